//! Many sequences in one batch: each sequence's logits match the same sequence run alone, in
//! every split mode; sequences join and leave between steps; a forked prefix is not evaluated
//! again; bad batches give typed errors and leave the cache as it was.

use super::*;
use std::sync::Arc;
use tessera::Device;
use tessera::registry;

/// A sequence of a batch is the same arithmetic as the sequence alone except for the order of
/// sums: its queries attend over more (masked) cells and its rows share matrix products with
/// other sequences' rows. Stated bound, per position: NMSE ≤ 1e-8 against the sequence alone
/// (the reference suite allows 1e-5 against llama.cpp on F32 files).
const BATCH_NMSE: f64 = 1e-8;
/// With quantized weights the activations are rounded to Q8_0, and a last-bit difference can
/// move one value across a rounding boundary (measured: one position of 57 at 5.2e-5 on
/// llama-q8_0-gqa, in every split mode). Stated bound: every position ≤ 2e-4, and nine in ten
/// within [`BATCH_NMSE`].
const BATCH_NMSE_FLIP: f64 = 2e-4;

/// The reference suite's models named `names`, with room for eight sequences (n_ctx 256).
fn models(names: &[&str]) -> Vec<(String, LlamaModel)> {
    reference::reference_models()
        .into_iter()
        .filter(|m| names.contains(&m.name.as_str()))
        .map(|mut m| {
            m.config.n_ctx = 256;
            (m.name.clone(), m.model().unwrap())
        })
        .collect()
}

fn open(model: &LlamaModel, mode: SplitMode) -> Session {
    let devs: Vec<Arc<dyn Device>> = registry()
        .select(if mode == SplitMode::None {
            "cpu:1"
        } else {
            "cpu:2"
        })
        .unwrap();
    let opts = SessionOptions::new(mode).with_threads(Some(2));
    Session::open(model, &devs, &opts).unwrap()
}

/// Eight prompts of different lengths (3 to 10 tokens).
fn prompts(n_vocab: usize) -> Vec<Vec<i32>> {
    (0..8)
        .map(|s| {
            (0..3 + s)
                .map(|i| ((s * 131 + i * 17 + 5) % n_vocab) as i32)
                .collect()
        })
        .collect()
}

/// The token sequence `s` is fed at decode step `k` (teacher-forced: the same whether alone or
/// batched, so positions can be compared one by one).
fn forced(s: usize, k: usize, n_vocab: usize) -> i32 {
    ((s * 37 + k * 101 + 11) % n_vocab) as i32
}

const STEPS: usize = 3;

/// Every position's logits of sequence `s` run alone: its prompt, then the forced tokens.
fn alone(session: &mut Session, prompt: &[i32], s: usize, n_vocab: usize) -> Vec<Vec<f32>> {
    session.reset();
    let mut rows: Vec<Vec<f32>> = session
        .eval(prompt)
        .unwrap()
        .chunks(n_vocab)
        .map(<[f32]>::to_vec)
        .collect();
    for k in 0..STEPS {
        rows.push(session.eval(&[forced(s, k, n_vocab)]).unwrap());
    }
    rows
}

/// Each compared position's NMSE, checked against the bounds when the run ends.
#[derive(Default)]
struct Errors(Vec<(usize, usize, f64)>);

impl Errors {
    fn push(&mut self, s: usize, pos: usize, got: &[f32], want: &[f32]) {
        self.0.push((s, pos, nmse(got, want)));
    }

    fn check(&self, label: &str, quantized: bool) {
        let bound = if quantized {
            BATCH_NMSE_FLIP
        } else {
            BATCH_NMSE
        };
        for &(s, pos, e) in &self.0 {
            assert!(
                e <= bound,
                "{label}: sequence {s} position {pos}: NMSE {e:.3e} against the sequence \
                 alone (bound {bound:e})"
            );
        }
        let close = self.0.iter().filter(|r| r.2 <= BATCH_NMSE).count();
        assert!(
            close * 10 >= self.0.len() * 9,
            "{label}: only {close} of {} positions within {BATCH_NMSE:e}",
            self.0.len()
        );
    }
}

