//! Text generation: [`Generator`] (one sequence's tokens and text as an iterator) and
//! [`TextStream`] (streaming detokenization with stop strings, one per sequence of a batch).

use crate::sampling::{Sampler, SamplerError};
use crate::{Batch, BatchLogits, SeqId, Session, Token, Tokenizer, TokenizerError};
use std::fmt;
use std::time::Instant;

/// Why generation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum GenerateError {
    /// The session refused or failed a step (names the device or the op).
    Session(tessera::Error),
    /// The sampler refused the logits.
    Sampler(SamplerError),
    /// A token has no text.
    Tokenizer(TokenizerError),
    /// The caller's picker or logits callback failed.
    Hook(Box<dyn std::error::Error + Send + Sync>),
    /// A step's logits hold a NaN or an infinity: nothing is sampled from them.
    NonFinite {
        /// The generation step (0: the prompt).
        step: usize,
        /// The logit's index (its token id).
        index: usize,
        /// The value.
        value: f32,
    },
}

impl fmt::Display for GenerateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenerateError::Session(e) => write!(f, "{e}"),
            GenerateError::Sampler(e) => write!(f, "sampling: {e}"),
            GenerateError::Tokenizer(e) => write!(f, "detokenizing: {e}"),
            GenerateError::Hook(e) => write!(f, "{e}"),
            GenerateError::NonFinite { step, index, value } => write!(
                f,
                "step {step}: logit {index} is {value}; refusing to sample from non-finite \
                 logits (Session::set_check_finite names the op that produced it)"
            ),
        }
    }
}

impl std::error::Error for GenerateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GenerateError::Session(e) => Some(e),
            GenerateError::Sampler(e) => Some(e),
            GenerateError::Tokenizer(e) => Some(e),
            GenerateError::Hook(e) => Some(e.as_ref()),
            GenerateError::NonFinite { .. } => None,
        }
    }
}

impl From<tessera::Error> for GenerateError {
    fn from(e: tessera::Error) -> Self {
        GenerateError::Session(e)
    }
}

impl From<SamplerError> for GenerateError {
    fn from(e: SamplerError) -> Self {
        GenerateError::Sampler(e)
    }
}

impl From<TokenizerError> for GenerateError {
    fn from(e: TokenizerError) -> Self {
        GenerateError::Tokenizer(e)
    }
}

/// Turns token pieces into text that is safe to show: a UTF-8 character split over two tokens
/// is held until it completes, and text that may be the start of a stop string is held until it
/// is known not to be. Once a stop string appears, the text before it is released and nothing
/// after.
///
/// ```
/// use tessera_model::TextStream;
/// let mut s = TextStream::new(&["\nUser:".to_string()]);
/// assert_eq!(s.push("Hi".as_bytes()), "Hi");
/// assert_eq!(s.push("\nUs".as_bytes()), ""); // may be the stop string: held
/// assert_eq!(s.push("er: more".as_bytes()), "");
/// assert_eq!(s.stopped(), Some("\nUser:"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct TextStream {
    stops: Vec<String>,
    /// Bytes of an unfinished UTF-8 character.
    bytes: Vec<u8>,
    /// Text not yet released (it may begin a stop string).
    held: String,
    stopped: Option<String>,
}

impl TextStream {
    /// A stream stopping at any of `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> TextStream {
        TextStream {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..TextStream::default()
        }
    }

    /// Adds a token's bytes; returns the text that can be shown now (possibly empty).
    pub fn push(&mut self, piece: &[u8]) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        self.bytes.extend_from_slice(piece);
        let valid = match std::str::from_utf8(&self.bytes) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Invalid bytes: release them replaced rather than wait forever.
            Err(_) => self.bytes.len(),
        };
        self.held
            .push_str(&String::from_utf8_lossy(&self.bytes[..valid]));
        self.bytes.drain(..valid);
        if let Some((at, stop)) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|i| (i, s)))
            .min_by_key(|(i, _)| *i)
        {
            self.stopped = Some(stop.clone());
            let out = self.held[..at].to_string();
            self.held.clear();
            self.bytes.clear();
            return out;
        }
        // Hold the longest tail that a stop string starts with.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| {
                        self.held.is_char_boundary(self.held.len() - n)
                            && s.starts_with(&self.held[self.held.len() - n..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// The stop string that ended the text, if one did.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Releases everything held (an unfinished character replaced by U+FFFD); empty after a
    /// stop string.
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        if !self.bytes.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.bytes));
            self.bytes.clear();
        }
        out
    }
}

/// Why a [`Generator`] stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// It generated the most tokens it was allowed.
    MaxTokens,
    /// The model produced a stop token (end of sequence or one given); not part of the text.
    StopToken(Token),
    /// The text reached a stop string; the text ends before it.
    StopString(String),
    /// The cache has no free cell for the next token.
    ContextFull,
    /// A step failed (the error was the iterator's last item).
    Failed,
}

