//! The per-process state: the driver ([`Runtime`]) and, per GPU, its context and lazily built
//! kernels ([`GpuContext`], [`Kernels`]). Built before anything that uses it (buffers, streams,
//! devices), so the modules above import this one and never each other in a circle.

use crate::driver::Driver;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use tessera_core::{Error, Result};
use tessera_kernels::cuda::{KERNELS, SOURCES};

/// A vendor's driver and its GPUs, opened once per process.
#[derive(Debug)]
pub struct Runtime<D: Driver> {
    driver: Arc<D>,
    gpus: Vec<Arc<GpuContext<D>>>,
}

impl<D: Driver> Runtime<D> {
    /// The runtime over `driver` with `gpus` (every physical GPU, in ordinal order).
    ///
    /// # Errors
    /// The reason there are no devices when `gpus` is empty.
    pub fn new(driver: D, gpus: Vec<Arc<D::Gpu>>) -> std::result::Result<Runtime<D>, String> {
        if gpus.is_empty() {
            return Err(format!("the {} driver reports no devices", D::NAME));
        }
        let driver = Arc::new(driver);
        let gpus = gpus
            .into_iter()
            .map(|gpu| {
                Arc::new(GpuContext {
                    gpu,
                    driver: driver.clone(),
                    kernels: OnceLock::new(),
                })
            })
            .collect();
        Ok(Runtime { driver, gpus })
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// Every GPU.
    pub fn gpus(&self) -> &[Arc<GpuContext<D>>] {
        &self.gpus
    }
}

/// One GPU with its lazily built kernels, shared by the logical devices on it.
#[derive(Debug)]
pub struct GpuContext<D: Driver> {
    gpu: Arc<D::Gpu>,
    driver: Arc<D>,
    kernels: OnceLock<std::result::Result<Arc<Kernels<D>>, String>>,
}

impl<D: Driver> GpuContext<D> {
    /// The GPU.
    pub fn gpu(&self) -> &Arc<D::Gpu> {
        &self.gpu
    }

    /// The driver ordinal.
    pub fn ordinal(&self) -> usize {
        D::ordinal(&self.gpu)
    }

    /// The kernels, built on first use (once per process and GPU; later from the disk cache).
    ///
    /// # Errors
    /// [`Error::Compute`] naming the GPU and what failed (kept: later calls give it again).
    pub fn kernels(&self) -> Result<Arc<Kernels<D>>> {
        self.kernels
            .get_or_init(|| {
                Kernels::build(&*self.driver, &self.gpu)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|reason| Error::Compute {
                device: D::gpu_name(&self.gpu).to_string(),
                reason: format!("building the {} kernels failed: {reason}", D::NAME),
            })
    }
}

/// Every kernel of `tessera_kernels::cuda`, loaded on one GPU.
#[derive(Debug)]
pub struct Kernels<D: Driver> {
    // Declared before the modules: handles are dropped before the code they point into.
    functions: HashMap<&'static str, D::Function>,
    _modules: Vec<D::Module>,
}

impl<D: Driver> Kernels<D> {
    /// Loads every source for `gpu` (the driver compiles or finds each one).
    ///
    /// # Errors
    /// The first source that does not compile or load, or a kernel missing from it.
    pub fn build(driver: &D, gpu: &Arc<D::Gpu>) -> Result<Kernels<D>> {
        let mut modules = Vec::with_capacity(SOURCES.len());
        let mut functions = HashMap::new();
        for (file, _) in SOURCES {
            let module = driver.load_module(gpu, file)?;
            for (_, kernel) in KERNELS.iter().filter(|(f, _)| f == file) {
                let f = D::function(&module, kernel).map_err(|e| Error::Compute {
                    device: D::gpu_name(gpu).to_string(),
                    reason: format!("kernel {kernel} of {file}: {e}"),
                })?;
                functions.insert(*kernel, f);
            }
            modules.push(module);
        }
        tracing::debug!(backend = D::NAME, gpu = D::gpu_name(gpu), "kernels loaded");
        Ok(Kernels {
            functions,
            _modules: modules,
        })
    }

    /// The kernel `name`.
    ///
    /// # Errors
    /// [`Error::Compute`] when no source defines it.
    pub fn get(&self, name: &str) -> Result<D::Function> {
        self.functions
            .get(name)
            .copied()
            .ok_or_else(|| Error::Compute {
                device: D::NAME.into(),
                reason: format!("kernel {name} is not loaded"),
            })
    }
}
