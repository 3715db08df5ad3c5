//! The multi-device scheduler against single-device runs: layer placement over shared and
//! isolated CPU devices, fallback of refused ops, reuse of memory, pipelined micro-batches.

use std::sync::Arc;
use tessera_core::sched::{Cause, SchedOptions, Scheduler, layer_devices};
use tessera_core::{
    BackendOptions, Bindings, Context, DType, Device, Error, Graph, OpKind, RopeMode, RopeParams,
    TensorBuffer, TensorFlags, TensorId,
};
use tessera_cpu::{CpuDevice, split_devices};

const HD: usize = 16;
const NH: usize = 4;
const E: usize = HD * NH;
const T: usize = 5;

struct Net {
    ctx: Context,
    layers: Vec<Vec<TensorId>>,
    x: TensorId,
    pos: TensorId,
    out: TensorId,
}

/// A small residual network with rms_norm, matmul, reshape, rope, silu and adds per layer.
fn net(n_layers: usize, wdtype: DType) -> Net {
    let mut ctx = Context::new();
    let param = TensorFlags {
        param: true,
        ..Default::default()
    };
    let x = ctx.new_named("x", DType::F32, [E, T]).unwrap();
    ctx.set_input(x).unwrap();
    let pos = ctx.new_named("pos", DType::I32, [T]).unwrap();
    ctx.set_input(pos).unwrap();
    let mut h = x;
    let mut layers = Vec::new();
    for l in 0..n_layers {
        let w1 = ctx
            .new_named(&format!("blk.{l}.w1"), wdtype, [E, E])
            .unwrap();
        let w2 = ctx
            .new_named(&format!("blk.{l}.w2"), wdtype, [E, E])
            .unwrap();
        ctx.set_flags(w1, param).unwrap();
        ctx.set_flags(w2, param).unwrap();
        layers.push(vec![w1, w2]);
        let n = ctx.rms_norm(h, 1e-5).unwrap();
        let a = ctx.mul_mat(w1, n).unwrap();
        let a = ctx.reshape(a, [HD, NH, T]).unwrap();
        let rp = RopeParams {
            n_dims: HD,
            mode: RopeMode::Neox,
            freq_base: 10000.0,
            freq_scale: 1.0,
        };
        let a = ctx.rope(a, pos, rp).unwrap();
        let a = ctx.reshape(a, [E, T]).unwrap();
        let a = ctx.silu(a).unwrap();
        let b = ctx.mul_mat(w2, a).unwrap();
        h = ctx.add(h, b).unwrap();
    }
    let out = ctx.scale(h, 0.5).unwrap();
    ctx.set_output(out).unwrap();
    Net {
        ctx,
        layers,
        x,
        pos,
        out,
    }
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 0.25)
        .collect()
}

fn weight_bytes(net: &Net, id: TensorId) -> Vec<u8> {
    let t = net.ctx.tensor(id).unwrap();
    let v = values(t.nelements(), id.index());
    match t.dtype() {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        other => panic!("test weights are f32 or f16, not {other}"),
    }
}

fn input_bytes(seed: usize) -> (Vec<u8>, Vec<u8>) {
    let x: Vec<u8> = values(E * T, 1000 + seed)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let p: Vec<u8> = (0..T as i32)
        .flat_map(|i| (i + seed as i32).to_le_bytes())
        .collect();
    (x, p)
}

/// Reference: everything on one device, no scheduler.
fn reference(net: &Net, seed: usize) -> Vec<f32> {
    let dev = CpuDevice::new("REF", vec![]);
    let graph = net.ctx.build_forward(net.out).unwrap();
    let buf = dev.buffer_type().alloc_tensors(&net.ctx).unwrap();
    for l in &net.layers {
        for &w in l {
            buf.set(w, &weight_bytes(net, w)).unwrap();
        }
    }
    let (x, p) = input_bytes(seed);
    buf.set(net.x, &x).unwrap();
    buf.set(net.pos, &p).unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(2)).unwrap();
    be.compute(&graph, buf.bindings()).unwrap();
    be.synchronize().unwrap();
    buf.get_f32(net.out).unwrap()
}

