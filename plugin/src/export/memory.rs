//! The buffer type and buffer tables of the export adapter.
#![allow(unsafe_code)]

use super::{
    BufferObj, BufferTypeObj, guarded, guarded_unit, obj, put, quiet, quiet_unit, release,
    write_str,
};
use crate::abi::{
    RawBufferTable, RawBufferTypeTable, RawErrorOut, RawHeader, RawStrOut, RawTensor,
    STATUS_DECLINED, STATUS_OK, raw_bytes, raw_bytes_mut,
};
use crate::codec::decode_tensor;
use std::ffi::c_void;
use tessera_core::error::{Error, Result};

/// The table every exported buffer type handle uses.
pub(crate) static BUFFER_TYPE_TABLE: RawBufferTypeTable = RawBufferTypeTable {
    header: RawHeader::of::<RawBufferTypeTable>(),
    release: buft_release,
    name: buft_name,
    alignment: buft_alignment,
    max_size: buft_max_size,
    alloc_size: buft_alloc_size,
    is_host: buft_is_host,
    alloc: buft_alloc,
};

/// The table every exported buffer handle uses.
pub(crate) static BUFFER_TABLE: RawBufferTable = RawBufferTable {
    header: RawHeader::of::<RawBufferTable>(),
    release: buf_release,
    size: buf_size,
    name: buf_name,
    is_host: buf_is_host,
    write: buf_write,
    read: buf_read,
    memset: buf_memset,
    write_2d: buf_write_2d,
    read_2d: buf_read_2d,
    copy_from: buf_copy_from,
};

fn buft<'a>(h: *mut c_void) -> Result<&'a BufferTypeObj> {
    // SAFETY: the host passes buffer type handles this adapter made and has not released.
    unsafe { obj::<BufferTypeObj>(h, "buffer type") }
}

pub(crate) fn buf<'a>(h: *mut c_void) -> Result<&'a BufferObj> {
    // SAFETY: the host passes buffer handles this adapter made and has not released.
    unsafe { obj::<BufferObj>(h, "buffer") }
}

/// Host bytes lent for the call.
pub(crate) fn host_bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8]> {
    if ptr.is_null() && len > 0 {
        return Err(Error::InvalidArgument(format!(
            "null host pointer for {len} bytes"
        )));
    }
    // SAFETY: the host lends `len` readable bytes for the call (ABI contract).
    Ok(unsafe { raw_bytes(ptr, len) })
}

/// Host bytes lent for writing during the call.
pub(crate) fn host_bytes_mut<'a>(ptr: *mut u8, len: usize) -> Result<&'a mut [u8]> {
    if ptr.is_null() && len > 0 {
        return Err(Error::InvalidArgument(format!(
            "null host pointer for {len} bytes"
        )));
    }
    // SAFETY: the host lends `len` writable, unaliased bytes for the call (ABI contract).
    Ok(unsafe { raw_bytes_mut(ptr, len) })
}

unsafe extern "C" fn buft_release(h: *mut c_void) {
    quiet_unit("buffer_type.release", || {
        // SAFETY: the host releases each buffer type handle once (ABI contract).
        unsafe { release::<BufferTypeObj>(h) };
        Ok(())
    })
}

unsafe extern "C" fn buft_name(h: *mut c_void, out: *const RawStrOut) {
    quiet_unit("buffer_type.name", || {
        write_str(out, buft(h)?.name());
        Ok(())
    })
}

unsafe extern "C" fn buft_alignment(h: *mut c_void) -> usize {
    quiet("buffer_type.alignment", 1, || Ok(buft(h)?.alignment()))
}

unsafe extern "C" fn buft_max_size(h: *mut c_void) -> usize {
    quiet("buffer_type.max_size", 0, || Ok(buft(h)?.max_size()))
}

