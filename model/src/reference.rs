//! The reference suite's models: small random-weight GGUF files of every supported architecture
//! (F32 and quantized, grouped-query and single-KV-head attention), generated deterministically
//! here and run by llama.cpp to record the logits Tessera is checked against
//! (`tests/reference/make_references.sh`, `tests/reference/synthetic/`).
//!
//! Q and K projections are drawn with a standard deviation of [`QK_STD`], far above the
//! variance-preserving default, so attention is peaked: a wrong RoPE pairing, mask or scale
//! changes the logits a lot instead of being averaged away by near-uniform attention.

use super::config::{Arch, LlamaConfig};
use super::llama::LlamaModel;
use super::weights::SplitMix;
use tessera::{DType, Result};

/// Vocabulary of the reference models: room for the synthetic vocabulary's 256 byte tokens,
/// which llama.cpp's SentencePiece loader needs (it looks up `<0x0A>`).
pub const REFERENCE_VOCAB: usize = 384;

/// Standard deviation of the reference models' Q and K weights.
pub const QK_STD: f32 = 0.15;

/// Tokens of each reference prompt (BOS included).
pub const PROMPT_LEN: usize = 16;

/// One model of the reference suite.
#[derive(Clone, Debug)]
pub struct ReferenceModel {
    /// File stem: `{arch}-{dtype}-{attention}` plus a variant suffix.
    pub name: String,
    /// Hyper-parameters.
    pub config: LlamaConfig,
    /// Weight seed.
    pub seed: u64,
}

impl ReferenceModel {
    /// The model with its peaked Q/K weights.
    ///
    /// # Errors
    /// As [`LlamaModel::new`].
    pub fn model(&self) -> Result<LlamaModel> {
        LlamaModel::new(self.config.clone(), self.seed)?.with_qk_std(QK_STD)
    }

    /// The GGUF file of the model.
    ///
    /// # Errors
    /// As [`LlamaModel::to_gguf`].
    pub fn gguf_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.model()?.to_gguf()?.to_bytes())
    }

    /// The prompt: BOS (1), then [`PROMPT_LEN`]` - 1` ids drawn from the name, past the three
    /// special tokens.
    pub fn prompt(&self) -> Vec<i32> {
        let mut draws = vec![0f32; PROMPT_LEN - 1];
        SplitMix::for_tensor(self.seed, &self.name).fill_uniform(&mut draws, 0.5, 0.5);
        let span = (self.config.n_vocab - 3) as f32;
        std::iter::once(1)
            .chain(
                draws
                    .iter()
                    .map(|u| 3 + ((u * span) as i32).min(span as i32 - 1)),
            )
            .collect()
    }

    /// How much looser than the suite's bounds this model is held
    /// ([`crate::recorded::tolerance_scale`]: 2 for YaRN, 2.5 for gpt-oss's YaRN, 1 otherwise).
    pub fn tolerance_scale(&self) -> f64 {
        crate::recorded::tolerance_scale(&self.config)
    }

    /// Whether the weights are F32 (held to NMSE ≤ 1e-6 against llama.cpp) rather than quantized.
    pub fn is_f32(&self) -> bool {
        self.config.weight_dtype == DType::F32
    }
}

