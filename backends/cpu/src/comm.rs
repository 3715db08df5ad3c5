//! The CPU comm: an in-place all-reduce between CPU devices of one process, over shared memory,
//! performed by the devices' own stream threads and pools. Exported as the comm trio
//! (`tessera_comm_init` / `tessera_comm_allreduce_tensor` / `tessera_comm_free`) through the
//! registry's `proc_address`.
//!
//! Each participant runs one queued job: a barrier (every device's earlier work is done), a
//! reduce-scatter (device j sums chunk j of every contributing slice, in device order, into its
//! own slice), a barrier, an all-gather (device j copies every other chunk from its owner), and a
//! final barrier (no device moves on while a peer still reads its chunk). Each value is summed
//! once, so every device ends bit-identical; silent slices are skipped, never scaled by 0.
#![allow(unsafe_code)]

use crate::buffer::CpuBuffer;
use crate::pool::{Barrier, Pool};
use crate::stream::{CpuBackend, Job, StreamHandle};
use parking_lot::RawRwLock;
use parking_lot::lock_api::ArcRwLockReadGuard;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use tessera_core::plugin::RawCommSlice;
use tessera_core::{Backend, Buffer};

/// Values a thread sums per step (keeps the accumulator in L1).
const STEP: usize = 2048;

/// Base address of one device's f32 slice.
#[derive(Clone, Copy)]
struct SlicePtr(*mut f32);
// SAFETY: the pointers target CPU buffers kept alive by `ReduceState::_buffers`; the barriers
// order every access (see the module docs), so sharing them between threads is sound.
unsafe impl Send for SlicePtr {}
// SAFETY: as for Send.
unsafe impl Sync for SlicePtr {}

/// One all-reduce, shared by its participants.
pub(crate) struct ReduceState {
    ptrs: Vec<SlicePtr>,
    contributes: Vec<bool>,
    len: usize,
    barrier: Barrier,
    _buffers: Vec<Arc<dyn Buffer>>,
    _guards: Vec<ArcRwLockReadGuard<RawRwLock, ()>>,
}

impl ReduceState {
    fn chunk(&self, j: usize) -> (usize, usize) {
        let n = self.ptrs.len();
        let per = self.len.div_ceil(n);
        let first = (j * per).min(self.len);
        (first, (first + per).min(self.len))
    }
}

/// Device `j`'s part, run on its stream thread with its pool.
pub(crate) fn participate(pool: &Pool, st: &Arc<ReduceState>, j: usize) {
    st.barrier.wait();
    let (c0, c1) = st.chunk(j);
    let state = st.clone();
    pool.run(Arc::new(move |ith, nth| {
        let span = (c1 - c0).div_ceil(nth.max(1));
        let (a, b) = ((c0 + ith * span).min(c1), (c0 + (ith + 1) * span).min(c1));
        let mut acc = [0f32; STEP];
        let mut i = a;
        while i < b {
            let n = STEP.min(b - i);
            let acc = &mut acc[..n];
            acc.fill(0.0);
            for (d, p) in state.ptrs.iter().enumerate() {
                if !state.contributes[d] {
                    continue;
                }
                // SAFETY: values i..i+n lie in chunk j of slice d; during the reduce-scatter only
                // device j touches chunk j (it reads every slice's chunk j, writes only its own).
                let src = unsafe { std::slice::from_raw_parts(p.0.add(i), n) };
                acc.iter_mut().zip(src).for_each(|(x, y)| *x += y);
            }
            // SAFETY: chunk j of device j's own slice; the shared borrow above has ended.
            let dst = unsafe { std::slice::from_raw_parts_mut(state.ptrs[j].0.add(i), n) };
            dst.copy_from_slice(acc);
            i += n;
        }
    }));
    st.barrier.wait();
    let state = st.clone();
    pool.run(Arc::new(move |ith, nth| {
        for d in (0..state.ptrs.len()).filter(|&d| d != j) {
            let (a, b) = state.chunk(d);
            let span = (b - a).div_ceil(nth.max(1));
            let (s, e) = ((a + ith * span).min(b), (a + (ith + 1) * span).min(b));
            if s < e {
                // SAFETY: chunk d of slice d is final (reduced before the barrier) and only read now;
                // chunk d of our slice is written by us alone during the all-gather.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        state.ptrs[d].0.add(s),
                        state.ptrs[j].0.add(s),
                        e - s,
                    )
                };
            }
        }
    }));
    st.barrier.wait();
}

/// The comm context: one stream handle per device.
struct CpuComm {
    streams: Vec<StreamHandle>,
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
        tracing::debug!(devices = n, "CPU shared-memory comm ready");
        Box::into_raw(Box::new(CpuComm { streams: handles })) as *mut c_void
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
                || s.offset
                    .checked_add(len * 4)
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
        let mut guards = Vec::new();
        for (i, b) in buffers.iter().enumerate() {
            if !buffers[..i].iter().any(|o| Arc::ptr_eq(o, b))
                && let Some(cpu) = b.as_any().downcast_ref::<CpuBuffer>()
            {
                guards.push(cpu.access.read_arc());
            }
        }
        let state = Arc::new(ReduceState {
            ptrs,
            contributes: raw.iter().map(|s| s.contributes != 0).collect(),
            len,
            barrier: Barrier::new(n),
            _buffers: buffers,
            _guards: guards,
        });
        for (j, h) in comm.streams.iter().enumerate() {
            if h.enqueue(Job::Reduce(state.clone(), j)).is_err() {
                // A stopped stream cannot take its part: the others would wait forever, so this
                // only happens before any job is queued (streams stop only when dropped).
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
    let f: *const c_void = match name {
        tessera_core::plugin::COMM_INIT => comm_init as *const c_void,
        tessera_core::plugin::COMM_ALLREDUCE => comm_allreduce as *const c_void,
        tessera_core::plugin::COMM_FREE => comm_free as *const c_void,
        _ => return None,
    };
    Some(tessera_core::ProcAddress::new(f))
}
