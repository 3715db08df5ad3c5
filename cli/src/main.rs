//! The `tessera` command line.

mod commands;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Run tensor graphs on any device; split models across devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// A setting for this run, KEY=VALUE (repeatable), over its TESSERA_* variable, e.g.
    /// cpu.repack=0 or vulkan.all-reduce=bf16; `tessera devices` lists them.
    #[arg(long = "set", global = true, value_name = "KEY=VALUE", value_parser = commands::args::setting)]
    settings: Vec<(tessera::settings::Setting, String)>,
}

#[derive(Subcommand)]
enum Command {
    /// List backends, devices, memory and capabilities (plugins included: TESSERA_BACKEND_PATH
    /// and the executable's directory are scanned for libtessera_*.so).
    Devices {
        /// Also load this backend plugin (repeatable).
        #[arg(long, value_name = "PATH")]
        load: Vec<std::path::PathBuf>,
    },
    /// Check every op against a scalar reference on each device; exits non-zero on any failure.
    TestOps {
        /// Only this op (e.g. MUL_MAT, SILU, ROPE).
        #[arg(short = 'o', long)]
        op: Option<String>,
        /// Only devices of this backend or with this name.
        #[arg(short = 'b', long)]
        backend: Option<String>,
        /// Devices: comma-separated names, or KIND:N (e.g. cpu:2).
        #[arg(long)]
        devices: Option<String>,
        /// Print only failures and the summary.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Generate text with a GGUF model: streams the output and prints prompt and generation
    /// tokens per second.
    #[command(after_help = commands::architectures_help())]
    Run(commands::run::RunArgs),
    /// What each KV cache type costs against the F16 cache: KL divergence, same top token and
    /// perplexity over a text (llama-perplexity's --kl-divergence), with each type's KV bytes.
    Kld(commands::kld::KldArgs),
    /// Write the synthetic model (deterministic weights, a small SentencePiece vocabulary) as a
    /// GGUF file, for `run` and for tests without a download.
    #[command(after_help = commands::architectures_help())]
    WriteSynthetic {
        /// Output path.
        #[arg(short = 'o', long)]
        out: std::path::PathBuf,
        /// Architecture, a name from the list below (the mixture-of-experts ones get 8 experts,
        /// 2 used, with a dense preset).
        #[arg(long, default_value = "llama")]
        arch: String,
        /// Size preset.
        #[arg(long, value_enum, default_value = "tiny")]
        model: commands::session::ModelPreset,
        /// Weight type of the matrices (default: the preset's, Q8_0), e.g. q4_0, q4_K or f16.
        #[arg(long, value_parser = commands::args::dtype)]
        weight_type: Option<tessera::DType>,
    },
    /// Write the reference suite's random-weight models (every architecture, F32 and quantized)
    /// as `DIR/NAME.gguf` with their prompts as `DIR/NAME.tokens`, for recording llama.cpp's
    /// logits (tests/reference/make_references.sh).
    WriteReference {
        /// Output directory (created if missing).
        dir: std::path::PathBuf,
        /// Only these models (comma-separated names, e.g. llama-f32-gqa); default: every one.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// Tensor-parallel equivalence: a small llama model on one CPU device vs split over
    /// --devices (the meta device); prints NMSE per output, exits non-zero on a failure.
    TestTp {
        /// Devices of the meta device: comma-separated names, or KIND:N.
        #[arg(long, default_value = "cpu:2")]
        devices: String,
        /// Split ratios, one per device (default: even), e.g. 2,1,1.
        #[arg(long, value_delimiter = ',', value_parser = commands::args::ratio)]
        ratios: Vec<f32>,
        /// Use the generic all-reduce even where the backend has its own.
        #[arg(long)]
        generic: bool,
        /// tensor (a dense llama model) or expert (a mixture-of-experts model with whole
        /// experts per device).
        #[arg(long, value_parser = commands::args::split_mode, default_value = "tensor")]
        split_mode: tessera_model::SplitMode,
        #[command(flatten)]
        cache: commands::session::CacheTypeArgs,
        #[command(flatten)]
        dist: commands::dist::DistArgs,
        /// llama.cpp's recorded logits of the model given with -m (`tests/reference/`): run the
        /// reference suite's check of the split model against them instead of the tiny model's
        /// split-vs-unsplit check.
        #[arg(long, requires = "model")]
        reference: Option<std::path::PathBuf>,
        /// GGUF file the recording of --reference was made from.
        #[arg(short = 'm', long, requires = "reference")]
        model: Option<std::path::PathBuf>,
    },
    /// Time the all-reduce between devices (size, time, algbw, busbw, path).
    BenchAllreduce {
        /// Devices (per rank with --dist): comma-separated names, or KIND:N (default cpu:2,
        /// cpu:1 with --dist mpi).
        #[arg(long)]
        devices: Option<String>,
        /// Slice sizes in bytes, MIN..MAX, stepping by x4 (K, M, G suffixes).
        #[arg(long, default_value = "4K..64M")]
        sizes: String,
        /// Exchange format: f32 (exact) or bf16 (half the bytes, round to nearest even).
        #[arg(long, default_value = "f32")]
        wire: String,
        /// Generic algorithm: auto, doubling or ring.
        #[arg(long, default_value = "auto")]
        algo: String,
        /// auto (the backend's comm when it covers every device, else generic), vendor or generic.
        #[arg(long, default_value = "auto")]
        path: String,
        /// Threads in all, divided among the CPU devices as llama.cpp's -t (default: one per
        /// core of each device).
        #[arg(short = 't', long, value_parser = commands::args::threads)]
        threads: Option<usize>,
        /// Minimum seconds to measure each size.
        #[arg(long, default_value_t = 0.3, value_parser = commands::args::seconds)]
        min_time: f64,
        /// Across processes: `mpi` (start under mpirun; every rank runs the same command and
        /// rank 0 prints Tessera's cross-rank step against a raw MPI_Allreduce), or `none`.
        #[arg(long, default_value = "none")]
        dist: String,
        /// With --dist: seconds a collective waits for the other ranks before the job is
        /// aborted with an error naming them.
        #[arg(long, default_value_t = 60.0, value_parser = commands::bench_allreduce::timeout)]
        dist_timeout: f64,
    },
    /// Time single-op graphs: GFLOP/s and GB/s per op and shape, and the per-node cost of each
    /// device (OVERHEAD: a chain of 64 small element-wise nodes, in µs per node).
    BenchOps {
        /// Only this op (e.g. MUL_MAT) or label prefix; repeat for several.
        #[arg(short = 'o', long)]
        op: Vec<String>,
        /// Only devices of this backend or with this name.
        #[arg(short = 'b', long)]
        backend: Option<String>,
        /// Devices: comma-separated names, or KIND:N.
        #[arg(long)]
        devices: Option<String>,
        /// Thread counts to run with, e.g. 1,2 (default: one per core of the device).
        #[arg(short = 't', long)]
        threads: Option<String>,
        /// Rows m of the MUL_MAT shapes.
        #[arg(short = 'm', long, default_value_t = 4096, value_parser = commands::args::reduction)]
        m: usize,
        /// Reduction length k of the MUL_MAT shapes.
        #[arg(short = 'k', long, default_value_t = 4096, value_parser = commands::args::reduction)]
        k: usize,
        /// Columns n of the MUL_MAT shapes, comma-separated.
        #[arg(short = 'n', long, default_value = "1,512")]
        cols: String,
        /// Copies of each MUL_MAT weight, read in turn (a working set past the GPU's L2 cache).
        #[arg(long, default_value_t = 1, value_parser = commands::args::count)]
        rotate: usize,
        /// Minimum seconds to measure each case.
        #[arg(long, default_value_t = 1.0, value_parser = commands::args::seconds)]
        min_time: f64,
    },
    /// Time a synthetic llama model: prompt processing and generation, whole or split by layers.
    Bench(commands::bench::BenchArgs),
    /// This machine's memory read bandwidth, read the way a decode reads its weights (each
    /// thread its own contiguous share), with every read loop the CPU has; the best is the limit
    /// `bench --read-bw` sets a decode's GB/s against.
    BenchMem(commands::bench_mem::BenchMemArgs),
    /// Throughput of many sequences decoded together, as llama-batched-bench: prompts of B
    /// sequences, then B tokens per step (-npp, -ntg, -npl as llama.cpp spells them).
    BatchedBench(commands::batched_bench::BatchedBenchArgs),
    /// Soak test: thousands of random-length requests on the synthetic model per split mode,
    /// reporting resident memory and open file descriptors at start and end (they must stay
    /// flat) and comparing sampled requests with fresh single-request runs.
    Soak(commands::soak::SoakArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| {
                // The scheduler's assignment report is an info log; asking for it should show it.
                if std::env::var_os(tessera::sched::DEBUG_ENV).is_some() {
                    "warn,tessera::sched=info".into()
                } else {
                    "warn".into()
                }
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse_from(commands::session::rewrite_llama_flags(
        std::env::args_os(),
    ))) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    for (setting, value) in &cli.settings {
        tessera::settings::set(*setting, value)?;
    }
    match cli.command {
        Command::Devices { load } => commands::devices::run(&load).map(|_| ExitCode::SUCCESS),
        Command::Bench(args) => commands::bench::run(&args).map(|_| ExitCode::SUCCESS),
        Command::BenchMem(args) => commands::bench_mem::run(&args).map(|_| ExitCode::SUCCESS),
        Command::BatchedBench(args) => {
            commands::batched_bench::run(&args).map(|_| ExitCode::SUCCESS)
        }
        Command::Run(args) => commands::run::run(&args).map(|_| ExitCode::SUCCESS),
        Command::Kld(args) => commands::kld::run(&args).map(|_| ExitCode::SUCCESS),
        Command::Soak(args) => commands::soak::run(&args).map(|_| ExitCode::SUCCESS),
        Command::WriteReference { dir, only } => {
            let models = tessera_model::reference::reference_models();
            if let Some(unknown) = only.iter().find(|n| !models.iter().any(|m| &m.name == *n)) {
                let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
                anyhow::bail!(
                    "write-reference --only: no model {unknown}; the models are {}",
                    names.join(", ")
                );
            }
            std::fs::create_dir_all(&dir)?;
            for m in models
                .iter()
                .filter(|m| only.is_empty() || only.contains(&m.name))
            {
                let path = dir.join(format!("{}.gguf", m.name));
                std::fs::write(&path, m.gguf_bytes()?)?;
                let ids: Vec<String> = m.prompt().iter().map(i32::to_string).collect();
                std::fs::write(dir.join(format!("{}.tokens", m.name)), ids.join(","))?;
                eprintln!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::WriteSynthetic {
            out,
            arch,
            model,
            weight_type,
        } => {
            let arch = tessera_model::Arch::from_name(&arch).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown architecture '{arch}' ({})",
                    tessera_model::Arch::supported_names()
                )
            })?;
            let base = model.config();
            let mut config = tessera_model::LlamaConfig { arch, ..base };
            if let Some(t) = weight_type {
                config.weight_dtype = t;
            }
            if arch.requires_experts() && !config.is_moe() {
                // The dense presets as 8 experts of the dense width, 2 used.
                config.n_expert = 8;
                config.n_expert_used = 2;
                config.n_ff_exp = config.n_ff;
            }
            if config.is_moe() && !arch.allows_experts() {
                anyhow::bail!("{} has no mixture-of-experts blocks", arch.name());
            }
            if arch == tessera_model::Arch::GptOss {
                let g = tessera_model::LlamaConfig::tiny_moe(arch, 8, 2, 64);
                config.n_swa = g.n_swa;
                config.swa_period = g.swa_period;
                config.rope_base_swa = config.rope_base;
            }
            if arch == tessera_model::Arch::Gemma3 {
                let g = tessera_model::LlamaConfig::tiny_arch(arch);
                config.n_swa = g.n_swa;
                config.swa_period = arch.default_swa_period();
                config.tied_output = true;
            }
            let m = tessera_model::LlamaModel::new(config, 0x5eed)?;
            m.write_gguf(&out)?;
            eprintln!(
                "wrote {} ({} parameters)",
                out.display(),
                m.config().param_count()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::TestOps {
            op,
            backend,
            devices,
            quiet,
        } => {
            let devs = commands::select_devices(devices.as_deref(), backend.as_deref())?;
            let ok = commands::test_ops::run(&devs, op.as_deref(), quiet)?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::TestTp {
            devices,
            ratios,
            generic,
            split_mode,
            cache,
            dist,
            reference,
            model,
        } => {
            let print = commands::dist::fingerprint(model.as_deref())?;
            let job = commands::dist::Job::start(&dist, &print)?;
            let devs = job.finish(tessera::registry().select(&devices).map_err(Into::into))?;
            let reference = match (&reference, &model) {
                (Some(recording), Some(model)) => {
                    Some(commands::test_tp::ReferenceRun { model, recording })
                }
                _ => None,
            };
            let args = commands::test_tp::TpArgs {
                devices: &devs,
                ratios: &ratios,
                generic,
                mode: split_mode,
                cache: cache.types()?,
                job: &job,
            };
            let ok = job.finish(commands::test_tp::run(&args, reference.as_ref()))?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::BenchAllreduce {
            devices,
            sizes,
            wire,
            algo,
            path,
            threads,
            min_time,
            dist,
            dist_timeout,
        } => {
            let dist = match dist.to_lowercase().as_str() {
                "none" => false,
                "mpi" => {
                    if let Some(why) = tessera::dist::mpi_unavailable() {
                        anyhow::bail!("--dist mpi: {why}");
                    }
                    true
                }
                other => anyhow::bail!("--dist {other}: expected mpi or none"),
            };
            let default_devices = if dist { "cpu:1" } else { "cpu:2" };
            let devs = commands::select_devices(
                Some(devices.as_deref().unwrap_or(default_devices)),
                None,
            )?;
            let wire = match wire.to_lowercase().as_str() {
                "f32" => tessera::comm::Wire::F32,
                "bf16" => tessera::comm::Wire::Bf16,
                other => anyhow::bail!("--wire {other}: expected f32 or bf16"),
            };
            let algorithm = match algo.to_lowercase().as_str() {
                "auto" => tessera::comm::Algorithm::Auto {
                    threshold_bytes: tessera::comm::DEFAULT_RING_THRESHOLD,
                },
                "doubling" => tessera::comm::Algorithm::RecursiveDoubling,
                "ring" => tessera::comm::Algorithm::Ring,
                other => anyhow::bail!("--algo {other}: expected auto, doubling or ring"),
            };
            let opts = commands::bench_allreduce::Options {
                sizes: commands::bench_allreduce::parse_range(&sizes)?,
                wire,
                algorithm,
                threads,
                min_time: Duration::from_secs_f64(min_time),
                path: path.to_lowercase(),
            };
            if dist {
                #[cfg(feature = "mpi")]
                return commands::bench_allreduce::run_dist(
                    &devs,
                    &opts,
                    Duration::from_secs_f64(dist_timeout),
                )
                .map(|_| ExitCode::SUCCESS);
            }
            let _ = dist_timeout;
            commands::bench_allreduce::run(&devs, &opts).map(|_| ExitCode::SUCCESS)
        }
        Command::BenchOps {
            op,
            backend,
            devices,
            threads,
            m,
            k,
            cols,
            rotate,
            min_time,
        } => {
            let cols = commands::parse_list(&cols).map_err(|e| anyhow::anyhow!("--cols: {e}"))?;
            let devs = commands::select_devices(devices.as_deref(), backend.as_deref())?;
            if devs.is_empty() {
                anyhow::bail!("no device selected");
            }
            let threads = threads
                .as_deref()
                .map(commands::parse_list)
                .transpose()?
                .unwrap_or_default();
            let min_time = Duration::from_secs_f64(min_time);
            commands::bench_ops::run(
                &devs,
                &commands::bench_ops::Options {
                    op,
                    threads,
                    m,
                    k,
                    cols,
                    rotate,
                    min_time,
                },
            )
            .map(|_| ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parses(args: &[&str]) -> bool {
        Cli::try_parse_from(std::iter::once("tessera").chain(args.iter().copied())).is_ok()
    }

    #[test]
    fn nonsensical_numbers_are_refused_by_every_command() {
        let bad: &[&[&str]] = &[
            &["run", "-m", "x.gguf", "-p", "hi", "--temp", "nan"],
            &["run", "-m", "x.gguf", "-p", "hi", "--temp", "inf"],
            &["run", "-m", "x.gguf", "-p", "hi", "--temp=-1"],
            &["run", "-m", "x.gguf", "-p", "hi", "-t", "0"],
            &["run", "-m", "x.gguf", "-p", "hi", "-t", "1000000"],
            &["run", "-m", "x.gguf", "-p", "hi", "-c", "0"],
            &["run", "-m", "x.gguf", "-p", "hi", "--ratios", "1,nan"],
            &["run", "-m", "x.gguf", "-p", "hi", "--ratios=-1,2"],
            &["bench", "-t", "0"],
            &["bench", "--ratios", "inf,1"],
            &["test-tp", "--ratios", "nan,1"],
            // NaN seconds used to reach Duration::from_secs_f64 and panic.
            &["bench-ops", "--min-time", "nan"],
            &["bench-ops", "--min-time", "inf"],
            &["bench-ops", "--min-time=-1"],
            &["bench-ops", "-k", "0"],
            &["bench-allreduce", "--min-time", "nan"],
            &["bench-allreduce", "-t", "0"],
            &["bench-allreduce", "--dist-timeout", "0"],
            &["bench-allreduce", "--dist-timeout", "nan"],
            &["soak", "--requests", "0"],
            &["soak", "--ratios", "2,nan,1"],
        ];
        for args in bad {
            assert!(!parses(args), "accepted: {args:?}");
        }
        let good: &[&[&str]] = &[
            &[
                "run", "-m", "x.gguf", "-p", "hi", "--temp", "0.7", "-t", "2", "-c", "64",
            ],
            &["bench", "--ratios", "2,1,1", "-t", "1"],
            &["bench-ops", "--min-time", "0.5", "-k", "256"],
            &["bench-allreduce", "--min-time", "0"],
            &["soak", "--requests", "10", "--ratios", "2,1,1"],
        ];
        for args in good {
            assert!(parses(args), "refused: {args:?}");
        }
    }

    /// A batched-bench command line parsed as `main` parses it (llama.cpp's flags rewritten).
    fn batched(line: &[&str]) -> commands::batched_bench::BatchedBenchArgs {
        let argv =
            commands::session::rewrite_llama_flags(line.iter().map(std::ffi::OsString::from));
        match Cli::try_parse_from(argv).unwrap().command {
            Command::BatchedBench(args) => args,
            _ => panic!("not batched-bench: {line:?}"),
        }
    }

    /// llama-batched-bench's own command line parses after the rewrite, and runs on the tiny
    /// model in every split mode (a case too big for `-c` is skipped, not an error).
    #[test]
    fn batched_bench_takes_llama_cpp_flags_and_runs_every_split() {
        let line = [
            "tessera",
            "batched-bench",
            "--preset",
            "tiny",
            "-c",
            "64",
            "-b",
            "2048",
            "-ub",
            "8",
            "-npp",
            "4,40",
            "-ntg",
            "3",
            "-npl",
            "1,3",
            "-t",
            "2",
            "-fa",
            "on",
            "-ngl",
            "99",
        ];
        let mut args = batched(&line);
        assert_eq!(
            (args.n_pp.clone(), args.n_tg.clone(), args.n_pl.clone()),
            (vec![4, 40], vec![3], vec![1, 3])
        );
        assert_eq!((args.n_ubatch, args.ctx_size), (8, 64));
        for mode in ["none", "layer", "tensor", "expert"] {
            args.split_mode = mode.parse().unwrap();
            commands::batched_bench::run(&args).unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        }
        let pps = [
            "tessera",
            "batched-bench",
            "--preset",
            "tiny",
            "-c",
            "64",
            "-npp",
            "8",
            "-ntg",
            "2",
            "-npl",
            "4",
            "-pps",
        ];
        let args = batched(&pps);
        assert!(args.pp_shared);
        commands::batched_bench::run(&args).unwrap();
        assert!(!parses(&["batched-bench", "--n-pl", "0"]));
        let off = ["tessera", "batched-bench", "--preset", "tiny", "-fa", "off"];
        let args = batched(&off);
        assert!(commands::batched_bench::run(&args).is_err());
    }

    #[test]
    fn a_zero_thread_count_in_a_list_is_an_error() {
        assert_eq!(commands::parse_list("1, 2").unwrap(), vec![1, 2]);
        // `-t 0,2` used to drop the 0 silently.
        assert!(commands::parse_list("0,2").is_err());
        assert!(commands::parse_list("x").is_err());
    }
}
