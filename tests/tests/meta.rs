//! The meta device on CPU devices: split storage (set/get of every state, sub-ranges, 2-D
//! copies, PARTIAL sums), per-device memory, graph execution for N = 1..6 on both all-reduce
//! paths against a single device, and errors instead of panics. (Mixture-of-experts blocks under
//! the llama policy's tensor and expert splits are tested with that policy, in tessera-model.)

use std::sync::{Arc, Once};
use tessera_core::meta::{CommPath, MetaDevice, Segment, SplitLayout, SplitState};
use tessera_core::{
    Backend, BackendOptions, Bindings, Context, DType, Device, DeviceRegistry, Error, Result,
    TensorDesc, TensorId,
};

fn devices(n: usize) -> Vec<Arc<dyn Device>> {
    static REG: Once = Once::new();
    REG.call_once(|| DeviceRegistry::global().register(tessera_cpu::registry()));
    tessera_cpu::split_devices(n)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// A policy reading states from tensor names: `a0:…`, `a1:…`, `qkv`, `m`, `p`.
fn by_name(desc: &TensorDesc, l: &SplitLayout) -> Result<SplitState> {
    let n = l.n_devices;
    let even = |len: usize| -> Vec<usize> {
        (0..n)
            .map(|j| len * (j + 1) / n - len * j / n)
            .collect::<Vec<_>>()
    };
    match desc.name() {
        "m" => Ok(SplitState::mirrored()),
        "p" => Ok(SplitState::partial()),
        "a0" => SplitState::axis_lens(0, even(desc.ne()[0])),
        "a1" => SplitState::axis_lens(1, even(desc.ne()[1])),
        "a1_zero" => {
            let mut lens = vec![0; n];
            lens[n - 1] = desc.ne()[1];
            SplitState::axis_lens(1, lens)
        }
        "a0_q8" => {
            // Whole blocks of 32 per device.
            let blocks = desc.ne()[0] / 32;
            SplitState::axis_lens(0, even(blocks).iter().map(|b| b * 32).collect())
        }
        // Fused QKV: rows [Q | K | V] with Q twice as wide as K and V.
        "qkv" => {
            let q = desc.ne()[1] / 2;
            let kv = q / 2;
            SplitState::axis(
                1,
                vec![Segment::new(even(q), 1), Segment::new(even(kv), 2)],
                desc.ne()[1],
            )
        }
        // Weights of the graph tests: W1 column-parallel, W2 row-parallel.
        "w1" => SplitState::axis_lens(1, even(desc.ne()[1])),
        "w2" => SplitState::axis_lens(0, even(desc.ne()[0])),
        _ => Ok(SplitState::mirrored()),
    }
}

#[test]
fn set_and_get_round_trip_for_every_state() {
    for n in [1, 2, 3, 4] {
        let meta = MetaDevice::new(&devices(n), by_name).unwrap();
        let mut ctx = Context::new();
        let names = ["m", "p", "a0", "a1", "a1_zero", "qkv"];
        let ids: Vec<TensorId> = names
            .iter()
            .map(|nm| ctx.new_named(nm, DType::F32, [24, 16]).unwrap())
            .collect();
        let q8 = ctx.new_named("a0_q8", DType::Q8_0, [128, 3]).unwrap();
        let tb = meta.buffer_type().alloc_tensors(&ctx).unwrap();
        for (k, &id) in ids.iter().enumerate() {
            let v = values(24 * 16, k as u32 + 1);
            tb.set_f32(id, &v).unwrap();
            assert_eq!(tb.get_f32(id).unwrap(), v, "{} over {n}", names[k]);
            // A sub-range of whole rows, then a single element in the middle.
            let patch = values(24 * 5, 99);
            tb.set_at(id, 24 * 4 * 3, &f32_bytes(&patch)).unwrap();
            let mut back = vec![0u8; patch.len() * 4];
            tb.get_at(id, 24 * 4 * 3, &mut back).unwrap();
            assert_eq!(f32s(&back), patch, "{} sub-range over {n}", names[k]);
            tb.set_at(id, 4 * 37, &7.5f32.to_le_bytes()).unwrap();
            let all = tb.get_f32(id).unwrap();
            assert_eq!(all[37], 7.5);
            assert_eq!(&all[72..72 + patch.len()], &patch[..]);
        }
        let qbytes: Vec<u8> = (0..3 * 4 * 34).map(|i| (i * 7 % 251) as u8).collect();
        tb.set(q8, &qbytes).unwrap();
        let mut back = vec![0u8; qbytes.len()];
        tb.get(q8, &mut back).unwrap();
        assert_eq!(back, qbytes, "q8_0 over {n}");
    }
}

#[test]
fn partial_set_is_exact_and_get_sums_devices() {
    let meta = MetaDevice::new(&devices(3), by_name).unwrap();
    let mut ctx = Context::new();
    let p = ctx.new_named("p", DType::F32, [64]).unwrap();
    let tb = meta.buffer_type().alloc_tensors(&ctx).unwrap();
    let v = values(64, 5);
    tb.set_f32(p, &v).unwrap();
    // Dividing by 3 would not sum back exactly; value-on-one-device does.
    assert_eq!(tb.get_f32(p).unwrap(), v);
    // Each device's addend is visible through the parts: device 0 holds the value.
    let mb = tb
        .buffer()
        .as_any()
        .downcast_ref::<tessera_core::meta::MetaBuffer>()
        .unwrap();
    let slot = tb.bindings().slot(p).unwrap().offset;
    let pl = mb.placement_at(slot).unwrap();
    for j in 1..3 {
        let mut b = vec![0u8; 256];
        mb.parts()[j].read(pl.local_offset[j], &mut b).unwrap();
        assert!(f32s(&b).iter().all(|x| *x == 0.0));
        // Put an addend on device j: the read is the sum.
        mb.parts()[j]
            .write(pl.local_offset[j], &f32_bytes(&[1.0; 64]))
            .unwrap();
    }
    let sum = tb.get_f32(p).unwrap();
    for (s, x) in sum.iter().zip(&v) {
        assert_eq!(*s, (x + 1.0) + 1.0);
    }
    // Misaligned access to PARTIAL data is an error, not a panic.
    let mut odd = [0u8; 3];
    assert!(tb.get_at(p, 1, &mut odd).is_err());
}

#[test]
fn strided_2d_copies_follow_the_split() {
    let meta = MetaDevice::new(&devices(2), by_name).unwrap();
    let mut ctx = Context::new();
    let t = ctx.new_named("a0", DType::F32, [8, 6]).unwrap();
    let tb = meta.buffer_type().alloc_tensors(&ctx).unwrap();
    tb.set_f32(t, &[0.0; 48]).unwrap();
    let off = tb.bindings().slot(t).unwrap().offset;
    // Columns 2..5 of rows 1..4 from a host array with a 40-byte row stride.
    let host: Vec<f32> = (0..40).map(|i| i as f32).collect();
    let hb = f32_bytes(&host);
    tb.buffer()
        .write_2d(off + 32 + 8, &hb, 12, 3, 32, 40)
        .unwrap();
    let all = tb.get_f32(t).unwrap();
    for r in 0..6 {
        for c in 0..8 {
            let want = if (1..4).contains(&r) && (2..5).contains(&c) {
                host[(r - 1) * 10 + (c - 2)]
            } else {
                0.0
            };
            assert_eq!(all[r * 8 + c], want, "row {r} col {c}");
        }
    }
    let mut back = vec![0u8; 40 * 3];
    tb.buffer()
        .read_2d(off + 32 + 8, &mut back, 12, 3, 32, 40)
        .unwrap();
    for r in 0..3 {
        assert_eq!(&back[r * 40..r * 40 + 12], &hb[r * 40..r * 40 + 12]);
    }
}

#[test]
fn devices_hold_only_their_slices() {
    let meta = MetaDevice::new(&devices(4), by_name).unwrap();
    let mut ctx = Context::new();
    ctx.new_named("a1", DType::F32, [256, 64]).unwrap();
    ctx.new_named("a1_zero", DType::F32, [256, 64]).unwrap();
    let tb = meta.buffer_type().alloc_tensors(&ctx).unwrap();
    let mb = tb
        .buffer()
        .as_any()
        .downcast_ref::<tessera_core::meta::MetaBuffer>()
        .unwrap();
    let bytes = mb.device_bytes();
    let full = 256 * 64 * 4;
    // Even quarter of the first tensor each; the second all on the last device.
    assert!(
        bytes[0] >= full / 4 && bytes[0] < full / 4 + 1024,
        "{bytes:?}"
    );
    assert!(bytes[3] >= full / 4 + full, "{bytes:?}");
}

/// What the model layer reads through the plain traits: each tensor's bytes per device, the
/// mirrored state and the windows of a copy (`Buffer::spreads`, `BufferType::with_copies`), and
/// the stream's report (`Backend::split_report`); a one-device buffer and stream report none.
#[test]
fn spreads_and_reports_reach_callers_through_the_plain_traits() {
    let devs = devices(2);
    let meta = MetaDevice::new(&devs, by_name).unwrap();
    let mut ctx = Context::new();
    let m = ctx.new_named("m", DType::F32, [64, 32]).unwrap();
    let a1 = ctx.new_named("a1", DType::F32, [64, 32]).unwrap();
    let plain: Arc<dyn tessera_core::BufferType> = meta.buffer_type();
    assert!(plain.with_copies(&[]).is_none(), "only weights take copies");
    let tb = plain.alloc_tensors(&ctx).unwrap();
    let spread = |id: TensorId| {
        let slot = tb.bindings().slot(id).unwrap();
        tb.buffer().spread_at(slot.offset).unwrap()
    };
    let (sa, sm) = (spread(a1), spread(m));
    assert_eq!((sa.tensor.as_str(), sa.mirrored), ("a1", false));
    assert_eq!(sa.held, vec![64 * 16 * 4, 64 * 16 * 4], "{sa:?}");
    assert!(
        sm.mirrored && sm.held.iter().all(|&b| b == 64 * 32 * 4),
        "{sm:?}"
    );
    assert_eq!(tb.buffer().device_bytes().len(), 2);
    assert!(sa.window_of.is_none() && sm.window_of.is_none());

    // A weight buffer told that `a1` is a copy of `m`: `m` is kept once (CPU devices read each
    // other's memory) and `a1`'s row slices are windows into it (rows split at multiples of
    // COPY_ROW_ALIGN, as here).
    let weights = meta
        .weight_buffer_type()
        .with_copies(&[("a1", "m")])
        .unwrap();
    let wb = weights.alloc_tensors(&ctx).unwrap();
    let copies: Vec<(String, Option<String>)> = wb
        .buffer()
        .spreads()
        .into_iter()
        .map(|s| (s.tensor, s.window_of))
        .collect();
    assert!(
        copies.contains(&("a1".into(), Some("m".into()))),
        "{copies:?}"
    );
    let held: Vec<Vec<usize>> = wb.buffer().spreads().into_iter().map(|s| s.held).collect();
    assert_eq!(
        held,
        vec![vec![64 * 32 * 4, 0], vec![0, 0]],
        "one copy of m, none of a1"
    );

    let one = devs[0].buffer_type().alloc_tensors(&ctx).unwrap();
    assert!(one.buffer().spreads().is_empty());
    assert_eq!(one.buffer().device_bytes(), vec![one.buffer().size()]);

    let m = mlp(64, 128, 3);
    run_mlp_seen(&devs, false, &m, |be| {
        let r = be.split_report().expect("a meta stream reports");
        assert_eq!(r.comm_path, CommPath::Generic);
        assert_eq!(r.stats.generic_reduces, 1);
        assert_eq!(r.reduces.len(), 1, "{r:?}");
        assert_eq!(r.compute_bytes.len(), 2);
    });
    let cpu = devs[0]
        .init_backend(&BackendOptions::with_threads(1))
        .unwrap();
    assert!(cpu.split_report().is_none());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let devs = devices(2);
    // Untyped allocation cannot be split.
    let meta = MetaDevice::new(&devs, by_name).unwrap();
    assert!(meta.buffer_type().alloc(1024).is_err());
    // A ratio list of the wrong length, a negative or all-zero one.
    assert!(
        MetaDevice::new(&devs, by_name)
            .unwrap()
            .with_ratios(&[1.0])
            .is_err()
    );
    assert!(
        MetaDevice::new(&devs, by_name)
            .unwrap()
            .with_ratios(&[1.0, -1.0])
            .is_err()
    );
    assert!(
        MetaDevice::new(&devs, by_name)
            .unwrap()
            .with_ratios(&[0.0, 0.0])
            .is_err()
    );
    // The same device twice; no devices.
    assert!(MetaDevice::new(&[devs[0].clone(), devs[0].clone()], by_name).is_err());
    assert!(MetaDevice::new(&[], by_name).is_err());
    // A policy whose state does not fit the tensor names it.
    let bad = |_: &TensorDesc, _: &SplitLayout| SplitState::axis_lens(0, vec![3, 3]);
    let meta = MetaDevice::new(&devs, bad).unwrap();
    let mut ctx = Context::new();
    ctx.new_named("w", DType::F32, [8, 2]).unwrap();
    let e = meta.buffer_type().alloc_tensors(&ctx).unwrap_err();
    assert!(e.to_string().contains("'w'"), "{e}");
    // A range that crosses two tensors of a meta buffer.
    let meta = MetaDevice::new(&devs, by_name).unwrap();
    let mut ctx = Context::new();
    ctx.new_named("a0", DType::F32, [8]).unwrap();
    ctx.new_named("a1", DType::F32, [8, 2]).unwrap();
    let tb = meta.buffer_type().alloc_tensors(&ctx).unwrap();
    let e = tb.buffer().write(16, &[0u8; 64]).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_) | Error::OutOfBounds { .. }),
        "{e}"
    );
}

