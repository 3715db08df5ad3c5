//! Pre-tokenizers of byte-level BPE vocabularies: hand-written equivalents of the split regexes
//! (which need look-ahead), following llama.cpp's own hand-written GPT-2 and LLaMA-3 splitters.
//!
//! Character classes are Unicode's: `\p{L}` (general category L, from `regex-syntax`'s tables),
//! `\p{N}` (`char::is_numeric`: Nd, Nl, No) and `\s` (`char::is_whitespace`: White_Space).

use regex_syntax::hir::{self, HirKind};
use std::sync::OnceLock;

/// How a byte-level BPE vocabulary splits text into words before merging (GGUF key
/// `tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    /// Also used for `default` (llama.cpp's `default` runs extra punctuation and digit splits
    /// that are not implemented).
    Gpt2,
    /// LLaMA 3: case-insensitive contractions, `[^\r\n\p{L}\p{N}]?\p{L}+`, digits in groups of
    /// up to three, ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`. Whole words
    /// that are tokens skip merging (`ignore_merges`).
    Llama3,
    /// Qwen 2: as LLaMA 3 but each digit is its own word, and merges always apply.
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer of a `tokenizer.ggml.pre` value, if supported.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "default" | "gpt2" | "gpt-2" => Some(PreTokenizer::Gpt2),
            "llama3" | "llama-v3" | "llama-bpe" => Some(PreTokenizer::Llama3),
            "qwen2" => Some(PreTokenizer::Qwen2),
            _ => None,
        }
    }

    /// The `tokenizer.ggml.pre` names accepted, for error messages.
    pub const SUPPORTED: &'static str = "default, gpt2, llama3, llama-v3, llama-bpe, qwen2";

    /// Splits `text` into words; their concatenation is `text`.
    pub fn split(self, text: &str) -> Vec<&str> {
        match self {
            PreTokenizer::Gpt2 => split_gpt2(text),
            PreTokenizer::Llama3 => split_llama3(text, 3),
            PreTokenizer::Qwen2 => split_llama3(text, 1),
        }
    }
}

fn letter_ranges() -> &'static [(char, char)] {
    static RANGES: OnceLock<Vec<(char, char)>> = OnceLock::new();
    RANGES.get_or_init(
        || match regex_syntax::parse(r"\p{L}").map(|h| h.into_kind()) {
            Ok(HirKind::Class(hir::Class::Unicode(c))) => {
                c.ranges().iter().map(|r| (r.start(), r.end())).collect()
            }
            // The pattern is a constant that always parses to a class.
            _ => unreachable!("the letter class parses to a Unicode class"),
        },
    )
}

/// `\p{L}`.
pub(super) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    let r = letter_ranges();
    match r.binary_search_by(|&(lo, _)| lo.cmp(&c)) {
        Ok(_) => true,
        Err(0) => false,
        Err(i) => c <= r[i - 1].1,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
    /// Past the end of the text.
    End,
}

fn class(c: Option<char>) -> Class {
    match c {
        None => Class::End,
        Some(c) if is_letter(c) => Class::Letter,
        Some(c) if c.is_numeric() => Class::Number,
        Some(c) if c.is_whitespace() => Class::Space,
        Some(_) => Class::Other,
    }
}

/// Text as chars with byte offsets, and the words cut so far.
struct Splitter<'a> {
    text: &'a str,
    chars: Vec<(usize, char)>,
    words: Vec<&'a str>,
    prev: usize,
}

impl<'a> Splitter<'a> {
    fn new(text: &'a str) -> Splitter<'a> {
        Splitter {
            text,
            chars: text.char_indices().collect(),
            words: Vec::new(),
            prev: 0,
        }
    }

    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).map(|&(_, c)| c)
    }

    fn byte(&self, i: usize) -> usize {
        self.chars.get(i).map_or(self.text.len(), |&(b, _)| b)
    }

    /// Ends the current word before char `end`.
    fn cut(&mut self, end: usize) {
        if end > self.prev {
            self.words
                .push(&self.text[self.byte(self.prev)..self.byte(end)]);
            self.prev = end;
        }
    }

    /// Length of the contraction (`'s`, `'re`, …) at `pos`, if any.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        let low = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
        if self.at(pos) != Some('\'') {
            return None;
        }
        match (low(self.at(pos + 1)), low(self.at(pos + 2))) {
            (Some('s' | 't' | 'm' | 'd'), _) => Some(2),
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => Some(3),
            _ => None,
        }
    }

    /// Whitespace at `pos`: `\s+(?!\S)` (all but the last before a non-space) or `\s+`.
    /// Returns the end of the match, if there is whitespace.
    fn trailing_space(&self, pos: usize) -> Option<usize> {
        let n = (pos..)
            .take_while(|&i| self.at(i).is_some_and(char::is_whitespace))
            .count();
        match n {
            0 => None,
            n if n > 1 && self.at(pos + n).is_some() => Some(pos + n - 1),
            n => Some(pos + n),
        }
    }

    fn skip_class(&self, mut pos: usize, c: Class) -> usize {
        while class(self.at(pos)) == c {
            pos += 1;
        }
        pos
    }
}

