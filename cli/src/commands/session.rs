//! What every model command shares: choosing devices for a split mode, and opening a
//! [`Session`] with a progress line and a load report. Commands import this module, never each
//! other.

use anyhow::Context as _;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Instant;
use tessera::{Device, registry};
use tessera_model::{LlamaConfig, LlamaModel, Session, SessionOptions, SplitMode};

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

/// Loads `model` on `devices` as `opts` says, with a progress line on a terminal, and reports
/// the load on stderr (rank 0 only under `--dist`).
///
/// # Errors
/// Split, allocation and upload errors, naming the devices.
pub(crate) fn open_session(
    model: &LlamaModel,
    devices: &[Arc<dyn Device>],
    opts: SessionOptions,
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
    let session = Session::open_with_progress(model, devices, &opts, progress)
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
    Ok(session)
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
