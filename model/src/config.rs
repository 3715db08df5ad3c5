//! [`LlamaConfig`]: the hyper-parameters of a llama-style decoder.

use tessera::{DType, Error, Result};

/// The model family: which optional tensors a block has and how it is wired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Arch {
    /// Llama 2/3, TinyLlama, SmolLM: RMS norms, SwiGLU, no biases.
    #[default]
    Llama,
    /// Qwen2: llama plus biases on the Q/K/V projections.
    Qwen2,
    /// Qwen3: llama plus RMS norms of Q and K per head (QK-norm).
    Qwen3,
    /// Gemma 3: QK-norm, norms after attention and feed-forward, GeGLU, embeddings scaled by
    /// √n_embd, sliding-window layers with their own RoPE base, output tied to the embedding.
    Gemma3,
    /// Qwen3 MoE: Qwen3 with a mixture-of-experts feed-forward in every block (softmax router,
    /// top-k weights renormalised).
    Qwen3Moe,
    /// gpt-oss: biases on Q/K/V/O, attention sinks, every other layer a sliding window, YaRN on
    /// every layer, and mixture-of-experts blocks with biased experts, a biased router whose
    /// top-k logits are softmaxed, and the clamped SwiGLU (`swiglu_oai`).
    GptOss,
}

/// How a mixture-of-experts router turns its logits into the weights of the chosen experts
/// (llama.cpp's `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Gating {
    /// Softmax over every expert, then the top-k probabilities (optionally renormalised).
    Softmax,
    /// Top-k of the raw logits, then a softmax over those k.
    SoftmaxWeight,
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: &'static [Arch] = &[
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Qwen3Moe,
        Arch::GptOss,
    ];

    /// The GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// The architecture of a GGUF `general.architecture` name.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// The model families this architecture covers, for help texts.
    pub fn models(self) -> &'static str {
        match self {
            Arch::Llama => "Llama 2/3, TinyLlama, SmolLM; with experts, Mixtral",
            Arch::Qwen2 => "Qwen2, Qwen2.5",
            Arch::Qwen3 => "Qwen3 (dense)",
            Arch::Gemma3 => "Gemma 3",
            Arch::Qwen3Moe => "Qwen3 mixture of experts",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// The names of [`Arch::ALL`], for messages.
    pub fn supported_names() -> String {
        Arch::ALL
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    // Every property below is one exhaustive match, like llama.cpp's `llama_model_rope_type`:
    // a new architecture cannot compile until each one is decided for it.

    /// How RoPE pairs the rotated elements (llama.cpp's `llama_model_rope_type`): adjacent pairs
    /// for `llama`, halves (NeoX) for the others.
    pub fn rope_mode(self) -> tessera::RopeMode {
        match self {
            Arch::Llama => tessera::RopeMode::Normal,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe | Arch::GptOss => {
                tessera::RopeMode::Neox
            }
        }
    }

    /// Q/K/V projections carry biases.
    pub fn attn_bias(self) -> bool {
        match self {
            Arch::Qwen2 | Arch::GptOss => true,
            Arch::Llama | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => false,
        }
    }

    /// The attention output projection carries a bias.
    pub fn attn_out_bias(self) -> bool {
        match self {
            Arch::GptOss => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => false,
        }
    }

    /// Every head has an attention sink (`attn_sinks.weight`).
    pub fn attn_sinks(self) -> bool {
        match self {
            Arch::GptOss => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => false,
        }
    }

    /// Q and K are RMS-normed per head before RoPE.
    pub fn qk_norm(self) -> bool {
        match self {
            Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => true,
            Arch::Llama | Arch::Qwen2 | Arch::GptOss => false,
        }
    }

    /// Attention and feed-forward outputs are RMS-normed before the residual add.
    pub fn post_norms(self) -> bool {
        match self {
            Arch::Gemma3 => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::GptOss => false,
        }
    }

    /// Token embeddings are scaled by √n_embd.
    pub fn scales_embeddings(self) -> bool {
        match self {
            Arch::Gemma3 => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::GptOss => false,
        }
    }

    /// With a sliding window in the file, every how many layers one is global when the file
    /// does not say (`{arch}.attention.sliding_window_pattern`); 0 when the architecture has no
    /// sliding-window layers (the key is then ignored, as llama.cpp does).
    pub fn default_swa_period(self) -> usize {
        match self {
            Arch::Gemma3 => 6,
            Arch::GptOss => 2,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => 0,
        }
    }

    /// Sliding-window layers rotate with the global layers' scaling (YaRN or linear) too:
    /// gpt-oss sets `rope_freq_scale_train_swa` to the global value, Gemma 3 leaves them unscaled.
    pub fn scales_swa_rope(self) -> bool {
        match self {
            Arch::GptOss => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => false,
        }
    }

    /// The file's feed-forward blocks are mixtures of experts whatever `expert_count` says
    /// (llama can be either: Mixtral is `llama` with experts).
    pub fn requires_experts(self) -> bool {
        match self {
            Arch::Qwen3Moe | Arch::GptOss => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => false,
        }
    }

    /// Mixture-of-experts blocks are possible at all.
    pub fn allows_experts(self) -> bool {
        match self {
            Arch::Llama | Arch::Qwen3Moe | Arch::GptOss => true,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => false,
        }
    }

    /// The router's gating function.
    pub fn gating(self) -> Gating {
        match self {
            Arch::GptOss => Gating::SoftmaxWeight,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => {
                Gating::Softmax
            }
        }
    }

    /// The chosen experts' weights are renormalised to sum to 1 (llama.cpp's `norm_w`).
    pub fn normalises_expert_weights(self) -> bool {
        match self {
            Arch::Llama | Arch::Qwen3Moe => true,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::GptOss => false,
        }
    }

    /// The router and every expert carry biases (`ffn_gate_inp.bias`, `ffn_*_exps.bias`).
    pub fn expert_biases(self) -> bool {
        match self {
            Arch::GptOss => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => false,
        }
    }

    /// The GGUF name of the norm before the feed-forward block (`blk.{i}.NAME.weight`).
    pub fn ffn_norm_name(self) -> &'static str {
        match self {
            Arch::GptOss => "post_attention_norm",
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe => "ffn_norm",
        }
    }

    /// The architecture applies `rope_freqs.weight` when a file has it (llama.cpp's
    /// `get_rope_factors`).
    pub fn uses_rope_freqs(self) -> bool {
        match self {
            Arch::Llama => true,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe | Arch::GptOss => false,
        }
    }

    /// The architecture reads `{arch}.final_logit_softcapping` (llama.cpp: Gemma 3 only).
    pub fn reads_logit_softcap(self) -> bool {
        match self {
            Arch::Gemma3 => true,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::GptOss => false,
        }
    }

    /// RoPE must rotate the whole head (llama.cpp refuses other `rope.dimension_count` values
    /// for `llama` with "invalid n_rot").
    pub fn rotates_whole_head(self) -> bool {
        match self {
            Arch::Llama => true,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe | Arch::GptOss => false,
        }
    }

    /// The gated activation of the feed-forward block.
    pub fn glu(self) -> tessera::GluOp {
        match self {
            Arch::Gemma3 => tessera::GluOp::Geglu,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::GptOss => {
                tessera::GluOp::Swiglu
            }
        }
    }
}

