//! The Tessera CUDA backend.
//!
//! - The driver (libcuda) is loaded at run time through cudarc and probed before any call, so a
//!   binary built with this crate starts on a machine without a driver: the registry then has no
//!   devices and [`CudaRegistry::reason`] says why (`tessera devices` prints it).
//! - Kernels are the CUDA C sources of `tessera_kernels::cuda`, compiled at run time by NVRTC
//!   ([`nvrtc`]) for each GPU's architecture and cached on disk ([`compile`]).
//! - Streams, events, async and peer copies and a pinned host buffer type implement the core
//!   traits; the comm trio runs all-reduces through NCCL ([`nccl`], `libnccl.so.2`).
//!
//! Devices are `CUDA0..` (one per GPU); the `cuda:N` selector may ask for more logical devices
//! than GPUs, which then share GPUs round-robin.
//!
//! ```
//! let reg = tessera_cuda::CudaRegistry::new();
//! match reg.reason() {
//!     None => println!("{} CUDA GPU(s)", reg.gpu_count()),
//!     Some(why) => println!("no CUDA devices: {why}"),
//! }
//! ```
#![deny(unsafe_code)]

mod buffer;
mod comm;
pub mod compile;
mod device;
mod ops;
mod stream;
mod sys;

pub use buffer::{CUDA_ALIGNMENT, CudaBuffer, CudaBufferType, CudaHostBuffer, CudaHostBufferType};
pub use comm::{ALLREDUCE_ENV, f32_wire};
pub use device::CudaDevice;
pub use stream::{CudaBackend, CudaEvent};
pub use sys::{nccl, nvrtc};

/// Finding and opening vendor libraries at run time (shared with the HIP backend).
pub mod loader {
    pub use crate::sys::{library_candidates, open_first};
}

use device::GpuShared;
use std::sync::{Arc, OnceLock};
use tessera_core::{Device, Error, ProcAddress, Registry, Result};

/// The GPUs of this process (opened once), or why there are none.
fn gpus() -> &'static std::result::Result<Vec<Arc<GpuShared>>, String> {
    static GPUS: OnceLock<std::result::Result<Vec<Arc<GpuShared>>, String>> = OnceLock::new();
    GPUS.get_or_init(|| {
        let count = sys::driver::probe()?;
        if count == 0 {
            return Err("the CUDA driver reports no devices".into());
        }
        let nvrtc = Arc::new(nvrtc::Nvrtc::load().map_err(|e| e.to_string())?);
        let version = sys::driver::driver_version().unwrap_or(0);
        tracing::debug!(count, driver = version, nvrtc = ?nvrtc.version(), "CUDA available");
        (0..count)
            .map(|i| {
                sys::driver::Gpu::open(i)
                    .map(|g| Arc::new(GpuShared::new(g, nvrtc.clone())))
                    .map_err(|e| format!("GPU {i}: {e}"))
            })
            .collect()
    })
}

/// The CUDA backend's registry.
#[derive(Debug, Default)]
pub struct CudaRegistry;

impl CudaRegistry {
    /// The registry (cheap; GPUs are probed once per process, on first use).
    pub fn new() -> CudaRegistry {
        CudaRegistry
    }

    /// Why the backend has no devices here (no driver, no GPU, no NVRTC), or `None` when it has.
    /// Never panics.
    pub fn reason(&self) -> Option<String> {
        match gpus() {
            Ok(_) => None,
            Err(e) => Some(e.clone()),
        }
    }

    /// Physical GPUs found (0 when unavailable).
    pub fn gpu_count(&self) -> usize {
        gpus().as_ref().map_or(0, Vec::len)
    }

    fn shared(&self) -> Result<&'static [Arc<GpuShared>]> {
        gpus().as_deref().map_err(|reason| Error::Unavailable {
            backend: "cuda".into(),
            reason: reason.clone(),
        })
    }
}

impl Registry for CudaRegistry {
    fn name(&self) -> &str {
        "cuda"
    }
    fn probe(&self) -> Result<()> {
        self.shared().map(|_| ())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        self.devices_with_count(self.shared()?.len())
    }
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        let gpus = self.shared()?;
        if n == 0 || n > 256 {
            return Err(Error::InvalidArgument(format!(
                "cuda:{n}: device count must be in 1..=256"
            )));
        }
        Ok((0..n)
            .map(|i| {
                Arc::new(CudaDevice::new(
                    &format!("CUDA{i}"),
                    gpus[i % gpus.len()].clone(),
                )) as Arc<dyn Device>
            })
            .collect())
    }
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        comm::proc_address(name)
    }
}

/// The CUDA registry, ready to register.
pub fn registry() -> Arc<dyn Registry> {
    Arc::new(CudaRegistry::new())
}
