//! [`LlamaModel`]: the weights and KV caches of a llama-style decoder as tensors of one
//! [`Context`], synthetic weight generation, placement over devices, and the graph of one step.

use super::config::LlamaConfig;
use super::kv_types::KvCacheTypes;
use super::weights::SplitMix;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tessera::{
    Bindings, DType, Device, DeviceType, Error, Graph, Result, TensorBuffer, TensorFlags, TensorId,
    encode_f32,
};
use tessera::{Context, TensorDesc};

/// How a parameter tensor's synthetic values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// Uniform in `[-a, a)`.
    Uniform(f32),
    /// Uniform in `[0.9, 1.1)`: norm weights.
    Norm,
    /// RoPE frequency factors in [0.25, 4), scrambled over the pairs (Llama 3.1's slow only the
    /// low-frequency pairs; these change every pair, so a test sees them).
    RopeFactors,
    /// YaRN's rotation divisors, computed from the config ([`LlamaConfig::yarn_factors`]); not
    /// a file tensor.
    Yarn,
    /// An orthonormal Walsh–Hadamard matrix (the KV caches' rotations,
    /// [`KvCacheTypes::rotations`]); not a file tensor.
    Hadamard,
    /// All zero: KV caches.
    Zero,
    /// The same values as another parameter (an untied copy of a tied output).
    Same(TensorId),
}

/// Which part of the network a parameter tensor belongs to; decides its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// The token embedding (input layer).
    Input,
    /// Weights and KV cache of block `i`.
    Layer(usize),
    /// The final norm and the output projection.
    Output,
}

/// Tensor ids of one transformer block.
#[derive(Clone, Copy, Debug)]
pub struct LayerTensors {
    /// `blk.{i}.attn_norm.weight` F32 `[n_embd]`.
    pub attn_norm: TensorId,
    /// `blk.{i}.attn_q.weight` `[n_embd, n_head·head_dim]`.
    pub wq: TensorId,
    /// `blk.{i}.attn_k.weight` `[n_embd, n_head_kv·head_dim]`.
    pub wk: TensorId,
    /// `blk.{i}.attn_v.weight` `[n_embd, n_head_kv·head_dim]`.
    pub wv: TensorId,
    /// `blk.{i}.attn_output.weight` `[n_head·head_dim, n_embd]`.
    pub wo: TensorId,
    /// `blk.{i}.ffn_norm.weight` F32 `[n_embd]`.
    pub ffn_norm: TensorId,
    /// `blk.{i}.ffn_gate.weight` `[n_embd, n_ff]`, or in a mixture-of-experts block the stack
    /// `ffn_gate_exps.weight` `[n_embd, n_ff_exp, n_expert]`.
    pub ffn_gate: TensorId,
    /// `blk.{i}.ffn_up.weight` `[n_embd, n_ff]` (MoE: `ffn_up_exps.weight`).
    pub ffn_up: TensorId,
    /// `blk.{i}.ffn_down.weight` `[n_ff, n_embd]` (MoE: `ffn_down_exps.weight`
    /// `[n_ff_exp, n_embd, n_expert]`).
    pub ffn_down: TensorId,
    /// The router and expert biases of a mixture-of-experts block.
    pub moe: Option<MoeTensors>,
    /// `blk.{i}.attn_output.bias` F32 `[n_embd]` (gpt-oss).
    pub bias_o: Option<TensorId>,
    /// `blk.{i}.attn_sinks.weight` F32 `[n_head]` (gpt-oss).
    pub sinks: Option<TensorId>,
    /// `blk.{i}.attn_q.bias`, `attn_k.bias`, `attn_v.bias` F32 (Qwen2).
    pub bias_qkv: Option<[TensorId; 3]>,
    /// `blk.{i}.attn_q_norm.weight`, `attn_k_norm.weight` F32 `[head_dim]` (QK-norm).
    pub qk_norm: Option<[TensorId; 2]>,
    /// `blk.{i}.post_attention_norm.weight`, `post_ffw_norm.weight` F32 `[n_embd]` (Gemma 3).
    pub post_norms: Option<[TensorId; 2]>,
    /// `cache_k.{i}` `[n_head_kv·head_dim, n_ctx]` ([`LlamaModel::cache_types`]).
    pub cache_k: TensorId,
    /// `cache_v.{i}` `[n_head_kv·head_dim, n_ctx]`.
    pub cache_v: TensorId,
}

/// The router of a mixture-of-experts block and its experts' biases.
#[derive(Clone, Copy, Debug)]
pub struct MoeTensors {
    /// `blk.{i}.ffn_gate_inp.weight` F32 `[n_embd, n_expert]`: the router.
    pub gate_inp: TensorId,
    /// `blk.{i}.ffn_gate_inp.bias` F32 `[n_expert]` (gpt-oss).
    pub gate_inp_b: Option<TensorId>,
    /// `blk.{i}.ffn_gate_exps.bias`, `ffn_up_exps.bias` F32 `[n_ff_exp, n_expert]` and
    /// `ffn_down_exps.bias` F32 `[n_embd, n_expert]` (gpt-oss).
    pub exps_b: Option<[TensorId; 3]>,
}