/// Hyper-parameters of a llama-style decoder (names as in llama.cpp's `llama_hparams`).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size (rows of the token embedding and of the output projection).
    pub n_vocab: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention: `n_head` must be a multiple).
    pub n_head_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Hidden size of the feed-forward block.
    pub n_ff: usize,
    /// Context length: rows of each KV cache.
    pub n_ctx: usize,
    /// RoPE θ base.
    pub rope_base: f32,
    /// ε of the RMS norms.
    pub norm_eps: f32,
    /// Dtype of the projection matrices (attention, feed-forward and output); the token
    /// embedding and the norms are F32.
    pub weight_dtype: DType,
    /// Model family.
    pub arch: Arch,
    /// Sliding-window size of the local-attention layers (0: every layer attends globally).
    pub n_swa: usize,
    /// With a sliding window, every `swa_period`-th layer (counting from 1) is global and the
    /// others are local (Gemma 3: 6). 0: all layers are local when `n_swa > 0`.
    pub swa_period: usize,
    /// RoPE θ base of the local (sliding-window) layers.
    pub rope_base_swa: f32,
    /// The output projection is the token embedding (no `output.weight`).
    pub tied_output: bool,
    /// Leading elements of each head that RoPE rotates (`{arch}.rope.dimension_count`; the
    /// head size when absent). Even and at most `head_dim`.
    pub n_rot: usize,
    /// RoPE position scale of the global layers: `1 / factor` for linear scaling
    /// (`{arch}.rope.scaling.factor`), 1 for none. Sliding-window layers are never scaled.
    pub rope_freq_scale: f32,
    /// Final logits are soft-capped to `±cap · tanh(x / cap)` (0: no capping;
    /// `{arch}.final_logit_softcapping`).
    pub logit_softcap: f32,
    /// RoPE frequency factors `rope_freqs.weight` (f32 `[n_rot / 2]`, Llama 3.1-style
    /// long-context scaling) divide each pair's angle; architectures whose
    /// [`Arch::uses_rope_freqs`] is false have none.
    pub rope_freqs: bool,
    /// YaRN context extension of the global layers (`{arch}.rope.scaling.type` `yarn`): the
    /// trained context the factor extends (`rope.scaling.original_context_length`); 0 without
    /// YaRN. With it, [`LlamaConfig::rope_freq_scale`] is `1 / factor`.
    pub yarn_orig_ctx: usize,
    /// Experts per mixture-of-experts block (`{arch}.expert_count`); 0: dense feed-forward.
    pub n_expert: usize,
    /// Experts each token is routed to (`{arch}.expert_used_count`).
    pub n_expert_used: usize,
    /// Hidden size of one expert (`{arch}.expert_feed_forward_length`; llama: `n_ff`).
    pub n_ff_exp: usize,
}

