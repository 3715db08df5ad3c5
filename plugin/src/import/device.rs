//! The registry and devices of a loaded plugin, behind the core traits.
#![allow(unsafe_code)]

use super::loader::Lib;
use super::memory::{PluginBuffer, PluginBufferType};
use super::stream::PluginBackend;
use crate::abi::{RawHandleOut, RawHostMemory, RawMemoryInfo, STATUS_DECLINED, caps_bit};
use crate::codec::FlatGraph;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use tessera_core::backend::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, HostMemory,
    MemoryInfo, Support,
};
use tessera_core::error::Result;
use tessera_core::registry::{ProcAddress, Registry};
use tessera_core::tensor::{TensorDesc, TensorId};

/// A backend loaded from a shared library, as a [`Registry`]. Its name is the plugin's own
/// qualified with the file (`cpu@libtessera_cpu.so`), and so are its devices' names
/// (`CPU@libtessera_cpu.so`), so they never collide with compiled-in ones.
pub struct PluginRegistry {
    lib: Arc<Lib>,
    plugin_name: String,
    name: String,
}

impl fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginRegistry")
            .field("name", &self.name)
            .field("file", &self.lib.file)
            .finish()
    }
}

impl PluginRegistry {
    pub(crate) fn new(lib: Arc<Lib>) -> PluginRegistry {
        // SAFETY: the registry table was validated at load.
        let plugin_name = lib.string(|out| unsafe { (lib.reg.name)(lib.reg.ctx, out) });
        let name = format!("{plugin_name}@{}", lib.file_name);
        PluginRegistry {
            lib,
            plugin_name,
            name,
        }
    }

    /// The backend's own name (`cpu`), without the file.
    pub fn plugin_name(&self) -> &str {
        &self.plugin_name
    }

    /// The qualified name (`cpu@libtessera_cpu.so`), as [`Registry::name`] returns it.
    pub fn name_str(&self) -> &str {
        &self.name
    }

    /// The shared library's path.
    pub fn file(&self) -> &str {
        &self.lib.file
    }

    fn wrap_devices(&self, count: usize) -> Result<Vec<Arc<dyn Device>>> {
        let mut handles: Vec<*mut c_void> = Vec::new();
        let sink = RawHandleOut {
            ctx: &mut handles as *mut Vec<*mut c_void> as *mut c_void,
            push: push_handle,
        };
        let status = self.lib.call("registry.devices", |err| {
            // SAFETY: the registry table was validated at load; `sink` lives for the call.
            unsafe { (self.lib.reg.devices)(self.lib.reg.ctx, count, &sink, err) }
        });
        // Wrap first, so handles are released even when the call failed half-way.
        let devices: Vec<Arc<dyn Device>> = handles
            .into_iter()
            .filter(|h| !h.is_null())
            .map(|h| {
                Arc::new(PluginDevice::new(self.lib.clone(), h, &self.name)) as Arc<dyn Device>
            })
            .collect();
        status?;
        Ok(devices)
    }
}

unsafe extern "C" fn push_handle(ctx: *mut c_void, h: *mut c_void) {
    // SAFETY: `ctx` is the `Vec` of the ongoing `wrap_devices` call.
    unsafe { (*(ctx as *mut Vec<*mut c_void>)).push(h) }
}

impl Registry for PluginRegistry {
    fn name(&self) -> &str {
        &self.name
    }
    fn probe(&self) -> Result<()> {
        self.lib
            .call("registry.probe", |err| {
                // SAFETY: the registry table was validated at load.
                unsafe { (self.lib.reg.probe)(self.lib.reg.ctx, err) }
            })
            .map(|_| ())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        self.wrap_devices(0)
    }
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        if n == 0 {
            return Err(tessera_core::Error::InvalidArgument(format!(
                "{}:0: the device count must be positive",
                self.name
            )));
        }
        self.wrap_devices(n)
    }
    /// The comm trio is answered by host shims that translate host objects into the plugin's
    /// handles (see `import::comm`); any other name is the plugin's raw address, whose arguments
    /// must be plugin handles ([`super::buffer_handle`], [`super::backend_handle`]).
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        if let Some(shim) = super::comm::shim(name) {
            return self.lib.comm.map(|_| shim);
        }
        let p = self.lib.raw_proc_address(name);
        (!p.is_null()).then(|| ProcAddress::new(p))
    }
    fn origin(&self) -> String {
        self.lib.file.clone()
    }
}

/// A device of a plugin.
pub(crate) struct PluginDevice {
    pub(crate) lib: Arc<Lib>,
    h: *mut c_void,
    name: String,
    description: String,
    backend_name: String,
    kind: DeviceType,
    buft: Arc<dyn BufferType>,
    host_buft: Option<Arc<dyn BufferType>>,
}

// SAFETY: the handle is a plugin-side `Arc<dyn Device>`, which is Send + Sync; the tables are
// immutable.
unsafe impl Send for PluginDevice {}
// SAFETY: as above.
unsafe impl Sync for PluginDevice {}

impl fmt::Debug for PluginDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginDevice")
            .field("name", &self.name)
            .field("file", &self.lib.file)
            .finish()
    }
}