/// A generated token and the text it released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The token, or `None` for the text released when generation ends (held text).
    pub token: Option<Token>,
    /// Text that can be shown now (empty while a character or a possible stop string is held).
    pub text: String,
}

/// Counts and timings of a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenStats {
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Seconds evaluating the prompt.
    pub prompt_secs: f64,
    /// Tokens generated (stop tokens excluded).
    pub generated: usize,
    /// Seconds from the prompt's logits to the last token (sampling and evaluation).
    pub gen_secs: f64,
}

impl GenStats {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        per_second(self.prompt_tokens, self.prompt_secs)
    }

    /// Generated tokens per second.
    pub fn gen_tps(&self) -> f64 {
        per_second(self.generated, self.gen_secs)
    }
}

fn per_second(n: usize, s: f64) -> f64 {
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

type Picker<'a> = Box<dyn FnMut(&[f32], &mut Sampler) -> Result<Token, GenerateError> + 'a>;
type LogitsHook<'a> = Box<dyn FnMut(&[f32]) -> Result<(), GenerateError> + 'a>;

/// One sequence's generation as an iterator of [`Piece`]s: the prompt is evaluated on the first
/// call, then each call samples a token with the sampler chain, releases its text through a
/// [`TextStream`] and evaluates it, until a stop token, a stop string, `max_tokens` or a full
/// cache.
///
/// ```
/// use tessera_model::sampling::{Sampler, SamplerConfig};
/// use tessera_model::{Generator, LlamaConfig, LlamaModel, Session};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let model = LlamaModel::new(LlamaConfig::tiny(), 42)?;
/// let tok = model.synthetic_tokenizer()?;
/// let mut session = Session::builder(&model).build()?;
/// let prompt = tok.encode("once upon", true, false);
/// let sampler = Sampler::new(SamplerConfig::default())?; // greedy
/// let mut generator = Generator::new(&mut session, &tok, sampler, &prompt).max_tokens(8);
/// let mut text = String::new();
/// for piece in &mut generator {
///     text += &piece?.text;
/// }
/// let stats = generator.stats();
/// assert!(stats.generated <= 8);
/// # Ok(()) }
/// ```
pub struct Generator<'a> {
    session: &'a mut Session,
    tok: &'a Tokenizer,
    sampler: Sampler,
    prompt: Vec<Token>,
    seq: SeqId,
    max_tokens: usize,
    stop_tokens: Vec<Token>,
    text: TextStream,
    batch: Batch,
    logits: BatchLogits,
    all_prompt_logits: bool,
    pick: Option<Picker<'a>>,
    on_logits: Option<LogitsHook<'a>>,
    started: bool,
    finish: Option<Finish>,
    stats: GenStats,
    t_gen: Option<Instant>,
}

