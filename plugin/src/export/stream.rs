//! The backend (stream) and event tables of the export adapter, and host events as seen by the
//! plugin.
#![allow(unsafe_code)]

use super::memory::{buf, host_bytes, host_bytes_mut};
use super::{
    BackendObj, EventObj, guarded, guarded_unit, obj, obj_mut, put, quiet, quiet_unit, release,
    write_str,
};
use crate::abi::{
    RawBackendTable, RawBinding, RawErrorOut, RawEventTable, RawGraph, RawHeader, RawHostEvent,
    RawStrOut, STATUS_DECLINED, STATUS_OK,
};
use crate::codec::decode_graph;
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;
use tessera_core::backend::{Bindings, Event, EventImpl};
use tessera_core::error::{Error, Result};
use tessera_core::tensor::TensorId;

/// The table every exported backend handle uses.
pub(crate) static BACKEND_TABLE: RawBackendTable = RawBackendTable {
    header: RawHeader::of::<RawBackendTable>(),
    release: be_release,
    name: be_name,
    compute: be_compute,
    synchronize: be_synchronize,
    write_async: be_write_async,
    read_async: be_read_async,
    copy_async: be_copy_async,
    record_event: be_record_event,
    wait_event: be_wait_event,
    wait_host_event: be_wait_host_event,
};

/// The table every exported event handle uses.
pub(crate) static EVENT_TABLE: RawEventTable = RawEventTable {
    header: RawHeader::of::<RawEventTable>(),
    release: ev_release,
    synchronize: ev_synchronize,
    is_complete: ev_is_complete,
};

fn backend<'a>(h: *mut c_void) -> Result<&'a mut BackendObj> {
    // SAFETY: the host passes backend handles this adapter made and has not released, from the one
    // thread that drives the stream (a backend is Send, not Sync), so the borrow is unique.
    unsafe { obj_mut::<BackendObj>(h, "backend") }
}

fn event<'a>(h: *mut c_void) -> Result<&'a EventObj> {
    // SAFETY: the host passes event handles this adapter made and has not released.
    unsafe { obj::<EventObj>(h, "event") }
}

unsafe extern "C" fn be_release(h: *mut c_void) {
    quiet_unit("backend.release", || {
        // SAFETY: the host releases each backend handle once (ABI contract).
        unsafe { release::<BackendObj>(h) };
        Ok(())
    })
}

unsafe extern "C" fn be_name(h: *mut c_void, out: *const RawStrOut) {
    quiet_unit("backend.name", || {
        write_str(out, backend(h)?.name());
        Ok(())
    })
}

unsafe extern "C" fn be_compute(
    h: *mut c_void,
    graph: *const RawGraph,
    bindings: *const RawBinding,
    n_bindings: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "backend.compute", || {
        // SAFETY: a non-null graph is readable for the call (ABI contract).
        let raw =
            unsafe { graph.as_ref() }.ok_or_else(|| Error::InvalidArgument("null graph".into()))?;
        // SAFETY: the graph's arrays are readable for the call (ABI contract).
        let g = unsafe { decode_graph(raw) }?;
        if bindings.is_null() && n_bindings > 0 {
            return Err(Error::InvalidArgument("null bindings".into()));
        }
        let list = if n_bindings == 0 {
            &[][..]
        } else {
            // SAFETY: `n_bindings` entries are readable for the call (ABI contract).
            unsafe { std::slice::from_raw_parts(bindings, n_bindings) }
        };
        let mut b = Bindings::new();
        for r in list {
            let id = TensorId::from_index(r.tensor as usize);
            g.tensor(id)?;
            b.bind(id, buf(r.buffer)?.clone(), r.offset);
        }
        backend(h)?.compute(&g, &b)
    })
}

unsafe extern "C" fn be_synchronize(h: *mut c_void, err: *const RawErrorOut) -> i32 {
    guarded_unit(err, "backend.synchronize", || backend(h)?.synchronize())
}

