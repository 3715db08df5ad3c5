//! [`HipDriver`]: the HIP runtime table (`sys`) and the hipRTC / ahead-of-time compile step
//! (`compile`) behind the shared runtime's [`Driver`] trait; RCCL as its collective library.

use crate::sys::{DeviceMem, Function, Gpu, HIP_ERROR_NO_DEVICE, Hip, Module, RawEvent, Stream};
use crate::{ARCH_ENV, arch_of, compile};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use tessera_core::{Error, Result};
use tessera_gpu::nccl::Nccl;
use tessera_gpu::{Driver, NoPinned, RegistryDriver, Runtime};
use tessera_kernels::cuda::plan::{ArgSlots, Launch};

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
    let gpus = (0..count)
        .map(|i| {
            let arch = arch_of(i).ok_or_else(|| {
                format!("GPU {i}: unknown gfx target (set {ARCH_ENV}, e.g. gfx90a)")
            })?;
            Gpu::open(hip, i, arch).map_err(|e| format!("GPU {i}: {e}"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Runtime::new(HipDriver, gpus)
}

impl Driver for HipDriver {
    const NAME: &'static str = "hip";
    type Gpu = Gpu;
    type Mem = DeviceMem;
    type Pinned = NoPinned;
    type Stream = Stream;
    type Event = RawEvent;
    type Module = Module;
    type Function = Function;

    tessera_gpu::forward_driver_methods!();

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

    fn copy_peer_async(
        s: &Stream,
        dst: &DeviceMem,
        doff: usize,
        src: &DeviceMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        // `copy_dtod` picks hipMemcpyPeerAsync for memory of two GPUs.
        s.copy_dtod(dst, doff, src, soff, len)
    }

    fn load_module(&self, gpu: &Arc<Gpu>, file: &'static str) -> Result<Module> {
        compile::load_module(gpu, file)
    }
    #[allow(unsafe_code)]
    unsafe fn launch(stream: &Stream, f: &Function, launch: &Launch) -> Result<()> {
        let mut args = ArgSlots::from_launch(launch);
        // SAFETY: the caller's contract (`Driver::launch`) is `sys::launch`'s, for the
        // arguments `launch` lists, packed in order.
        unsafe { crate::sys::launch(stream, *f, launch.grid, launch.block, &mut args) }
    }
}

impl RegistryDriver for HipDriver {
    const DEVICE_PREFIX: &'static str = "HIP";
    const ALLREDUCE_ENV: &'static str = ALLREDUCE_ENV;

    fn runtime() -> &'static std::result::Result<Runtime<HipDriver>, String> {
        static RUNTIME: OnceLock<std::result::Result<Runtime<HipDriver>, String>> = OnceLock::new();
        RUNTIME.get_or_init(open)
    }

    fn stream_raw(stream: &Stream) -> *mut c_void {
        stream.raw()
    }

    fn load_collectives() -> Result<Nccl> {
        load_rccl()
    }
}
