//! Streams and events of a loaded plugin, behind the core traits. Graphs are flattened per call;
//! bindings are translated into the plugin's buffer handles; events cross both ways (a plugin
//! event is waited on natively by its own streams, a host event through callbacks).
#![allow(unsafe_code)]

use super::loader::Lib;
use super::memory::PluginBuffer;
use crate::abi::{RawBinding, RawErrorOut, RawHostEvent, RawStrOut, STATUS_DECLINED};
use crate::codec::FlatGraph;
use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use tessera_core::backend::{Backend, Bindings, Buffer, Event, EventImpl, copy_between};
use tessera_core::error::{Error, Result};
use tessera_core::graph::{Graph, label_of};

/// A stream of a plugin device.
pub(crate) struct PluginBackend {
    pub(crate) lib: Arc<Lib>,
    pub(crate) h: *mut c_void,
    name: String,
}

// SAFETY: the handle is a plugin-side `Box<dyn Backend>`, which is Send; it is used only through
// `&mut self` (the wrapper is not Sync).
unsafe impl Send for PluginBackend {}

impl fmt::Debug for PluginBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginBackend")
            .field("name", &self.name)
            .field("file", &self.lib.file)
            .finish()
    }
}

impl PluginBackend {
    pub(crate) fn new(lib: Arc<Lib>, h: *mut c_void, device: &str) -> Result<PluginBackend> {
        if h.is_null() {
            return Err(Error::Plugin {
                file: lib.file.clone(),
                call: "device.init_backend".into(),
                reason: "succeeded without a stream".into(),
            });
        }
        Ok(PluginBackend {
            lib,
            h,
            name: device.to_string(),
        })
    }

    fn status(
        &mut self,
        call: &'static str,
        f: impl FnOnce(*const RawErrorOut) -> i32,
    ) -> Result<()> {
        self.lib.call(call, f).map(|_| ())
    }

    fn own(&self, buf: &dyn Buffer) -> Option<*mut c_void> {
        PluginBuffer::handle_of(buf, &self.lib)
    }

    /// The placements of `graph`'s tensors as plugin handles; a tensor the graph touches that is
    /// bound to memory of another backend is refused by name.
    fn raw_bindings(&self, graph: &Graph, bindings: &Bindings) -> Result<Vec<RawBinding>> {
        let tensors = graph.tensors();
        let mut touched = vec![false; tensors.len()];
        let mut stack: Vec<usize> = graph
            .nodes()
            .iter()
            .chain(graph.leafs())
            .map(|id| id.index())
            .collect();
        while let Some(i) = stack.pop() {
            if i >= touched.len() || touched[i] {
                continue;
            }
            touched[i] = true;
            let t = &tensors[i];
            stack.extend(t.srcs().map(|s| s.index()));
            stack.extend(t.view_of().map(|v| v.src.index()));
        }
        let mut out = Vec::new();
        for (i, &used) in touched.iter().enumerate() {
            let id = tessera_core::tensor::TensorId::from_index(i);
            let Some(slot) = bindings.slot(id) else {
                continue;
            };
            match self.own(slot.buffer.as_ref()) {
                Some(h) => out.push(RawBinding {
                    tensor: i as u32,
                    buffer: h,
                    offset: slot.offset,
                }),
                None if used => {
                    return Err(Error::Foreign {
                        backend: self.name.clone(),
                        what: format!(
                            "tensor {} is bound to {}, which is not memory of {}",
                            label_of(tensors, id),
                            slot.buffer.name(),
                            self.lib.file
                        ),
                    });
                }
                None => {}
            }
        }
        Ok(out)
    }
}

impl Drop for PluginBackend {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this wrapper and released once.
        unsafe { (self.lib.be.release)(self.h) }
    }
}