/// `y = W2 · silu(W1 · x) + x`: W1 column-parallel, W2 row-parallel (one all-reduce), and a
/// softmax over the result (which needs the reduced value).
struct Mlp {
    ctx: Context,
    x: TensorId,
    w1: TensorId,
    w2: TensorId,
    y: TensorId,
}

fn mlp(d: usize, f: usize, t: usize) -> Mlp {
    let mut ctx = Context::new();
    let x = ctx.new_named("x", DType::F32, [d, t]).unwrap();
    let w1 = ctx.new_named("w1", DType::F32, [d, f]).unwrap();
    let w2 = ctx.new_named("w2", DType::F32, [f, d]).unwrap();
    let h = ctx.mul_mat(w1, x).unwrap();
    let h = ctx.silu(h).unwrap();
    let o = ctx.mul_mat(w2, h).unwrap();
    let o = ctx.add(o, x).unwrap();
    let y = ctx.soft_max(o).unwrap();
    ctx.set_output(y).unwrap();
    Mlp { ctx, x, w1, w2, y }
}

fn run_mlp(devs: &[Arc<dyn Device>], vendor: bool, m: &Mlp) -> (Vec<f32>, CommPath) {
    run_mlp_seen(devs, vendor, m, |_| {})
}

/// [`run_mlp`], handing the meta stream to `seen` after the run.
fn run_mlp_seen(
    devs: &[Arc<dyn Device>],
    vendor: bool,
    m: &Mlp,
    seen: impl FnOnce(&tessera_core::meta::MetaBackend),
) -> (Vec<f32>, CommPath) {
    let graph = m.ctx.build_forward(m.y).unwrap();
    let meta = MetaDevice::new(devs, by_name)
        .unwrap()
        .with_vendor_comm(vendor);
    let weights = meta
        .buffer_type()
        .alloc_tensors_where(&m.ctx, |t| t.name().starts_with('w'))
        .unwrap();
    for (id, seed) in [(m.w1, 11), (m.w2, 12)] {
        let ne = m.ctx.tensor(id).unwrap().nelements();
        weights.set_f32(id, &values(ne, seed)).unwrap();
    }
    let host = devs[0].buffer_type();
    let io = host
        .alloc_tensors_where(&m.ctx, |t| t.name() == "x" || t.flags().output)
        .unwrap();
    let nx = m.ctx.tensor(m.x).unwrap().nelements();
    io.set_f32(m.x, &values(nx, 13)).unwrap();
    let mut b = Bindings::new();
    b.extend(weights.bindings());
    b.extend(io.bindings());
    let mut be = meta
        .init_meta_backend(&BackendOptions::with_threads(1))
        .unwrap();
    be.compute(&graph, &b).unwrap();
    be.synchronize().unwrap();
    seen(&be);
    (io.get_f32(m.y).unwrap(), be.comm_path().clone())
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den
}