/// Weights of layer `l` on `devices[placement[l]]`.
fn place_weights(
    net: &Net,
    devices: &[Arc<dyn Device>],
    placement: &[usize],
) -> (Vec<TensorBuffer>, Bindings) {
    let mut bufs = Vec::new();
    let mut all = Bindings::new();
    for (d, dev) in devices.iter().enumerate() {
        let mine: Vec<TensorId> = net
            .layers
            .iter()
            .enumerate()
            .filter(|(l, _)| placement[*l] == d)
            .flat_map(|(_, w)| w.iter().copied())
            .collect();
        let buf = dev
            .buffer_type()
            .alloc_tensors_where(&net.ctx, |t| {
                mine.iter()
                    .any(|&w| net.ctx.tensor(w).is_ok_and(|x| std::ptr::eq(x, t)))
            })
            .unwrap();
        for &w in &mine {
            buf.set(w, &weight_bytes(net, w)).unwrap();
        }
        all.extend(buf.bindings());
        bufs.push(buf);
    }
    (bufs, all)
}

fn run_sched(
    sched: &mut Scheduler,
    net: &Net,
    graph: &Graph,
    weights: &Bindings,
    seed: usize,
) -> Vec<f32> {
    sched.alloc_graph(graph, weights).unwrap();
    let (x, p) = input_bytes(seed);
    sched.set_input(net.x, &x).unwrap();
    sched.set_input(net.pos, &p).unwrap();
    sched.compute().unwrap();
    sched.synchronize().unwrap();
    sched.get_f32(net.out).unwrap()
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

fn check_layer_split(devices: Vec<Arc<dyn Device>>, expect_copies: bool) {
    let net = net(4, DType::F16);
    let placement = layer_devices(4, &[], devices.len()).unwrap();
    let (_bufs, weights) = place_weights(&net, &devices, &placement);
    let graph = net.ctx.build_forward(net.out).unwrap();
    let mut sched = Scheduler::new(&devices, SchedOptions::default()).unwrap();
    let got = run_sched(&mut sched, &net, &graph, &weights, 0);
    let want = reference(&net, 0);
    let e = nmse(&got, &want);
    assert!(e <= 1e-10, "layer split NMSE {e}\n{}", sched.describe());
    let splits = sched.splits();
    assert!(splits.len() >= devices.len(), "{splits:?}");
    let copies: usize = splits.iter().map(|s| s.2).sum();
    assert_eq!(
        copies > 0,
        expect_copies,
        "copied inputs {copies}\n{}",
        sched.describe()
    );
    // Every device ran the layers whose weights it holds.
    for a in sched.assignments() {
        if let Cause::Weight(_) = a.cause {
            let layer: usize = net
                .layers
                .iter()
                .position(|l| {
                    net.ctx.tensor(a.node).is_ok()
                        && l.iter()
                            .any(|&w| graph.tensor(a.node).unwrap().srcs().any(|s| s == w))
                })
                .unwrap();
            assert_eq!(a.device, placement[layer]);
        }
    }
}

#[test]
fn layer_split_over_shared_memory_cpu_devices_matches_one_device() {
    let devs: Vec<Arc<dyn Device>> = split_devices(2)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    check_layer_split(devs, false);
}

#[test]
fn layer_split_over_isolated_devices_copies_inputs_and_matches() {
    for n in [2, 3] {
        let devs: Vec<Arc<dyn Device>> = split_devices(n)
            .into_iter()
            .map(|d| Arc::new(d.isolated()) as Arc<dyn Device>)
            .collect();
        check_layer_split(devs, true);
    }
}

#[test]
fn refused_op_falls_back_to_the_cpu_with_correct_results() {
    let gpu_like: Arc<dyn Device> = Arc::new(
        CpuDevice::new("ACC0", vec![])
            .isolated()
            .refusing(&[OpKind::Rope]),
    );
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new("CPU", vec![]));
    let devices = vec![gpu_like, cpu];
    let net = net(2, DType::F32);
    let (_bufs, weights) = place_weights(&net, &devices, &[0, 0]);
    let graph = net.ctx.build_forward(net.out).unwrap();
    let mut sched = Scheduler::new(&devices, SchedOptions::default()).unwrap();
    let got = run_sched(&mut sched, &net, &graph, &weights, 3);
    let e = nmse(&got, &reference(&net, 3));
    assert!(e <= 1e-10, "NMSE {e}");
    let ropes: Vec<_> = sched
        .assignments()
        .into_iter()
        .filter(|a| graph.tensor(a.node).unwrap().op().kind() == OpKind::Rope)
        .collect();
    assert_eq!(ropes.len(), 2);
    for a in &ropes {
        assert_eq!(a.device, 1, "ROPE must run on the CPU");
        assert!(
            matches!(&a.cause, Cause::Fallback(why) if why.contains("refuse")),
            "{:?}",
            a.cause
        );
    }
    assert!(sched.describe().contains("fallback"));
    // The matmuls stay with their weights on the first device.
    assert!(
        sched
            .assignments()
            .iter()
            .filter(|a| graph.tensor(a.node).unwrap().op().kind() == OpKind::MulMat)
            .all(|a| a.device == 0)
    );
}

