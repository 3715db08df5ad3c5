//! Device memory ([`GpuBufferType`], [`GpuBuffer`]) and pinned host memory ([`HostBufferType`],
//! [`HostBuffer`]) for truly asynchronous transfers, for any [`Driver`].
//!
//! Blocking reads and writes wait for all work queued on the GPU first, so host access always
//! sees the results of graphs computed before it.

pub use crate::driver::GPU_ALIGNMENT;
use crate::driver::{Driver, PinnedMem};
use std::any::Any;
use std::sync::Arc;
use tessera_core::{Buffer, BufferType, Result};

/// The memory of one logical GPU device.
#[derive(Debug)]
pub struct GpuBufferType<D: Driver> {
    name: String,
    gpu: Arc<D::Gpu>,
}

impl<D: Driver> GpuBufferType<D> {
    pub(crate) fn new(name: &str, gpu: Arc<D::Gpu>) -> GpuBufferType<D> {
        GpuBufferType {
            name: name.to_string(),
            gpu,
        }
    }
    /// The driver ordinal of the GPU.
    pub fn gpu_ordinal(&self) -> usize {
        D::ordinal(&self.gpu)
    }
}

impl<D: Driver> BufferType for GpuBufferType<D> {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        D::ALIGNMENT
    }
    fn max_size(&self) -> usize {
        D::total_mem(&self.gpu)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(GpuBuffer::<D> {
            device: self.name.clone(),
            mem: D::alloc(&self.gpu, size)?,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A block of device memory.
#[derive(Debug)]
pub struct GpuBuffer<D: Driver> {
    device: String,
    pub(crate) mem: D::Mem,
}

impl<D: Driver> GpuBuffer<D> {
    /// Name of the logical device that allocated it.
    pub fn device_name(&self) -> &str {
        &self.device
    }
    /// The driver ordinal of the GPU holding it.
    pub fn gpu_ordinal(&self) -> usize {
        D::ordinal(D::mem_gpu(&self.mem))
    }
    /// The device address of its first byte.
    pub fn ptr(&self) -> u64 {
        D::mem_ptr(&self.mem)
    }
    /// The driver's memory object (for a vendor's own comm).
    pub fn mem(&self) -> &D::Mem {
        &self.mem
    }
}

impl<D: Driver> Buffer for GpuBuffer<D> {
    fn size(&self) -> usize {
        D::mem_size(&self.mem)
    }
    fn name(&self) -> String {
        format!("{} buffer {:#x}", self.device, self.ptr())
    }
    fn is_host(&self) -> bool {
        false
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        D::write(&self.mem, offset, src)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        D::read(&self.mem, offset, dst)
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        D::memset(&self.mem, offset, len, value)
    }
    fn copy_from(
        &self,
        src: &dyn Buffer,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<bool> {
        match src.as_any().downcast_ref::<GpuBuffer<D>>() {
            Some(s) if D::can_copy(D::mem_gpu(&self.mem), D::mem_gpu(&s.mem)) => {
                D::copy(&self.mem, dst_offset, &s.mem, src_offset, len)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Pinned (page-locked) host memory registered with a GPU: the host reads and writes it
/// directly, and streams copy to and from it asynchronously.
#[derive(Debug)]
pub struct HostBufferType<D: Driver> {
    name: String,
    gpu: Arc<D::Gpu>,
}

impl<D: Driver> HostBufferType<D> {
    pub(crate) fn new(device: &str, gpu: Arc<D::Gpu>) -> HostBufferType<D> {
        HostBufferType {
            name: format!("{device}_Host"),
            gpu,
        }
    }
}

impl<D: Driver> BufferType for HostBufferType<D> {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        D::ALIGNMENT
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let mem = D::alloc_pinned(&self.gpu, size)?.ok_or_else(|| {
            tessera_core::Error::InvalidArgument(format!("{}: no pinned host memory", self.name))
        })?;
        Ok(Arc::new(HostBuffer::<D> {
            name: self.name.clone(),
            mem,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A block of pinned host memory.
#[derive(Debug)]
pub struct HostBuffer<D: Driver> {
    name: String,
    pub(crate) mem: D::Pinned,
}

impl<D: Driver> Buffer for HostBuffer<D> {
    fn size(&self) -> usize {
        self.mem.size()
    }
    fn name(&self) -> String {
        format!("{} buffer {:#x}", self.name, self.mem.addr())
    }
    fn is_host(&self) -> bool {
        true
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
    fn as_any(&self) -> &dyn Any {
        self
    }
}
