//! The comm trio of a plugin, found by name like a compiled-in one. The comm ABI passes host
//! objects (`*mut Box<dyn Backend>`, `*const Arc<dyn Buffer>`), which for a plugin are host
//! wrappers; these shims swap them for the plugin handles underneath (which are exactly the
//! plugin's own `Box<dyn Backend>` / `Arc<dyn Buffer>`) and call the plugin's trio. Streams or
//! buffers from elsewhere make the shims decline, so the generic all-reduce runs instead.
#![allow(unsafe_code)]

use super::loader::{Lib, RawComm};
use super::memory::PluginBuffer;
use super::stream::PluginBackend;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use tessera_core::backend::{Backend, Buffer};
use tessera_core::comm::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT, RawCommSlice};
use tessera_core::registry::ProcAddress;

/// The host shim answering `name`, if `name` is one of the comm trio.
pub(crate) fn shim(name: &str) -> Option<ProcAddress> {
    let f: *const c_void = match name {
        COMM_INIT => shim_init as *const c_void,
        COMM_ALLREDUCE => shim_allreduce as *const c_void,
        COMM_FREE => shim_free as *const c_void,
        _ => return None,
    };
    Some(ProcAddress::new(f))
}

/// A plugin comm context with the library it came from.
struct ShimComm {
    lib: Arc<Lib>,
    comm: RawComm,
    ctx: *mut c_void,
}

unsafe extern "C" fn shim_init(streams: *const *mut c_void, n: usize) -> *mut c_void {
    let made = catch_unwind(AssertUnwindSafe(|| {
        if streams.is_null() || n == 0 {
            return std::ptr::null_mut();
        }
        let mut lib: Option<Arc<Lib>> = None;
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: the caller passes `n` valid `*mut Box<dyn Backend>` for the call (comm ABI).
            let p = unsafe { *streams.add(i) } as *mut Box<dyn Backend>;
            // SAFETY: as above; borrowed only for this call.
            let Some(backend) = (unsafe { p.as_mut() }) else {
                return std::ptr::null_mut();
            };
            let Some(pb) = backend.as_any_mut().downcast_mut::<PluginBackend>() else {
                return std::ptr::null_mut(); // not a plugin stream: decline
            };
            match &lib {
                None => lib = Some(pb.lib.clone()),
                Some(l) if l.same(&pb.lib) => {}
                Some(_) => return std::ptr::null_mut(), // streams of two plugins: decline
            }
            handles.push(pb.h);
        }
        let Some(lib) = lib else {
            return std::ptr::null_mut();
        };
        let Some(comm) = lib.comm else {
            return std::ptr::null_mut();
        };
        // SAFETY: the plugin handles are its `*mut Box<dyn Backend>`, valid for the call.
        let ctx = unsafe { (comm.init)(handles.as_ptr(), handles.len()) };
        if ctx.is_null() {
            return std::ptr::null_mut();
        }
        Box::into_raw(Box::new(ShimComm { lib, comm, ctx })) as *mut c_void
    }));
    made.unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn shim_allreduce(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
) -> i32 {
    let rc = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` came from `shim_init` and is not freed yet (comm ABI).
        let Some(shim) = (unsafe { (ctx as *const ShimComm).as_ref() }) else {
            return -1;
        };
        if slices.is_null() && n > 0 {
            return -1;
        }
        let raw = if n == 0 {
            &[][..]
        } else {
            // SAFETY: the caller passes `n` slices valid for the call (comm ABI).
            unsafe { std::slice::from_raw_parts(slices, n) }
        };
        let mut translated = Vec::with_capacity(n);
        for s in raw {
            // SAFETY: `buffer` is a `*const Arc<dyn Buffer>` valid for the call (comm ABI).
            let Some(buf) = (unsafe { (s.buffer as *const Arc<dyn Buffer>).as_ref() }) else {
                return -1;
            };
            match PluginBuffer::parts(buf.as_ref()) {
                Some((lib, h)) if lib.same(&shim.lib) => translated.push(RawCommSlice {
                    buffer: h as *const c_void,
                    ..*s
                }),
                _ => return 1, // memory the plugin cannot see: decline, nothing enqueued
            }
        }
        // SAFETY: the context is the plugin's; the translated buffers are its live handles, held
        // by the caller's `Arc`s for the call.
        unsafe { (shim.comm.allreduce)(shim.ctx, translated.as_ptr(), translated.len()) }
    }));
    rc.unwrap_or(-2)
}

unsafe extern "C" fn shim_free(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: `ctx` came from `shim_init` and is freed once (comm ABI).
    let shim = unsafe { Box::from_raw(ctx as *mut ShimComm) };
    // SAFETY: the plugin context is freed once, here.
    unsafe { (shim.comm.free)(shim.ctx) };
}
