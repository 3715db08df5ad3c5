//! The comm trio through NCCL: `tessera_comm_init` / `tessera_comm_allreduce_tensor` /
//! `tessera_comm_free` (see `tessera_core::plugin`), one communicator per GPU from
//! `ncclCommInitAll` in this process.
//!
//! - Wire: f32 below the element thresholds of ggml-cuda (N ≤ 2: 32768, N = 3: 131072, N ≥ 4:
//!   262144), else bf16 with round-to-nearest-even conversion kernels around the reduction.
//! - Slices that do not contribute are zeroed first; zero-length reductions are done at once.
//! - Declines (nothing enqueued, the generic all-reduce runs): `TESSERA_CUDA_ALLREDUCE=none`, a
//!   stream that is not CUDA, NCCL not loadable, two logical devices on one GPU (NCCL needs one
//!   rank per GPU), or a slice that is not 4-byte aligned CUDA memory of its stream's GPU.
#![allow(unsafe_code)]

use crate::buffer::CudaBuffer;
use crate::compile::Kernels;
use crate::stream::CudaBackend;
use crate::sys::driver::{Args, DeviceMem, RawEvent, Stream, launch};
use crate::sys::nccl::{NCCL_BFLOAT16, NCCL_FLOAT32, Nccl, NcclComm};
use std::ffi::c_void;
use std::sync::Arc;
use tessera_core::plugin::{
    CommCall, RawCommSlice, comm_allreduce_with, comm_free_with, comm_init_with,
};
use tessera_core::{Backend, Buffer, ProcAddress, Result};
use tessera_kernels::cuda::host::InFlight;

/// Environment variable choosing the all-reduce path: `nccl` (default) or `none` (always the
/// generic fallback).
pub const ALLREDUCE_ENV: &str = "TESSERA_CUDA_ALLREDUCE";

/// Whether `n_elements` values over `n_devices` GPUs go over the wire as f32 (else bf16): the
/// thresholds ggml-cuda tuned on PCIe 4.0.
pub fn f32_wire(n_devices: usize, n_elements: usize) -> bool {
    match n_devices {
        0..=2 => n_elements < 32768,
        3 => n_elements < 131_072,
        _ => n_elements < 262_144,
    }
}

/// The comm trio's addresses by name.
pub(crate) fn proc_address(name: &str) -> Option<ProcAddress> {
    tessera_core::plugin::comm_proc_address(name, comm_init, comm_allreduce, comm_free)
}

struct Member {
    ordinal: usize,
    stream: Arc<Stream>,
    kernels: Arc<Kernels>,
    scratch: Option<DeviceMem>,
}

struct CommCtx {
    members: Vec<Member>,
    /// NCCL and one communicator per member, or why this set of streams is declined.
    nccl: std::result::Result<(Arc<Nccl>, Vec<NcclComm>), String>,
    inflight: InFlight<Vec<RawEvent>>,
}

unsafe extern "C" fn comm_init(streams: *const *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: forwarded from the comm ABI's contract for this function.
    unsafe { comm_init_with(streams, n, init) }
}

