//! Device memory: [`SyclBufferType`] and [`SyclBuffer`] (USM `malloc_device`). Blocking reads
//! and writes first wait for every queue of the device, so host access sees the results of
//! graphs computed before it.
#![allow(unsafe_code)]

use crate::device::DevState;
use crate::sys::DeviceMem;
use std::any::Any;
use std::sync::Arc;
use tessera_core::{Buffer, BufferType, Result};

/// Alignment of tensor offsets in SYCL buffers.
pub const SYCL_ALIGNMENT: usize = 128;

/// The memory of one SYCL device.
#[derive(Debug)]
pub struct SyclBufferType {
    pub(crate) state: Arc<DevState>,
}

impl BufferType for SyclBufferType {
    fn name(&self) -> &str {
        &self.state.name
    }
    fn alignment(&self) -> usize {
        SYCL_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.state.info().global_mem as usize
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(SyclBuffer {
            state: self.state.clone(),
            mem: DeviceMem::alloc(&self.state.platform, self.state.index, size)?,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A block of device memory.
#[derive(Debug)]
pub struct SyclBuffer {
    pub(crate) state: Arc<DevState>,
    pub(crate) mem: DeviceMem,
}

impl SyclBuffer {
    /// Name of the device that allocated it.
    pub fn device_name(&self) -> &str {
        &self.state.name
    }
}

impl Buffer for SyclBuffer {
    fn size(&self) -> usize {
        self.mem.size()
    }
    fn name(&self) -> String {
        format!("{} buffer {:#x}", self.state.name, self.mem.ptr())
    }
    fn is_host(&self) -> bool {
        false
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.mem.at(offset, src.len())?;
        let q = self.state.io_queue()?;
        // SAFETY: `dst` spans `src.len()` bytes of this live allocation (checked above) and the
        // copy is blocking, so `src` outlives it.
        unsafe { q.memcpy(dst, src.as_ptr(), src.len(), true) }
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.mem.at(offset, dst.len())?;
        let q = self.state.io_queue()?;
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { q.memcpy(dst.as_mut_ptr(), src, dst.len(), true) }
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.mem.at(offset, len)?;
        let q = self.state.io_queue()?;
        // SAFETY: `dst` spans `len` bytes of this live allocation; the fill is blocking.
        unsafe { q.memset(dst, value, len, true) }
    }
    fn copy_from(
        &self,
        src: &dyn Buffer,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let Some(s) = src.as_any().downcast_ref::<SyclBuffer>() else {
            return Ok(false);
        };
        if !self.state.same_context(&s.state) {
            return Ok(false);
        }
        let (d, sp) = (self.mem.at(dst_offset, len)?, s.mem.at(src_offset, len)?);
        s.state.io_queue()?;
        let q = self.state.io_queue()?;
        // SAFETY: both ranges lie in live allocations of one context (checked above), and every
        // queue of both devices has finished; the copy is blocking.
        unsafe { q.memcpy(d, sp, len, true) }?;
        Ok(true)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