#[test]
fn rerunning_the_same_shape_allocates_nothing_new() {
    let devs: Vec<Arc<dyn Device>> = split_devices(2)
        .into_iter()
        .map(|d| Arc::new(d.isolated()) as Arc<dyn Device>)
        .collect();
    let net = net(2, DType::F32);
    let (_bufs, weights) = place_weights(&net, &devs, &[0, 1]);
    let mut sched = Scheduler::new(&devs, SchedOptions::default()).unwrap();
    let graph = net.ctx.build_forward(net.out).unwrap();
    let first = run_sched(&mut sched, &net, &graph, &weights, 1);
    let count = sched.allocation_count();
    assert!(count > 0);
    for seed in 1..4 {
        let graph = net.ctx.build_forward(net.out).unwrap();
        let got = run_sched(&mut sched, &net, &graph, &weights, seed);
        assert_eq!(sched.allocation_count(), count, "re-run allocated");
        assert!(nmse(&got, &reference(&net, seed)) <= 1e-10);
        if seed == 1 {
            assert_eq!(got, first);
        }
    }
}

#[test]
fn pipelined_micro_batches_with_two_copies() {
    let devs: Vec<Arc<dyn Device>> = split_devices(2)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    let mut net = net(2, DType::F32);
    // Each micro-batch copies its result into its own column block of a pre-allocated output.
    let n_mb = 3;
    let results = net
        .ctx
        .new_named("results", DType::F32, [E, T * n_mb])
        .unwrap();
    let mut outs = Vec::new();
    for mb in 0..n_mb {
        let row_bytes = E * 4;
        let v = net
            .ctx
            .view(
                net.out,
                [E, T],
                [row_bytes, row_bytes * T, row_bytes * T],
                0,
            )
            .unwrap();
        let dst = net
            .ctx
            .view(
                results,
                [E, T],
                [row_bytes, row_bytes * T, row_bytes * T],
                mb * T * row_bytes,
            )
            .unwrap();
        outs.push(net.ctx.cpy(v, dst).unwrap());
    }
    let (_bufs, mut weights) = place_weights(&net, &devs, &[0, 1]);
    let out_buf = devs[1]
        .buffer_type()
        .alloc_tensors_where(&net.ctx, |t| t.name() == "results")
        .unwrap();
    weights.extend(out_buf.bindings());
    let mut sched = Scheduler::new(
        &devs,
        SchedOptions {
            n_threads: Some(1),
            n_copies: 2,
        },
    )
    .unwrap();
    for (mb, &o) in outs.iter().enumerate() {
        let graph = net.ctx.build_forward(o).unwrap();
        sched.alloc_graph(&graph, &weights).unwrap();
        let (x, p) = input_bytes(mb);
        sched.set_input(net.x, &x).unwrap();
        sched.set_input(net.pos, &p).unwrap();
        sched.compute().unwrap();
    }
    sched.synchronize().unwrap();
    let all = out_buf.get_f32(results).unwrap();
    for mb in 0..n_mb {
        let got = &all[mb * E * T..(mb + 1) * E * T];
        let e = nmse(got, &reference(&net, mb));
        assert!(e <= 1e-10, "micro-batch {mb}: NMSE {e}");
    }
}

#[test]
fn user_assignment_is_respected_and_unsupported_everywhere_is_an_error() {
    let devs: Vec<Arc<dyn Device>> = split_devices(2)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    let net = net(1, DType::F32);
    let (_bufs, weights) = place_weights(&net, &devs, &[0]);
    let graph = net.ctx.build_forward(net.out).unwrap();
    let mut sched = Scheduler::new(&devs, SchedOptions::default()).unwrap();
    sched.set_tensor_device(net.out, 1).unwrap();
    let got = run_sched(&mut sched, &net, &graph, &weights, 2);
    assert!(nmse(&got, &reference(&net, 2)) <= 1e-10);
    let a = sched
        .assignments()
        .into_iter()
        .find(|a| a.node == net.out)
        .unwrap();
    assert_eq!((a.device, a.cause), (1, Cause::User));
    assert!(sched.set_tensor_device(net.out, 7).is_err());

    let refusing: Vec<Arc<dyn Device>> = (0..2)
        .map(|i| {
            Arc::new(CpuDevice::new(&format!("R{i}"), vec![]).refusing(&[OpKind::Rope]))
                as Arc<dyn Device>
        })
        .collect();
    let mut sched = Scheduler::new(&refusing, SchedOptions::default()).unwrap();
    let err = sched.alloc_graph(&graph, &Bindings::new()).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(Scheduler::new(&[], SchedOptions::default()).is_err());
    assert!(
        Scheduler::new(
            &devs,
            SchedOptions {
                n_threads: None,
                n_copies: 5
            }
        )
        .is_err()
    );
}