fn init(streams: Vec<&mut Box<dyn Backend>>) -> Option<CommCtx> {
    if std::env::var(ALLREDUCE_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("none"))
        || streams.len() < 2
    {
        return None;
    }
    let mut members = Vec::with_capacity(streams.len());
    for backend in streams {
        let cuda = backend.as_any_mut().downcast_mut::<CudaBackend>()?;
        members.push(Member {
            ordinal: cuda.gpu_ordinal(),
            stream: cuda.stream.clone(),
            kernels: cuda.shared.kernels().ok()?,
            scratch: None,
        });
    }
    let mut ordinals: Vec<usize> = members.iter().map(|m| m.ordinal).collect();
    ordinals.sort_unstable();
    let nccl = if ordinals.windows(2).any(|w| w[0] == w[1]) {
        Err("two logical devices share a GPU".to_string())
    } else {
        let nccl = Arc::new(
            Nccl::load()
                .map_err(|e| tracing::info!(error = %e, "NCCL unavailable"))
                .ok()?,
        );
        let devs: Vec<i32> = members.iter().map(|m| m.ordinal as i32).collect();
        let comms = nccl
            .init_all(&devs)
            .map_err(|e| tracing::warn!(error = %e, "ncclCommInitAll failed; declining"))
            .ok()?;
        Ok((nccl, comms))
    };
    Some(CommCtx {
        members,
        nccl,
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

/// A validated slice: its buffer (kept alive while queued) and device address.
struct Slot {
    buffer: Arc<dyn Buffer>,
    ptr: u64,
    contributes: bool,
}

fn allreduce(ctx: &mut CommCtx, calls: Vec<CommCall>) -> Result<i32> {
    if calls.len() != ctx.members.len() {
        return Ok(-2);
    }
    let Ok((nccl, comms)) = &ctx.nccl else {
        return Ok(1);
    };
    let len = calls.first().map_or(0, |s| s.len);
    let mut slots = Vec::with_capacity(calls.len());
    for (s, m) in calls.into_iter().zip(&ctx.members) {
        let Some(buffer) = s.buffer.filter(|_| s.len == len) else {
            return Ok(1);
        };
        let Some(cb) = buffer.as_any().downcast_ref::<CudaBuffer>() else {
            return Ok(1);
        };
        let in_range = s
            .offset
            .checked_add(len * 4)
            .is_some_and(|end| end <= cb.mem.size());
        if cb.gpu_ordinal() != m.ordinal || s.offset % 4 != 0 || !in_range {
            return Ok(1);
        }
        let ptr = cb.mem.ptr() + s.offset as u64;
        slots.push(Slot {
            buffer,
            ptr,
            contributes: s.contributes,
        });
    }
    if len == 0 {
        return Ok(0);
    }
    let n_dev = ctx.members.len();
    if f32_wire(n_dev, len) {
        for (slot, m) in slots.iter().zip(&ctx.members) {
            if !slot.contributes {
                zero(&m.stream, slot, len * 4)?;
            }
        }
        nccl.group(|| {
            for ((slot, m), comm) in slots.iter().zip(&ctx.members).zip(comms) {
                // SAFETY: `slot.ptr` addresses `len` f32 values inside a live buffer of this
                // member's GPU (validated above), held in `inflight` until the stream passes.
                unsafe {
                    comm.all_reduce_in_place(
                        slot.ptr,
                        len,
                        NCCL_FLOAT32,
                        m.stream.raw() as *mut c_void,
                    )?
                };
            }
            Ok(())
        })?;
    } else {
        for m in ctx.members.iter_mut() {
            if m.scratch.as_ref().is_none_or(|s| s.size() < len * 2) {
                m.stream.synchronize()?;
                m.scratch = Some(DeviceMem::alloc(m.stream.gpu(), len * 2)?);
            }
        }
        for (slot, m) in slots.iter().zip(&ctx.members) {
            let scratch = m.scratch.as_ref().map_or(0, DeviceMem::ptr);
            if slot.contributes {
                convert(m, "k_f32_to_bf16", scratch, slot.ptr, len)?;
            } else if let Some(s) = &m.scratch {
                m.stream.memset(s, 0, len * 2, 0)?;
            }
        }
        nccl.group(|| {
            for (m, comm) in ctx.members.iter().zip(comms) {
                let scratch = m.scratch.as_ref().map_or(0, DeviceMem::ptr);
                // SAFETY: the member's scratch holds at least `len` bf16 values (grown above) and
                // lives in the context until it is freed after a synchronize.
                unsafe {
                    comm.all_reduce_in_place(
                        scratch,
                        len,
                        NCCL_BFLOAT16,
                        m.stream.raw() as *mut c_void,
                    )?
                };
            }
            Ok(())
        })?;
        for (slot, m) in slots.iter().zip(&ctx.members) {
            let scratch = m.scratch.as_ref().map_or(0, DeviceMem::ptr);
            convert(m, "k_bf16_to_f32", slot.ptr, scratch, len)?;
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

fn zero(stream: &Stream, slot: &Slot, bytes: usize) -> Result<()> {
    let Some(cb) = slot.buffer.as_any().downcast_ref::<CudaBuffer>() else {
        return Ok(());
    };
    let offset = (slot.ptr - cb.mem.ptr()) as usize;
    stream.memset(&cb.mem, offset, bytes, 0)
}

/// Queues a wire conversion of `len` values from `src` to `dst` (device addresses).
fn convert(m: &Member, kernel: &str, dst: u64, src: u64, len: usize) -> Result<()> {
    let f = m.kernels.get(kernel)?;
    let mut args = Args::new();
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
                    tracing::warn!(error = %e, "CUDA stream failed while freeing the comm");
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
    fn wire_thresholds_follow_ggml() {
        assert!(f32_wire(2, 32767) && !f32_wire(2, 32768));
        assert!(f32_wire(3, 131_071) && !f32_wire(3, 131_072));
        assert!(f32_wire(8, 262_143) && !f32_wire(4, 262_144));
    }

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
}
