//! Build a small compute graph by hand and run it on every device Tessera knows.
//!
//! The graph is one feed-forward step followed by a softmax:
//!
//! ```text
//! h = silu(W · x + b)        W: Q8_0 weights [K, M], x: f32 [K, N], b: f32 [M]
//! y = softmax(h)             per column of N
//! ```
//!
//! Every device in `tessera::registry()` (the CPU at least; GPUs when their backend features
//! are on) runs the same graph, and its output is compared with a plain-Rust f32 computation
//! of the same formula. The reference uses the original f32 weights, so the difference shows
//! what Q8_0 costs: ±1/254 of each 32-weight block's largest value for the weights, and on the
//! CPU the same again for the activations, which it quantizes to Q8_0 as ggml does.
//!
//! Run it with:
//!
//! ```sh
//! cargo run --release -p tessera-examples --example custom_graph
//! ```

use anyhow::{Context as _, ensure};
use tessera::{BackendOptions, Context, DType};

/// Input width (a multiple of Q8_0's block of 32 values), output width, and number of columns.
const K: usize = 128;
const M: usize = 16;
const N: usize = 3;

/// Largest allowed |device − reference| for `h` (values of magnitude ~1) and for the softmax
/// output `y` (values ~1/M). Measured on the CPU: 3.3e-3 and 2.1e-4, about half of it from
/// quantizing W alone.
const TOL_H: f32 = 2e-2;
const TOL_Y: f32 = 2e-3;

fn main() -> anyhow::Result<()> {
    // ---- Inputs: deterministic pseudo-random values in [-1, 1). ----
    // Weights scaled by 1/√K so that W·x stays of magnitude ~1.
    let w: Vec<f32> = random_values(K * M, 1)
        .iter()
        .map(|v| v / (K as f32).sqrt())
        .collect(); // W[m][k] at w[m * K + k]: ne[0] = K is contiguous
    let x = random_values(K * N, 2); // x[n][k] at x[n * K + k]
    let b = random_values(M, 3);

    // ---- Describe the graph. ----
    // A `Context` is an arena of tensor descriptions; ops return tensor ids and check shapes.
    // Shapes follow ggml: ne[0] is the contiguous axis, a weight is [K, M], and
    // mul_mat(W [K, M], x [K, N]) = [M, N].
    let mut ctx = Context::new();
    let w_id = ctx.new_named("W", DType::Q8_0, [K, M])?;
    let x_id = ctx.new_named("x", DType::F32, [K, N])?;
    let b_id = ctx.new_named("b", DType::F32, [M, 1])?;
    let wx = ctx.mul_mat(w_id, x_id)?; // [M, N]
    let wx_b = ctx.add(wx, b_id)?; // b [M, 1] broadcasts over the N columns
    let h = ctx.silu(wx_b)?;
    let y = ctx.soft_max(h)?; // softmax along ne[0] (M), once per column
    // Both `h` and `y` are outputs: we read both back.
    let graph = ctx.build_forward_multi(&[h, y])?;

    // Q8_0 bytes for W (ggml's reference quantizer, bit-exact).
    let w_q8 = tessera::encode_f32(DType::Q8_0, &w)?;
    // The same formula in plain Rust, with the unquantized weights.
    let (want_h, want_y) = reference(&w, &x, &b);

    // ---- Run on every device. ----
    let devices = tessera::registry().devices();
    ensure!(!devices.is_empty(), "no devices found");
    for dev in &devices {
        // One buffer on this device holding every tensor of the context.
        let buf = dev
            .buffer_type()
            .alloc_tensors(&ctx)
            .with_context(|| format!("allocating on {}", dev.name()))?;
        buf.set(w_id, &w_q8)?;
        buf.set_f32(x_id, &x)?;
        buf.set_f32(b_id, &b)?;

        // A backend is a stream on the device: `compute` queues the graph, `synchronize`
        // waits for it and reports run-time errors.
        let mut backend = dev.init_backend(&BackendOptions::default())?;
        backend.compute(&graph, buf.bindings())?;
        backend.synchronize()?;

        let got_h = buf.get_f32(h)?;
        let got_y = buf.get_f32(y)?;
        let err_h = max_abs_diff(&got_h, &want_h);
        let err_y = max_abs_diff(&got_y, &want_y);
        println!(
            "{:<12} h: max |err| {err_h:.2e} (≤ {TOL_H:.0e})   softmax: max |err| {err_y:.2e} (≤ {TOL_Y:.0e})",
            dev.name()
        );
        ensure!(
            err_h <= TOL_H && err_y <= TOL_Y,
            "{} is outside the tolerance",
            dev.name()
        );
    }
    println!(
        "all {} device(s) agree with the f32 reference",
        devices.len()
    );
    Ok(())
}

/// `h = silu(W·x + b)` and `y = softmax(h)` per column, in f32 with the unquantized weights.
fn reference(w: &[f32], x: &[f32], b: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let silu = |v: f32| v / (1.0 + (-v).exp());
    let mut h = vec![0f32; M * N];
    for n in 0..N {
        for m in 0..M {
            let dot: f32 = (0..K).map(|k| w[m * K + k] * x[n * K + k]).sum();
            h[n * M + m] = silu(dot + b[m]);
        }
    }
    let mut y = h.clone();
    for col in y.chunks_mut(M) {
        let max = col.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        col.iter_mut().for_each(|v| *v = (*v - max).exp());
        let sum: f32 = col.iter().sum();
        col.iter_mut().for_each(|v| *v /= sum);
    }
    (h, y)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f32::max)
}

/// `n` values in [-1, 1) from a small linear congruential generator seeded with `seed`.
fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