impl fmt::Debug for Generator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generator")
            .field("seq", &self.seq)
            .field("max_tokens", &self.max_tokens)
            .field("stop_tokens", &self.stop_tokens)
            .field("finish", &self.finish)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<'a> Generator<'a> {
    /// Generation after `prompt` on sequence 0 of `session` (continuing what the sequence
    /// holds), stopping at the tokenizer's end-of-sequence token, with no token limit but the
    /// cache's. The sampler's penalties see the prompt.
    pub fn new(
        session: &'a mut Session,
        tok: &'a Tokenizer,
        mut sampler: Sampler,
        prompt: &[Token],
    ) -> Generator<'a> {
        for &t in prompt {
            sampler.accept(t);
        }
        Generator {
            session,
            tok,
            sampler,
            prompt: prompt.to_vec(),
            seq: 0,
            max_tokens: usize::MAX,
            stop_tokens: tok.eos().into_iter().collect(),
            text: TextStream::default(),
            batch: Batch::new(),
            logits: BatchLogits::default(),
            all_prompt_logits: false,
            pick: None,
            on_logits: None,
            started: false,
            finish: None,
            stats: GenStats::default(),
            t_gen: None,
        }
    }

    /// Generate on sequence `seq` instead of 0.
    pub fn sequence(mut self, seq: SeqId) -> Self {
        self.seq = seq;
        self
    }

    /// Stop after `n` tokens.
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = n;
        self
    }

    /// Also stop at these tokens (the end-of-sequence token always stops).
    pub fn stop_tokens(mut self, tokens: &[Token]) -> Self {
        self.stop_tokens.extend_from_slice(tokens);
        self
    }

    /// Stop when the text reaches any of `stops`; the text ends before it.
    pub fn stop_strings(mut self, stops: &[String]) -> Self {
        self.text = TextStream::new(stops);
        self
    }

    /// Choose each token with `pick(logits, sampler)` instead of the sampler alone (e.g. one
    /// process samples and broadcasts the token to the others); `pick` must `accept` it.
    pub fn with_picker(
        mut self,
        pick: impl FnMut(&[f32], &mut Sampler) -> Result<Token, GenerateError> + 'a,
    ) -> Self {
        self.pick = Some(Box::new(pick));
        self
    }

    /// Calls `f` with every evaluated position's logits before they are sampled from: the
    /// prompt's last position, or all of its positions with `all_prompt`, then each token's.
    pub fn on_logits(
        mut self,
        all_prompt: bool,
        f: impl FnMut(&[f32]) -> Result<(), GenerateError> + 'a,
    ) -> Self {
        self.all_prompt_logits = all_prompt;
        self.on_logits = Some(Box::new(f));
        self
    }

    /// Counts and timings so far.
    pub fn stats(&self) -> GenStats {
        let mut s = self.stats;
        if let Some(t) = self.t_gen
            && self.finish.is_none()
        {
            s.gen_secs = t.elapsed().as_secs_f64();
        }
        s
    }

    /// Why generation stopped, once it has.
    pub fn finish_reason(&self) -> Option<&Finish> {
        self.finish.as_ref()
    }

    /// Evaluates `tokens` on the sequence; every position's logits when `all`.
    fn eval(&mut self, tokens: &[Token], all: bool) -> Result<(), GenerateError> {
        let p0 = self.session.seq_next_pos(self.seq)?;
        self.batch.clear();
        for (i, &t) in tokens.iter().enumerate() {
            self.batch
                .add(t, p0 + i, self.seq, all || i + 1 == tokens.len());
        }
        self.session.decode_into(&self.batch, &mut self.logits)?;
        let n = self.logits.n_vocab().max(1);
        for (r, row) in self.logits.as_slice().chunks(n).enumerate() {
            if let Some(f) = self.on_logits.as_mut() {
                f(row)?;
            }
            // Only the row sampled from must be finite.
            if r + 1 == self.logits.len()
                && let Some((index, value)) = crate::first_non_finite(row)
            {
                return Err(GenerateError::NonFinite {
                    step: self.stats.generated,
                    index,
                    value,
                });
            }
        }
        Ok(())
    }

    fn last_logits(&self) -> &[f32] {
        let n = self.logits.n_vocab();
        let all = self.logits.as_slice();
        &all[all.len() - n..]
    }

    fn step(&mut self) -> Result<Option<Piece>, GenerateError> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if !self.started {
            self.started = true;
            let t = Instant::now();
            let prompt = std::mem::take(&mut self.prompt);
            self.eval(&prompt, self.all_prompt_logits)?;
            self.stats.prompt_tokens = prompt.len();
            self.stats.prompt_secs = t.elapsed().as_secs_f64();
            self.t_gen = Some(Instant::now());
        }
        if self.stats.generated >= self.max_tokens {
            return Ok(self.end(Finish::MaxTokens));
        }
        let logits = self.last_logits().to_vec();
        let token = match self.pick.as_mut() {
            Some(pick) => pick(&logits, &mut self.sampler)?,
            None => {
                let t = self.sampler.sample(&logits)?;
                self.sampler.accept(t);
                t
            }
        };
        if self.stop_tokens.contains(&token) {
            return Ok(self.end(Finish::StopToken(token)));
        }
        let mut text = self.text.push(&self.tok.token_to_piece(token, false)?);
        self.stats.generated += 1;
        if let Some(stop) = self.text.stopped() {
            let stop = stop.to_string();
            self.end(Finish::StopString(stop));
            return Ok(Some(Piece {
                token: Some(token),
                text,
            }));
        }
        let full = self.session.cells_used() >= self.session.model().config().n_ctx;
        if self.stats.generated >= self.max_tokens || full {
            // The last piece carries whatever the stream still held back.
            if let Some(rest) = self.end(if full {
                Finish::ContextFull
            } else {
                Finish::MaxTokens
            }) {
                text.push_str(&rest.text);
            }
        } else {
            self.eval(&[token], false)?;
        }
        Ok(Some(Piece {
            token: Some(token),
            text,
        }))
    }

    /// Marks the end and returns the held text, if any, as a last piece.
    fn end(&mut self, why: Finish) -> Option<Piece> {
        if let Some(t) = self.t_gen {
            self.stats.gen_secs = t.elapsed().as_secs_f64();
        }
        self.finish = Some(why);
        let text = self.text.finish();
        (!text.is_empty()).then_some(Piece { token: None, text })
    }
}

impl Iterator for Generator<'_> {
    type Item = Result<Piece, GenerateError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(p) => p.map(Ok),
            Err(e) => {
                // An error ends the generation; the session's cache is as the failed step left
                // it (a refused step changes nothing).
                if let Some(t) = self.t_gen {
                    self.stats.gen_secs = t.elapsed().as_secs_f64();
                }
                self.finish = Some(Finish::Failed);
                Some(Err(e))
            }
        }
    }
}
