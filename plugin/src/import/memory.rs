//! Buffer types and buffers of a loaded plugin, behind the core traits. A plugin buffer carries
//! its plugin handle, so the plugin's own streams and devices receive their own objects back.
#![allow(unsafe_code)]

use super::loader::Lib;
use crate::abi::STATUS_OK;
use crate::codec::encode_tensor;
use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use tessera_core::backend::{Buffer, BufferType};
use tessera_core::error::{Error, Result};
use tessera_core::tensor::TensorDesc;

/// A buffer type of a plugin (or, when the plugin returned none, one that refuses to allocate).
pub(crate) struct PluginBufferType {
    lib: Arc<Lib>,
    h: *mut c_void,
    name: String,
}

// SAFETY: the handle is a plugin-side `Arc<dyn BufferType>`, which is Send + Sync.
unsafe impl Send for PluginBufferType {}
// SAFETY: as above.
unsafe impl Sync for PluginBufferType {}

impl fmt::Debug for PluginBufferType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginBufferType")
            .field("name", &self.name)
            .field("file", &self.lib.file)
            .finish()
    }
}

impl PluginBufferType {
    pub(crate) fn new(lib: Arc<Lib>, h: *mut c_void) -> PluginBufferType {
        // SAFETY: validated table, live handle owned by this wrapper.
        let name = lib.string(|out| unsafe { (lib.buft.name)(h, out) });
        PluginBufferType { lib, h, name }
    }

    /// Stands in for a buffer type the plugin failed to return.
    pub(crate) fn broken(lib: Arc<Lib>, device: &str) -> PluginBufferType {
        PluginBufferType {
            lib,
            h: std::ptr::null_mut(),
            name: format!("{device} (no buffer type)"),
        }
    }

    /// The plugin handle, if this buffer type belongs to `lib`.
    pub(crate) fn handle_for(&self, lib: &Lib) -> Option<*mut c_void> {
        (self.lib.same(lib) && !self.h.is_null()).then_some(self.h)
    }

    fn missing(&self) -> Error {
        Error::Plugin {
            file: self.lib.file.clone(),
            call: "device.buffer_type".into(),
            reason: format!("{}: the plugin returned no buffer type", self.name),
        }
    }
}

impl Drop for PluginBufferType {
    fn drop(&mut self) {
        if !self.h.is_null() {
            // SAFETY: the handle is owned by this wrapper and released once.
            unsafe { (self.lib.buft.release)(self.h) }
        }
    }
}

impl BufferType for PluginBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        if self.h.is_null() {
            return 1;
        }
        // SAFETY: validated table, live handle.
        unsafe { (self.lib.buft.alignment)(self.h) }.max(1)
    }
    fn max_size(&self) -> usize {
        if self.h.is_null() {
            return 0;
        }
        // SAFETY: validated table, live handle.
        unsafe { (self.lib.buft.max_size)(self.h) }
    }
    fn alloc_size(&self, t: &TensorDesc) -> usize {
        if self.h.is_null() {
            return t.nbytes();
        }
        let raw = encode_tensor(t, &|_| None);
        // SAFETY: validated table, live handle; `raw` borrows `t`'s name for the call.
        unsafe { (self.lib.buft.alloc_size)(self.h, &raw) }
    }
    fn is_host(&self) -> bool {
        // SAFETY: validated table, live handle.
        !self.h.is_null() && unsafe { (self.lib.buft.is_host)(self.h) } != 0
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        if self.h.is_null() {
            return Err(self.missing());
        }
        let mut out: *mut c_void = std::ptr::null_mut();
        self.lib.call("buffer_type.alloc", |err| {
            // SAFETY: validated table, live handle, `out` writable for the call.
            unsafe { (self.lib.buft.alloc)(self.h, size, &mut out, err) }
        })?;
        if out.is_null() {
            return Err(Error::Plugin {
                file: self.lib.file.clone(),
                call: "buffer_type.alloc".into(),
                reason: "succeeded without a buffer".into(),
            });
        }
        Ok(Arc::new(PluginBuffer::new(self.lib.clone(), out)))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer of a plugin.
pub(crate) struct PluginBuffer {
    lib: Arc<Lib>,
    h: *mut c_void,
    size: usize,
}

// SAFETY: the handle is a plugin-side `Arc<dyn Buffer>`, which is Send + Sync.
unsafe impl Send for PluginBuffer {}
// SAFETY: as above.
unsafe impl Sync for PluginBuffer {}

impl fmt::Debug for PluginBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginBuffer")
            .field("size", &self.size)
            .field("file", &self.lib.file)
            .finish()
    }
}

