//! `tessera test-tp`: the tensor-parallel equivalence check. A small llama model (F32 and Q8_0
//! weights) runs unsplit on the first of the chosen devices and split over all of them (the meta
//! device); the logits of a prompt, of two decode steps, of the prompt's last token alone and of
//! a batch of three sequences (prompts, then a token each) are compared by NMSE. The split is held to [`split_tolerance`] against the same backend unsplit;
//! the backend's difference from the CPU backend is reported separately, against that backend's
//! own tolerance.
//!
//! With `--reference FILE -m MODEL` it runs the reference suite's check instead: the model, split
//! over the chosen devices (or across MPI ranks with `--dist mpi`), is teacher-forced on
//! llama.cpp's recorded tokens and its logits are judged against llama.cpp's by the suite's rule
//! ([`tessera_model::recorded::Recording::check`]).

use anyhow::Context as _;
use std::sync::Arc;
use tessera::{DType, Device, registry};
use tessera_model::ExpertSplit;
use tessera_model::{
    Arch, Batch, LlamaConfig, LlamaModel, Outputs, Session, Split, SplitMode, nmse,
};

const SEED: u64 = 0x7e57;
const PROMPT: [i32; 12] = [1, 17, 200, 3, 255, 9, 64, 128, 31, 32, 33, 7];

/// NMSE bound of a split against the same backend unsplit for `dtype` weights: only the order
/// of partial sums differs (measured 0–1e-10 on the CPU and SYCL devices); quantized weights get
/// 1e-5 because a partial sum at a rounding boundary can move a quantized activation one step.
pub fn split_tolerance(dtype: DType) -> f64 {
    if dtype.is_quantized() { 1e-5 } else { 1e-6 }
}

/// NMSE bound of a backend (unsplit) against the CPU backend for `dtype` weights: F32 agrees to
/// float rounding; with quantized weights the CPU quantizes activations to Q8_0 / Q8_K as ggml
/// does while the GPU kernels (CUDA, HIP, SYCL) multiply f32 activations (measured 2e-4 on SYCL).
pub fn backend_tolerance(dtype: DType) -> f64 {
    if dtype.is_quantized() { 1e-3 } else { 1e-6 }
}

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

/// How the split under test is made.
pub struct TpArgs<'a> {
    /// Devices of the meta device (this rank's, under `--dist`).
    pub devices: &'a [Arc<dyn Device>],
    /// Split ratios, one per device of every rank (empty: even).
    pub ratios: &'a [f32],
    /// The generic all-reduce even where the backend has its own.
    pub generic: bool,
    /// `tensor` or `expert`.
    pub mode: SplitMode,
    /// KV cache types.
    pub cache: tessera_model::KvCacheTypes,
    /// The MPI job (or a job of one process).
    pub job: &'a super::dist::Job,
}

impl TpArgs<'_> {
    /// A session of `model` split over the devices (across the job's ranks under `--dist`).
    fn split(&self, model: &LlamaModel) -> anyhow::Result<Session> {
        let experts = self.mode.expert_split();
        let meta = match self.job.comm() {
            Some(comm) => model.distributed_meta_device(self.devices, comm, self.ratios, experts),
            None => model.meta_device_with(self.devices, self.ratios, experts),
        }
        .context("making the meta device")?
        .with_vendor_comm(!self.generic);
        Session::builder(model)
            .split(Split::Meta(meta))
            .build()
            .context("splitting the model")
    }
}

/// Runs the check (against llama.cpp's recording with `reference`, else the tiny model's split
/// against its unsplit run); prints a table and returns whether every output, on every rank,
/// is within its tolerance.
///
/// # Errors
/// Device selection, split and compute errors; see also [`run_reference`].
pub fn run(args: &TpArgs<'_>, reference: Option<&ReferenceRun<'_>>) -> anyhow::Result<bool> {
    if !args.mode.is_tensor_parallel() {
        anyhow::bail!(
            "test-tp checks the meta device: --split-mode tensor or expert, not {}",
            args.mode.name()
        );
    }
    match reference {
        Some(r) => run_reference(args, r),
        None => run_tiny(args),
    }
}

