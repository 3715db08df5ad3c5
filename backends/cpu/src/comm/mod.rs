//! The CPU comm: an in-place all-reduce between CPU devices of one process, over shared memory,
//! performed by the devices' own stream threads (and pools, for large slices). Exported as the
//! comm trio (`tessera_comm_init` / `tessera_comm_allreduce_tensor` / `tessera_comm_free`)
//! through the registry's `proc_address`.
//!
//! Each device runs one queued job per all-reduce, in one of two plans chosen by size:
//!
//! - **One-shot** (small: N·S ≤ [`ONE_SHOT_BYTES`]; decode-sized reductions). Device j copies its
//!   slice into its staging slot, announces the phase, waits for every peer, then sums every
//!   staged slice into its own. One synchronisation, and a device only ever writes its own slice,
//!   so nothing waits for the peers at the end. Slots are double-buffered by phase parity: a
//!   slot is rewritten two phases later, after every peer has announced the phase that follows
//!   its reading.
//! - **Fused** (large). Entry phase (every slice is final), then device j sums chunk j of every
//!   slice and writes the sum into chunk j of every slice in the same pass (reduce-scatter and
//!   all-gather fused: 2·S bytes of traffic per device; streaming stores on request,
//!   [`STREAM_FROM_ENV`]); exit phase (no device moves on while a peer still writes into
//!   its slice). Chunks are whole cache lines, and only device j touches chunk j of any slice.
//!
//! Every value is summed in device order by exactly one kernel call, so every device ends
//! bit-identical; silent slices are left out of the sum, never scaled by 0. Phases are counted
//! per context by [`sync::PhaseFlags`], which also decides how to wait (spin, or yield the core
//! when the participating threads outnumber the cores).
#![allow(unsafe_code)]

mod kernel;
mod sync;

use crate::buffer::CpuBuffer;
use crate::pool::Pool;
use crate::stream::{CpuBackend, Job, StreamHandle};
use kernel::{Kernel, LINE};
use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{Mutex, RawRwLock};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use sync::PhaseFlags;
use tessera_core::comm::RawCommSlice;
use tessera_core::{Backend, Buffer};

/// Largest N·S (bytes over all slices) reduced one-shot. Above it, reading every peer's whole
/// slice costs more than the fused plan's second synchronisation.
const ONE_SHOT_BYTES: usize = 64 << 10;

/// Slice bytes per pool thread below which a device reduces its chunk on the stream thread
/// alone: waking the pool's parked workers costs microseconds.
const PAR_MIN_BYTES: usize = 512 << 10;

/// Environment variable: slice size in bytes from which the fused plan writes with streaming
/// (non-temporal) stores. Unset: never, because on the machines measured so far (AMD Zen 5, 32 MiB
/// L3) they were slower at every size up to 256 MiB: the bytes they push out of the cache are
/// the ones the next reduce, or the next op, reads.
pub const STREAM_FROM_ENV: &str = "TESSERA_CPU_COMM_STREAM_FROM";

/// The [`STREAM_FROM_ENV`] threshold, read once (unset or unparsable: never).
fn stream_from() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let v = tessera_core::settings::var_once(STREAM_FROM_ENV);
        let parsed = v.as_deref().map(|s| s.trim().parse::<usize>());
        if let Some(Err(_)) = parsed {
            tracing::warn!(value = ?v, "{STREAM_FROM_ENV} is not a byte count; ignored");
        }
        parsed.and_then(|r| r.ok()).unwrap_or(usize::MAX)
    })
}

/// Base address of one device's f32 slice (or staging slot).
#[derive(Clone, Copy)]
struct SlicePtr(*mut f32);
// SAFETY: the pointers target CPU buffers kept alive by `ReduceState::_buffers` (or the staging
// area owned by `Shared`); the phases order every access (see the module docs).
unsafe impl Send for SlicePtr {}
// SAFETY: as for Send.
unsafe impl Sync for SlicePtr {}

