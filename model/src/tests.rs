//! End-to-end tests of the llama model on CPU devices.

use super::*;
use std::sync::Arc;
use tessera::sched::{SchedOptions, layer_devices};
use tessera::{DType, Device, Error, registry};

const SEED: u64 = 0x5eed;
const PROMPT: [i32; 5] = [1, 17, 200, 3, 255];

fn one_cpu() -> Vec<Arc<dyn Device>> {
    registry().select("cpu:1").unwrap()
}

fn session(model: &LlamaModel, devices: &[Arc<dyn Device>]) -> Session {
    let ld = layer_devices(model.config().n_layer, &[], devices.len()).unwrap();
    Session::on_devices(model, devices, &ld, SchedOptions::default()).unwrap()
}

#[test]
fn tiny_model_gives_finite_logits() {
    let model = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let n_vocab = model.config().n_vocab;
    let mut s = session(&model, &one_cpu());
    let logits = s.eval(&PROMPT).unwrap();
    assert_eq!(logits.len(), n_vocab * PROMPT.len());
    assert!(logits.iter().all(|x| x.is_finite()));
    // Activations stay O(1) and positions differ from each other.
    let rms = (logits.iter().map(|x| x * x).sum::<f32>() / logits.len() as f32).sqrt();
    assert!((0.05..50.0).contains(&rms), "logit rms {rms}");
    assert!(nmse(&logits[..n_vocab], &logits[n_vocab..2 * n_vocab]) > 1e-3);
    assert_eq!(s.n_past(), PROMPT.len());
}

#[test]
fn batched_prompt_matches_token_by_token() {
    // F32 weights: the batched and the single-token paths sum in the same order, so they agree
    // exactly. Q8_0 quantizes activations, and the tiled GEMM and the GEMV add block products
    // in different orders, so a value at a rounding boundary can quantize one step apart
    // (measured: 1e-15 for two positions, then ~1e-4 once a boundary value flips).
    for (dtype, tol) in [(DType::F32, 1e-6), (DType::Q8_0, 1e-3)] {
        let config = LlamaConfig {
            weight_dtype: dtype,
            ..LlamaConfig::tiny()
        };
        let model = LlamaModel::new(config, SEED).unwrap();
        let n_vocab = model.config().n_vocab;
        let mut s = session(&model, &one_cpu());
        let batch = s.eval(&PROMPT).unwrap();
        s.reset();
        let mut last = Vec::new();
        for (i, &tok) in PROMPT.iter().enumerate() {
            last = s.eval(&[tok]).unwrap();
            let row = &batch[i * n_vocab..(i + 1) * n_vocab];
            let e = nmse(&last, row);
            assert!(e <= tol, "{dtype} position {i}: nmse {e}");
        }
        let e = nmse(&last, &batch[(PROMPT.len() - 1) * n_vocab..]);
        assert!(e <= tol, "{dtype} last position: nmse {e}");
        // Continuing after a batched prompt matches continuing after single steps.
        let after_single = s.eval(&[42]).unwrap();
        s.reset();
        s.eval(&PROMPT).unwrap();
        let after_batch = s.eval(&[42]).unwrap();
        let e = nmse(&after_batch, &after_single);
        assert!(e <= tol, "{dtype} continuation: nmse {e}");
    }
}

#[test]
fn layer_split_matches_single_device() {
    let model = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let two = registry().select("cpu:2").unwrap();
    let mut split = session(&model, &two);
    let mut single = session(&model, &one_cpu());
    for chunk in [&PROMPT[..], &[7], &[8]] {
        let a = split.eval(chunk).unwrap();
        let b = single.eval(chunk).unwrap();
        let e = nmse(&a, &b);
        assert!(e <= 1e-10, "nmse {e}");
    }
    // Each device holds one layer; the embedding and output sit with the first and last layer.
    let ld = layer_devices(2, &[], 2).unwrap();
    assert_eq!(ld, vec![0, 1]);
    let placed = model.param_devices(&two, &ld).unwrap();
    let dev_of = |id| placed.iter().find(|(p, _)| *p == id).map(|p| p.1);
    assert_eq!(dev_of(model.tok_embd()), Some(0));
    assert_eq!(dev_of(model.output_tensors().1), Some(1));
    assert_eq!(dev_of(model.layers()[1].cache_k), Some(1));
    assert_eq!(
        split.buffers().len(),
        4,
        "weights and caches on each device"
    );
}