fn split_gpt2(text: &str) -> Vec<&str> {
    let mut s = Splitter::new(text);
    let mut pos = 0;
    while pos < s.chars.len() {
        let c = s.chars[pos].1;
        if let Some(n) = s.contraction(pos, false) {
            pos += n;
        } else {
            // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the class of the char after an
            // optional leading space decides.
            let lead = usize::from(c == ' ');
            let cls = class(s.at(pos + lead));
            pos = match cls {
                Class::Letter | Class::Number | Class::Other => s.skip_class(pos + lead, cls),
                Class::Space | Class::End => s.trailing_space(pos).unwrap_or(pos + 1),
            };
        }
        s.cut(pos);
    }
    s.words
}

fn split_llama3(text: &str, max_digits: usize) -> Vec<&str> {
    let mut s = Splitter::new(text);
    let mut pos = 0;
    'outer: while pos < s.chars.len() {
        let c = s.chars[pos].1;
        if let Some(n) = s.contraction(pos, true) {
            pos += n;
            s.cut(pos);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        let crlf = |c: char| c == '\r' || c == '\n';
        if !crlf(c) && !c.is_numeric() && (is_letter(c) || class(s.at(pos + 1)) == Class::Letter) {
            pos = s.skip_class(pos + 1, Class::Letter);
            s.cut(pos);
            continue;
        }
        // `\p{N}{1,max_digits}`
        if c.is_numeric() {
            let mut start = pos;
            while class(s.at(pos)) == Class::Number {
                pos += 1;
                if pos - start >= max_digits {
                    s.cut(pos);
                    start = pos;
                }
            }
            s.cut(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let lead = usize::from(c == ' ');
        if class(s.at(pos + lead)) == Class::Other {
            pos = s.skip_class(pos + lead, Class::Other);
            while s.at(pos).is_some_and(crlf) {
                pos += 1;
            }
            s.cut(pos);
            continue;
        }
        // `\s*[\r\n]+`: whitespace up to its last CR or LF.
        let mut i = pos;
        let mut last_crlf = None;
        while let Some(w) = s.at(i).filter(|w| w.is_whitespace()) {
            i += 1;
            if crlf(w) {
                last_crlf = Some(i);
            }
        }
        if let Some(end) = last_crlf {
            pos = end;
            s.cut(pos);
            continue 'outer;
        }
        pos = s.trailing_space(pos).unwrap_or(pos + 1);
        s.cut(pos);
    }
    s.words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2(t: &str) -> Vec<&str> {
        PreTokenizer::Gpt2.split(t)
    }

    fn llama3(t: &str) -> Vec<&str> {
        PreTokenizer::Llama3.split(t)
    }

    #[test]
    fn unicode_classes() {
        for c in ['a', 'Z', 'é', 'ß', 'Ж', '中', 'ひ', 'ا'] {
            assert!(is_letter(c), "{c}");
        }
        // Digits, Roman numeral Ⅻ (Nl), a combining mark (Mn), emoji and punctuation are not.
        for c in ['1', '٣', 'Ⅻ', '\u{0301}', '🦀', '!', ' ', '\u{094D}'] {
            assert!(!is_letter(c), "{c:?}");
        }
        assert!('Ⅻ'.is_numeric() && '٣'.is_numeric());
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            gpt2("Hello world, it's 2024!"),
            ["Hello", " world", ",", " it", "'s", " 2024", "!"]
        );
        // `\s+(?!\S)`: a run of spaces leaves its last one to the next word.
        assert_eq!(gpt2("a   b"), ["a", "  ", " b"]);
        assert_eq!(gpt2("a  \n b  "), ["a", "  \n", " b", "  "]);
        assert_eq!(gpt2("x\ny"), ["x", "\n", "y"]);
        assert_eq!(gpt2("I'M don't"), ["I", "'", "M", " don", "'t"]);
        assert_eq!(gpt2("中文🦀🦀 ok"), ["中文", "🦀🦀", " ok"]);
        assert_eq!(gpt2(""), Vec::<&str>::new());
    }

    #[test]
    fn llama3_words() {
        assert_eq!(
            llama3("Hello world, it's 12345!"),
            ["Hello", " world", ",", " it", "'s", " ", "123", "45", "!"]
        );
        assert_eq!(llama3("I'M HERE"), ["I", "'M", " HERE"]);
        assert_eq!(llama3("a\n\n  b"), ["a", "\n\n", " ", " b"]);
        assert_eq!(llama3("x  \n\n  y"), ["x", "  \n\n", " ", " y"]);
        assert_eq!(llama3("end...\n\nnext"), ["end", "...\n\n", "next"]);
        assert_eq!(llama3("\tword (x)"), ["\tword", " (", "x", ")"]);
        assert_eq!(
            PreTokenizer::Qwen2.split("v12 3"),
            ["v", "1", "2", " ", "3"]
        );
    }

    #[test]
    fn splits_cover_the_text() {
        let t = "  Mixed: CJK 漢字, emoji 🦀👍🏽, tabs\t\tand\r\nlines 1234567 — done.  ";
        for p in [
            PreTokenizer::Gpt2,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
        ] {
            let words = p.split(t);
            assert_eq!(words.concat(), t, "{p:?}");
            assert!(words.iter().all(|w| !w.is_empty()), "{p:?}");
        }
    }
}