/// Continuous batching: sequences 0–3 start with their prompts; the next step decodes them while
/// sequences 4–7 join with theirs; then every sequence decodes together, sequence 1 leaves and
/// a new sequence 1 starts in the cells it freed. Every logit of every position asked for is
/// compared with the sequence run alone.
fn check_batched(label: &str, model: &LlamaModel, mode: SplitMode) {
    let n_vocab = model.config().n_vocab;
    let prompts = prompts(n_vocab);
    let mut single = open(model, mode);
    let want: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .enumerate()
        .map(|(s, p)| alone(&mut single, p, s, n_vocab))
        .collect();
    drop(single);

    let mut errors = Errors::default();
    let mut session = open(model, mode);
    // Where each sequence stands: its next decode step (None while its prompt is pending).
    let mut next_step: Vec<Option<usize>> = vec![None; 8];
    let mut batch = Batch::new();
    let mut run = |session: &mut Session, batch: &Batch, next_step: &mut Vec<Option<usize>>| {
        let out = session
            .decode(batch)
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        for (i, t) in batch.tokens().iter().enumerate() {
            let s = t.seq as usize;
            assert_eq!(out.get(i).is_some(), t.logits, "{label}: token {i}");
            if let Some(got) = out.get(i) {
                errors.push(s, t.pos, got, &want[s][t.pos]);
            }
        }
        for t in batch.tokens() {
            let s = t.seq as usize;
            next_step[s] = Some((t.pos + 1).saturating_sub(prompts[s].len()));
        }
    };
    // Step 1: four prompts, every position's logits.
    for (s, p) in prompts.iter().enumerate().take(4) {
        for (i, &tok) in p.iter().enumerate() {
            batch.add(tok, i, s as SeqId, true);
        }
    }
    run(&mut session, &batch, &mut next_step);
    // Step 2: 0–3 decode, 4–7 join (logits of their last prompt token only).
    batch.clear();
    for (s, p) in prompts.iter().enumerate().take(4) {
        batch.add(forced(s, 0, n_vocab), p.len(), s as SeqId, true);
    }
    for (s, p) in prompts.iter().enumerate().skip(4) {
        batch.add_sequence(s as SeqId, 0, p);
    }
    run(&mut session, &batch, &mut next_step);
    // Steps 3–4: all decode until every sequence has taken its forced tokens.
    while next_step.iter().any(|k| k.is_none_or(|k| k < STEPS)) {
        batch.clear();
        for (s, k) in next_step.iter().enumerate() {
            if let Some(k) = k.filter(|&k| k < STEPS) {
                let pos = prompts[s].len() + k;
                batch.add(forced(s, k, n_vocab), pos, s as SeqId, true);
            }
        }
        run(&mut session, &batch, &mut next_step);
    }
    // Sequence 1 leaves; a new sequence 1 (sequence 6's prompt) takes its cells while the
    // others hold theirs.
    let used = session.cells_used();
    session.seq_remove(Some(1), 0, usize::MAX).unwrap();
    assert_eq!(session.cells_used(), used - prompts[1].len() - STEPS);
    assert_eq!(session.seq_next_pos(1).unwrap(), 0);
    batch.clear();
    for (i, &tok) in prompts[6].iter().enumerate() {
        batch.add(tok, i, 1, true);
    }
    let out = session.decode(&batch).unwrap();
    for (i, t) in batch.tokens().iter().enumerate() {
        errors.push(1, t.pos, out.get(i).unwrap(), &want[6][i]);
    }
    let quantized = model.config().weight_dtype != tessera::DType::F32
        || model.cache_types() != KvCacheTypes::default();
    errors.check(label, quantized);
    assert_eq!(
        session.cells_used(),
        used - prompts[1].len() - STEPS + prompts[6].len()
    );
}

#[test]
fn batched_sequences_match_each_sequence_alone_in_every_split_mode() {
    // A dense llama with Q8_0 weights; Gemma 3 for its sliding window (a window of its own per
    // sequence) and soft-capping; a mixture of experts for the expert split.
    for (name, model) in models(&[
        "llama-q8_0-gqa",
        "llama-f32-gqa",
        "gemma3-f32-gqa",
        "qwen3moe-q8_0-gqa",
        "qwen3moe-f32-gqa",
    ]) {
        let modes: &[SplitMode] = if model.config().is_moe() {
            &[SplitMode::None, SplitMode::Expert]
        } else {
            &[SplitMode::None, SplitMode::Layer, SplitMode::Tensor]
        };
        for &mode in modes {
            check_batched(&format!("{name} {mode}"), &model, mode);
        }
    }
}

