//! Pre-tokenizers of byte-level BPE vocabularies: how `tokenizer.ggml.pre` cuts text into words
//! before merging, exactly as llama.cpp's `unicode_regex_split` does.
//!
//! Each pre-tokenizer is llama.cpp's list of regexes ([`PreTokenizer`]; the tables are in
//! `names.rs`), applied in turn, each to the pieces the previous one left; text between matches
//! stays a piece of its own. As in llama.cpp:
//! - regexes that llama.cpp replaces by hand-written splitters (GPT-2, LLaMA 3, Qwen 2 / 3.5,
//!   Kimi K2, AFMoE digits, newline runs) run the same hand-written code (`custom.rs`);
//! - the other regexes run in `fancy-regex` (look-around). A regex with Unicode classes
//!   (`\p{L}`, `\p{N}`, `\p{P}`, `\p{M}`, `\p{S}`, `\p{Lu}`…) runs on a *collapsed* text in which
//!   every non-ASCII code point stands for its category (all letters alike, so `\p{Lu}` is any
//!   letter) and non-ASCII whitespace for `\x0B`; the others see the text with non-ASCII
//!   whitespace replaced by `\x0B`.
//!
//! Character classes are Unicode's, from `regex-syntax`'s tables (`unicode.rs`).

mod custom;
mod names;
mod unicode;

use fancy_regex::Regex;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

/// A pre-tokenizer type: llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`. Several `tokenizer.ggml.pre`
/// names map to one type ([`PreTokenizer::from_gguf_name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum PreTokenizer {
    Afmoe,
    Bailingmoe,
    Bloom,
    Chameleon,
    Chatglm4,
    Codeshell,
    CommandR,
    Dbrx,
    Deepseek3Llm,
    DeepseekCoder,
    DeepseekLlm,
    Default,
    Exaone,
    ExaoneMoe,
    Falcon,
    Gemma4,
    Gpt2,
    Gpt3Finnish,
    Gpt4o,
    GraniteDocling,
    GraniteEmbMulti,
    Grok2,
    Hunyuan,
    HunyuanDense,
    HyV4,
    Jais,
    Jais2,
    JoyaiLlm,
    KimiK2,
    Laguna,
    Llama3,
    Mellum2,
    Minerva,
    Minicpm5,
    MinimaxM2,
    Mpt,
    Olmo,
    Poro,
    Qwen2,
    Qwen35,
    Refact,
    SarvamMoe,
    SeedCoder,
    Smaug,
    Smollm,
    SolarOpen,
    Spark25,
    Stablelm2,
    Starcoder,
    Superbpe,
    Tekken,
    TinyAya,
    Trillion,
    Ufakzeka,
    Viking,
    Whitespace,
    Youtu,
}

/// What a `tokenizer.ggml.pre` name changes besides the split (llama.cpp sets these per name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Quirks {
    /// A word that is a token is taken whole, without merging.
    pub ignore_merges: bool,
    /// `add_special` adds BOS unless `tokenizer.ggml.add_bos_token` says otherwise.
    pub add_bos: bool,
    /// llama.cpp's `clean_spaces` (detokenizer clean-up; recorded, not applied).
    pub clean_spaces: bool,
    /// Spaces become `▁` before splitting (SentencePiece-style BPE).
    pub escape_whitespaces: bool,
    /// Appends SEP with special tokens (BERT-like; recorded, not applied).
    pub add_sep: bool,
    /// No default BOS id (only `tokenizer.ggml.bos_token_id` sets one).
    pub no_bos: bool,
}

impl Quirks {
    /// BPE defaults: merges always, no BOS, clean-up on.
    pub const NONE: Quirks = Quirks {
        ignore_merges: false,
        add_bos: false,
        clean_spaces: true,
        escape_whitespaces: false,
        add_sep: false,
        no_bos: false,
    };
}

/// The `tokenizer.ggml.pre` names accepted, comma-separated (for error messages).
pub struct KnownNames;

impl fmt::Display for KnownNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, _, _)) in names::NAMES.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