unsafe extern "C" fn buft_alloc_size(h: *mut c_void, tensor: *const RawTensor) -> usize {
    // usize::MAX fails every later size check, so a broken call cannot under-allocate.
    quiet("buffer_type.alloc_size", usize::MAX, || {
        // SAFETY: a non-null descriptor is readable for the call (ABI contract).
        let raw = unsafe { tensor.as_ref() }
            .ok_or_else(|| Error::InvalidArgument("null tensor".into()))?;
        let mut alone = *raw;
        alone.src = [crate::abi::NO_TENSOR; tessera_core::tensor::MAX_SRC];
        alone.view_src = crate::abi::NO_TENSOR;
        // SAFETY: the name is readable for the call (ABI contract).
        let t = unsafe { decode_tensor(&alone, 0, 1) }?;
        Ok(buft(h)?.alloc_size(&t))
    })
}

unsafe extern "C" fn buft_is_host(h: *mut c_void) -> u8 {
    quiet("buffer_type.is_host", 0, || Ok(buft(h)?.is_host() as u8))
}

unsafe extern "C" fn buft_alloc(
    h: *mut c_void,
    size: usize,
    out: *mut *mut c_void,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "buffer_type.alloc", || {
        put::<BufferObj>(out, buft(h)?.alloc(size)?)
    })
}

unsafe extern "C" fn buf_release(h: *mut c_void) {
    quiet_unit("buffer.release", || {
        // SAFETY: the host releases each buffer handle once (ABI contract).
        unsafe { release::<BufferObj>(h) };
        Ok(())
    })
}

unsafe extern "C" fn buf_size(h: *mut c_void) -> usize {
    quiet("buffer.size", 0, || Ok(buf(h)?.size()))
}

unsafe extern "C" fn buf_name(h: *mut c_void, out: *const RawStrOut) {
    quiet_unit("buffer.name", || {
        write_str(out, &buf(h)?.name());
        Ok(())
    })
}

unsafe extern "C" fn buf_is_host(h: *mut c_void) -> u8 {
    quiet("buffer.is_host", 0, || Ok(buf(h)?.is_host() as u8))
}

unsafe extern "C" fn buf_write(
    h: *mut c_void,
    offset: usize,
    src: *const u8,
    len: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "buffer.write", || {
        buf(h)?.write(offset, host_bytes(src, len)?)
    })
}

unsafe extern "C" fn buf_read(
    h: *mut c_void,
    offset: usize,
    dst: *mut u8,
    len: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "buffer.read", || {
        buf(h)?.read(offset, host_bytes_mut(dst, len)?)
    })
}

unsafe extern "C" fn buf_memset(
    h: *mut c_void,
    offset: usize,
    len: usize,
    value: u8,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "buffer.memset", || buf(h)?.memset(offset, len, value))
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn buf_write_2d(
    h: *mut c_void,
    offset: usize,
    src: *const u8,
    src_len: usize,
    block: usize,
    n_blocks: usize,
    dst_stride: usize,
    src_stride: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "buffer.write_2d", || {
        let src = host_bytes(src, src_len)?;
        buf(h)?.write_2d(offset, src, block, n_blocks, dst_stride, src_stride)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn buf_read_2d(
    h: *mut c_void,
    offset: usize,
    dst: *mut u8,
    dst_len: usize,
    block: usize,
    n_blocks: usize,
    src_stride: usize,
    dst_stride: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "buffer.read_2d", || {
        let dst = host_bytes_mut(dst, dst_len)?;
        buf(h)?.read_2d(offset, dst, block, n_blocks, src_stride, dst_stride)
    })
}

unsafe extern "C" fn buf_copy_from(
    h: *mut c_void,
    src: *mut c_void,
    src_offset: usize,
    dst_offset: usize,
    len: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded(err, "buffer.copy_from", || {
        let copied = buf(h)?.copy_from(buf(src)?.as_ref(), src_offset, dst_offset, len)?;
        Ok(if copied { STATUS_OK } else { STATUS_DECLINED })
    })
}