impl Backend for PluginBackend {
    fn name(&self) -> &str {
        &self.name
    }
    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        let raw_bindings = self.raw_bindings(graph, bindings)?;
        let flat = FlatGraph::from_graph(graph);
        let raw = flat.raw();
        let (lib, h) = (self.lib.clone(), self.h);
        self.status("backend.compute", |err| {
            // SAFETY: validated table, live handle; `raw` and `raw_bindings` live for the call.
            unsafe { (lib.be.compute)(h, &raw, raw_bindings.as_ptr(), raw_bindings.len(), err) }
        })
    }
    fn synchronize(&mut self) -> Result<()> {
        let (lib, h) = (self.lib.clone(), self.h);
        // SAFETY: validated table, live handle.
        self.status("backend.synchronize", |err| unsafe {
            (lib.be.synchronize)(h, err)
        })
    }
    fn write_async(&mut self, dst: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        let Some(bh) = self.own(dst) else {
            self.synchronize()?;
            return dst.write(offset, data);
        };
        let (lib, h) = (self.lib.clone(), self.h);
        self.status("backend.write_async", |err| {
            // SAFETY: validated table, live handles; `data` is lent for the call.
            unsafe { (lib.be.write_async)(h, bh, offset, data.as_ptr(), data.len(), err) }
        })
    }
    fn read_async(&mut self, src: &dyn Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let Some(bh) = self.own(src) else {
            self.synchronize()?;
            return src.read(offset, dst);
        };
        let (lib, h) = (self.lib.clone(), self.h);
        self.status("backend.read_async", |err| {
            // SAFETY: validated table, live handles; `dst` is lent, writable, for the call.
            unsafe { (lib.be.read_async)(h, bh, offset, dst.as_mut_ptr(), dst.len(), err) }
        })
    }
    fn copy_async(
        &mut self,
        src: &Arc<dyn Buffer>,
        src_offset: usize,
        dst: &Arc<dyn Buffer>,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let (Some(sh), Some(dh)) = (self.own(src.as_ref()), self.own(dst.as_ref())) else {
            // A buffer the plugin cannot see: order by waiting, then copy through the host.
            self.synchronize()?;
            return copy_between(src.as_ref(), src_offset, dst.as_ref(), dst_offset, len);
        };
        let (lib, h) = (self.lib.clone(), self.h);
        self.status("backend.copy_async", |err| {
            // SAFETY: validated table, live handles of this plugin.
            unsafe { (lib.be.copy_async)(h, sh, src_offset, dh, dst_offset, len, err) }
        })
    }
    fn record_event(&mut self) -> Result<Option<Event>> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let (lib, h) = (self.lib.clone(), self.h);
        let status = lib.call("backend.record_event", |err| {
            // SAFETY: validated table, live handle, `out` writable for the call.
            unsafe { (lib.be.record_event)(h, &mut out, err) }
        })?;
        if status == STATUS_DECLINED || out.is_null() {
            return Ok(None);
        }
        Ok(Some(Event(Arc::new(PluginEvent {
            lib: self.lib.clone(),
            h: out,
        }))))
    }
    fn wait_event(&mut self, event: &Event) -> Result<()> {
        let (lib, h) = (self.lib.clone(), self.h);
        if let Some(pe) = event.0.as_any().downcast_ref::<PluginEvent>()
            && pe.lib.same(&lib)
        {
            let eh = pe.h;
            return self.status("backend.wait_event", |err| {
                // SAFETY: validated table, live handles of this plugin.
                unsafe { (lib.be.wait_event)(h, eh, err) }
            });
        }
        // Any other event: lent to the plugin through callbacks, so its stream waits, not we.
        let raw = RawHostEvent {
            ctx: Box::into_raw(Box::new(event.clone())) as *mut c_void,
            synchronize: host_event_synchronize,
            is_complete: host_event_is_complete,
            release: host_event_release,
        };
        self.status("backend.wait_host_event", |err| {
            // SAFETY: validated table, live handle; the plugin takes ownership of `raw.ctx`.
            unsafe { (lib.be.wait_host_event)(h, &raw, err) }
        })
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

unsafe extern "C" fn host_event_synchronize(ctx: *mut c_void, msg: *const RawStrOut) -> i32 {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: `ctx` is the `Box<Event>` lent by `wait_event`, alive until `release`.
        let ev = unsafe { &*(ctx as *const Event) };
        ev.synchronize()
    });
    let e = match r {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "the host event panicked".to_string(),
    };
    if let Some(out) =
        // SAFETY: a non-null sink is valid for the call (ABI contract).
        unsafe { msg.as_ref() }
    {
        // SAFETY: as above; `e` is lent for the call.
        unsafe { (out.write)(out.ctx, e.as_ptr(), e.len()) };
    }
    -1
}

unsafe extern "C" fn host_event_is_complete(ctx: *mut c_void) -> u8 {
    // SAFETY: `ctx` is the `Box<Event>` lent by `wait_event`, alive until `release`.
    std::panic::catch_unwind(|| unsafe { &*(ctx as *const Event) }.is_complete()).unwrap_or(false)
        as u8
}

unsafe extern "C" fn host_event_release(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: `ctx` is the `Box<Event>` lent by `wait_event`; the plugin releases it once.
        drop(unsafe { Box::from_raw(ctx as *mut Event) });
    }
}

/// An event of a plugin stream.
pub(crate) struct PluginEvent {
    lib: Arc<Lib>,
    h: *mut c_void,
}

// SAFETY: the handle is a plugin-side `Event` (an `Arc<dyn EventImpl>`), which is Send + Sync.
unsafe impl Send for PluginEvent {}
// SAFETY: as above.
unsafe impl Sync for PluginEvent {}

impl fmt::Debug for PluginEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginEvent")
            .field("file", &self.lib.file)
            .finish()
    }
}

impl Drop for PluginEvent {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this wrapper and released once.
        unsafe { (self.lib.ev.release)(self.h) }
    }
}

impl EventImpl for PluginEvent {
    fn synchronize(&self) -> Result<()> {
        self.lib
            .call("event.synchronize", |err| {
                // SAFETY: validated table, live handle.
                unsafe { (self.lib.ev.synchronize)(self.h, err) }
            })
            .map(|_| ())
    }
    fn is_complete(&self) -> bool {
        // SAFETY: validated table, live handle.
        unsafe { (self.lib.ev.is_complete)(self.h) != 0 }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
