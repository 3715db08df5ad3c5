//! `tessera soak`: many requests of random length on the synthetic model in each split mode,
//! watching the process's resident memory and open file descriptors (they must stay flat), and
//! checking sampled requests against a fresh session that runs only that request.

use super::session::{ModelPreset, device_names, devices_for, open_session};
use anyhow::Context as _;
use std::time::Instant;
use tessera_model::{LlamaModel, Outputs, Session, SplitMode, argmax};

/// Arguments of `tessera soak`.
#[derive(Clone, Debug, clap::Args)]
pub struct SoakArgs {
    /// Requests per split mode.
    #[arg(long, default_value_t = 2000, value_parser = super::args::count)]
    pub requests: usize,
    /// Split modes, run one after the other in this process.
    #[arg(long, value_delimiter = ',', value_parser = super::args::split_mode, default_value = "none,layer,tensor")]
    pub split_mode: Vec<SplitMode>,
    /// Devices of the layer and tensor modes (`none` uses the first).
    #[arg(long, default_value = "cpu:3")]
    pub devices: String,
    /// Split ratios of the layer and tensor modes, one per device.
    #[arg(long, value_delimiter = ',', value_parser = super::args::ratio, default_value = "2,1,1")]
    pub ratios: Vec<f32>,
    /// Synthetic model.
    #[arg(long, value_enum, default_value = "synthetic-100m")]
    pub preset: ModelPreset,
    /// Longest prompt of a request (lengths are uniform in 1..=this).
    #[arg(long, default_value_t = 32, value_parser = super::args::count)]
    pub max_prompt: usize,
    /// Most tokens a request generates (uniform in 1..=this, greedy).
    #[arg(long, default_value_t = 16, value_parser = super::args::count)]
    pub max_gen: usize,
    /// Requests compared against a fresh session (evenly spaced, first and last included).
    #[arg(long, default_value_t = 8)]
    pub compare: usize,
    /// Seed of the request lengths and prompt tokens.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Threads in all, divided among the CPU devices as llama.cpp's -t (default: one per core
    /// of each device).
    #[arg(short = 't', long, value_parser = super::args::threads)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub cache: super::session::CacheTypeArgs,
}

/// Resident set size of this process in bytes (`/proc/self/statm`).
fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .context("parsing /proc/self/statm")?;
    // The page size of every Linux target Tessera builds for; statm counts pages.
    Ok(pages * 4096)
}

/// Open file descriptors of this process (`/proc/self/fd`, less the one reading it).
fn open_fds() -> anyhow::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")
        .context("listing /proc/self/fd")?
        .count()
        .saturating_sub(1))
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    rss: u64,
    fds: usize,
}

fn sample() -> anyhow::Result<Sample> {
    Ok(Sample {
        rss: rss_bytes()?,
        fds: open_fds()?,
    })
}

/// One request: a prompt, then greedy generation.
#[derive(Clone, Debug)]
struct Request {
    prompt: Vec<i32>,
    n_gen: usize,
}

/// SplitMix64 for the request stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `1..=max`.
    fn len(&mut self, max: usize) -> usize {
        1 + (self.next() % max as u64) as usize
    }
}

fn requests(args: &SoakArgs, n_vocab: usize) -> Vec<Request> {
    let mut rng = Rng(args.seed);
    (0..args.requests)
        .map(|_| {
            let n = rng.len(args.max_prompt);
            let prompt = (0..n)
                .map(|_| (rng.next() % n_vocab as u64) as i32)
                .collect();
            Request {
                prompt,
                n_gen: rng.len(args.max_gen),
            }
        })
        .collect()
}

/// What a request produced: the generated tokens and the last step's logits.
struct Outcome {
    tokens: Vec<i32>,
    logits: Vec<f32>,
}

fn serve(s: &mut Session, r: &Request, logits: &mut Vec<f32>) -> anyhow::Result<Outcome> {
    s.reset();
    s.eval_outputs_into(&r.prompt, Outputs::Last, logits)?;
    let mut tokens = Vec::with_capacity(r.n_gen);
    for i in 0..r.n_gen {
        let next = i32::try_from(argmax(logits)).context("token id overflows i32")?;
        tokens.push(next);
        if i + 1 < r.n_gen {
            s.eval_outputs_into(&[next], Outputs::Last, logits)?;
        }
    }
    Ok(Outcome {
        tokens,
        logits: logits.clone(),
    })
}

const MIB: f64 = (1u64 << 20) as f64;

