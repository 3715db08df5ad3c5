use crate::error::{Result, check_range};
use crate::graph::Context;
use crate::tensor::TensorDesc;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A kind of memory on a device: how to allocate it and how tensors are laid out in it.
pub trait BufferType: Send + Sync + fmt::Debug {
    /// Name for reports, e.g. `CPU` or `CUDA0`.
    fn name(&self) -> &str;
    /// Required alignment of tensor offsets.
    fn alignment(&self) -> usize;
    /// Optional. Largest single allocation. Default: unlimited.
    fn max_size(&self) -> usize {
        usize::MAX
    }
    /// Optional. Bytes a tensor needs here. Default: [`TensorDesc::nbytes`].
    fn alloc_size(&self, t: &TensorDesc) -> usize {
        t.nbytes()
    }
    /// Whether the memory is host memory the CPU can address.
    fn is_host(&self) -> bool;
    /// Allocates `size` bytes (zero-initialised where the device allows it cheaply).
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] and vendor errors.
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>>;
    /// Optional. Allocates `size` bytes that will hold `tensors`, each `(offset, descriptor)`
    /// (what [`alloc_tensors`](trait.BufferType.html#method.alloc_tensors) calls). Buffer types
    /// that lay tensors out themselves, such as the meta device's, which splits each tensor across
    /// devices, need the list. Default: [`BufferType::alloc`].
    ///
    /// # Errors
    /// As [`BufferType::alloc`], plus the buffer type's own layout errors.
    fn alloc_placed(
        &self,
        size: usize,
        _tensors: &[(usize, &TensorDesc)],
    ) -> Result<Arc<dyn Buffer>> {
        self.alloc(size)
    }
    /// Optional. This buffer type, told that each `(copy, original)` pair of tensor names holds
    /// the same values, where it can keep a copy as windows into its original's memory (a meta
    /// device's weights: an untied output projection split over the vocabulary while the
    /// embedding is kept once). Such a copy is then read-only: write the original. Default:
    /// `None`, every tensor has memory of its own.
    fn with_copies(&self, _copies: &[(&str, &str)]) -> Option<Arc<dyn BufferType>> {
        None
    }
    /// Downcast support.
    fn as_any(&self) -> &dyn Any;
}

impl dyn BufferType {
    /// Allocates one buffer holding every non-view tensor of `ctx` (ggml's
    /// `alloc_ctx_tensors`), each at an aligned offset.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] or allocation errors of the buffer type.
    pub fn alloc_tensors(&self, ctx: &Context) -> Result<super::TensorBuffer> {
        self.alloc_tensors_where(ctx, |_| true)
    }

    /// Like `alloc_tensors` for the non-view tensors `keep` selects.
    ///
    /// # Errors
    /// As `alloc_tensors`.
    pub fn alloc_tensors_where(
        &self,
        ctx: &Context,
        keep: impl Fn(&TensorDesc) -> bool,
    ) -> Result<super::TensorBuffer> {
        super::bindings::alloc_tensors(self, ctx, keep)
    }
}

