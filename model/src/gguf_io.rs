//! GGUF export of the synthetic [`LlamaModel`]: its weights under their GGUF names, the `llama.*`
//! hyper-parameters as llama.cpp names them, and a small SentencePiece vocabulary, so model
//! loading can be developed and tested without downloading a model. [`LlamaConfig::from_gguf`]
//! reads the hyper-parameters back.

use super::config::{Arch, LlamaConfig};
use super::llama::LlamaModel;
use super::tokenizer::{
    KEY_ADD_BOS, KEY_ADD_EOS, KEY_BOS, KEY_EOS, KEY_MODEL, KEY_SCORES, KEY_TOKEN_TYPE, KEY_TOKENS,
    KEY_UNK, synthetic_vocab,
};
use std::path::Path;
use tessera::gguf::{GgufFile, GgufWriter};
use tessera::{Error, Result};

/// The synthetic vocabulary's tokenizer keys ([`synthetic_vocab`]) into `w`.
fn write_vocab(w: &mut GgufWriter, n_vocab: usize) -> Result<()> {
    let (tokens, scores, types) = synthetic_vocab(n_vocab);
    w.set(KEY_MODEL, "llama")?;
    w.set(KEY_TOKENS, tokens)?;
    w.set(KEY_SCORES, scores)?;
    w.set(KEY_TOKEN_TYPE, types)?;
    for (key, id) in [(KEY_UNK, 0), (KEY_BOS, 1), (KEY_EOS, 2)] {
        if id < n_vocab {
            w.set(key, id as u32)?;
        }
    }
    w.set(KEY_ADD_BOS, n_vocab > 1)?;
    w.set(KEY_ADD_EOS, false)?;
    Ok(())
}

impl LlamaModel {
    /// The tokenizer of the vocabulary [`LlamaModel::to_gguf`] writes (a synthetic model's
    /// text in and out without a file).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a vocabulary the tokenizer refuses (fewer than 3 tokens).
    pub fn synthetic_tokenizer(&self) -> Result<super::Tokenizer> {
        let mut w = GgufWriter::new();
        write_vocab(&mut w, self.config().n_vocab)?;
        let file = GgufFile::from_bytes(
            w.to_bytes(),
            "synthetic vocabulary",
            &tessera::gguf::ReadOptions::default(),
        )
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        super::Tokenizer::from_gguf(&file).map_err(|e| Error::InvalidArgument(e.to_string()))
    }
}

/// `general.architecture` of the files written here for [`Arch::Llama`] models (other
/// architectures write their own name).
pub const ARCHITECTURE: &str = "llama";

/// The `llama.*` hyper-parameter keys, as llama.cpp names them.
pub mod llama_keys {
    /// Context length the model was trained for (here: rows of the KV caches).
    pub const CONTEXT_LENGTH: &str = "llama.context_length";
    /// Width of the residual stream.
    pub const EMBEDDING_LENGTH: &str = "llama.embedding_length";
    /// Number of transformer blocks.
    pub const BLOCK_COUNT: &str = "llama.block_count";
    /// Hidden size of the feed-forward block.
    pub const FEED_FORWARD_LENGTH: &str = "llama.feed_forward_length";
    /// Query heads.
    pub const HEAD_COUNT: &str = "llama.attention.head_count";
    /// Key/value heads.
    pub const HEAD_COUNT_KV: &str = "llama.attention.head_count_kv";
    /// Size of one key head.
    pub const KEY_LENGTH: &str = "llama.attention.key_length";
    /// Size of one value head.
    pub const VALUE_LENGTH: &str = "llama.attention.value_length";
    /// RoPE θ base.
    pub const ROPE_FREQ_BASE: &str = "llama.rope.freq_base";
    /// Rotated dimensions per head.
    pub const ROPE_DIMENSION_COUNT: &str = "llama.rope.dimension_count";
    /// ε of the RMS norms.
    pub const RMS_EPS: &str = "llama.attention.layer_norm_rms_epsilon";
    /// Vocabulary size.
    pub const VOCAB_SIZE: &str = "llama.vocab_size";
}

impl LlamaModel {
    /// Writes the model to `path` as GGUF v3 (see [`LlamaModel::to_gguf`]).
    ///
    /// # Errors
    /// As [`LlamaModel::to_gguf`]; [`Error::File`] (a [`tessera::gguf::GgufError`] inside) for
    /// i/o errors, naming the path.
    pub fn write_gguf(&self, path: impl AsRef<Path>) -> Result<()> {
        self.to_gguf()?.write_file(path)?;
        Ok(())
    }