/// Which positions of a step produce logits.
///
/// The output norm and the projection to the vocabulary cost `n_vocab × n_embd` multiply-adds per
/// position (a quarter of a Gemma 3 270M prompt step, whose vocabulary is 262144), and their
/// result is `n_vocab` floats per position; a prompt that only samples its next token needs the
/// last position's. As llama.cpp, only the positions asked for go through them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Outputs {
    /// Every position: logits `[n_vocab, T]`.
    #[default]
    All,
    /// The last position only: logits `[n_vocab, 1]`.
    Last,
    /// `n` positions named by the step's [`Step::out_rows`] input: logits `[n_vocab, n]` (the
    /// last token of each sequence of a batch).
    Selected(usize),
}

/// Attention spans of step graphs are multiples of this (as llama.cpp pads its KV cache views):
/// decoding reuses one graph for this many tokens, and masked padding keys cost little.
pub const KV_PAD: usize = 256;

/// The graph of one evaluation step and its input and output tensors.
#[derive(Clone, Debug)]
pub struct Step {
    /// Token ids, i32 `[T]` (input).
    pub tokens: TensorId,
    /// Positions `n_past..n_past+T`, i32 `[T]` (input).
    pub positions: TensorId,
    /// KV cache rows to write, `n_past..n_past+T`, i32 `[T]` (input).
    pub kv_rows: TensorId,
    /// Causal mask, f16 `[n_kv, T]`: 0 where a query may see a key, −∞ elsewhere, including
    /// the padding rows `n_past+T..n_kv` (input).
    pub mask: TensorId,
    /// The sliding-window causal mask of the local-attention layers, if any (input).
    pub mask_swa: Option<TensorId>,
    /// The token indices whose logits the step returns, i32 `[n_outputs]` (input), for
    /// [`Outputs::Selected`].
    pub out_rows: Option<TensorId>,
    /// Logits, f32 `[n_vocab, n_outputs]` (output): every position's, or the last one's (see
    /// [`Outputs`]).
    pub logits: TensorId,
    /// Tokens in the step (`T`).
    pub n_tokens: usize,
    /// Rows of `logits`: `T` for [`Outputs::All`], 1 for [`Outputs::Last`], `n` for
    /// [`Outputs::Selected`]`(n)`.
    pub n_outputs: usize,
    /// Cache rows already filled before the step it was built for (0 for
    /// [`LlamaModel::build_span`]). The graph serves any `n_past` with the same [`Step::n_kv`]:
    /// positions, cache rows and masks are inputs.
    pub n_past: usize,
    /// Cache rows attention reads: `n_past + T` rounded up to [`crate::KV_PAD`] (at most `n_ctx`),
    /// so consecutive decode steps share one graph and its schedule.
    pub n_kv: usize,
    /// The graph computing `logits` (and writing the new cache rows).
    pub graph: Graph,
}

/// Where a model's weights come from when they are not synthetic (a GGUF file, a test's map).
pub trait WeightSource: Send + Sync + std::fmt::Debug {
    /// Dtype and shape (`ne`, innermost first) of tensor `name`, if the source holds it.
    fn describe(&self, name: &str) -> Option<(DType, [usize; 4])>;
    /// The bytes of tensor `name`, exactly its size in its dtype.
    ///
    /// # Errors
    /// I/O or format errors naming the tensor.
    fn read(&self, name: &str) -> Result<Vec<u8>>;
    /// Calls `f` with the bytes of tensor `name` (as [`WeightSource::read`] returns them), where
    /// possible without a copy (a memory-mapped file), and lets the source drop its own copy of
    /// them afterwards. Default: `f(&self.read(name)?)`.
    ///
    /// # Errors
    /// As [`WeightSource::read`], and `f`'s errors.
    fn with_bytes(&self, name: &str, f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        f(&self.read(name)?)
    }
    /// Optional. Bytes `range` of tensor `name`, lent by [`WeightSource::with_bytes`], have been
    /// copied: the source may drop them from memory. Default: nothing.
    fn release(&self, name: &str, range: std::ops::Range<usize>) {
        let _ = (name, range);
    }
    /// A label for messages (a file path).
    fn label(&self) -> String;
}

/// A llama-style decoder with deterministic synthetic weights, or weights from a
/// [`WeightSource`].
///
/// The model's [`Context`] holds only parameters (flag `param`): weights named as in GGUF and the
/// per-layer KV caches `cache_k.{i}` / `cache_v.{i}` (F16 unless [`LlamaModel::with_cache_types`]). Step graphs are built on clones of that
/// context, so weight and cache ids are the same in every graph.
#[derive(Clone, Debug)]
pub struct LlamaModel {
    config: LlamaConfig,
    seed: u64,
    source: Option<Arc<dyn WeightSource>>,
    kv_types: KvCacheTypes,
    /// The rotations of K (with Q) and of V ([`KvCacheTypes::rotations`]), where the cache
    /// types have them.
    kv_rot: [Option<TensorId>; 2],
    ctx: Context,
    tok_embd: TensorId,
    layers: Vec<LayerTensors>,
    output_norm: TensorId,
    output: TensorId,
    rope_freqs: Option<TensorId>,
    yarn_factors: Option<TensorId>,
    params: Vec<(TensorId, Init, Placement)>,
}