/// Memory on a device. Blocking copies; ordered asynchronous ones are on [`crate::Backend`].
pub trait Buffer: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn size(&self) -> usize;
    /// Name for messages (`CPU buffer 0x..`, device name).
    fn name(&self) -> String;
    /// Whether the CPU can address the memory directly.
    fn is_host(&self) -> bool;
    /// Copies `src` to `offset`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`], [`crate::Error::ReadOnly`], vendor errors.
    fn write(&self, offset: usize, src: &[u8]) -> Result<()>;
    /// Copies from `offset` into `dst`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`], vendor errors.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Optional. Writes all of tensor `t` (`src` is its [`TensorDesc::nbytes`] bytes in ggml's
    /// layout), placed at `offset`. A buffer may keep the tensor in a faster device-specific
    /// layout (the CPU's repacked weights); reads and copies still see ggml's bytes. Default:
    /// [`Buffer::write`].
    ///
    /// # Errors
    /// As [`Buffer::write`].
    fn set_tensor(&self, t: &TensorDesc, offset: usize, src: &[u8]) -> Result<()> {
        let _ = t;
        self.write(offset, src)
    }
    /// Optional. Whether any of the `len` bytes at `offset` are held in a device-specific
    /// layout that [`Buffer::set_tensor`] chose: only the kernels that know it (a weight's
    /// reader) may read them in place, everyone else through [`Buffer::read`]. Default: none.
    fn holds_device_layout(&self, offset: usize, len: usize) -> bool {
        let _ = (offset, len);
        false
    }
    /// Sets `len` bytes at `offset` to `value`.
    ///
    /// # Errors
    /// As [`Buffer::write`].
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()>;
    /// Optional. Strided write: `n_blocks` blocks of `block` bytes, block `i` from
    /// `src[i*src_stride..]` to `offset + i*dst_stride`. Default: a loop of [`Buffer::write`].
    ///
    /// # Errors
    /// As [`Buffer::write`], checked before anything is copied.
    fn write_2d(
        &self,
        offset: usize,
        src: &[u8],
        block: usize,
        n_blocks: usize,
        dst_stride: usize,
        src_stride: usize,
    ) -> Result<()> {
        check_2d(
            &self.name(),
            self.size(),
            offset,
            src.len(),
            block,
            n_blocks,
            dst_stride,
            src_stride,
        )?;
        for i in 0..n_blocks {
            self.write(
                offset + i * dst_stride,
                &src[i * src_stride..i * src_stride + block],
            )?;
        }
        Ok(())
    }
    /// Optional. Strided read, the mirror of [`Buffer::write_2d`]. Default: a loop of [`Buffer::read`].
    ///
    /// # Errors
    /// As [`Buffer::read`], checked before anything is copied.
    fn read_2d(
        &self,
        offset: usize,
        dst: &mut [u8],
        block: usize,
        n_blocks: usize,
        src_stride: usize,
        dst_stride: usize,
    ) -> Result<()> {
        check_2d(
            &self.name(),
            self.size(),
            offset,
            dst.len(),
            block,
            n_blocks,
            src_stride,
            dst_stride,
        )?;
        for i in 0..n_blocks {
            self.read(
                offset + i * src_stride,
                &mut dst[i * dst_stride..i * dst_stride + block],
            )?;
        }
        Ok(())
    }
    /// Optional. Copies `len` bytes from `src` at `src_offset` to `dst_offset` in this buffer
    /// without staging through the host. Default `Ok(false)`: declined, [`copy_between`] stages.
    ///
    /// # Errors
    /// Range and vendor errors; declining is not an error.
    fn copy_from(
        &self,
        _src: &dyn Buffer,
        _src_offset: usize,
        _dst_offset: usize,
        _len: usize,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Optional. Bytes this buffer keeps on each device it spans, in device order. Default: one
    /// device, [`Buffer::size`].
    fn device_bytes(&self) -> Vec<usize> {
        vec![self.size()]
    }
    /// Optional. How a buffer spanning several devices (a meta device's) holds each of its
    /// tensors, by offset. Default: empty (one device holds every byte).
    fn spreads(&self) -> Vec<super::Spread> {
        Vec::new()
    }
    /// Optional. The [`Spread`](super::Spread) of the tensor placed at `offset`, for a buffer
    /// spanning several devices. Default: `None`.
    fn spread_at(&self, _offset: usize) -> Option<super::Spread> {
        None
    }
    /// Downcast support: a backend reaches its own buffers through this.
    fn as_any(&self) -> &dyn Any;
}

#[allow(clippy::too_many_arguments)]
fn check_2d(
    name: &str,
    size: usize,
    offset: usize,
    host_len: usize,
    block: usize,
    n: usize,
    dev_stride: usize,
    host_stride: usize,
) -> Result<()> {
    if n == 0 || block == 0 {
        return Ok(());
    }
    let dev_span = (n - 1)
        .checked_mul(dev_stride)
        .and_then(|s| s.checked_add(block));
    let host_span = (n - 1)
        .checked_mul(host_stride)
        .and_then(|s| s.checked_add(block));
    check_range(&name, offset, dev_span.unwrap_or(usize::MAX), size)?;
    check_range(&"host data", 0, host_span.unwrap_or(usize::MAX), host_len)
}

/// Copies `len` bytes between any two buffers: directly when the destination can, else through a
/// host staging vector.
///
/// # Errors
/// Range and vendor errors of either buffer.
pub fn copy_between(
    src: &dyn Buffer,
    src_offset: usize,
    dst: &dyn Buffer,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check_range(&src.name(), src_offset, len, src.size())?;
    check_range(&dst.name(), dst_offset, len, dst.size())?;
    if len == 0 || dst.copy_from(src, src_offset, dst_offset, len)? {
        return Ok(());
    }
    let mut staging = vec![0u8; len];
    src.read(src_offset, &mut staging)?;
    dst.write(dst_offset, &staging)
}

/// Host memory a device may wrap without copying (a memory-mapped model file, a `Vec`): the owner
/// is kept alive by the buffer, so no raw pointer crosses the API.
pub type HostMemory = Arc<dyn AsRef<[u8]> + Send + Sync>;