/// Runs `tessera soak`; fails when descriptors leak, resident memory grows past warm-up, or a
/// sampled request differs from a fresh single-request run.
///
/// # Errors
/// Device, model and compute errors, and the checks above.
pub fn run(args: &SoakArgs) -> anyhow::Result<()> {
    if args.split_mode.is_empty() {
        anyhow::bail!("no split mode given");
    }
    let config = args.preset.config();
    if args.max_prompt + args.max_gen > config.n_ctx {
        anyhow::bail!(
            "--max-prompt {} + --max-gen {} exceed the model's context of {}",
            args.max_prompt,
            args.max_gen,
            config.n_ctx
        );
    }
    let t0 = Instant::now();
    let model = LlamaModel::new(config, 0x50a4)?.with_cache_types(args.cache.types()?)?;
    let reqs = requests(args, model.config().n_vocab);
    let tokens: usize = reqs.iter().map(|r| r.prompt.len() + r.n_gen - 1).sum();
    eprintln!(
        "soak: {} requests per mode ({tokens} tokens evaluated), prompts 1..={}, generation \
         1..={}; model built in {:.1} s; process at {:.1} MiB RSS, {} fds",
        reqs.len(),
        args.max_prompt,
        args.max_gen,
        t0.elapsed().as_secs_f64(),
        rss_bytes()? as f64 / MIB,
        open_fds()?
    );
    let n = reqs.len();
    let compare: Vec<usize> = match args.compare.min(n) {
        0 => Vec::new(),
        1 => vec![n - 1],
        k => (0..k).map(|i| i * (n - 1) / (k - 1)).collect(),
    };
    let warm_at = (n / 10).max(1);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for &mode in &args.split_mode {
        // `none` runs on the whole CPU device (all cores), the others on `--devices`.
        let list = (mode != SplitMode::None).then_some(args.devices.as_str());
        let devices = devices_for(mode, list)?;
        let ratios: &[f32] = if mode == SplitMode::None {
            &[]
        } else {
            &args.ratios
        };
        let before_load = sample()?;
        let mut session = open_session(
            &model,
            &devices,
            super::session::Load::new(mode)
                .with_ratios(ratios)
                .with_threads(args.threads),
        )?;
        let loaded = sample()?;
        let mut logits = Vec::new();
        let mut kept = Vec::new();
        let mut warm = loaded;
        let mut peak = loaded.rss;
        let t = Instant::now();
        for (i, r) in reqs.iter().enumerate() {
            let out = serve(&mut session, r, &mut logits)
                .with_context(|| format!("{}: request {i}", mode.name()))?;
            if compare.contains(&i) {
                kept.push((i, out));
            }
            if i + 1 == warm_at {
                warm = sample()?;
            }
            if i % 50 == 0 {
                peak = peak.max(rss_bytes()?);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let end = sample()?;
        peak = peak.max(end.rss);
        drop(session);
        // Fresh single-request runs of the sampled requests, each in a new session.
        let mut max_diff = 0f32;
        let mut token_mismatches = 0usize;
        for (i, out) in &kept {
            let mut fresh = open_session(
                &model,
                &devices,
                super::session::Load::new(mode)
                    .with_ratios(ratios)
                    .with_threads(args.threads),
            )?;
            let again = serve(&mut fresh, &reqs[*i], &mut logits)?;
            if again.tokens != out.tokens {
                token_mismatches += 1;
            }
            for (a, b) in again.logits.iter().zip(&out.logits) {
                max_diff = max_diff.max((a - b).abs());
            }
        }
        let grew = end.rss.saturating_sub(warm.rss);
        let allowed = (warm.rss / 20).max(8 << 20);
        if end.fds != warm.fds || end.fds != loaded.fds {
            failures.push(format!(
                "{}: open fds went {} -> {} -> {}",
                mode.name(),
                loaded.fds,
                warm.fds,
                end.fds
            ));
        }
        if grew > allowed {
            failures.push(format!(
                "{}: RSS grew {:.1} MiB after warm-up (allowed {:.1})",
                mode.name(),
                grew as f64 / MIB,
                allowed as f64 / MIB
            ));
        }
        if token_mismatches > 0 || max_diff != 0.0 {
            failures.push(format!(
                "{}: {token_mismatches} of {} sampled requests generate other tokens than a \
                 fresh run; max |logit difference| {max_diff:e}",
                mode.name(),
                kept.len()
            ));
        }
        rows.push(format!(
            "| {:6} | {:>14} | {:>7.1} | {:>9.1} | {:>9.1} | {:>9.1} | {:>8.1} | {:>3} -> {:<3} | {:>5.1} | {}/{} same, max |Δ| {:e} |",
            mode.name(),
            device_names(&devices),
            before_load.rss as f64 / MIB,
            loaded.rss as f64 / MIB,
            warm.rss as f64 / MIB,
            end.rss as f64 / MIB,
            peak as f64 / MIB,
            loaded.fds,
            end.fds,
            secs,
            kept.len() - token_mismatches,
            kept.len(),
            max_diff
        ));
    }
    println!(
        "| mode   | devices  | RSS before load MiB | after load | after {warm_at} req | after {n} req | peak | fds load -> end | s | fresh single-request runs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!("{r}");
    }
    if failures.is_empty() {
        println!(
            "soak: flat (fds unchanged, RSS within max(5%, 8 MiB) of warm-up), every sampled request identical to a fresh run"
        );
        Ok(())
    } else {
        anyhow::bail!("soak failed:\n  {}", failures.join("\n  "))
    }
}
