//! The Tessera SYCL backend.
//!
//! - A host-only C++ shim (`shim/tessera_sycl_shim.cpp`), compiled by the build script against a
//!   SYCL runtime's headers and `libsycl` (found by `tessera-toolchain`: `SYCL_ROOT`, a `.venv-sycl`
//!   or `.venv` with the `dpcpp-cpp-rt` wheel, or oneAPI), is loaded at run time, so the crate
//!   builds and a binary starts without any runtime: the registry then has no devices and
//!   [`SyclRegistry::reason`] says why.
//! - Kernels are the CUDA C sources of `tessera_kernels::gpu` made SYCL free-function kernels by
//!   `kernels/sycl/compat.hpp`, compiled at run time by the runtime's kernel compiler and cached
//!   in memory per context and on disk by the runtime's persistent cache ([`cache_dir`]).
//! - Devices: every SYCL device (`SYCL0`, ...) and the sub-devices of each root that partitions
//!   into equal halves (`SYCL0.0`, `SYCL0.1`), all in one context per root.
//! - Devices, buffers, streams (in-order queues) and events are the shared GPU runtime's
//!   (`tessera-gpu`) over the [`Sycl`] driver; this crate keeps the shim table (`sys`), the
//!   program builds (`compile`), that trait impl and its enumeration of roots and sub-devices.
//! - The comm trio runs the two-device ring all-reduce ([`comm`]).
//!
//! ```
//! let reg = tessera_sycl::SyclRegistry::new();
//! match reg.reason() {
//!     None => println!("SYCL devices available"),
//!     Some(why) => println!("no SYCL devices: {why}"),
//! }
//! ```
#![deny(unsafe_code)]

pub mod comm;
mod compile;
mod device;
mod gpu;
mod sys;

pub use gpu::{SYCL_ALIGNMENT, Sycl};

use compile::Programs;
use device::DevState;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use sys::{Platform, Shim};
use tessera_core::{Device, Error, ProcAddress, Registry, Result};
use tessera_gpu::{GpuContext, GpuDevice};

/// A SYCL device (a root device, a sub-device, or a logical device sharing a root).
pub type SyclDevice = GpuDevice<Sycl>;
/// The memory of one SYCL device (USM `malloc_device`).
pub type SyclBufferType = tessera_gpu::GpuBufferType<Sycl>;
/// A block of SYCL device memory.
pub type SyclBuffer = tessera_gpu::GpuBuffer<Sycl>;
/// A stream of work on a SYCL device: an in-order queue.
pub type SyclBackend = tessera_gpu::GpuStream<Sycl>;
/// A SYCL event.
pub type SyclEvent = tessera_gpu::GpuEvent<Sycl>;

/// Environment variable naming the shim library to load instead of the one built with the crate.
pub const SHIM_ENV: &str = "TESSERA_SYCL_SHIM";
/// Environment variable: `0` turns the on-disk kernel cache off; a path moves it.
pub const CACHE_ENV: &str = "TESSERA_SYCL_CACHE";

/// Where compiled kernels persist across processes: `$TESSERA_SYCL_CACHE`, or
/// `$XDG_CACHE_HOME/tessera/sycl` (`~/.cache/tessera/sycl`), in a folder named after the runtime
/// library the shim was built against (`libsycl-<size>`); `None` when turned off. The runtime
/// keys entries by source hash, build options and device; it stores the compiled source the
/// first time and the device binaries the second, so from the third process on a source loads
/// in a fraction of a second.
pub fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os(CACHE_ENV) {
        Some(v) if v == "0" => return None,
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("tessera/sycl"),
    };
    // Wheels hold no symlinks, so the library's file name carries no version: its size tells
    // runtime builds apart.
    let root = PathBuf::from(env!("TESSERA_SYCL_ROOT_BUILT"));
    let runtime = std::fs::metadata(root.join("lib/libsycl.so"))
        .map(|m| format!("libsycl-{}", m.len()))
        .unwrap_or_else(|_| "unknown-runtime".into());
    Some(base.join(runtime))
}

/// Devices of this process: (registry name, runtime index) in listing order, plus shared state.
struct Shared {
    platform: Arc<Platform>,
    /// Root devices as (name, index, sub-device indices).
    roots: Vec<(String, usize, Vec<usize>)>,
    driver: Arc<Sycl>,
    programs: Mutex<HashMap<usize, Arc<Programs>>>,
    contexts: Mutex<HashMap<String, Arc<GpuContext<Sycl>>>>,
}