impl LlamaConfig {
    /// A llama-shaped model of about 100M parameters with Q8_0 weights: vocabulary 32000,
    /// width 768, 12 layers of 12 query / 4 KV heads of 64, feed-forward 1280, context 512.
    ///
    /// (A feed-forward size of 2048 would give 125M parameters; 1280 keeps the total near 100M.)
    pub fn synthetic_100m() -> LlamaConfig {
        LlamaConfig {
            n_vocab: 32000,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_head_kv: 4,
            head_dim: 64,
            n_ff: 1280,
            n_ctx: 512,
            rope_base: 10000.0,
            norm_eps: 1e-5,
            weight_dtype: DType::Q8_0,
            arch: Arch::Llama,
            n_swa: 0,
            swa_period: 0,
            rope_base_swa: 10000.0,
            tied_output: false,
            n_rot: 64,
            rope_freq_scale: 1.0,
            logit_softcap: 0.0,
            rope_freqs: false,
            yarn_orig_ctx: 0,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
        }
    }

    /// A llama-shaped model of about 1.1B parameters (Llama 3.2 1B's width and depth with a
    /// 32000-token vocabulary): width 2048, 16 layers of 32 query / 8 KV heads of 64,
    /// feed-forward 8192, context 1024, Q8_0 weights; for GPU benchmarks, where the 100M model
    /// is too small to fill the device.
    pub fn synthetic_1b() -> LlamaConfig {
        LlamaConfig {
            n_embd: 2048,
            n_layer: 16,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 64,
            n_ff: 8192,
            n_ctx: 1024,
            ..LlamaConfig::synthetic_100m()
        }
    }

    /// A llama-shaped model in Llama 3 8B's dimensions (width 4096, 32 layers of 32 query / 8 KV
    /// heads of 128, feed-forward 14336, a 128256-token vocabulary, rope base 500000), context
    /// 1024, Q8_0 weights: the size users run on GPUs, for comparing decode and prompt speed with
    /// llama.cpp on the same file. About 8.0B parameters.
    pub fn synthetic_8b() -> LlamaConfig {
        LlamaConfig {
            n_vocab: 128_256,
            n_embd: 4096,
            n_layer: 32,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            n_rot: 128,
            n_ff: 14336,
            n_ctx: 1024,
            rope_base: 500_000.0,
            ..LlamaConfig::synthetic_100m()
        }
    }

