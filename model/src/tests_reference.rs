//! The reference suite: Tessera against llama.cpp on the same GGUF files, in every split mode.
//!
//! Each random-weight model of [`super::reference::reference_models`] is written as GGUF, loaded
//! through [`LlamaModel::from_gguf`] (the path `tessera run -m` takes) and evaluated teacher-forced
//! on llama.cpp's token sequence (prompt, then llama.cpp's greedy tokens) with `none`, `layer`
//! over 2 devices and `tensor` over 2 devices and over 3 devices with ratios 5:1:3. Every logit
//! row is compared with llama.cpp's (`tests/reference/synthetic/NAME.txt`, recorded by
//! `make_references.sh`):
//! - every model: mean NMSE over the positions no worse than twice llama.cpp's own
//!   flash-attention on/off difference, and the same argmax wherever llama.cpp's top two are
//!   further apart than [`RefRow::tie_gap`] (at least [`crate::recorded::TIE_GAP`]);
//! - F32 weights also: NMSE ≤ [`F32_NMSE`] at every position;
//! - free-running greedy generation: llama.cpp's tokens until a step where its choice led by
//!   less than that gap.

use super::reference::{ReferenceModel, reference_models};
use super::*;
use crate::ExpertSplit;
use std::sync::Arc;
use tessera::gguf::GgufFile;
use tessera::registry;
use tessera::sched::{SchedOptions, layer_devices};

use crate::recorded::Rule;
pub(super) use crate::recorded::{F32_NMSE, RecordedRow as RefRow, Recording as Reference, median};

pub(super) fn parse_reference(text: &str) -> Reference {
    Reference::parse(text).unwrap()
}

/// Calls `f(label, evaluator, reset)` for each split mode: `none`, `layer` over 2 devices, the
/// distributed meta device over 2 ranks (`dist/2`), `tensor` over 2 and over 3 devices with
/// ratios 5:1:3 (and `expert` likewise for mixture-of-experts models).
pub(super) fn with_each_mode(
    model: &LlamaModel,
    f: impl FnMut(&str, &mut dyn FnMut(&[i32]) -> Vec<f32>, &mut dyn FnMut()),
) {
    with_modes(model, &|_| true, f);
}

/// [`with_each_mode`] over the modes whose label `keep` accepts (and the environment's
/// `TESSERA_REFERENCE_MODES` allows).
pub(super) fn with_modes(
    model: &LlamaModel,
    keep: &dyn Fn(&str) -> bool,
    mut f: impl FnMut(&str, &mut dyn FnMut(&[i32]) -> Vec<f32>, &mut dyn FnMut()),
) {
    let n_layer = model.config().n_layer;
    // A GPU check runs the same suite on another backend's devices (e.g. `cuda` on a lent GPU:
    // `scripts/gpu-check.sh`); CI runs it on the CPU.
    let kind = std::env::var("TESSERA_REFERENCE_BACKEND").unwrap_or_else(|_| "cpu".into());
    let select = |n: usize| {
        registry()
            .select(&format!("{kind}:{n}"))
            .unwrap_or_else(|e| panic!("TESSERA_REFERENCE_BACKEND={kind}: {e}"))
    };
    // `TESSERA_REFERENCE_MODES=none,layer,tensor,expert` (any subset) runs only those modes: the
    // arm64 check runs `none` on the CPU models below its top level (scripts/arm64-qemu.sh),
    // development runs pick what they need. Unset: every mode.
    let modes_env = std::env::var("TESSERA_REFERENCE_MODES").ok();
    let wanted = |label: &str| {
        keep(label)
            && modes_env.as_deref().is_none_or(|m| {
                m.split(',')
                    .map(str::trim)
                    .any(|w| !w.is_empty() && label.starts_with(w))
            })
    };
    let one = select(1);
    let two = select(2);
    for (label, devs) in [("none", &one), ("layer/2", &two)] {
        if !wanted(label) {
            continue;
        }
        let ld = layer_devices(n_layer, &[], devs.len()).unwrap();
        let session = Session::on_devices(model, devs, &ld, SchedOptions::default())
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let s = std::cell::RefCell::new(session);
        f(label, &mut |t| s.borrow_mut().eval(t).unwrap(), &mut || {
            s.borrow_mut().reset()
        });
    }
    if wanted("dist/2") {
        with_two_ranks(model, &two, &mut f);
    }
    if !wanted("tensor") && !wanted("expert") {
        eprintln!("TESSERA_REFERENCE_MODES: tensor and expert modes skipped");
        return;
    }
    let three = select(3);
    let mut modes = vec![
        ("tensor/2", &two, &[][..], ExpertSplit::Tensor),
        (
            "tensor/3 5:1:3",
            &three,
            &[5.0, 1.0, 3.0][..],
            ExpertSplit::Tensor,
        ),
    ];
    if model.config().is_moe() {
        // Expert parallelism changes only the expert stacks: dense models would repeat tensor.
        modes.push(("expert/2", &two, &[][..], ExpertSplit::Expert));
        modes.push((
            "expert/3 5:1:3",
            &three,
            &[5.0, 1.0, 3.0][..],
            ExpertSplit::Expert,
        ));
    }
    for (label, devs, ratios, experts) in modes {
        if !wanted(label) {
            continue;
        }
        let meta = model
            .meta_device_with(devs, ratios, experts)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let tp = Session::on_meta(model, meta, None).unwrap_or_else(|e| panic!("{label}: {e}"));
        let s = std::cell::RefCell::new(tp);
        f(label, &mut |t| s.borrow_mut().eval(t).unwrap(), &mut || {
            s.borrow_mut().reset()
        });
        if model.config().is_moe() {
            check_moe_reduces(label, &s.borrow(), model.config(), experts);
        }
    }
}