#[test]
fn weights_are_deterministic_and_named_as_gguf() {
    let a = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let b = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let c = LlamaModel::new(LlamaConfig::tiny(), SEED + 1).unwrap();
    let wq = a.layers()[1].wq;
    assert_eq!(a.weight_bytes(wq).unwrap(), b.weight_bytes(wq).unwrap());
    assert_ne!(a.weight_bytes(wq).unwrap(), c.weight_bytes(wq).unwrap());
    let ctx = a.context();
    let name = |id| ctx.tensor(id).unwrap().name().to_string();
    assert_eq!(name(a.tok_embd()), "token_embd.weight");
    assert_eq!(name(wq), "blk.1.attn_q.weight");
    assert_eq!(name(a.layers()[0].ffn_down), "blk.0.ffn_down.weight");
    assert_eq!(name(a.layers()[1].cache_v), "cache_v.1");
    assert_eq!(name(a.output_tensors().1), "output.weight");
    assert!(ctx.tensors().iter().all(|t| t.flags().param));
    let cache = ctx.tensor(a.layers()[0].cache_k).unwrap();
    assert_eq!((cache.dtype(), cache.ne()), (DType::F16, [32, 64, 1, 1]));
    // Norm weights are 1 ± 0.1.
    let norm = tessera::decode_to_f32(
        DType::F32,
        &a.weight_bytes(a.layers()[0].attn_norm).unwrap(),
    )
    .unwrap();
    assert!(norm.iter().all(|x| (0.9..1.1).contains(x)));
    assert!(
        a.weight_bytes(tessera::TensorId::from_index(10_000))
            .is_err()
    );
    assert_eq!(
        a.params().count(),
        2 + 11 * a.config().n_layer + 1,
        "embedding, 11 per layer, output norm and output"
    );
    let weights = a.weight_bytes_total();
    assert!(weights > a.config().param_count() && weights < 4 * a.config().param_count());
}

#[test]
fn weights_encoded_on_every_core_are_the_bytes_of_one_call() {
    // 520 rows of 4096: past the size that splits, and not a multiple of the part count.
    let (rows, row_len) = (520usize, 4096usize);
    let mut values = vec![0f32; rows * row_len];
    crate::weights::SplitMix::for_tensor(7, "w").fill_uniform(&mut values, 0.0, 1.0);
    for dtype in [DType::Q4_K, DType::Q8_0, DType::F16] {
        let whole = tessera::encode_f32(dtype, &values).unwrap();
        let parallel = crate::weights::encode_rows_in_parallel(dtype, &values, row_len).unwrap();
        assert_eq!(whole.len(), parallel.len(), "{dtype}");
        assert!(whole == parallel, "{dtype}: the parts differ from one call");
    }
}

