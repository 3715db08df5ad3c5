//! Known answers on small hand-built vocabularies (expected ids worked out from the merge rules),
//! round trips, special tokens and vocabulary errors.

use super::*;
use tessera_gguf::{GgufErrorKind, Metadata, Value};

/// Types for `texts`: `<unk>` unknown, `<0xXX>` byte, `<|…|>` / `<s>` / `</s>` control,
/// `<tool>` user-defined, the rest normal.
fn types_of(texts: &[String]) -> Vec<i32> {
    texts
        .iter()
        .map(|t| {
            let ty = match t.as_str() {
                "<unk>" => TokenType::Unknown,
                "<s>" | "</s>" => TokenType::Control,
                "<tool>" => TokenType::UserDefined,
                t if t.starts_with("<0x") => TokenType::Byte,
                t if t.starts_with("<|") => TokenType::Control,
                _ => TokenType::Normal,
            };
            ty.id()
        })
        .collect()
}

// ---- SentencePiece ("llama") ----

/// 0 `<unk>`, 1 `<s>`, 2 `</s>`, 3..=258 byte tokens, then scored pieces from 259.
fn spm_metadata() -> Metadata {
    let mut texts: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        texts.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
    }
    let pieces: [(&str, f32); 23] = [
        ("▁", -10.0),          // 259
        ("h", -10.0),          // 260
        ("e", -10.0),          // 261
        ("l", -10.0),          // 262
        ("o", -10.0),          // 263
        ("w", -10.0),          // 264
        ("r", -10.0),          // 265
        ("d", -10.0),          // 266
        ("▁h", -5.0),          // 267
        ("he", -3.0),          // 268
        ("ll", -2.0),          // 269
        ("lo", -1.0),          // 270
        ("▁he", -4.0),         // 271
        ("llo", -6.0),         // 272
        ("▁w", -5.0),          // 273
        ("or", -3.0),          // 274
        ("▁wor", -4.0),        // 275
        ("ld", -2.0),          // 276
        ("▁world", -7.0),      // 277
        ("中", -10.0),         // 278
        ("<|im_start|>", 0.0), // 279
        ("<tool>", 0.0),       // 280
        ("▁▁", -9.0),          // 281
    ];
    for (t, s) in pieces {
        texts.push(t.to_string());
        scores.push(s);
    }
    let mut md = Metadata::new("spm-test");
    md.set(KEY_MODEL, "llama");
    md.set(KEY_TOKEN_TYPE, types_of(&texts));
    md.set(KEY_TOKENS, texts);
    md.set(KEY_SCORES, scores);
    md
}

fn spm() -> Tokenizer {
    Tokenizer::from_metadata(&spm_metadata()).unwrap()
}

#[test]
fn spm_merges_by_score_not_left_to_right() {
    let t = spm();
    assert_eq!((t.bos(), t.eos(), t.unk()), (Some(1), Some(2), Some(0)));
    // `lo` (-1) merges before `ll` (-2), so `llo` comes from `l`+`lo`; `▁hello` is not a token.
    assert_eq!(t.encode("hello world", true, false), [1, 271, 272, 277]);
    assert_eq!(t.encode("hello world", false, false), [271, 272, 277]);
    // Two spaces: `▁w` (-5) beats `▁▁` (-9) and leaves a lone `▁`.
    assert_eq!(t.encode("hello  world", false, false), [271, 272, 259, 277]);
    // Equal scores: the leftmost pair merges first.
    assert_eq!(t.encode("lll", false, false), [259, 269, 262]);
    assert_eq!(t.encode("", true, false), [1]);
    assert_eq!(t.encode("", false, false), Vec::<Token>::new());
}

