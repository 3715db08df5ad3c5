//! The comm trio (`tessera_comm_init` / `tessera_comm_allreduce_tensor` / `tessera_comm_free`,
//! see `tessera_core::comm`) over an NCCL-API library
//! ([`RegistryDriver::load_collectives`]: NCCL for CUDA, RCCL for HIP), one communicator per GPU
//! from `ncclCommInitAll` in this process.
//!
//! - Wire: f32 below the element thresholds of ggml-cuda ([`f32_wire`]), else bf16 with
//!   round-to-nearest-even conversion kernels around the reduction.
//! - Slices that do not contribute are zeroed first; zero-length reductions are done at once.
//! - Declines (nothing enqueued, the generic all-reduce runs), with the reason logged: the
//!   driver's `ALLREDUCE_ENV` set to `none`, a stream of another backend, the library not
//!   loadable, two logical devices on one GPU (one rank per GPU), `ncclCommInitAll` failing, or
//!   a slice that is not 4-byte aligned memory of its stream's GPU.
#![allow(unsafe_code)]

use crate::buffer::GpuBuffer;
use crate::driver::Driver;
use crate::inflight::InFlight;
use crate::runtime::Kernels;
use crate::runtime::RegistryDriver;
use crate::stream::GpuStream;
use crate::sys::nccl::{NCCL_BFLOAT16, NCCL_FLOAT32, Nccl, NcclComm, UNIQUE_ID_BYTES, UniqueId};
use std::ffi::c_void;
use std::sync::Arc;
use tessera_core::comm::{
    CommCall, RawCommSlice, comm_allreduce_with, comm_free_with, comm_init_with,
};
use tessera_core::{Backend, Buffer, ProcAddress, Result};
use tessera_kernels::gpu::launch::{Arg, Launch};

/// Whether `n_elements` values over `n_devices` GPUs go over the wire as f32 (else bf16): the
/// thresholds ggml-cuda tuned on PCIe 4.0.
pub fn f32_wire(n_devices: usize, n_elements: usize) -> bool {
    match n_devices {
        0..=2 => n_elements < 32768,
        3 => n_elements < 131_072,
        _ => n_elements < 262_144,
    }
}

/// The comm trio's addresses by name, for driver `D`, and the two functions of a comm across
/// processes ([`tessera_core::comm::COMM_UNIQUE_ID`], [`tessera_core::comm::COMM_INIT_RANKS`]).
pub fn proc_address<D: RegistryDriver>(name: &str) -> Option<ProcAddress> {
    use tessera_core::comm::{COMM_INIT_RANKS, COMM_UNIQUE_ID, CommInitRanksFn, CommUniqueIdFn};
    match name {
        COMM_UNIQUE_ID => {
            let f: CommUniqueIdFn = comm_unique_id::<D>;
            return Some(ProcAddress::new(f as *const c_void));
        }
        COMM_INIT_RANKS => {
            let f: CommInitRanksFn = comm_init_ranks::<D>;
            return Some(ProcAddress::new(f as *const c_void));
        }
        _ => {}
    }
    tessera_core::comm::comm_proc_address(name, comm_init::<D>, comm_allreduce::<D>, comm_free::<D>)
}

/// One stream of a comm: its GPU, driver stream and kernels, and a device scratch for the bf16
/// wire, grown as needed.
pub(crate) struct Member<D: Driver> {
    pub(crate) ordinal: usize,
    pub(crate) gpu: Arc<D::Gpu>,
    pub(crate) stream: Arc<D::Stream>,
    pub(crate) kernels: Arc<Kernels<D>>,
    pub(crate) scratch: Option<D::Mem>,
}

impl<D: Driver> Member<D> {
    /// The member for `backend`, if it is a [`GpuStream<D>`].
    pub(crate) fn of(backend: &mut Box<dyn Backend>) -> Option<Member<D>> {
        let s = backend.as_any_mut().downcast_mut::<GpuStream<D>>()?;
        Some(Member {
            ordinal: s.gpu_ordinal(),
            gpu: s.context().gpu().clone(),
            stream: s.driver_stream().clone(),
            kernels: s.context().kernels().clone(),
            scratch: None,
        })
    }
}

struct CommCtx<D: Driver> {
    members: Vec<Member<D>>,
    /// Devices in the sum: the members, or every rank's devices for a comm across processes
    /// (the wire choice depends on it and must be the same on every rank).
    n_ranks: usize,
    nccl: Arc<Nccl>,
    comms: Vec<NcclComm>,
    inflight: InFlight<Vec<D::Event>>,
}

