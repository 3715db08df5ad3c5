//! `tessera batched-bench`: throughput of many sequences decoded together, with
//! llama-batched-bench's flags and table: for each prompt length PP, generation length TG and
//! batch size B, B prompts are evaluated (T_PP), then B sequences generate TG tokens each, one
//! token per sequence per step (T_TG).

use super::inputs::Rng;
use super::session::{ModelPreset, devices_for, open_session};
use anyhow::Context as _;
use std::sync::Arc;
use std::time::Instant;
use tessera_model::{Batch, BatchLogits, LlamaModel, SeqId, Session, SplitMode};

/// Seed of the synthetic weights and of the random tokens.
const SEED: u64 = 0xba7c4;

/// Arguments of `tessera batched-bench` (llama-batched-bench's `-npp`, `-ntg`, `-npl`, `-pps`
/// and `-ub` are rewritten to the long forms before parsing).
#[derive(Clone, Debug, clap::Args)]
pub struct BatchedBenchArgs {
    /// A GGUF model file (default: the synthetic preset).
    #[arg(short = 'm', long = "model")]
    pub model_file: Option<std::path::PathBuf>,
    /// Synthetic model to run when no file is given.
    #[arg(long, value_enum, default_value = "synthetic-100m")]
    pub preset: ModelPreset,
    /// KV cache cells shared by all sequences (llama.cpp's n_kv_max); a case needing more is
    /// skipped, as llama-batched-bench does.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 2048, value_parser = super::args::context)]
    pub ctx_size: usize,
    /// Tokens evaluated per step of the prompt phase (llama.cpp's -b).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048, value_parser = super::args::count)]
    pub n_batch: usize,
    /// Tokens per graph within a step (llama.cpp's -ub); the smaller of -b and -ub applies.
    #[arg(long = "ubatch-size", default_value_t = 512, value_parser = super::args::count)]
    pub n_ubatch: usize,
    /// Prompt lengths, comma-separated (-npp).
    #[arg(long = "n-pp", value_delimiter = ',', value_parser = super::args::count, default_value = "128")]
    pub n_pp: Vec<usize>,
    /// Tokens generated per sequence, comma-separated (-ntg).
    #[arg(long = "n-tg", value_delimiter = ',', value_parser = super::args::count, default_value = "128")]
    pub n_tg: Vec<usize>,
    /// Sequences decoded together, comma-separated (-npl).
    #[arg(long = "n-pl", value_delimiter = ',', value_parser = super::args::count, default_value = "1,2,4,8")]
    pub n_pl: Vec<usize>,
    /// One prompt shared by every sequence (-pps): evaluated once, then forked.
    #[arg(long = "pps")]
    pub pp_shared: bool,
    /// Threads in all, divided among the CPU devices as llama.cpp's -t.
    #[arg(short = 't', long, value_parser = super::args::threads)]
    pub threads: Option<usize>,
    /// none, layer, tensor or expert.
    #[arg(long, value_parser = super::args::split_mode, default_value = "none")]
    pub split_mode: SplitMode,
    /// Split ratios, one per device (default: even).
    #[arg(long, value_delimiter = ',', value_parser = super::args::ratio)]
    pub ratios: Vec<f32>,
    /// Devices: comma-separated names, or KIND:N (default: CPU for none, cpu:2 otherwise).
    #[arg(long)]
    pub devices: Option<String>,
    #[command(flatten)]
    pub cache: super::session::CacheTypeArgs,
    /// Flash attention (-fa): Tessera always uses it, so `on`, `1` and `auto` are accepted and
    /// `off` is refused.
    #[arg(long = "flash-attn", value_parser = ["on", "1", "auto", "off", "0"])]
    pub flash_attn: Option<String>,
    /// Accepted for llama.cpp's -ngl and ignored: `--devices` chooses where the model runs.
    #[arg(long = "n-gpu-layers")]
    pub n_gpu_layers: Option<i64>,
    /// Print one JSON object per case instead of the table (llama.cpp's --output-format jsonl).
    #[arg(long = "output-format", default_value = "md", value_parser = ["md", "jsonl"])]
    pub output_format: String,
}

