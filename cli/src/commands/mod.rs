//! The `tessera` command line: device listing, op conformance, op and model benchmarks.

pub mod args;
pub mod batched_bench;
pub mod bench;
pub mod bench_allreduce;
pub mod bench_mem;
pub mod bench_ops;
pub mod devices;
pub mod dist;
pub mod inputs;
pub mod kld;
pub mod run;
pub mod session;
pub mod soak;
pub mod test_ops;
pub mod test_tp;

use std::sync::Arc;
use tessera::{Device, registry};

/// The architectures `run`, `bench -m` and `write-synthetic` accept, one per line with the
/// models they cover, from the model crate's architecture table.
pub fn architectures_help() -> String {
    let mut out = String::from("Architectures (GGUF `general.architecture`):\n");
    for a in tessera_model::Arch::ALL {
        out += &format!("  {:<10} {}\n", a.name(), a.models());
    }
    out
}

/// Devices for a `--devices` list, or every registered device when none is given.
pub fn select_devices(
    list: Option<&str>,
    backend: Option<&str>,
) -> anyhow::Result<Vec<Arc<dyn Device>>> {
    let reg = registry();
    let mut devs = match list {
        Some(l) => reg.select(l)?,
        None => reg.devices(),
    };
    if let Some(b) = backend {
        devs.retain(|d| {
            d.backend_name().eq_ignore_ascii_case(b) || d.name().eq_ignore_ascii_case(b)
        });
    }
    Ok(devs)
}

/// Parses a comma-separated list of positive integers (`1,2`).
pub fn parse_list(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| anyhow::anyhow!("'{x}' is not a positive integer"))
        })
        .map(|r| match r {
            Ok(0) => Err(anyhow::anyhow!("'0' is not a positive integer")),
            r => r,
        })
        .collect()
}