impl LlamaModel {
    /// Describes the tensors of a model with `config`; values are drawn from `seed` on demand.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an invalid config (see [`LlamaConfig::validate`]).
    pub fn new(config: LlamaConfig, seed: u64) -> Result<LlamaModel> {
        Self::build_params(config, seed, None, KvCacheTypes::default())
    }

    /// Describes the tensors of a model with `config` whose weights come from `source`: each
    /// weight takes the source's dtype (quantization mixes differ per tensor) and must have the
    /// shape `config` implies.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an invalid config, or naming a tensor the source lacks or
    /// holds with another shape.
    pub fn from_source(config: LlamaConfig, source: Arc<dyn WeightSource>) -> Result<LlamaModel> {
        Self::build_params(config, 0, Some(source), KvCacheTypes::default())
    }

    fn build_params(
        config: LlamaConfig,
        seed: u64,
        source: Option<Arc<dyn WeightSource>>,
        kv_types: KvCacheTypes,
    ) -> Result<LlamaModel> {
        // A source brings its own dtypes; only the shapes of the config matter then.
        let mut check = config.clone();
        if source.is_some() {
            check.weight_dtype = DType::F32;
        }
        check.validate()?;
        kv_types.check(&config)?;
        let c = &config;
        let wt = c.weight_dtype;
        let (e, q, kv, ff) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.n_ff);
        let mut ctx = Context::new();
        let mut params = Vec::new();
        let mut param = |ctx: &mut Context,
                         name: String,
                         dtype: DType,
                         shape: [usize; 3],
                         init: Init,
                         place: Placement|
         -> Result<TensorId> {
            let dtype = match (&source, init) {
                (_, Init::Yarn) => dtype,
                (Some(src), Init::Norm | Init::Uniform(_) | Init::RopeFactors) => {
                    let (dt, ne) = src.describe(&name).ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "{}: tensor '{name}' is missing",
                            src.label()
                        ))
                    })?;
                    if ne != [shape[0], shape[1], shape[2], 1] {
                        return Err(Error::InvalidArgument(format!(
                            "{}: tensor '{name}' has shape {ne:?}, the model expects {shape:?}",
                            src.label()
                        )));
                    }
                    dt
                }
                _ => dtype,
            };
            let id = ctx.new_named(&name, dtype, shape)?;
            ctx.set_flags(
                id,
                TensorFlags {
                    param: true,
                    ..TensorFlags::default()
                },
            )?;
            params.push((id, init, place));
            Ok(id)
        };
        // Uniform ±√(3/fan_in) keeps the variance of a projection's output that of its input.
        let proj = |fan_in: usize| Init::Uniform((3.0 / fan_in as f32).sqrt());
        let tok_embd = param(
            &mut ctx,
            "token_embd.weight".into(),
            DType::F32,
            [e, c.n_vocab, 1],
            Init::Uniform(1.0),
            Placement::Input,
        )?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let p = Placement::Layer(i);
            let mut w = |ctx: &mut Context, what: &str, dtype, [a, b]: [usize; 2], init| {
                param(
                    ctx,
                    format!("blk.{i}.{what}.weight"),
                    dtype,
                    [a, b, 1],
                    init,
                    p,
                )
            };
            let attn_norm = w(&mut ctx, "attn_norm", DType::F32, [e, 1], Init::Norm)?;
            let wq = w(&mut ctx, "attn_q", wt, [e, q], proj(e))?;
            let wk = w(&mut ctx, "attn_k", wt, [e, kv], proj(e))?;
            let wv = w(&mut ctx, "attn_v", wt, [e, kv], proj(e))?;
            let wo = w(&mut ctx, "attn_output", wt, [q, e], proj(q))?;
            let ffn_norm = w(
                &mut ctx,
                c.arch.ffn_norm_name(),
                DType::F32,
                [e, 1],
                Init::Norm,
            )?;
            let (ffn_gate, ffn_up, ffn_down, moe) = if c.is_moe() {
                let (n, f) = (c.n_expert, c.n_ff_exp);
                let mut exps = |ctx: &mut Context, what: &str, shape, init| {
                    param(ctx, format!("blk.{i}.{what}.weight"), wt, shape, init, p)
                };
                let gate = exps(&mut ctx, "ffn_gate_exps", [e, f, n], proj(e))?;
                let up = exps(&mut ctx, "ffn_up_exps", [e, f, n], proj(e))?;
                let down = exps(&mut ctx, "ffn_down_exps", [f, e, n], proj(f))?;
                // The router in F32 (as converted files keep it), drawn wide enough that each
                // token prefers other experts.
                let gate_inp = param(
                    &mut ctx,
                    format!("blk.{i}.ffn_gate_inp.weight"),
                    DType::F32,
                    [e, n, 1],
                    Init::Uniform((12.0 / e as f32).sqrt()),
                    p,
                )?;
                let mut bias = |ctx: &mut Context, what: &str, shape, a: f32| {
                    param(
                        ctx,
                        format!("blk.{i}.{what}.bias"),
                        DType::F32,
                        shape,
                        Init::Uniform(a),
                        p,
                    )
                };
                let (gate_inp_b, exps_b) = if c.arch.expert_biases() {
                    (
                        Some(bias(&mut ctx, "ffn_gate_inp", [n, 1, 1], 0.5)?),
                        Some([
                            bias(&mut ctx, "ffn_gate_exps", [f, n, 1], 0.1)?,
                            bias(&mut ctx, "ffn_up_exps", [f, n, 1], 0.1)?,
                            bias(&mut ctx, "ffn_down_exps", [e, n, 1], 0.1)?,
                        ]),
                    )
                } else {
                    (None, None)
                };
                let moe = MoeTensors {
                    gate_inp,
                    gate_inp_b,
                    exps_b,
                };
                (gate, up, down, Some(moe))
            } else {
                let mut w = |ctx: &mut Context, what: &str, dtype, [a, b]: [usize; 2], init| {
                    param(
                        ctx,
                        format!("blk.{i}.{what}.weight"),
                        dtype,
                        [a, b, 1],
                        init,
                        p,
                    )
                };
                (
                    w(&mut ctx, "ffn_gate", wt, [e, ff], proj(e))?,
                    w(&mut ctx, "ffn_up", wt, [e, ff], proj(e))?,
                    w(&mut ctx, "ffn_down", wt, [ff, e], proj(ff))?,
                    None,
                )
            };
            let hd = c.head_dim;
            let mut named = |ctx: &mut Context, name: &str, n: usize, init| {
                param(
                    ctx,
                    format!("blk.{i}.{name}"),
                    DType::F32,
                    [n, 1, 1],
                    init,
                    p,
                )
            };
            let bias_o = if c.arch.attn_out_bias() {
                Some(named(&mut ctx, "attn_output.bias", e, Init::Uniform(0.1))?)
            } else {
                None
            };
            let sinks = if c.arch.attn_sinks() {
                Some(named(
                    &mut ctx,
                    "attn_sinks.weight",
                    c.n_head,
                    Init::Uniform(2.0),
                )?)
            } else {
                None
            };
            let bias_qkv = if c.arch.attn_bias() {
                Some([
                    named(&mut ctx, "attn_q.bias", q, Init::Uniform(0.1))?,
                    named(&mut ctx, "attn_k.bias", kv, Init::Uniform(0.1))?,
                    named(&mut ctx, "attn_v.bias", kv, Init::Uniform(0.1))?,
                ])
            } else {
                None
            };
            let qk_norm = if c.arch.qk_norm() {
                Some([
                    named(&mut ctx, "attn_q_norm.weight", hd, Init::Norm)?,
                    named(&mut ctx, "attn_k_norm.weight", hd, Init::Norm)?,
                ])
            } else {
                None
            };
            let post_norms = if c.arch.post_norms() {
                Some([
                    named(&mut ctx, "post_attention_norm.weight", e, Init::Norm)?,
                    named(&mut ctx, "post_ffw_norm.weight", e, Init::Norm)?,
                ])
            } else {
                None
            };
            let cache_k = param(
                &mut ctx,
                format!("cache_k.{i}"),
                kv_types.k,
                [kv, c.n_ctx, 1],
                Init::Zero,
                p,
            )?;
            let cache_v = param(
                &mut ctx,
                format!("cache_v.{i}"),
                kv_types.v,
                [kv, c.n_ctx, 1],
                Init::Zero,
                p,
            )?;
            layers.push(LayerTensors {
                attn_norm,
                wq,
                wk,
                wv,
                wo,
                ffn_norm,
                ffn_gate,
                ffn_up,
                ffn_down,
                moe,
                bias_o,
                sinks,
                bias_qkv,
                qk_norm,
                post_norms,
                cache_k,
                cache_v,
            });
        }
        // RoPE divisors, one per rotated pair: from the file, or computed for YaRN.
        let mut factors = |ctx: &mut Context, on: bool, name: &str, init| {
            on.then(|| {
                param(
                    ctx,
                    name.into(),
                    DType::F32,
                    [c.n_rot / 2, 1, 1],
                    init,
                    Placement::Input,
                )
            })
            .transpose()
        };
        let rope_freqs = factors(
            &mut ctx,
            c.rope_freqs,
            "rope_freqs.weight",
            Init::RopeFactors,
        )?;
        let yarn_factors = factors(
            &mut ctx,
            c.yarn_orig_ctx > 0,
            "rope_yarn_factors",
            Init::Yarn,
        )?;
        // llama.cpp's rotations of quantized caches: one matrix each for K (and Q) and V.
        let (rot_k, rot_v) = kv_types.rotations(c.head_dim);
        let mut rotation = |ctx: &mut Context, n: Option<usize>, name: &str| {
            n.map(|n| {
                param(
                    ctx,
                    name.into(),
                    DType::F32,
                    [n, n, 1],
                    Init::Hadamard,
                    Placement::Input,
                )
            })
            .transpose()
        };
        let kv_rot = [
            rotation(&mut ctx, rot_k, "attn_rot_k")?,
            rotation(&mut ctx, rot_v, "attn_rot_v")?,
        ];
        let output_norm = param(
            &mut ctx,
            "output_norm.weight".into(),
            DType::F32,
            [e, 1, 1],
            Init::Norm,
            Placement::Output,
        )?;
        let output = if c.tied_output {
            tok_embd
        } else {
            param(
                &mut ctx,
                "output.weight".into(),
                wt,
                [e, c.n_vocab, 1],
                proj(e),
                Placement::Output,
            )?
        };
        Ok(LlamaModel {
            config,
            seed,
            source,
            kv_types,
            kv_rot,
            ctx,
            tok_embd,
            layers,
            output_norm,
            output,
            rope_freqs,
            yarn_factors,
            params,
        })
    }

    /// This synthetic model with the Q and K projections drawn with standard deviation `std`
    /// (uniform in ±√3·std) instead of the variance-preserving default, so attention scores are
    /// large and attention is peaked rather than near uniform (the reference suite's models).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a model whose weights come from a source, or a `std` that
    /// is not positive and finite.
    pub fn with_qk_std(mut self, std: f32) -> Result<LlamaModel> {
        if self.source.is_some() || !(std.is_finite() && std > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "with_qk_std({std}) needs a synthetic model and a positive std"
            )));
        }
        for (id, init, _) in &mut self.params {
            let name = self.ctx.tensors()[id.index()].name();
            if name.ends_with(".attn_q.weight") || name.ends_with(".attn_k.weight") {
                *init = Init::Uniform(std * 3f32.sqrt());
            }
        }
        Ok(self)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The element types of the KV caches.
    pub fn cache_types(&self) -> KvCacheTypes {
        self.kv_types
    }

    /// This model with KV caches of `types` (the same weights, from the same source or seed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a type a cache cannot have or heads that are not whole
    /// blocks of it ([`KvCacheTypes::check`]).
    pub fn with_cache_types(&self, types: KvCacheTypes) -> Result<LlamaModel> {
        if types == self.kv_types {
            return Ok(self.clone());
        }
        self.rebuilt(self.config.clone(), types)
    }

    /// This model's weights with `config` and cache `types`.
    fn rebuilt(&self, config: LlamaConfig, types: KvCacheTypes) -> Result<LlamaModel> {
        let mut m = Self::build_params(config, self.seed, self.source.clone(), types)?;
        // Keep the weights' initialisers (`with_qk_std` changes some), matched by name: the
        // new types may add or drop rotation matrices.
        for new in &mut m.params {
            let name = m.ctx.tensors()[new.0.index()].name();
            if let Some(old) = self
                .params
                .iter()
                .find(|o| self.ctx.tensors()[o.0.index()].name() == name)
                .filter(|o| !matches!(o.1, Init::Same(_)))
            {
                new.1 = old.1;
            }
        }
        if self.output != self.tok_embd && m.output == m.tok_embd {
            return m.untie_output();
        }
        Ok(m)
    }

    /// This model with KV caches of `n_ctx` cells (the same weights and cache types).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 cells or a context the configuration refuses.
    pub fn with_context_size(&self, n_ctx: usize) -> Result<LlamaModel> {
        if n_ctx == self.config.n_ctx {
            return Ok(self.clone());
        }
        if n_ctx == 0 {
            return Err(Error::InvalidArgument(
                "a context of 0 cells holds nothing".into(),
            ));
        }
        let config = LlamaConfig {
            n_ctx,
            ..self.config.clone()
        };
        self.rebuilt(config, self.kv_types)
    }

    /// The Walsh–Hadamard matrices `attn_rot_k` and `attn_rot_v` that rotate Q and K, and V,
    /// for block-type caches ([`KvCacheTypes::rotations`]).
    pub fn cache_rotations(&self) -> [Option<TensorId>; 2] {
        self.kv_rot
    }

    /// The context holding the parameter tensors (clone it to build graphs).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// `token_embd.weight`.
    pub fn tok_embd(&self) -> TensorId {
        self.tok_embd
    }

    /// Tensor ids of each block.
    pub fn layers(&self) -> &[LayerTensors] {
        &self.layers
    }

    /// This model with a tied output given its own `output.weight` (a copy of the token
    /// embedding; the same model otherwise). Tensor parallelism splits that copy over the
    /// vocabulary while the embedding stays whole for GET_ROWS, so no device computes all the
    /// logits.
    ///
    /// # Errors
    /// Context errors (none for a valid model).
    pub fn untie_output(&self) -> Result<LlamaModel> {
        if self.output != self.tok_embd {
            return Ok(self.clone());
        }
        let mut m = self.clone();
        let emb = m.ctx.tensor(m.tok_embd)?.clone();
        let id = m
            .ctx
            .new_named("output.weight", emb.dtype(), [emb.ne()[0], emb.ne()[1]])?;
        m.ctx.set_flags(
            id,
            TensorFlags {
                param: true,
                ..TensorFlags::default()
            },
        )?;
        m.params
            .push((id, Init::Same(m.tok_embd), Placement::Output));
        m.output = id;
        Ok(m)
    }

    /// The parameter `id` is a copy of (an untied output's embedding), if any.
    pub fn copy_of(&self, id: TensorId) -> Option<TensorId> {
        self.params.iter().find_map(|&(p, init, _)| match init {
            Init::Same(of) if p == id => Some(of),
            _ => None,
        })
    }

    /// `rope_freqs.weight`, the RoPE frequency factors (Llama 3.1-style files).
    pub fn rope_freqs(&self) -> Option<TensorId> {
        self.rope_freqs
    }

    /// YaRN's rotation divisors (computed from the config, not stored in files).
    pub fn yarn_factors(&self) -> Option<TensorId> {
        self.yarn_factors
    }

    /// Whether `id` is computed from the config rather than stored in a file (YaRN's factors):
    /// GGUF export leaves it out.
    pub fn is_derived(&self, id: TensorId) -> bool {
        self.params
            .iter()
            .any(|&(p, init, _)| p == id && matches!(init, Init::Yarn | Init::Hadamard))
    }

    /// `output_norm.weight` and `output.weight` (the token embedding when the output is tied).
    pub fn output_tensors(&self) -> (TensorId, TensorId) {
        (self.output_norm, self.output)
    }

    /// Every parameter tensor (weights and caches) with the part of the network it belongs to.
    pub fn params(&self) -> impl Iterator<Item = (TensorId, Placement)> + '_ {
        self.params.iter().map(|&(id, _, p)| (id, p))
    }

    /// Whether `id` is a KV cache.
    pub fn is_cache(&self, id: TensorId) -> bool {
        self.params
            .iter()
            .any(|&(p, init, _)| p == id && init == Init::Zero)
    }

    /// Bytes of the weights, KV caches excluded (the `size` column of `tessera bench`).
    pub fn weight_bytes_total(&self) -> usize {
        self.params
            .iter()
            .filter(|(_, init, _)| *init != Init::Zero)
            .map(|&(id, _, _)| self.ctx.tensors()[id.index()].nbytes())
            .sum()
    }

    /// Bytes of the KV caches.
    pub fn cache_bytes_total(&self) -> usize {
        self.params
            .iter()
            .filter(|(_, init, _)| *init == Init::Zero)
            .map(|&(id, _, _)| self.ctx.tensors()[id.index()].nbytes())
            .sum()
    }

    /// Bytes one decode step (one token of one sequence) reads from memory with `n_kv`
    /// positions in the cache: `(weights, cache)`. Every weight is read once, except the token
    /// embedding, of which one row is (all of it when it is also the output projection), and
    /// the experts, of which the `n_expert_used` of `n_expert` a token is routed to are. The
    /// cache part is the K and V rows of the positions each layer attends to (`n_kv`; a
    /// sliding-window layer's window at most). What `tessera bench` divides by a token's time
    /// for the bandwidth a decode reaches.
    pub fn decode_bytes_per_token(&self, n_kv: usize) -> (u64, u64) {
        let c = &self.config;
        let (mut weights, mut cache) = (0u64, 0u64);
        for &(id, init, place) in &self.params {
            let t = &self.ctx.tensors()[id.index()];
            let bytes = t.nbytes() as u64;
            let ne = t.ne();
            if init == Init::Zero {
                // `[n_head_kv·head_dim, n_ctx]`: one row per position; a sliding-window layer
                // attends to its window's.
                let positions = ne[1].max(1);
                let seen = match place {
                    Placement::Layer(il) if c.is_swa(il) => n_kv.min(c.n_swa),
                    _ => n_kv,
                };
                cache += bytes / positions as u64 * seen.min(positions) as u64;
            } else if id == self.tok_embd && self.output != self.tok_embd {
                weights += bytes / ne[1].max(1) as u64;
            } else if c.n_expert > 1 && ne[2] == c.n_expert {
                weights += bytes / c.n_expert as u64 * c.n_expert_used.max(1) as u64;
            } else {
                weights += bytes;
            }
        }
        (weights, cache)
    }

    fn param_entry(&self, id: TensorId) -> Result<(&TensorDesc, Init, Placement)> {
        let &(_, init, place) = self
            .params
            .iter()
            .find(|(p, _, _)| *p == id)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "tensor {} is not a parameter of the model",
                    self.ctx.label(id)
                ))
            })?;
        Ok((self.ctx.tensor(id)?, init, place))
    }

    /// Writes weight `id` into `buf`. A large weight from a file goes in pieces of whole rows
    /// (multiples of 16, the CPU's packed groups), each released from the source once copied,
    /// so the file's pages and the copy are never both resident in full.
    pub(crate) fn upload(&self, id: TensorId, buf: &TensorBuffer) -> Result<()> {
        const PIECE_BYTES: usize = 16 << 20;
        let (t, init, _) = self.param_entry(id)?;
        let of = match init {
            Init::Same(of) => of,
            _ => id,
        };
        let ne = t.ne();
        let rb = t.row_bytes();
        let piecewise = self.source.is_some()
            && t.nbytes() > PIECE_BYTES
            && ne[2] == 1
            && ne[3] == 1
            && rb > 0
            // Every piece must be packable when the whole is: whole groups of 16 rows each.
            && ne[1].is_multiple_of(16)
            && matches!(
                self.param_entry(of)?.1,
                Init::Norm | Init::Uniform(_) | Init::RopeFactors
            );
        let (Some(src), true) = (&self.source, piecewise) else {
            return self.with_weight_bytes(id, |bytes| buf.set(id, bytes));
        };
        let rows_per = (PIECE_BYTES / rb / 16).max(1) * 16;
        let name = self.ctx.tensor(of)?.name().to_string();
        self.with_weight_bytes(id, |bytes| {
            for r0 in (0..ne[1]).step_by(rows_per) {
                let r1 = (r0 + rows_per).min(ne[1]);
                buf.set_rows(id, r0, &bytes[r0 * rb..r1 * rb])?;
                src.release(&name, r0 * rb..r1 * rb);
            }
            Ok(())
        })
    }

    /// Calls `f` with the bytes [`LlamaModel::weight_bytes`] gives for `id`, borrowed from the
    /// source where it can lend them (a mapped GGUF file), so loading copies each weight once.
    ///
    /// # Errors
    /// As [`LlamaModel::weight_bytes`], and `f`'s errors.
    pub fn with_weight_bytes(
        &self,
        id: TensorId,
        mut f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let (t, init, _) = self.param_entry(id)?;
        if let Init::Same(of) = init {
            return self.with_weight_bytes(of, f);
        }
        match (&self.source, init) {
            (Some(src), Init::Norm | Init::Uniform(_) | Init::RopeFactors) => {
                let (name, want) = (t.name().to_string(), t.nbytes());
                src.with_bytes(&name, &mut |bytes| {
                    if bytes.len() != want {
                        return Err(Error::SizeMismatch {
                            tensor: name.clone(),
                            got: bytes.len(),
                            expected: want,
                        });
                    }
                    f(bytes)
                })
            }
            _ => f(&self.weight_bytes(id)?),
        }
    }

    /// The bytes of parameter `id` in its dtype: from the weight source, or deterministic values
    /// drawn from the model seed and the tensor's name (zeros for a KV cache).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `id` is not a parameter of this model; the source's errors.
    pub fn weight_bytes(&self, id: TensorId) -> Result<Vec<u8>> {
        let (t, init, _) = self.param_entry(id)?;
        if let Init::Same(of) = init {
            return self.weight_bytes(of);
        }
        if init == Init::Yarn {
            let values = self.config.yarn_factors().unwrap_or_default();
            return encode_f32(t.dtype(), &values);
        }
        if init == Init::Hadamard {
            // Sylvester's construction: H[i][j] = (-1)^popcount(i & j) / √n (symmetric, H² = I).
            let n = t.ne()[0];
            let scale = 1.0 / (n as f32).sqrt();
            let values: Vec<f32> = (0..n * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    if (i & j).count_ones() % 2 == 0 {
                        scale
                    } else {
                        -scale
                    }
                })
                .collect();
            return encode_f32(t.dtype(), &values);
        }
        if let (Some(src), false) = (&self.source, init == Init::Zero) {
            let bytes = src.read(t.name())?;
            if bytes.len() != t.nbytes() {
                return Err(Error::SizeMismatch {
                    tensor: format!("'{}' in {}", t.name(), src.label()),
                    got: bytes.len(),
                    expected: t.nbytes(),
                });
            }
            return Ok(bytes);
        }
        let (center, half) = match init {
            Init::Zero | Init::Same(_) | Init::Yarn | Init::Hadamard => {
                return Ok(vec![0u8; t.nbytes()]);
            }
            Init::RopeFactors => {
                // Scrambled over [0.25, 4) so that high-frequency pairs, which move most within
                // a short test sequence, are changed too: a dropped or misapplied factor shows.
                let n = t.nelements();
                let values: Vec<f32> = (0..n)
                    .map(|i| 0.25 * 16f32.powf(((i * 7) % n) as f32 / n as f32))
                    .collect();
                return encode_f32(t.dtype(), &values);
            }
            Init::Norm => (1.0, 0.1),
            Init::Uniform(a) => (0.0, a),
        };
        let mut values = vec![0f32; t.nelements()];
        SplitMix::for_tensor(self.seed, t.name()).fill_uniform(&mut values, center, half);
        crate::weights::encode_rows_in_parallel(t.dtype(), &values, t.ne()[0])
    }

    /// The index into `devices` of each parameter's device: block `i` on `layer_device[i]`, the
    /// token embedding on the first CPU device of `devices` (else the first device: ggml keeps the
    /// input layer on the host), the output on the last block's device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `layer_device` does not have one valid entry per layer.
    pub fn param_devices(
        &self,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
    ) -> Result<Vec<(TensorId, usize)>> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "no device to place weights on".into(),
            ));
        }
        if layer_device.len() != self.config.n_layer
            || layer_device.iter().any(|&d| d >= devices.len())
        {
            return Err(Error::InvalidArgument(format!(
                "layer_device {layer_device:?} must hold {} indices below {}",
                self.config.n_layer,
                devices.len()
            )));
        }
        let input = devices
            .iter()
            .position(|d| d.kind() == DeviceType::Cpu)
            .unwrap_or(0);
        let output = layer_device[self.config.n_layer - 1];
        Ok(self
            .params()
            .map(|(id, p)| {
                let d = match p {
                    Placement::Input => input,
                    Placement::Layer(i) => layer_device[i],
                    Placement::Output => output,
                };
                (id, d)
            })
            .collect())
    }

    /// Allocates the parameters on `devices` (per device that holds any: a buffer of its weight
    /// buffer type for the weights and one of its plain buffer type for the caches; see
    /// [`LlamaModel::param_devices`]), uploads the weights, zeroes the caches and returns the
    /// buffers with their merged bindings.
    ///
    /// # Errors
    /// As [`LlamaModel::param_devices`]; allocation and write errors of the devices.
    pub fn alloc_weights(
        &self,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
    ) -> Result<(Vec<TensorBuffer>, Bindings)> {
        self.alloc_weights_with_progress(devices, layer_device, |_, _| {})
    }

    /// [`LlamaModel::alloc_weights`], calling `progress(done, total)` after each tensor.
    ///
    /// # Errors
    /// As [`LlamaModel::alloc_weights`].
    pub fn alloc_weights_with_progress(
        &self,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
        mut progress: impl FnMut(usize, usize),
    ) -> Result<(Vec<TensorBuffer>, Bindings)> {
        let placed = self.param_devices(devices, layer_device)?;
        let by_name: HashMap<&str, usize> = placed
            .iter()
            .map(|&(id, d)| (self.ctx.tensors()[id.index()].name(), d))
            .collect();
        let (total, mut done) = (placed.len(), 0);
        let name = |id: TensorId| self.ctx.tensors()[id.index()].name().to_string();
        let caches: HashSet<String> = self
            .params()
            .filter(|&(id, _)| self.is_cache(id))
            .map(|(id, _)| name(id))
            .collect();
        // An untied output is a copy of the embedding: where a device keeps the embedding once
        // for several devices (a meta device), each one's vocabulary slice of the output may be a
        // window into it.
        let copies: Vec<(String, String)> = self
            .params()
            .filter_map(|(id, _)| self.copy_of(id).map(|of| (name(id), name(of))))
            .collect();
        let copy_refs: Vec<(&str, &str)> = copies
            .iter()
            .map(|(c, o)| (c.as_str(), o.as_str()))
            .collect();
        let mut buffers = Vec::new();
        let mut bindings = Bindings::new();
        for (d, dev) in devices.iter().enumerate() {
            let here: Vec<TensorId> = placed
                .iter()
                .filter(|&&(_, pd)| pd == d)
                .map(|&(id, _)| id)
                .collect();
            let mine = |t: &TensorDesc| by_name.get(t.name()) == Some(&d);
            // Weights are read only by MUL_MAT and GET_ROWS, so they may take the device's
            // faster weight layout; caches are written by graphs, so they take plain memory.
            let weight_type = dev.weight_buffer_type();
            let weight_type = weight_type.with_copies(&copy_refs).unwrap_or(weight_type);
            let has_weights = here.iter().any(|&id| !self.is_cache(id));
            let has_caches = here.iter().any(|&id| self.is_cache(id));
            let wbuf = has_weights
                .then(|| {
                    weight_type
                        .alloc_tensors_where(&self.ctx, |t| mine(t) && !caches.contains(t.name()))
                })
                .transpose()?;
            let cbuf = has_caches
                .then(|| {
                    dev.buffer_type()
                        .alloc_tensors_where(&self.ctx, |t| mine(t) && caches.contains(t.name()))
                })
                .transpose()?;
            for &id in &here {
                // Both buffers exist whenever a tensor of their kind is placed here.
                if self.is_cache(id) {
                    if let Some(cbuf) = &cbuf {
                        zero_tensor(cbuf, id, &self.ctx)?;
                    }
                } else if let Some(wbuf) = &wbuf {
                    self.write_weight(id, wbuf)?;
                }
                done += 1;
                progress(done, total);
            }
            for buf in [wbuf, cbuf].into_iter().flatten() {
                bindings.extend(buf.bindings());
                buffers.push(buf);
            }
        }
        Ok((buffers, bindings))
    }

    /// Writes weight `id` into `buf` as the buffer holds it: nothing for a window into another
    /// weight (written with that one), whole rows in pieces where every device sees the whole
    /// tensor (one device, or mirrored), and at once where a buffer splits it across devices.
    fn write_weight(&self, id: TensorId, buf: &TensorBuffer) -> Result<()> {
        let spread = buf
            .bindings()
            .slot(id)
            .and_then(|slot| buf.buffer().spread_at(slot.offset));
        match spread {
            Some(s) if s.window_of.is_some() => Ok(()),
            Some(s) if !s.mirrored => self.with_weight_bytes(id, |bytes| buf.set(id, bytes)),
            _ => self.upload(id, buf),
        }
    }
}

/// Writes zeros over tensor `id` of `buf` (a fresh KV cache).
fn zero_tensor(buf: &TensorBuffer, id: TensorId, ctx: &Context) -> Result<()> {
    let slot = buf.bindings().slot(id).ok_or_else(|| Error::NotAllocated {
        tensor: ctx.label(id),
    })?;
    buf.buffer()
        .memset(slot.offset, ctx.tensors()[id.index()].nbytes(), 0)
}
