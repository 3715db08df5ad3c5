//! Single-threaded benchmark of `mul_mat_tile`.
//!
//! `cargo run --release --example kernel_bench [-- --quick] [--k 4096,14336] [--n 512]`
//!
//! Times m = 4096 weight rows at each k, n = 1 and n = 512 activation
//! columns, for every weight type, with the active instruction set and with
//! the plain scalar path as a baseline (the scalar baseline runs on fewer
//! rows at n = 512 to keep the run short; rates are per flop so they stay
//! comparable). n = 512 is run the way the backend calls it: 64-row x
//! 64-column tiles ("tiled"), and also as one call for the whole matrix.

use std::time::Instant;

use tessera_kernels::cpu::{
    Isa, WeightType, act_row_bytes, act_type, active_isa, mul_mat_tile_with_isa, prepare_act,
    quantize_row_iq4_nl, quantize_row_iq4_xs, quantize_row_mxfp4, quantize_row_q2_k,
    quantize_row_q3_k, quantize_row_q4_0, quantize_row_q4_1, quantize_row_q4_k, quantize_row_q5_0,
    quantize_row_q5_1, quantize_row_q5_k, quantize_row_q6_k, quantize_row_q8_0,
};

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn encode(wt: WeightType, vals: &[f32], k: usize) -> Vec<u8> {
    let rb = wt.row_bytes(k);
    let rows = vals.len() / k;
    let mut out = vec![0u8; rows * rb];
    for (src, dst) in vals.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        match wt {
            WeightType::F32 => {
                for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
            WeightType::F16 => {
                for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            WeightType::BF16 => {
                for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            WeightType::Q8_0 => quantize_row_q8_0(src, dst),
            WeightType::Q4_0 => quantize_row_q4_0(src, dst),
            WeightType::Q5_0 => quantize_row_q5_0(src, dst),
            WeightType::Q4_1 => quantize_row_q4_1(src, dst),
            WeightType::Q5_1 => quantize_row_q5_1(src, dst),
            WeightType::Q4_K => quantize_row_q4_k(src, dst),
            WeightType::Q5_K => quantize_row_q5_k(src, dst),
            WeightType::Q6_K => quantize_row_q6_k(src, dst),
            WeightType::Q2_K => quantize_row_q2_k(src, dst),
            WeightType::Q3_K => quantize_row_q3_k(src, dst),
            WeightType::IQ4_NL => quantize_row_iq4_nl(src, dst),
            WeightType::IQ4_XS => quantize_row_iq4_xs(src, dst),
            WeightType::MXFP4 => quantize_row_mxfp4(src, dst),
        }
    }
    out
}

struct Problem {
    wt: WeightType,
    k: usize,
    w: Vec<u8>,
    x: Vec<u8>,
    rows: usize,
}

impl Problem {
    /// Runs the matmul over `rows` rows and `cols` columns, in tiles of
    /// `tr` x `tc`; returns seconds.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        isa: Isa,
        rows: usize,
        cols: usize,
        tr: usize,
        tc: usize,
        out: &mut [f32],
        scratch: &mut Vec<u8>,
    ) -> f64 {
        let wrow = self.wt.row_bytes(self.k);
        let xrow = act_row_bytes(act_type(self.wt), self.k);
        let t = Instant::now();
        for c0 in (0..cols).step_by(tc) {
            let nc = tc.min(cols - c0);
            for r0 in (0..rows).step_by(tr) {
                let nr = tr.min(rows - r0);
                mul_mat_tile_with_isa(
                    isa,
                    self.wt,
                    &self.w[r0 * wrow..],
                    wrow,
                    nr,
                    &self.x[c0 * xrow..],
                    xrow,
                    nc,
                    self.k,
                    &mut out[c0 * rows + r0..],
                    rows,
                    scratch,
                );
            }
        }
        t.elapsed().as_secs_f64()
    }
}

fn best_of(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    f(); // warm-up
    (0..reps).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let ks: Vec<usize> = match args.iter().position(|a| a == "--k") {
        Some(i) => args[i + 1]
            .split(',')
            .map(|s| s.parse().expect("k"))
            .collect(),
        None => vec![4096, 14336],
    };
    let m = 4096;
    let n_big: usize = match args.iter().position(|a| a == "--n") {
        Some(i) => args[i + 1].parse().expect("n"),
        None => 512,
    };
    let isa = active_isa();
    println!("active ISA: {isa}; m = {m}; single thread");

    // Streaming read bandwidth reference (sum of a 256 MiB buffer).
    {
        let buf = vec![1.0f32; 64 << 20];
        let secs = best_of(3, || {
            let t = Instant::now();
            let s = tessera_kernels::cpu::dot_f32(&buf[..buf.len() / 2], &buf[buf.len() / 2..]);
            std::hint::black_box(s);
            t.elapsed().as_secs_f64()
        });
        println!(
            "memory read bandwidth (dot_f32 over 2 x 128 MiB): {:.1} GB/s\n",
            (buf.len() * 4) as f64 / secs / 1e9
        );
    }

    println!(
        "{:<5} {:>6} {:>4} {:<7} {:>9} {:>8} | {:>13} {:>8}",
        "type", "k", "n", "mode", "GFLOP/s", "GB/s", "scalar GFLOP/s", "speedup"
    );
    for &k in &ks {
        for wt in WeightType::ALL {
            let vals = rand_vec(m * k, k as u64 + wt as u64);
            let w = encode(wt, &vals, k);
            drop(vals);
            let xrow = act_row_bytes(act_type(wt), k);
            let mut x = vec![0u8; n_big * xrow];
            for c in 0..n_big {
                prepare_act(
                    act_type(wt),
                    &rand_vec(k, 77 + c as u64),
                    &mut x[c * xrow..(c + 1) * xrow],
                );
            }
            let p = Problem {
                wt,
                k,
                w,
                x,
                rows: m,
            };
            let mut out = vec![0.0f32; m * n_big];
            let mut scratch = Vec::new();
            let wbytes = p.w.len() as f64;

            // n = 1: one call per 64 rows... the backend gives all rows when n == 1.
            let reps = if quick { 2 } else { 5 };
            let t1 = best_of(reps, || {
                p.run(isa, p.rows, 1, p.rows, 1, &mut out, &mut scratch)
            });
            let s_rows = if quick { 256 } else { 1024 };
            let t1s = best_of(1, || {
                p.run(Isa::Scalar, s_rows, 1, s_rows, 1, &mut out, &mut scratch)
            });
            let g1 = 2.0 * m as f64 * k as f64 / t1 / 1e9;
            let g1s = 2.0 * s_rows as f64 * k as f64 / t1s / 1e9;
            println!(
                "{:<5} {:>6} {:>4} {:<7} {:>9.1} {:>8.1} | {:>13.2} {:>7.1}x",
                format!("{wt:?}"),
                k,
                1,
                "gemv",
                g1,
                wbytes / t1 / 1e9,
                g1s,
                g1 / g1s
            );

            // n = 512.
            let flops = 2.0 * m as f64 * n_big as f64 * k as f64;
            let s_rows = if quick { 32 } else { 64 };
            let ts = best_of(1, || {
                p.run(Isa::Scalar, s_rows, n_big, 64, 64, &mut out, &mut scratch)
            });
            let gs = 2.0 * s_rows as f64 * n_big as f64 * k as f64 / ts / 1e9;
            let reps = if quick || k > 8192 { 1 } else { 2 };
            for (mode, tr, tc) in [("tiled", 64, 64), ("whole", m, n_big)] {
                let t = best_of(reps, || {
                    p.run(isa, p.rows, n_big, tr, tc, &mut out, &mut scratch)
                });
                let g = flops / t / 1e9;
                println!(
                    "{:<5} {:>6} {:>4} {:<7} {:>9.1} {:>8} | {:>13.2} {:>7.1}x",
                    format!("{wt:?}"),
                    k,
                    n_big,
                    mode,
                    g,
                    "",
                    gs,
                    g / gs
                );
            }
        }
    }
}
