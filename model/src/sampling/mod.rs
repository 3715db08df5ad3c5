//! Token sampling with llama.cpp's semantics: the chain llama.cpp users expect,
//!
//! ```
//! use tessera_model::sampling::{Sampler, SamplerConfig};
//! let config = SamplerConfig { temperature: 0.8, seed: 7, ..SamplerConfig::default() };
//! let mut sampler = Sampler::new(config)?; // validates every parameter
//! for &t in &[1, 2, 3] {
//!     sampler.accept(t); // the prompt feeds the repetition penalties
//! }
//! let logits = vec![0.5f32, 2.0, -1.0, 1.5];
//! let next = sampler.sample(&logits)?; // top-k 40, top-p 0.95, min-p 0.05, T = 0.8
//! sampler.accept(next); // the caller records what it feeds back
//! # Ok::<(), tessera_model::sampling::SamplerError>(())
//! ```
//!
//! The stages, in llama.cpp's order:
//!
//! ```text
//! penalties -> top-k -> top-p -> min-p -> temperature -> distribution draw
//! ```
//!
//! Each stage follows the behaviour of the corresponding llama.cpp sampler
//! (`src/llama-sampling.cpp`):
//!
//! * **penalties** (`llama_sampler_penalties_apply`): for every token seen in
//!   the last `penalty_last_n` accepted tokens, a positive logit is divided by
//!   `repeat_penalty` and a non-positive one is multiplied by it; then
//!   `count * frequency_penalty + presence_penalty` is subtracted, where
//!   `count` is the number of occurrences in the window (the presence penalty
//!   is applied once, whatever the count). The stage is skipped when
//!   `penalty_last_n == 0` or when all three penalties are neutral.
//! * **top-k** (`llama_sampler_top_k_impl`): `top_k == 0` disables it;
//!   otherwise the `min(top_k, n)` highest logits are kept, sorted in
//!   descending order.
//! * **top-p** (`llama_sampler_top_p_apply`): disabled when `top_p >= 1`;
//!   otherwise the softmax of the current candidates is taken and the
//!   smallest prefix (in descending probability order) whose cumulative
//!   probability reaches `top_p` is kept, at least one token.
//! * **min-p** (`llama_sampler_min_p_apply`): disabled when `min_p <= 0`;
//!   otherwise a candidate is kept when `p >= min_p * p_max`, i.e. when its
//!   logit is at least `max_logit + ln(min_p)`; at least one token is kept.
//! * **temperature** (`llama_sampler_temp_impl`): logits are divided by the
//!   temperature. A temperature `<= 0` means greedy decoding: the sampler
//!   returns the argmax of the penalized logits (ties go to the lowest token
//!   id) without consuming randomness.
//! * **distribution draw** (`llama_sampler_dist_apply`): softmax over the
//!   surviving candidates and one inverse-CDF draw with a deterministic
//!   xoshiro256\*\* generator seeded from [`SamplerConfig::seed`].
//!
//! Like llama.cpp with its default `min_keep`, every filter keeps at least
//! one candidate. Ties between equal logits are always broken towards the
//! lower token id, which makes the whole chain deterministic for a given seed.
//!
//! # Cost on large vocabularies
//!
//! Buffers are reused across calls, so a steady-state call does not
//! allocate. Greedy decoding is a single argmax scan of the logits. With
//! `top_k > 0`, top-k is one pass over the vocabulary that buffers only
//! candidates beating the current `k`-th best logit and trims the buffer
//! with `select_nth_unstable_by`; only the `k` survivors are sorted. The
//! logits row is copied only when a penalty actually applies. Without
//! top-k, top-p on a large unsorted list sorts the best 256 candidates
//! first (llama.cpp's heuristic) and extends the sorted prefix
//! geometrically only if the nucleus is larger, so its cost grows with the
//! size of the nucleus rather than always sorting the whole vocabulary.

mod rng;
mod stages;
#[cfg(test)]
mod tests;

use rng::Rng;
use stages::{Candidates, PenaltyWindow, argmax, check_logits};
use std::fmt;
use tessera_tokenizer::Token;