    /// [`LlamaConfig::synthetic_100m`] with Mixtral's layout: every feed-forward block a mixture
    /// of 8 experts of width 512, 2 used per token (181M parameters, 96M active).
    pub fn synthetic_moe() -> LlamaConfig {
        LlamaConfig {
            n_ff: 512,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 512,
            ..LlamaConfig::synthetic_100m()
        }
    }

    /// A tiny model for tests: vocabulary 256, width 64, 2 layers of 4 query / 2 KV heads of 16,
    /// feed-forward 128, context 64, Q8_0 weights.
    pub fn tiny() -> LlamaConfig {
        LlamaConfig {
            n_vocab: 256,
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_ff: 128,
            n_ctx: 64,
            rope_base: 10000.0,
            norm_eps: 1e-5,
            weight_dtype: DType::Q8_0,
            arch: Arch::Llama,
            n_swa: 0,
            swa_period: 0,
            rope_base_swa: 10000.0,
            tied_output: false,
            n_rot: 16,
            rope_freq_scale: 1.0,
            logit_softcap: 0.0,
            rope_freqs: false,
            yarn_orig_ctx: 0,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
        }
    }

    /// [`LlamaConfig::tiny`] shaped as `arch` (Gemma 3 with a window of 4 tokens, every second
    /// layer global, and a tied output), for tests of every architecture.
    pub fn tiny_arch(arch: Arch) -> LlamaConfig {
        let mut c = LlamaConfig {
            arch,
            ..LlamaConfig::tiny()
        };
        if arch == Arch::Gemma3 {
            c.n_swa = 4;
            c.swa_period = 2;
            c.rope_base_swa = 10000.0;
            c.rope_base = 1_000_000.0;
            c.tied_output = true;
        }
        c
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// [`LlamaConfig::tiny`] as a mixture of `n_expert` experts of which `n_used` are active,
    /// each of hidden size `n_ff_exp`, shaped as `arch` (llama: Mixtral's layout).
    pub fn tiny_moe(arch: Arch, n_expert: usize, n_used: usize, n_ff_exp: usize) -> LlamaConfig {
        let mut c = LlamaConfig::tiny_arch(arch);
        c.n_expert = n_expert;
        c.n_expert_used = n_used;
        c.n_ff_exp = n_ff_exp;
        if arch == Arch::Llama {
            c.n_ff = n_ff_exp;
        }
        if arch == Arch::GptOss {
            c.n_swa = 4;
            c.swa_period = 2;
        }
        c
    }

    /// Whether layer `il` attends through a sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.n_swa > 0 && (self.swa_period == 0 || !(il + 1).is_multiple_of(self.swa_period))
    }

    /// The scale of Q·K in attention: 1/√head_dim, except Gemma 3 27B (62 layers), which
    /// scales by 1/√(n_embd / n_head) as llama.cpp and the reference implementation do.
    pub fn kq_scale(&self) -> f32 {
        let d = match self.arch {
            Arch::Gemma3 if self.n_layer == 62 => self.n_embd / self.n_head,
            Arch::Gemma3
            | Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::GptOss => self.head_dim,
        };
        1.0 / (d as f32).sqrt()
    }

