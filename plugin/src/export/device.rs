//! The device table of the export adapter.
#![allow(unsafe_code)]

use super::{
    BackendObj, BufferObj, BufferTypeObj, DeviceObj, guarded, into_handle, obj, put, quiet,
    quiet_unit, release, write_str,
};
use crate::abi::{
    RawDeviceTable, RawErrorOut, RawGraph, RawHeader, RawHostMemory, RawMemoryInfo, RawStrOut,
    STATUS_DECLINED, STATUS_OK, caps_bit,
};
use crate::codec::decode_graph;
use std::ffi::c_void;
use tessera_core::backend::{BackendOptions, DeviceType, HostMemory, Support};
use tessera_core::error::{Error, Result};
use tessera_core::tensor::TensorId;

/// The device table every exported device handle uses.
pub(crate) static TABLE: RawDeviceTable = RawDeviceTable {
    header: RawHeader::of::<RawDeviceTable>(),
    release: dev_release,
    name: dev_name,
    description: dev_description,
    kind: dev_kind,
    memory: dev_memory,
    caps: dev_caps,
    buffer_type: dev_buffer_type,
    host_buffer_type: dev_host_buffer_type,
    supports_op: dev_supports_op,
    supports_buffer_type: dev_supports_buffer_type,
    owns_buffer: dev_owns_buffer,
    can_access: dev_can_access,
    offload_op: dev_offload_op,
    buffer_from_host: dev_buffer_from_host,
    init_backend: dev_init_backend,
};

fn dev<'a>(h: *mut c_void) -> Result<&'a DeviceObj> {
    // SAFETY: the host passes device handles this adapter made and has not released (ABI contract).
    unsafe { obj::<DeviceObj>(h, "device") }
}

unsafe extern "C" fn dev_release(h: *mut c_void) {
    quiet_unit("device.release", || {
        // SAFETY: the host releases each device handle once (ABI contract).
        unsafe { release::<DeviceObj>(h) };
        Ok(())
    })
}

unsafe extern "C" fn dev_name(h: *mut c_void, out: *const RawStrOut) {
    quiet_unit("device.name", || {
        write_str(out, dev(h)?.name());
        Ok(())
    })
}

unsafe extern "C" fn dev_description(h: *mut c_void, out: *const RawStrOut) {
    quiet_unit("device.description", || {
        write_str(out, &dev(h)?.description());
        Ok(())
    })
}

unsafe extern "C" fn dev_kind(h: *mut c_void) -> u32 {
    quiet("device.kind", 0, || {
        Ok(match dev(h)?.kind() {
            DeviceType::Cpu => 0,
            DeviceType::Gpu => 1,
            DeviceType::Igpu => 2,
            DeviceType::Accel => 3,
            DeviceType::Meta => 4,
            // A kind newer than this ABI: the host reads unknown kinds as CPU-like.
            _ => u32::MAX,
        })
    })
}

unsafe extern "C" fn dev_memory(h: *mut c_void, out: *mut RawMemoryInfo) {
    quiet_unit("device.memory", || {
        let m = dev(h)?.memory();
        if !out.is_null() {
            // SAFETY: a non-null out-pointer is writable for the call (ABI contract).
            unsafe {
                *out = RawMemoryInfo {
                    free: m.free,
                    total: m.total,
                }
            };
        }
        Ok(())
    })
}

unsafe extern "C" fn dev_caps(h: *mut c_void) -> u32 {
    quiet("device.caps", 0, || {
        let c = dev(h)?.caps();
        Ok([
            (c.is_async, caps_bit::IS_ASYNC),
            (c.host_buffer, caps_bit::HOST_BUFFER),
            (c.buffer_from_host, caps_bit::BUFFER_FROM_HOST),
            (c.events, caps_bit::EVENTS),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |acc, (_, bit)| acc | bit))
    })
}

unsafe extern "C" fn dev_buffer_type(h: *mut c_void) -> *mut c_void {
    quiet("device.buffer_type", std::ptr::null_mut(), || {
        Ok(into_handle::<BufferTypeObj>(dev(h)?.buffer_type()))
    })
}

unsafe extern "C" fn dev_host_buffer_type(h: *mut c_void) -> *mut c_void {
    quiet("device.host_buffer_type", std::ptr::null_mut(), || {
        Ok(dev(h)?
            .host_buffer_type()
            .map_or(std::ptr::null_mut(), into_handle::<BufferTypeObj>))
    })
}