impl PluginDevice {
    fn new(lib: Arc<Lib>, h: *mut c_void, backend_name: &str) -> PluginDevice {
        let t = lib.dev;
        // SAFETY: the device table was validated at load and `h` is a live device handle this
        // wrapper owns (the same holds for every call below).
        let own_name = lib.string(|out| unsafe { (t.name)(h, out) });
        // SAFETY: as above.
        let description = lib.string(|out| unsafe { (t.description)(h, out) });
        // SAFETY: as above.
        let kind = match unsafe { (t.kind)(h) } {
            1 => DeviceType::Gpu,
            2 => DeviceType::Igpu,
            3 => DeviceType::Accel,
            4 => DeviceType::Meta,
            _ => DeviceType::Cpu,
        };
        // SAFETY: as above.
        let buft = unsafe { (t.buffer_type)(h) };
        // SAFETY: as above.
        let host_buft = unsafe { (t.host_buffer_type)(h) };
        let wrap = |b: *mut c_void| {
            (!b.is_null())
                .then(|| Arc::new(PluginBufferType::new(lib.clone(), b)) as Arc<dyn BufferType>)
        };
        let buft = wrap(buft).unwrap_or_else(|| {
            Arc::new(PluginBufferType::broken(lib.clone(), &own_name)) as Arc<dyn BufferType>
        });
        let host_buft = wrap(host_buft);
        PluginDevice {
            name: format!("{own_name}@{}", lib.file_name),
            description,
            backend_name: backend_name.to_string(),
            kind,
            buft,
            host_buft,
            lib,
            h,
        }
    }
}

impl Drop for PluginDevice {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this wrapper and released once.
        unsafe { (self.lib.dev.release)(self.h) }
    }
}

impl Device for PluginDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        self.description.clone()
    }
    fn backend_name(&self) -> &str {
        &self.backend_name
    }
    fn kind(&self) -> DeviceType {
        self.kind
    }
    fn memory(&self) -> MemoryInfo {
        let mut m = RawMemoryInfo::default();
        // SAFETY: validated table, live handle, `m` writable for the call.
        unsafe { (self.lib.dev.memory)(self.h, &mut m) };
        MemoryInfo {
            free: m.free,
            total: m.total,
        }
    }
    fn caps(&self) -> DeviceCaps {
        // SAFETY: validated table, live handle.
        let bits = unsafe { (self.lib.dev.caps)(self.h) };
        DeviceCaps {
            is_async: bits & caps_bit::IS_ASYNC != 0,
            host_buffer: bits & caps_bit::HOST_BUFFER != 0,
            buffer_from_host: bits & caps_bit::BUFFER_FROM_HOST != 0,
            events: bits & caps_bit::EVENTS != 0,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        self.host_buft.clone()
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        let (flat, at) = match FlatGraph::around_node(tensors, node) {
            Ok(v) => v,
            Err(e) => return Support::No(e.to_string()),
        };
        let raw = flat.raw();
        let mut yes = 0u8;
        let reason = self.lib.string(|out| {
            // SAFETY: validated table, live handle; `raw` borrows `flat`, alive for the call.
            yes = unsafe { (self.lib.dev.supports_op)(self.h, &raw, at, out) };
        });
        if yes != 0 {
            Support::Yes
        } else {
            Support::No(reason)
        }
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        let Some(b) = buft.as_any().downcast_ref::<PluginBufferType>() else {
            return false;
        };
        match b.handle_for(&self.lib) {
            // SAFETY: validated table, live handles of this plugin.
            Some(bh) => unsafe { (self.lib.dev.supports_buffer_type)(self.h, bh) != 0 },
            None => false,
        }
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        match PluginBuffer::handle_of(buf, &self.lib) {
            // SAFETY: validated table, live handles of this plugin.
            Some(bh) => unsafe { (self.lib.dev.owns_buffer)(self.h, bh) != 0 },
            None => false,
        }
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        match PluginBuffer::handle_of(buf, &self.lib) {
            // SAFETY: validated table, live handles of this plugin.
            Some(bh) => unsafe { (self.lib.dev.can_access)(self.h, bh) != 0 },
            None => false,
        }
    }
    fn offload_op(&self, tensors: &[TensorDesc], node: TensorId) -> bool {
        let Ok((flat, at)) = FlatGraph::around_node(tensors, node) else {
            return false;
        };
        let raw = flat.raw();
        // SAFETY: validated table, live handle; `raw` borrows `flat`, alive for the call.
        unsafe { (self.lib.dev.offload_op)(self.h, &raw, at) != 0 }
    }
    fn buffer_from_host(&self, mem: HostMemory) -> Result<Option<Arc<dyn Buffer>>> {
        let bytes: &[u8] = (*mem).as_ref();
        let raw = RawHostMemory {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
            ctx: Box::into_raw(Box::new(mem.clone())) as *mut c_void,
            release: release_host_memory,
        };
        let mut out: *mut c_void = std::ptr::null_mut();
        let status = self.lib.call("device.buffer_from_host", |err| {
            // SAFETY: validated table, live handle; the plugin takes ownership of `raw.ctx`.
            unsafe { (self.lib.dev.buffer_from_host)(self.h, &raw, &mut out, err) }
        })?;
        if status == STATUS_DECLINED || out.is_null() {
            return Ok(None);
        }
        Ok(Some(Arc::new(PluginBuffer::new(self.lib.clone(), out))))
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        let mut out: *mut c_void = std::ptr::null_mut();
        self.lib.call("device.init_backend", |err| {
            // SAFETY: validated table, live handle, `out` writable for the call.
            unsafe {
                (self.lib.dev.init_backend)(self.h, opts.n_threads.unwrap_or(0), &mut out, err)
            }
        })?;
        PluginBackend::new(self.lib.clone(), out, &self.name)
            .map(|b| Box::new(b) as Box<dyn Backend>)
    }
}

unsafe extern "C" fn release_host_memory(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: `ctx` is the `Box<HostMemory>` `buffer_from_host` made, released once (ABI).
        drop(unsafe { Box::from_raw(ctx as *mut HostMemory) });
    }
}
