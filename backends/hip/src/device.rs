//! [`HipDevice`]: one logical device on an AMD GPU, with its memory ([`HipBufferType`],
//! [`HipBuffer`]). Several logical devices may share a GPU (`hip:N` with N above the GPU count):
//! they share its memory and compiled kernels, and each stream is its own HIP stream.

use crate::compile::Kernels;
use crate::stream::HipBackend;
use crate::sys::{DeviceMem, Gpu};
use std::any::Any;
use std::sync::{Arc, OnceLock};
use tessera_core::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, Error, MemoryInfo,
    Result, Support, TensorDesc, TensorId,
};

/// Alignment of tensor offsets in HIP buffers.
pub const HIP_ALIGNMENT: usize = 256;

/// A GPU with its lazily built kernels, shared by the logical devices on it.
#[derive(Debug)]
pub(crate) struct GpuShared {
    pub(crate) gpu: Arc<Gpu>,
    kernels: OnceLock<std::result::Result<Arc<Kernels>, String>>,
}

impl GpuShared {
    pub(crate) fn new(gpu: Arc<Gpu>) -> GpuShared {
        GpuShared {
            gpu,
            kernels: OnceLock::new(),
        }
    }

    /// The kernels, built on first use (once per process and GPU; later from the disk cache).
    pub(crate) fn kernels(&self) -> Result<Arc<Kernels>> {
        self.kernels
            .get_or_init(|| {
                Kernels::build(&self.gpu)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|reason| Error::Compute {
                device: self.gpu.name().to_string(),
                reason: format!("building the HIP kernels failed: {reason}"),
            })
    }
}

/// A HIP device.
#[derive(Debug, Clone)]
pub struct HipDevice {
    name: String,
    pub(crate) shared: Arc<GpuShared>,
    buft: Arc<HipBufferType>,
}

impl HipDevice {
    pub(crate) fn new(name: &str, shared: Arc<GpuShared>) -> HipDevice {
        HipDevice {
            name: name.to_string(),
            buft: Arc::new(HipBufferType {
                name: name.to_string(),
                gpu: shared.gpu.clone(),
            }),
            shared,
        }
    }

    /// The HIP ordinal of the GPU.
    pub fn gpu_ordinal(&self) -> usize {
        self.shared.gpu.ordinal()
    }

    /// The gfx target kernels are built for (e.g. `gfx90a`).
    pub fn arch(&self) -> &str {
        self.shared.gpu.arch()
    }
}

impl Device for HipDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        let g = &self.shared.gpu;
        format!(
            "{} (GPU {}, {}, {} CUs, wave{})",
            g.name(),
            g.ordinal(),
            g.arch(),
            g.compute_units(),
            g.warp_size()
        )
    }
    fn backend_name(&self) -> &str {
        "hip"
    }
    fn kind(&self) -> DeviceType {
        DeviceType::Gpu
    }
    fn memory(&self) -> MemoryInfo {
        let g = &self.shared.gpu;
        let (free, total) = g.mem_info().unwrap_or((0, g.total_mem()));
        MemoryInfo { free, total }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            is_async: true,
            host_buffer: false,
            buffer_from_host: false,
            events: true,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        None
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        tessera_kernels::cuda::plan::supports(tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any()
            .downcast_ref::<HipBufferType>()
            .is_some_and(|b| b.gpu.ordinal() == self.gpu_ordinal())
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<HipBuffer>()
            .is_some_and(|b| b.device == self.name)
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<HipBuffer>()
            .is_some_and(|b| b.gpu_ordinal() == self.gpu_ordinal())
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        if opts.n_threads.is_some_and(|n| n == 0) {
            return Err(Error::InvalidArgument(format!(
                "{}: thread count 0",
                self.name
            )));
        }
        Ok(Box::new(HipBackend::new(&self.name, self.shared.clone())?))
    }
}

/// The memory of one HIP device.
#[derive(Debug)]
pub struct HipBufferType {
    name: String,
    gpu: Arc<Gpu>,
}

impl BufferType for HipBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        HIP_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.gpu.total_mem()
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(HipBuffer {
            device: self.name.clone(),
            mem: DeviceMem::alloc(&self.gpu, size)?,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A block of device memory.
#[derive(Debug)]
pub struct HipBuffer {
    device: String,
    pub(crate) mem: DeviceMem,
}

impl HipBuffer {
    /// Name of the logical device that allocated it.
    pub fn device_name(&self) -> &str {
        &self.device
    }
    /// The HIP ordinal of the GPU holding it.
    pub fn gpu_ordinal(&self) -> usize {
        self.mem.gpu().ordinal()
    }
}

impl Buffer for HipBuffer {
    fn size(&self) -> usize {
        self.mem.size()
    }
    fn name(&self) -> String {
        format!("{} buffer {:#x}", self.device, self.mem.ptr())
    }
    fn is_host(&self) -> bool {
        false
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.mem.write(offset, src)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.mem.read(offset, dst)
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.mem.memset(offset, len, value)
    }
    fn copy_from(
        &self,
        src: &dyn Buffer,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<bool> {
        match src.as_any().downcast_ref::<HipBuffer>() {
            Some(s) => {
                self.mem.copy_from(dst_offset, &s.mem, src_offset, len)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