unsafe extern "C" fn be_write_async(
    h: *mut c_void,
    b: *mut c_void,
    offset: usize,
    src: *const u8,
    len: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "backend.write_async", || {
        backend(h)?.write_async(buf(b)?.as_ref(), offset, host_bytes(src, len)?)
    })
}

unsafe extern "C" fn be_read_async(
    h: *mut c_void,
    b: *mut c_void,
    offset: usize,
    dst: *mut u8,
    len: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "backend.read_async", || {
        backend(h)?.read_async(buf(b)?.as_ref(), offset, host_bytes_mut(dst, len)?)
    })
}

unsafe extern "C" fn be_copy_async(
    h: *mut c_void,
    src: *mut c_void,
    src_offset: usize,
    dst: *mut c_void,
    dst_offset: usize,
    len: usize,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "backend.copy_async", || {
        backend(h)?.copy_async(buf(src)?, src_offset, buf(dst)?, dst_offset, len)
    })
}

unsafe extern "C" fn be_record_event(
    h: *mut c_void,
    out: *mut *mut c_void,
    err: *const RawErrorOut,
) -> i32 {
    guarded(err, "backend.record_event", || {
        match backend(h)?.record_event()? {
            Some(ev) => {
                put::<EventObj>(out, ev)?;
                Ok(STATUS_OK)
            }
            None => Ok(STATUS_DECLINED),
        }
    })
}

unsafe extern "C" fn be_wait_event(
    h: *mut c_void,
    ev: *mut c_void,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "backend.wait_event", || {
        backend(h)?.wait_event(event(ev)?)
    })
}

/// A host event lent to this plugin; the host's reference is released on drop.
#[derive(Debug)]
struct HostEventRef(RawHostEvent);

// SAFETY: the host's event callbacks may be called from any thread and its event object is
// Send + Sync (ABI contract of `wait_host_event`).
unsafe impl Send for HostEventRef {}
// SAFETY: as above.
unsafe impl Sync for HostEventRef {}

impl EventImpl for HostEventRef {
    fn synchronize(&self) -> Result<()> {
        let mut msg = Vec::new();
        let out = RawStrOut::into_vec(&mut msg);
        // SAFETY: the event is held until `release` (on drop); `out` lives for the call.
        let rc = unsafe { (self.0.synchronize)(self.0.ctx, &out) };
        if rc == STATUS_OK {
            Ok(())
        } else {
            Err(Error::Compute {
                device: "host event".into(),
                reason: String::from_utf8_lossy(&msg).into_owned(),
            })
        }
    }
    fn is_complete(&self) -> bool {
        // SAFETY: the event is held until `release` (on drop).
        unsafe { (self.0.is_complete)(self.0.ctx) != 0 }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HostEventRef {
    fn drop(&mut self) {
        // SAFETY: released once, here (ABI contract).
        unsafe { (self.0.release)(self.0.ctx) }
    }
}

unsafe extern "C" fn be_wait_host_event(
    h: *mut c_void,
    ev: *const RawHostEvent,
    err: *const RawErrorOut,
) -> i32 {
    guarded_unit(err, "backend.wait_host_event", || {
        // SAFETY: a non-null descriptor is readable for the call (ABI contract).
        let raw = unsafe { ev.as_ref() }
            .copied()
            .ok_or_else(|| Error::InvalidArgument("null host event".into()))?;
        // Owned from here on: released when the stream is done with it, or now on error.
        let event = Event(Arc::new(HostEventRef(raw)));
        backend(h)?.wait_event(&event)
    })
}

unsafe extern "C" fn ev_release(h: *mut c_void) {
    quiet_unit("event.release", || {
        // SAFETY: the host releases each event handle once (ABI contract).
        unsafe { release::<EventObj>(h) };
        Ok(())
    })
}

unsafe extern "C" fn ev_synchronize(h: *mut c_void, err: *const RawErrorOut) -> i32 {
    guarded_unit(err, "event.synchronize", || event(h)?.synchronize())
}

unsafe extern "C" fn ev_is_complete(h: *mut c_void) -> u8 {
    quiet("event.is_complete", 0, || Ok(event(h)?.is_complete() as u8))
}