/// Quantized caches hold their cells the same way: K as q8_0 and V as q4_0 (rotated, as
/// llama.cpp's), each sequence of the batch against itself alone with those caches.
#[test]
fn batched_sequences_with_quantized_caches_match_each_sequence_alone() {
    let (name, model) = models(&["llama-f32-gqa"]).remove(0);
    let model = model
        .with_cache_types(KvCacheTypes::parse("q8_0", "q4_0").unwrap())
        .unwrap();
    // Rounded queries and cache rows: the quantized-weights bound.
    check_batched(&format!("{name} q8_0/q4_0"), &model, SplitMode::None);
}

/// A prefix shared with [`Session::seq_copy`] is read by both sequences and evaluated once.
#[test]
fn forked_prefix_is_not_evaluated_again() {
    let (_, model) = models(&["llama-q8_0-gqa"]).remove(0);
    let n_vocab = model.config().n_vocab;
    let prefix: Vec<i32> = (0..12).map(|i| (i * 29 + 3) % n_vocab as i32).collect();
    let (a, b) = (7, 300 % n_vocab as i32);
    let mut single = open(&model, SplitMode::None);
    let mut want = Vec::new();
    for tok in [a, b] {
        single.reset();
        single.eval(&prefix).unwrap();
        want.push(single.eval(&[tok]).unwrap());
    }

    let mut s = open(&model, SplitMode::None);
    s.decode(Batch::new().add_sequence(0, 0, &prefix)).unwrap();
    s.seq_copy(0, 1, 0, usize::MAX).unwrap();
    s.seq_copy(0, 2, 0, 4).unwrap();
    assert_eq!(s.cells_used(), prefix.len(), "a fork copies no cell");
    assert_eq!(s.seq_next_pos(1).unwrap(), prefix.len());
    assert_eq!(s.seq_next_pos(2).unwrap(), 4);
    let mut batch = Batch::new();
    batch
        .add(a, prefix.len(), 0, true)
        .add(b, prefix.len(), 1, true);
    let out = s.decode(&batch).unwrap();
    assert_eq!(
        s.tokens_evaluated(),
        prefix.len() as u64 + 2,
        "the forked prefix was evaluated again"
    );
    let mut errors = Errors::default();
    errors.push(0, prefix.len(), out.get(0).unwrap(), &want[0]);
    errors.push(1, prefix.len(), out.get(1).unwrap(), &want[1]);
    errors.check("fork", true);
    // Keeping sequence 1 frees what only 0 and 2 held, and the shared prefix stays.
    s.seq_keep(1).unwrap();
    assert_eq!(s.sequences(), vec![1]);
    assert_eq!(s.cells_used(), prefix.len() + 1);
}