fn shared() -> &'static std::result::Result<Shared, String> {
    static SHARED: OnceLock<std::result::Result<Shared, String>> = OnceLock::new();
    SHARED.get_or_init(|| {
        let path = match std::env::var_os(SHIM_ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => {
                let built = env!("TESSERA_SYCL_SHIM_BUILT");
                if built.is_empty() {
                    return Err(env!("TESSERA_SYCL_MISSING").to_string());
                }
                PathBuf::from(built)
            }
        };
        let shim = Shim::load(&path).map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        let icd = PathBuf::from(env!("TESSERA_SYCL_ROOT_BUILT")).join("lib/libintelocl.so");
        let cache = cache_dir();
        if let Some(c) = &cache
            && let Err(e) = std::fs::create_dir_all(c)
        {
            tracing::debug!(dir = %c.display(), error = %e, "SYCL kernel cache unavailable");
        }
        let platform = Platform::open(
            shim,
            true,
            cache.as_deref(),
            icd.exists().then_some(icd.as_path()),
        )
        .map_err(|e| e.to_string())?;
        if platform.devices.is_empty() {
            return Err("the SYCL runtime reports no devices (no OpenCL CPU runtime or GPU driver registered)".into());
        }
        let mut roots = Vec::new();
        for (i, d) in platform.devices.iter().enumerate() {
            match d.root {
                None => roots.push((format!("SYCL{}", roots.len()), i, Vec::new())),
                Some(r) => {
                    if let Some(root) = roots.iter_mut().find(|(_, idx, _)| *idx == r) {
                        root.2.push(i);
                    }
                }
            }
        }
        tracing::debug!(devices = platform.devices.len(), version = %platform.version, "SYCL available");
        Ok(Shared {
            platform: Arc::new(platform),
            roots,
            driver: Arc::new(Sycl),
            programs: Mutex::new(HashMap::new()),
            contexts: Mutex::new(HashMap::new()),
        })
    })
}

impl Shared {
    fn context(&self, name: &str, index: usize) -> Result<Arc<GpuContext<Sycl>>> {
        // Held throughout, so concurrent lookups of one name share one state (its buffers,
        // queues and kernels).
        let mut contexts = self.contexts.lock();
        if let Some(c) = contexts.get(name) {
            return Ok(c.clone());
        }
        let root = self.platform.devices[index].root.unwrap_or(index);
        let programs = self
            .programs
            .lock()
            .entry(root)
            .or_insert_with(|| Arc::new(Programs::new(self.platform.clone(), root)))
            .clone();
        let state = DevState::new(name.to_string(), &self.platform, index, programs)?;
        let ctx = Arc::new(GpuContext::new(self.driver.clone(), Arc::new(state)));
        contexts.insert(name.to_string(), ctx.clone());
        Ok(ctx)
    }

    fn device(&self, name: String, index: usize) -> Result<Arc<dyn Device>> {
        let ctx = self.context(&name, index)?;
        Ok(Arc::new(SyclDevice::new(&name, ctx, false)))
    }
}

/// The SYCL backend's registry.
#[derive(Debug, Default)]
pub struct SyclRegistry;

impl SyclRegistry {
    /// The registry (cheap; the runtime is opened once per process, on first use).
    pub fn new() -> SyclRegistry {
        SyclRegistry
    }

    /// Why the backend has no devices here (no runtime at build time, shim not loadable, no
    /// device), or `None` when it has. Never panics.
    pub fn reason(&self) -> Option<String> {
        shared().as_ref().err().cloned()
    }

    fn shared(&self) -> Result<&'static Shared> {
        shared().as_ref().map_err(|reason| Error::Unavailable {
            backend: "sycl".into(),
            reason: reason.clone(),
        })
    }
}

impl Registry for SyclRegistry {
    fn name(&self) -> &str {
        "sycl"
    }
    fn probe(&self) -> Result<()> {
        self.shared().map(|_| ())
    }
    /// Every root device followed by its sub-devices.
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        let s = self.shared()?;
        let mut out = Vec::new();
        for (name, idx, subs) in &s.roots {
            out.push(s.device(name.clone(), *idx)?);
            for (j, sub) in subs.iter().enumerate() {
                out.push(s.device(format!("{name}.{j}"), *sub)?);
            }
        }
        Ok(out)
    }
    /// `sycl:1` is `SYCL0`; `sycl:N` are the first N sub-devices of `SYCL0` when it has that
    /// many, else N logical devices sharing it (`SYCL0/0`, ...), each with its own queues.
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        let s = self.shared()?;
        if n == 0 || n > 64 {
            return Err(Error::InvalidArgument(format!(
                "sycl:{n}: device count must be in 1..=64"
            )));
        }
        let (name, idx, subs) = &s.roots[0];
        if n == 1 {
            return Ok(vec![s.device(name.clone(), *idx)?]);
        }
        if subs.len() >= n {
            return subs
                .iter()
                .take(n)
                .enumerate()
                .map(|(j, sub)| s.device(format!("{name}.{j}"), *sub))
                .collect();
        }
        (0..n)
            .map(|j| s.device(format!("{name}/{j}"), *idx))
            .collect()
    }
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        comm::proc_address(name)
    }
}

/// The SYCL registry, ready to register.
pub fn registry() -> Arc<dyn Registry> {
    Arc::new(SyclRegistry::new())
}
