//! The Tessera HIP/ROCm backend.
//!
//! - The HIP runtime (`libamdhip64`) and hipRTC are loaded at run time through a hand-written
//!   function table ([`sys`]), so a binary built with this crate builds and starts on a machine
//!   without ROCm: the registry then has no devices and [`HipRegistry::reason`] says why.
//! - Kernels are the CUDA C sources of `tessera_kernels::cuda` through the compat header of
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

pub use gpu::{ALLREDUCE_ENV, HipDriver, RCCL_PATH_ENV, load_rccl};

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

/// Environment variable forcing the gfx target of every GPU (e.g. `gfx90a`).
pub const ARCH_ENV: &str = "TESSERA_HIP_ARCH";

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
        use tessera_core::plugin::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT, CommApi};
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