/// The `dist/2` mode of [`with_modes`]: the distributed meta device an MPI job builds, over two
/// ranks as threads ([`tessera::comm::ThreadGroup`], the same `DistComm` contract), one of
/// `devs` each, tensor split. Rank 1 repeats every step of rank 0, whose logits go to `f`, and
/// must return the same logits.
fn with_two_ranks(
    model: &LlamaModel,
    devs: &[Arc<dyn tessera::Device>],
    mut f: impl FnMut(&str, &mut dyn FnMut(&[i32]) -> Vec<f32>, &mut dyn FnMut()),
) {
    let mut ranks =
        tessera::comm::ThreadGroup::new(2, std::time::Duration::from_secs(120)).into_iter();
    let (r0, r1) = (ranks.next().unwrap(), ranks.next().unwrap());
    let open = |dev: &Arc<dyn tessera::Device>, rank| {
        let meta = model
            .distributed_meta_device(
                std::slice::from_ref(dev),
                Arc::new(rank),
                &[],
                ExpertSplit::Tensor,
            )
            .unwrap_or_else(|e| panic!("dist/2: {e}"));
        Session::on_meta(model, meta, None).unwrap_or_else(|e| panic!("dist/2: {e}"))
    };
    std::thread::scope(|sc| {
        // Some(tokens): evaluate them; None: reset. The channel closes when rank 0 is done (or
        // panics), which ends rank 1.
        let (steps, steps_rx) = std::sync::mpsc::channel::<Option<Vec<i32>>>();
        let (logits_tx, logits) = std::sync::mpsc::channel::<Vec<f32>>();
        let open = &open;
        sc.spawn(move || {
            let mut s = open(&devs[1], r1);
            for step in steps_rx {
                match step {
                    Some(t) => {
                        let _ = logits_tx.send(s.eval(&t).unwrap());
                    }
                    None => s.reset(),
                }
            }
        });
        let s = std::cell::RefCell::new(open(&devs[0], r0));
        f(
            "dist/2",
            &mut |t| {
                steps.send(Some(t.to_vec())).unwrap();
                let mine = s.borrow_mut().eval(t).unwrap();
                let theirs = logits.recv().expect("rank 1 evaluates");
                assert_eq!(mine, theirs, "dist/2: the ranks' logits differ");
                mine
            },
            &mut || {
                steps.send(None).unwrap();
                s.borrow_mut().reset()
            },
        );
    });
}

/// A split mixture-of-experts model does one all-reduce per expert block, of `n_embd·T` values
/// on its output `ffn_moe_out.{il}` (the weighted sum over the chosen experts), not of the
/// `n_embd·n_used·T` expert outputs; under `expert` the describe line names the EP layers.
fn check_moe_reduces(label: &str, s: &Session, c: &LlamaConfig, experts: ExpertSplit) {
    let reduces = s.tp().reduces().to_vec();
    let d = s.tp().describe();
    // The last step decoded one token.
    let n_embd = c.n_embd;
    for il in 0..c.n_layer {
        let name = format!("ffn_moe_out.{il}");
        let hits: Vec<usize> = reduces
            .iter()
            .filter(|(n, _)| n.starts_with("ffn_moe"))
            .filter(|(n, _)| n.ends_with(&format!(".{il}")))
            .map(|(_, len)| *len)
            .collect();
        assert_eq!(
            hits.len(),
            1,
            "{label}: layer {il}: {} all-reduces in the expert block, want 1 ({d})",
            hits.len()
        );
        assert!(
            reduces.iter().any(|(n, len)| *n == name && *len == n_embd),
            "{label}: layer {il}: the block's all-reduce is not one of n_embd values on {name} ({d})"
        );
    }
    if experts == ExpertSplit::Expert {
        assert!(
            d.contains("EP layers"),
            "{label}: no layer splits whole experts: {d}"
        );
    }
}

/// Logit rows of `tokens`: the prompt as one batch, then the rest one token at a time.
pub(super) fn teacher_forced(
    eval: &mut dyn FnMut(&[i32]) -> Vec<f32>,
    prompt: &[i32],
    rest: &[i32],
) -> Vec<Vec<f32>> {
    let logits = eval(prompt);
    let n_vocab = logits.len() / prompt.len();
    let mut rows: Vec<Vec<f32>> = logits.chunks(n_vocab).map(<[f32]>::to_vec).collect();
    for &t in rest {
        rows.push(eval(&[t]));
    }
    rows
}

