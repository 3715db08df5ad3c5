//! `check_finite`: a NaN or infinite weight makes the first op reading it produce a non-finite
//! value; sessions with the check on fail naming that op (single device, layer split and tensor
//! split), sessions without it return the logits as computed, and a failed step leaves the
//! session usable.

use super::*;
use std::sync::Arc;
use tessera::gguf::{GgufFile, ReadOptions};
use tessera::registry;
use tessera::sched::{SchedOptions, layer_devices};

/// The tiny model with the first Q8_0 block scale of `tensor` set to an f16 NaN (or +inf).
pub(crate) fn poisoned_model(tensor: &str, value: u16) -> LlamaModel {
    let m = LlamaModel::new(LlamaConfig::tiny(), 0xf1).unwrap();
    let mut bytes = m.to_gguf().unwrap().to_bytes();
    let file = GgufFile::from_bytes(bytes.clone(), "tiny", &ReadOptions::default()).unwrap();
    let at = file.tensor_info(tensor).unwrap().file_range().start;
    bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
    let file = GgufFile::from_bytes(bytes, "poisoned", &ReadOptions::default()).unwrap();
    LlamaModel::from_gguf(Arc::new(file), None).unwrap()
}

const F16_NAN: u16 = 0x7e00;
const F16_INF: u16 = 0x7c00;

fn check_error(e: tessera::Error) {
    let msg = e.to_string();
    assert!(msg.contains("MUL_MAT"), "{msg}");
    assert!(msg.contains("first non-finite value"), "{msg}");
    // Layer 1's FFN up projection reads the poisoned block.
    assert!(msg.contains("ffn_up") && msg.contains('1'), "{msg}");
}

#[test]
fn nan_weight_is_named_on_one_device_and_split_by_layer() {
    let model = poisoned_model("blk.1.ffn_up.weight", F16_NAN);
    for devs in ["cpu:1", "cpu:2"] {
        let devices = registry().select(devs).unwrap();
        let ld = layer_devices(model.config().n_layer, &[], devices.len()).unwrap();
        let mut s = Session::on_devices(&model, &devices, &ld, SchedOptions::default()).unwrap();
        // Unchecked, the step runs: the NaN is squashed to 0 where layer 1's FFN output is
        // quantized for ffn_down, so the logits stay finite and nothing says so.
        let logits = s.eval_last(&[1, 2, 3]).unwrap();
        assert!(first_non_finite(&logits).is_none(), "{devs}");
        s.reset();
        s.set_check_finite(true);
        check_error(s.eval_last(&[1, 2, 3]).unwrap_err());
        assert_eq!(s.n_past(), 0, "a failed step does not advance");
        // The session still runs (and still reports) after the checking re-run.
        check_error(s.eval(&[4]).unwrap_err());
    }
}

#[test]
fn inf_weight_is_named_through_the_meta_device() {
    let model = poisoned_model("blk.1.ffn_up.weight", F16_INF);
    let devices = registry().select("cpu:3").unwrap();
    let meta = model.meta_device(&devices, &[2.0, 1.0, 1.0]).unwrap();
    let mut s = Session::on_meta(&model, meta, Some(1)).unwrap();
    let logits = s.eval_last(&[1, 2, 3]).unwrap();
    assert!(first_non_finite(&logits).is_some());
    s.reset();
    s.set_check_finite(true);
    check_error(s.eval_last(&[1, 2, 3]).unwrap_err());
}

#[test]
fn finite_model_passes_the_check_unchanged() {
    let model = LlamaModel::new(LlamaConfig::tiny(), 0xf1).unwrap();
    let devices = registry().select("cpu:1").unwrap();
    let ld = layer_devices(model.config().n_layer, &[], 1).unwrap();
    let mut plain = Session::on_devices(&model, &devices, &ld, SchedOptions::default()).unwrap();
    let mut checked = Session::on_devices(&model, &devices, &ld, SchedOptions::default()).unwrap();
    checked.set_check_finite(true);
    for chunk in [&[1, 2, 3][..], &[4], &[5]] {
        assert_eq!(plain.eval(chunk).unwrap(), checked.eval(chunk).unwrap());
    }
}
