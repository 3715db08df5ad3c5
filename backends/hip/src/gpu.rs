//! [`HipDriver`]: the HIP runtime table (`sys`) and the hipRTC / ahead-of-time compile step
//! (`compile`) behind the shared runtime's [`Driver`] trait; RCCL as its collective library.

use crate::compile;
use crate::sys::{DeviceMem, Function, Gpu, HIP_ERROR_NO_DEVICE, Hip, Module, RawEvent, Stream};
use std::sync::Arc;
use tessera_core::{Error, Result};
use tessera_gpu::nccl::Nccl;
use tessera_gpu::{Driver, NoPinned, RegistryDriver, Runtime, Unit};

/// Environment variable choosing the all-reduce path: `rccl` (default) or `none` (always the
/// generic fallback).
pub const ALLREDUCE_ENV: &str = "TESSERA_HIP_ALLREDUCE";
/// Environment variable naming the RCCL library (or its directory).
pub const RCCL_PATH_ENV: &str = "TESSERA_RCCL_PATH";

/// Loads RCCL: [`RCCL_PATH_ENV`], `librccl.so.1` / `librccl.so` on the loader's path, then
/// `/opt/rocm/lib`.
///
/// # Errors
/// [`Error::Unavailable`] saying what was tried.
pub fn load_rccl() -> Result<Nccl> {
    Nccl::load_named("hip", RCCL_PATH_ENV, &["librccl.so.1", "librccl.so"], &[]).or_else(|e| {
        Nccl::load_from(std::path::Path::new("/opt/rocm/lib/librccl.so.1")).map_err(|_| e)
    })
}

/// Environment variable forcing the gfx target of every GPU (e.g. `gfx90a`).
pub const ARCH_ENV: &str = "TESSERA_HIP_ARCH";
/// Set to `1` to record programs with hipGraph and replay them. Off by default until it has run
/// on an AMD GPU (none has been at hand): CI only checks that the runtime exports the calls.
pub const GRAPHS_ENV: &str = "TESSERA_HIP_GRAPHS";

/// The gfx target of HIP device `ordinal`: [`ARCH_ENV`], else the `gfx_target_version` of the
/// ordinal-th GPU node of the KFD topology in sysfs (honouring `HIP_VISIBLE_DEVICES` /
/// `ROCR_VISIBLE_DEVICES` lists of indices). This avoids `hipDeviceProp_t::gcnArchName`, whose
/// offset differs between ROCm 5 and 6.
pub fn arch_of(ordinal: usize) -> Option<String> {
    if let Ok(a) = std::env::var(ARCH_ENV)
        && !a.is_empty()
    {
        return Some(a);
    }
    let mut nodes: Vec<(usize, u32)> = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let idx: usize = e.file_name().to_str()?.parse().ok()?;
            let props = std::fs::read_to_string(e.path().join("properties")).ok()?;
            let v = props.lines().find_map(|l| {
                l.strip_prefix("gfx_target_version ")
                    .and_then(|v| v.trim().parse::<u32>().ok())
            })?;
            (v != 0).then_some((idx, v))
        })
        .collect();
    nodes.sort_unstable();
    let visible = ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
    let index = match visible {
        Some(list) => list.split(',').nth(ordinal)?.trim().parse().ok()?,
        None => ordinal,
    };
    nodes.get(index).map(|&(_, v)| gfx_name(v))
}

/// `gfx_target_version` (major·10000 + minor·100 + stepping) as a gfx name: 90010 → `gfx90a`.
pub fn gfx_name(v: u32) -> String {
    format!("gfx{}{:x}{:x}", v / 10000, (v / 100) % 100, v % 100)
}

/// The HIP runtime with hipRTC, as the shared GPU runtime drives it.
#[derive(Debug)]
pub struct HipDriver;

/// Loads the runtime and opens every GPU, or says why not.
fn open() -> std::result::Result<Runtime<HipDriver>, String> {
    let hip = Hip::get()?;
    let count = match hip.device_count() {
        Ok(0) => return Err("the HIP runtime reports no devices".into()),
        Ok(n) => n,
        Err(Error::Driver { code, .. }) if code == HIP_ERROR_NO_DEVICE as i64 => {
            return Err(format!(
                "no AMD GPU (hipGetDeviceCount: hipErrorNoDevice; runtime {})",
                hip.path().display()
            ));
        }
        Err(e) => return Err(e.to_string()),
    };
    tracing::debug!(count, runtime = ?hip.runtime_version().ok(), "HIP available");
    Runtime::open_each(HipDriver, count, |i| {
        let arch = arch_of(i)
            .ok_or_else(|| format!("unknown gfx target (set {ARCH_ENV}, e.g. gfx90a)"))?;
        Gpu::open(hip, i, arch).map_err(|e| e.to_string())
    })
}

impl Driver for HipDriver {
    const NAME: &'static str = "hip";

    tessera_gpu::forward_driver_methods!(
        Gpu = Gpu,
        Mem = DeviceMem,
        Pinned = NoPinned,
        Stream = Stream,
        Event = RawEvent,
        Module = Module,
        Function = Function,
    );

    fn describe(g: &Gpu) -> String {
        format!(
            "{} (GPU {}, {}, {} CUs, wave{})",
            g.name(),
            g.ordinal(),
            g.arch(),
            g.compute_units(),
            g.warp_size()
        )
    }
    fn load_module(&self, gpu: &Arc<Gpu>, unit: &Unit) -> Result<Module> {
        compile::load_module(gpu, unit.file)
    }
    // Replay through hipGraph, as CUDA's through CUDA graphs (the runtime's capture API mirrors
    // CUDA's), when asked for (GRAPHS_ENV); a runtime without it launches node by node.
    fn record_begin(stream: &Stream) -> Result<bool> {
        let wanted = tessera_core::settings::var(GRAPHS_ENV).is_some_and(|v| v.trim() == "1");
        if !wanted || !stream.can_record() {
            return Ok(false);
        }
        stream.begin_capture().map(|()| true)
    }
    fn record_end(stream: &Stream) -> Result<Box<dyn std::any::Any + Send + Sync>> {
        Ok(Box::new(stream.end_capture()?))
    }
    fn replay(stream: &Stream, recorded: &(dyn std::any::Any + Send + Sync)) -> Result<()> {
        match recorded.downcast_ref::<crate::sys::GraphExec>() {
            Some(g) => stream.launch_graph(g),
            None => Err(tessera_core::Error::InvalidArgument(
                "hip: a recording of another backend".into(),
            )),
        }
    }
}

impl RegistryDriver for HipDriver {
    const DEVICE_PREFIX: &'static str = "HIP";
    const ALLREDUCE_ENV: &'static str = ALLREDUCE_ENV;

    tessera_gpu::forward_registry_methods!(HipDriver, open);

    fn load_collectives() -> Result<Nccl> {
        load_rccl()
    }
}
