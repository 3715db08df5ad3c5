//! `tessera bench`: prompt processing and token generation speed of a synthetic llama model,
//! whole on one device and split by layers over several, in the style of llama-bench.

use super::inputs::Rng;
use super::session::{MIB, ModelPreset, device_names, devices_for, open_session, status};
use anyhow::Context as _;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;
use tessera::Device;
use tessera_model::{LlamaModel, Outputs, Session, SplitMode, TensorParallel, argmax, nmse};

/// Seed of the synthetic weights and of the prompt.
const SEED: u64 = 0x11a3a;
/// Token the generation test starts from (llama's BOS).
const BOS: i32 = 1;

/// Arguments of `tessera bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Split modes to run, comma-separated: none (whole model on the first device), layer
    /// (layers over all devices), tensor (every layer split over all devices: the meta device).
    #[arg(long, value_delimiter = ',', value_parser = super::args::split_mode, default_value = "none,layer,tensor")]
    pub split_mode: Vec<SplitMode>,
    /// Split ratios of the layer and tensor modes, one per device (default: even).
    #[arg(long, value_delimiter = ',', value_parser = super::args::ratio)]
    pub ratios: Vec<f32>,
    /// For tensor and expert: cut the devices into this many equal groups, each splitting its
    /// layers tensor-parallel, with the layers split between the groups.
    #[arg(long, default_value_t = 1, value_parser = super::args::count)]
    pub tp_groups: usize,
    /// Devices: comma-separated names, or KIND:N (default: CPU for none, cpu:2 for layer and
    /// tensor).
    #[arg(long)]
    pub devices: Option<String>,
    /// Prompt length of the pp test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 64)]
    pub n_prompt: usize,
    /// Tokens generated in the tg test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 32)]
    pub n_gen: usize,
    /// Tokens already in the cache when each test starts (llama-bench's depth): filled once,
    /// untimed, and kept while the tests run after it.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub n_depth: usize,
    #[command(flatten)]
    pub cache: super::session::CacheTypeArgs,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Threads in all, divided among the CPU devices as llama.cpp's -t (default: one per core
    /// of each device).
    #[arg(short = 't', long, value_parser = super::args::threads)]
    pub threads: Option<usize>,
    /// Synthetic model to run when no file is given.
    #[arg(
        long = "preset",
        alias = "model",
        value_enum,
        default_value = "synthetic-100m"
    )]
    pub model: ModelPreset,
    /// Weight type of the synthetic model (default: the preset's, Q8_0), e.g. q4_0 or q4_k.
    #[arg(long, value_parser = super::args::dtype)]
    pub weight_type: Option<tessera::DType>,
    /// A GGUF model file (an architecture `tessera run --help` lists) instead of the synthetic
    /// model.
    #[arg(short = 'm', long = "model-file")]
    pub model_file: Option<std::path::PathBuf>,
    /// Measure this machine's read bandwidth first (`tessera bench-mem`'s best loop at the
    /// bench's thread count) and print each tg row's GB/s as a fraction of it.
    #[arg(long)]
    pub read_bw: bool,
    #[command(flatten)]
    pub dist: super::dist::DistArgs,
}

