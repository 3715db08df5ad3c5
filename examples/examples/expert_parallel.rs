//! Split a mixture-of-experts model over two devices by experts (expert parallelism) and check
//! it computes what one device computes.
//!
//! In a mixture-of-experts (MoE) layer a router picks a few of many feed-forward "experts" for
//! each token. Expert parallelism gives each device whole experts: a device computes only the
//! tokens routed to its own experts, and one all-reduce per layer sums the devices' shares.
//! Attention still splits by heads, as in `tensor_parallel`. It is `tessera run
//! --split-mode expert` in the CLI; in the library, a `Session` opened with
//! `Split::Expert` (a meta device whose policy splits experts whole, `ExpertSplit::Expert`).
//!
//! The model is synthetic: `LlamaConfig::tiny_moe(Arch::Qwen3Moe, 8, 2, 64)` is the tiny test
//! model shaped as Qwen3-MoE with 8 experts of width 64 per layer, 2 used per token (Q8_0
//! weights). It runs unsplit on one CPU device and split over two (evenly, then 3:1), on the
//! same prompt and greedy decode steps, and the logits are compared by normalised mean squared
//! error, `NMSE = Σ(split − ref)² / Σ ref²`, which must be at most 1e-5.
//!
//! The split is chosen per layer when the meta device is made: whole experts where the busiest
//! device's share of the experts is no larger than its share of the expert width would be
//! under the width split; otherwise that layer splits every expert along its width. The
//! program prints the choice: `EP layers 0-1` when even; at 3:1 one layer keeps the width
//! split (`EP layers 1, TP layers 0`): widths split in whole Q8_0 blocks of 32, so a width
//! of 64 splits 32:32 there, a smaller share for the busier device than 6 of the 8 experts.
//!
//! Run it with:
//!
//! ```sh
//! cargo run --release -p tessera-examples --example expert_parallel
//! ```

use anyhow::{Context as _, ensure};
use tessera_model::{Arch, LlamaConfig, LlamaModel, Session, Split, argmax, nmse};

/// NMSE bound of the split against one device (only the order of sums differs; 1e-5 allows a
/// Q8_0-quantized activation to move one step).
const TOLERANCE: f64 = 1e-5;
/// Seed of the synthetic weights.
const SEED: u64 = 7;
/// Greedy decode steps after the prompt.
const DECODE_STEPS: usize = 3;

fn main() -> anyhow::Result<()> {
    // 8 experts of hidden width 64, 2 chosen per token.
    let config = LlamaConfig::tiny_moe(Arch::Qwen3Moe, 8, 2, 64);
    let model = LlamaModel::new(config, SEED)?;
    let prompt = [1, 17, 200, 3, 255, 9, 64, 128];
    let devices = tessera::registry().select("cpu:2")?;

    // The reference: the whole model on the first device.
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

    for ratios in [&[][..], &[3.0, 1.0]] {
        // `Split::Expert` is `--split-mode expert`; `Split::Tensor` would split every
        // expert by width.
        let mut split = Session::builder(&model)
            .devices(&devices)
            .split(Split::Expert {
                ratios: ratios.to_vec(),
                groups: 1,
            })
            .build()?;
        let mut got = vec![split.eval(&prompt)?];
        for &t in &decoded {
            got.push(split.eval_last(&[t])?);
        }

        let tp = split
            .tensor_parallel()
            .context("an expert split runs on the meta device")?;
        println!(
            "ratios {:<10} experts: {}",
            if ratios.is_empty() {
                "even".to_string()
            } else {
                format!("{ratios:?}")
            },
            tp.expert_split_summary()
        );
        println!("  {}", tp.meta().describe());
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
    println!("PASS: the expert-split logits match one device");
    Ok(())
}