/// An unknown sequence id, a position gap, a batch larger than the free cells, a token outside
/// the vocabulary: each a typed error, the cache as it was (the next step's logits equal a
/// session that never saw the bad batch).
#[test]
fn bad_batches_are_typed_errors_and_leave_the_cache_unchanged() {
    let (_, model) = models(&["llama-q8_0-gqa"]).remove(0);
    let c = model.config();
    let opts = SessionOptions::default().with_max_sequences(4);
    let cpu = registry().select("cpu:1").unwrap();
    let mut s = Session::open(&model, &cpu, &opts).unwrap();
    let mut clean = Session::open(&model, &cpu, &opts).unwrap();
    let prompt = [1, 2, 3];
    for x in [&mut s, &mut clean] {
        x.decode(
            Batch::new()
                .add_sequence(0, 0, &prompt)
                .add_sequence(2, 0, &prompt[..2]),
        )
        .unwrap();
    }
    let before = (s.sequences(), s.cells_used(), s.n_past());
    let big: Vec<i32> = vec![1; c.n_ctx];
    let cases: Vec<(Batch, &str)> = vec![
        (
            Batch::new().add(1, 0, 4, true).clone(),
            "unknown sequence id 4",
        ),
        (
            Batch::new().add(1, 3, 0, true).add(1, 5, 0, true).clone(),
            "continues at position 4, not 5",
        ),
        (
            Batch::new().add(1, 2, 2, true).add(1, 4, 1, true).clone(),
            "at position 0, not 4",
        ),
        (
            Batch::new().add_sequence(1, 0, &big).clone(),
            "needs as many free cache cells",
        ),
        (
            Batch::new()
                .add(1, 3, 0, true)
                .add(c.n_vocab as i32, 2, 2, true)
                .clone(),
            "outside the vocabulary",
        ),
        (Batch::new(), "no tokens"),
    ];
    for (batch, want) in &cases {
        let e = s.decode(batch).unwrap_err();
        assert!(
            matches!(e, tessera::Error::InvalidArgument(_)) && e.to_string().contains(want),
            "{e} (wanted '{want}')"
        );
        assert_eq!(
            (s.sequences(), s.cells_used(), s.n_past()),
            before,
            "{want}"
        );
    }
    assert!(s.seq_copy(0, 9, 0, 1).is_err() && s.seq_keep(4).is_err());
    assert!(
        s.seq_copy(0, 2, 0, 3)
            .unwrap_err()
            .to_string()
            .contains("already holds")
    );
    assert!(
        SessionOptions::default()
            .with_max_sequences(0)
            .max_sequences
            == 0
            && Session::open(
                &model,
                &cpu,
                &SessionOptions::default().with_max_sequences(0)
            )
            .is_err()
    );
    // The cache still continues both sequences exactly as a session that saw no bad batch.
    let mut next = Batch::new();
    next.add(9, 3, 0, true).add(10, 2, 2, true);
    let (got, want) = (s.decode(&next).unwrap(), clean.decode(&next).unwrap());
    assert_eq!(got.as_slice(), want.as_slice());
}

/// llama.cpp's record of eight sequences in one unified cache (`llama_reference --batch`):
/// the prompts, the tokens fed, and every row with llama.cpp's own spreads.
struct BatchReference {
    prompts: Vec<Vec<i32>>,
    /// Per decode step, (sequence, position, token) for every sequence.
    feeds: Vec<Vec<(SeqId, usize, i32)>>,
    /// (sequence, position, fa_nmse, solo_nmse, values) in the recorded order.
    rows: Vec<(SeqId, usize, f64, f64, Vec<f32>)>,
}

fn parse_batch_reference(text: &str) -> BatchReference {
    let mut r = BatchReference {
        prompts: Vec::new(),
        feeds: Vec::new(),
        rows: Vec::new(),
    };
    let mut last_was_row = true;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let num = |s: Option<&str>| s.unwrap().parse::<usize>().unwrap();
        match f.next() {
            Some("prompt") => {
                f.next();
                r.prompts.push(f.map(|t| t.parse().unwrap()).collect());
            }
            Some("feed") => {
                if last_was_row {
                    r.feeds.push(Vec::new());
                }
                last_was_row = false;
                let (s, p, t) = (
                    num(f.next()),
                    num(f.next()),
                    f.next().unwrap().parse().unwrap(),
                );
                r.feeds.last_mut().unwrap().push((s as SeqId, p, t));
            }
            Some("row") => {
                last_was_row = true;
                let (s, p) = (num(f.next()), num(f.next()));
                let val =
                    |kv: Option<&str>| kv.unwrap().split('=').nth(1).unwrap().parse().unwrap();
                let (fa, solo) = (val(f.next()), val(f.next()));
                r.rows.push((
                    s as SeqId,
                    p,
                    fa,
                    solo,
                    f.map(|v| v.parse().unwrap()).collect(),
                ));
            }
            _ => {}
        }
    }
    r
}