#[test]
fn spm_byte_fallback_and_unicode() {
    let t = spm();
    // `€` is not a piece: its UTF-8 bytes E2 82 AC become byte tokens 3 + byte.
    assert_eq!(
        t.encode("h€", false, false),
        [267, 3 + 0xE2, 3 + 0x82, 3 + 0xAC]
    );
    assert_eq!(t.encode("中", false, false), [259, 278]);
    for text in [
        "hello world",
        "Hello, World! 123",
        "中文 and 日本語 text",
        "emoji 🦀👍🏽 ok",
        "  leading, trailing  ",
        "tabs\tand\nnew\r\nlines",
        "a    b",
        "€",
    ] {
        let ids = t.encode(text, true, false);
        assert_eq!(t.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
}

#[test]
fn spm_special_tokens() {
    let t = spm();
    // Parsed whole, with a space prefix after it; not parsed, its chars fall back to bytes.
    assert_eq!(t.encode("<s>hello", false, true), [1, 271, 272]);
    assert_eq!(
        t.encode("<s>hello", false, false),
        [
            259,
            3 + b'<' as Token,
            3 + b's' as Token,
            3 + b'>' as Token,
            268,
            272
        ]
    );
    assert_eq!(t.encode("<|im_start|>he", false, true), [279, 271]);
    // User-defined tokens are always matched and always rendered.
    let ids = t.encode("a<tool>b", false, false);
    assert_eq!(ids, [259, 3 + b'a' as Token, 280, 259, 3 + b'b' as Token]);
    assert_eq!(t.decode(&ids, false).unwrap(), "a<tool> b");
    // Control tokens render only on request.
    assert_eq!(t.decode(&[1, 271, 272, 2], false).unwrap(), "hello");
    assert_eq!(t.decode(&[1, 271, 272, 2], true).unwrap(), "<s> hello</s>");
    assert_eq!(t.decode(&[0], true).unwrap(), "<unk>");
    assert_eq!(t.token_to_piece(3 + 0x41, false).unwrap(), b"A");
    assert!(matches!(
        t.decode(&[282], false),
        Err(TokenizerError::UnknownToken {
            token: 282,
            n_vocab: 282
        })
    ));
    assert!(t.decode(&[-1], false).is_err());
}

#[test]
fn spm_flags_from_metadata() {
    let mut md = spm_metadata();
    md.set(KEY_ADD_BOS, false);
    md.set(KEY_ADD_EOS, true);
    md.set(KEY_ADD_SPACE_PREFIX, false);
    let t = Tokenizer::from_metadata(&md).unwrap();
    assert_eq!(t.encode("hello", true, false), [268, 272, 2]);
    assert_eq!(t.decode(&[271, 272], false).unwrap(), " hello");
}

// ---- byte-level BPE ("gpt2") ----

/// Tokens 0..=255: the byte chars in byte order; 256 `Ġt`, 257 `he`, 258 `Ġthe`, 259 `lo`,
/// 260 `llo`, 261 `ello`, 262 `hello`, 263 `<|endoftext|>`, 264 `<|begin_of_text|>`.
fn bpe_metadata(pre: &str) -> Metadata {
    let mut texts: Vec<String> = (0..=255u8).map(|b| bpe::byte_char(b).to_string()).collect();
    for t in ["Ġt", "he", "Ġthe", "lo", "llo", "ello", "hello"] {
        texts.push(t.to_string());
    }
    texts.push("<|endoftext|>".into());
    texts.push("<|begin_of_text|>".into());
    let merges = ["Ġ t", "h e", "Ġt he", "l o", "l lo", "e llo", "h ello"];
    let mut md = Metadata::new("bpe-test");
    md.set(KEY_MODEL, "gpt2");
    md.set(KEY_PRE, pre);
    md.set(KEY_TOKEN_TYPE, types_of(&texts));
    md.set(KEY_TOKENS, texts);
    md.set(KEY_MERGES, merges.to_vec());
    md.set(KEY_EOS, 263u32);
    md.set(KEY_BOS, 264u32);
    md
}

fn bpe(pre: &str) -> Tokenizer {
    Tokenizer::from_metadata(&bpe_metadata(pre)).unwrap()
}

#[test]
fn bpe_merges_by_rank() {
    let t = bpe("gpt-2");
    assert_eq!(
        (t.n_vocab(), t.merge_count(), t.model_name()),
        (265, 7, "gpt2")
    );
    assert_eq!(t.pre_tokenizer(), Some(PreTokenizer::Gpt2));
    // `h e` (rank 1) merges before `l o` (rank 3), so `hello` ends as `he` + `llo`, although
    // `hello` is a token (reachable only through `ello`).
    assert_eq!(t.encode("hello", true, false), [257, 260]);
    assert_eq!(t.encode(" the", false, false), [258]);
    assert_eq!(t.encode("hello the", false, false), [257, 260, 258]);
    // Words are merged separately: `o` and ` t` never join.
    assert_eq!(t.encode("lo t", false, false), [259, 256]);
    assert_eq!(t.encode("x", false, false), [b'x' as Token]);
}

#[test]
fn bpe_llama3_takes_whole_word_tokens_and_adds_bos() {
    let t = bpe("llama-bpe");
    assert_eq!(t.pre_tokenizer(), Some(PreTokenizer::Llama3));
    assert!(t.adds_bos());
    assert_eq!(t.encode("hello", true, false), [264, 262]);
    assert_eq!(t.encode("hello", false, false), [262]);
    // Digits in groups of three.
    assert_eq!(
        t.encode("12345", false, false),
        [b'1', b'2', b'3', b'4', b'5'].map(Token::from)
    );
    let q = bpe("qwen2");
    assert_eq!(q.encode("hello", false, false), [257, 260]);
}

#[test]
fn bpe_round_trips_and_specials() {
    for pre in [
        "gpt-2",
        "llama3",
        "qwen2",
        "default",
        "smollm",
        "falcon",
        "deepseek-llm",
        "tekken",
        "bloom",
    ] {
        let t = bpe(pre);
        for text in [
            "hello the world",
            "中文 and 日本語, emoji 🦀👍🏽!",
            "  spaces   and\ttabs\n\n  newlines  ",
            "numbers 1234567 and 3.14",
            "",
        ] {
            let ids = t.encode(text, false, false);
            assert_eq!(t.decode(&ids, false).unwrap(), text, "{pre}: {ids:?}");
        }
        let ids = t.encode("hi<|endoftext|>", false, true);
        assert_eq!(ids, [b'h' as Token, b'i' as Token, 263]);
        assert_eq!(t.decode(&ids, false).unwrap(), "hi");
        assert_eq!(t.decode(&ids, true).unwrap(), "hi<|endoftext|>");
        let plain = t.encode("hi<|endoftext|>", false, false);
        assert!(!plain.contains(&263));
        assert_eq!(t.decode(&plain, false).unwrap(), "hi<|endoftext|>");
    }
}

/// Deterministic pseudo-random texts from a pool of awkward pieces.
fn random_texts() -> Vec<String> {
    let pool = [
        "a",
        "Z",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "hello",
        "'s",
        "'LL",
        "中",
        "文字",
        "🦀",
        "👍🏽",
        "é",
        "0",
        "123456",
        ".",
        "...",
        "<s>",
        "<|endoftext|>",
        "\u{0}",
        "\u{7f}",
        "ß",
        "Ⅻ",
        "\u{301}",
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..300)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let n = (state % 12) as usize;
            (0..n)
                .map(|k| pool[((state >> (5 * k)) % pool.len() as u64) as usize])
                .collect()
        })
        .collect()
}