    /// The model as a GGUF writer: every weight (KV caches excluded) under its GGUF name with
    /// trailing unit dimensions dropped (norms are 1-D), `general.architecture = llama`, the
    /// `llama.*` hyper-parameters ([`llama_keys`]) and a `llama` (SentencePiece) vocabulary of
    /// exactly `n_vocab` tokens from [`synthetic_vocab`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a hyper-parameter does not fit in a `u32`; weight
    /// generation errors.
    pub fn to_gguf(&self) -> Result<GgufWriter> {
        let c = self.config();
        let u32_of = |name: &str, v: usize| {
            u32::try_from(v).map_err(|_| {
                Error::InvalidArgument(format!("{name} = {v} does not fit a GGUF u32"))
            })
        };
        let mut w = GgufWriter::new();
        let arch = c.arch.name();
        // The llama_keys with this architecture's prefix.
        let k = |key: &str| key.replacen("llama.", &format!("{arch}."), 1);
        w.set("general.architecture", arch)?;
        w.set("general.name", format!("tessera synthetic {arch}"))?;
        for (key, v) in [
            (llama_keys::CONTEXT_LENGTH, c.n_ctx),
            (llama_keys::EMBEDDING_LENGTH, c.n_embd),
            (llama_keys::BLOCK_COUNT, c.n_layer),
            (llama_keys::FEED_FORWARD_LENGTH, c.n_ff),
            (llama_keys::HEAD_COUNT, c.n_head),
            (llama_keys::HEAD_COUNT_KV, c.n_head_kv),
            (llama_keys::KEY_LENGTH, c.head_dim),
            (llama_keys::VALUE_LENGTH, c.head_dim),
            (llama_keys::ROPE_DIMENSION_COUNT, c.n_rot),
            (llama_keys::VOCAB_SIZE, c.n_vocab),
        ] {
            w.set(&k(key), u32_of(key, v)?)?;
        }
        w.set(&k(llama_keys::ROPE_FREQ_BASE), c.rope_base)?;
        w.set(&k(llama_keys::RMS_EPS), c.norm_eps)?;
        if c.n_swa > 0 {
            w.set(
                &format!("{arch}.attention.sliding_window"),
                u32_of("n_swa", c.n_swa)?,
            )?;
            w.set(
                &format!("{arch}.attention.sliding_window_pattern"),
                u32_of("swa_period", c.swa_period)?,
            )?;
            w.set(&format!("{arch}.rope.freq_base_swa"), c.rope_base_swa)?;
        }
        if c.rope_freq_scale != 1.0 {
            let kind = if c.yarn_orig_ctx > 0 {
                "yarn"
            } else {
                "linear"
            };
            w.set(&format!("{arch}.rope.scaling.type"), kind)?;
            w.set(
                &format!("{arch}.rope.scaling.factor"),
                1.0 / c.rope_freq_scale,
            )?;
            if c.yarn_orig_ctx > 0 {
                w.set(
                    &format!("{arch}.rope.scaling.original_context_length"),
                    u32_of("yarn_orig_ctx", c.yarn_orig_ctx)?,
                )?;
            }
        }
        if c.logit_softcap > 0.0 {
            w.set(&format!("{arch}.final_logit_softcapping"), c.logit_softcap)?;
        }
        if c.is_moe() {
            w.set(
                &format!("{arch}.expert_count"),
                u32_of("n_expert", c.n_expert)?,
            )?;
            w.set(
                &format!("{arch}.expert_used_count"),
                u32_of("n_expert_used", c.n_expert_used)?,
            )?;
            if c.arch != Arch::Llama {
                w.set(
                    &format!("{arch}.expert_feed_forward_length"),
                    u32_of("n_ff_exp", c.n_ff_exp)?,
                )?;
            }
        }
        write_vocab(&mut w, c.n_vocab)?;
        for (id, _) in self.params() {
            if self.is_cache(id) || self.is_derived(id) {
                continue;
            }
            let t = self.context().tensor(id)?;
            let ne = t.ne();
            let n_dims = ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1);
            w.add_tensor(t.name(), t.dtype(), &ne[..n_dims], self.weight_bytes(id)?)?;
        }
        Ok(w)
    }
}

