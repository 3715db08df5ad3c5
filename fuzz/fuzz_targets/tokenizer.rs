//! The tokenizer on arbitrary vocabularies: a GGUF file is written with fuzzed
//! `tokenizer.ggml.*` keys (tokens, types, scores, merges, pre-tokenizer, special ids, flags),
//! read back, and the tokenizer it describes (or a typed error) encodes arbitrary text and
//! decodes arbitrary ids. A tokenizer that loads must round-trip every id it produced to text
//! without a panic, and never produce an id outside its vocabulary.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::gguf::{GgufFile, GgufWriter, ReadOptions};
use tessera_model::Tokenizer;
use tessera_model::tokenizer::{
    KEY_ADD_BOS, KEY_ADD_EOS, KEY_ADD_SPACE_PREFIX, KEY_BOS, KEY_EOS, KEY_MERGES, KEY_MODEL,
    KEY_PAD, KEY_PRE, KEY_SCORES, KEY_TOKEN_TYPE, KEY_TOKENS, KEY_UNK, PreTokenizer,
};

#[derive(Arbitrary, Debug)]
struct Input {
    /// 0: llama, 1: gpt2, 2: gemma4, else an arbitrary name.
    model: u8,
    other_model: String,
    /// Index into the known pre-tokenizer names, or (past the end) `pre_name`.
    pre: Option<u8>,
    pre_name: String,
    /// Size of llama's synthetic SentencePiece vocabulary to start from (0: none).
    base: u8,
    tokens: Vec<(String, u8, f32)>,
    /// Merges as pairs of token indices, plus raw merge strings.
    merges: Vec<(u16, u16)>,
    raw_merges: Vec<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    flags: [Option<bool>; 3],
    /// Drop the scores / types arrays, or give them a wrong length.
    shape: u8,
    texts: Vec<(String, bool, bool)>,
    ids: Vec<i32>,
}

fn file(inp: &Input) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let model = match inp.model {
        0 => "llama",
        1 => "gpt2",
        2 => "gemma4",
        _ => inp.other_model.as_str(),
    };
    let (mut texts, mut scores, mut types) = if inp.base > 0 {
        tessera_model::synthetic_vocab(usize::from(inp.base) * 4)
    } else {
        (Vec::new(), Vec::new(), Vec::new())
    };
    for (t, ty, s) in &inp.tokens {
        texts.push(t.clone());
        types.push(i32::from(*ty % 8));
        scores.push(*s);
    }
    let n = texts.len().max(1);
    let mut merges: Vec<String> = inp
        .merges
        .iter()
        .filter_map(|&(a, b)| {
            let a = texts.get(usize::from(a) % n)?;
            let b = texts.get(usize::from(b) % n)?;
            Some(format!("{a} {b}"))
        })
        .collect();
    merges.extend(inp.raw_merges.iter().cloned());
    match inp.shape % 4 {
        1 => {
            scores.pop();
        }
        2 => types.push(1),
        _ => {}
    }
    let _ = w.set(KEY_MODEL, model);
    let _ = w.set(KEY_TOKENS, texts);
    if inp.shape % 8 < 6 {
        let _ = w.set(KEY_SCORES, scores);
        let _ = w.set(KEY_TOKEN_TYPE, types);
    }
    let _ = w.set(KEY_MERGES, merges);
    let names: Vec<&str> = PreTokenizer::names().collect();
    match inp.pre {
        Some(i) if usize::from(i) < names.len() => {
            let _ = w.set(KEY_PRE, names[usize::from(i)]);
        }
        Some(_) => {
            let _ = w.set(KEY_PRE, inp.pre_name.as_str());
        }
        None => {}
    }
    for (key, v) in [
        (KEY_BOS, inp.bos),
        (KEY_EOS, inp.eos),
        (KEY_UNK, inp.unk),
        (KEY_PAD, inp.pad),
    ] {
        if let Some(v) = v {
            let _ = w.set(key, v);
        }
    }
    for (key, v) in [KEY_ADD_BOS, KEY_ADD_EOS, KEY_ADD_SPACE_PREFIX]
        .into_iter()
        .zip(inp.flags)
    {
        if let Some(v) = v {
            let _ = w.set(key, v);
        }
    }
    w.to_bytes()
}

fuzz_target!(|inp: Input| {
    let bytes = file(&inp);
    let gguf = GgufFile::from_bytes(bytes, "fuzz.gguf", &ReadOptions::default())
        .expect("the writer's output must read back");
    let Ok(tok) = Tokenizer::from_gguf(&gguf) else {
        return;
    };
    let n = tok.n_vocab();
    for (text, add_special, parse_special) in &inp.texts {
        let ids = tok.encode(text, *add_special, *parse_special);
        assert!(
            ids.iter().all(|&i| i >= 0 && (i as usize) < n),
            "{ids:?} of {n}"
        );
        tok.decode(&ids, true).expect("decoding encoded ids");
        tok.decode(&ids, false).expect("decoding encoded ids");
    }
    let _ = tok.decode(&inp.ids, true);
    for &id in &inp.ids {
        let _ = tok.token_to_piece(id, false);
        let _ = (tok.token_text(id), tok.token_type(id));
    }
});