/// Tessera against llama.cpp on the same batches: every prompt position of eight sequences in
/// one step, then three steps of one token per sequence, in every split mode. The reference
/// suite's criterion for F32 files: NMSE ≤ 1e-5 at every row (llama.cpp's own flash-attention
/// on/off spread is recorded beside each row, and its batched-vs-alone spread is checked to be
/// far below that bound, so the bound is about attention arithmetic, not batching).
#[test]
fn batches_match_llama_cpp_in_every_split_mode() {
    use crate::tests_reference::F32_NMSE;
    for (name, model) in models(&["llama-f32-gqa", "gemma3-f32-gqa", "qwen3moe-f32-gqa"]) {
        let r = batch_reference(&name);
        assert_eq!(r.prompts.len(), 8, "{name}");
        assert!(
            r.rows.iter().all(|row| row.3 < F32_NMSE / 100.0),
            "{name}: llama.cpp's batch spread"
        );
        let modes: &[SplitMode] = if model.config().is_moe() {
            &[SplitMode::None, SplitMode::Layer, SplitMode::Expert]
        } else {
            &[SplitMode::None, SplitMode::Layer, SplitMode::Tensor]
        };
        for &mode in modes {
            let label = format!("{name} {mode}");
            check_batch_reference(&label, &mut open(&model, mode), &r);
        }
    }
}

/// Runs `r`'s batches on `s` and holds every row to the reference suite's F32 bound.
fn check_batch_reference(label: &str, s: &mut Session, r: &BatchReference) {
    use crate::tests_reference::F32_NMSE;
    let mut rows = Vec::new();
    let mut batch = Batch::new();
    for (seq, p) in r.prompts.iter().enumerate() {
        for (i, &t) in p.iter().enumerate() {
            batch.add(t, i, seq as SeqId, true);
        }
    }
    let mut steps = vec![batch];
    for feed in &r.feeds {
        let mut b = Batch::new();
        for &(seq, pos, t) in feed {
            b.add(t, pos, seq, true);
        }
        steps.push(b);
    }
    for b in &steps {
        let out = s.decode(b).unwrap_or_else(|e| panic!("{label}: {e}"));
        for (i, t) in b.tokens().iter().enumerate() {
            rows.push((t.seq, t.pos, out.get(i).unwrap().to_vec()));
        }
    }
    assert_eq!(rows.len(), r.rows.len(), "{label}: rows");
    let mut worst = 0f64;
    for ((seq, pos, got), (rs, rp, _, _, want)) in rows.iter().zip(&r.rows) {
        assert_eq!((seq, pos), (rs, rp), "{label}: row order");
        let e = nmse(got, want);
        worst = worst.max(e);
        assert!(
            e <= F32_NMSE,
            "{label}: sequence {seq} position {pos}: NMSE {e:.3e} against llama.cpp (bound \
             {F32_NMSE:e})"
        );
    }
    eprintln!(
        "{label}: {} rows, worst NMSE {worst:.2e} against llama.cpp",
        rows.len()
    );
}

/// The llama.cpp batch record of `name` (from `TESSERA_REFERENCE_DIR` when set).
fn batch_reference(name: &str) -> BatchReference {
    let dir = std::env::var("TESSERA_REFERENCE_DIR").unwrap_or_else(|_| {
        format!(
            "{}/../tests/reference/synthetic",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let path = format!("{dir}/batch/{name}.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run tests/reference/make_references.sh)"));
    parse_batch_reference(&text)
}

/// The same batches on the GPU backends compiled in, whole on one device (SYCL's OpenCL CPU
/// device and lavapipe in CI): each absent backend prints why it is skipped, or fails under
/// `TESSERA_REQUIRE` naming it.
#[cfg(any(feature = "sycl", feature = "vulkan"))]
#[test]
fn gpu_backends_match_llama_cpp_on_batches() {
    let required = std::env::var("TESSERA_REQUIRE").unwrap_or_default();
    let mut kinds = Vec::new();
    if cfg!(feature = "sycl") {
        kinds.push("sycl");
    }
    if cfg!(feature = "vulkan") {
        kinds.push("vulkan");
    }
    for kind in kinds {
        let devs = match registry().select(&format!("{kind}:1")) {
            Ok(d) if !d.is_empty() => d,
            other => {
                let why = other
                    .err()
                    .map_or("no device".to_string(), |e| e.to_string());
                assert!(
                    !required.split(',').any(|b| b.trim() == kind),
                    "TESSERA_REQUIRE={kind}: {why}"
                );
                eprintln!("skipped {kind}: {why}");
                continue;
            }
        };
        for (name, model) in models(&["llama-f32-gqa", "gemma3-f32-gqa"]) {
            let mut s = Session::builder(&model).devices(&devs).build().unwrap();
            check_batch_reference(&format!("{name} {kind}"), &mut s, &batch_reference(&name));
        }
    }
}
