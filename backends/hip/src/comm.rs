//! The comm trio through RCCL (`tessera_comm_init` / `tessera_comm_allreduce_tensor` /
//! `tessera_comm_free`, see `tessera_core::plugin`): RCCL exports the NCCL C API, so this uses
//! the CUDA backend's NCCL function table loaded from `librccl.so.1`, one communicator per GPU.
//!
//! - Wire: the CUDA backend's policy ([`tessera_cuda::f32_wire`]): f32 below the element
//!   thresholds, else bf16 with round-to-nearest-even conversion kernels around the reduction.
//! - Declines (the generic all-reduce runs), with the reason logged:
//!   `TESSERA_HIP_ALLREDUCE=none`, a stream that is not HIP, RCCL not loadable (Debian 12 has no
//!   RCCL package), two logical devices on one GPU, or `ncclCommInitAll` failing.
#![allow(unsafe_code)]

use crate::compile::Kernels;
use crate::device::HipBuffer;
use crate::stream::HipBackend;
use crate::sys::{DeviceMem, RawEvent, Stream, launch};
use std::ffi::c_void;
use std::sync::Arc;
use tessera_core::plugin::{
    CommCall, RawCommSlice, comm_allreduce_with, comm_free_with, comm_init_with,
};
use tessera_core::{Backend, Buffer, ProcAddress, Result};
use tessera_cuda::f32_wire;
use tessera_cuda::nccl::{NCCL_BFLOAT16, NCCL_FLOAT32, Nccl, NcclComm};
use tessera_kernels::cuda::host::InFlight;
use tessera_kernels::cuda::plan::ArgSlots;

/// Environment variable choosing the all-reduce path: `rccl` (default) or `none` (always the
/// generic fallback).
pub const ALLREDUCE_ENV: &str = "TESSERA_HIP_ALLREDUCE";
/// Environment variable naming the RCCL library (or its directory).
pub const RCCL_PATH_ENV: &str = "TESSERA_RCCL_PATH";

/// The comm trio's addresses by name.
pub(crate) fn proc_address(name: &str) -> Option<ProcAddress> {
    tessera_core::plugin::comm_proc_address(name, comm_init, comm_allreduce, comm_free)
}

/// Loads RCCL: [`RCCL_PATH_ENV`], `librccl.so.1` / `librccl.so` on the loader's path, then
/// `/opt/rocm/lib`.
///
/// # Errors
/// [`tessera_core::Error::Unavailable`] saying what was tried.
pub fn load_rccl() -> Result<Nccl> {
    Nccl::load_named("hip", RCCL_PATH_ENV, &["librccl.so.1", "librccl.so"], &[]).or_else(|e| {
        Nccl::load_from(std::path::Path::new("/opt/rocm/lib/librccl.so.1")).map_err(|_| e)
    })
}

struct Member {
    ordinal: usize,
    stream: Arc<Stream>,
    kernels: Arc<Kernels>,
    scratch: Option<DeviceMem>,
}

struct CommCtx {
    members: Vec<Member>,
    rccl: Arc<Nccl>,
    comms: Vec<NcclComm>,
    inflight: InFlight<Vec<RawEvent>>,
}

unsafe extern "C" fn comm_init(streams: *const *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: forwarded from the comm ABI's contract for this function.
    unsafe { comm_init_with(streams, n, init) }
}

fn decline(reason: &str) -> Option<CommCtx> {
    tracing::info!(
        reason,
        "HIP all-reduce: RCCL path declined; the generic all-reduce runs"
    );
    None
}

fn init(streams: Vec<&mut Box<dyn Backend>>) -> Option<CommCtx> {
    if std::env::var(ALLREDUCE_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("none")) {
        return decline("TESSERA_HIP_ALLREDUCE=none");
    }
    if streams.len() < 2 {
        return None;
    }
    let mut members = Vec::with_capacity(streams.len());
    for backend in streams {
        let Some(hip) = backend.as_any_mut().downcast_mut::<HipBackend>() else {
            return decline("a stream is not a HIP stream");
        };
        let kernels = match hip.shared.kernels() {
            Ok(k) => k,
            Err(e) => return decline(&e.to_string()),
        };
        members.push(Member {
            ordinal: hip.gpu_ordinal(),
            stream: hip.stream.clone(),
            kernels,
            scratch: None,
        });
    }
    let mut ordinals: Vec<usize> = members.iter().map(|m| m.ordinal).collect();
    ordinals.sort_unstable();
    if ordinals.windows(2).any(|w| w[0] == w[1]) {
        return decline("two logical devices share a GPU (RCCL needs one rank per GPU)");
    }
    let rccl = match load_rccl() {
        Ok(r) => Arc::new(r),
        Err(e) => return decline(&e.to_string()),
    };
    let devs: Vec<i32> = members.iter().map(|m| m.ordinal as i32).collect();
    let comms = match rccl.init_all(&devs) {
        Ok(c) => c,
        Err(e) => return decline(&e.to_string()),
    };
    tracing::debug!(path = %rccl.path().display(), ranks = devs.len(), "RCCL all-reduce ready");
    Some(CommCtx {
        members,
        rccl,
        comms,
        inflight: InFlight::new(),
    })
}