    /// YaRN's per-pair divisors of the rotation angle for the global layers (ggml's `rope_yarn`
    /// with `ext_factor` 1 and β 32 / 1, as llama.cpp sets them): pair `i` turns by
    /// `θ_i · (s·(1 − r_i) + r_i)` for the position scale `s` and the ramp `r_i` between the
    /// correction dimensions, i.e. by `θ_i / f_i` with `f_i = 1 / (s·(1 − r_i) + r_i)`. `None`
    /// without YaRN.
    pub fn yarn_factors(&self) -> Option<Vec<f32>> {
        if self.yarn_orig_ctx == 0 {
            return None;
        }
        let (n_dims, base, s) = (self.n_rot as f32, self.rope_base, self.rope_freq_scale);
        let corr_dim = |beta: f32| {
            n_dims * (self.yarn_orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = corr_dim(32.0).floor().max(0.0);
        let high = corr_dim(1.0).ceil().min(n_dims - 1.0);
        Some(
            (0..self.n_rot / 2)
                .map(|i| {
                    let y = (i as f32 - low) / (high - low).max(0.001);
                    let ramp = 1.0 - y.clamp(0.0, 1.0);
                    1.0 / (s * (1.0 - ramp) + ramp)
                })
                .collect(),
        )
    }

    /// YaRN's magnitude scale of the rotated Q and K, `1 + 0.1·ln(1/s)` (1 without YaRN, and
    /// for factors ≤ 1, where llama.cpp's attention factor cancels it); it multiplies attention
    /// scores by its square.
    pub fn yarn_mscale(&self) -> f32 {
        if self.yarn_orig_ctx == 0 || self.rope_freq_scale >= 1.0 {
            1.0
        } else {
            1.0 + 0.1 * (1.0 / self.rope_freq_scale).ln()
        }
    }

    /// Width of the attention output (`n_head · head_dim`).
    pub fn n_embd_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of one KV cache row (`n_head_kv · head_dim`).
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Parameters of the weights (KV caches excluded).
    pub fn param_count(&self) -> usize {
        let (e, q, kv, ff) = (self.n_embd, self.n_embd_q(), self.n_embd_kv(), self.n_ff);
        let a = self.arch;
        let ffn = if self.is_moe() {
            let (n, f) = (self.n_expert, self.n_ff_exp);
            e * n
                + 3 * e * f * n
                + if a.expert_biases() {
                    n + (2 * f + e) * n
                } else {
                    0
                }
        } else {
            3 * e * ff
        };
        let per_layer = 2 * e
            + 2 * e * q
            + 2 * e * kv
            + ffn
            + if a.attn_bias() { q + 2 * kv } else { 0 }
            + if a.attn_out_bias() { e } else { 0 }
            + if a.attn_sinks() { self.n_head } else { 0 }
            + if a.qk_norm() { 2 * self.head_dim } else { 0 }
            + if a.post_norms() { 2 * e } else { 0 };
        let embeddings = if self.tied_output { 1 } else { 2 };
        let rope_freqs = if self.rope_freqs { self.n_rot / 2 } else { 0 };
        embeddings * self.n_vocab * e + e + self.n_layer * per_layer + rope_freqs
    }

    /// Checks that the shapes are consistent and that every matrix row is a whole number of
    /// blocks of `weight_dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument(format!("llama config: {msg}")));
        let sizes = [
            ("n_vocab", self.n_vocab),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("n_ff", self.n_ff),
            ("n_ctx", self.n_ctx),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} must be positive"));
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "n_head {} is not a multiple of n_head_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if !self.n_rot.is_multiple_of(2) || self.n_rot == 0 || self.n_rot > self.head_dim {
            return bad(format!(
                "n_rot {} must be even, positive and at most head_dim {}",
                self.n_rot, self.head_dim
            ));
        }
        if !(self.weight_dtype.is_float() || self.weight_dtype.is_quantized()) {
            return bad(format!(
                "weight dtype {} is not a float or quantized type",
                self.weight_dtype
            ));
        }
        let bs = self.weight_dtype.block_size();
        // The reduction length k = ne0 of every projection must be whole blocks.
        for (name, k) in [
            ("n_embd", self.n_embd),
            ("n_head * head_dim", self.n_embd_q()),
            ("n_ff", self.n_ff),
        ] {
            if !k.is_multiple_of(bs) {
                return bad(format!(
                    "{name} = {k} is not a multiple of {}'s block size {bs}",
                    self.weight_dtype
                ));
            }
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad(format!("rope_base {} must be positive", self.rope_base));
        }
        if !(self.rope_base_swa.is_finite() && self.rope_base_swa > 0.0) {
            return bad(format!(
                "rope_base_swa {} must be positive",
                self.rope_base_swa
            ));
        }
        if !(self.rope_freq_scale.is_finite() && self.rope_freq_scale > 0.0) {
            return bad(format!(
                "rope_freq_scale {} must be positive",
                self.rope_freq_scale
            ));
        }
        if !(self.logit_softcap.is_finite() && self.logit_softcap >= 0.0) {
            return bad(format!("logit_softcap {} must be ≥ 0", self.logit_softcap));
        }
        if self.arch.rotates_whole_head() && self.n_rot != self.head_dim {
            return bad(format!(
                "invalid n_rot {} for {}: it rotates whole heads of {}",
                self.n_rot,
                self.arch.name(),
                self.head_dim
            ));
        }
        if self.logit_softcap > 0.0 && !self.arch.reads_logit_softcap() {
            return bad(format!(
                "{} has no final-logit soft-capping",
                self.arch.name()
            ));
        }
        if self.yarn_orig_ctx > 0 && self.n_rot != self.head_dim {
            // YaRN's magnitude scale applies to the rotated part only; it is folded into the
            // attention scale, which is exact only when the whole head rotates.
            return bad(format!(
                "YaRN with partial rotation (n_rot {} < head_dim {}) is not supported",
                self.n_rot, self.head_dim
            ));
        }
        if self.rope_freqs && !self.arch.uses_rope_freqs() {
            return bad(format!(
                "{} does not use RoPE frequency factors",
                self.arch.name()
            ));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return bad(format!("norm_eps {} must be ≥ 0", self.norm_eps));
        }
        if self.arch.scales_swa_rope()
            && self.yarn_orig_ctx > 0
            && self.n_swa > 0
            && self.rope_base_swa != self.rope_base
        {
            // YaRN's ramp depends on the base; the divisors are built once, for the global one.
            return bad(format!(
                "YaRN with a local RoPE base {} other than the global {} is not supported",
                self.rope_base_swa, self.rope_base
            ));
        }
        if self.arch.requires_experts() && !self.is_moe() {
            return bad(format!(
                "{} needs experts (expert_count > 0)",
                self.arch.name()
            ));
        }
        if self.is_moe() {
            if !self.arch.allows_experts() {
                return bad(format!(
                    "{} has no mixture-of-experts blocks",
                    self.arch.name()
                ));
            }
            if self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
                return bad(format!(
                    "expert_used_count {} must be in 1..={} (expert_count)",
                    self.n_expert_used, self.n_expert
                ));
            }
            if self.n_ff_exp == 0 || !self.n_ff_exp.is_multiple_of(bs) {
                return bad(format!(
                    "expert feed-forward length {} must be a positive multiple of {}'s block size {bs}",
                    self.n_ff_exp, self.weight_dtype
                ));
            }
            if self.n_expert > i32::MAX as usize {
                return bad("expert_count must fit in i32".into());
            }
        }
        if i32::try_from(self.n_ctx).is_err() || i32::try_from(self.n_vocab).is_err() {
            return bad("n_ctx and n_vocab must fit in i32".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_preset_is_valid_and_sized() {
        let c = LlamaConfig::synthetic_moe();
        c.validate().unwrap();
        let p = c.param_count();
        assert!((170_000_000..190_000_000).contains(&p), "{p}");
        for arch in [Arch::Llama, Arch::Qwen3Moe, Arch::GptOss] {
            LlamaConfig::tiny_moe(arch, 4, 2, 64).validate().unwrap();
        }
        let mut dense_only = LlamaConfig::tiny_moe(Arch::Qwen3, 4, 2, 64);
        assert!(dense_only.validate().is_err());
        dense_only.arch = Arch::Qwen3Moe;
        dense_only.n_expert_used = 5;
        assert!(dense_only.validate().is_err());
        assert!(LlamaConfig::tiny_arch(Arch::GptOss).validate().is_err());
    }

    #[test]
    fn presets_are_valid_and_sized() {
        LlamaConfig::tiny().validate().unwrap();
        let c = LlamaConfig::synthetic_100m();
        c.validate().unwrap();
        let p = c.param_count();
        assert!((95_000_000..110_000_000).contains(&p), "{p}");
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        let mut c = LlamaConfig::tiny();
        c.n_embd = 48;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
        c.weight_dtype = DType::F16;
        c.validate().unwrap();
        let mut c = LlamaConfig::tiny();
        c.n_head_kv = 3;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
        let mut c = LlamaConfig::tiny();
        c.n_layer = 0;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
        let mut c = LlamaConfig::tiny();
        c.weight_dtype = DType::I32;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
    }
}
