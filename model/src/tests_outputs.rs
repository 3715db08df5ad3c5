//! Last-position outputs ([`Outputs::Last`]): the graph projects one column, and `eval_last`
//! gives the last row of `eval` in every split mode and continues the sequence alike.

use super::*;
use tessera::ops::Op;
use tessera::registry;

const SEED: u64 = 0x1a57;
const PROMPT: [i32; 7] = [1, 17, 200, 3, 255, 9, 64];
const NEXT: i32 = 42;

/// The last-only path runs the output projection as a matrix-vector product instead of a column
/// of a matrix-matrix product: the same dot products summed in another order (and for Q8_0 the
/// same quantized activations), so rows agree to rounding. Stated bound: NMSE ≤ 1e-6 and every
/// logit within 1e-4 of the largest |logit|.
const LAST_NMSE: f64 = 1e-6;
const LAST_MAX_ABS_REL: f32 = 1e-4;

/// Tiny llama with Q8_0 weights, and the reference suite's Gemma 3 with final-logit soft-capping
/// (F32, sliding window, tied output).
fn models() -> Vec<(String, LlamaModel)> {
    let softcap = reference::reference_models()
        .into_iter()
        .find(|m| m.name == "gemma3-f32-gqa-softcap")
        .unwrap();
    assert!(softcap.config.logit_softcap > 0.0);
    vec![
        (
            "llama-q8_0".into(),
            LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap(),
        ),
        (softcap.name.clone(), softcap.model().unwrap()),
    ]
}

/// `none` on cpu:1, `layer` over cpu:2, and `tensor` and `expert` over cpu:2: every mode through
/// the one [`Session`] type.
fn sessions(model: &LlamaModel) -> Vec<(&'static str, Session)> {
    let one = registry().select("cpu:1").unwrap();
    let two = registry().select("cpu:2").unwrap();
    let open = |mode: SplitMode, devs: &[std::sync::Arc<dyn tessera::Device>]| {
        let opts = SessionOptions::new(mode).with_threads(Some(1));
        let s = Session::open(model, devs, &opts).unwrap();
        assert_eq!(s.split_mode(), mode);
        assert_eq!(s.tensor_parallel().is_some(), mode.is_tensor_parallel());
        s
    };
    vec![
        ("none cpu:1", open(SplitMode::None, &one)),
        ("layer cpu:2", open(SplitMode::Layer, &two)),
        ("tensor cpu:2", open(SplitMode::Tensor, &two)),
        ("expert cpu:2", open(SplitMode::Expert, &two)),
    ]
}

#[test]
fn split_modes_parse_by_name_and_sessions_refuse_bad_options() {
    for &m in SplitMode::ALL {
        assert_eq!(m.name().parse::<SplitMode>().unwrap(), m);
        assert_eq!(
            format!(" {} ", m.name().to_uppercase())
                .parse::<SplitMode>()
                .unwrap(),
            m
        );
    }
    let e = "row".parse::<SplitMode>().unwrap_err().to_string();
    assert!(
        e.contains("unknown split mode 'row'") && e.contains(SplitMode::ACCEPTED),
        "{e}"
    );
    let model = LlamaModel::new(LlamaConfig::tiny(), SEED).unwrap();
    let e = Session::open(&model, &[], &SessionOptions::default()).unwrap_err();
    assert!(e.to_string().contains("no devices"), "{e}");
    let two = registry().select("cpu:2").unwrap();
    let bad = SessionOptions::new(SplitMode::Layer).with_ratios(&[1.0, f32::NAN]);
    assert!(Session::open(&model, &two, &bad).is_err());
    let comm: std::sync::Arc<dyn tessera::comm::DistComm> = std::sync::Arc::new(
        tessera::comm::ThreadGroup::new(1, std::time::Duration::from_secs(5))
            .into_iter()
            .next()
            .unwrap(),
    );
    let e = Session::open(
        &model,
        &two,
        &SessionOptions::new(SplitMode::Layer).with_comm(Some(comm)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("not layer"), "{e}");
}

#[test]
fn last_only_graph_projects_one_column() {
    for (name, model) in models() {
        let n_vocab = model.config().n_vocab;
        let t = PROMPT.len();
        let (_, output) = model.output_tensors();
        // The projection: the MUL_MAT whose weight is the output (or the tied embedding).
        let projection = |step: &Step| {
            let g = &step.graph;
            let ids: Vec<_> = g
                .nodes()
                .iter()
                .copied()
                .filter(|&id| {
                    let d = g.tensor(id).unwrap();
                    matches!(d.op(), Op::MulMat) && d.src(0) == Some(output)
                })
                .collect();
            assert_eq!(ids.len(), 1, "{name}: one output projection");
            g.tensor(ids[0]).unwrap().ne()
        };
        let all = model.build_step(t, 0, Outputs::All).unwrap();
        let last = model.build_step(t, 0, Outputs::Last).unwrap();
        assert_eq!((all.n_outputs, last.n_outputs), (t, 1), "{name}");
        assert_eq!(projection(&all), [n_vocab, t, 1, 1], "{name}");
        assert_eq!(projection(&last), [n_vocab, 1, 1, 1], "{name}");
        let ne = |s: &Step| s.graph.tensor(s.logits).unwrap().ne();
        assert_eq!(ne(&all), [n_vocab, t, 1, 1], "{name}");
        assert_eq!(ne(&last), [n_vocab, 1, 1, 1], "{name}");
        // One token: the last position is every position, and the graph is the same.
        let one_all = model.build_step(1, t, Outputs::All).unwrap();
        let one_last = model.build_step(1, t, Outputs::Last).unwrap();
        assert_eq!(one_all.graph.nodes().len(), one_last.graph.nodes().len());
        assert_eq!(one_last.n_outputs, 1);
    }
}

#[test]
fn eval_last_is_the_last_row_of_eval_in_every_split_mode() {
    for (name, model) in models() {
        let n_vocab = model.config().n_vocab;
        for (mode, mut s) in sessions(&model) {
            let all = s.eval(&PROMPT).unwrap();
            let after_all = s.eval(&[NEXT]).unwrap();
            s.reset();
            let last = s.eval_last(&PROMPT).unwrap();
            assert_eq!(s.n_past(), PROMPT.len(), "{name} {mode}");
            assert_eq!(last.len(), n_vocab, "{name} {mode}");
            let want = &all[all.len() - n_vocab..];
            let e = nmse(&last, want);
            assert!(e <= LAST_NMSE, "{name} {mode}: nmse {e:e}");
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = last
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= LAST_MAX_ABS_REL * scale,
                "{name} {mode}: max |Δ| {worst:e} vs max |logit| {scale}"
            );
            // The caches hold the whole prompt: the next step sees the same history.
            let after_last = s.eval_last(&[NEXT]).unwrap();
            assert_eq!(s.n_past(), PROMPT.len() + 1, "{name} {mode}");
            let e = nmse(&after_last, &after_all);
            assert!(e <= 1e-12, "{name} {mode} continuation: nmse {e:e}");
        }
    }
}