#[test]
fn set_rows_then_read_of_another_view_on_another_device_is_ordered() {
    let devs: Vec<Arc<dyn Device>> = split_devices(2)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    let (k, rows) = (256usize, 64usize);
    let mut ctx = Context::new();
    let param = TensorFlags {
        param: true,
        ..Default::default()
    };
    let w = ctx.new_named("w", DType::F32, [k, k]).unwrap();
    let cache = ctx.new_named("cache", DType::F32, [k, rows]).unwrap();
    ctx.set_flags(w, param).unwrap();
    ctx.set_flags(cache, param).unwrap();
    let x = ctx.new_named("x", DType::F32, [k, rows]).unwrap();
    ctx.set_input(x).unwrap();
    let ids = ctx.new_named("ids", DType::I32, [rows]).unwrap();
    ctx.set_input(ids).unwrap();
    // Some work on device 0, then SET_ROWS into the cache it holds.
    let mut h = x;
    for _ in 0..4 {
        h = ctx.mul_mat(w, h).unwrap();
    }
    let sr = ctx.set_rows(cache, h, ids).unwrap();
    // A reader of the cache through a separate view, forced onto device 1.
    let kv = ctx
        .view(cache, [k, rows], [k * 4, k * 4 * rows, k * 4 * rows], 0)
        .unwrap();
    let out = ctx.scale(kv, 2.0).unwrap();
    ctx.set_output(out).unwrap();
    let graph = ctx.build_forward_multi(&[sr, out]).unwrap();
    let wbuf = devs[0]
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| t.flags().param)
        .unwrap();
    let identity: Vec<f32> = (0..k * k)
        .map(|i| if i % (k + 1) == 0 { 1.0 } else { 0.0 })
        .collect();
    wbuf.set_f32(w, &identity).unwrap();
    wbuf.set_f32(cache, &vec![0.0; k * rows]).unwrap();
    let mut sched = Scheduler::new(
        &devs,
        SchedOptions {
            n_threads: Some(1),
            n_copies: 1,
        },
    )
    .unwrap();
    sched.set_tensor_device(out, 1).unwrap();
    sched.alloc_graph(&graph, wbuf.bindings()).unwrap();
    let plan = sched.describe();
    let reader = plan
        .lines()
        .find(|l| l.starts_with("split 1: CPU1"))
        .unwrap_or_else(|| panic!("no split 1 on CPU1\n{plan}"));
    assert!(
        reader.contains("copied inputs: []") && reader.contains("waits on splits [0]"),
        "the reader of the cache must read it in place after the SET_ROWS split\n{plan}"
    );
    let xb: Vec<u8> = (0..k * rows).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let ib: Vec<u8> = (0..rows as i32).flat_map(|v| v.to_le_bytes()).collect();
    sched.set_input(x, &xb).unwrap();
    sched.set_input(ids, &ib).unwrap();
    sched.compute().unwrap();
    sched.synchronize().unwrap();
    let got = sched.get_f32(out).unwrap();
    assert!(
        got.iter().all(|&v| v == 2.0),
        "reader saw stale cache values"
    );
}

