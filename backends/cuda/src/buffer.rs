//! Device memory ([`CudaBufferType`], [`CudaBuffer`]) and pinned host memory
//! ([`CudaHostBufferType`], [`CudaHostBuffer`]) for fast, truly asynchronous transfers.
//!
//! Blocking reads and writes wait for all work queued on the GPU first, so host access always
//! sees the results of graphs computed before it.

use crate::sys::driver::{DeviceMem, Gpu, PinnedMem};
use std::any::Any;
use std::sync::Arc;
use tessera_core::{Buffer, BufferType, Result};

/// Alignment of tensor offsets in CUDA buffers (the driver's allocation granularity for fast
/// loads, as ggml-cuda).
pub const CUDA_ALIGNMENT: usize = 256;

/// The memory of one CUDA device.
#[derive(Debug)]
pub struct CudaBufferType {
    name: String,
    gpu: Arc<Gpu>,
}

impl CudaBufferType {
    pub(crate) fn new(name: &str, gpu: Arc<Gpu>) -> CudaBufferType {
        CudaBufferType {
            name: name.to_string(),
            gpu,
        }
    }
    /// The driver ordinal of the GPU.
    pub fn gpu_ordinal(&self) -> usize {
        self.gpu.ordinal()
    }
}

impl BufferType for CudaBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        CUDA_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.gpu.total_mem()
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(CudaBuffer {
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
pub struct CudaBuffer {
    device: String,
    pub(crate) mem: DeviceMem,
}

impl CudaBuffer {
    /// Name of the logical device that allocated it.
    pub fn device_name(&self) -> &str {
        &self.device
    }
    /// The driver ordinal of the GPU holding it.
    pub fn gpu_ordinal(&self) -> usize {
        self.mem.gpu().ordinal()
    }
}

impl Buffer for CudaBuffer {
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
        match src.as_any().downcast_ref::<CudaBuffer>() {
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

/// Pinned (page-locked) host memory registered with a GPU's context: the host reads and writes it
/// directly, and streams copy to and from it asynchronously.
#[derive(Debug)]
pub struct CudaHostBufferType {
    name: String,
    gpu: Arc<Gpu>,
}

impl CudaHostBufferType {
    pub(crate) fn new(device: &str, gpu: Arc<Gpu>) -> CudaHostBufferType {
        CudaHostBufferType {
            name: format!("{device}_Host"),
            gpu,
        }
    }
}

impl BufferType for CudaHostBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        CUDA_ALIGNMENT
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(CudaHostBuffer {
            name: self.name.clone(),
            mem: PinnedMem::alloc(&self.gpu, size)?,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A block of pinned host memory.
#[derive(Debug)]
pub struct CudaHostBuffer {
    name: String,
    pub(crate) mem: PinnedMem,
}

impl Buffer for CudaHostBuffer {
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
