//! Tessera's tokenizers: text ↔ token ids from a GGUF file's `tokenizer.ggml.*` metadata
//! ([`Tokenizer`]), and chat templates ([`ChatTemplate`]).
//!
//! Two vocabulary models, as llama.cpp names them:
//! - `llama`: SentencePiece-style BPE over `tokenizer.ggml.tokens` and `tokenizer.ggml.scores`.
//!   Spaces become `▁` (U+2581), a `▁` is prefixed to the text and after each special token
//!   (`tokenizer.ggml.add_space_prefix`, default on), chars outside the vocabulary fall back to
//!   `<0xXX>` byte tokens. (`spm.rs`)
//! - `gpt2`: byte-level BPE: text is split into words by the pre-tokenizer named by
//!   `tokenizer.ggml.pre` ([`PreTokenizer`]), each word's bytes are mapped to GPT-2's printable
//!   chars and merged by the ranks of `tokenizer.ggml.merges`. (`bpe.rs`) `gemma4` is the same
//!   over raw UTF-8 with spaces as `▁`.
//!
//! Token types come from `tokenizer.ggml.token_type` (all normal if absent). Special tokens
//! (control, user-defined, unknown) are matched as whole strings in the input, longest first:
//! user-defined ones always, control and unknown ones only with `parse_special`. `decode`
//! renders control and unknown tokens only with `render_special`; byte tokens become their byte,
//! and the pieces are joined as bytes before UTF-8 decoding, so characters split over byte
//! tokens come back whole.
//!
//! BOS / EOS: `tokenizer.ggml.bos_token_id` / `eos_token_id` (when absent: 1 and 2 for `llama`,
//! 11 for `gpt2`), added by `encode` with `add_special` per `tokenizer.ggml.add_bos_token`
//! (default on for `llama` and the pre-tokenizers llama.cpp turns it on for) / `add_eos_token`
//! (default off).
//!
//! Every `tokenizer.ggml.pre` name llama.cpp accepts for BPE is implemented as llama.cpp runs it
//! (`pretok/`); tested against llama.cpp's own outputs (`tests_llama.rs`). Chat templates:
//! `chat.rs`.
//!
//! Not implemented: other vocabulary models (WPM, UGM, RWKV: an error naming them), llama.cpp's
//! `clean_spaces` decoding and the lstrip/rstrip attributes of special tokens.

#![deny(unsafe_code)]

mod bpe;
mod chat;
mod pretok;
mod spm;
mod synthetic;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_llama;

pub use chat::{ChatError, ChatMessage, ChatTemplate, KEY_CHAT_TEMPLATE, user_turn};
pub use pretok::{KnownNames, PreSplitter, PreTokenizer};
pub use synthetic::synthetic_vocab;

use std::collections::HashMap;
use tessera_gguf::{GgufError, GgufFile, Metadata};

/// A token id (i32, as the model's inputs take them).
pub type Token = i32;

/// GGUF key of the vocabulary model name.
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// GGUF key of the token texts.
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// GGUF key of the token scores (SentencePiece merge priorities).
pub const KEY_SCORES: &str = "tokenizer.ggml.scores";
/// GGUF key of the token types ([`TokenType`] ids).
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// GGUF key of the BPE merges (`"left right"`, highest priority first).
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// GGUF key of the pre-tokenizer name.
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// GGUF key of the beginning-of-sequence token id.
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
/// GGUF key of the end-of-sequence token id.
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
/// GGUF key of the unknown token id.
pub const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
/// GGUF key of the padding token id.
pub const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
/// GGUF key: whether `encode` with `add_special` adds BOS.
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// GGUF key: whether `encode` with `add_special` adds EOS.
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// GGUF key: whether SentencePiece text gets a leading `▁`.
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// The type of a token (GGUF `tokenizer.ggml.token_type`, llama.cpp's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: not set.
    Undefined,
    /// 1: ordinary text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, EOS, chat markers).
    Control,
    /// 4: user-defined: always matched whole in the input, rendered as-is.
    UserDefined,
    /// 5: unused slot.
    Unused,
    /// 6: a byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenType {
    /// The type of GGUF id `id`.
    pub fn from_id(id: i32) -> Option<TokenType> {
        Some(match id {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// GGUF's id of the type.
    pub fn id(self) -> i32 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => 1,
            TokenType::Unknown => 2,
            TokenType::Control => 3,
            TokenType::UserDefined => 4,
            TokenType::Unused => 5,
            TokenType::Byte => 6,
        }
    }

    /// Whether the input is searched for this token's text as a whole (control, user-defined,
    /// unknown).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }
}