impl PreTokenizer {
    /// The pre-tokenizer of a `tokenizer.ggml.pre` value, if llama.cpp knows it.
    pub fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        Self::lookup(name).map(|(p, _)| p)
    }

    pub(super) fn lookup(name: &str) -> Option<(PreTokenizer, Quirks)> {
        names::NAMES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, p, q)| (p, q))
    }

    /// Every accepted `tokenizer.ggml.pre` name.
    pub fn names() -> impl Iterator<Item = &'static str> {
        names::NAMES.iter().map(|(n, _, _)| *n)
    }

    /// The accepted names, for messages.
    pub const KNOWN: KnownNames = KnownNames;

    /// Whether words are mapped to GPT-2's byte chars before merging (false for the
    /// SentencePiece-style BPE of Gemma 4 and Sarvam, and for `whitespace`).
    pub fn byte_encode(self) -> bool {
        !matches!(
            self,
            PreTokenizer::Gemma4 | PreTokenizer::SarvamMoe | PreTokenizer::Whitespace
        )
    }

    /// The compiled splitter.
    ///
    /// # Errors
    /// A regex that does not compile (the tables are constants, so this is a bug report).
    pub fn splitter(self) -> Result<PreSplitter, String> {
        let stages = self
            .regexes()
            .iter()
            .map(|re| Stage::cached(re))
            .collect::<Result<_, _>>()?;
        Ok(PreSplitter { kind: self, stages })
    }
}

const RE_GPT2: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const RE_LLAMA3: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_LLAMA3_ADAPTED: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// One of llama.cpp's hand-written splitters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Custom {
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    KimiK2,
    Afmoe,
    Newlines,
}

impl Custom {
    /// The splitter llama.cpp's `unicode_regex_split_custom` runs for `re`, if any.
    fn of(re: &str) -> Option<Custom> {
        Some(match re {
            RE_GPT2 => Custom::Gpt2,
            RE_LLAMA3 | RE_LLAMA3_ADAPTED => Custom::Llama3,
            RE_QWEN2 => Custom::Qwen2,
            RE_QWEN35 => Custom::Qwen35,
            "\\p{Han}+" => Custom::KimiK2,
            "\\p{AFMoE_digits}" | "\\d{1,3}(?=(?:\\d{3})*\\b)" => Custom::Afmoe,
            "[^\\n]+|[\\n]+" => Custom::Newlines,
            _ => return None,
        })
    }

    fn split(self, cps: &[char], out: &mut Vec<usize>) {
        match self {
            Custom::Gpt2 => custom::gpt2(cps, out),
            Custom::Llama3 => custom::llama3(cps, 3, false, out),
            Custom::Qwen2 => custom::llama3(cps, 1, false, out),
            Custom::Qwen35 => custom::llama3(cps, 1, true, out),
            Custom::KimiK2 => custom::kimi_k2(cps, out),
            Custom::Afmoe => custom::afmoe_digits(cps, out),
            Custom::Newlines => custom::newlines(cps, out),
        }
    }
}

