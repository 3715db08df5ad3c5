//! The Tessera HIP/ROCm backend.
//!
//! - The HIP runtime (`libamdhip64`) and hipRTC are loaded at run time through a hand-written
//!   function table ([`sys`]), so a binary built with this crate builds and starts on a machine
//!   without ROCm: the registry then has no devices and [`HipRegistry::reason`] says why.
//! - Kernels are the CUDA C sources of `tessera_kernels::cuda` through the compat header of
//!   `tessera_kernels::hip`, compiled by hipRTC for each GPU's gfx target and cached on disk
//!   ([`compile`]), or loaded from code objects built ahead of time by `hipcc --genco`.
//! - The launch plans, argument packing and kernel cache are the CUDA backend's, shared.
//! - The comm trio runs all-reduces through RCCL (`librccl.so.1`, the NCCL C API, loaded with
//!   the CUDA backend's NCCL table); without RCCL it declines and the generic all-reduce runs.
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

mod comm;
pub mod compile;
mod device;
mod stream;
pub mod sys;

pub use comm::{ALLREDUCE_ENV, RCCL_PATH_ENV, load_rccl};
pub use device::{HIP_ALIGNMENT, HipBuffer, HipBufferType, HipDevice};
pub use stream::{HipBackend, HipEvent};

use device::GpuShared;
use std::sync::{Arc, OnceLock};
use sys::{HIP_ERROR_NO_DEVICE, Hip};
use tessera_core::{Device, Error, ProcAddress, Registry, Result};

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

/// The GPUs of this process (opened once), or why there are none.
fn gpus() -> &'static std::result::Result<Vec<Arc<GpuShared>>, String> {
    static GPUS: OnceLock<std::result::Result<Vec<Arc<GpuShared>>, String>> = OnceLock::new();
    GPUS.get_or_init(|| {
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
        (0..count)
            .map(|i| {
                let arch = arch_of(i).ok_or_else(|| {
                    format!("GPU {i}: unknown gfx target (set {ARCH_ENV}, e.g. gfx90a)")
                })?;
                sys::Gpu::open(hip, i, arch)
                    .map(|g| Arc::new(GpuShared::new(g)))
                    .map_err(|e| format!("GPU {i}: {e}"))
            })
            .collect()
    })
}

/// The HIP backend's registry.
#[derive(Debug, Default)]
pub struct HipRegistry;

impl HipRegistry {
    /// The registry (cheap; GPUs are probed once per process, on first use).
    pub fn new() -> HipRegistry {
        HipRegistry
    }

    /// Why the backend has no devices here (no runtime, no GPU, unknown target), or `None`.
    /// Never panics.
    pub fn reason(&self) -> Option<String> {
        gpus().as_ref().err().cloned()
    }

    /// Physical GPUs found (0 when unavailable).
    pub fn gpu_count(&self) -> usize {
        gpus().as_ref().map_or(0, Vec::len)
    }

    fn shared(&self) -> Result<&'static [Arc<GpuShared>]> {
        gpus().as_deref().map_err(|reason| Error::Unavailable {
            backend: "hip".into(),
            reason: reason.clone(),
        })
    }
}

impl Registry for HipRegistry {
    fn name(&self) -> &str {
        "hip"
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
                "hip:{n}: device count must be in 1..=256"
            )));
        }
        Ok((0..n)
            .map(|i| {
                Arc::new(HipDevice::new(
                    &format!("HIP{i}"),
                    gpus[i % gpus.len()].clone(),
                )) as Arc<dyn Device>
            })
            .collect())
    }
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        comm::proc_address(name)
    }
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
    fn no_device_is_a_reason_not_a_panic() {
        let reg = HipRegistry::new();
        if let Some(why) = reg.reason() {
            assert_eq!(reg.gpu_count(), 0);
            assert!(reg.devices().is_err() && reg.probe().is_err(), "{why}");
        }
    }
}