#[test]
fn step_shapes_inputs_and_limits() {
    let model = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let step = model.build_step(2, 3, Outputs::All).unwrap();
    let ne = |id| step.graph.tensor(id).unwrap().ne();
    assert_eq!(ne(step.logits), [256, 2, 1, 1]);
    // The tiny context (64) is shorter than KV_PAD: every step attends over all of it.
    assert_eq!(step.n_kv, model.config().n_ctx.min(super::llama::KV_PAD));
    assert_eq!(ne(step.mask), [step.n_kv, 2, 1, 1]);
    let inputs = model.step_inputs(&step, &[4, 5], 3).unwrap();
    let i32s = |b: &[u8]| -> Vec<i32> {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    assert_eq!(i32s(&inputs[0].1), vec![4, 5]);
    assert_eq!(i32s(&inputs[1].1), vec![3, 4]);
    assert_eq!(i32s(&inputs[2].1), vec![3, 4]);
    let mask = tessera::decode_to_f32(DType::F16, &inputs[3].1).unwrap();
    let ninf = f32::NEG_INFINITY;
    // Query i (position 3 + i) sees keys 0..=3 + i; the rest, padding included, is hidden.
    let want: Vec<f32> = (0..2)
        .flat_map(|i| (0..step.n_kv).map(move |j| if j <= 3 + i { 0.0 } else { ninf }))
        .collect();
    assert_eq!(mask, want);
    let ctx_len = model.config().n_ctx;
    assert!(matches!(
        model.build_step(2, ctx_len - 1, Outputs::All),
        Err(Error::InvalidArgument(_))
    ));
    assert!(model.build_step(0, 0, Outputs::Last).is_err());
    assert!(model.step_inputs(&step, &[4], 3).is_err());
    assert!(model.step_inputs(&step, &[4, 256], 3).is_err());
    assert!(model.step_inputs(&step, &[-1, 0], 3).is_err());
    // A step serves every n_past with the same span, and no other.
    let mut long = LlamaConfig::tiny();
    long.n_ctx = 2 * super::llama::KV_PAD + 8;
    let long = LlamaModel::new(long, SEED).unwrap();
    let s1 = long.build_step(1, 10, Outputs::Last).unwrap();
    assert_eq!(s1.n_kv, super::llama::KV_PAD);
    assert!(long.step_fits(&s1, 1, super::llama::KV_PAD - 1));
    assert!(!long.step_fits(&s1, 1, super::llama::KV_PAD));
    assert!(!long.step_fits(&s1, 2, 10));
    assert!(long.step_inputs(&s1, &[1], 200).is_ok());
    assert!(long.step_inputs(&s1, &[1], 300).is_err());
    let tail = long
        .build_step(1, 2 * super::llama::KV_PAD + 2, Outputs::Last)
        .unwrap();
    assert_eq!(
        tail.n_kv,
        2 * super::llama::KV_PAD + 8,
        "the span stops at n_ctx"
    );
    let mut foreign = tessera::Context::new();
    assert!(model.build(&mut foreign, 1, 0, Outputs::All).is_err());
    let mut s = session(&model, &one_cpu());
    assert!(s.eval(&[]).is_err());
    assert!(s.eval_last(&[]).is_err());
    assert!(s.eval(&[300]).is_err());
    assert_eq!(s.n_past(), 0);
}

#[test]
fn decoding_reuses_one_plan_per_kv_span_and_allocates_nothing_new() {
    let mut c = LlamaConfig::tiny();
    c.n_ctx = 2 * super::llama::KV_PAD;
    let model = LlamaModel::new(c, SEED).unwrap();
    let mut s = session(&model, &one_cpu());
    let mut logits = Vec::new();
    s.eval_outputs_into(&PROMPT, Outputs::Last, &mut logits)
        .unwrap();
    s.eval_outputs_into(&[7], Outputs::Last, &mut logits)
        .unwrap();
    let (plans, cap) = (s.plans(), logits.capacity());
    let allocs = s.scheduler_allocations();
    let mut tok = 7;
    while s.n_past() < super::llama::KV_PAD {
        tok = (tok * 31 + 5) % 200;
        s.eval_outputs_into(&[tok], Outputs::Last, &mut logits)
            .unwrap();
    }
    assert_eq!(s.plans(), plans, "one plan for the whole first span");
    assert_eq!(s.scheduler_allocations(), allocs);
    assert_eq!(logits.capacity(), cap, "the logits buffer is reused");
    s.eval_outputs_into(&[3], Outputs::Last, &mut logits)
        .unwrap();
    assert_eq!(
        s.plans(),
        plans + 1,
        "crossing into the next span plans again"
    );
}

/// A model whose heads take 32-element blocks (the tiny model's heads of 16 do not).
fn blockable() -> LlamaConfig {
    LlamaConfig {
        n_embd: 128,
        head_dim: 64,
        n_rot: 64,
        n_head: 4,
        n_head_kv: 2,
        ..LlamaConfig::tiny()
    }
}

#[test]
fn quantized_caches_are_smaller_and_typed_errors_name_the_cache() {
    let f16 = LlamaModel::new(blockable(), SEED).unwrap();
    let kv = |k: &str, v: &str| KvCacheTypes::parse(k, v).unwrap();
    let q8 = f16.with_cache_types(kv("q8_0", "q8_0")).unwrap();
    let q4 = f16.with_cache_types(kv("q4_0", "q4_0")).unwrap();
    let ratio = |m: &LlamaModel| m.cache_bytes_total() as f64 / f16.cache_bytes_total() as f64;
    assert!(
        ratio(&q8) <= 0.54 && ratio(&q4) <= 0.29,
        "{} {}",
        ratio(&q8),
        ratio(&q4)
    );
    // The weights are the same; the caches change, and two 64×64 f32 rotations join.
    assert_eq!(
        q8.weight_bytes_total(),
        f16.weight_bytes_total() + 2 * 64 * 64 * 4
    );
    assert!(q8.cache_rotations().iter().all(Option::is_some));
    assert!(f16.cache_rotations().iter().all(Option::is_none));
    // Heads of 16 are not whole blocks: a typed error naming the cache, at open time too.
    let tiny = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let e = tiny.with_cache_types(kv("f16", "q8_0")).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("cache_v.0"),
        "{e}"
    );
    let opts = SessionOptions::new(SplitMode::Tensor).with_cache_types(kv("q4_1", "f16"));
    let Err(e) = Session::open(&tiny, &registry().select("cpu:2").unwrap(), &opts) else {
        panic!("q4_1 keys with heads of 16 opened");
    };
    assert!(e.to_string().contains("cache_k.0"), "{e}");
}