unsafe extern "C" fn comm_allreduce(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
) -> i32 {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init` (a CommCtx).
    unsafe { comm_allreduce_with(ctx, slices, n, allreduce) }
}

/// A validated slice: its buffer (kept alive while queued), device address, and the buffer
/// offset of that address.
struct Slot {
    buffer: Arc<dyn Buffer>,
    ptr: u64,
    offset: usize,
    contributes: bool,
}

fn allreduce(ctx: &mut CommCtx, calls: Vec<CommCall>) -> Result<i32> {
    if calls.len() != ctx.members.len() {
        return Ok(-2);
    }
    let len = calls.first().map_or(0, |s| s.len);
    let mut slots = Vec::with_capacity(calls.len());
    for (s, m) in calls.into_iter().zip(&ctx.members) {
        let Some(buffer) = s.buffer.filter(|_| s.len == len) else {
            return Ok(1);
        };
        let Some(hb) = buffer.as_any().downcast_ref::<HipBuffer>() else {
            return Ok(1);
        };
        let in_range = s
            .offset
            .checked_add(len * 4)
            .is_some_and(|end| end <= hb.mem.size());
        if hb.gpu_ordinal() != m.ordinal || s.offset % 4 != 0 || !in_range {
            return Ok(1);
        }
        let ptr = hb.mem.ptr() + s.offset as u64;
        slots.push(Slot {
            buffer,
            ptr,
            offset: s.offset,
            contributes: s.contributes,
        });
    }
    if len == 0 {
        return Ok(0);
    }
    let f32_path = f32_wire(ctx.members.len(), len);
    if !f32_path {
        for m in ctx.members.iter_mut() {
            if m.scratch.as_ref().is_none_or(|s| s.size() < len * 2) {
                m.stream.synchronize()?;
                m.scratch = Some(DeviceMem::alloc(m.stream.gpu(), len * 2)?);
            }
        }
    }
    // Per member: the address RCCL reduces in place, after zeroing or converting into it.
    let mut targets = Vec::with_capacity(slots.len());
    for (slot, m) in slots.iter().zip(&ctx.members) {
        let hb = slot.buffer.as_any().downcast_ref::<HipBuffer>();
        let target = match (&m.scratch, f32_path) {
            (Some(s), false) => {
                if slot.contributes {
                    convert(m, "k_f32_to_bf16", s.ptr(), slot.ptr, len)?;
                } else {
                    m.stream.memset(s, 0, len * 2, 0)?;
                }
                s.ptr()
            }
            _ => {
                if let (false, Some(hb)) = (slot.contributes, hb) {
                    m.stream.memset(&hb.mem, slot.offset, len * 4, 0)?;
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
    ctx.rccl.group(|| {
        for ((target, m), comm) in targets.iter().zip(&ctx.members).zip(&ctx.comms) {
            // SAFETY: `target` addresses `len` values of `dtype` in live memory of this member's
            // GPU (a validated slice, or the member's scratch grown above), kept alive in
            // `inflight` / the context until the stream passes.
            unsafe { comm.all_reduce_in_place(*target, len, dtype, m.stream.raw())? };
        }
        Ok(())
    })?;
    if !f32_path {
        for (slot, (m, target)) in slots.iter().zip(ctx.members.iter().zip(&targets)) {
            convert(m, "k_bf16_to_f32", slot.ptr, *target, len)?;
        }
    }
    // Keep the slices' buffers until every member's stream has passed the reduction.
    let members = &ctx.members;
    ctx.inflight.hold(
        slots.into_iter().map(|s| s.buffer).collect(),
        |evs: &Vec<RawEvent>| evs.iter().all(RawEvent::is_complete),
        || {
            members
                .iter()
                .map(|m| RawEvent::record(&m.stream))
                .collect()
        },
    )?;
    Ok(0)
}

/// Queues a wire conversion of `len` values from `src` to `dst` (device addresses).
fn convert(m: &Member, kernel: &str, dst: u64, src: u64, len: usize) -> Result<()> {
    let f = m.kernels.get(kernel)?;
    let mut args = ArgSlots::new();
    args.ptr(dst).ptr(src).i64(len as i64);
    let blocks = len.div_ceil(256).clamp(1, 1 << 20) as u32;
    // SAFETY: (dst, src, n) matches `k_f32_to_bf16` / `k_bf16_to_f32`; both addresses span `len`
    // values of live memory of this member's GPU (a validated slice and the member's scratch).
    unsafe { launch(&m.stream, f, (blocks, 1, 1), 256, &mut args) }
}

unsafe extern "C" fn comm_free(ctx: *mut c_void) {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init` (a CommCtx).
    unsafe {
        comm_free_with(ctx, |ctx: Box<CommCtx>| {
            for m in &ctx.members {
                if let Err(e) = m.stream.synchronize() {
                    tracing::warn!(error = %e, "HIP stream failed while freeing the comm");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::plugin::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT};

    #[test]
    fn trio_is_exported() {
        for name in [COMM_INIT, COMM_ALLREDUCE, COMM_FREE] {
            assert!(proc_address(name).is_some_and(|p| !p.as_ptr().is_null()));
        }
        assert!(proc_address("tessera_nope").is_none());
    }

    #[test]
    fn init_declines_without_streams() {
        // SAFETY: zero streams: nothing is dereferenced.
        assert!(unsafe { comm_init(std::ptr::null(), 0) }.is_null());
    }

    #[test]
    fn rccl_missing_is_an_error_not_a_panic() {
        if let Err(e) = load_rccl() {
            assert!(e.to_string().contains("librccl"), "{e}");
        }
    }
}
