//! Split a model over two devices (tensor parallelism) and check it computes what one device
//! computes.
//!
//! Tensor parallelism puts a slice of every layer on every device: attention heads and
//! feed-forward columns are divided between them, and after each attention and feed-forward
//! block the devices sum their partial results (an all-reduce). Tessera does this with a
//! *meta device*: a device made of several devices, whose buffers split every tensor and whose
//! stream runs each graph on all of them. A `Session` built with `Split::Tensor` runs a
//! `LlamaModel` on one; with `Split::None` it runs it whole on one device.
//!
//! The model here is synthetic (`LlamaConfig::tiny()`: 2 layers, width 64, Q8_0 weights,
//! random weights from a seed), so no file is needed. It runs
//! - unsplit on one CPU device (`Split::None`), the reference, and
//! - split over two CPU devices (`registry().select("cpu:2")`), evenly and 3:1,
//!
//! feeding both the same prompt and a few greedy decode steps, and compares the logits by
//! normalised mean squared error, `NMSE = Σ(split − ref)² / Σ ref²`. Only the order of the
//! partial sums differs, so the NMSE must be at most 1e-5 (1e-5 rather than ~1e-10 because a
//! sum at a rounding boundary can move a Q8_0-quantized activation by one step; on the CPU the
//! Q8_0 split is usually bit-identical, NMSE 0).
//!
//! Run it with:
//!
//! ```sh
//! cargo run --release -p tessera-examples --example tensor_parallel
//! ```

use anyhow::{Context as _, ensure};
use tessera_model::{LlamaConfig, LlamaModel, Session, Split, argmax, nmse};

/// NMSE bound of the split against one device.
const TOLERANCE: f64 = 1e-5;
/// Seed of the synthetic weights.
const SEED: u64 = 42;
/// Greedy decode steps after the prompt.
const DECODE_STEPS: usize = 3;

fn main() -> anyhow::Result<()> {
    let model = LlamaModel::new(LlamaConfig::tiny(), SEED)?;
    let prompt = [1, 17, 200, 3, 255, 9, 64, 128];

    // Two CPU devices. Each is a stream with its own threads; any devices of any backends
    // could be combined the same way (e.g. "cuda:2", or "CUDA0,CPU").
    let devices = tessera::registry().select("cpu:2")?;

    // The reference: the whole model on the first device. `eval` returns the logits of every
    // prompt position; each decode step then feeds the greedy token and gets its logits.
    let mut single = Session::builder(&model).devices(&devices).build()?;
    let n_vocab = model.config().n_vocab;
    let prompt_logits = single.eval(&prompt)?; // n_vocab per prompt token
    // The last position's logits pick the next token.
    let mut last = prompt_logits[prompt_logits.len() - n_vocab..].to_vec();
    let mut want = vec![prompt_logits];
    let mut decoded = Vec::new();
    for _ in 0..DECODE_STEPS {
        let next = i32::try_from(argmax(&last))?;
        decoded.push(next);
        last = single.eval_last(&[next])?;
        want.push(last.clone());
    }

    // Ratios give each device its share of every layer: empty means even.
    for ratios in [&[][..], &[3.0, 1.0]] {
        // A meta device over both CPUs, splitting with the model's split policy (which tensor
        // splits along which axis, in whole heads and whole quantization blocks); opening the
        // session uploads every weight's slices.
        let mut split = Session::builder(&model)
            .devices(&devices)
            .split(Split::Tensor {
                ratios: ratios.to_vec(),
                groups: 1,
            })
            .build()?;
        // The same prompt and the same decoded tokens as the reference.
        let mut got = vec![split.eval(&prompt)?];
        for &t in &decoded {
            got.push(split.eval_last(&[t])?);
        }

        // The meta device's own session says how it split and what it all-reduced.
        let tp = split
            .tensor_parallel()
            .context("a tensor split runs on the meta device")?;
        println!(
            "ratios {:<10} {}",
            if ratios.is_empty() {
                "even".to_string()
            } else {
                format!("{ratios:?}")
            },
            tp.describe().lines().next().unwrap_or_default()
        );
        // Mirrored tensors (embedding, norms) are stored once when every device can read the
        // first one's memory, as CPU devices can: the first device's share includes them.
        let kib: Vec<String> = tp
            .weight_bytes_per_device()
            .iter()
            .map(|b| format!("{:.1} KiB", *b as f64 / 1024.0))
            .collect();
        println!("  weights and KV caches per device: {}", kib.join(", "));
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = nmse(g, w);
            let what = if step == 0 {
                format!("prompt ({} tokens)", prompt.len())
            } else {
                format!("decode step {step}")
            };
            println!("  {what:<20} NMSE {e:.2e} (≤ {TOLERANCE:.0e})");
            ensure!(e <= TOLERANCE, "{what}: the split differs from one device");
        }
    }
    println!("PASS: the split logits match one device");
    Ok(())
}
