//! What every model command shares: choosing devices for a split mode, and opening a
//! [`Session`] with a progress line and a load report. Commands import this module, never each
//! other.

use anyhow::Context as _;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Instant;
use tessera::comm::DistComm;
use tessera::{Device, registry};
use tessera_model::{KvCacheTypes, LlamaConfig, LlamaModel, Session, Split, SplitMode};

/// The KV cache's element types, as llama.cpp's `--cache-type-k` / `--cache-type-v` (`-ctk` /
/// `-ctv` are rewritten to these before parsing).
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct CacheTypeArgs {
    /// Element type of the K cache (llama.cpp's -ctk): f16, f32, bf16, q8_0, q4_0, q4_1, q5_0,
    /// q5_1 or iq4_nl.
    #[arg(long = "cache-type-k", default_value = "f16", value_parser = super::args::cache_type)]
    pub k: tessera::DType,
    /// Element type of the V cache (llama.cpp's -ctv), as for K.
    #[arg(long = "cache-type-v", default_value = "f16", value_parser = super::args::cache_type)]
    pub v: tessera::DType,
}

impl Default for CacheTypeArgs {
    fn default() -> CacheTypeArgs {
        let d = KvCacheTypes::default();
        CacheTypeArgs { k: d.k, v: d.v }
    }
}

impl CacheTypeArgs {
    /// The pair, checked.
    ///
    /// # Errors
    /// A type no cache may have (the parser already refuses those).
    pub fn types(&self) -> anyhow::Result<KvCacheTypes> {
        Ok(KvCacheTypes::new(self.k, self.v)?)
    }
}

/// llama.cpp's multi-letter single-dash flags and the long flags they become.
const LLAMA_FLAGS: [(&str, &str); 9] = [
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-npp", "--n-pp"),
    ("-ntg", "--n-tg"),
    ("-npl", "--n-pl"),
    ("-pps", "--pps"),
    ("-ub", "--ubatch-size"),
    ("-fa", "--flash-attn"),
    ("-ngl", "--n-gpu-layers"),
];