impl super::llama::WeightSource for GgufFile {
    fn describe(&self, name: &str) -> Option<(tessera::DType, [usize; 4])> {
        let info = self.tensor_info(name).ok()?;
        Some((info.dtype().ok()?, info.ne()))
    }
    fn read(&self, name: &str) -> Result<Vec<u8>> {
        Ok(self.tensor_bytes(name)?.to_vec())
    }
    fn with_bytes(&self, name: &str, f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let out = f(self.tensor_bytes(name)?);
        // The loader has its copy: the file's pages need not stay resident.
        self.release_tensor(name);
        out
    }
    fn release(&self, name: &str, range: std::ops::Range<usize>) {
        self.release_tensor_range(name, range);
    }
    fn label(&self) -> String {
        self.source().to_string()
    }
}

impl LlamaModel {
    /// The model stored in a GGUF file: hyper-parameters from [`LlamaConfig::from_gguf`] (with
    /// the context capped at `n_ctx` when given: the KV caches have that many rows), weights read
    /// from the file in their own dtypes.
    ///
    /// # Errors
    /// As [`LlamaConfig::from_gguf`] and [`LlamaModel::from_source`] (a tensor the architecture
    /// needs is missing or has another shape, a dtype Tessera does not support).
    pub fn from_gguf(file: std::sync::Arc<GgufFile>, n_ctx: Option<usize>) -> Result<LlamaModel> {
        let mut config = LlamaConfig::from_gguf(&file)?;
        if let Some(n) = n_ctx {
            config.n_ctx = n;
        }
        LlamaModel::from_source(config, file)
    }
}