/// What one split mode measured, and the last-token logits kept to compare modes (empty when
/// there is nothing to compare with).
struct ModeResult {
    mode: SplitMode,
    /// The split-mode cell of the table: the mode, and for `expert` the layers whose experts
    /// split whole (EP) or along `n_ff_exp` (TP).
    label: String,
    devices: Vec<Arc<dyn Device>>,
    pp: Vec<f64>,
    tg: Vec<f64>,
    pp_logits: Vec<f32>,
    tg_logits: Vec<Vec<f32>>,
    tg_tokens: Vec<i32>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Brings the cache to exactly the `depth` tokens (evaluated once, then kept: later calls
/// forget what came after them).
fn to_depth(s: &mut Session, depth: &[i32]) -> anyhow::Result<()> {
    if depth.is_empty() {
        s.reset();
    } else if s.n_past() >= depth.len() && s.n_past() > 0 {
        s.truncate(depth.len())?;
    } else {
        s.reset();
        s.eval_last(depth)?;
    }
    Ok(())
}

/// Runs the pp test: `prompt` in one graph after the `depth` tokens, with logits for the last
/// token only (what generation samples from, as llama-bench). Returns tokens/s and those logits.
fn run_pp(s: &mut Session, depth: &[i32], prompt: &[i32]) -> anyhow::Result<(f64, Vec<f32>)> {
    to_depth(s, depth)?;
    let t0 = Instant::now();
    let logits = s.eval_last(prompt)?;
    Ok((prompt.len() as f64 / t0.elapsed().as_secs_f64(), logits))
}

/// Steps of a tg run whose logits are kept for the comparison between split modes: enough to
/// show agreement, few enough that a large vocabulary (262144 floats a step) does not make the
/// comparison the benchmark's biggest memory user.
const COMPARED_STEPS: usize = 4;

/// Runs the tg test: `n` single-token greedy steps after the `depth` tokens, starting at BOS.
/// Returns tokens/s, the first [`COMPARED_STEPS`] steps' logits if `keep` (else none) and the
/// tokens fed.
fn run_tg(
    s: &mut Session,
    depth: &[i32],
    n: usize,
    keep: bool,
) -> anyhow::Result<(f64, Vec<Vec<f32>>, Vec<i32>)> {
    to_depth(s, depth)?;
    let mut steps = Vec::with_capacity(if keep { n.min(COMPARED_STEPS) } else { 0 });
    let (mut tok, mut fed) = (BOS, Vec::with_capacity(n));
    let mut logits = Vec::new();
    let t0 = Instant::now();
    for _ in 0..n {
        fed.push(tok);
        s.eval_outputs_into(&[tok], Outputs::Last, &mut logits)?;
        tok = i32::try_from(argmax(&logits)).context("token id overflows i32")?;
        if keep && steps.len() < COMPARED_STEPS {
            steps.push(logits.clone());
        }
    }
    Ok((n as f64 / t0.elapsed().as_secs_f64(), steps, fed))
}

/// Runs the tests of one split mode; `keep_logits` keeps the last repetition's logits for the
/// comparison against `none`.
fn run_mode(
    model: &LlamaModel,
    mode: SplitMode,
    args: &BenchArgs,
    depth: &[i32],
    prompt: &[i32],
    keep_logits: bool,
    job: &super::dist::Job,
) -> anyhow::Result<ModeResult> {
    let devices = devices_for(mode, args.devices.as_deref())?;
    let names = device_names(&devices);
    let tty = std::io::stderr().is_terminal() && job.is_root();
    let opts = super::session::Load::new(mode)
        .with_ratios(&args.ratios)
        .with_threads(args.threads)
        .with_comm(job.comm())
        .with_groups(if mode.is_tensor_parallel() {
            args.tp_groups
        } else {
            1
        });
    let mut session = open_session(model, &devices, opts)?;
    if let (Some(comm), Some(s)) = (job.comm(), session.tensor_parallel()) {
        report_ranks(comm.as_ref(), s)?;
    }

    // Warm-up (not timed): plans and allocates compute memory for both graph shapes.
    if !prompt.is_empty() {
        run_pp(&mut session, depth, prompt)?;
    }
    if !prompt.is_empty() && job.is_root() {
        let mib = |v: &[usize]| -> String {
            v.iter()
                .map(|b| format!("{:.2}", *b as f64 / MIB))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match session.tensor_parallel() {
            None => {
                let s = &session;
                let st = s.plan_stats(prompt.len(), Outputs::Last)?;
                eprintln!(
                    "compute memory of the pp{} graph: peak {:.2} MiB in one buffer vs {:.2} MiB for all {} intermediates \
                     (liveness bound {:.2} MiB); scheduler per device: [{}] MiB",
                    prompt.len(),
                    st.peak as f64 / MIB,
                    st.total_tensor_bytes as f64 / MIB,
                    st.tensors,
                    st.liveness_bound as f64 / MIB,
                    mib(&s.compute_bytes())
                );
            }
            Some(s) => eprintln!(
                "{} split over {names}: weights and caches per device [{}] MiB; compute memory \
                 of the pp{} graph per device [{}] MiB; {}",
                mode.name(),
                mib(&s.weight_bytes_per_device()),
                prompt.len(),
                mib(s.compute_bytes()),
                s.describe()
            ),
        }
    }
    if args.n_gen > 0 {
        run_tg(&mut session, depth, 1, false)?;
    }
    let label = match session.tensor_parallel() {
        Some(s) if mode == SplitMode::Expert => {
            let experts = s.expert_split_summary();
            if experts.is_empty() {
                mode.name().to_string()
            } else {
                format!("{} ({experts})", mode.name())
            }
        }
        _ => mode.name().to_string(),
    };
    let label = match (session.tensor_parallel(), job.size()) {
        (Some(s), ranks) if ranks > 1 => {
            let n = s.meta().devices().len();
            if n % ranks == 0 {
                format!("{label}, {ranks} ranks × {} dev", n / ranks)
            } else {
                format!("{label}, {ranks} ranks, {n} devs")
            }
        }
        _ => label,
    };
    let mut r = ModeResult {
        mode,
        label,
        devices: devices.clone(),
        pp: Vec::new(),
        tg: Vec::new(),
        pp_logits: Vec::new(),
        tg_logits: Vec::new(),
        tg_tokens: Vec::new(),
    };
    for rep in 0..args.repetitions {
        if tty {
            status(format_args!(
                "running {} on {names}: repetition {}/{}",
                mode.name(),
                rep + 1,
                args.repetitions
            ));
        }
        let keep = keep_logits && rep + 1 == args.repetitions;
        if !prompt.is_empty() {
            let (tps, logits) = run_pp(&mut session, depth, prompt)?;
            r.pp.push(tps);
            if keep {
                r.pp_logits = logits;
            }
        }
        if args.n_gen > 0 {
            let (tps, logits, fed) = run_tg(&mut session, depth, args.n_gen, keep)?;
            r.tg.push(tps);
            r.tg_logits = logits;
            r.tg_tokens = fed;
        }
    }
    if tty {
        eprintln!();
    }
    Ok(r)
}

fn backend_names(devices: &[Arc<dyn Device>]) -> String {
    let mut names: Vec<String> = Vec::new();
    for d in devices {
        let b = d.backend_name().to_uppercase();
        if !names.contains(&b) {
            names.push(b);
        }
    }
    names.join(",")
}

/// Runs `tessera bench` and prints the table and the cross-mode checks.
///
/// # Errors
/// Invalid arguments, device selection, loading and compute errors.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let job = super::dist::Job::start(
        &args.dist,
        &super::dist::fingerprint(args.model_file.as_deref())?,
    )?;
    job.finish(run_job(args, &job))
}

/// Each rank's memory after loading, printed by rank 0: what the rank's devices hold of the
/// weights and caches, and the process's resident memory (a collective: every rank calls it).
fn report_ranks(comm: &dyn tessera::comm::DistComm, s: TensorParallel<'_>) -> anyhow::Result<()> {
    let local: usize = s
        .weight_bytes_per_device()
        .iter()
        .enumerate()
        .filter(|(j, _)| s.meta().is_local(*j))
        .map(|(_, b)| *b)
        .sum();
    let (rss, anon) = super::dist::rss().unwrap_or((0, 0));
    let mine: Vec<u8> = [local as u64, rss, anon]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let all = comm.allgather(&mine, &vec![24; comm.size()], "memory report")?;
    if comm.rank() == 0 {
        for (r, c) in all.chunks_exact(24).enumerate() {
            let v = |i: usize| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            eprintln!(
                "rank {r}: weights and caches on its devices {:.1} MiB; resident {:.1} MiB \
                 (anonymous {:.1} MiB)",
                v(0) as f64 / MIB,
                v(1) as f64 / MIB,
                v(2) as f64 / MIB
            );
        }
    }
    Ok(())
}

fn run_job(args: &BenchArgs, job: &super::dist::Job) -> anyhow::Result<()> {
    if args.split_mode.is_empty() {
        anyhow::bail!("no split mode given (accepted: {})", SplitMode::ACCEPTED);
    }
    if args.repetitions == 0 {
        anyhow::bail!("-r must be at least 1");
    }
    let model = match &args.model_file {
        Some(path) => {
            let file = Arc::new(
                tessera::gguf::GgufFile::open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            );
            // The caches only need the depth and the longest test.
            let n_ctx = args.n_depth + args.n_prompt.max(args.n_gen).max(1);
            LlamaModel::from_gguf(file, Some(n_ctx))?
        }
        None => {
            let mut config = args.model.config();
            if let Some(t) = args.weight_type {
                config.weight_dtype = t;
            }
            for (flag, n) in [("-p", args.n_prompt), ("-n", args.n_gen)] {
                if args.n_depth + n > config.n_ctx {
                    anyhow::bail!(
                        "-d {} with {flag} {n} exceeds the model's context of {}",
                        args.n_depth,
                        config.n_ctx
                    );
                }
            }
            LlamaModel::new(config, SEED)?
        }
    };
    let model = model.with_cache_types(args.cache.types()?)?;
    // The read bandwidth first, while nothing else runs: a 1 GiB buffer, every loop.
    let read_bw = if args.read_bw && job.is_root() {
        let threads = args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let r =
            super::bench_mem::measure(&[threads], 1 << 30, std::time::Duration::from_millis(500))?;
        super::bench_mem::best_at(&r, threads)
            .cloned()
            .map(|b| (b, threads))
    } else {
        None
    };
    let c = model.config();
    let mut rng = Rng::new(SEED);
    let mut tokens = |n: usize| -> Vec<i32> {
        (0..n)
            .map(|_| ((rng.uniform() + 1.0) * 0.5 * c.n_vocab as f32) as i32)
            .map(|t| t.clamp(0, c.n_vocab as i32 - 1))
            .collect()
    };
    let prompt = tokens(args.n_prompt);
    let depth = tokens(args.n_depth);

    let mut modes: Vec<SplitMode> = Vec::new();
    for &m in &args.split_mode {
        if !modes.contains(&m) {
            modes.push(m);
        }
    }
    let compare = modes.len() > 1 && modes.contains(&SplitMode::None);
    let mut results = Vec::new();
    for &mode in &modes {
        results.push(run_mode(&model, mode, args, &depth, &prompt, compare, job)?);
    }
    if !job.is_root() {
        return Ok(());
    }

    let params = c.param_count() as f64;
    let label = match &args.model_file {
        Some(p) => format!(
            "{} {}",
            c.arch.name(),
            p.file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        ),
        None => format!(
            "synthetic-llama {} {:?}",
            match args.model {
                ModelPreset::Synthetic100m => "100M",
                ModelPreset::Synthetic1b => "1.1B",
                ModelPreset::Synthetic8b => "8.0B",
                ModelPreset::SyntheticMoe => "8x2 MoE",
                ModelPreset::Tiny => "tiny",
            },
            c.weight_dtype
        ),
    };
    let size = format!("{:.2} MiB", model.weight_bytes_total() as f64 / MIB);
    let params = format!("{:.2} M", params / 1e6);
    // The bytes a generated token reads (weights, and the cache at the tg test's mean depth)
    // and what that is per second: the columns after t/s, which parsers read by header.
    let tg_kv = args.n_depth + args.n_gen.div_ceil(2).max(1);
    let (w_bytes, kv_bytes) = model.decode_bytes_per_token(tg_kv);
    let token_bytes = (w_bytes + kv_bytes) as f64;
    println!(
        "| {:<26} | {:>10} | {:>9} | {:<7} | {:<16} | {:<24} | {:>6} | {:>6} | {:>12} | {:>20} | {:>9} | {:>8} |",
        "model",
        "size",
        "params",
        "backend",
        "devices",
        "split mode",
        "type_k",
        "type_v",
        "test",
        "t/s",
        "MiB/token",
        "GB/s"
    );
    println!(
        "| {:-<26} | {:->10} | {:->9} | {:-<7} | {:-<16} | {:-<24} | {:->6} | {:->6} | {:->12} | {:->20} | {:->9} | {:->8} |",
        "", "", "", "", "", "", "", "", "", "", "", ""
    );
    let kv = model.cache_types();
    // llama-bench's test names: `pp512`, `tg128 @ d4096`.
    let at = if args.n_depth > 0 {
        format!(" @ d{}", args.n_depth)
    } else {
        String::new()
    };
    let mut tg_rates = Vec::new();
    for r in &results {
        for (test, speeds, is_tg) in [
            (format!("pp{}{at}", args.n_prompt), &r.pp, false),
            (format!("tg{}{at}", args.n_gen), &r.tg, true),
        ] {
            if speeds.is_empty() {
                continue;
            }
            let (mean, sd) = mean_sd(speeds);
            // A prompt reads its weights once for all its tokens: no per-token figure.
            let (per_token, rate) = if is_tg {
                let gb_s = mean * token_bytes / 1e9;
                tg_rates.push((r.label.clone(), gb_s));
                (format!("{:.2}", token_bytes / MIB), format!("{gb_s:.2}"))
            } else {
                ("-".into(), "-".into())
            };
            println!(
                "| {:<26} | {:>10} | {:>9} | {:<7} | {:<16} | {:<24} | {:>6} | {:>6} | {:>12} | {:>20} | {:>9} | {:>8} |",
                label,
                size,
                params,
                backend_names(&r.devices),
                device_names(&r.devices),
                r.label,
                kv.k.name(),
                kv.v.name(),
                test,
                format!("{mean:.2} ± {sd:.2}"),
                per_token,
                rate
            );
        }
    }
    if !tg_rates.is_empty() {
        println!(
            "a generated token reads {:.2} MiB: weights {:.2} MiB, cache {:.2} MiB at {tg_kv} \
             positions (the tg test's mean)",
            token_bytes / MIB,
            w_bytes as f64 / MIB,
            kv_bytes as f64 / MIB
        );
    }
    if let Some((bw, threads)) = read_bw {
        for (mode, rate) in &tg_rates {
            println!(
                "{mode}: tg at {rate:.2} GB/s, {:.2} of the read bandwidth ({:.2} GB/s, {} at \
                 {threads} thread(s))",
                rate / bw.gb_s,
                bw.gb_s,
                bw.name
            );
        }
    }

    let reference = results.iter().find(|r| r.mode == SplitMode::None);
    for r in results.iter().filter(|r| r.mode != SplitMode::None) {
        let Some(base) = reference else {
            println!(
                "{} vs none: not checked (add `none` to --split-mode to compare)",
                r.mode.name()
            );
            continue;
        };
        let mut parts = Vec::new();
        if !r.pp_logits.is_empty() {
            parts.push(format!(
                "pp{} last-token logits NMSE {:.3e}",
                args.n_prompt,
                nmse(&r.pp_logits, &base.pp_logits)
            ));
        }
        if !r.tg_logits.is_empty() {
            let same = r
                .tg_tokens
                .iter()
                .zip(&base.tg_tokens)
                .take_while(|(a, b)| a == b)
                .count();
            // Logits are comparable while both runs were fed the same tokens; random synthetic
            // weights give near-ties, so greedy paths may part after a last-bit difference.
            let worst = r
                .tg_logits
                .iter()
                .zip(&base.tg_logits)
                .take(same)
                .map(|(a, b)| nmse(a, b))
                .fold(0.0f64, f64::max);
            parts.push(format!(
                "tg{} logits NMSE ≤ {:.3e} over the {} steps with the same history (of the first \
                 {COMPARED_STEPS} kept), greedy tokens {}/{} identical",
                args.n_gen,
                worst,
                same.min(r.tg_logits.len()),
                same,
                base.tg_tokens.len()
            ));
        }
        println!(
            "{} ({}) vs none ({}): {}",
            r.mode.name(),
            device_names(&r.devices),
            device_names(&base.devices),
            parts.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_deviation() {
        assert_eq!(mean_sd(&[]), (0.0, 0.0));
        assert_eq!(mean_sd(&[2.0]), (2.0, 0.0));
        let (m, s) = mean_sd(&[1.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12 && (s - 2f64.sqrt()).abs() < 1e-12);
    }
}