/// Why a tokenizer could not be built, or a token not decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A key is missing or has the wrong type.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` names a model this tokenizer does not implement.
    #[error("{file}: unsupported tokenizer model {model:?} (supported: llama, gpt2, gemma4)")]
    UnsupportedModel {
        /// The file.
        file: String,
        /// The model name.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this tokenizer does not implement.
    #[error(
        "{file}: unsupported pre-tokenizer {pre:?} (supported: {})",
        PreTokenizer::KNOWN
    )]
    UnsupportedPreTokenizer {
        /// The file.
        file: String,
        /// The pre-tokenizer name.
        pre: String,
    },
    /// A vocabulary key holds something inconsistent (lengths, ids, types, merges).
    #[error("{file}: key {key}: {reason}")]
    InvalidVocab {
        /// The file.
        file: String,
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary (0..{n_vocab})")]
    UnknownToken {
        /// The id.
        token: Token,
        /// Size of the vocabulary.
        n_vocab: usize,
    },
}

/// Token texts, scores and types, and the text → id map.
#[derive(Clone, Debug)]
struct Vocab {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    by_text: HashMap<String, Token>,
    unk: Option<Token>,
}

impl Vocab {
    fn id(&self, text: &str) -> Option<Token> {
        self.by_text.get(text).copied()
    }

    fn score(&self, id: Token) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
}

#[derive(Clone, Debug)]
enum Model {
    Spm,
    Bpe {
        merges: bpe::Merges,
        pre: PreSplitter,
        opts: bpe::WordOpts,
        /// Spaces become `▁` before splitting (SentencePiece-style BPE).
        escape_whitespaces: bool,
    },
}

/// A piece of the input: raw text, or a special token matched whole.
enum Fragment<'a> {
    Text(&'a str),
    Special(Token),
}

/// A tokenizer built from GGUF metadata. See the module doc for the models and rules.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    bos: Option<Token>,
    eos: Option<Token>,
    pad: Option<Token>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Special tokens, longest text first.
    specials: Vec<Token>,
    /// Fallback token of each byte (`<0xXX>`).
    byte_tokens: Vec<Option<Token>>,
    /// The byte of each byte-type token.
    byte_values: Vec<Option<u8>>,
}