impl LlamaConfig {
    /// The hyper-parameters of a GGUF file of a supported architecture (`llama`, `qwen2`,
    /// `qwen3`, `gemma3`; see [`Arch`]): the `{arch}.*` keys as llama.cpp names them (the
    /// [`llama_keys`] with the architecture's prefix), `n_vocab` from `token_embd.weight`, the
    /// weight dtype from `blk.0.attn_q.weight`, `head_dim` from `{arch}.attention.key_length`
    /// (else `n_embd / n_head`), `n_ctx` from the context length, a tied output when the file has
    /// no `output.weight`, and for Gemma 3 the sliding window (every 6th layer global, local RoPE
    /// base 10000, as llama.cpp sets them).
    ///
    /// # Errors
    /// [`Error::File`] (a [`tessera::gguf::GgufError`] inside) for a missing or mistyped key or
    /// tensor; [`Error::InvalidArgument`] for
    /// an unsupported architecture or an invalid config.
    pub fn from_gguf(file: &GgufFile) -> Result<LlamaConfig> {
        let md = file.metadata();
        let name = md.get_str("general.architecture")?;
        let arch = Arch::from_name(name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: architecture {name:?} is not supported ({})",
                file.source(),
                Arch::supported_names()
            ))
        })?;
        let key = |suffix: &str| format!("{name}.{suffix}");
        let n_embd = md.get_usize(&key("embedding_length"))?;
        let n_head = md.get_usize(&key("attention.head_count"))?;
        let head_dim = match md.get(&key("attention.key_length")) {
            Some(_) => md.get_usize(&key("attention.key_length"))?,
            None => n_embd.checked_div(n_head).unwrap_or(0),
        };
        let n_head_kv = match md.get(&key("attention.head_count_kv")) {
            Some(_) => md.get_usize(&key("attention.head_count_kv"))?,
            None => n_head,
        };
        let float_or = |suffix: &str, default: f32| match md.get(&key(suffix)) {
            Some(_) => md.get_float(&key(suffix)),
            None => Ok(default),
        };
        let rope_base = float_or("rope.freq_base", 10000.0)?;
        let n_rot = match md.get(&key("rope.dimension_count")) {
            Some(_) => md.get_usize(&key("rope.dimension_count"))?,
            None => head_dim,
        };
        let n_ctx_train = md.get_usize(&key("context_length"))?;
        let (rope_freq_scale, yarn_orig_ctx) = rope_scaling(file, &key, n_ctx_train)?;
        // llama.cpp reads the window only for architectures with sliding-window layers.
        let period = arch.default_swa_period();
        let (n_swa, swa_period) = match md.get(&key("attention.sliding_window")) {
            Some(_) if period > 0 => {
                let n = md.get_usize(&key("attention.sliding_window"))?;
                let p = match md.get(&key("attention.sliding_window_pattern")) {
                    Some(tessera::gguf::Value::Array(_)) => {
                        return Err(Error::InvalidArgument(format!(
                            "{}: a per-layer sliding_window_pattern array is not supported",
                            file.source()
                        )));
                    }
                    Some(_) => md.get_usize(&key("attention.sliding_window_pattern"))?,
                    None => period,
                };
                (n, if n > 0 { p } else { 0 })
            }
            _ => (0, 0),
        };
        let n_expert = match md.get(&key("expert_count")) {
            Some(_) => md.get_usize(&key("expert_count"))?,
            None => 0,
        };
        let n_ff = md.get_usize(&key("feed_forward_length")).or_else(|e| {
            // MoE-only architectures may omit the dense width.
            if arch.requires_experts() {
                Ok(0)
            } else {
                Err(e)
            }
        })?;
        let (n_expert_used, n_ff_exp) = if n_expert > 0 {
            let used = md.get_usize(&key("expert_used_count"))?;
            // llama (Mixtral) experts are n_ff wide; the others say so, or (qwen3moe, as
            // llama.cpp) default to n_ff / n_expert_used.
            let ff_exp = match md.get(&key("expert_feed_forward_length")) {
                Some(_) if arch != Arch::Llama => {
                    md.get_usize(&key("expert_feed_forward_length"))?
                }
                _ if arch == Arch::Llama => n_ff,
                _ => n_ff.checked_div(used).unwrap_or(0),
            };
            (used, ff_exp)
        } else {
            (0, 0)
        };
        let rope_freqs = file.tensor_info("rope_freqs.weight").is_ok();
        if rope_freqs && !arch.uses_rope_freqs() {
            return Err(Error::InvalidArgument(format!(
                "{}: rope_freqs.weight in a {name} model, which llama.cpp does not apply either",
                file.source()
            )));
        }
        let config = LlamaConfig {
            n_vocab: file.tensor_info("token_embd.weight")?.ne()[1],
            n_embd,
            n_layer: md.get_usize(&key("block_count"))?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: if n_expert > 0 && n_ff == 0 {
                n_ff_exp
            } else {
                n_ff
            },
            n_ctx: n_ctx_train,
            rope_base,
            norm_eps: md.get_float(&key("attention.layer_norm_rms_epsilon"))?,
            weight_dtype: file.tensor_info("blk.0.attn_q.weight")?.dtype()?,
            arch,
            n_swa,
            swa_period,
            // gpt-oss's local layers share the global base unless the file says otherwise.
            rope_base_swa: float_or(
                "rope.freq_base_swa",
                if arch.scales_swa_rope() {
                    rope_base
                } else {
                    10000.0
                },
            )?,
            tied_output: file.tensor_info("output.weight").is_err(),
            n_rot,
            rope_freq_scale,
            // llama.cpp reads the key for Gemma 3 only; other architectures ignore it.
            logit_softcap: if arch.reads_logit_softcap() {
                float_or("final_logit_softcapping", 0.0)?
            } else {
                0.0
            },
            rope_freqs,
            yarn_orig_ctx,
            n_expert,
            n_expert_used,
            n_ff_exp,
        };
        let mut check = config.clone();
        check.weight_dtype = tessera::DType::F32;
        check.validate()?;
        Ok(config)
    }
}