/// One case's timings.
struct Case {
    pp: usize,
    tg: usize,
    pl: usize,
    n_kv: usize,
    t_pp: f64,
    t_tg: f64,
}

impl Case {
    fn pp_tokens(&self, shared: bool) -> usize {
        if shared { self.pp } else { self.pl * self.pp }
    }
}

/// Evaluates `batch` in steps of at most `n` tokens.
fn decode_in_steps(
    s: &mut Session,
    batch: &Batch,
    n: usize,
    out: &mut BatchLogits,
) -> anyhow::Result<()> {
    if batch.len() <= n {
        return Ok(s.decode_into(batch, out)?);
    }
    let mut part = Batch::new();
    for chunk in batch.tokens().chunks(n) {
        part.clear();
        for t in chunk {
            part.add(t.token, t.pos, t.seq, t.logits);
        }
        s.decode_into(&part, out)?;
    }
    Ok(())
}

/// Runs one (PP, TG, B) case on an emptied cache.
fn run_case(
    s: &mut Session,
    args: &BatchedBenchArgs,
    (pp, tg, pl): (usize, usize, usize),
    rng: &mut Rng,
    n_vocab: usize,
) -> anyhow::Result<Case> {
    let step = args.n_batch.min(args.n_ubatch);
    let mut tok = || rng.below(n_vocab) as i32;
    let mut batch = Batch::new();
    let mut out = BatchLogits::default();
    let prompts = if args.pp_shared { 1 } else { pl };
    for j in 0..prompts {
        for i in 0..pp {
            batch.add(tok(), i, j as SeqId, i + 1 == pp);
        }
    }
    s.reset();
    let t0 = Instant::now();
    decode_in_steps(s, &batch, step, &mut out)?;
    let t_pp = t0.elapsed().as_secs_f64();
    if args.pp_shared {
        for j in 1..pl {
            s.seq_copy(0, j as SeqId, 0, usize::MAX)?;
        }
    }
    let t0 = Instant::now();
    for i in 0..tg {
        batch.clear();
        for j in 0..pl {
            batch.add(tok(), pp + i, j as SeqId, true);
        }
        // As llama-batched-bench, a step of more than -b tokens is cut into several.
        decode_in_steps(s, &batch, args.n_batch, &mut out)?;
    }
    let t_tg = t0.elapsed().as_secs_f64();
    Ok(Case {
        pp,
        tg,
        pl,
        n_kv: if args.pp_shared { pp } else { pl * pp } + pl * tg,
        t_pp,
        t_tg,
    })
}

fn print_row(c: &Case, args: &BatchedBenchArgs, threads: &str) {
    let shared = args.pp_shared;
    let t = c.t_pp + c.t_tg;
    let s_pp = c.pp_tokens(shared) as f64 / c.t_pp;
    let s_tg = (c.pl * c.tg) as f64 / c.t_tg;
    let s = (c.pp_tokens(shared) + c.pl * c.tg) as f64 / t;
    if args.output_format == "jsonl" {
        println!(
            "{{\"n_kv_max\": {}, \"n_batch\": {}, \"n_ubatch\": {}, \"is_pp_shared\": {}, \
             \"n_threads\": {threads}, \"pp\": {}, \"tg\": {}, \"pl\": {}, \"n_kv\": {}, \
             \"t_pp\": {:.6}, \"speed_pp\": {s_pp:.6}, \"t_tg\": {:.6}, \"speed_tg\": {s_tg:.6}, \
             \"t\": {t:.6}, \"speed\": {s:.6}}}",
            args.ctx_size,
            args.n_batch,
            args.n_ubatch,
            u8::from(shared),
            c.pp,
            c.tg,
            c.pl,
            c.n_kv,
            c.t_pp,
            c.t_tg,
        );
    } else {
        println!(
            "|{:6} | {:6} | {:4} | {:6} | {:8.3} | {s_pp:8.2} | {:8.3} | {s_tg:8.2} | {t:8.3} | \
             {s:8.2} |",
            c.pp, c.tg, c.pl, c.n_kv, c.t_pp, c.t_tg
        );
    }
}

