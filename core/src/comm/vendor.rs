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

/// Name of the optional function giving a new job id for [`COMM_INIT_RANKS`] (called on rank 0
/// of a job spanning several processes; NCCL's `ncclGetUniqueId`).
pub const COMM_UNIQUE_ID: &str = "tessera_comm_unique_id";
/// Name of the optional init over the streams of several processes: this process's streams are
/// global ranks `first_rank..first_rank + n` of `n_ranks`, joined by the id rank 0 made (NCCL's
/// `ncclCommInitRank`). The context it returns is used with [`COMM_ALLREDUCE`] and
/// [`COMM_FREE`] like one from [`COMM_INIT`]; every process must call it (it is collective).
pub const COMM_INIT_RANKS: &str = "tessera_comm_init_ranks";
/// Bytes of a job id.
pub const COMM_ID_BYTES: usize = 128;

/// `tessera_comm_unique_id(out, len) -> 0 | <0 failed`; writes `len` ([`COMM_ID_BYTES`]) bytes.
pub type CommUniqueIdFn = unsafe extern "C" fn(out: *mut u8, len: usize) -> i32;
/// `tessera_comm_init_ranks(streams, n, id, id_len, n_ranks, first_rank) -> ctx or null`.
pub type CommInitRanksFn = unsafe extern "C" fn(
    streams: *const *mut c_void,
    n: usize,
    id: *const u8,
    id_len: usize,
    n_ranks: usize,
    first_rank: usize,
) -> *mut c_void;

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

/// A registry's comm across processes ([`COMM_UNIQUE_ID`], [`COMM_INIT_RANKS`] and the trio).
#[derive(Clone, Copy, Debug)]
pub struct RanksCommApi {
    api: CommApi,
    unique_id: CommUniqueIdFn,
    init_ranks: CommInitRanksFn,
}

impl RanksCommApi {
    /// The functions of `registry`, if it exports all five.
    pub fn from_registry(registry: &dyn Registry) -> Option<RanksCommApi> {
        let api = CommApi::from_registry(registry)?;
        let (u, i) = (
            registry.proc_address(COMM_UNIQUE_ID)?,
            registry.proc_address(COMM_INIT_RANKS)?,
        );
        if u.as_ptr().is_null() || i.as_ptr().is_null() {
            return None;
        }
        // SAFETY: as in `CommApi::from_registry`: these names carry exactly these signatures.
        unsafe {
            Some(RanksCommApi {
                api,
                unique_id: std::mem::transmute::<*const c_void, CommUniqueIdFn>(u.as_ptr()),
                init_ranks: std::mem::transmute::<*const c_void, CommInitRanksFn>(i.as_ptr()),
            })
        }
    }

    /// A new job id (rank 0 makes it, the others receive it).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the backend cannot make one (no library, no device).
    pub fn unique_id(&self) -> Result<Vec<u8>> {
        let mut id = vec![0u8; COMM_ID_BYTES];
        // SAFETY: `id` has room for the documented length.
        let rc = unsafe { (self.unique_id)(id.as_mut_ptr(), id.len()) };
        if rc == 0 {
            Ok(id)
        } else {
            Err(Error::Unavailable {
                backend: "comm".into(),
                reason: format!("{COMM_UNIQUE_ID} returned {rc}"),
            })
        }
    }

    /// This process's `streams` as global ranks `first_rank..` of `n_ranks` in the job `id`, or
    /// `None` when the backend declines (every process must call this).
    pub fn init(
        &self,
        streams: &mut [Box<dyn Backend>],
        id: &[u8],
        n_ranks: usize,
        first_rank: usize,
    ) -> Option<VendorComm> {
        let mut handles: Vec<*mut c_void> = streams
            .iter_mut()
            .map(|s| s as *mut Box<dyn Backend> as *mut c_void)
            .collect();
        // SAFETY: as in `CommApi::init`; `id` is valid for the call.
        let ctx = unsafe {
            (self.init_ranks)(
                handles.as_mut_ptr() as *const *mut c_void,
                handles.len(),
                id.as_ptr(),
                id.len(),
                n_ranks,
                first_rank,
            )
        };
        (!ctx.is_null()).then_some(VendorComm {
            api: self.api,
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