/// The RoPE scaling a file asks for (`{arch}.rope.scaling.type`, default `linear`;
/// `{arch}.rope.scaling.factor` or the older `{arch}.rope.scale_linear`;
/// `{arch}.rope.scaling.original_context_length` for YaRN, default the trained context), as
/// llama.cpp reads them: the position scale `1 / factor` (1 without a factor) and YaRN's original
/// context (0 for none and linear).
fn rope_scaling(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    n_ctx_train: usize,
) -> Result<(f32, usize)> {
    let md = file.metadata();
    let kind = match md.get(&key("rope.scaling.type")) {
        Some(_) => md.get_str(&key("rope.scaling.type"))?.to_string(),
        None => "linear".to_string(),
    };
    let factor = match (
        md.get(&key("rope.scaling.factor")),
        md.get(&key("rope.scale_linear")),
    ) {
        (Some(_), _) => md.get_float(&key("rope.scaling.factor"))?,
        (None, Some(_)) => md.get_float(&key("rope.scale_linear"))?,
        (None, None) => 0.0,
    };
    if md.get(&key("rope.scaling.attn_factor")).is_some() {
        let a = md.get_float(&key("rope.scaling.attn_factor"))?;
        if a != 1.0 {
            return Err(Error::InvalidArgument(format!(
                "{}: rope.scaling.attn_factor {a} is not supported yet (only 1)",
                file.source()
            )));
        }
    }
    let scale = match factor {
        0.0 => 1.0,
        f if f.is_finite() && f > 0.0 => 1.0 / f,
        f => {
            return Err(Error::InvalidArgument(format!(
                "{}: RoPE scaling factor {f} must be positive",
                file.source()
            )));
        }
    };
    match kind.as_str() {
        "none" => Ok((1.0, 0)),
        "linear" => Ok((scale, 0)),
        "yarn" if scale == 1.0 => Ok((1.0, 0)),
        "yarn" => {
            let orig = match md.get(&key("rope.scaling.original_context_length")) {
                Some(_) => md.get_usize(&key("rope.scaling.original_context_length"))?,
                None => n_ctx_train,
            };
            if orig == 0 {
                return Err(Error::InvalidArgument(format!(
                    "{}: YaRN needs a positive original context length",
                    file.source()
                )));
            }
            Ok((scale, orig))
        }
        other => Err(Error::InvalidArgument(format!(
            "{}: RoPE scaling type {other:?} is not supported yet (supported: none, linear, yarn)",
            file.source()
        ))),
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use crate::Tokenizer;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("tessera-model-{}-{name}.gguf", std::process::id()))
    }

    #[test]
    fn synthetic_model_round_trips_through_gguf() {
        let model = LlamaModel::new(LlamaConfig::tiny(), 7).unwrap();
        let path = temp("tiny");
        model.write_gguf(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let md = file.metadata();
        assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(md.get_u32(llama_keys::BLOCK_COUNT).unwrap(), 2);
        assert_eq!(md.get_u32(llama_keys::HEAD_COUNT_KV).unwrap(), 2);
        assert_eq!(md.get_f32(llama_keys::RMS_EPS).unwrap(), 1e-5);
        assert_eq!(LlamaConfig::from_gguf(&file).unwrap(), *model.config());
        // Every weight, and no cache, with its bytes.
        let weights: Vec<_> = model
            .params()
            .filter(|(id, _)| !model.is_cache(*id))
            .collect();
        assert_eq!(file.tensors().len(), weights.len());
        for (id, _) in weights {
            let t = model.context().tensor(id).unwrap();
            let info = file.tensor_info(t.name()).unwrap();
            assert_eq!((info.dtype().unwrap(), info.ne()), (t.dtype(), t.ne()));
            assert_eq!(
                file.tensor_bytes(t.name()).unwrap(),
                model.weight_bytes(id).unwrap()
            );
        }
        assert_eq!(file.tensor("output_norm.weight").unwrap().n_dims(), 1);
        // A CPU device wraps the map without copying; tensors read back at their file offsets.
        let dev = tessera::registry().device("CPU").unwrap();
        let buf = dev.buffer_from_host(file.host_memory()).unwrap().unwrap();
        let q = file.tensor_info("blk.1.attn_q.weight").unwrap();
        let mut back = vec![0u8; q.nbytes()];
        buf.read(q.file_range().start, &mut back).unwrap();
        assert_eq!(back, file.tensor_bytes(q.name()).unwrap());
        drop((buf, file));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn synthetic_vocab_tokenizes() {
        let model = LlamaModel::new(LlamaConfig::tiny(), 7).unwrap();
        let bytes = model.to_gguf().unwrap().to_bytes();
        let file = GgufFile::from_bytes(bytes, "<tiny>", &Default::default()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        assert_eq!(tok.n_vocab(), 256);
        let ids = tok.encode("the cat sat", true, false);
        assert_eq!(ids[0], 1);
        assert!(ids.iter().all(|&i| (0..256).contains(&i)));
        assert_eq!(tok.decode(&ids, false).unwrap(), "the cat sat");
        // No byte tokens fit in 256 entries: another char becomes one <unk>.
        assert_eq!(
            tok.encode("é", false, false),
            [tok.token_id("▁").unwrap(), 0]
        );
        assert_eq!(tok.decode(&[0], true).unwrap(), "<unk>");

        let (texts, scores, types) = synthetic_vocab(32000);
        assert_eq!(
            (texts.len(), scores.len(), types.len()),
            (32000, 32000, 32000)
        );
        assert_eq!(texts[3 + 0xE9], "<0xE9>");
        let (texts, _, _) = synthetic_vocab(2);
        assert_eq!(texts, ["<unk>", "<s>"]);
    }
}