/// Double-buffered staging slots of the one-shot plan: `2 × n` slots of `per` values.
struct Staging {
    base: SlicePtr,
    per: usize,
    n: usize,
}

impl Staging {
    fn new(n: usize) -> Staging {
        // Whole cache lines per slot, so no two devices write one line.
        let per = (ONE_SHOT_BYTES / 4 / n.max(1)).div_ceil(LINE) * LINE;
        let area: Box<[f32]> = vec![0f32; 2 * n * per].into_boxed_slice();
        Staging {
            base: SlicePtr(Box::into_raw(area) as *mut f32),
            per,
            n,
        }
    }

    /// Device `j`'s slot for the reduce at `phase`.
    fn slot(&self, phase: u64, j: usize) -> *mut f32 {
        let parity = (phase % 2) as usize;
        self.base.0.wrapping_add((parity * self.n + j) * self.per)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let area = std::ptr::slice_from_raw_parts_mut(self.base.0, 2 * self.n * self.per);
        // SAFETY: made by `Box::into_raw` in `new` with this length; every reduce holding an
        // `Arc<Shared>` has finished, so no one uses the slots any more.
        drop(unsafe { Box::from_raw(area) });
    }
}

/// What the reductions of one context share.
struct Shared {
    flags: PhaseFlags,
    staging: Staging,
    kernel: Kernel,
    /// Slice bytes from which the fused plan uses streaming stores.
    stream_from: usize,
}

/// How one all-reduce runs (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    OneShot,
    Fused,
}

impl Plan {
    fn phases(self) -> u64 {
        match self {
            Plan::OneShot => 1,
            Plan::Fused => 2,
        }
    }
}

/// One all-reduce, shared by its participants.
pub(crate) struct ReduceState {
    shared: Arc<Shared>,
    plan: Plan,
    /// The first phase of this reduce.
    phase: u64,
    ptrs: Vec<SlicePtr>,
    contributes: Vec<bool>,
    len: usize,
    /// Set when the reduce could not be queued on every stream: waiters give up.
    cancelled: AtomicBool,
    _buffers: Vec<Arc<dyn Buffer>>,
    _guards: Vec<ArcRwLockReadGuard<RawRwLock, ()>>,
}

impl ReduceState {
    /// Device `j`'s chunk of the fused plan: whole cache lines (relative to the slice start), the
    /// last chunks possibly short or empty.
    fn chunk(&self, j: usize) -> (usize, usize) {
        let n = self.ptrs.len();
        let per = self.len.div_ceil(n).div_ceil(LINE) * LINE;
        let first = (j * per).min(self.len);
        (first, (first + per).min(self.len))
    }

    /// Sums values `a..b` of the contributing slices into values `a..b` of every slice.
    fn reduce_range(&self, a: usize, b: usize) {
        if a >= b {
            return;
        }
        let srcs: Vec<*const f32> = self
            .ptrs
            .iter()
            .zip(&self.contributes)
            .filter(|(_, c)| **c)
            .map(|(p, _)| p.0.wrapping_add(a) as *const f32)
            .collect();
        let dsts: Vec<*mut f32> = self.ptrs.iter().map(|p| p.0.wrapping_add(a)).collect();
        let streaming = self.len * 4 >= self.shared.stream_from;
        // SAFETY: values a..b lie in one fused chunk, which only this device touches between the
        // entry and exit phases; `comm_allreduce` checked that every slice lies inside its buffer
        // and that slices of different devices do not overlap (identical ranges included).
        unsafe { kernel::reduce(self.shared.kernel, &srcs, &dsts, b - a, streaming) };
    }
}

