//! The Tessera CUDA backend: the CUDA driver API and NVRTC tables (`sys`), the NVRTC
//! compile step ([`compile`]) and the [`Cuda`] driver behind the shared GPU runtime
//! (`tessera-gpu`), which holds the devices, buffers, streams, events, registry and comm trio.
//!
//! - The driver (libcuda) is loaded at run time through cudarc and probed before any call, so a
//!   binary built with this crate starts on a machine without a driver: the registry then has no
//!   devices and [`CudaRegistry::reason`] says why (`tessera devices` prints it).
//! - Kernels are the CUDA C sources of `tessera_kernels::gpu`, compiled at run time by NVRTC
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

pub mod compile;
mod gpu;
mod sys;

pub use gpu::{ALLREDUCE_ENV, Cuda};
pub use sys::nvrtc;
pub use tessera_gpu::{f32_wire, loader, nccl};

use std::sync::Arc;
use tessera_core::Registry;

/// Alignment of tensor offsets in CUDA buffers.
pub const CUDA_ALIGNMENT: usize = tessera_gpu::GPU_ALIGNMENT;
/// The CUDA backend's registry.
pub type CudaRegistry = tessera_gpu::GpuRegistry<Cuda>;
/// A CUDA device.
pub type CudaDevice = tessera_gpu::GpuDevice<Cuda>;
/// The memory of one CUDA device.
pub type CudaBufferType = tessera_gpu::GpuBufferType<Cuda>;
/// A block of CUDA device memory.
pub type CudaBuffer = tessera_gpu::GpuBuffer<Cuda>;
/// Pinned host memory registered with a GPU.
pub type CudaHostBufferType = tessera_gpu::HostBufferType<Cuda>;
/// A block of pinned host memory.
pub type CudaHostBuffer = tessera_gpu::HostBuffer<Cuda>;
/// A stream of work on a CUDA device.
pub type CudaBackend = tessera_gpu::GpuStream<Cuda>;
/// A CUDA event.
pub type CudaEvent = tessera_gpu::GpuEvent<Cuda>;

/// The CUDA registry, ready to register.
pub fn registry() -> Arc<dyn Registry> {
    Arc::new(CudaRegistry::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::comm::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT};

    #[test]
    fn trio_is_exported() {
        let reg = CudaRegistry::new();
        for name in [COMM_INIT, COMM_ALLREDUCE, COMM_FREE] {
            assert!(
                reg.proc_address(name)
                    .is_some_and(|p| !p.as_ptr().is_null())
            );
        }
        assert!(reg.proc_address("tessera_nope").is_none());
    }

    #[test]
    fn init_declines_without_streams() {
        let api = tessera_core::comm::CommApi::from_registry(&CudaRegistry::new()).unwrap();
        assert!(api.init(&mut []).is_none());
    }
}