#[test]
fn graphs_match_one_device_for_1_to_6_devices_on_both_paths() {
    let m = mlp(64, 96, 5);
    let (want, _) = run_mlp(&devices(1), true, &m);
    for n in 1..=6 {
        for vendor in [true, false] {
            let (got, path) = run_mlp(&devices(n), vendor, &m);
            let e = nmse(&got, &want);
            assert!(e <= 1e-10, "N={n} vendor={vendor}: nmse {e:e}");
            let expect = match (n, vendor) {
                (1, _) => CommPath::Single,
                (_, true) => CommPath::Vendor("cpu".into()),
                _ => CommPath::Generic,
            };
            assert_eq!(path, expect, "N={n}");
        }
    }
}

#[test]
fn isolated_devices_get_inputs_staged_and_outputs_gathered() {
    // Isolated CPU devices cannot read each other's memory, like discrete GPUs: the input lives
    // on device 0, so the others get a staged copy, and the output is gathered back.
    let m = mlp(32, 64, 3);
    let (want, _) = run_mlp(&devices(1), true, &m);
    for n in [2, 3] {
        let isolated: Vec<Arc<dyn Device>> = tessera_cpu::split_devices(n)
            .into_iter()
            .map(|d| Arc::new(d.isolated()) as Arc<dyn Device>)
            .collect();
        for vendor in [true, false] {
            let (got, _) = run_mlp(&isolated, vendor, &m);
            let e = nmse(&got, &want);
            assert!(e <= 1e-10, "isolated N={n} vendor={vendor}: nmse {e:e}");
        }
    }
}