/// The node of a flat graph, checked.
fn graph_node(graph: *const RawGraph, node: u32) -> Result<(tessera_core::graph::Graph, TensorId)> {
    // SAFETY: a non-null graph is valid for the call (ABI contract); null is refused.
    let raw =
        unsafe { graph.as_ref() }.ok_or_else(|| Error::InvalidArgument("null graph".into()))?;
    // SAFETY: as above, the graph's arrays are readable for the call.
    let g = unsafe { decode_graph(raw) }?;
    let id = TensorId::from_index(node as usize);
    g.tensor(id)?;
    Ok((g, id))
}

unsafe extern "C" fn dev_supports_op(
    h: *mut c_void,
    graph: *const RawGraph,
    node: u32,
    reason: *const RawStrOut,
) -> u8 {
    let answer = quiet(
        "device.supports_op",
        Support::No("the plugin panicked in supports_op".into()),
        || {
            let (g, id) = graph_node(graph, node)?;
            Ok(dev(h)?.supports_op(g.tensors(), id))
        },
    );
    match answer {
        Support::Yes => 1,
        Support::No(why) => {
            write_str(reason, &why);
            0
        }
    }
}

unsafe extern "C" fn dev_supports_buffer_type(h: *mut c_void, buft: *mut c_void) -> u8 {
    quiet("device.supports_buffer_type", 0, || {
        // SAFETY: the host passes a live buffer type handle of this plugin (ABI contract).
        let b = unsafe { obj::<BufferTypeObj>(buft, "buffer type") }?;
        Ok(dev(h)?.supports_buffer_type(b.as_ref()) as u8)
    })
}

unsafe extern "C" fn dev_owns_buffer(h: *mut c_void, buf: *mut c_void) -> u8 {
    quiet("device.owns_buffer", 0, || {
        // SAFETY: the host passes a live buffer handle of this plugin (ABI contract).
        let b = unsafe { obj::<BufferObj>(buf, "buffer") }?;
        Ok(dev(h)?.owns_buffer(b.as_ref()) as u8)
    })
}

unsafe extern "C" fn dev_can_access(h: *mut c_void, buf: *mut c_void) -> u8 {
    quiet("device.can_access", 0, || {
        // SAFETY: the host passes a live buffer handle of this plugin (ABI contract).
        let b = unsafe { obj::<BufferObj>(buf, "buffer") }?;
        Ok(dev(h)?.can_access(b.as_ref()) as u8)
    })
}

unsafe extern "C" fn dev_offload_op(h: *mut c_void, graph: *const RawGraph, node: u32) -> u8 {
    quiet("device.offload_op", 0, || {
        let (g, id) = graph_node(graph, node)?;
        Ok(dev(h)?.offload_op(g.tensors(), id) as u8)
    })
}

/// Host memory lent through [`RawHostMemory`]; released exactly once, on drop.
struct LentMemory(RawHostMemory);

// SAFETY: the host lends immutable bytes that stay valid until `release`, which may be called from
// any thread (ABI contract of `buffer_from_host`).
unsafe impl Send for LentMemory {}
// SAFETY: as above; the bytes are only read.
unsafe impl Sync for LentMemory {}

impl AsRef<[u8]> for LentMemory {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the bytes stay valid and unchanged until `release`, which runs only on drop.
        unsafe { crate::abi::raw_bytes(self.0.ptr, self.0.len) }
    }
}

impl Drop for LentMemory {
    fn drop(&mut self) {
        // SAFETY: released once, here (ABI contract).
        unsafe { (self.0.release)(self.0.ctx) }
    }
}

unsafe extern "C" fn dev_buffer_from_host(
    h: *mut c_void,
    mem: *const RawHostMemory,
    out: *mut *mut c_void,
    err: *const RawErrorOut,
) -> i32 {
    guarded(err, "device.buffer_from_host", || {
        // SAFETY: a non-null descriptor is readable for the call (ABI contract).
        let raw = unsafe { mem.as_ref() }
            .copied()
            .ok_or_else(|| Error::InvalidArgument("null host memory".into()))?;
        // Ownership passes to the plugin now: whatever happens next, the host's owner is released.
        let lent: HostMemory = std::sync::Arc::new(LentMemory(raw));
        match dev(h)?.buffer_from_host(lent)? {
            Some(buf) => {
                put::<BufferObj>(out, buf)?;
                Ok(STATUS_OK)
            }
            None => Ok(STATUS_DECLINED),
        }
    })
}

unsafe extern "C" fn dev_init_backend(
    h: *mut c_void,
    n_threads: usize,
    out: *mut *mut c_void,
    err: *const RawErrorOut,
) -> i32 {
    guarded(err, "device.init_backend", || {
        let opts = match n_threads {
            0 => BackendOptions::default(),
            n => BackendOptions::with_threads(n),
        };
        let backend = dev(h)?.init_backend(&opts)?;
        put::<BackendObj>(out, backend)?;
        Ok(STATUS_OK)
    })
}