fn run_tiny(args: &TpArgs<'_>) -> anyhow::Result<bool> {
    let TpArgs {
        devices,
        ratios,
        mode,
        cache,
        job,
        ..
    } = *args;
    // Under --dist every rank checks its own copy of the logits; rank 0 prints.
    let root = job.is_root();
    macro_rules! say {
        ($($t:tt)*) => { if root { println!($($t)*); } };
    }
    let names: Vec<String> = devices
        .iter()
        .map(|d| {
            if job.size() > 1 {
                format!("r{}/{}", job.rank(), d.name())
            } else {
                d.name().to_string()
            }
        })
        .collect();
    let experts = mode.expert_split();
    say!(
        "{}-parallel check on {} ({} devices{}, ratios {}), {}",
        mode.name(),
        names.join(","),
        devices.len(),
        if job.size() > 1 {
            format!(" on rank 0 of {} ranks", job.size())
        } else {
            String::new()
        },
        if ratios.is_empty() {
            "even".to_string()
        } else {
            format!("{ratios:?}")
        },
        if experts == ExpertSplit::Expert {
            "qwen3moe tiny model (8 experts, 2 used)"
        } else {
            "llama tiny model"
        }
    );
    if !cache.is_default() {
        say!("KV caches: {cache} (heads of 32)");
    }
    let mut ok = true;
    let mut path = String::new();
    let mut described = String::new();
    let first = devices
        .first()
        .cloned()
        .context("test-tp needs at least one device")?;
    // By backend, not device type: the SYCL OpenCL device is a CPU too, with other kernels.
    let on_cpu = first.backend_name() == "cpu";
    for dtype in [DType::F32, DType::Q8_0] {
        let base = match experts {
            ExpertSplit::Expert => LlamaConfig::tiny_moe(Arch::Qwen3Moe, 8, 2, 64),
            _ => LlamaConfig::tiny(),
        };
        let config = LlamaConfig {
            weight_dtype: dtype,
            n_layer: 3,
            ..base
        };
        // Block-type caches need heads of whole 32-element blocks (the tiny model's are 16).
        let config = if cache.is_default() {
            config
        } else {
            LlamaConfig {
                head_dim: 32,
                n_rot: 32,
                ..config
            }
        };
        let model = LlamaModel::new(config, SEED)?.with_cache_types(cache)?;
        let mut unsplit = Session::builder(&model)
            .devices(std::slice::from_ref(&first))
            .build()?;
        let mut cpu = if on_cpu {
            None
        } else {
            let cpu = registry().select("cpu:1")?;
            Some(Session::builder(&model).devices(&cpu).build()?)
        };
        let mut tp = args.split(&model)?;
        path = tp_report(&tp)?.comm_path().to_string();
        for (output, step) in steps() {
            // The last-token graph (a view of the final hidden state) as `run` and `bench` use
            // it, and the batches of several sequences, each on a fresh cache.
            if matches!(step, Step::Eval(_, Outputs::Last) | Step::Batch(_, true)) {
                unsplit.reset();
                tp.reset();
                if let Some(cpu) = cpu.as_mut() {
                    cpu.reset();
                }
            }
            let want = step.run(&mut unsplit)?;
            let got = step.run(&mut tp)?;
            // Devices of several backends (CPU and VK0): the split holds what each backend
            // computes for its slice, so it is held to the backends' tolerance.
            let mixed = devices
                .iter()
                .any(|d| d.backend_name() != first.backend_name());
            let mut rows = vec![Row {
                dtype,
                output: format!(
                    "{output}, split{} vs {}",
                    if mixed { " (mixed)" } else { "" },
                    first.name()
                ),
                nmse: nmse(&got, &want),
                tolerance: if mixed {
                    backend_tolerance(dtype)
                } else {
                    split_tolerance(dtype)
                },
            }];
            if let Some(cpu) = cpu.as_mut() {
                rows.push(Row {
                    dtype,
                    output: format!("{output}, {} vs CPU", first.name()),
                    nmse: nmse(&want, &step.run(cpu)?),
                    tolerance: backend_tolerance(dtype),
                });
            }
            for row in rows {
                let pass = row.nmse <= row.tolerance;
                ok &= pass;
                say!(
                    "  {:<5} {:<64} NMSE {:>10.3e} (≤ {:.0e})  {}",
                    row.dtype.to_string(),
                    row.output,
                    row.nmse,
                    row.tolerance,
                    if pass { "ok" } else { "FAIL" }
                );
            }
        }
        let report = tp_report(&tp)?;
        described = report.describe();
        let per_dev: Vec<String> = report
            .weight_bytes_per_device()
            .iter()
            .map(|b| format!("{:.1}", *b as f64 / 1024.0))
            .collect();
        let st = report.stats();
        say!(
            "  {:<5} weights+caches per device [{}] KiB; {} all-reduces{}",
            dtype.to_string(),
            per_dev.join(", "),
            st.vendor_reduces + st.generic_reduces + st.dist_reduces,
            if job.size() > 1 {
                format!(" ({} across ranks)", st.dist_reduces)
            } else {
                String::new()
            }
        );
    }
    say!("all-reduce path: {path}");
    if !described.is_empty() {
        say!("{described}");
    }
    verdict(ok, job)
}