#[test]
fn a_device_refusing_its_slice_runs_it_on_the_host_cpu() {
    // Device 1 has no unary kernel: its slice of the activation runs on the host CPU (inputs
    // copied out, output copied back) and the result equals the unsplit run.
    let m = mlp(16, 32, 2);
    let (want, _) = run_mlp(&devices(1), true, &m);
    let mut devs = devices(2);
    let refusing = tessera_cpu::split_devices(2)
        .pop()
        .unwrap()
        .refusing(&[tessera_core::OpKind::Unary]);
    devs[1] = Arc::new(refusing);
    let mut fallbacks = Vec::new();
    let (got, _) = run_mlp_seen(&devs, true, &m, |be| fallbacks = be.fallbacks());
    let e = nmse(&got, &want);
    assert!(e <= 1e-10, "nmse {e:e}");
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    assert_eq!(fallbacks[0].0, devs[1].name());
    assert_eq!(fallbacks[0].1, vec![("SILU".to_string(), 1)]);
}

#[test]
fn an_unsplittable_graph_fails_before_running() {
    // RMS_NORM over a tensor split along its rows (A0) has no rule: a typed error names it.
    let mut ctx = Context::new();
    let w = ctx.new_named("w1", DType::F32, [16, 32]).unwrap();
    let x = ctx.new_named("x", DType::F32, [16, 2]).unwrap();
    let h = ctx.mul_mat(w, x).unwrap();
    let y = ctx.rms_norm(h, 1e-5).unwrap();
    ctx.set_name(y, "bad_norm").unwrap();
    let graph = ctx.build_forward(y).unwrap();
    let devs = devices(2);
    let meta = MetaDevice::new(&devs, by_name).unwrap();
    let weights = meta
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| t.name() == "w1")
        .unwrap();
    let io = devs[0]
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| t.name() == "x")
        .unwrap();
    let mut b = Bindings::new();
    b.extend(weights.bindings());
    b.extend(io.bindings());
    let mut be = meta.init_backend(&BackendOptions::default()).unwrap();
    let e = be.compute(&graph, &b).unwrap_err();
    assert!(
        matches!(e, Error::InvalidOp { .. }) && e.to_string().contains("bad_norm"),
        "{e}"
    );
    // The stream is still usable.
    be.synchronize().unwrap();
}
