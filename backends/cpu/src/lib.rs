//! The Tessera CPU backend: every op of the op set, multi-threaded, with SIMD kernels from
//! `tessera-kernels` chosen at run time.
//!
//! One process may hold several CPU devices, each pinned to a disjoint set of cores with its own
//! thread pool, so a model split across them computes in parallel. By default the registry
//! exposes one device, `CPU`; `TESSERA_CPU_DEVICES=N` exposes `CPU0..CPU{N-1}`, and the `cpu:N`
//! selector (or [`split_devices`]) makes N on demand. N may exceed the core count: idle workers
//! park, so the machine stays correct, only slower.
//!
//! The registry exports the comm trio: an all-reduce between CPU devices over shared memory, run
//! by the devices' own streams (one-shot for small slices, fused reduce-scatter + all-gather for
//! large ones; see `comm/mod.rs`).
//!
//! ```
//! use tessera_core::{BackendOptions, Context, DType, Device};
//! let dev = tessera_cpu::CpuDevice::new("CPU", vec![]);
//! let mut ctx = Context::new();
//! let a = ctx.new_tensor(DType::F32, [4]).unwrap();
//! let b = ctx.scale(a, 2.0).unwrap();
//! let graph = ctx.build_forward(b).unwrap();
//! let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
//! buf.set_f32(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
//! let mut backend = dev.init_backend(&BackendOptions::with_threads(2)).unwrap();
//! backend.compute(&graph, buf.bindings()).unwrap();
//! backend.synchronize().unwrap();
//! assert_eq!(buf.get_f32(b).unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
//! ```
#![deny(unsafe_code)]

mod buffer;
mod comm;
mod device;
mod ops;
mod pool;
mod repack;
mod stream;
mod sys;
mod tview;

pub use buffer::{CPU_ALIGNMENT, CpuBuffer, CpuBufferType};
pub use comm::STREAM_FROM_ENV;
pub use device::CpuDevice;
pub use stream::CpuBackend;

use std::sync::Arc;
use tessera_core::{Device, Error, Registry, Result};

/// Environment variable: number of CPU devices the registry exposes by default.
pub const DEVICES_ENV: &str = "TESSERA_CPU_DEVICES";

/// `n` CPU devices named `CPU0..`, each pinned to its own share of the cores this process may use
/// (one core each, round-robin, when `n` exceeds the core count).
pub fn split_devices(n: usize) -> Vec<CpuDevice> {
    let cores = sys::allowed_cores();
    let c = cores.len().max(1);
    (0..n)
        .map(|i| {
            let mine = if n <= c {
                cores[i * c / n..(i + 1) * c / n].to_vec()
            } else {
                vec![cores[i % c]]
            };
            CpuDevice::new(&format!("CPU{i}"), mine)
        })
        .collect()
}

/// The CPU backend's registry.
#[derive(Debug, Default)]
pub struct CpuRegistry;

impl Registry for CpuRegistry {
    fn name(&self) -> &str {
        "cpu"
    }
    fn probe(&self) -> Result<()> {
        Ok(())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        match tessera_core::settings::var(DEVICES_ENV) {
            Some(v) => {
                let n: usize = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|&n| (1..=256).contains(&n))
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "{DEVICES_ENV}={v}: expected a device count in 1..=256"
                        ))
                    })?;
                Ok(split_devices(n)
                    .into_iter()
                    .map(|d| Arc::new(d) as Arc<dyn Device>)
                    .collect())
            }
            None => Ok(vec![Arc::new(CpuDevice::new("CPU", sys::allowed_cores()))]),
        }
    }
    fn proc_address(&self, name: &str) -> Option<tessera_core::ProcAddress> {
        comm::proc_address(name)
    }
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        if n == 0 || n > 256 {
            return Err(Error::InvalidArgument(format!(
                "cpu:{n}: device count must be in 1..=256"
            )));
        }
        Ok(split_devices(n)
            .into_iter()
            .map(|d| Arc::new(d) as Arc<dyn Device>)
            .collect())
    }
}

/// The CPU registry, ready to register.
pub fn registry() -> Arc<dyn Registry> {
    Arc::new(CpuRegistry)
}
