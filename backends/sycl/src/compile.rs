//! Programs for one SYCL context: each CUDA source is built as a SYCL program the first time one
//! of its kernels is needed (about 1–10 s per source on the OpenCL CPU device), then kept for the
//! process and shared by the devices of the context (the shared runtime's kernel cache asks
//! [`Programs::program`] once per source and device). Across processes the runtime's persistent cache (turned on by the registry, keyed by
//! source hash, build options and device) makes rebuilds a fraction of a second.

use crate::sys::{Platform, Program};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tessera_core::{Error, Result};

/// Programs of one context (a root device and its sub-devices).
#[derive(Debug)]
pub(crate) struct Programs {
    platform: Arc<Platform>,
    /// Device used to name the context in builds (its root).
    device: usize,
    programs: Mutex<HashMap<&'static str, Arc<Program>>>,
}

impl Programs {
    pub(crate) fn new(platform: Arc<Platform>, device: usize) -> Programs {
        Programs {
            platform,
            device,
            programs: Mutex::new(HashMap::new()),
        }
    }

    /// The program of source `file`, built once (builds of different files may overlap).
    pub(crate) fn program(&self, file: &'static str) -> Result<Arc<Program>> {
        let mut programs = self.programs.lock();
        if let Some(p) = programs.get(file) {
            return Ok(p.clone());
        }
        let source = tessera_kernels::sycl::source(file).ok_or_else(|| Error::Compute {
            device: self.device_name(),
            reason: format!("no kernel source {file}"),
        })?;
        let start = Instant::now();
        let program =
            Program::build(&self.platform, self.device, &source).map_err(|e| Error::Compute {
                device: self.device_name(),
                reason: format!("building {file}: {e}"),
            })?;
        tracing::debug!(
            device = %self.device_name(),
            file,
            seconds = start.elapsed().as_secs_f64(),
            "SYCL kernels built"
        );
        let program = Arc::new(program);
        programs.insert(file, program.clone());
        Ok(program)
    }

    fn device_name(&self) -> String {
        self.platform.devices[self.device].name.clone()
    }
}
