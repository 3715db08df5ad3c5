//! The per-process state: the driver ([`Runtime`]) and, per GPU, its context and lazily loaded
//! kernels ([`GpuContext`], [`Kernels`]); and [`RegistryDriver`], the driver entry points of a
//! vendor whose GPUs the shared registry enumerates. Built before anything that uses it (buffers, streams,
//! devices), so the modules above import this one and never each other in a circle.

use crate::driver::Driver;
use crate::sys::nccl::Nccl;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tessera_core::{Error, Result};
use tessera_kernels::gpu::launch::Launch;
use tessera_kernels::gpu::unit::{TypeSet, Unit};
use tessera_kernels::gpu::{KERNELS, SOURCES};

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
            .map(|gpu| Arc::new(GpuContext::new(driver.clone(), gpu)))
            .collect();
        Ok(Runtime { driver, gpus })
    }

    /// The runtime over `driver` with GPUs `0..count`, each opened by `open`.
    ///
    /// # Errors
    /// The first GPU that does not open (`GPU i: why`), or no GPUs.
    pub fn open_each<E: std::fmt::Display>(
        driver: D,
        count: usize,
        mut open: impl FnMut(usize) -> std::result::Result<Arc<D::Gpu>, E>,
    ) -> std::result::Result<Runtime<D>, String> {
        let gpus = (0..count)
            .map(|i| open(i).map_err(|e| format!("GPU {i}: {e}")))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Runtime::new(driver, gpus)
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

/// One GPU with its kernels, shared by the logical devices on it.
#[derive(Debug)]
pub struct GpuContext<D: Driver> {
    gpu: Arc<D::Gpu>,
    kernels: Arc<Kernels<D>>,
}

impl<D: Driver> GpuContext<D> {
    /// The context of `gpu`, whose kernels `driver` loads.
    pub fn new(driver: Arc<D>, gpu: Arc<D::Gpu>) -> GpuContext<D> {
        GpuContext {
            kernels: Arc::new(Kernels::new(driver, gpu.clone())),
            gpu,
        }
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<D::Gpu> {
        &self.gpu
    }

    /// The driver ordinal.
    pub fn ordinal(&self) -> usize {
        D::ordinal(&self.gpu)
    }

    /// The kernels of this GPU (each source is loaded when one of its kernels is first needed).
    pub fn kernels(&self) -> &Arc<Kernels<D>> {
        &self.kernels
    }
}

/// Kernel name → (index in [`SOURCES`], the name as listed in [`KERNELS`]), built once per
/// process.
fn source_of() -> &'static HashMap<&'static str, (usize, &'static str)> {
    static INDEX: OnceLock<HashMap<&'static str, (usize, &'static str)>> = OnceLock::new();
    INDEX.get_or_init(|| {
        KERNELS
            .iter()
            .filter_map(|&(file, kernel)| {
                let index = SOURCES.iter().position(|(f, _)| *f == file)?;
                Some((kernel, (index, kernel)))
            })
            .collect()
    })
}

/// One loaded unit: its kernels, then the module (handles drop before the code they point
/// into).
type Loaded<D> = (
    HashMap<&'static str, <D as Driver>::Function>,
    <D as Driver>::Module,
);

/// A unit's load, done once: the loaded kernels, or the reason it failed.
type Slot<D> = OnceLock<std::result::Result<Loaded<D>, String>>;

/// The kernels of `tessera_kernels::gpu` on one GPU: each compile unit (a whole source, or one
/// kernel for one set of element types when [`Driver::UNIT_PER_LAUNCH`]) compiled (or found) and
/// loaded by the driver the first time one of its kernels is asked for, then kept; a failure is
/// kept too, and every later request for that unit gives it again.
#[derive(Debug)]
pub struct Kernels<D: Driver> {
    driver: Arc<D>,
    gpu: Arc<D::Gpu>,
    /// Per entry of [`SOURCES`], for drivers that build whole sources: found without a lock.
    sources: Vec<Slot<D>>,
    /// Per unit, for drivers that build per launch; the lock is held only to find or add a
    /// slot, so builds of different units overlap.
    units: Mutex<HashMap<Unit, Arc<Slot<D>>>>,
}

impl<D: Driver> Kernels<D> {
    fn new(driver: Arc<D>, gpu: Arc<D::Gpu>) -> Kernels<D> {
        Kernels {
            driver,
            gpu,
            sources: SOURCES.iter().map(|_| OnceLock::new()).collect(),
            units: Mutex::new(HashMap::new()),
        }
    }

    fn load(&self, unit: &Unit) -> Result<Loaded<D>> {
        let start = Instant::now();
        let module = self.driver.load_module(&self.gpu, unit)?;
        let mut functions = HashMap::new();
        for kernel in unit.kernels() {
            let f = D::function(&module, kernel).map_err(|e| Error::Compute {
                device: D::gpu_name(&self.gpu).to_string(),
                reason: format!("kernel {kernel} of {}: {e}", unit.label()),
            })?;
            functions.insert(kernel, f);
        }
        tracing::debug!(
            backend = D::NAME,
            gpu = D::gpu_name(&self.gpu),
            unit = %unit.label(),
            seconds = start.elapsed().as_secs_f64(),
            "kernels loaded"
        );
        Ok((functions, module))
    }

    /// Kernel `name` from its unit for element types `types` (ignored by drivers that build
    /// whole sources), loading the unit on first use.
    fn function(&self, name: &str, types: TypeSet) -> Result<D::Function> {
        let &(index, kernel) = source_of().get(name).ok_or_else(|| Error::Compute {
            device: D::gpu_name(&self.gpu).to_string(),
            reason: format!("no {} kernel named {name}", D::NAME),
        })?;
        let file = SOURCES[index].0;
        let per_launch;
        let (unit, slot) = if D::UNIT_PER_LAUNCH {
            let unit = Unit {
                file,
                kernel: Some(kernel),
                types,
            };
            per_launch = self.units.lock().entry(unit).or_default().clone();
            (unit, &*per_launch)
        } else {
            (Unit::source(file), &self.sources[index])
        };
        let loaded = slot
            .get_or_init(|| self.load(&unit).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|reason| Error::Compute {
                device: D::gpu_name(&self.gpu).to_string(),
                reason: format!(
                    "building the {} kernels of {} failed: {reason}",
                    D::NAME,
                    unit.label()
                ),
            })?;
        loaded.0.get(name).cloned().ok_or_else(|| Error::Compute {
            device: D::gpu_name(&self.gpu).to_string(),
            reason: format!("no {} kernel named {name} in {}", D::NAME, unit.label()),
        })
    }

    /// The kernel `name`, able to take tensors of every element type, loading its unit on first
    /// use. Launches use [`Kernels::for_launch`], which builds for the launch's types where the
    /// driver builds per launch.
    ///
    /// # Errors
    /// [`Error::Compute`] when no source defines it, or its unit does not compile or load
    /// (naming the GPU and the compiler's or driver's reason).
    pub fn get(&self, name: &str) -> Result<D::Function> {
        self.function(name, TypeSet::ALL)
    }

    /// The kernel `launch` runs, built for the element types of its tensors when the driver
    /// builds per launch ([`Driver::UNIT_PER_LAUNCH`]), loading its unit on first use.
    ///
    /// # Errors
    /// As [`Kernels::get`].
    pub fn for_launch(&self, launch: &Launch) -> Result<D::Function> {
        // Whole-source drivers ignore the types: skip reading them on every launch.
        let types = if D::UNIT_PER_LAUNCH {
            TypeSet::of_launch(launch)
        } else {
            TypeSet::ALL
        };
        self.function(launch.kernel, types)
    }
}

/// The rest of a CUDA-like vendor: its process-wide runtime (enumerated GPUs, for
/// [`GpuRegistry`](crate::GpuRegistry)) and its NCCL-API collective library (for the comm trio).
/// SYCL, whose devices and all-reduce differ, implements [`Driver`] only.
pub trait RegistryDriver: Driver {
    /// Device-name prefix (`"CUDA"` gives `CUDA0`, `CUDA1`, ...).
    const DEVICE_PREFIX: &'static str;
    /// Environment variable that turns the vendor all-reduce off when set to `none`.
    const ALLREDUCE_ENV: &'static str;

    /// The process-wide runtime (driver state and every GPU), opened on first use, or why the
    /// backend has no devices here. Vendor crates keep it in their own `static OnceLock`.
    fn runtime() -> &'static std::result::Result<Runtime<Self>, String>;

    /// The raw stream handle, for the collective library (`cudaStream_t` / `hipStream_t`).
    fn stream_raw(stream: &Self::Stream) -> *mut c_void;

    /// Makes `gpu` the calling thread's current device (its context), as the collective
    /// library's per-rank init expects (`ncclCommInitRank` uses the current device).
    ///
    /// # Errors
    /// The driver's status.
    fn bind_gpu(gpu: &Self::Gpu) -> Result<()>;

    /// The NCCL-API collective library (NCCL, RCCL) for the comm trio.
    ///
    /// # Errors
    /// [`Error::Unavailable`] saying what was tried.
    fn load_collectives() -> Result<Nccl>;
}