/// Every rank compared its own logits: the job passes when all did. Rank 0 prints the verdict.
fn verdict(mut ok: bool, job: &super::dist::Job) -> anyhow::Result<bool> {
    if let Some(comm) = job.comm() {
        let all = comm.allgather(&[u8::from(ok)], &vec![1; comm.size()], "test-tp verdicts")?;
        let failed: Vec<usize> = (0..all.len()).filter(|&r| all[r] == 0).collect();
        if !failed.is_empty() && job.is_root() {
            println!("ranks {failed:?} saw outputs outside their tolerance");
        }
        ok = failed.is_empty();
    }
    if job.is_root() {
        println!("{}", if ok { "PASS" } else { "FAIL" });
    }
    Ok(ok)
}

/// What `--reference` checks: a GGUF model and llama.cpp's recording of it.
pub struct ReferenceRun<'a> {
    /// The GGUF file llama.cpp ran.
    pub model: &'a std::path::Path,
    /// Its recording (`tests/reference/`).
    pub recording: &'a std::path::Path,
}

/// The reference suite's check of `run.model` split over `devices` (or across the job's ranks):
/// teacher-forced on the recording's tokens, judged by the suite's rule for the recording (its
/// bound for quantized caches, or the F16 caches' mean bound and, with F32 weights, the per-row
/// one), argmax included. Prints the figures; returns whether every rank passed.
///
/// # Errors
/// An unreadable model or recording, a recording made with other cache kinds than `cache`,
/// device, split and compute errors.
fn run_reference(args: &TpArgs<'_>, run: &ReferenceRun<'_>) -> anyhow::Result<bool> {
    use tessera_model::recorded::{Recording, Rule};
    let TpArgs {
        devices,
        mode,
        cache,
        job,
        ..
    } = *args;
    let text = std::fs::read_to_string(run.recording)
        .with_context(|| format!("reading {}", run.recording.display()))?;
    let recording =
        Recording::parse(&text).with_context(|| format!("reading {}", run.recording.display()))?;
    // The suite names a recording with caches `NAME.K-V.txt`: a run with other types would be
    // judged against another cache's rounding.
    let named = run
        .recording
        .file_stem()
        .and_then(|stem| stem.to_str())
        .and_then(|stem| stem.rsplit_once('.'))
        .and_then(|(_, pair)| pair.split_once('-'))
        .and_then(|(k, v)| tessera_model::KvCacheTypes::parse(k, v).ok());
    if let Some(named) = named.filter(|n| *n != cache) {
        anyhow::bail!(
            "{} holds llama.cpp's logits with KV caches {named}, and this run has {cache}: pass \
             --cache-type-k/--cache-type-v to match",
            run.recording.display()
        );
    }
    if recording.typed == cache.is_default() {
        anyhow::bail!(
            "{} was recorded with {} KV caches but this run has {cache}: pass the recording's \
             --cache-type-k/--cache-type-v",
            run.recording.display(),
            if recording.typed { "quantized" } else { "F16" },
        );
    }
    let file = tessera::gguf::GgufFile::open(run.model)
        .with_context(|| format!("opening {}", run.model.display()))?;
    let n_ctx = recording.rows.len().next_multiple_of(tessera_model::KV_PAD);
    let model = LlamaModel::from_gguf(Arc::new(file), Some(n_ctx))?.with_cache_types(cache)?;
    let mut tp = args.split(&model)?;
    let rows = recording.teacher_forced(&mut |t| tp.eval(t))?;
    let rule = if recording.typed {
        Rule::Kv {
            bound: recording.kv_bound(cache),
        }
    } else {
        Rule::Plain {
            f32_weights: model.config().weight_dtype == DType::F32,
            scale: tessera_model::recorded::tolerance_scale(model.config()),
        }
    };
    let check = recording.check(&rows, rule);
    if job.is_root() {
        let report = tp_report(&tp)?;
        println!(
            "{}-parallel reference check of {} against llama.cpp ({}, {} positions{}) on {} \
             device{}{}",
            mode.name(),
            run.model.display(),
            run.recording.display(),
            rows.len(),
            if cache.is_default() {
                String::new()
            } else {
                format!(", KV caches {cache}")
            },
            devices.len(),
            if devices.len() == 1 { "" } else { "s" },
            if job.size() > 1 {
                format!(" per rank, {} ranks", job.size())
            } else {
                String::new()
            },
        );
        let (checked, agree) = check.argmax;
        println!(
            "  NMSE median {:.3e} mean {:.3e} worst {:.3e} (bound on the {} {:.3e}); argmax \
             {agree}/{checked} where llama.cpp leads by more than a near tie",
            check.median,
            check.mean,
            check.worst,
            if matches!(rule, Rule::Kv { .. }) {
                "median"
            } else {
                "mean"
            },
            check.bound,
        );
        for f in &check.failures {
            println!("  FAIL {f}");
        }
        println!("{}", report.describe());
    }
    verdict(check.passed(), job)
}