/// Device `j`'s part, run on its stream thread with its pool.
pub(crate) fn participate(pool: &Pool, st: &Arc<ReduceState>, j: usize) {
    let sh = &st.shared;
    match st.plan {
        Plan::OneShot => {
            let slot = sh.staging.slot(st.phase, j);
            if st.contributes[j] {
                // SAFETY: the slot holds `per >= len` values (plan chosen so) and is ours until
                // every peer has read it (module docs: parity); our slice is final (stream order).
                unsafe { std::ptr::copy_nonoverlapping(st.ptrs[j].0, slot, st.len) };
            }
            sh.flags.arrive(j, st.phase);
            if !sh.flags.wait_all(st.phase, &st.cancelled) {
                return;
            }
            let srcs: Vec<*const f32> = (0..st.ptrs.len())
                .filter(|&d| st.contributes[d])
                .map(|d| sh.staging.slot(st.phase, d) as *const f32)
                .collect();
            // SAFETY: every staged slot is final (its owner announced the phase after writing it)
            // and only read until the next phase; our own slice is written by us alone.
            unsafe { kernel::reduce(sh.kernel, &srcs, &[st.ptrs[j].0], st.len, false) };
        }
        Plan::Fused => {
            sh.flags.arrive(j, st.phase);
            if !sh.flags.wait_all(st.phase, &st.cancelled) {
                return;
            }
            let (c0, c1) = st.chunk(j);
            let threads = pool.n_threads().min((c1 - c0) * 4 / PAR_MIN_BYTES).max(1);
            if threads == 1 {
                st.reduce_range(c0, c1);
            } else {
                let state = st.clone();
                pool.run(Arc::new(move |ith, _| {
                    if ith < threads {
                        let per = (c1 - c0).div_ceil(threads).div_ceil(LINE) * LINE;
                        let a = (c0 + ith * per).min(c1);
                        state.reduce_range(a, (a + per).min(c1));
                    }
                }));
            }
            sh.flags.arrive(j, st.phase + 1);
            // Every device reached the entry phase, so none can cancel any more.
            sh.flags.wait_all(st.phase + 1, &st.cancelled);
        }
    }
}

/// The comm context: one stream handle per device, the shared phase state, and the next phase
/// number (under a lock, so each reduce is queued on every stream before the next one).
struct CpuComm {
    streams: Vec<StreamHandle>,
    shared: Arc<Shared>,
    last_phase: Mutex<u64>,
}