/// Rewrites llama.cpp's multi-letter flags (`-ctk` / `-ctv`, batched-bench's `-npp`, `-ntg`,
/// `-npl`, `-pps`, `-ub`, `-fa`, `-ngl`; also `-ctk=q8_0`) to their long forms: clap reads `-ctk` as
/// `-c tk`.
pub(crate) fn rewrite_llama_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    args.into_iter()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in LLAMA_FLAGS {
                if s == short {
                    return long.into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

pub(crate) const MIB: f64 = (1u64 << 20) as f64;

/// The devices `mode` runs on: the `--devices` list, else the CPU for `none` and `cpu:2` for
/// the split modes.
///
/// # Errors
/// A list naming no device, or devices the registry does not have.
pub(crate) fn devices_for(
    mode: SplitMode,
    list: Option<&str>,
) -> anyhow::Result<Vec<Arc<dyn Device>>> {
    let reg = registry();
    let devs = match (list, mode) {
        (Some(l), _) => reg.select(l)?,
        (None, SplitMode::None) => match reg.device("CPU") {
            Ok(d) => vec![d],
            Err(_) => reg.devices().into_iter().take(1).collect(),
        },
        (None, _) => reg.select("cpu:2")?,
    };
    if devs.is_empty() {
        anyhow::bail!("no device selected");
    }
    Ok(match mode {
        SplitMode::None => devs.into_iter().take(1).collect(),
        _ => devs,
    })
}

/// What a command's flags ask of a session: the split mode and what goes with it, turned into a
/// [`Split`] for [`Session::builder`].
#[derive(Clone)]
pub(crate) struct Load {
    pub(crate) split_mode: SplitMode,
    ratios: Vec<f32>,
    groups: usize,
    pub(crate) threads: Option<usize>,
    pub(crate) comm: Option<Arc<dyn DistComm>>,
    cache_types: Option<KvCacheTypes>,
    max_sequences: Option<usize>,
}

impl Load {
    /// `mode` with even ratios, one group and default threads.
    pub(crate) fn new(split_mode: SplitMode) -> Load {
        Load {
            split_mode,
            ratios: Vec::new(),
            groups: 1,
            threads: None,
            comm: None,
            cache_types: None,
            max_sequences: None,
        }
    }

    /// Split ratios (ignored by `none`, which uses one device).
    pub(crate) fn with_ratios(mut self, ratios: &[f32]) -> Load {
        self.ratios = ratios.to_vec();
        self
    }

    pub(crate) fn with_groups(mut self, groups: usize) -> Load {
        self.groups = groups;
        self
    }

    pub(crate) fn with_threads(mut self, threads: Option<usize>) -> Load {
        self.threads = threads;
        self
    }

    pub(crate) fn with_comm(mut self, comm: Option<Arc<dyn DistComm>>) -> Load {
        self.comm = comm;
        self
    }

    pub(crate) fn with_cache_types(mut self, types: KvCacheTypes) -> Load {
        self.cache_types = Some(types);
        self
    }

    pub(crate) fn with_max_sequences(mut self, n: usize) -> Load {
        self.max_sequences = Some(n);
        self
    }

    /// The typed split.
    ///
    /// # Errors
    /// A distributed job outside tensor and expert or with groups; groups outside them.
    fn split(&self) -> anyhow::Result<Split> {
        let mode = self.split_mode;
        if let Some(comm) = &self.comm {
            if !mode.is_tensor_parallel() {
                anyhow::bail!(
                    "a distributed job splits each layer over the ranks: use split mode tensor \
                     or expert, not {mode}"
                );
            }
            if self.groups != 1 {
                anyhow::bail!(
                    "a distributed job is one tensor-parallel group over every rank, not {}",
                    self.groups
                );
            }
            return Ok(Split::Distributed {
                comm: comm.clone(),
                ratios: self.ratios.clone(),
                experts: mode == SplitMode::Expert,
            });
        }
        let ratios: &[f32] = if mode == SplitMode::None {
            &[]
        } else {
            &self.ratios
        };
        Ok(Split::from_mode(mode, ratios, self.groups)?)
    }
}

/// Loads `model` on `devices` as `opts` says, with a progress line on a terminal, and reports
/// the load on stderr (rank 0 only under `--dist`).
///
/// # Errors
/// Split, allocation and upload errors, naming the devices.
pub(crate) fn open_session(
    model: &LlamaModel,
    devices: &[Arc<dyn Device>],
    opts: Load,
) -> anyhow::Result<Session> {
    let (mode, threads, comm) = (opts.split_mode, opts.threads, opts.comm.clone());
    let names = device_names(devices);
    // `-t` counts threads in all (divided among the CPU devices' pools by the scheduler); more
    // than the cores here still works, only slower, and fewer than the pools gives each one.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Split mode none loads the model on the first device only.
    let used = if mode == SplitMode::None {
        &devices[..devices.len().min(1)]
    } else {
        devices
    };
    let pools: usize = used.iter().map(|d| d.thread_pools()).sum();
    // Under --dist only rank 0 reports.
    let loud = comm.as_ref().is_none_or(|c| c.rank() == 0);
    if let Some(t) = threads
        && loud
    {
        if t > cores {
            eprintln!("warning: -t {t} exceeds the {cores} cores here: threads will share cores");
        } else if t < pools {
            eprintln!("note: -t {t} is fewer than the {pools} CPU devices: each runs one thread");
        }
    }
    let t0 = Instant::now();
    let tty = std::io::stderr().is_terminal() && loud;
    let mut last_pct = usize::MAX;
    let progress = |d: usize, n: usize| {
        let pct = d * 100 / n.max(1);
        if tty && pct != last_pct {
            last_pct = pct;
            status(format_args!(
                "loading {} on {names}: {pct:3}% ({d}/{n} tensors)",
                mode.name()
            ));
        }
    };
    let mut builder = Session::builder(model)
        .devices(devices)
        .split(opts.split()?)
        .progress(progress);
    if let Some(t) = threads {
        builder = builder.threads(t);
    }
    if let Some(t) = opts.cache_types {
        builder = builder.cache_types(t);
    }
    if let Some(n) = opts.max_sequences {
        builder = builder.max_sequences(n);
    }
    let session = builder
        .build()
        .with_context(|| format!("loading the model ({mode} split) on {names}"))?;
    if !loud {
        return Ok(session);
    }
    eprintln!(
        "{}loading {} on {names}: {:.1} MiB of weights and KV caches in {:.2} s",
        if tty { "\r" } else { "" },
        mode.name(),
        (model.weight_bytes_total() + model.cache_bytes_total()) as f64 / MIB,
        t0.elapsed().as_secs_f64()
    );
    eprintln!("{}", kv_report(&session));
    Ok(session)
}

/// The KV caches' types, context and bytes per device, e.g. `KV cache (K q8_0, V q8_0), 4096
/// positions: CPU0 9.56 MiB, CPU1 9.56 MiB`.
pub(crate) fn kv_report(session: &Session) -> String {
    let per: Vec<String> = session
        .cache_bytes_per_device()
        .iter()
        .map(|(d, b)| format!("{d} {:.2} MiB", *b as f64 / MIB))
        .collect();
    let m = session.model();
    let rot = match m.cache_types().rotations(m.config().head_dim) {
        (None, None) => String::new(),
        (k, v) => {
            let n = |r: Option<usize>| r.map_or("none".to_string(), |n| n.to_string());
            format!("; Hadamard-rotated K {}, V {}", n(k), n(v))
        }
    };
    format!(
        "KV cache ({}{rot}), {} positions: {}",
        m.cache_types(),
        m.config().n_ctx,
        per.join(", ")
    )
}

/// Rewrites the current terminal line of stderr.
pub(crate) fn status(msg: std::fmt::Arguments<'_>) {
    eprint!("\r{msg}");
    let _ = std::io::stderr().flush();
}

/// The devices' names, comma-separated.
pub(crate) fn device_names(devices: &[Arc<dyn Device>]) -> String {
    devices
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(",")
}

/// Which synthetic model to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelPreset {
    /// About 100M parameters, Q8_0 weights (`LlamaConfig::synthetic_100m`).
    #[value(name = "synthetic-100m")]
    Synthetic100m,
    /// About 1.1B parameters, Q8_0 weights (`LlamaConfig::synthetic_1b`), for GPUs.
    #[value(name = "synthetic-1b")]
    Synthetic1b,
    /// About 8.0B parameters in Llama 3 8B's dimensions, Q8_0 weights
    /// (`LlamaConfig::synthetic_8b`), for GPUs.
    #[value(name = "synthetic-8b")]
    Synthetic8b,
    /// A Mixtral-layout mixture of experts (`LlamaConfig::synthetic_moe`): the 100M model's
    /// attention with 8 experts of 512 per block, 2 used per token; Q8_0, 181M parameters.
    #[value(name = "synthetic-moe")]
    SyntheticMoe,
    /// The 0.1M-parameter test model (`LlamaConfig::tiny`).
    Tiny,
}

impl ModelPreset {
    /// The preset's hyper-parameters.
    pub fn config(self) -> LlamaConfig {
        match self {
            ModelPreset::Synthetic100m => LlamaConfig::synthetic_100m(),
            ModelPreset::Synthetic1b => LlamaConfig::synthetic_1b(),
            ModelPreset::Synthetic8b => LlamaConfig::synthetic_8b(),
            ModelPreset::SyntheticMoe => LlamaConfig::synthetic_moe(),
            ModelPreset::Tiny => LlamaConfig::tiny(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_cache_flags_are_rewritten() {
        let args = [
            "tessera",
            "bench",
            "-ctk",
            "q8_0",
            "-ctv=q4_0",
            "-c",
            "64",
            "-ctkx",
        ];
        let out = rewrite_llama_flags(args.iter().map(std::ffi::OsString::from));
        let out: Vec<&str> = out.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            out,
            [
                "tessera",
                "bench",
                "--cache-type-k",
                "q8_0",
                "--cache-type-v=q4_0",
                "-c",
                "64",
                "-ctkx"
            ]
        );
    }
}
