//! Every architecture on CPU devices: batched prompts against token-by-token steps (masks and
//! caches, including sliding windows), and the layer and tensor splits against one device.

use super::*;
use std::sync::Arc;
use tessera::sched::{SchedOptions, layer_devices};
use tessera::{DType, registry};

const SEED: u64 = 0xa7c4;
const PROMPT: [i32; 9] = [1, 17, 200, 3, 255, 9, 64, 128, 31];
const ARCHS: [Arch; 4] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3];

fn model(arch: Arch, dtype: DType) -> LlamaModel {
    let config = LlamaConfig {
        weight_dtype: dtype,
        ..LlamaConfig::tiny_arch(arch)
    };
    LlamaModel::new(config, SEED).unwrap()
}

fn session(m: &LlamaModel, spec: &str) -> Session {
    let devs = registry().select(spec).unwrap();
    let ld = layer_devices(m.config().n_layer, &[], devs.len()).unwrap();
    Session::on_devices(m, &devs, &ld, SchedOptions::default()).unwrap()
}

#[test]
fn batched_prompt_matches_single_steps_for_every_arch() {
    for arch in ARCHS {
        let m = model(arch, DType::F32);
        let n_vocab = m.config().n_vocab;
        let mut s = session(&m, "cpu:1");
        let batch = s.eval(&PROMPT).unwrap();
        assert!(batch.iter().all(|x| x.is_finite()), "{arch:?}");
        s.reset();
        for (i, &tok) in PROMPT.iter().enumerate() {
            let one = s.eval(&[tok]).unwrap();
            let e = nmse(&one, &batch[i * n_vocab..(i + 1) * n_vocab]);
            assert!(e <= 1e-8, "{arch:?} position {i}: nmse {e:e}");
        }
    }
}

#[test]
fn architectures_differ_and_the_window_matters() {
    let logits = |c: LlamaConfig| {
        let m = LlamaModel::new(c, SEED).unwrap();
        session(&m, "cpu:1").eval(&PROMPT).unwrap()
    };
    let base = logits(LlamaConfig::tiny_arch(Arch::Llama));
    for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let other = logits(LlamaConfig::tiny_arch(arch));
        assert!(
            nmse(&other, &base) > 1e-4,
            "{arch:?} computes the same as llama"
        );
    }
    // Gemma 3 with the window wider than the prompt attends like a global layer: the last
    // token's logits change once the window is narrower than its history.
    let wide = logits(LlamaConfig {
        n_swa: 64,
        ..LlamaConfig::tiny_arch(Arch::Gemma3)
    });
    let narrow = logits(LlamaConfig::tiny_arch(Arch::Gemma3));
    let n_vocab = LlamaConfig::tiny().n_vocab;
    let first = |v: &[f32]| v[..n_vocab].to_vec();
    let last = |v: &[f32]| v[v.len() - n_vocab..].to_vec();
    assert!(
        nmse(&first(&narrow), &first(&wide)) <= 1e-12,
        "the first token sees itself only"
    );
    assert!(
        nmse(&last(&narrow), &last(&wide)) > 1e-6,
        "the window is ignored"
    );
}

#[test]
fn layer_and_tensor_splits_match_one_device_for_every_arch() {
    for arch in ARCHS {
        for dtype in [DType::F32, DType::Q8_0] {
            let m = model(arch, dtype);
            let tol = if dtype == DType::F32 { 1e-6 } else { 1e-4 };
            let mut single = session(&m, "cpu:1");
            let mut layer = session(&m, "cpu:2");
            let mut tps = ["cpu:2", "cpu:3"].map(|spec| {
                let devs = registry().select(spec).unwrap();
                let meta = m.meta_device(&devs, &[]).unwrap();
                Session::on_meta(&m, meta, Some(1)).unwrap()
            });
            for chunk in [&PROMPT[..], &[7], &[8]] {
                let want = single.eval(chunk).unwrap();
                let e = nmse(&layer.eval(chunk).unwrap(), &want);
                assert!(e <= 1e-10, "{arch:?} {dtype} layer: nmse {e:e}");
                for tp in &mut tps {
                    let e = nmse(&tp.eval(chunk).unwrap(), &want);
                    assert!(e <= tol, "{arch:?} {dtype} tensor: nmse {e:e}");
                }
            }
        }
    }
}

