//! A synthetic vocabulary for models and tests that need no model file.

use crate::TokenType;

/// A SentencePiece-style vocabulary of exactly `n_vocab` tokens (texts, scores, types): `<unk>`,
/// `<s>`, `</s>`; the 256 byte tokens `<0xXX>` when `n_vocab` leaves room for them and the
/// basic pieces; `▁` and the printable ASCII chars; then `▁a`…`▁z`, letter pairs, `▁` + pair,
/// letter triples, `▁` + triple (earlier pieces score higher, so they merge first); then
/// `<unused_N>` if still short.
pub fn synthetic_vocab(n_vocab: usize) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let letters = || ('a'..='z').map(String::from);
    let pairs = || letters().flat_map(|a| ('a'..='z').map(move |b| format!("{a}{b}")));
    let triples = || pairs().flat_map(|p| ('a'..='z').map(move |c| format!("{p}{c}")));
    let basic =
        std::iter::once("▁".to_string()).chain((b'!'..=b'~').map(|b| char::from(b).to_string()));
    let with_bytes = n_vocab >= 3 + 256 + 95;
    let mut texts = Vec::with_capacity(n_vocab);
    let mut scores = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    let specials = [
        ("<unk>", TokenType::Unknown),
        ("<s>", TokenType::Control),
        ("</s>", TokenType::Control),
    ];
    for (t, ty) in specials {
        texts.push(t.to_string());
        scores.push(0.0);
        types.push(ty.id());
    }
    if with_bytes {
        for b in 0..=255u8 {
            texts.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(TokenType::Byte.id());
        }
    }
    let pieces = basic
        .chain(letters().map(|l| format!("▁{l}")))
        .chain(pairs())
        .chain(pairs().map(|p| format!("▁{p}")))
        .chain(triples())
        .chain(triples().map(|t| format!("▁{t}")));
    for (i, p) in pieces.enumerate() {
        if texts.len() >= n_vocab {
            break;
        }
        texts.push(p);
        scores.push(-(i as f32));
        types.push(TokenType::Normal.id());
    }
    while texts.len() < n_vocab {
        texts.push(format!("<unused_{}>", texts.len()));
        scores.push(f32::NEG_INFINITY);
        types.push(TokenType::Unused.id());
    }
    texts.truncate(n_vocab);
    scores.truncate(n_vocab);
    types.truncate(n_vocab);
    (texts, scores, types)
}