/// Runs `tessera batched-bench` and prints its table.
///
/// # Errors
/// Unreadable model files, device selection, loading and compute errors.
pub fn run(args: &BatchedBenchArgs) -> anyhow::Result<()> {
    if matches!(args.flash_attn.as_deref(), Some("off" | "0")) {
        anyhow::bail!("-fa off: Tessera's attention is always flash attention");
    }
    if args.n_gpu_layers.is_some() {
        tracing::info!("-ngl is ignored: --devices chooses the devices");
    }
    let n_ctx = args.ctx_size;
    let model = match &args.model_file {
        Some(path) => {
            let file = Arc::new(
                tessera::gguf::GgufFile::open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            );
            LlamaModel::from_gguf(file, Some(n_ctx))?
        }
        None => {
            let mut config = args.preset.config();
            config.n_ctx = n_ctx;
            LlamaModel::new(config, SEED)?
        }
    };
    let model = model.with_cache_types(args.cache.types()?)?;
    let n_vocab = model.config().n_vocab;
    let max_pl = args.n_pl.iter().copied().max().unwrap_or(1);
    if max_pl > tessera_model::MAX_SEQUENCES {
        anyhow::bail!(
            "-npl {max_pl}: a session holds at most {} sequences",
            tessera_model::MAX_SEQUENCES
        );
    }
    let devices = devices_for(args.split_mode, args.devices.as_deref())?;
    let opts = super::session::Load::new(args.split_mode)
        .with_ratios(&args.ratios)
        .with_threads(args.threads)
        .with_max_sequences(max_pl);
    let mut session = open_session(&model, &devices, opts)?;
    let mut rng = Rng::new(SEED);
    // Warm-up, as llama-batched-bench: 16 tokens of one sequence, untimed.
    let mut warm = Batch::new();
    for i in 0..16.min(n_ctx) {
        warm.add(rng.below(n_vocab) as i32, i, 0, false);
    }
    session.decode(&warm).context("warm-up")?;
    // The table says "default"; JSON gets null.
    let threads = args
        .threads
        .map_or_else(|| "default".to_string(), |t| t.to_string());
    let threads_json = args
        .threads
        .map_or_else(|| "null".to_string(), |t| t.to_string());
    if args.output_format == "md" {
        println!();
        println!(
            "batched-bench: n_kv_max = {n_ctx}, n_batch = {}, n_ubatch = {}, is_pp_shared = {}, \
             split_mode = {}, devices = {}, n_threads = {threads}, cache = {}",
            args.n_batch,
            args.n_ubatch,
            u8::from(args.pp_shared),
            args.split_mode,
            super::session::device_names(&session.devices()),
            model.cache_types()
        );
        println!();
        println!(
            "|{:>6} | {:>6} | {:>4} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |",
            "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"
        );
        println!(
            "|{}-|-{}-|-{}-|-{}-|-{}-|-{}-|-{}-|-{}-|-{}-|-{}-|",
            "-".repeat(6),
            "-".repeat(6),
            "-".repeat(4),
            "-".repeat(6),
            "-".repeat(8),
            "-".repeat(8),
            "-".repeat(8),
            "-".repeat(8),
            "-".repeat(8),
            "-".repeat(8)
        );
    }
    for &pp in &args.n_pp {
        for &tg in &args.n_tg {
            for &pl in &args.n_pl {
                let need = if args.pp_shared { pp } else { pl * pp } + pl * tg;
                if need > n_ctx {
                    tracing::info!(
                        "PP {pp} TG {tg} B {pl} needs {need} cells > -c {n_ctx}: skipped"
                    );
                    continue;
                }
                let case = run_case(&mut session, args, (pp, tg, pl), &mut rng, n_vocab)
                    .with_context(|| format!("PP {pp} TG {tg} B {pl}"))?;
                print_row(&case, args, &threads_json);
            }
        }
    }
    Ok(())
}