#[test]
fn session_options_choose_the_cache_and_report_its_bytes() {
    let model = LlamaModel::new(blockable(), SEED).unwrap();
    let kv = KvCacheTypes::parse("q8_0", "q4_0").unwrap();
    let devices = registry().select("cpu:2").unwrap();
    for mode in [SplitMode::None, SplitMode::Layer, SplitMode::Tensor] {
        let opts = SessionOptions::new(mode).with_cache_types(kv);
        let mut s = Session::open(&model, &devices, &opts).unwrap();
        assert_eq!(s.model().cache_types(), kv, "{mode}");
        let per = s.cache_bytes_per_device();
        let total: usize = per.iter().map(|(_, b)| b).sum();
        assert_eq!(total, s.model().cache_bytes_total(), "{mode}: {per:?}");
        assert_eq!(
            per.len(),
            if mode == SplitMode::None { 1 } else { 2 },
            "{mode}: {per:?}"
        );
        // Forgetting positions: the same logits as evaluating the kept prefix fresh.
        let full = s.eval(&PROMPT).unwrap();
        s.truncate(2).unwrap();
        let again = s.eval(&PROMPT[2..]).unwrap();
        let n_vocab = model.config().n_vocab;
        assert!(nmse(&again, &full[2 * n_vocab..]) < 1e-6, "{mode}");
        assert!(
            s.truncate(99).is_err() && s.n_past() == PROMPT.len(),
            "{mode}"
        );
    }
}

#[test]
fn decode_bytes_count_one_embedding_row_and_the_positions_in_view() {
    // tiny: a 256 × 64 F32 token embedding, an untied output, two layers of F16 K and V
    // caches with 2 × 16 values per position.
    let model = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let embd = 256 * 64 * 4;
    let row = 64 * 4;
    let per_position = 2 * 2 * (2 * 16) * 2; // layers × (K, V) × values × bytes
    let (w, kv) = model.decode_bytes_per_token(10);
    assert_eq!(w as usize, model.weight_bytes_total() - embd + row);
    assert_eq!(kv as usize, 10 * per_position);
    // Past the context, the cache holds n_ctx = 64 positions.
    assert_eq!(
        model.decode_bytes_per_token(100).1 as usize,
        64 * per_position
    );

    // Gemma 3: the output is the embedding (read whole), and layer 0 attends through a window
    // of 4 positions while layer 1 sees all 10.
    let gemma = LlamaModel::new(LlamaConfig::tiny_arch(Arch::Gemma3), SEED).unwrap();
    let (w, kv) = gemma.decode_bytes_per_token(10);
    assert_eq!(w as usize, gemma.weight_bytes_total());
    assert_eq!(kv as usize, (4 + 10) * 2 * (2 * 16) * 2);
}