#[test]
fn random_texts_round_trip() {
    let spm = spm();
    let bpes = [
        "gpt-2", "llama3", "qwen2", "smollm", "gpt-4o", "kimi-k2", "afmoe",
    ]
    .map(bpe);
    for text in random_texts() {
        let ids = spm.encode(&text, true, false);
        assert_eq!(spm.decode(&ids, false).unwrap(), text, "spm {ids:?}");
        for t in &bpes {
            let ids = t.encode(&text, true, false);
            assert_eq!(
                t.decode(&ids, false).unwrap(),
                text,
                "{:?} {ids:?}",
                t.pre_tokenizer()
            );
            // Parsing specials changes the ids, not the text (when rendered).
            let ids = t.encode(&text, false, true);
            assert_eq!(t.decode(&ids, true).unwrap(), text);
        }
    }
}

// ---- errors ----

fn err(md: &Metadata) -> TokenizerError {
    Tokenizer::from_metadata(md).unwrap_err()
}

#[test]
fn vocabulary_errors_are_typed() {
    let mut md = spm_metadata();
    md.set(KEY_MODEL, "bert");
    assert!(matches!(err(&md), TokenizerError::UnsupportedModel { model, .. } if model == "bert"));

    let mut md = bpe_metadata("no-such-pre");
    let e = err(&md);
    assert!(
        matches!(e, TokenizerError::UnsupportedPreTokenizer { ref pre, .. } if pre == "no-such-pre")
    );
    // The message names the value and lists every name llama.cpp accepts.
    let msg = e.to_string();
    assert!(msg.contains("\"no-such-pre\"") && msg.contains("smollm") && msg.contains("llama-bpe"));
    assert_eq!(PreTokenizer::names().count(), 91);
    for name in PreTokenizer::names() {
        let splitter = PreTokenizer::from_gguf_name(name).unwrap().splitter();
        assert!(splitter.is_ok(), "{name}: {:?}", splitter.err());
    }
    md.set(KEY_PRE, "gpt-2");
    md.set(KEY_MERGES, vec!["nospace"]);
    assert!(matches!(err(&md), TokenizerError::InvalidVocab { key, .. } if key == KEY_MERGES));

    let mut md = spm_metadata();
    md.set(KEY_SCORES, vec![0.0f32; 3]);
    let e = err(&md);
    assert_eq!(
        e.to_string(),
        "spm-test: key tokenizer.ggml.scores: 3 entries for 282 tokens"
    );

    let mut md = spm_metadata();
    md.set(KEY_BOS, 5000u32);
    assert!(matches!(err(&md), TokenizerError::InvalidVocab { key, .. } if key == KEY_BOS));

    let mut md = spm_metadata();
    md.set(KEY_TOKEN_TYPE, vec![9i32; 282]);
    assert!(matches!(err(&md), TokenizerError::InvalidVocab { key, .. } if key == KEY_TOKEN_TYPE));

    let mut md = spm_metadata();
    let mut types = vec![TokenType::Normal.id(); 282];
    types[5] = TokenType::Byte.id();
    types[260] = TokenType::Byte.id();
    md.set(KEY_TOKEN_TYPE, types);
    assert!(matches!(err(&md), TokenizerError::InvalidVocab { key, .. } if key == KEY_TOKENS));

    let mut md = spm_metadata();
    md.set(KEY_TOKENS, Value::from(7u32));
    match err(&md) {
        TokenizerError::Gguf(e) => {
            assert!(matches!(e.kind(), GgufErrorKind::WrongType { .. }), "{e}")
        }
        e => panic!("{e}"),
    }

    let mut md = bpe_metadata("gpt-2");
    md.set(KEY_ADD_BOS, true);
    md.set(KEY_BOS, Value::from("x"));
    assert!(matches!(err(&md), TokenizerError::Gguf(_)));

    let md = Metadata::new("empty");
    match err(&md) {
        TokenizerError::Gguf(e) => {
            assert!(matches!(e.kind(), GgufErrorKind::MissingKey { key } if key == KEY_MODEL))
        }
        e => panic!("{e}"),
    }
}