impl Tokenizer {
    /// The tokenizer of a GGUF file.
    ///
    /// # Errors
    /// As [`Tokenizer::from_metadata`].
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(file.metadata())
    }

    /// The tokenizer described by `tokenizer.ggml.*` keys.
    ///
    /// # Errors
    /// Missing or mistyped keys ([`TokenizerError::Gguf`]); an unsupported model or
    /// pre-tokenizer; inconsistent vocabulary data ([`TokenizerError::InvalidVocab`]: array
    /// lengths that differ from the token count, ids outside the vocabulary, unknown token types,
    /// malformed merges or byte tokens, BOS/EOS requested but not defined).
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let invalid = |key: &str, reason: String| TokenizerError::InvalidVocab {
            file: md.source().to_string(),
            key: key.to_string(),
            reason,
        };
        let model_name = md.get_str(KEY_MODEL)?;
        let tokens = md.get_str_array(KEY_TOKENS)?.to_vec();
        let n = tokens.len();
        if n == 0 || Token::try_from(n).is_err() {
            return Err(invalid(KEY_TOKENS, format!("{n} tokens")));
        }
        let check_len = |key: &str, len: usize| {
            if len == n {
                Ok(())
            } else {
                Err(invalid(key, format!("{len} entries for {n} tokens")))
            }
        };
        let scores = match md.get(KEY_SCORES) {
            None => vec![0.0; n],
            Some(_) => md.get_f32_array(KEY_SCORES)?.to_vec(),
        };
        check_len(KEY_SCORES, scores.len())?;
        let types = match md.get(KEY_TOKEN_TYPE) {
            None => vec![TokenType::Normal; n],
            Some(_) => md
                .get_i32_array(KEY_TOKEN_TYPE)?
                .iter()
                .enumerate()
                .map(|(i, &t)| {
                    TokenType::from_id(t)
                        .ok_or_else(|| invalid(KEY_TOKEN_TYPE, format!("token {i}: type {t}")))
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        check_len(KEY_TOKEN_TYPE, types.len())?;
        // llama.cpp marks end-of-generation tokens found by text as control tokens.
        let mut types = types;
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            if EOG_TEXTS.contains(&t.as_str()) {
                *ty = TokenType::Control;
            }
        }
        let id_of = |key: &str| -> Result<Option<Token>, TokenizerError> {
            if !md.contains(key) {
                return Ok(None);
            }
            let v = md.get_uint(key)?;
            match Token::try_from(v) {
                Ok(id) if (id as usize) < n => Ok(Some(id)),
                _ => Err(invalid(
                    key,
                    format!("id {v} is outside the vocabulary of {n}"),
                )),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool, TokenizerError> {
            Ok(if md.contains(key) {
                md.get_bool(key)?
            } else {
                default
            })
        };
        let in_vocab = |id: Token| ((id as usize) < n).then_some(id);
        let (model, bos, eos, unk, add_bos, add_space_prefix) = match model_name {
            "llama" => (
                Model::Spm,
                id_of(KEY_BOS)?.or(in_vocab(1)),
                id_of(KEY_EOS)?.or(in_vocab(2)),
                id_of(KEY_UNK)?.or(in_vocab(0)),
                flag(KEY_ADD_BOS, true)?,
                flag(KEY_ADD_SPACE_PREFIX, true)?,
            ),
            "gpt2" | "gemma4" => {
                let merges = bpe::Merges::parse(md.get_str_array(KEY_MERGES)?)
                    .map_err(|r| invalid(KEY_MERGES, r))?;
                let pre_name = if model_name == "gemma4" {
                    "gemma4"
                } else if md.contains(KEY_PRE) {
                    md.get_str(KEY_PRE)?
                } else {
                    "default"
                };
                let (pre, quirks) = PreTokenizer::lookup(pre_name).ok_or_else(|| {
                    TokenizerError::UnsupportedPreTokenizer {
                        file: md.source().to_string(),
                        pre: pre_name.to_string(),
                    }
                })?;
                let splitter = pre.splitter().map_err(|r| invalid(KEY_PRE, r))?;
                // llama.cpp's defaults: BOS = EOS = 11 for `gpt2`, none for `gemma4` or where
                // the pre-tokenizer clears BOS; Gemma 4 always adds BOS.
                let default_special = (model_name == "gpt2").then(|| in_vocab(11)).flatten();
                let bos = id_of(KEY_BOS)?.or(default_special.filter(|_| !quirks.no_bos));
                let add_bos = flag(KEY_ADD_BOS, quirks.add_bos)? || pre == PreTokenizer::Gemma4;
                let model = Model::Bpe {
                    merges,
                    pre: splitter,
                    opts: bpe::WordOpts {
                        ignore_merges: quirks.ignore_merges,
                        byte_encode: pre.byte_encode(),
                        whole_newlines: pre == PreTokenizer::Gemma4,
                    },
                    escape_whitespaces: quirks.escape_whitespaces,
                };
                (
                    model,
                    bos,
                    id_of(KEY_EOS)?.or(default_special),
                    id_of(KEY_UNK)?,
                    add_bos,
                    false,
                )
            }
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    file: md.source().to_string(),
                    model: other.to_string(),
                });
            }
        };
        let add_eos = flag(KEY_ADD_EOS, false)?;
        if add_bos && bos.is_none() {
            return Err(invalid(
                KEY_ADD_BOS,
                format!("set, but {KEY_BOS} is absent"),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(invalid(
                KEY_ADD_EOS,
                format!("set, but {KEY_EOS} is absent"),
            ));
        }
        let mut byte_values = vec![None; n];
        for (i, t) in types.iter().enumerate() {
            if *t == TokenType::Byte {
                let b = parse_byte_token(&tokens[i]).ok_or_else(|| {
                    invalid(KEY_TOKENS, format!("byte token {i} is {:?}", tokens[i]))
                })?;
                byte_values[i] = Some(b);
            }
        }
        let mut by_text = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // A later duplicate wins, as in llama.cpp's map.
            by_text.insert(t.clone(), i as Token);
        }
        let mut specials: Vec<Token> = (0..n)
            .filter(|&i| types[i].is_special() && !tokens[i].is_empty())
            .map(|i| i as Token)
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        let byte_tokens = (0..=255u8)
            .map(|b| by_text.get(&format!("<0x{b:02X}>")).copied())
            .collect();
        Ok(Tokenizer {
            vocab: Vocab {
                tokens,
                scores,
                types,
                by_text,
                unk,
            },
            model,
            bos,
            eos,
            pad: id_of(KEY_PAD)?,
            add_bos,
            add_eos,
            add_space_prefix,
            specials,
            byte_tokens,
            byte_values,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// The vocabulary model (`llama` or `gpt2`; Gemma 4's `gemma4` BPE reports `gpt2`).
    pub fn model_name(&self) -> &'static str {
        match self.model {
            Model::Spm => "llama",
            Model::Bpe { .. } => "gpt2",
        }
    }

    /// Number of BPE merges (0 for `llama` vocabularies).
    pub fn merge_count(&self) -> usize {
        match &self.model {
            Model::Spm => 0,
            Model::Bpe { merges, .. } => merges.len(),
        }
    }

    /// The pre-tokenizer of a BPE vocabulary.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Spm => None,
            Model::Bpe { pre, .. } => Some(pre.kind()),
        }
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<Token> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<Token> {
        self.eos
    }

    /// The unknown token.
    pub fn unk(&self) -> Option<Token> {
        self.vocab.unk
    }

    /// The padding token.
    pub fn pad(&self) -> Option<Token> {
        self.pad
    }

    /// Whether `encode` with `add_special` adds BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode` with `add_special` adds EOS.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// The stored text of `token` (with `▁` or GPT-2 byte chars, as in the file).
    pub fn token_text(&self, token: Token) -> Option<&str> {
        self.vocab
            .tokens
            .get(usize::try_from(token).ok()?)
            .map(String::as_str)
    }

    /// The type of `token`.
    pub fn token_type(&self, token: Token) -> Option<TokenType> {
        self.vocab.types.get(usize::try_from(token).ok()?).copied()
    }

    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<Token> {
        self.vocab.id(text)
    }

    /// Tokens of `text`. With `add_special`, BOS and EOS are added as the vocabulary asks; with
    /// `parse_special`, control and unknown tokens written in the text are matched whole
    /// (user-defined ones always are).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.partition(text, parse_special);
        match &self.model {
            Model::Spm => {
                let mut after_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(t) => {
                            let escaped = spm::escape(t, self.add_space_prefix && after_special);
                            spm::tokenize(
                                &self.vocab,
                                &escaped,
                                |b| self.byte_fallback(b),
                                &mut out,
                            );
                            after_special = false;
                        }
                        Fragment::Special(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
            Model::Bpe {
                merges,
                pre,
                opts,
                escape_whitespaces,
            } => {
                for f in fragments {
                    match f {
                        Fragment::Text(t) => {
                            let escaped;
                            let t = if *escape_whitespaces {
                                escaped = t.replace(' ', "\u{2581}");
                                escaped.as_str()
                            } else {
                                t
                            };
                            for word in pre.split(t) {
                                let mapped;
                                let word = if opts.byte_encode {
                                    mapped = bpe::encode_bytes(word);
                                    mapped.as_str()
                                } else {
                                    word
                                };
                                bpe::tokenize_word(&self.vocab, merges, word, *opts, &mut out);
                            }
                        }
                        Fragment::Special(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The bytes `token` renders as: text for normal and user-defined tokens, the byte of a
    /// byte token, the text of control and unknown tokens only with `render_special`, nothing
    /// for unused ones. May be part of a UTF-8 character.
    ///
    /// # Errors
    /// [`TokenizerError::UnknownToken`] for an id outside the vocabulary.
    pub fn token_to_piece(
        &self,
        token: Token,
        render_special: bool,
    ) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        self.append_piece(token, render_special, &mut out)?;
        Ok(out)
    }

    /// The text of `tokens`: pieces joined as bytes, then decoded as UTF-8 (invalid sequences
    /// become U+FFFD). For `llama` vocabularies with a space prefix, the leading space of the
    /// first piece that renders anything is removed, so `decode(encode(t))` gives `t` back.
    ///
    /// # Errors
    /// [`TokenizerError::UnknownToken`] for an id outside the vocabulary.
    pub fn decode(&self, tokens: &[Token], render_special: bool) -> Result<String, TokenizerError> {
        let mut out = Vec::new();
        let mut strip = self.add_space_prefix && matches!(self.model, Model::Spm);
        for &t in tokens {
            let start = out.len();
            self.append_piece(t, render_special, &mut out)?;
            if strip && out.len() > start {
                if out[start] == b' ' {
                    out.remove(start);
                }
                strip = false;
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn append_piece(
        &self,
        token: Token,
        render_special: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), TokenizerError> {
        let i = usize::try_from(token)
            .ok()
            .filter(|&i| i < self.n_vocab())
            .ok_or(TokenizerError::UnknownToken {
                token,
                n_vocab: self.n_vocab(),
            })?;
        let text = &self.vocab.tokens[i];
        match self.vocab.types[i] {
            TokenType::Normal => match self.model {
                Model::Spm => {
                    for c in text.chars() {
                        let c = if c == spm::SPACE { ' ' } else { c };
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                }
                Model::Bpe { opts, .. } if opts.byte_encode => bpe::decode_bytes(text, out),
                Model::Bpe { .. } => {
                    out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
                }
            },
            TokenType::UserDefined => out.extend_from_slice(text.as_bytes()),
            TokenType::Control | TokenType::Unknown => {
                if render_special {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            TokenType::Byte => out.extend(self.byte_values[i]),
            TokenType::Unused | TokenType::Undefined => {}
        }
        Ok(())
    }

    /// The token a byte falls back to: `<0xXX>`, else the byte's own one-char token (ASCII).
    fn byte_fallback(&self, b: u8) -> Option<Token> {
        self.byte_tokens[b as usize].or_else(|| {
            b.is_ascii()
                .then(|| self.vocab.id(char::from(b).encode_utf8(&mut [0; 4])))
                .flatten()
        })
    }

    /// Splits `text` at special tokens, longest first.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = Vec::new();
        if !text.is_empty() {
            frags.push(Fragment::Text(text));
        }
        for &id in &self.specials {
            let ty = self.vocab.types[id as usize];
            if !parse_special && ty != TokenType::UserDefined {
                continue;
            }
            let needle = self.vocab.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Special(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }
}

/// Texts llama.cpp takes for end-of-generation tokens and makes control tokens, whatever
/// their stored type (`llama_vocab::impl::load`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The byte of a `<0xXX>` token text.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