/// One compared step: tokens of sequence 0 with the outputs asked for, or a batch of several
/// sequences (`true`: on a fresh cache).
enum Step {
    Eval(Vec<i32>, Outputs),
    Batch(Batch, bool),
}

impl Step {
    /// The step's logits on `s`.
    fn run(&self, s: &mut Session) -> tessera::Result<Vec<f32>> {
        match self {
            Step::Eval(tokens, outputs) => s.eval_outputs(tokens, *outputs),
            Step::Batch(batch, _) => Ok(s.decode(batch)?.as_slice().to_vec()),
        }
    }
}

/// The prompt with every row's logits, two decode steps, the prompt's last row alone; then
/// three sequences of different lengths prompted in one batch (every row's logits: each sees
/// only its own cells) and one token more each.
fn steps() -> Vec<(String, Step)> {
    let mut prompts = Batch::new();
    for (seq, part) in [&PROMPT[..], &PROMPT[3..8], &PROMPT[..2]]
        .iter()
        .enumerate()
    {
        for (pos, &t) in part.iter().enumerate() {
            prompts.add(t, pos, seq as u32, true);
        }
    }
    let mut next = Batch::new();
    next.add(5, PROMPT.len(), 0, true)
        .add(6, 5, 1, true)
        .add(7, 2, 2, true);
    vec![
        (
            format!("prompt logits ({} tokens)", PROMPT.len()),
            Step::Eval(PROMPT.to_vec(), Outputs::All),
        ),
        ("decode 1 logits".into(), Step::Eval(vec![5], Outputs::All)),
        ("decode 2 logits".into(), Step::Eval(vec![6], Outputs::All)),
        (
            "prompt last-token logits".into(),
            Step::Eval(PROMPT.to_vec(), Outputs::Last),
        ),
        (
            format!("3 sequences' prompts, one batch ({} tokens)", prompts.len()),
            Step::Batch(prompts, true),
        ),
        (
            "3 sequences, one token each".into(),
            Step::Batch(next, false),
        ),
    ]
}

/// The tensor-parallel report of a session opened on a meta device.
fn tp_report(s: &Session) -> anyhow::Result<tessera_model::TensorParallel<'_>> {
    s.tensor_parallel()
        .context("the session has no tensor-parallel group")
}
