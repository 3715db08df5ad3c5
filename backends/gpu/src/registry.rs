//! [`GpuRegistry`]: a vendor's registry over its [`Runtime`](crate::Runtime): devices
//! `PREFIX0..` (one per GPU; `KIND:N` may ask for more logical devices than GPUs, which then
//! share GPUs round-robin), the reason when there are none, and the comm trio by name.

use crate::device::GpuDevice;
use crate::runtime::GpuContext;
use crate::runtime::RegistryDriver;
use std::marker::PhantomData;
use std::sync::Arc;
use tessera_core::{Device, Error, ProcAddress, Registry, Result};

/// The registry of the GPU backend of driver `D`.
#[derive(Debug)]
pub struct GpuRegistry<D: RegistryDriver>(PhantomData<fn() -> D>);

impl<D: RegistryDriver> Default for GpuRegistry<D> {
    fn default() -> Self {
        GpuRegistry(PhantomData)
    }
}

impl<D: RegistryDriver> GpuRegistry<D> {
    /// The registry (cheap; GPUs are probed once per process, on first use).
    pub fn new() -> GpuRegistry<D> {
        GpuRegistry::default()
    }

    /// Why the backend has no devices here (no driver, no GPU, no compiler), or `None` when it
    /// has. Never panics.
    pub fn reason(&self) -> Option<String> {
        D::runtime().as_ref().err().cloned()
    }

    /// Physical GPUs found (0 when unavailable).
    pub fn gpu_count(&self) -> usize {
        D::runtime().as_ref().map_or(0, |r| r.gpus().len())
    }

    fn gpus(&self) -> Result<&'static [Arc<GpuContext<D>>]> {
        D::runtime()
            .as_ref()
            .map(|r| r.gpus())
            .map_err(|reason| Error::Unavailable {
                backend: D::NAME.into(),
                reason: reason.clone(),
            })
    }
}

impl<D: RegistryDriver> Registry for GpuRegistry<D> {
    fn name(&self) -> &str {
        D::NAME
    }
    fn probe(&self) -> Result<()> {
        self.gpus().map(|_| ())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        self.devices_with_count(self.gpus()?.len())
    }
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        let gpus = self.gpus()?;
        if n == 0 || n > 256 {
            return Err(Error::InvalidArgument(format!(
                "{}:{n}: device count must be in 1..=256",
                D::NAME
            )));
        }
        Ok((0..n)
            .map(|i| {
                let ctx = gpus[i % gpus.len()].clone();
                let name = format!("{}{i}", D::DEVICE_PREFIX);
                Arc::new(GpuDevice::new(&name, ctx, D::PINNED_HOST)) as Arc<dyn Device>
            })
            .collect())
    }
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        crate::comm::proc_address::<D>(name)
    }
}