#[test]
fn a_meta_device_is_scheduled_like_any_other_device() {
    use tessera_core::meta::{MetaDevice, SplitLayout, SplitState};
    // Layer 0 on a plain CPU device, layer 1 tensor-parallel on META(CPU0, CPU1): the hidden
    // state crosses into the meta device, which computes the rest and delivers the output, read
    // through a view (a reshape, so the scheduler must bind the node it views).
    let mut net = net(2, DType::F32);
    // The view is the graph's only output: the node it views must still be bound.
    net.ctx.set_flags(net.out, TensorFlags::default()).unwrap();
    let flat = net.ctx.reshape(net.out, [E * T]).unwrap();
    net.ctx.set_output(flat).unwrap();
    let cpus: Vec<Arc<dyn Device>> = split_devices(3)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    let even = |len: usize| vec![len / 2, len - len / 2];
    let policy = move |t: &tessera_core::TensorDesc, _: &SplitLayout| match t.name() {
        "blk.1.w1" => SplitState::axis_lens(1, even(t.ne()[1])),
        "blk.1.w2" => SplitState::axis_lens(0, even(t.ne()[0])),
        _ => Ok(SplitState::mirrored()),
    };
    let meta = MetaDevice::new(&cpus[..2], policy).unwrap();
    let devices: Vec<Arc<dyn Device>> = vec![cpus[2].clone(), Arc::new(meta)];
    let (_bufs, weights) = place_weights(&net, &devices, &[0, 1]);
    let graph = net.ctx.build_forward(flat).unwrap();
    let mut sched = Scheduler::new(&devices, SchedOptions::default()).unwrap();
    let want = reference(&net, 2);
    for round in 0..2 {
        sched.alloc_graph(&graph, &weights).unwrap();
        let (x, p) = input_bytes(2);
        sched.set_input(net.x, &x).unwrap();
        sched.set_input(net.pos, &p).unwrap();
        sched.compute().unwrap();
        sched.synchronize().unwrap();
        let got = sched.get_f32(flat).unwrap();
        let e = nmse(&got, &want);
        assert!(e <= 1e-10, "round {round}: NMSE {e}\n{}", sched.describe());
    }
    let splits = sched.splits();
    assert!(
        splits.iter().any(|s| s.0 == 0) && splits.iter().any(|s| s.0 == 1),
        "both devices run a part: {splits:?}"
    );
    // The hidden state is copied into the meta device's plain memory.
    assert!(splits.iter().any(|s| s.0 == 1 && s.2 > 0), "{splits:?}");
}

/// The threads each stream of `sched` runs: a CPU stream's pool, or each of a meta device's.
fn stream_threads(sched: &Scheduler) -> Vec<Vec<usize>> {
    (0..sched.devices().len())
        .map(|i| {
            let any = sched.backend(i).and_then(|b| b.as_any()).unwrap();
            if let Some(cpu) = any.downcast_ref::<tessera_cpu::CpuBackend>() {
                return vec![cpu.n_threads()];
            }
            let meta = any
                .downcast_ref::<tessera_core::meta::MetaBackend>()
                .expect("a CPU or meta stream");
            (0..)
                .map_while(|j| meta.device_stream(j))
                .map(|s| {
                    s.as_any()
                        .and_then(|a| a.downcast_ref::<tessera_cpu::CpuBackend>())
                        .unwrap()
                        .n_threads()
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_thread_count_is_divided_among_the_cpu_devices() {
    let raw = split_devices(3);
    let cpus: Vec<Arc<dyn Device>> = raw
        .iter()
        .map(|d| Arc::new(d.clone()) as Arc<dyn Device>)
        .collect();
    let meta: Arc<dyn Device> = Arc::new(
        tessera_core::meta::MetaDevice::new(&cpus[1..], |_: &tessera_core::TensorDesc, _: &_| {
            Ok(tessera_core::meta::SplitState::mirrored())
        })
        .unwrap(),
    );
    assert_eq!(meta.thread_pools(), 2);
    let with = |devices: &[Arc<dyn Device>], n| {
        let opts = SchedOptions {
            n_threads: n,
            ..SchedOptions::default()
        };
        stream_threads(&Scheduler::new(devices, opts).unwrap())
    };
    // llama.cpp's -t: threads in all, the first pools taking the remainder.
    assert_eq!(with(&cpus[..2], Some(4)), [vec![2], vec![2]]);
    assert_eq!(with(&cpus[..2], Some(3)), [vec![2], vec![1]]);
    assert_eq!(with(&cpus[..2], Some(1)), [vec![1], vec![1]]);
    assert_eq!(with(&cpus, Some(7)), [vec![3], vec![2], vec![2]]);
    // A meta device's share is divided among its devices in turn.
    let mixed = [cpus[0].clone(), meta.clone()];
    assert_eq!(with(&mixed, Some(5)), [vec![2], vec![2, 1]]);
    assert_eq!(with(&[meta], Some(4)), [vec![2, 2]]);
    // None keeps each device's default (one thread per core it owns); zero is refused by the
    // device, not rounded up.
    let defaults: Vec<Vec<usize>> = raw[..2].iter().map(|d| vec![d.default_threads()]).collect();
    assert_eq!(with(&cpus[..2], None), defaults);
    let err = Scheduler::new(
        &cpus[..2],
        SchedOptions {
            n_threads: Some(0),
            ..SchedOptions::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("thread count 0"), "{err}");
}