unsafe extern "C" fn comm_init<D: RegistryDriver>(
    streams: *const *mut c_void,
    n: usize,
) -> *mut c_void {
    // SAFETY: forwarded from the comm ABI's contract for this function.
    unsafe { comm_init_with(streams, n, init::<D>) }
}

fn decline<T>(backend: &str, reason: &str) -> Option<T> {
    decline_as("vendor", backend, reason)
}

/// Logs why the `what` all-reduce declined a comm (the generic all-reduce runs instead).
pub(crate) fn decline_as<T>(what: &str, backend: &str, reason: &str) -> Option<T> {
    tracing::info!(
        backend,
        reason,
        "{what} all-reduce declined; the generic all-reduce runs"
    );
    None
}

/// The members of a comm over `streams` (each a [`GpuStream<D>`] of its own GPU), or why not.
fn members_of<D: RegistryDriver>(
    streams: Vec<&mut Box<dyn Backend>>,
) -> std::result::Result<Vec<Member<D>>, &'static str> {
    let mut members = Vec::with_capacity(streams.len());
    for backend in streams {
        members.push(Member::of(backend).ok_or("a stream is of another backend")?);
    }
    let mut ordinals: Vec<usize> = members.iter().map(|m| m.ordinal).collect();
    ordinals.sort_unstable();
    if ordinals.windows(2).any(|w| w[0] == w[1]) {
        return Err("two logical devices share a GPU (one rank per GPU)");
    }
    Ok(members)
}

unsafe extern "C" fn comm_unique_id<D: RegistryDriver>(out: *mut u8, len: usize) -> i32 {
    if out.is_null() || len != UNIQUE_ID_BYTES {
        return -2;
    }
    let made = std::panic::catch_unwind(|| D::load_collectives().and_then(|n| n.unique_id()));
    match made {
        Ok(Ok(id)) => {
            // SAFETY: the caller's contract: `out` has room for `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(id.0.as_ptr(), out, len) };
            0
        }
        Ok(Err(e)) => {
            tracing::info!(backend = D::NAME, error = %e, "no job id for a comm across processes");
            -1
        }
        Err(_) => -3,
    }
}

unsafe extern "C" fn comm_init_ranks<D: RegistryDriver>(
    streams: *const *mut c_void,
    n: usize,
    id: *const u8,
    id_len: usize,
    n_ranks: usize,
    first_rank: usize,
) -> *mut c_void {
    if id.is_null() || id_len != UNIQUE_ID_BYTES {
        return std::ptr::null_mut();
    }
    let mut uid = UniqueId([0; UNIQUE_ID_BYTES]);
    // SAFETY: the caller's contract: `id` points to `id_len` readable bytes.
    unsafe { std::ptr::copy_nonoverlapping(id, uid.0.as_mut_ptr(), id_len) };
    // SAFETY: forwarded from the comm ABI's contract for this function.
    unsafe { comm_init_with(streams, n, |s| init_ranks::<D>(s, uid, n_ranks, first_rank)) }
}

/// A comm whose members are global ranks `first_rank..` of `n_ranks` in job `id`.
fn init_ranks<D: RegistryDriver>(
    streams: Vec<&mut Box<dyn Backend>>,
    id: UniqueId,
    n_ranks: usize,
    first_rank: usize,
) -> Option<CommCtx<D>> {
    if tessera_core::settings::var(D::ALLREDUCE_ENV).is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return decline(D::NAME, &format!("{}=none", D::ALLREDUCE_ENV));
    }
    let members = match members_of::<D>(streams) {
        Ok(m) => m,
        Err(why) => return decline(D::NAME, why),
    };
    let nccl = match D::load_collectives() {
        Ok(n) => Arc::new(n),
        Err(e) => return decline(D::NAME, &e.to_string()),
    };
    let comms = nccl.group(|| {
        members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                D::bind_gpu(&m.gpu)?;
                nccl.init_rank(n_ranks, id, first_rank + i)
            })
            .collect::<Result<Vec<_>>>()
    });
    let comms = match comms {
        Ok(c) => c,
        Err(e) => return decline(D::NAME, &e.to_string()),
    };
    tracing::debug!(
        backend = D::NAME,
        ranks = n_ranks,
        first_rank,
        local = members.len(),
        "all-reduce across processes ready"
    );
    Some(CommCtx {
        members,
        n_ranks,
        nccl,
        comms,
        inflight: InFlight::new(),
    })
}

