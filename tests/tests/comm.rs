//! The all-reduce on CPU devices, generic and the CPU backend's comm: every N from 1 to 6, sizes
//! from 0 to 4M values, every algorithm and plan, f32 exactness, bf16 bounded error,
//! non-contributing slices full of NaN, back-to-back and oversubscribed reductions.

use std::sync::Arc;
use tessera_core::comm::{Algorithm, AllReduce, CommSlice, ReducePath, Wire};
use tessera_core::{Backend, BackendOptions, Buffer, Device};
use tessera_cpu::{CpuDevice, split_devices};

struct Setup {
    devices: Vec<Arc<dyn Device>>,
    streams: Vec<Box<dyn Backend>>,
    bufs: Vec<Arc<dyn Buffer>>,
}

/// `n` isolated CPU devices (so nothing is shared by accident), one f32 buffer of `len` values
/// (plus a 16-byte offset) each.
fn setup(n: usize, len: usize) -> Setup {
    setup_with_threads(n, len, 1)
}

/// As [`setup`], with `threads` threads per stream.
fn setup_with_threads(n: usize, len: usize, threads: usize) -> Setup {
    // A pool runs no more threads than the cores its device is pinned to, and `split_devices`
    // gives each device one core on a two-core machine: with several threads each device is
    // pinned to cores 0.. of its own (shared between the devices, which only costs speed).
    let devices: Vec<Arc<dyn Device>> = if threads > 1 {
        (0..n)
            .map(|j| CpuDevice::new(&format!("CPU{j}"), (0..threads).collect()))
            .collect()
    } else {
        split_devices(n)
    }
    .into_iter()
    .map(|d| Arc::new(d.isolated()) as Arc<dyn Device>)
    .collect();
    let streams = devices
        .iter()
        .map(|d| {
            d.init_backend(&BackendOptions::with_threads(threads))
                .unwrap()
        })
        .collect();
    let bufs = devices
        .iter()
        .map(|d| d.buffer_type().alloc(16 + len * 4).unwrap())
        .collect();
    Setup {
        devices,
        streams,
        bufs,
    }
}

/// `n` devices whose slice `j` holds `f(j, i)` (NaN for the `silent` ones, which do not contribute).
fn filled(
    n: usize,
    len: usize,
    silent: &[usize],
    f: impl Fn(usize, usize) -> f32,
) -> (Setup, Vec<CommSlice>) {
    let s = setup(n, len);
    for j in 0..n {
        let v: Vec<f32> = (0..len)
            .map(|i| {
                if silent.contains(&j) {
                    f32::NAN
                } else {
                    f(j, i)
                }
            })
            .collect();
        write(&s.bufs[j], &v);
    }
    let slices = (0..n)
        .map(|j| CommSlice {
            buffer: s.bufs[j].clone(),
            offset: 16,
            len,
            contributes: !silent.contains(&j),
        })
        .collect();
    (s, slices)
}

fn write(buf: &Arc<dyn Buffer>, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    buf.write(16, &bytes).unwrap();
}

