//! The reference suite with quantized KV caches: Tessera against llama.cpp run with the same
//! cache types (`-ctk`/`-ctv`) and flash attention, on the same GGUF files, in every split mode.
//!
//! `tests/reference/synthetic/kv/NAME.K-V.txt` (recorded by `make_references.sh`) holds
//! llama.cpp's top-64 logits of model NAME with a K cache of type K and a V cache of type V,
//! teacher-forced on its own greedy tokens, and per row two spreads measured on the same tokens:
//! `top_nmse`, its F16 cache's flash-attention on/off difference, and `kv_nmse`, the pair's own
//! effect (its logits against its F16 cache's). Each split mode's rows must have
//! - a median NMSE within `max(2 × median top_nmse, ¼ × median kv_nmse)`: as close to llama.cpp
//!   with that cache as llama.cpp's own flash-attention paths are to each other, or a quarter of
//!   what the cache itself changes, whichever is larger;
//! - llama.cpp's argmax wherever its lead exceeds a near tie: the reference suite's tie gap, or
//!   twice the RMS difference the bound allows at the scale of the top logits.
//!
//! Real models (`tests_real.rs`, Gemma 3 270M) cannot meet that bound with 4- and 5-bit caches:
//! their unquantized logits already differ from llama.cpp's by its flash-attention spread, and
//! rounding K and V to a few bits turns those small differences into different blocks, so the two
//! quantizations err nearly independently. There each pair is held to `2 × top_nmse + 3 ×
//! kv_nmse` (independent roundings, with room for q4_0's, and the unquantized difference), and Tessera's own cost
//! of the cache (its logits with the pair against its own F16 cache's) is compared with
//! llama.cpp's.
//!
//! CI checks the committed pairs (every type as K and V together, and each as K with an F16 V
//! and as V with an F16 K); `TESSERA_KV_REFERENCE_DIR` points the test at another recording,
//! such as all 81 pairs (`KV_PAIRS=all KV_DIR=DIR make_references.sh ...`).

use super::reference::reference_models;
use super::tests_reference::{Reference, parse_reference, with_modes};
use super::*;
use crate::recorded::Rule;
use std::sync::Arc;
use tessera::gguf::GgufFile;

#[test]
fn quantized_caches_match_llama_cpp_in_every_split_mode() {
    let dir = std::env::var("TESSERA_KV_REFERENCE_DIR").unwrap_or_else(|_| {
        format!(
            "{}/../tests/reference/synthetic/kv",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e} (run tests/reference/make_references.sh)"))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{dir}: no recordings");
    let only = std::env::var("TESSERA_REFERENCE_ONLY").ok();
    let models = reference_models();
    let mut report = vec![format!(
        "{:<16} {:<14} {:<15} {:>9} {:>9} {:>9} {:>8}",
        "model", "K-V", "mode", "median", "bound", "llama kv", "argmax"
    )];
    let mut failures = Vec::new();
    for file in &files {
        let stem = file.trim_end_matches(".txt");
        let (name, pair) = stem.rsplit_once('.').expect("NAME.K-V.txt");
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|part| stem.contains(part)))
        {
            continue;
        }
        let (k, v) = pair.split_once('-').expect("K-V");
        let types = KvCacheTypes::parse(k, v).unwrap();
        let m = models
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{file}: no reference model {name}"));
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let reference = parse_reference(&text);
        assert_eq!(reference.tokens, m.prompt(), "{file}: prompt");
        let bytes = m.gguf_bytes().unwrap();
        let gguf = Arc::new(GgufFile::from_bytes(bytes, name, &Default::default()).unwrap());
        let model = LlamaModel::from_gguf(gguf, None)
            .and_then(|m| m.with_cache_types(types))
            .unwrap();
        let bound = reference.kv_bound(types);
        let (lines, bad) = check_pair(name, pair, &model, &reference, &|_| true, bound);
        report.extend(lines);
        failures.extend(bad);
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Checks `model` (with its cache types) against `reference`, recorded by llama.cpp with the same
/// types, in the split modes `keep` accepts, with the median NMSE held to `bound`: the report
/// lines and the failures.
pub(super) fn check_pair(
    name: &str,
    pair: &str,
    model: &LlamaModel,
    reference: &Reference,
    keep: &dyn Fn(&str) -> bool,
    bound: f64,
) -> (Vec<String>, Vec<String>) {
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    let file = format!("{name}.{pair}");
    let effect = reference.effect_median();
    with_modes(model, keep, |mode, eval, _reset| {
        let rows = reference
            .teacher_forced(&mut |t| Ok(eval(t)))
            .unwrap_or_else(|e| panic!("{file} {mode}: {e}"));
        if std::env::var_os("TESSERA_KV_ROWS").is_some() {
            let per: Vec<String> = rows
                .iter()
                .zip(&reference.rows)
                .map(|(row, r)| format!("{:.1e}/{:.1e}", r.nmse(row), r.kv_nmse))
                .collect();
            println!(
                "{file} {mode} rows (ours/llama.cpp's effect): {}",
                per.join(" ")
            );
        }
        let check = reference.check(&rows, Rule::Kv { bound });
        failures.extend(check.failures.iter().map(|f| format!("{file} {mode}: {f}")));
        let (checked, agree) = check.argmax;
        report.push(format!(
            "{name:<16} {pair:<14} {mode:<15} {:>9.2e} {bound:>9.2e} {effect:>9.2e} {agree:>3}/{checked:<3}",
            check.median
        ));
    });
    (report, failures)
}
