//! [`CudaDevice`]: one logical device on a GPU. Several logical devices may share a GPU (the
//! `cuda:N` selector with N above the GPU count): they share its context, memory and compiled
//! kernels, and each stream is its own CUDA stream.

use crate::buffer::{CudaBuffer, CudaBufferType, CudaHostBufferType};
use crate::compile::Kernels;
use crate::stream::CudaBackend;
use crate::sys::driver::Gpu;
use crate::sys::nvrtc::Nvrtc;
use std::sync::{Arc, OnceLock};
use tessera_core::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, Error, MemoryInfo,
    Result, Support, TensorDesc, TensorId,
};

/// A GPU with its lazily compiled kernels, shared by the logical devices on it.
#[derive(Debug)]
pub(crate) struct GpuShared {
    pub(crate) gpu: Arc<Gpu>,
    nvrtc: Arc<Nvrtc>,
    kernels: OnceLock<std::result::Result<Arc<Kernels>, String>>,
}

impl GpuShared {
    pub(crate) fn new(gpu: Arc<Gpu>, nvrtc: Arc<Nvrtc>) -> GpuShared {
        GpuShared {
            gpu,
            nvrtc,
            kernels: OnceLock::new(),
        }
    }

    /// The kernels, compiled on first use (once per process and GPU; later from the disk cache).
    pub(crate) fn kernels(&self) -> Result<Arc<Kernels>> {
        self.kernels
            .get_or_init(|| {
                Kernels::build(&self.gpu, &self.nvrtc)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|reason| Error::Compute {
                device: self.gpu.name().to_string(),
                reason: format!("building the CUDA kernels failed: {reason}"),
            })
    }
}

/// A CUDA device.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    name: String,
    pub(crate) shared: Arc<GpuShared>,
    buft: Arc<CudaBufferType>,
    host_buft: Arc<CudaHostBufferType>,
}

impl CudaDevice {
    pub(crate) fn new(name: &str, shared: Arc<GpuShared>) -> CudaDevice {
        let gpu = shared.gpu.clone();
        CudaDevice {
            name: name.to_string(),
            buft: Arc::new(CudaBufferType::new(name, gpu.clone())),
            host_buft: Arc::new(CudaHostBufferType::new(name, gpu)),
            shared,
        }
    }

    /// The driver ordinal of the GPU.
    pub fn gpu_ordinal(&self) -> usize {
        self.shared.gpu.ordinal()
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.shared.gpu.compute_capability()
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        let (maj, min) = self.compute_capability();
        format!(
            "{} (GPU {}, sm_{maj}{min})",
            self.shared.gpu.name(),
            self.gpu_ordinal()
        )
    }
    fn backend_name(&self) -> &str {
        "cuda"
    }
    fn kind(&self) -> DeviceType {
        DeviceType::Gpu
    }
    fn memory(&self) -> MemoryInfo {
        let (free, total) = self
            .shared
            .gpu
            .mem_info()
            .unwrap_or((0, self.shared.gpu.total_mem()));
        MemoryInfo { free, total }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            is_async: true,
            host_buffer: true,
            buffer_from_host: false,
            events: true,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        Some(self.host_buft.clone())
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        crate::ops::supports(tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any()
            .downcast_ref::<CudaBufferType>()
            .is_some_and(|b| b.name() == self.name || self.same_gpu_buft(b))
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<CudaBuffer>()
            .is_some_and(|b| b.device_name() == self.name)
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<CudaBuffer>()
            .is_some_and(|b| b.gpu_ordinal() == self.gpu_ordinal())
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        if opts.n_threads.is_some_and(|n| n == 0) {
            return Err(Error::InvalidArgument(format!(
                "{}: thread count 0",
                self.name
            )));
        }
        Ok(Box::new(CudaBackend::new(&self.name, self.shared.clone())?))
    }
}

impl CudaDevice {
    fn same_gpu_buft(&self, b: &CudaBufferType) -> bool {
        b.gpu_ordinal() == self.gpu_ordinal()
    }
}