impl PluginBuffer {
    pub(crate) fn new(lib: Arc<Lib>, h: *mut c_void) -> PluginBuffer {
        // SAFETY: validated table, live handle owned by this wrapper.
        let size = unsafe { (lib.buf.size)(h) };
        PluginBuffer { lib, h, size }
    }

    /// The plugin handle of `buf` if it is a buffer of `lib`.
    pub(crate) fn handle_of(buf: &dyn Buffer, lib: &Lib) -> Option<*mut c_void> {
        buf.as_any()
            .downcast_ref::<PluginBuffer>()
            .filter(|b| b.lib.same(lib))
            .map(|b| b.h)
    }

    /// The plugin handle and library of `buf`, if it is a plugin buffer.
    pub(crate) fn parts(buf: &dyn Buffer) -> Option<(&Arc<Lib>, *mut c_void)> {
        buf.as_any()
            .downcast_ref::<PluginBuffer>()
            .map(|b| (&b.lib, b.h))
    }

    fn status(
        &self,
        call: &'static str,
        f: impl FnOnce(*const crate::abi::RawErrorOut) -> i32,
    ) -> Result<()> {
        self.lib.call(call, f).map(|_| ())
    }
}

impl Drop for PluginBuffer {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this wrapper and released once.
        unsafe { (self.lib.buf.release)(self.h) }
    }
}

impl Buffer for PluginBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        // SAFETY: validated table, live handle.
        self.lib
            .string(|out| unsafe { (self.lib.buf.name)(self.h, out) })
    }
    fn is_host(&self) -> bool {
        // SAFETY: validated table, live handle.
        unsafe { (self.lib.buf.is_host)(self.h) != 0 }
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.status("buffer.write", |err| {
            // SAFETY: validated table, live handle; `src` is lent for the call.
            unsafe { (self.lib.buf.write)(self.h, offset, src.as_ptr(), src.len(), err) }
        })
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.status("buffer.read", |err| {
            // SAFETY: validated table, live handle; `dst` is lent, writable, for the call.
            unsafe { (self.lib.buf.read)(self.h, offset, dst.as_mut_ptr(), dst.len(), err) }
        })
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.status("buffer.memset", |err| {
            // SAFETY: validated table, live handle.
            unsafe { (self.lib.buf.memset)(self.h, offset, len, value, err) }
        })
    }
    fn write_2d(
        &self,
        offset: usize,
        src: &[u8],
        block: usize,
        n_blocks: usize,
        dst_stride: usize,
        src_stride: usize,
    ) -> Result<()> {
        self.status("buffer.write_2d", |err| {
            // SAFETY: validated table, live handle; `src` is lent for the call.
            unsafe {
                (self.lib.buf.write_2d)(
                    self.h,
                    offset,
                    src.as_ptr(),
                    src.len(),
                    block,
                    n_blocks,
                    dst_stride,
                    src_stride,
                    err,
                )
            }
        })
    }
    fn read_2d(
        &self,
        offset: usize,
        dst: &mut [u8],
        block: usize,
        n_blocks: usize,
        src_stride: usize,
        dst_stride: usize,
    ) -> Result<()> {
        self.status("buffer.read_2d", |err| {
            // SAFETY: validated table, live handle; `dst` is lent, writable, for the call.
            unsafe {
                (self.lib.buf.read_2d)(
                    self.h,
                    offset,
                    dst.as_mut_ptr(),
                    dst.len(),
                    block,
                    n_blocks,
                    src_stride,
                    dst_stride,
                    err,
                )
            }
        })
    }
    fn copy_from(
        &self,
        src: &dyn Buffer,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let Some(sh) = PluginBuffer::handle_of(src, &self.lib) else {
            return Ok(false); // another plugin's or a built-in buffer: the caller stages
        };
        let status = self.lib.call("buffer.copy_from", |err| {
            // SAFETY: validated table, live handles of this plugin.
            unsafe { (self.lib.buf.copy_from)(self.h, sh, src_offset, dst_offset, len, err) }
        })?;
        Ok(status == STATUS_OK)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