#[test]
fn single_kv_head_models_split_queries_and_mirror_kv() {
    // Gemma 3 270M has one KV head: K/V and the caches stay whole on every device.
    let config = LlamaConfig {
        n_head_kv: 1,
        weight_dtype: DType::F32,
        ..LlamaConfig::tiny_arch(Arch::Gemma3)
    };
    let m = LlamaModel::new(config, SEED).unwrap();
    let mut single = session(&m, "cpu:1");
    let devs = registry().select("cpu:2").unwrap();
    let meta = m.meta_device(&devs, &[]).unwrap();
    let cache = &m.context().tensors()[m.layers()[0].cache_k.index()];
    assert!(meta.split_state(cache).unwrap().is_mirrored());
    let wq = &m.context().tensors()[m.layers()[0].wq.index()];
    assert_eq!(meta.split_state(wq).unwrap().split_axis(), Some(1));
    let mut tp = Session::on_meta(&m, meta, Some(1)).unwrap();
    for chunk in [&PROMPT[..], &[7]] {
        let e = nmse(&tp.eval(chunk).unwrap(), &single.eval(chunk).unwrap());
        assert!(e <= 1e-6, "nmse {e:e}");
    }
}

/// Weights held in memory by name, as a GGUF file would hold them.
#[derive(Debug)]
struct MapSource(std::collections::HashMap<String, (DType, [usize; 4], Vec<u8>)>);

impl WeightSource for MapSource {
    fn describe(&self, name: &str) -> Option<(DType, [usize; 4])> {
        self.0.get(name).map(|(d, ne, _)| (*d, *ne))
    }
    fn read(&self, name: &str) -> tessera::Result<Vec<u8>> {
        self.0
            .get(name)
            .map(|(_, _, b)| b.clone())
            .ok_or_else(|| tessera::Error::InvalidArgument(format!("no tensor {name}")))
    }
    fn label(&self) -> String {
        "map".into()
    }
}

fn source_of(m: &LlamaModel, f32_names: &[&str]) -> MapSource {
    let mut map = std::collections::HashMap::new();
    for (id, _) in m.params() {
        if m.is_cache(id) {
            continue;
        }
        let t = &m.context().tensors()[id.index()];
        let mut bytes = m.weight_bytes(id).unwrap();
        let mut dtype = t.dtype();
        if f32_names.contains(&t.name()) {
            bytes =
                tessera::encode_f32(DType::F32, &tessera::decode_to_f32(dtype, &bytes).unwrap())
                    .unwrap();
            dtype = DType::F32;
        }
        map.insert(t.name().to_string(), (dtype, t.ne(), bytes));
    }
    MapSource(map)
}

#[test]
fn models_load_from_a_weight_source_with_mixed_dtypes() {
    let synth = model(Arch::Qwen3, DType::Q8_0);
    let want = session(&synth, "cpu:1").eval(&PROMPT).unwrap();
    // Same bytes, same dtypes: identical logits.
    let config = synth.config().clone();
    let same = LlamaModel::from_source(config.clone(), Arc::new(source_of(&synth, &[]))).unwrap();
    assert_eq!(session(&same, "cpu:1").eval(&PROMPT).unwrap(), want);
    // One projection stored as F32 (dequantized): a mixed model, the same values.
    let mixed = LlamaModel::from_source(
        config.clone(),
        Arc::new(source_of(&synth, &["blk.1.ffn_down.weight"])),
    )
    .unwrap();
    let l1 = mixed.layers()[1].ffn_down;
    assert_eq!(mixed.context().tensors()[l1.index()].dtype(), DType::F32);
    let got = session(&mixed, "cpu:1").eval(&PROMPT).unwrap();
    // The F32 matmul skips the Q8_0 quantization of its activations, hence not bit-identical.
    let e = nmse(&got, &want);
    assert!(e <= 1e-3, "nmse {e:e}");
    // Missing and misshapen tensors are named.
    let mut src = source_of(&synth, &[]);
    src.0.remove("blk.0.attn_k_norm.weight");
    let e = LlamaModel::from_source(config.clone(), Arc::new(src)).unwrap_err();
    assert!(e.to_string().contains("blk.0.attn_k_norm.weight"), "{e}");
    let mut src = source_of(&synth, &[]);
    src.0.get_mut("output_norm.weight").unwrap().1 = [32, 1, 1, 1];
    let e = LlamaModel::from_source(config, Arc::new(src)).unwrap_err();
    assert!(e.to_string().contains("output_norm.weight"), "{e}");
}