/// Every model of the suite, in a fixed order.
pub fn reference_models() -> Vec<ReferenceModel> {
    let mut out = Vec::new();
    for arch in Arch::ALL.iter().copied().filter(|a| !a.requires_experts()) {
        let base = base_config(arch);
        // F32 with a feed-forward width (704) that no 128-element granularity divides.
        for (tag, kv) in [("gqa", 2), ("mqa", 1)] {
            out.push(variant(
                format!("{}-f32-{tag}", arch.name()),
                LlamaConfig {
                    n_head_kv: kv,
                    ..base.clone()
                },
            ));
        }
        out.push(variant(
            format!("{}-q8_0-gqa", arch.name()),
            LlamaConfig {
                weight_dtype: DType::Q8_0,
                n_ff: 768,
                ..base.clone()
            },
        ));
    }
    // K-quant weights quantize activations to Q8_K blocks of 256.
    for arch in [Arch::Llama, Arch::Qwen3] {
        out.push(variant(
            format!("{}-q4_k-gqa", arch.name()),
            LlamaConfig {
                weight_dtype: DType::Q4_K,
                n_ff: 768,
                ..base_config(arch)
            },
        ));
    }
    // Affine 4- and 5-bit weights (Q8_1 activations).
    for (arch, dtype, tag) in [
        (Arch::Llama, DType::Q4_1, "q4_1"),
        (Arch::Qwen2, DType::Q5_1, "q5_1"),
    ] {
        out.push(variant(
            format!("{}-{tag}-gqa", arch.name()),
            LlamaConfig {
                weight_dtype: dtype,
                n_ff: 768,
                ..base_config(arch)
            },
        ));
    }
    // The low-bit formats of downloaded files (Q8_K activations for the K-quants and IQ4_XS,
    // Q8_0 for IQ4_NL).
    for (arch, dtype, tag) in [
        (Arch::Llama, DType::Q2_K, "q2_k"),
        (Arch::Qwen3, DType::Q3_K, "q3_k"),
        (Arch::Qwen2, DType::IQ4_NL, "iq4_nl"),
        (Arch::Llama, DType::IQ4_XS, "iq4_xs"),
    ] {
        out.push(variant(
            format!("{}-{tag}-gqa", arch.name()),
            LlamaConfig {
                weight_dtype: dtype,
                n_ff: 768,
                ..base_config(arch)
            },
        ));
    }
    // Linear RoPE scaling (`rope.scaling.factor` 4) and final-logit soft-capping.
    out.push(variant(
        "llama-f32-gqa-linear4".into(),
        LlamaConfig {
            rope_freq_scale: 0.25,
            ..base_config(Arch::Llama)
        },
    ));
    out.push(variant(
        "qwen2-f32-gqa-yarn4".into(),
        LlamaConfig {
            rope_freq_scale: 0.25,
            yarn_orig_ctx: 32,
            ..base_config(Arch::Qwen2)
        },
    ));
    out.push(variant(
        "llama-f32-gqa-ropefreqs".into(),
        LlamaConfig {
            rope_freqs: true,
            ..base_config(Arch::Llama)
        },
    ));
    // Gemma 3 4B-27B style: linear scaling ×8 of the global layers only, a local base other than
    // the default, and half of each head rotated.
    out.push(variant(
        "gemma3-f32-gqa-linear8-swabase".into(),
        LlamaConfig {
            rope_freq_scale: 0.125,
            rope_base_swa: 20000.0,
            n_rot: 32,
            ..base_config(Arch::Gemma3)
        },
    ));
    // Gemma 3 270M's attention: heads of 256 sharing one KV head (a quantized cache rotates K
    // by 256, V by 64).
    out.push(variant(
        "gemma3-f32-mqa-hd256".into(),
        LlamaConfig {
            n_head_kv: 1,
            head_dim: 256,
            n_rot: 256,
            ..base_config(Arch::Gemma3)
        },
    ));
    out.push(variant(
        "gemma3-f32-gqa-softcap".into(),
        LlamaConfig {
            logit_softcap: 50.0,
            ..base_config(Arch::Gemma3)
        },
    ));
    moe_models(&mut out);
    out
}