/// The category escapes llama.cpp collapses, and what each stands for: the collapsed code
/// point (`k_ucat_cpt`) and the ASCII members (`k_ucat_map`), as a class body.
const CATEGORIES: [(&str, &str); 10] = [
    ("\\p{N}", "\\x{D1}0-9"),
    ("\\p{L}", "\\x{D2}A-Za-z"),
    ("\\p{P}", "\\x{D3}!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    ("\\p{M}", "\\x{D4}"),
    ("\\p{S}", "\\x{D5}\\$\\+<->\\^`\\|~"),
    ("\\p{Lu}", "\\x{D2}A-Za-z"),
    ("\\p{Ll}", "\\x{D2}A-Za-z"),
    ("\\p{Lt}", "\\x{D2}A-Za-z"),
    ("\\p{Lm}", "\\x{D2}A-Za-z"),
    ("\\p{Lo}", "\\x{D2}A-Za-z"),
];

/// The stand-in of a non-ASCII code point in the collapsed text.
fn collapse(c: char) -> char {
    use unicode::Cat;
    if c.is_ascii() {
        return c;
    }
    let f = unicode::flags(c);
    if f.ws {
        return '\x0B';
    }
    match f.cat {
        Cat::Number => '\u{D1}',
        Cat::Letter => '\u{D2}',
        Cat::Punct => '\u{D3}',
        Cat::Mark => '\u{D4}',
        Cat::Symbol => '\u{D5}',
        Cat::Other => '\u{D0}',
    }
}

/// llama.cpp's rewrite of a regex with category escapes for the collapsed text.
fn collapse_regex(re: &str) -> Result<String, String> {
    if !re.is_ascii() {
        return Err(format!(
            "regex {re:?} mixes Unicode categories and non-ASCII characters"
        ));
    }
    let b = re.as_bytes();
    let mut out = String::with_capacity(re.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\'
            && i + 3 < b.len()
            && b[i + 1] == b'p'
            && b[i + 2] == b'{'
            && let Some(close) = re[i + 3..].find('}').map(|p| p + i + 3)
            && close <= i + 10
            && let Some((_, body)) = CATEGORIES.iter().find(|(k, _)| *k == &re[i..=close])
        {
            if !inside {
                out.push('[');
            }
            out.push_str(body);
            if !inside {
                out.push(']');
            }
            i = close + 1;
            continue;
        }
        out.push(char::from(c));
        i += 1;
    }
    Ok(out)
}

/// One step of a pre-tokenizer.
#[derive(Clone, Debug)]
enum Stage {
    Custom(Custom),
    /// A regex; `collapsed`: it runs on the collapsed text.
    Regex {
        re: Box<Regex>,
        collapsed: bool,
    },
}

/// Compiled stages by pattern, at most this many. A process builds the same few pre-tokenizers
/// again and again (each model load; each input of the tokenizer fuzz target), and compiling
/// their Unicode regexes takes up to 0.6 ms per splitter (measured in release builds).
const STAGE_CACHE_MAX: usize = 64;

impl Stage {
    fn cached(re: &str) -> Result<Stage, String> {
        static CACHE: OnceLock<Mutex<HashMap<String, Stage>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        // A panic elsewhere while the lock was held leaves whole entries: the map stays usable.
        let lock = || {
            cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(s) = lock().get(re) {
            return Ok(s.clone());
        }
        let stage = Stage::new(re)?;
        let mut c = lock();
        if c.len() >= STAGE_CACHE_MAX {
            c.clear();
        }
        c.insert(re.to_string(), stage.clone());
        Ok(stage)
    }

    fn new(re: &str) -> Result<Stage, String> {
        if let Some(c) = Custom::of(re) {
            return Ok(Stage::Custom(c));
        }
        let collapsed = CATEGORIES.iter().any(|(k, _)| re.contains(k));
        let pattern = if collapsed {
            collapse_regex(re)?
        } else {
            // std::wregex's `\d` is ASCII only.
            re.replace("\\d", "[0-9]")
        };
        let re = fancy_regex::RegexBuilder::new(&pattern)
            .backtrack_limit(100_000_000)
            .build()
            .map_err(|e| format!("regex {pattern:?}: {e}"))?;
        Ok(Stage::Regex {
            re: Box::new(re),
            collapsed,
        })
    }

    /// Appends the word lengths of segment `cps`.
    fn split(&self, cps: &[char], out: &mut Vec<usize>) {
        let (re, collapsed) = match self {
            Stage::Custom(c) => return c.split(cps, out),
            Stage::Regex { re, collapsed } => (re, *collapsed),
        };
        let mut text = String::with_capacity(cps.len());
        // Byte offset of each code point of `text`, and the end.
        let mut at = Vec::with_capacity(cps.len() + 1);
        for &c in cps {
            at.push(text.len());
            text.push(if collapsed {
                collapse(c)
            } else if !c.is_ascii() && c.is_whitespace() {
                '\x0B'
            } else {
                c
            });
        }
        at.push(text.len());
        let index = |byte: usize| at.partition_point(|&b| b < byte);
        let mut prev = 0;
        for m in re.find_iter(&text) {
            let Ok(m) = m else {
                // Backtracking limit: the rest of the segment stays one piece.
                tracing::warn!("pre-tokenizer regex gave up on a {}-char piece", cps.len());
                break;
            };
            let (s, e) = (index(m.start()), index(m.end()));
            if s > prev {
                out.push(s - prev);
            }
            if e > s {
                out.push(e - s);
            }
            prev = e;
        }
        if prev < cps.len() {
            out.push(cps.len() - prev);
        }
    }
}

/// A compiled pre-tokenizer.
#[derive(Clone, Debug)]
pub struct PreSplitter {
    kind: PreTokenizer,
    stages: Vec<Stage>,
}

impl PreSplitter {
    /// The pre-tokenizer type.
    pub fn kind(&self) -> PreTokenizer {
        self.kind
    }

    /// Splits `text` into words; their concatenation is `text`.
    pub fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let cps: Vec<char> = text.chars().collect();
        let mut lens = vec![cps.len()];
        let mut next = Vec::new();
        for stage in &self.stages {
            next.clear();
            let mut start = 0;
            for &len in &lens {
                stage.split(&cps[start..start + len], &mut next);
                start += len;
            }
            std::mem::swap(&mut lens, &mut next);
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut byte = 0;
        for len in lens {
            let end = byte
                + text[byte..]
                    .chars()
                    .take(len)
                    .map(char::len_utf8)
                    .sum::<usize>();
            if end > byte {
                words.push(&text[byte..end]);
            }
            byte = end;
        }
        words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: PreTokenizer, t: &str) -> Vec<String> {
        let s = p.splitter().unwrap();
        s.split(t).into_iter().map(String::from).collect()
    }

    #[test]
    fn gpt2_words() {
        let g = |t| split(PreTokenizer::Gpt2, t);
        assert_eq!(
            g("Hello world, it's 2024!"),
            ["Hello", " world", ",", " it", "'s", " 2024", "!"]
        );
        // `\s+(?!\S)`: a run of spaces leaves its last one to the next word.
        assert_eq!(g("a   b"), ["a", "  ", " b"]);
        assert_eq!(g("a  \n b  "), ["a", "  \n", " b", "  "]);
        assert_eq!(g("I'M don't"), ["I", "'", "M", " don", "'t"]);
        assert_eq!(g("中文🦀🦀 ok"), ["中文", "🦀🦀", " ok"]);
        assert!(g("").is_empty());
    }

    #[test]
    fn llama3_family_words() {
        let l = |t| split(PreTokenizer::Llama3, t);
        assert_eq!(
            l("Hello world, it's 12345!"),
            ["Hello", " world", ",", " it", "'s", " ", "123", "45", "!"]
        );
        assert_eq!(l("I'M HERE"), ["I", "'M", " HERE"]);
        assert_eq!(l("x  \n\n  y"), ["x", "  \n\n", " ", " y"]);
        assert_eq!(
            split(PreTokenizer::Qwen2, "v12 3"),
            ["v", "1", "2", " ", "3"]
        );
    }

    #[test]
    fn regex_stages_and_collapse() {
        // SmolLM / StarCoder: digits one by one, then GPT-2.
        assert_eq!(
            split(PreTokenizer::Smollm, "ab 123 é"),
            ["ab", " ", "1", "2", "3", " é"]
        );
        // `default`: punctuation runs first, then GPT-2, numbers, and threes of ASCII digits.
        assert_eq!(
            split(PreTokenizer::Default, "x+=12345;"),
            ["x", "+=", "123", "45", ";"]
        );
        // The collapsed regex: `\p{P}` covers non-ASCII punctuation too.
        assert_eq!(split(PreTokenizer::Falcon, "a、b"), ["a", "、", "b"]);
        assert_eq!(
            collapse_regex("[^\\s\\p{L}]\\p{N}").unwrap(),
            "[^\\s\\x{D2}A-Za-z][\\x{D1}0-9]"
        );
        // AFMoE's digit splitter keeps llama.cpp's quirk: the text before a number joins it.
        assert_eq!(split(PreTokenizer::Afmoe, "ab1234"), ["ab", "1", "234"]);
    }

    #[test]
    fn splits_cover_the_text() {
        let t = "  Mixed: CJK 漢字, emoji 🦀👍🏽, tabs\t\tand\r\nlines 1234567 — done.  ";
        for name in PreTokenizer::names() {
            let p = PreTokenizer::from_gguf_name(name).unwrap();
            let words = split(p, t);
            assert_eq!(words.concat(), t, "{name}");
            assert!(words.iter().all(|w| !w.is_empty()), "{name}");
        }
    }
}
