//! [`Generator`] and [`TextStream`]: the generation loop gives the tokens a hand-written greedy
//! loop gives, stops where asked, and releases text only when it is complete.

use super::*;
use crate::sampling::{Sampler, SamplerConfig};

#[test]
fn text_stream_holds_split_characters_and_stop_strings() {
    let mut s = TextStream::new(&["</s>".to_string(), "\n\n".to_string()]);
    let e = "é".as_bytes();
    assert_eq!(s.push(&e[..1]), "", "half a character is held");
    assert_eq!(s.push(&e[1..]), "é");
    assert_eq!(s.push(b"ab<"), "ab", "'<' may begin '</s>'");
    assert_eq!(s.push(b"b"), "<b", "'<b' begins no stop string");
    assert_eq!(s.push(b"x\n"), "x");
    assert_eq!(s.push(b"y"), "\ny");
    assert_eq!(s.push(b"z</"), "z");
    assert_eq!(s.push(b"s> tail"), "");
    assert_eq!(s.stopped(), Some("</s>"));
    assert_eq!(s.push(b"more"), "", "nothing after a stop string");
    assert_eq!(s.finish(), "");

    let mut s = TextStream::new(&[]);
    assert_eq!(s.push(&"€".as_bytes()[..2]), "");
    assert_eq!(
        s.finish(),
        "\u{fffd}",
        "an unfinished character is replaced at the end"
    );
    assert_eq!(
        s.push(&[0xff, b'a']),
        "\u{fffd}a",
        "invalid bytes are not held forever"
    );
}

fn setup() -> (LlamaModel, Tokenizer) {
    let model = LlamaModel::new(LlamaConfig::tiny(), 5).unwrap();
    let tok = model.synthetic_tokenizer().unwrap();
    (model, tok)
}

#[test]
fn generator_gives_the_greedy_loops_tokens_and_text() {
    let (model, tok) = setup();
    let prompt = tok.encode("the cat", true, false);
    let n = 12;
    // By hand: the last position's logits, argmax, feed back.
    let mut s = Session::builder(&model).build().unwrap();
    let mut logits = s.eval_last(&prompt).unwrap();
    let mut want = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits) as i32;
        if Some(t) == tok.eos() {
            break;
        }
        want.push(t);
        logits = s.eval_last(&[t]).unwrap();
    }
    let want_text = tok.decode(&want, false).unwrap();

    let mut s = Session::builder(&model).build().unwrap();
    let greedy = Sampler::new(SamplerConfig::default()).unwrap();
    let mut g = Generator::new(&mut s, &tok, greedy, &prompt).max_tokens(n);
    let (mut got, mut text) = (Vec::new(), String::new());
    for p in &mut g {
        let p = p.unwrap();
        got.extend(p.token);
        text += &p.text;
    }
    assert_eq!(got, want);
    assert_eq!(text, want_text);
    let st = g.stats();
    assert_eq!((st.prompt_tokens, st.generated), (prompt.len(), want.len()));
    let why = g.finish_reason().cloned();
    drop(g);
    if want.len() == n {
        assert_eq!(why, Some(Finish::MaxTokens));
        // The last token is not evaluated: nothing would read its logits.
        assert_eq!(s.n_past(), prompt.len() + n - 1);
    } else {
        assert_eq!(why, Some(Finish::StopToken(tok.eos().unwrap())));
    }
}