#[test]
fn every_arch_round_trips_through_a_gguf_file() {
    let dir = std::env::temp_dir().join(format!("tessera-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for arch in ARCHS {
        let mut config = LlamaConfig {
            weight_dtype: DType::Q8_0,
            ..LlamaConfig::tiny_arch(arch)
        };
        if arch == Arch::Gemma3 {
            // What a Gemma 3 file implies: every 6th layer global, local RoPE base 10000.
            config.swa_period = 6;
            config.rope_base_swa = 10000.0;
        }
        let synth = LlamaModel::new(config.clone(), SEED).unwrap();
        let path = dir.join(format!("{}.gguf", arch.name()));
        synth.write_gguf(&path).unwrap();
        let file = Arc::new(tessera::gguf::GgufFile::open(&path).unwrap());
        let loaded = LlamaModel::from_gguf(file, None).unwrap();
        assert_eq!(loaded.config(), &config, "{arch:?}");
        let want = session(&synth, "cpu:1").eval(&PROMPT).unwrap();
        let got = session(&loaded, "cpu:1").eval(&PROMPT).unwrap();
        assert_eq!(got, want, "{arch:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn low_bit_weights_round_trip_through_a_gguf_file() {
    let dir = std::env::temp_dir().join(format!("tessera-lowbit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for dtype in [
        DType::Q2_K,
        DType::Q3_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ] {
        let config = LlamaConfig {
            n_embd: 256,
            head_dim: 64,
            n_ff: 512,
            weight_dtype: dtype,
            ..LlamaConfig::tiny_arch(Arch::Qwen3)
        };
        let synth = LlamaModel::new(config.clone(), SEED).unwrap();
        let path = dir.join(format!("{dtype}.gguf"));
        synth.write_gguf(&path).unwrap();
        let file = Arc::new(tessera::gguf::GgufFile::open(&path).unwrap());
        assert_eq!(
            file.tensor_info("blk.0.attn_q.weight")
                .unwrap()
                .dtype()
                .unwrap(),
            dtype
        );
        let loaded = LlamaModel::from_gguf(file, None).unwrap();
        assert_eq!(loaded.config(), &config, "{dtype}");
        let want = session(&synth, "cpu:1").eval(&PROMPT).unwrap();
        let got = session(&loaded, "cpu:1").eval(&PROMPT).unwrap();
        assert_eq!(got, want, "{dtype}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn k_quant_weights_split_by_whole_super_blocks() {
    for dtype in [DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0] {
        let config = LlamaConfig {
            n_embd: 256,
            head_dim: 64,
            n_ff: 512,
            weight_dtype: dtype,
            ..LlamaConfig::tiny_arch(Arch::Qwen3)
        };
        let m = LlamaModel::new(config, SEED).unwrap();
        let mut single = session(&m, "cpu:1");
        let devs = registry().select("cpu:2").unwrap();
        let meta = m.meta_device(&devs, &[]).unwrap();
        // ffn_down is split on its reduction axis: every piece is whole blocks of the dtype.
        let down = &m.context().tensors()[m.layers()[0].ffn_down.index()];
        let st = meta.split_state(down).unwrap();
        assert_eq!(st.split_axis(), Some(0), "{dtype}");
        assert!(
            st.local_lens().iter().all(|l| l % dtype.block_size() == 0),
            "{dtype}: {st}"
        );
        let mut tp = Session::on_meta(&m, meta, Some(1)).unwrap();
        for chunk in [&PROMPT[..], &[7]] {
            let e = nmse(&tp.eval(chunk).unwrap(), &single.eval(chunk).unwrap());
            assert!(e <= 1e-4, "{dtype}: nmse {e:e}");
        }
    }
}
