//! Language models on Tessera: the layer above the device crates, as llama.cpp's `libllama` sits
//! above ggml.
//!
//! - [`LlamaModel`] is a llama-style decoder covering every architecture of [`Arch::ALL`] (RMS
//!   norm, grouped-query attention with RoPE paired as its architecture does, KV caches of any
//!   [`KvCacheTypes`] (F16 by default),
//!   SwiGLU or GeGLU feed-forward, mixture-of-experts blocks), loaded from a GGUF file
//!   ([`LlamaModel::from_gguf`]) or made with deterministic synthetic weights, so benchmarks and
//!   tests need no model file. Its tensors are named as in GGUF.
//! - [`Session`] runs it on devices in any [`Split`]: whole, split by layers, tensor- or
//!   expert-parallel, or a layer split over tensor-parallel groups ([`Session::builder`] opens
//!   one). The [`tessera::sched::Scheduler`] places every op; a tensor-parallel group is one
//!   meta device ([`tessera::meta`]) among its devices ([`TensorParallel`] reports on it).
//! - Many sequences share one session: a [`Batch`] holds tokens of any sequences, the KV cache's
//!   cells belong to sequences, and sequences join, fork ([`Session::seq_copy`]) and leave
//!   between steps (continuous batching).
//! - [`Generator`] is the generation loop (sampler chain, streaming text, stop tokens and
//!   strings, statistics); [`sampling`] is llama.cpp's sampler chain; [`tokenizer`] (the
//!   `tessera-tokenizer` crate) turns text into tokens and back, with chat templates.
//!
//! ```
//! use tessera_model::sampling::{Sampler, SamplerConfig};
//! use tessera_model::{Generator, LlamaConfig, LlamaModel, Session, Split};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = LlamaModel::new(LlamaConfig::tiny(), 42)?; // or LlamaModel::from_gguf(file, n_ctx)
//! let tok = model.synthetic_tokenizer()?; // or Tokenizer::from_gguf(&file)
//! let mut session = Session::builder(&model)
//!     .devices(&tessera::registry().select("cpu:2")?)
//!     .split(Split::layer()) // Split::None, ::layer(), ::tensor(), ::expert()
//!     .build()?;
//! let sampler = Sampler::new(SamplerConfig::default())?; // greedy unless a temperature
//! let prompt = tok.encode("once upon a time", true, false);
//! for piece in Generator::new(&mut session, &tok, sampler, &prompt).max_tokens(8) {
//!     print!("{}", piece?.text);
//! }
//! # Ok(()) }
//! ```

mod batch;
mod builder;
mod config;
mod engine;
mod finite;
mod generate;
mod gguf_io;
mod graph;
mod kv_cells;
mod kv_types;
mod llama;
mod moe;
pub mod recorded;
pub mod reference;
pub mod sampling;
mod split_policy;
#[cfg(all(test, feature = "cpu"))]
mod tests;
#[cfg(all(test, feature = "cpu"))]
mod tests_arch;
#[cfg(all(test, feature = "cpu"))]
mod tests_batch;
#[cfg(test)]
mod tests_fallback;
#[cfg(all(test, feature = "cpu"))]
mod tests_finite;
#[cfg(all(test, feature = "cpu"))]
mod tests_generate;
#[cfg(all(test, feature = "cpu"))]
mod tests_moe;
#[cfg(all(test, feature = "cpu"))]
mod tests_outputs;
#[cfg(all(test, feature = "cpu"))]
mod tests_real;
#[cfg(all(test, feature = "cpu"))]
mod tests_reference;
#[cfg(all(test, feature = "cpu"))]
mod tests_reference_kv;
#[cfg(all(test, feature = "cpu"))]
mod tests_tp;
pub use tessera_tokenizer as tokenizer;
mod tp;
mod weights;

pub use batch::{Batch, BatchLogits, BatchToken, SeqId};
pub use builder::{SessionBuilder, Split};
pub use config::{Arch, Gating, LlamaConfig};
#[cfg(test)]
pub(crate) use engine::SessionOptions;
pub use engine::{Session, SplitMode};
pub use finite::first_non_finite;
pub use generate::{Finish, GenStats, GenerateError, Generator, Piece, TextStream};
pub use gguf_io::{ARCHITECTURE, llama_keys};
pub use kv_cells::MAX_SEQUENCES;
pub use kv_types::{CACHE_TYPES, KvCacheTypes};
pub use llama::{
    KV_PAD, LayerTensors, LlamaModel, MoeTensors, Outputs, Placement, Step, WeightSource,
};
pub use split_policy::{ExpertSplit, LlamaSplitPolicy};
pub use tessera_tokenizer::synthetic_vocab;
pub use tokenizer::{Token, Tokenizer, TokenizerError};
pub use tp::TensorParallel;
pub use weights::encode_rows_in_parallel;

/// Normalised mean squared error `Σ(a−b)² / Σb²` of `a` against the reference `b` (∞ if the
/// lengths differ, 0 for two empty slices).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut err, mut norm) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        err += (f64::from(x) - f64::from(y)).powi(2);
        norm += f64::from(y).powi(2);
    }
    if err == 0.0 { 0.0 } else { err / norm }
}

/// Replaces `out`'s contents with the little-endian f32 values of `bytes`, keeping its
/// allocation (decode loops read logits into one vector).
pub(crate) fn f32s_into(bytes: &[u8], out: &mut Vec<f32>) {
    out.clear();
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
}

/// Index of the largest value (the first one on ties; 0 for an empty slice). NaNs are skipped.
pub fn argmax(v: &[f32]) -> usize {
    // The running maximum in a local (not re-read through the index) keeps this at a compare
    // per element: it runs on every generated token over the whole vocabulary.
    let (mut best, mut top) = (0, f32::NEG_INFINITY);
    for (i, &x) in v.iter().enumerate() {
        if x > top {
            (best, top) = (i, x);
        }
    }
    best
}