fn read(buf: &Arc<dyn Buffer>, len: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; len * 4];
    buf.read(16, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs one all-reduce where device `j`'s value `i` is `f(j, i)`; devices in `silent` hold NaN
/// and do not contribute. Returns every device's result.
fn reduce(
    n: usize,
    len: usize,
    wire: Wire,
    algo: Algorithm,
    silent: &[usize],
    f: impl Fn(usize, usize) -> f32,
) -> (Vec<Vec<f32>>, ReducePath) {
    let (mut s, slices) = filled(n, len, silent, f);
    let mut ar = AllReduce::new(&s.devices, wire, algo).unwrap();
    let path = ar.run(&mut s.streams, &slices).unwrap();
    for st in s.streams.iter_mut() {
        st.synchronize().unwrap();
    }
    ((0..n).map(|j| read(&s.bufs[j], len)).collect(), path)
}

const ALGOS: [Algorithm; 3] = [
    Algorithm::RecursiveDoubling,
    Algorithm::Ring,
    Algorithm::Auto {
        threshold_bytes: 64 * 1024,
    },
];

#[test]
fn f32_sums_are_exact_and_identical_for_n_1_to_6() {
    for n in 1..=6 {
        for len in [0usize, 1, 31, 32768, 1 << 22] {
            for algo in ALGOS {
                if len == 1 << 22 && algo != Algorithm::Ring && n > 2 {
                    continue; // the big size is covered by the ring (the path Auto picks) and N ≤ 2
                }
                // Small integers: every summation order gives the exact same f32.
                let f = |j: usize, i: usize| ((i * 7 + j * 13) % 61) as f32 - 30.0;
                let (out, path) = reduce(n, len, Wire::F32, algo, &[], f);
                for (j, o) in out.iter().enumerate() {
                    for i in [0, len / 2, len.saturating_sub(1)] {
                        if len == 0 {
                            continue;
                        }
                        let want: f32 = (0..n).map(|d| f(d, i)).sum();
                        assert_eq!(
                            o[i], want,
                            "n={n} len={len} {algo:?} ({path}) device {j} value {i}"
                        );
                    }
                    assert!(
                        o == &out[0],
                        "n={n} len={len} {algo:?}: device {j} differs from device 0"
                    );
                }
                if len > 0 && n > 1 {
                    let full: Vec<f32> = (0..len).map(|i| (0..n).map(|d| f(d, i)).sum()).collect();
                    assert_eq!(out[0], full, "n={n} len={len} {algo:?}");
                }
            }
        }
    }
}

#[test]
fn silent_slices_count_as_zero_even_when_they_hold_nan() {
    for n in [2usize, 3, 5] {
        for algo in ALGOS {
            let f = |j: usize, i: usize| (i % 9) as f32 + j as f32;
            let silent = [n - 1];
            let (out, _) = reduce(n, 1000, Wire::F32, algo, &silent, f);
            for o in &out {
                for (i, v) in o.iter().enumerate() {
                    let want: f32 = (0..n - 1).map(|d| f(d, i)).sum();
                    assert_eq!(*v, want, "n={n} {algo:?} value {i}");
                }
            }
        }
    }
}

#[test]
fn bf16_wire_has_bounded_error_and_identical_results() {
    for n in [2usize, 3, 4, 6] {
        for algo in [Algorithm::RecursiveDoubling, Algorithm::Ring] {
            let len = 40_000;
            let f = |j: usize, i: usize| {
                (((i * 2654435761 + j * 40503) % 10007) as f32 / 10007.0 - 0.5) * 4.0
            };
            let (out, _) = reduce(n, len, Wire::Bf16, algo, &[], f);
            let mut max_rel = 0f64;
            for (i, &got) in out[0].iter().enumerate() {
                let exact: f64 = (0..n).map(|d| f(d, i) as f64).sum();
                let mag: f64 = (0..n).map(|d| (f(d, i) as f64).abs()).sum();
                max_rel = max_rel.max((got as f64 - exact).abs() / mag.max(1e-6));
            }
            // bf16 keeps 8 significant bits: each rounding errs by ≤ 2^-8 of the rounded partial
            // sum (≤ the sum of magnitudes). Recursive doubling rounds a value at most
            // ⌈log2 n⌉ + 1 times; the ring rounds each partial sum once per reduce-scatter step.
            let roundings = match algo {
                Algorithm::Ring => (n - 1) as f64,
                _ => (n as f64).log2().ceil() + 1.0,
            };
            let bound = 2f64.powi(-8) * roundings;
            assert!(
                max_rel <= bound,
                "n={n} {algo:?}: max relative error {max_rel:e} > {bound:e}"
            );
            for (j, o) in out.iter().enumerate() {
                assert!(
                    o == &out[0],
                    "n={n} {algo:?}: device {j} differs from device 0"
                );
            }
        }
    }
}

#[test]
fn repeated_reductions_reuse_scratch_safely() {
    let n = 3;
    let len = 5000;
    let mut s = setup(n, len);
    let mut ar = AllReduce::new(&s.devices, Wire::F32, Algorithm::RecursiveDoubling).unwrap();
    let slices: Vec<CommSlice> = (0..n)
        .map(|j| CommSlice {
            buffer: s.bufs[j].clone(),
            offset: 16,
            len,
            contributes: true,
        })
        .collect();
    for j in 0..n {
        write(&s.bufs[j], &vec![1.0; len]);
    }
    // Queue several reductions back to back: values grow by a factor n each time.
    for _ in 0..4 {
        ar.run(&mut s.streams, &slices).unwrap();
    }
    for st in s.streams.iter_mut() {
        st.synchronize().unwrap();
    }
    for j in 0..n {
        assert!(
            read(&s.bufs[j], len).iter().all(|&v| v == 81.0),
            "device {j}"
        );
    }
    let bad = vec![
        CommSlice {
            len: len + 1,
            ..slices[0].clone()
        },
        slices[1].clone(),
        slices[2].clone(),
    ];
    assert!(ar.run(&mut s.streams, &bad).is_err());
    assert!(ar.run(&mut s.streams[..2], &slices[..2]).is_err());
}

// ===== The CPU comm exported through the registry's proc_address =====

use tessera_core::comm::{CommApi, CommOutcome};

fn cpu_comm() -> CommApi {
    CommApi::from_registry(tessera_cpu::registry().as_ref())
        .expect("the CPU registry exports the comm trio")
}

fn vendor_reduce(
    n: usize,
    len: usize,
    silent: &[usize],
    f: impl Fn(usize, usize) -> f32,
) -> Vec<Vec<f32>> {
    let (mut s, slices) = filled(n, len, silent, f);
    let mut comm = cpu_comm()
        .init(&mut s.streams)
        .expect("CPU streams are accepted");
    assert_eq!(comm.allreduce(&slices).unwrap(), CommOutcome::Done);
    for st in s.streams.iter_mut() {
        st.synchronize().unwrap();
    }
    (0..n).map(|j| read(&s.bufs[j], len)).collect()
}

#[test]
fn cpu_comm_sums_exactly_and_identically_for_n_1_to_6() {
    for n in 1..=6 {
        for len in [0usize, 1, 31, 32768, 1 << 22] {
            if len == 1 << 22 && n > 3 {
                continue;
            }
            let f = |j: usize, i: usize| ((i * 5 + j * 11) % 53) as f32 - 26.0;
            let out = vendor_reduce(n, len, &[], f);
            let want: Vec<f32> = (0..len).map(|i| (0..n).map(|d| f(d, i)).sum()).collect();
            for (j, o) in out.iter().enumerate() {
                assert_eq!(o, &want, "n={n} len={len} device {j}");
            }
        }
    }
}

#[test]
fn cpu_comm_skips_silent_slices_and_declines_what_it_cannot_do() {
    let f = |j: usize, i: usize| (i % 7) as f32 * (j + 1) as f32;
    let out = vendor_reduce(3, 1000, &[1], f);
    for o in &out {
        for (i, v) in o.iter().enumerate() {
            assert_eq!(*v, f(0, i) + f(2, i), "value {i}");
        }
    }
    // Unaligned f32 data is declined before anything is queued.
    let mut s = setup(2, 64);
    let mut comm = cpu_comm().init(&mut s.streams).unwrap();
    let odd: Vec<CommSlice> = (0..2)
        .map(|j| CommSlice {
            buffer: s.bufs[j].clone(),
            offset: 2,
            len: 8,
            contributes: true,
        })
        .collect();
    assert_eq!(comm.allreduce(&odd).unwrap(), CommOutcome::Declined);
    // Out-of-range slices are errors, not crashes.
    let big: Vec<CommSlice> = (0..2)
        .map(|j| CommSlice {
            buffer: s.bufs[j].clone(),
            offset: 16,
            len: 1 << 20,
            contributes: true,
        })
        .collect();
    assert!(comm.allreduce(&big).is_err());
    assert!(comm.allreduce(&big[..1]).is_err());
    drop(comm);
    // Streams of another backend make init decline.
    let mut mixed: Vec<Box<dyn Backend>> = vec![s.streams.remove(0), Box::new(Foreign)];
    assert!(cpu_comm().init(&mut mixed).is_none());
}

/// One slice of `len` values at byte `offset` of each buffer.
fn slices_at(s: &Setup, offset: usize, len: usize) -> Vec<CommSlice> {
    s.bufs
        .iter()
        .map(|b| CommSlice {
            buffer: b.clone(),
            offset,
            len,
            contributes: true,
        })
        .collect()
}

fn read_at(buf: &Arc<dyn Buffer>, offset: usize, len: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; len * 4];
    buf.read(offset, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn cpu_comm_back_to_back_reductions_of_every_plan_stay_exact() {
    // Small slices take the one-shot plan (staging slots reused by phase parity), large ones the
    // fused plan (two phases); queued back to back and interleaved, every reduce must see the
    // previous one's result. With 5 devices on a machine with fewer cores (CI), the waits are the
    // oversubscribed kind; the test must finish and be exact either way.
    for n in [2usize, 3, 5] {
        let (small, big) = (1000usize, 300_000usize);
        let mut s = setup(n, 16 + small + big);
        for b in &s.bufs {
            write(b, &vec![1.0; small + big + 16]);
        }
        let mut comm = cpu_comm().init(&mut s.streams).unwrap();
        let (a, b) = (slices_at(&s, 16, small), slices_at(&s, 16 + 4 * small, big));
        for round in 0..6 {
            let slices = if round % 3 == 2 { &b } else { &a };
            assert_eq!(comm.allreduce(slices).unwrap(), CommOutcome::Done);
        }
        for st in s.streams.iter_mut() {
            st.synchronize().unwrap();
        }
        // Four small and two large reductions: n^4 and n^2.
        let (ws, wb) = ((n * n * n * n) as f32, (n * n) as f32);
        for (j, buf) in s.bufs.iter().enumerate() {
            assert!(
                read_at(buf, 16, small).iter().all(|&v| v == ws),
                "n={n} device {j} small"
            );
            assert!(
                read_at(buf, 16 + 4 * small, big).iter().all(|&v| v == wb),
                "n={n} device {j} big"
            );
        }
    }
}

#[test]
fn cpu_comm_uses_pool_threads_and_stays_exact() {
    // 2 MiB chunks per device: the stream's second thread takes half of each.
    let (n, len) = (2usize, 1usize << 20);
    let f = |j: usize, i: usize| ((i * 3 + j * 7) % 41) as f32 - 20.0;
    let mut s = setup_with_threads(n, len, 2);
    for st in &s.streams {
        let cpu = st
            .as_any()
            .and_then(|a| a.downcast_ref::<tessera_cpu::CpuBackend>());
        assert_eq!(
            cpu.map(|c| c.running_threads()),
            Some(2),
            "two threads run per stream"
        );
    }
    for j in 0..n {
        write(&s.bufs[j], &(0..len).map(|i| f(j, i)).collect::<Vec<_>>());
    }
    let mut comm = cpu_comm().init(&mut s.streams).unwrap();
    assert_eq!(
        comm.allreduce(&slices_at(&s, 16, len)).unwrap(),
        CommOutcome::Done
    );
    for st in s.streams.iter_mut() {
        st.synchronize().unwrap();
    }
    let want: Vec<f32> = (0..len).map(|i| f(0, i) + f(1, i)).collect();
    for j in 0..n {
        assert_eq!(read(&s.bufs[j], len), want, "device {j}");
    }
}

#[test]
fn cpu_comm_keeps_negative_zero_and_declines_overlapping_slices() {
    // The sum starts from the first contributor, not from +0.0: -0 + -0 stays -0.
    let out = vendor_reduce(2, 40, &[], |_, _| -0.0);
    assert!(
        out.iter()
            .flatten()
            .all(|v| v.to_bits() == (-0.0f32).to_bits())
    );
    // Two devices' slices sharing bytes would race: left to the generic path.
    let mut s = setup(2, 64);
    let mut comm = cpu_comm().init(&mut s.streams).unwrap();
    let shared = s.bufs[0].clone();
    let overlapping = vec![
        CommSlice {
            buffer: shared.clone(),
            offset: 16,
            len: 32,
            contributes: true,
        },
        CommSlice {
            buffer: shared,
            offset: 16 + 64,
            len: 32,
            contributes: true,
        },
    ];
    assert_eq!(comm.allreduce(&overlapping).unwrap(), CommOutcome::Declined);
}

/// A stream of some other backend.
#[derive(Debug)]
struct Foreign;

impl Backend for Foreign {
    fn name(&self) -> &str {
        "foreign"
    }
    fn compute(
        &mut self,
        _: &tessera_core::Graph,
        _: &tessera_core::Bindings,
    ) -> tessera_core::Result<()> {
        Err(tessera_core::Error::InvalidArgument(
            "foreign test stream computes nothing".into(),
        ))
    }
    fn synchronize(&mut self) -> tessera_core::Result<()> {
        Ok(())
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