/// Parameters of the sampler chain.
///
/// The defaults are llama.cpp's `common_params_sampling` defaults except for
/// [`temperature`](Self::temperature), which defaults to `0.0` (greedy) in
/// Tessera while llama.cpp's CLI uses `0.8`.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature applied after the filters. `0.0` selects greedy
    /// decoding (argmax of the penalized logits). Must be finite and `>= 0`.
    /// Tessera's default is `0.0`; llama.cpp's CLI default is `0.8`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables the stage.
    /// Default `40`.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose
    /// cumulative probability reaches `top_p`; `1.0` disables the stage.
    /// Must be in `(0, 1]`. Default `0.95`.
    pub top_p: f32,
    /// Keep tokens whose probability is at least `min_p` times the
    /// probability of the most likely token; `0.0` disables the stage.
    /// Must be in `[0, 1]`. Default `0.05`.
    pub min_p: f32,
    /// Repetition penalty: positive logits of recently seen tokens are
    /// divided by it, non-positive ones multiplied by it; `1.0` disables it.
    /// Must be finite and `> 0`. Default `1.0`.
    pub repeat_penalty: f32,
    /// Subtracted from a recently seen token's logit once per occurrence in
    /// the penalty window; `0.0` disables it. Must be finite. Default `0.0`.
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of any token present in the penalty
    /// window; `0.0` disables it. Must be finite. Default `0.0`.
    pub presence_penalty: f32,
    /// Number of most recent accepted tokens the penalties look at; `0`
    /// disables the penalties (llama.cpp's `-1`, "context size", has no
    /// equivalent here: pass the context length instead). Default `64`.
    pub penalty_last_n: usize,
    /// Seed of the pseudo-random generator used for the distribution draw.
    /// The same seed, configuration, logits and accepted tokens always give
    /// the same tokens. Default `0`.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's common defaults (`top_k` 40, `top_p` 0.95, `min_p` 0.05,
    /// neutral penalties over the last 64 tokens) with Tessera's greedy
    /// `temperature` of `0.0` (llama.cpp's CLI uses `0.8`) and seed `0`.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Plain greedy decoding: temperature `0.0`, every filter and penalty
    /// disabled, so [`Sampler::sample`] returns the argmax of the raw logits
    /// (lowest token id on ties), like llama.cpp's greedy sampler.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..Self::default()
        }
    }

    /// Checks every parameter against its accepted range.
    ///
    /// Rejects a non-finite or negative `temperature`, a `top_p` outside
    /// `(0, 1]`, a `min_p` outside `[0, 1]`, a non-finite or non-positive
    /// `repeat_penalty`, and non-finite `frequency_penalty` or
    /// `presence_penalty`. The error names the parameter and its range.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let invalid = |parameter, value, expected| {
            Err(SamplerError::InvalidParameter {
                parameter,
                value,
                expected,
            })
        };
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return invalid("temperature", t, "a finite value >= 0 (0 = greedy)");
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return invalid("top_p", p, "a value in (0, 1] (1 = disabled)");
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return invalid("min_p", m, "a value in [0, 1] (0 = disabled)");
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return invalid("repeat_penalty", r, "a finite value > 0 (1 = disabled)");
        }
        if !self.frequency_penalty.is_finite() {
            return invalid(
                "frequency_penalty",
                self.frequency_penalty,
                "a finite value (0 = disabled)",
            );
        }
        if !self.presence_penalty.is_finite() {
            return invalid(
                "presence_penalty",
                self.presence_penalty,
                "a finite value (0 = disabled)",
            );
        }
        Ok(())
    }

    /// Whether the penalty stage changes anything (llama.cpp skips it when
    /// the window is empty or all three penalties are neutral).
    fn penalties_active(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// Errors reported by [`SamplerConfig::validate`] and [`Sampler`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SamplerError {
    /// A configuration parameter is outside its accepted range.
    InvalidParameter {
        /// Name of the offending [`SamplerConfig`] field.
        parameter: &'static str,
        /// The rejected value.
        value: f32,
        /// Human-readable description of the accepted range.
        expected: &'static str,
    },
    /// The logits slice passed to the sampler is empty.
    EmptyLogits,
    /// A logit is NaN or infinite.
    NonFiniteLogit {
        /// Index (token id) of the first non-finite logit.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// The logits slice has more entries than token ids (`i32`) can address.
    VocabTooLarge {
        /// Length of the logits slice.
        len: usize,
    },
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidParameter {
                parameter,
                value,
                expected,
            } => write!(
                f,
                "invalid sampler parameter `{parameter}` = {value}: expected {expected}"
            ),
            Self::EmptyLogits => write!(f, "cannot sample from an empty logits slice"),
            Self::NonFiniteLogit { index, value } => {
                write!(f, "logit at index {index} is not finite ({value})")
            }
            Self::VocabTooLarge { len } => {
                write!(f, "{len} logits exceed the range of token ids")
            }
        }
    }
}

impl std::error::Error for SamplerError {}

/// A stateful token sampler: penalty window, random generator and reused
/// buffers.
///
/// The caller feeds every token that should count for the penalties —
/// prompt tokens and sampled tokens alike — through [`accept`](Self::accept);
/// [`sample`](Self::sample) does not record the token it returns.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    window: PenaltyWindow,
    candidates: Candidates,
    /// Penalized copy of the logits row, used only when penalties apply.
    penalized: Vec<f32>,
}

impl Sampler {
    /// Creates a sampler after [validating](SamplerConfig::validate) the
    /// configuration.
    pub fn new(config: SamplerConfig) -> Result<Self, SamplerError> {
        config.validate()?;
        Ok(Self::new_unchecked(config))
    }