/// The mixture-of-experts models: 8 experts per block, every block a mixture, routing that
/// changes from token to token (the router is drawn wide; `tests_reference.rs` checks the
/// spread). Mixtral is `llama` with experts.
fn moe_models(out: &mut Vec<ReferenceModel>) {
    let moe = |arch: Arch, n_used: usize, n_ff_exp: usize, dtype: DType| {
        let mut c = base_config(arch);
        c.n_expert = 8;
        c.n_expert_used = n_used;
        c.n_ff_exp = n_ff_exp;
        c.weight_dtype = dtype;
        if arch == Arch::Llama {
            c.n_ff = n_ff_exp;
        }
        c
    };
    for (arch, n_used, tag) in [
        (Arch::Llama, 2, "llama-moe"),
        (Arch::Qwen3Moe, 2, "qwen3moe"),
        (Arch::GptOss, 4, "gpt-oss"),
    ] {
        out.push(variant(
            format!("{tag}-f32-gqa"),
            moe(arch, n_used, 192, DType::F32),
        ));
    }
    out.push(variant(
        "qwen3moe-f32-mqa".into(),
        LlamaConfig {
            n_head_kv: 1,
            ..moe(Arch::Qwen3Moe, 2, 192, DType::F32)
        },
    ));
    out.push(variant(
        "qwen3moe-q8_0-gqa".into(),
        moe(Arch::Qwen3Moe, 2, 256, DType::Q8_0),
    ));
    out.push(variant(
        "llama-moe-q4_k-gqa".into(),
        moe(Arch::Llama, 2, 256, DType::Q4_K),
    ));
    // gpt-oss as released: MXFP4 weights (Q8_0 activations).
    out.push(variant(
        "gpt-oss-mxfp4-gqa".into(),
        moe(Arch::GptOss, 4, 192, DType::MXFP4),
    ));
    // gpt-oss's own RoPE: YaRN ×4 on every layer, the local ones included.
    out.push(variant(
        "gpt-oss-f32-gqa-yarn4".into(),
        LlamaConfig {
            rope_freq_scale: 0.25,
            yarn_orig_ctx: 32,
            ..moe(Arch::GptOss, 4, 192, DType::F32)
        },
    ));
}

fn variant(name: String, config: LlamaConfig) -> ReferenceModel {
    ReferenceModel {
        name,
        config,
        seed: 0x7e55_e7a0,
    }
}

fn base_config(arch: Arch) -> LlamaConfig {
    let mut c = LlamaConfig {
        n_vocab: REFERENCE_VOCAB,
        n_embd: 256,
        head_dim: 64,
        n_rot: 64,
        n_ff: 704,
        weight_dtype: DType::F32,
        arch,
        ..LlamaConfig::tiny()
    };
    match arch {
        Arch::Llama => {}
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
            c.rope_base = 1_000_000.0;
            c.norm_eps = 1e-6;
        }
        Arch::GptOss => {
            // Layer 0 local with a 4-token window, layer 1 global; one RoPE base for both.
            c.rope_base = 150_000.0;
            c.rope_base_swa = 150_000.0;
            c.n_swa = 4;
            c.swa_period = 2;
        }
        Arch::Gemma3 => {
            // Layer 0 local with a 4-token window, layer 1 global; tied output.
            c.rope_base = 1_000_000.0;
            c.norm_eps = 1e-6;
            c.n_swa = 4;
            c.swa_period = 2;
            c.tied_output = true;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_is_valid_and_named_uniquely() {
        let models = reference_models();
        let mut names: Vec<_> = models.iter().map(|m| m.name.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), models.len());
        for m in &models {
            m.config.validate().unwrap();
            let p = m.prompt();
            assert_eq!(p.len(), PROMPT_LEN);
            assert_eq!(p[0], 1);
            assert!(
                p[1..]
                    .iter()
                    .all(|&t| (3..REFERENCE_VOCAB as i32).contains(&t))
            );
        }
        // Every dense architecture has F32 GQA and MQA and a quantized model; every MoE one an
        // F32 model.
        for tag in ["llama-moe-f32-gqa", "qwen3moe-f32-gqa", "gpt-oss-f32-gqa"] {
            assert!(names.iter().any(|n| n == tag), "{tag}");
        }
        for arch in Arch::ALL.iter().copied().filter(|a| !a.requires_experts()) {
            for tag in ["f32-gqa", "f32-mqa", "q8_0-gqa"] {
                let name = format!("{}-{tag}", arch.name());
                assert!(names.contains(&name), "{name}");
            }
        }
    }
}