fn init<D: RegistryDriver>(streams: Vec<&mut Box<dyn Backend>>) -> Option<CommCtx<D>> {
    if tessera_core::settings::var(D::ALLREDUCE_ENV).is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return decline(D::NAME, &format!("{}=none", D::ALLREDUCE_ENV));
    }
    if streams.len() < 2 {
        return None;
    }
    let members = match members_of::<D>(streams) {
        Ok(m) => m,
        Err(why) => return decline(D::NAME, why),
    };
    let nccl = match D::load_collectives() {
        Ok(n) => Arc::new(n),
        Err(e) => return decline(D::NAME, &e.to_string()),
    };
    let devs: Vec<i32> = members.iter().map(|m| m.ordinal as i32).collect();
    let comms = match nccl.init_all(&devs) {
        Ok(c) => c,
        Err(e) => return decline(D::NAME, &e.to_string()),
    };
    tracing::debug!(backend = D::NAME, path = %nccl.path().display(), ranks = devs.len(), "all-reduce ready");
    Some(CommCtx {
        n_ranks: members.len(),
        members,
        nccl,
        comms,
        inflight: InFlight::new(),
    })
}

unsafe extern "C" fn comm_allreduce<D: RegistryDriver>(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
) -> i32 {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init::<D>`.
    unsafe { comm_allreduce_with(ctx, slices, n, allreduce::<D>) }
}

/// A validated slice of one member: its buffer (kept alive while queued), the device address of
/// its first value, that address's offset in the buffer, and whether it contributes.
#[derive(Debug)]
pub struct Slot {
    /// The buffer holding the slice.
    pub buffer: Arc<dyn Buffer>,
    /// Device address of the slice.
    pub ptr: u64,
    /// Offset of the slice in the buffer, in bytes.
    pub offset: usize,
    /// Whether the slice's values count (else it is zeroed first).
    pub contributes: bool,
}

/// Validates one all-reduce call (one slice per member, in member order) for driver `D`: every
/// slice holds the same number of f32 values in a [`GpuBuffer<D>`], 4-byte aligned and in range,
/// whose GPU `usable(member, gpu)` accepts. Returns that count and the slots, or the status the
/// comm trio returns instead: `-2` when the slice count is not the member count, `1` (declined:
/// the generic all-reduce runs) for any other mismatch.
///
/// # Errors
/// The status, as above.
pub fn validate_slices<D: Driver, M>(
    calls: Vec<CommCall>,
    members: &[M],
    usable: impl Fn(&M, &D::Gpu) -> bool,
) -> std::result::Result<(usize, Vec<Slot>), i32> {
    if calls.len() != members.len() {
        return Err(-2);
    }
    let len = calls.first().map_or(0, |s| s.len);
    let mut slots = Vec::with_capacity(calls.len());
    for (s, m) in calls.into_iter().zip(members) {
        let buffer = s.buffer.filter(|_| s.len == len).ok_or(1)?;
        let gb = buffer.as_any().downcast_ref::<GpuBuffer<D>>().ok_or(1)?;
        let in_range = s
            .offset
            .checked_add(len * 4)
            .is_some_and(|end| end <= D::mem_size(&gb.mem));
        if !usable(m, D::mem_gpu(&gb.mem)) || s.offset % 4 != 0 || !in_range {
            return Err(1);
        }
        let ptr = gb.ptr() + s.offset as u64;
        slots.push(Slot {
            buffer,
            ptr,
            offset: s.offset,
            contributes: s.contributes,
        });
    }
    Ok((len, slots))
}

fn allreduce<D: RegistryDriver>(ctx: &mut CommCtx<D>, calls: Vec<CommCall>) -> Result<i32> {
    let result = allreduce_queued(ctx, calls);
    if result.is_err() {
        drain::<D>(ctx.members.iter().map(|m| &m.stream));
    }
    result
}

fn allreduce_queued<D: RegistryDriver>(ctx: &mut CommCtx<D>, calls: Vec<CommCall>) -> Result<i32> {
    let usable = |m: &Member<D>, gpu: &D::Gpu| D::ordinal(gpu) == m.ordinal;
    let (len, slots) = match validate_slices::<D, _>(calls, &ctx.members, usable) {
        Ok(v) => v,
        Err(status) => return Ok(status),
    };
    if len == 0 {
        return Ok(0);
    }
    let f32_path = f32_wire(ctx.n_ranks, len);
    if !f32_path {
        for m in ctx.members.iter_mut() {
            if m.scratch.as_ref().is_none_or(|s| D::mem_size(s) < len * 2) {
                D::stream_sync(&m.stream)?;
                m.scratch = Some(D::alloc(D::stream_gpu(&m.stream), len * 2)?);
            }
        }
    }
    // Per member: the address the library reduces in place, after zeroing or converting into it.
    let mut targets = Vec::with_capacity(slots.len());
    for (slot, m) in slots.iter().zip(&ctx.members) {
        let target = match (&m.scratch, f32_path) {
            (Some(s), false) => {
                if slot.contributes {
                    m.convert("k_f32_to_bf16", D::mem_ptr(s), slot.ptr, len)?;
                } else {
                    D::memset_async(&m.stream, s, 0, len * 2, 0)?;
                }
                D::mem_ptr(s)
            }
            _ => {
                let gb = slot.buffer.as_any().downcast_ref::<GpuBuffer<D>>();
                if let (false, Some(gb)) = (slot.contributes, gb) {
                    D::memset_async(&m.stream, &gb.mem, slot.offset, len * 4, 0)?;
                }
                slot.ptr
            }
        };
        targets.push(target);
    }
    let dtype = if f32_path {
        NCCL_FLOAT32
    } else {
        NCCL_BFLOAT16
    };
    ctx.nccl.group(|| {
        for ((target, m), comm) in targets.iter().zip(&ctx.members).zip(&ctx.comms) {
            // SAFETY: `target` addresses `len` values of `dtype` in live memory of this member's
            // GPU (a validated slice, or the member's scratch grown above), kept alive in
            // `inflight` / the context until the stream passes.
            unsafe { comm.all_reduce_in_place(*target, len, dtype, D::stream_raw(&m.stream))? };
        }
        Ok(())
    })?;
    if !f32_path {
        for (slot, (m, target)) in slots.iter().zip(ctx.members.iter().zip(&targets)) {
            m.convert("k_bf16_to_f32", slot.ptr, *target, len)?;
        }
    }
    // Keep the slices' buffers until every member's stream has passed the reduction.
    hold_until_passed(&mut ctx.inflight, &ctx.members, slots)?;
    Ok(0)
}

impl<D: Driver> Member<D> {
    /// Queues `kernel` (`k_f32_to_bf16` / `k_bf16_to_f32`) converting `len` values from `src` to
    /// `dst` (device addresses of this member's GPU) on its stream.
    ///
    /// # Errors
    /// The kernel's load or the launch's status.
    pub(crate) fn convert(
        &self,
        kernel: &'static str,
        dst: u64,
        src: u64,
        len: usize,
    ) -> Result<()> {
        let launch = Launch {
            kernel,
            grid: (len.div_ceil(256).clamp(1, 1 << 20) as u32, 1, 1),
            block: 256,
            args: vec![Arg::Ptr(dst), Arg::Ptr(src), Arg::I64(len as i64)],
        };
        let f = self.kernels.for_launch(&launch)?;
        // SAFETY: (dst, src, n) matches `k_f32_to_bf16` / `k_bf16_to_f32`; the callers pass
        // addresses spanning `len` values of live memory of this member's GPU (a validated slice
        // and the member's scratch), kept alive until the stream passes.
        unsafe { D::launch(&self.stream, &f, &launch) }
    }
}

/// Keeps the buffers of `slots` in `inflight` until every member's stream has passed the work
/// queued so far.
///
/// # Errors
/// The driver's status recording the events.
pub(crate) fn hold_until_passed<D: Driver>(
    inflight: &mut InFlight<Vec<D::Event>>,
    members: &[Member<D>],
    slots: Vec<Slot>,
) -> Result<()> {
    inflight.hold(
        slots.into_iter().map(|s| s.buffer).collect(),
        |evs: &Vec<D::Event>| evs.iter().all(D::event_query),
        || members.iter().map(|m| D::event_record(&m.stream)).collect(),
    )
}

/// Waits for every one of `streams`, logging failures: before a comm is freed, and when an
/// all-reduce fails after queuing work (the caller may drop its slices once we return).
pub(crate) fn drain<'a, D: Driver + 'a>(streams: impl IntoIterator<Item = &'a Arc<D::Stream>>) {
    for s in streams {
        if let Err(e) = D::stream_sync(s) {
            tracing::warn!(backend = D::NAME, error = %e, "stream failed while draining the comm");
        }
    }
}

unsafe extern "C" fn comm_free<D: RegistryDriver>(ctx: *mut c_void) {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init::<D>`.
    unsafe {
        comm_free_with(ctx, |ctx: Box<CommCtx<D>>| {
            drain::<D>(ctx.members.iter().map(|m| &m.stream));
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_thresholds_follow_ggml() {
        assert!(f32_wire(2, 32767) && !f32_wire(2, 32768));
        assert!(f32_wire(3, 131_071) && !f32_wire(3, 131_072));
        assert!(f32_wire(8, 262_143) && !f32_wire(4, 262_144));
    }
}
