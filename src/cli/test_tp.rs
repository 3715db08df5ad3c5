//! `tessera test-tp`: the tensor-parallel equivalence check. A small llama model (F32 and Q8_0
//! weights) runs on one CPU device and on a meta device over the chosen devices; the logits of a
//! prompt and of two decode steps are compared by NMSE.

use anyhow::Context as _;
use std::sync::Arc;
use tessera::model::{LlamaConfig, LlamaModel, LlamaSession, TpSession, nmse};
use tessera::sched::{SchedOptions, layer_devices};
use tessera::{BackendOptions, DType, Device, registry};

const SEED: u64 = 0x7e57;
const PROMPT: [i32; 12] = [1, 17, 200, 3, 255, 9, 64, 128, 31, 32, 33, 7];

/// NMSE bound for F32 weights (the criterion).
pub const F32_TOLERANCE: f64 = 1e-6;
/// NMSE bound for Q8_0 weights: llama.cpp's bound on logits. Activations are quantized to Q8_0
/// per block, so a last-bit difference in a partial sum can move a value to the next step.
pub const Q8_TOLERANCE: f64 = 1e-4;

/// One compared output.
pub struct Row {
    /// Weight dtype.
    pub dtype: DType,
    /// `prompt`, `decode 1`, ...
    pub output: String,
    /// NMSE against the single device.
    pub nmse: f64,
    /// The bound it must meet.
    pub tolerance: f64,
}

/// Runs the check; prints a table and returns whether every output is within its tolerance.
///
/// # Errors
/// Device selection, split and compute errors.
pub fn run(devices: &[Arc<dyn Device>], ratios: &[f32], generic: bool) -> anyhow::Result<bool> {
    let names: Vec<&str> = devices.iter().map(|d| d.name()).collect();
    println!(
        "tensor-parallel check on {} ({} devices, ratios {}), llama tiny model",
        names.join(","),
        devices.len(),
        if ratios.is_empty() {
            "even".to_string()
        } else {
            format!("{ratios:?}")
        }
    );
    let mut ok = true;
    let mut path = String::new();
    for (dtype, tol) in [(DType::F32, F32_TOLERANCE), (DType::Q8_0, Q8_TOLERANCE)] {
        let config = LlamaConfig {
            weight_dtype: dtype,
            n_layer: 3,
            ..LlamaConfig::tiny()
        };
        let model = LlamaModel::new(config, SEED)?;
        let reference = registry().select("cpu:1")?;
        let ld = layer_devices(model.config().n_layer, &[], 1)?;
        let mut single = LlamaSession::new(&model, &reference, &ld, SchedOptions::default())?;
        let meta = model
            .meta_device(devices, ratios)
            .context("making the meta device")?
            .with_vendor_comm(!generic);
        let mut tp = TpSession::new(&model, meta, &BackendOptions::default(), |_, _| {})
            .context("splitting the model")?;
        path = tp.backend().comm_path().to_string();
        for (i, chunk) in [&PROMPT[..], &[5], &[6]].iter().enumerate() {
            let want = single.eval(chunk)?;
            let got = tp.eval(chunk)?;
            let e = nmse(&got, &want);
            let row = Row {
                dtype,
                output: if i == 0 {
                    format!("prompt logits ({} tokens)", chunk.len())
                } else {
                    format!("decode {i} logits")
                },
                nmse: e,
                tolerance: tol,
            };
            let pass = row.nmse <= row.tolerance;
            ok &= pass;
            println!(
                "  {:<5} {:<26} NMSE {:>10.3e} (≤ {:.0e})  {}",
                row.dtype.to_string(),
                row.output,
                row.nmse,
                row.tolerance,
                if pass { "ok" } else { "FAIL" }
            );
        }
        let per_dev: Vec<String> = tp
            .weight_bytes_per_device()
            .iter()
            .map(|b| format!("{:.1}", *b as f64 / 1024.0))
            .collect();
        println!(
            "  {:<5} weights+caches per device [{}] KiB; {} all-reduces",
            dtype.to_string(),
            per_dev.join(", "),
            tp.backend().stats().vendor_reduces + tp.backend().stats().generic_reduces
        );
    }
    println!("all-reduce path: {path}");
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}