/// Free-running greedy tokens after `prompt`.
fn greedy(eval: &mut dyn FnMut(&[i32]) -> Vec<f32>, prompt: &[i32], n: usize) -> Vec<i32> {
    let mut logits = eval(prompt);
    let n_vocab = logits.len() / prompt.len();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits[logits.len() - n_vocab..]) as i32;
        out.push(next);
        logits = eval(&[next]);
    }
    out
}

/// Checks one model in every split mode against its reference; returns the report lines.
pub(super) fn check_against_reference(
    name: &str,
    model: &LlamaModel,
    reference: &Reference,
    f32_weights: bool,
    tolerance_scale: f64,
) -> Vec<String> {
    let prompt = &reference.tokens;
    let greedy_ref: Vec<i32> = reference.greedy.iter().map(|g| g.0).collect();
    let fed = &greedy_ref[..reference.rows.len() - prompt.len()];
    let mut fa: Vec<f64> = reference.rows.iter().map(RefRow::spread).collect();
    let fa_mean = fa.iter().sum::<f64>() / fa.len() as f64;
    let fa_median = median(&mut fa);
    let rule = Rule::Plain {
        f32_weights,
        scale: tolerance_scale,
    };
    let mut report = Vec::new();
    with_each_mode(model, |mode, eval, reset| {
        let rows = teacher_forced(eval, prompt, fed);
        let check = reference.check(&rows, rule);
        assert!(
            check.passed(),
            "{name} {mode}:\n{}\nllama.cpp's top ids (id, llama.cpp, ours): {:?}",
            check.failures.join("\n"),
            rows.iter()
                .zip(&reference.rows)
                .map(|(row, r)| r
                    .top
                    .iter()
                    .take(3)
                    .map(|&(id, v)| (id, v, row[id]))
                    .collect())
                .collect::<Vec<Vec<_>>>()
        );
        let (mean, worst) = (check.mean, check.worst);
        let (argmax_checked, flips_within_spread) = (check.argmax.0, check.flips_within_spread);
        reset();
        let ours = greedy(eval, prompt, greedy_ref.len());
        let same = ours
            .iter()
            .zip(&greedy_ref)
            .take_while(|(a, b)| a == b)
            .count();
        if same < greedy_ref.len() {
            let gap = reference.greedy[same].1;
            let tie = reference.rows[prompt.len() - 1 + same].tie_gap();
            assert!(
                gap <= tie,
                "{name} {mode}: greedy step {same} is {} where llama.cpp chose {} by a lead of {gap}",
                ours[same],
                greedy_ref[same]
            );
        }
        report.push(format!(
            "{name:<24} {mode:<15} NMSE median {:.2e} mean {mean:.2e} max {worst:.2e} | llama.cpp FA on/off median {fa_median:.2e} mean {fa_mean:.2e} | argmax {argmax_checked}/{} ({flips_within_spread} flips within llama.cpp's spread) | greedy {same}/{}",
            check.median,
            rows.len(),
            greedy_ref.len()
        ));
    });
    report
}

/// The recorded llama.cpp output of `m`: from `TESSERA_REFERENCE_DIR` when set (a test binary
/// run away from the checkout it was built in, as on a GPU machine), else from this checkout.
fn reference_text(m: &ReferenceModel) -> String {
    let dir = std::env::var("TESSERA_REFERENCE_DIR").unwrap_or_else(|_| {
        format!(
            "{}/../tests/reference/synthetic",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let path = format!("{dir}/{}.txt", m.name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run tests/reference/make_references.sh)"))
}

#[test]
fn synthetic_models_match_llama_cpp_in_every_split_mode() {
    let mut report = Vec::new();
    // Development runs may pick models by name: any of a comma-separated list of parts of the
    // name (CI never sets it).
    let only = std::env::var("TESSERA_REFERENCE_ONLY").ok();
    for m in reference_models() {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|part| m.name.contains(part)))
        {
            eprintln!("TESSERA_REFERENCE_ONLY: {} skipped", m.name);
            continue;
        }
        let reference = parse_reference(&reference_text(&m));
        assert_eq!(reference.tokens, m.prompt(), "{}: prompt", m.name);
        let bytes = m.gguf_bytes().unwrap();
        let file = Arc::new(GgufFile::from_bytes(bytes, &m.name, &Default::default()).unwrap());
        let model = LlamaModel::from_gguf(file, None).unwrap();
        assert_eq!(model.config(), &m.config, "{}: config read back", m.name);
        report.extend(check_against_reference(
            &m.name,
            &model,
            &reference,
            m.is_f32(),
            m.tolerance_scale(),
        ));
    }
    println!("{}", report.join("\n"));
}
