//! Programs for one SYCL context: each compile unit (one kernel, for the element types of the
//! launches that use it: `tessera_kernels::gpu::unit`) is built as a SYCL program the first time
//! it is needed, then kept for the process and shared by the devices of the context (the shared
//! runtime's kernel cache asks [`Programs::program`] once per unit and device). Small units keep
//! each OpenCL CPU JIT compile to seconds. Across processes the runtime's persistent cache
//! (turned on by the registry, keyed by source hash, build options and device) makes rebuilds a
//! fraction of a second.

use crate::sys::{Platform, Program};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tessera_core::{Error, Result};
use tessera_kernels::gpu::unit::Unit;

/// A unit's build, done once: the program or the reason it failed.
type Built = Arc<OnceLock<std::result::Result<Arc<Program>, String>>>;

/// Programs of one context (a root device and its sub-devices).
#[derive(Debug)]
pub(crate) struct Programs {
    platform: Arc<Platform>,
    /// Device used to name the context in builds (its root).
    device: usize,
    /// The lock is held only to find or add a slot, so builds of different units overlap.
    programs: Mutex<HashMap<Unit, Built>>,
}

impl Programs {
    pub(crate) fn new(platform: Arc<Platform>, device: usize) -> Programs {
        Programs {
            platform,
            device,
            programs: Mutex::new(HashMap::new()),
        }
    }

    /// The program of `unit`, built once (a failure is kept: the compiler's verdict on a source
    /// does not change).
    pub(crate) fn program(&self, unit: &Unit) -> Result<Arc<Program>> {
        let slot = self.programs.lock().entry(*unit).or_default().clone();
        slot.get_or_init(|| self.build(unit))
            .clone()
            .map_err(|reason| Error::Compute {
                device: self.device_name(),
                reason,
            })
    }

    /// Builds `unit`, or says why it did not build.
    fn build(&self, unit: &Unit) -> std::result::Result<Arc<Program>, String> {
        let label = unit.label();
        let source = tessera_kernels::sycl::unit_source(unit)
            .ok_or_else(|| format!("no kernel source {}", unit.file))?;
        let start = Instant::now();
        let program = Program::build(&self.platform, self.device, &source)
            .map_err(|e| format!("building {label}: {e}"))?;
        let seconds = start.elapsed().as_secs_f64();
        // A cold build takes a second or two; more is worth seeing without debug logs (small
        // units are what keeps it so).
        if seconds > 20.0 {
            tracing::info!(device = %self.device_name(), unit = %label, seconds, "slow SYCL kernel build");
        } else {
            tracing::debug!(device = %self.device_name(), unit = %label, seconds, "SYCL kernels built");
        }
        Ok(Arc::new(program))
    }

    fn device_name(&self) -> String {
        self.platform.devices[self.device].name.clone()
    }
}