#[test]
fn generator_stops_at_tokens_strings_and_a_full_cache() {
    let (model, tok) = setup();
    let prompt = tok.encode("a b", true, false);
    let greedy = || Sampler::new(SamplerConfig::default()).unwrap();
    // The greedy continuation's second token as a stop token: one token comes out.
    let mut s = Session::builder(&model).build().unwrap();
    let all: Vec<i32> = Generator::new(&mut s, &tok, greedy(), &prompt)
        .max_tokens(4)
        .filter_map(|p| p.unwrap().token)
        .collect();
    assert!(all.len() >= 2, "{all:?}");
    let mut s = Session::builder(&model).build().unwrap();
    let mut g = Generator::new(&mut s, &tok, greedy(), &prompt).stop_tokens(&[all[1]]);
    let got: Vec<i32> = (&mut g).filter_map(|p| p.unwrap().token).collect();
    assert_eq!(got, all[..1]);
    assert_eq!(g.finish_reason(), Some(&Finish::StopToken(all[1])));

    // The second token's text as a stop string: the text ends before it.
    let piece = String::from_utf8(tok.token_to_piece(all[1], false).unwrap()).unwrap();
    let first = String::from_utf8(tok.token_to_piece(all[0], false).unwrap()).unwrap();
    if !piece.is_empty() && !first.contains(&piece) {
        let mut s = Session::builder(&model).build().unwrap();
        let mut g = Generator::new(&mut s, &tok, greedy(), &prompt)
            .stop_strings(std::slice::from_ref(&piece));
        let text: String = (&mut g).map(|p| p.unwrap().text).collect();
        assert_eq!(text, first);
        assert_eq!(g.finish_reason(), Some(&Finish::StopString(piece.clone())));
    }

    // Text held back as a possible stop string when the token limit ends the generation is
    // released with the last piece: the texts of 1 and of 2 tokens, the second run stopping on a
    // string that begins with the second token's text but never completes.
    if !piece.is_empty() {
        let mut s = Session::builder(&model).build().unwrap();
        let never = format!("{piece}\u{1}never");
        let mut g = Generator::new(&mut s, &tok, greedy(), &prompt)
            .max_tokens(2)
            .stop_strings(&[never]);
        let text: String = (&mut g).map(|p| p.unwrap().text).collect();
        assert_eq!(text, format!("{first}{piece}"));
        assert_eq!(g.finish_reason(), Some(&Finish::MaxTokens));
    }

    // A cache of the prompt and three more cells: three tokens, then ContextFull (or an
    // earlier end-of-sequence).
    let mut s = Session::builder(&model)
        .context(prompt.len() + 3)
        .build()
        .unwrap();
    let mut g = Generator::new(&mut s, &tok, greedy(), &prompt);
    let n = (&mut g)
        .map(|p| p.unwrap())
        .filter(|p| p.token.is_some())
        .count();
    match g.finish_reason() {
        Some(Finish::ContextFull) => assert_eq!(n, 4),
        Some(Finish::StopToken(_)) => assert!(n < 4),
        other => panic!("{other:?}"),
    }
}

#[test]
fn builder_checks_its_options_together() {
    let (model, _) = setup();
    let two = tessera::registry().select("cpu:2").unwrap();
    let e = |b: SessionBuilder<'_>| b.build().unwrap_err().to_string();
    assert!(e(Session::builder(&model).threads(0)).contains("0 threads"));
    assert!(e(Session::builder(&model).context(0)).contains("0 cells"));
    assert!(e(Session::builder(&model).max_sequences(0)).contains("max_sequences 0"));
    assert!(
        e(Session::builder(&model).devices(&two).split(Split::Layer {
            ratios: vec![1.0, 2.0, 3.0]
        }))
        .contains("3 split ratios for 2 devices")
            || e(Session::builder(&model).devices(&two).split(Split::Layer {
                ratios: vec![1.0, 2.0, 3.0]
            }))
            .contains("ratio")
    );
    assert!(
        e(Session::builder(&model).devices(&two).split(Split::Tensor {
            ratios: vec![],
            groups: 3
        }))
        .contains("do not form 3 tensor-parallel groups")
    );
    let meta = model.meta_device(&two, &[]).unwrap();
    assert!(
        e(Session::builder(&model)
            .devices(&two)
            .split(Split::Meta(meta.clone())))
        .contains("brings its own devices")
    );
    assert!(Split::from_mode(SplitMode::Layer, &[], 2).is_err());
    assert!(Split::from_mode(SplitMode::None, &[1.0], 1).is_err());
    for &m in SplitMode::ALL {
        assert_eq!(Split::from_mode(m, &[], 1).unwrap().mode(), m);
    }
    // Every split loads and reports its mode; the progress callback sees every tensor.
    for split in [
        Split::None,
        Split::layer(),
        Split::tensor(),
        Split::expert(),
        Split::Meta(meta),
    ] {
        let mode = split.mode();
        let mut last = (0, 0);
        let b = Session::builder(&model);
        let b = if matches!(split, Split::Meta(_)) {
            b
        } else {
            b.devices(&two)
        };
        let s = b
            .split(split)
            .threads(2)
            .context(100)
            .progress(|d, n| last = (d, n))
            .build()
            .unwrap();
        assert_eq!(s.split_mode(), mode);
        assert_eq!(s.model().config().n_ctx, 100);
        assert!(last.1 > 0 && last.0 == last.1, "{last:?}");
    }
}