    fn new_unchecked(config: SamplerConfig) -> Self {
        Self {
            rng: Rng::new(config.seed),
            window: PenaltyWindow::new(config.penalty_last_n),
            candidates: Candidates::default(),
            penalized: Vec::new(),
            config,
        }
    }

    /// The configuration this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks the next token id from one row of logits (one entry per
    /// vocabulary token).
    ///
    /// Runs penalties, top-k, top-p, min-p, temperature and a seeded draw.
    /// With a temperature of `0` it returns the argmax of the penalized
    /// logits (lowest id on ties) and consumes no randomness.
    ///
    /// # Errors
    ///
    /// [`SamplerError::EmptyLogits`] for an empty slice,
    /// [`SamplerError::NonFiniteLogit`] naming the first NaN or infinite
    /// logit, [`SamplerError::VocabTooLarge`] beyond the token ids' range.
    pub fn sample(&mut self, logits: &[f32]) -> Result<Token, SamplerError> {
        let row = if self.prepare(logits)? {
            &self.penalized[..]
        } else {
            logits
        };
        let id = if self.config.temperature <= 0.0 {
            argmax(row) as u32
        } else {
            filter(&self.config, &mut self.candidates, row);
            let u = self.rng.next_f64();
            let i = self.candidates.dist(self.config.temperature, u);
            self.candidates.data[i].id
        };
        // `prepare` refused vocabularies beyond `Token`'s range.
        Ok(id as Token)
    }

    /// Records `token` in the penalty window (the last `penalty_last_n`
    /// accepted tokens). Call it for prompt tokens and for every generated
    /// token. A no-op when `penalty_last_n == 0` (and for negative ids, which
    /// no vocabulary has).
    pub fn accept(&mut self, token: Token) {
        if let Ok(t) = u32::try_from(token) {
            self.window.accept(t);
        }
    }

    /// Clears the penalty history and re-seeds the generator from the
    /// configured seed, so the sampler behaves as if freshly created.
    pub fn reset(&mut self) {
        self.window.clear();
        self.rng = Rng::new(self.config.seed);
    }

    /// The candidates that survive penalties, top-k, top-p and min-p, with
    /// their probabilities after temperature and normalization — what the
    /// final draw samples from — in the order llama.cpp holds them (sorted
    /// best first once top-k or top-p ran, vocabulary order otherwise).
    ///
    /// With a temperature of `0` the surviving candidates are returned with
    /// probability `1` for the token [`sample`](Self::sample) would return
    /// and `0` for the others. Uses the current penalty history; consumes no
    /// randomness.
    ///
    /// # Errors
    ///
    /// The same input errors as [`sample`](Self::sample).
    pub fn probabilities(&mut self, logits: &[f32]) -> Result<Vec<(u32, f32)>, SamplerError> {
        let row = if self.prepare(logits)? {
            &self.penalized[..]
        } else {
            logits
        };
        filter(&self.config, &mut self.candidates, row);
        self.candidates.dist(self.config.temperature, 0.0);
        Ok(self.candidates.data.iter().map(|c| (c.id, c.p)).collect())
    }

    /// Validates `logits` and, when penalties apply, writes the penalized
    /// row to `self.penalized`. Returns whether it did.
    fn prepare(&mut self, logits: &[f32]) -> Result<bool, SamplerError> {
        check_logits(logits)?;
        if !self.config.penalties_active() || self.window.counts.is_empty() {
            return Ok(false);
        }
        self.penalized.clear();
        self.penalized.extend_from_slice(logits);
        self.window.apply(&self.config, &mut self.penalized);
        Ok(true)
    }
}

/// Loads `row` (penalized logits) into `cands` and runs top-k, top-p and
/// min-p.
fn filter(config: &SamplerConfig, cands: &mut Candidates, row: &[f32]) {
    let k = config.top_k;
    if k > 0 && k < row.len() {
        cands.fill_top_k(row, k);
    } else {
        cands.fill_all(row);
        cands.top_k(k);
    }
    cands.top_p(config.top_p);
    cands.min_p(config.min_p);
}

/// Runs the chain once on `logits` after accepting `history` and returns the
/// surviving candidates with their final normalized probabilities (see
/// [`Sampler::probabilities`]).
///
/// # Errors
///
/// An invalid `config`, or the input errors of [`Sampler::sample`].
pub fn probabilities_after(
    config: &SamplerConfig,
    logits: &[f32],
    history: &[u32],
) -> Result<Vec<(u32, f32)>, SamplerError> {
    let mut sampler = Sampler::new(config.clone())?;
    for &token in history {
        sampler.window.accept(token);
    }
    sampler.probabilities(logits)
}

/// Lets model code mix sampling with device calls under one `?`: a sampler error is an invalid
/// argument (a parameter out of range, or logits that cannot be sampled).
impl From<SamplerError> for tessera::Error {
    fn from(e: SamplerError) -> Self {
        tessera::Error::InvalidArgument(e.to_string())
    }
}
