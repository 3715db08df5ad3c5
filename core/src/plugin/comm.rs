//! The comm trio: a backend's optional in-place all-reduce, found by name.
//!
//! | symbol | signature | meaning |
//! |---|---|---|
//! | [`COMM_INIT`] | [`CommInitFn`] | a context for these streams, or null to decline |
//! | [`COMM_ALLREDUCE`] | [`CommAllReduceFn`] | enqueue the sum on every stream: 0 done, 1 declined (nothing enqueued), negative = failed |
//! | [`COMM_FREE`] | [`CommFreeFn`] | destroy the context |
//!
//! Contract (what ggml left implicit): slices are f32, contiguous, of equal length, one per
//! stream in the order given to init; a slice whose `contributes` is 0 counts as zeros whatever
//! its memory holds; the sum is ordered after the work already queued on each stream and before
//! work queued later; a decline happens before anything is enqueued. Stream and buffer handles
//! are in-process Rust objects (`*mut Box<dyn Backend>`, `*const Arc<dyn Buffer>`) valid only for
//! the duration of the call: implementations keep their own references, never the pointers.
#![allow(unsafe_code)]

use crate::backend::{Backend, Buffer};
use crate::comm::CommSlice;
use crate::error::{Error, Result};
use crate::registry::Registry;
use std::ffi::c_void;
use std::sync::Arc;

/// Name of the init function.
pub const COMM_INIT: &str = "tessera_comm_init";
/// Name of the all-reduce function.
pub const COMM_ALLREDUCE: &str = "tessera_comm_allreduce_tensor";
/// Name of the free function.
pub const COMM_FREE: &str = "tessera_comm_free";

/// One device's slice as the comm ABI sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawCommSlice {
    /// `*const Arc<dyn Buffer>`, valid for the duration of the call.
    pub buffer: *const c_void,
    /// Byte offset of the first value.
    pub offset: usize,
    /// Number of f32 values.
    pub len: usize,
    /// 1 if the slice holds an addend, 0 if it counts as zeros.
    pub contributes: u8,
}

/// `tessera_comm_init(streams, n) -> ctx or null`; `streams[i]` is a `*mut Box<dyn Backend>`.
pub type CommInitFn = unsafe extern "C" fn(streams: *const *mut c_void, n: usize) -> *mut c_void;
/// `tessera_comm_allreduce_tensor(ctx, slices, n) -> 0 done | 1 declined | <0 failed`.
pub type CommAllReduceFn =
    unsafe extern "C" fn(ctx: *mut c_void, slices: *const RawCommSlice, n: usize) -> i32;
/// `tessera_comm_free(ctx)`.
pub type CommFreeFn = unsafe extern "C" fn(ctx: *mut c_void);

/// What a vendor all-reduce did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommOutcome {
    /// Enqueued on every stream.
    Done,
    /// Not handled; nothing was enqueued, the generic path should run.
    Declined,
}

/// A registry's comm trio, checked to be complete.
#[derive(Clone, Copy, Debug)]
pub struct CommApi {
    init: CommInitFn,
    allreduce: CommAllReduceFn,
    free: CommFreeFn,
}

impl CommApi {
    /// The trio of `registry`, if it exports all three functions.
    pub fn from_registry(registry: &dyn Registry) -> Option<CommApi> {
        let (i, a, f) = (
            registry.proc_address(COMM_INIT)?,
            registry.proc_address(COMM_ALLREDUCE)?,
            registry.proc_address(COMM_FREE)?,
        );
        if i.as_ptr().is_null() || a.as_ptr().is_null() || f.as_ptr().is_null() {
            return None;
        }
        // SAFETY: these names are documented to carry exactly these signatures (module docs);
        // a registry exporting them under other signatures breaks the Registry contract.
        unsafe {
            Some(CommApi {
                init: std::mem::transmute::<*const c_void, CommInitFn>(i.as_ptr()),
                allreduce: std::mem::transmute::<*const c_void, CommAllReduceFn>(a.as_ptr()),
                free: std::mem::transmute::<*const c_void, CommFreeFn>(f.as_ptr()),
            })
        }
    }

    /// A context for `streams`, or `None` when the backend declines them.
    pub fn init(&self, streams: &mut [Box<dyn Backend>]) -> Option<VendorComm> {
        let mut handles: Vec<*mut c_void> = streams
            .iter_mut()
            .map(|s| s as *mut Box<dyn Backend> as *mut c_void)
            .collect();
        // SAFETY: every handle points to a live `Box<dyn Backend>` borrowed mutably for this call;
        // the contract forbids keeping the pointers.
        let ctx = unsafe { (self.init)(handles.as_mut_ptr() as *const *mut c_void, handles.len()) };
        (!ctx.is_null()).then_some(VendorComm {
            api: *self,
            ctx,
            n: streams.len(),
        })
    }
}

/// A live vendor comm context; freed on drop.
#[derive(Debug)]
pub struct VendorComm {
    api: CommApi,
    ctx: *mut c_void,
    n: usize,
}

// SAFETY: the context is owned by this value and only used through `&mut self`; implementations
// hold thread-safe handles (the CPU one: channel senders and Arcs).
unsafe impl Send for VendorComm {}

impl VendorComm {
    /// Enqueues the in-place sum of `slices` (one per stream given to init).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slice count other than the stream count;
    /// [`Error::Compute`] when the implementation reports a failure.
    pub fn allreduce(&mut self, slices: &[CommSlice]) -> Result<CommOutcome> {
        if slices.len() != self.n {
            return Err(Error::InvalidArgument(format!(
                "comm over {} streams got {} slices",
                self.n,
                slices.len()
            )));
        }
        let raw: Vec<RawCommSlice> = slices
            .iter()
            .map(|s| RawCommSlice {
                buffer: &s.buffer as *const Arc<dyn Buffer> as *const c_void,
                offset: s.offset,
                len: s.len,
                contributes: s.contributes as u8,
            })
            .collect();
        // SAFETY: `ctx` came from this API's init and is not freed yet; `raw` and the Arcs it points
        // to live for the call.
        let rc = unsafe { (self.api.allreduce)(self.ctx, raw.as_ptr(), raw.len()) };
        match rc {
            0 => Ok(CommOutcome::Done),
            1 => Ok(CommOutcome::Declined),
            code => Err(Error::Compute {
                device: "comm".into(),
                reason: format!("{COMM_ALLREDUCE} returned {code}"),
            }),
        }
    }
}

impl Drop for VendorComm {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from init and is freed exactly once, here.
        unsafe { (self.api.free)(self.ctx) }
    }
}