unsafe extern "C" fn comm_init(streams: *const *mut c_void, n: usize) -> *mut c_void {
    let made = catch_unwind(AssertUnwindSafe(|| {
        if streams.is_null() || n == 0 {
            return std::ptr::null_mut();
        }
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: the caller passes `n` valid `*mut Box<dyn Backend>` (comm ABI contract).
            let p = unsafe { *streams.add(i) } as *mut Box<dyn Backend>;
            if p.is_null() {
                return std::ptr::null_mut();
            }
            // SAFETY: as above; borrowed only for this call.
            let backend = unsafe { &mut *p };
            match backend
                .as_any_mut()
                .downcast_mut::<CpuBackend>()
                .and_then(|c| c.handle())
            {
                Some(h) => handles.push(h),
                None => return std::ptr::null_mut(), // not all CPU streams: decline
            }
        }
        let threads: usize = handles.iter().map(|h| h.n_threads()).sum();
        let cores = crate::sys::allowed_cores().len();
        let oversubscribed = threads > cores;
        let stream_from = stream_from();
        let shared = Arc::new(Shared {
            flags: PhaseFlags::new(n, oversubscribed),
            staging: Staging::new(n),
            kernel: Kernel::best(),
            stream_from,
        });
        tracing::debug!(
            devices = n,
            threads,
            cores,
            oversubscribed,
            stream_from,
            kernel = ?shared.kernel,
            "CPU shared-memory comm ready"
        );
        Box::into_raw(Box::new(CpuComm {
            streams: handles,
            shared,
            last_phase: Mutex::new(0),
        })) as *mut c_void
    }));
    made.unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn comm_allreduce(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
) -> i32 {
    let rc = catch_unwind(AssertUnwindSafe(|| {
        if ctx.is_null() || slices.is_null() {
            return -1;
        }
        // SAFETY: `ctx` came from `comm_init` and has not been freed (ABI contract).
        let comm = unsafe { &*(ctx as *const CpuComm) };
        if n != comm.streams.len() {
            return -1;
        }
        // SAFETY: the caller passes `n` slices valid for the call.
        let raw = unsafe { std::slice::from_raw_parts(slices, n) };
        let mut buffers: Vec<Arc<dyn Buffer>> = Vec::with_capacity(n);
        let mut ptrs = Vec::with_capacity(n);
        let len = raw[0].len;
        for s in raw {
            if s.buffer.is_null() || s.len != len {
                return -1;
            }
            // SAFETY: `buffer` is a `*const Arc<dyn Buffer>` valid for the call (ABI contract).
            let buf: Arc<dyn Buffer> = unsafe { &*(s.buffer as *const Arc<dyn Buffer>) }.clone();
            let Some(cpu) = buf.as_any().downcast_ref::<CpuBuffer>() else {
                return 1;
            };
            if s.offset % 4 != 0 {
                return 1; // unaligned f32 data: let the generic path handle it
            }
            if !cpu.writable()
                || len
                    .checked_mul(4)
                    .and_then(|bytes| s.offset.checked_add(bytes))
                    .is_none_or(|end| end > cpu.size())
            {
                return -1;
            }
            ptrs.push(SlicePtr(cpu.base_ptr().wrapping_add(s.offset) as *mut f32));
            buffers.push(buf);
        }
        if len == 0 {
            return 0;
        }
        // Distinct devices' slices must not overlap: each device writes its chunk of every
        // slice (or its whole slice) without the others, so shared bytes would race. The generic
        // path, built from ordered copies and ADD graphs, handles such a call.
        for a in 0..n {
            for b in a + 1..n {
                let (pa, pb) = (ptrs[a].0 as usize, ptrs[b].0 as usize);
                if pa < pb + len * 4 && pb < pa + len * 4 {
                    return 1;
                }
            }
        }
        let mut guards = Vec::new();
        for (i, b) in buffers.iter().enumerate() {
            if !buffers[..i].iter().any(|o| Arc::ptr_eq(o, b))
                && let Some(cpu) = b.as_any().downcast_ref::<CpuBuffer>()
            {
                guards.push(cpu.access.read_arc());
            }
        }
        let plan = if len <= comm.shared.staging.per && len * 4 * n <= ONE_SHOT_BYTES {
            Plan::OneShot
        } else {
            Plan::Fused
        };
        let mut last_phase = comm.last_phase.lock();
        let state = Arc::new(ReduceState {
            shared: comm.shared.clone(),
            plan,
            phase: *last_phase + 1,
            ptrs,
            contributes: raw.iter().map(|s| s.contributes != 0).collect(),
            len,
            cancelled: AtomicBool::new(false),
            _buffers: buffers,
            _guards: guards,
        });
        *last_phase += plan.phases();
        for (j, h) in comm.streams.iter().enumerate() {
            let part = state.clone();
            let work = Box::new(move |pool: &Pool| participate(pool, &part, j));
            if h.enqueue(Job::Pooled(work)).is_err() {
                // A stopped stream cannot take its part (streams stop only when dropped): release
                // the devices already waiting for it. None of them has touched a slice yet.
                state.cancelled.store(true, Ordering::SeqCst);
                comm.shared.flags.wake_all();
                return -3;
            }
        }
        0
    }));
    rc.unwrap_or(-2)
}

unsafe extern "C" fn comm_free(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: `ctx` came from `comm_init` and is freed once (ABI contract).
        drop(unsafe { Box::from_raw(ctx as *mut CpuComm) });
    }
}

/// The CPU comm function registered under `name`, if any.
pub(crate) fn proc_address(name: &str) -> Option<tessera_core::ProcAddress> {
    tessera_core::comm::comm_proc_address(name, comm_init, comm_allreduce, comm_free)
}
