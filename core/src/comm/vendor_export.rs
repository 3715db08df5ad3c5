//! Helpers for backends that export the comm trio: the pointer handling and panic catching every
//! implementation needs, so a backend's `extern "C"` functions are one call each and its own code
//! sees safe types.
#![allow(unsafe_code)]

use super::vendor::{
    COMM_ALLREDUCE, COMM_FREE, COMM_INIT, CommAllReduceFn, CommFreeFn, CommInitFn, RawCommSlice,
};
use crate::backend::{Backend, Buffer};
use crate::error::Result;
use crate::registry::ProcAddress;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// One slice of an all-reduce call, with its buffer (`None` when the caller passed null).
#[derive(Clone)]
pub struct CommCall {
    /// The device's buffer.
    pub buffer: Option<Arc<dyn Buffer>>,
    /// Byte offset of the first value.
    pub offset: usize,
    /// Number of f32 values.
    pub len: usize,
    /// Whether the slice holds an addend.
    pub contributes: bool,
}

/// Body of a backend's `tessera_comm_init`: hands the streams to `make` and boxes the context it
/// returns (null when it declines or panics).
///
/// # Safety
/// `streams` is null or points to `n` live, exclusively borrowed `*mut Box<dyn Backend>` handles
/// (the comm ABI), valid for the call.
pub unsafe fn comm_init_with<C>(
    streams: *const *mut c_void,
    n: usize,
    make: impl FnOnce(Vec<&mut Box<dyn Backend>>) -> Option<C>,
) -> *mut c_void {
    if streams.is_null() && n > 0 {
        return std::ptr::null_mut();
    }
    let run = || {
        let backends: Vec<&mut Box<dyn Backend>> = (0..n)
            // SAFETY: the caller's contract: entry `i` is a live, exclusively borrowed backend.
            .map(|i| unsafe { &mut *(*streams.add(i) as *mut Box<dyn Backend>) })
            .collect();
        make(backends)
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Some(ctx)) => Box::into_raw(Box::new(ctx)) as *mut c_void,
        Ok(None) => std::ptr::null_mut(),
        Err(_) => {
            tracing::warn!("tessera_comm_init panicked; declining");
            std::ptr::null_mut()
        }
    }
}

/// Body of a backend's `tessera_comm_allreduce_tensor`: returns what `run` returns (0 done,
/// 1 declined), -1 when it fails (logged), -2 for bad arguments, -3 when it panics.
///
/// # Safety
/// `ctx` is null or came from [`comm_init_with`] with the same `C` and is not used concurrently;
/// `slices` is null or points to `n` slices valid for the call.
pub unsafe fn comm_allreduce_with<C>(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
    run: impl FnOnce(&mut C, Vec<CommCall>) -> Result<i32>,
) -> i32 {
    if ctx.is_null() || (slices.is_null() && n > 0) {
        return -2;
    }
    // SAFETY: the caller's contract: a live context of type C, used by one caller at a time.
    let ctx = unsafe { &mut *(ctx as *mut C) };
    let raw = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the ABI passes `n` slices valid for the call.
        unsafe { std::slice::from_raw_parts(slices, n) }
    };
    let calls = raw
        .iter()
        .map(|s| CommCall {
            buffer: (!s.buffer.is_null())
                // SAFETY: the ABI's `buffer` is a `*const Arc<dyn Buffer>` valid for the call.
                .then(|| unsafe { (*(s.buffer as *const Arc<dyn Buffer>)).clone() }),
            offset: s.offset,
            len: s.len,
            contributes: s.contributes != 0,
        })
        .collect();
    match catch_unwind(AssertUnwindSafe(|| run(ctx, calls))) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "vendor all-reduce failed");
            -1
        }
        Err(_) => -3,
    }
}

/// Body of a backend's `tessera_comm_free`: hands the context to `release` (panics caught).
///
/// # Safety
/// `ctx` is null or came from [`comm_init_with`] with the same `C`, and is freed only here, once.
pub unsafe fn comm_free_with<C>(ctx: *mut c_void, release: impl FnOnce(Box<C>)) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: the caller's contract: the context's Box, freed exactly once.
    let ctx = unsafe { Box::from_raw(ctx as *mut C) };
    if catch_unwind(AssertUnwindSafe(move || release(ctx))).is_err() {
        tracing::warn!("tessera_comm_free panicked");
    }
}

/// A backend's `Registry::proc_address` for its comm trio: the address of `init`, `allreduce` or
/// `free` for their names, `None` for any other. Taking the ABI's function types checks the
/// backend's signatures at compile time.
pub fn comm_proc_address(
    name: &str,
    init: CommInitFn,
    allreduce: CommAllReduceFn,
    free: CommFreeFn,
) -> Option<ProcAddress> {
    let f: *const c_void = match name {
        COMM_INIT => init as *const c_void,
        COMM_ALLREDUCE => allreduce as *const c_void,
        COMM_FREE => free as *const c_void,
        _ => return None,
    };
    Some(ProcAddress::new(f))
}
