//! The Tessera HIP/ROCm backend.
//!
//! - The HIP runtime (`libamdhip64`) and hipRTC are loaded at run time through a hand-written
//!   function table ([`sys`]), so a binary built with this crate builds and starts on a machine
//!   without ROCm: the registry then has no devices and [`HipRegistry::reason`] says why.
//! - Kernels are the CUDA C sources of `tessera_kernels::gpu` through the compat header of
//!   `tessera_kernels::hip`, compiled by hipRTC for each GPU's gfx target and cached on disk
//!   ([`compile`]), or loaded from code objects built ahead of time by `hipcc --genco`.
//! - Devices, buffers, streams, events, the kernel cache, the registry and the comm trio are the
//!   shared GPU runtime's (`tessera-gpu`) over the [`HipDriver`]; this crate keeps
//!   the FFI table ([`sys`]), the compile step ([`compile`]) and that trait impl.
//! - The comm trio runs all-reduces through RCCL (`librccl.so.1`, the NCCL C API, loaded with
//!   the shared NCCL table); without RCCL it declines and the generic all-reduce runs.
//!
//! Devices are `HIP0..` (one per GPU); `hip:N` may ask for more logical devices than GPUs.
//!
//! ```
//! let reg = tessera_hip::HipRegistry::new();
//! match reg.reason() {
//!     None => println!("{} AMD GPU(s)", reg.gpu_count()),
//!     Some(why) => println!("no HIP devices: {why}"),
//! }
//! ```
#![deny(unsafe_code)]

pub mod compile;
mod gpu;
pub mod sys;

pub use gpu::{
    ALLREDUCE_ENV, ARCH_ENV, GRAPHS_ENV, HipDriver, RCCL_PATH_ENV, arch_of, gfx_name, load_rccl,
};

use std::sync::Arc;
use tessera_core::Registry;

/// Alignment of tensor offsets in HIP buffers.
pub const HIP_ALIGNMENT: usize = tessera_gpu::GPU_ALIGNMENT;
/// The HIP backend's registry.
pub type HipRegistry = tessera_gpu::GpuRegistry<HipDriver>;
/// A HIP device.
pub type HipDevice = tessera_gpu::GpuDevice<HipDriver>;
/// The memory of one HIP device.
pub type HipBufferType = tessera_gpu::GpuBufferType<HipDriver>;
/// A block of HIP device memory.
pub type HipBuffer = tessera_gpu::GpuBuffer<HipDriver>;
/// A stream of work on a HIP device.
pub type HipBackend = tessera_gpu::GpuStream<HipDriver>;
/// A HIP event.
pub type HipEvent = tessera_gpu::GpuEvent<HipDriver>;

/// The HIP registry, ready to register.
pub fn registry() -> Arc<dyn Registry> {
    Arc::new(HipRegistry::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_names() {
        assert_eq!(gfx_name(90010), "gfx90a");
        assert_eq!(gfx_name(100300), "gfx1030");
        assert_eq!(gfx_name(110000), "gfx1100");
        assert_eq!(gfx_name(90402), "gfx942");
    }

    #[test]
    fn trio_is_exported_and_declines_without_streams() {
        use tessera_core::comm::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT, CommApi};
        let reg = HipRegistry::new();
        for name in [COMM_INIT, COMM_ALLREDUCE, COMM_FREE] {
            assert!(
                reg.proc_address(name)
                    .is_some_and(|p| !p.as_ptr().is_null())
            );
        }
        assert!(reg.proc_address("tessera_nope").is_none());
        assert!(
            CommApi::from_registry(&reg)
                .unwrap()
                .init(&mut [])
                .is_none()
        );
    }

    #[test]
    fn rccl_missing_is_an_error_not_a_panic() {
        if let Err(e) = load_rccl() {
            assert!(e.to_string().contains("librccl"), "{e}");
        }
    }

    #[test]
    fn no_device_is_a_reason_not_a_panic() {
        let reg = HipRegistry::new();
        if let Some(why) = reg.reason() {
            assert_eq!(reg.gpu_count(), 0);
            assert!(reg.devices().is_err() && reg.probe().is_err(), "{why}");
        }
    }
}
