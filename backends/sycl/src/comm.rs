//! The comm trio for SYCL streams: `tessera_comm_init` / `tessera_comm_allreduce_tensor` /
//! `tessera_comm_free` (see `tessera_core::comm`), a two-device ring all-reduce.
//!
//! - N = 2 only (other N decline, and the generic all-reduce runs), both streams on devices of one
//!   context (a root and its sub-devices), so each device copies its peer's memory directly.
//! - Below [`F32_WIRE_BELOW`] elements the exchange is f32: each device copies its peer's slice
//!   into its scratch and adds it; both add the same two operands, so both hold the same sum.
//! - From there on the wire is bf16 (round to nearest even), halving the bytes moved: a
//!   reduce-scatter (each device sends the half the other owns as bf16 and adds what it
//!   receives) and an all-gather (each device rounds its reduced half to bf16, keeps the rounded
//!   values and sends them). Both devices end with identical values, each within two bf16
//!   roundings of the exact sum.
//! - Slices that do not contribute are zeroed first; a persistent scratch per device grows as
//!   needed. Ordering uses events between the two queues; nothing blocks the host.
#![allow(unsafe_code)]

use crate::device::DevState;
use crate::gpu::{Sycl, SyclQueue};
use crate::sys::{DeviceMem, RawEvent};
use std::ffi::c_void;
use std::sync::Arc;
use tessera_core::comm::{
    CommCall, RawCommSlice, comm_allreduce_with, comm_free_with, comm_init_with,
};
use tessera_core::{Backend, ProcAddress, Result};
use tessera_gpu::{Driver, GpuStream, InFlight, Kernels, validate_slices};
use tessera_kernels::gpu::launch::{Arg, Launch};

/// Element count from which values cross as bf16 (as ggml-cuda for two devices).
pub const F32_WIRE_BELOW: usize = 32768;

/// Environment variable choosing the all-reduce path: `ring` (default) or `none` (always the
/// generic fallback).
pub const ALLREDUCE_ENV: &str = "TESSERA_SYCL_ALLREDUCE";

/// The comm trio's addresses by name.
pub(crate) fn proc_address(name: &str) -> Option<ProcAddress> {
    tessera_core::comm::comm_proc_address(name, comm_init, comm_allreduce, comm_free)
}

struct Member {
    /// The stream's queue and device, shared with it.
    stream: Arc<SyclQueue>,
    kernels: Arc<Kernels<Sycl>>,
    /// Persistent scratch: f32 values (f32 wire) or bf16 wire + received halves.
    scratch: Option<DeviceMem>,
}

struct CommCtx {
    members: Vec<Member>,
    inflight: InFlight<Vec<RawEvent>>,
}

unsafe extern "C" fn comm_init(streams: *const *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: forwarded from the comm ABI's contract for this function.
    unsafe { comm_init_with(streams, n, init) }
}

fn init(streams: Vec<&mut Box<dyn Backend>>) -> Option<CommCtx> {
    if tessera_core::settings::var(ALLREDUCE_ENV).is_some_and(|v| v.eq_ignore_ascii_case("none"))
        || streams.len() != 2
    {
        return None;
    }
    let mut members = Vec::with_capacity(2);
    for backend in streams {
        let s = backend.as_any_mut().downcast_mut::<GpuStream<Sycl>>()?;
        members.push(Member {
            stream: s.driver_stream().clone(),
            kernels: s.context().kernels().clone(),
            scratch: None,
        });
    }
    if !members[0]
        .stream
        .state
        .same_context(&members[1].stream.state)
    {
        tracing::info!("SYCL ring all-reduce declined: the devices do not share a context");
        return None;
    }
    Some(CommCtx {
        members,
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

fn launch(m: &Member, kernel: &'static str, n: usize, args: Vec<Arg>) -> Result<()> {
    let l = Launch {
        kernel,
        grid: (n.div_ceil(256).clamp(1, 1 << 20) as u32, 1, 1),
        block: 256,
        args,
    };
    let k = m.kernels.for_launch(&l)?;
    // SAFETY: the comm kernels take (pointer, pointer, i64) as built by the callers; the
    // pointers address `n` values inside validated slices or the member's scratch, held until
    // the queues pass (the in-flight list and the context).
    unsafe { Sycl::launch(&m.stream, &k, &l) }
}

fn allreduce(ctx: &mut CommCtx, calls: Vec<CommCall>) -> Result<i32> {
    // Each device of the context reads and writes the others' memory directly.
    let usable = |m: &Member, gpu: &DevState| gpu.same_context(&m.stream.state);
    let (len, slots) = match validate_slices::<Sycl, _>(calls, &ctx.members, usable) {
        Ok(v) => v,
        Err(status) => return Ok(status),
    };
    if len == 0 {
        return Ok(0);
    }
    // Scratch: f32 wire needs len f32; bf16 wire needs (len/2 + 1) bf16 to send plus as many
    // to receive, well within len * 4 bytes too.
    for m in ctx.members.iter_mut() {
        if m.scratch.as_ref().is_none_or(|s| s.size() < len * 4) {
            m.stream.queue.wait()?;
            let st = &m.stream.state;
            m.scratch = Some(DeviceMem::alloc(&st.platform, st.index, len * 4)?);
        }
    }
    for (slot, m) in slots.iter().zip(&ctx.members) {
        if !slot.contributes {
            // SAFETY: the slot spans len f32 of a live buffer (validated), held below.
            unsafe {
                m.stream
                    .queue
                    .memset(slot.ptr as *mut u8, 0, len * 4, false)?
            };
        }
    }
    let scratch: Vec<u64> = ctx
        .members
        .iter()
        .map(|m| m.scratch.as_ref().map_or(0, DeviceMem::ptr))
        .collect();
    let (a, b) = (&ctx.members[0], &ctx.members[1]);
    let ready = [a.stream.queue.record()?, b.stream.queue.record()?];
    if len < F32_WIRE_BELOW {
        // Each copies its peer's slice, then (once the peer has copied its own) adds it.
        a.stream.queue.wait_event(&ready[1])?;
        b.stream.queue.wait_event(&ready[0])?;
        // SAFETY: slices and scratches span len f32 of live memory in one context.
        unsafe {
            a.stream.queue.memcpy(
                scratch[0] as *mut u8,
                slots[1].ptr as *const u8,
                len * 4,
                false,
            )?;
            b.stream.queue.memcpy(
                scratch[1] as *mut u8,
                slots[0].ptr as *const u8,
                len * 4,
                false,
            )?;
        }
        let copied = [a.stream.queue.record()?, b.stream.queue.record()?];
        a.stream.queue.wait_event(&copied[1])?;
        b.stream.queue.wait_event(&copied[0])?;
        for (i, m) in [a, b].into_iter().enumerate() {
            let args = vec![
                Arg::Ptr(slots[i].ptr),
                Arg::Ptr(scratch[i]),
                Arg::I64(len as i64),
            ];
            launch(m, "k_add_f32", len, args)?;
        }
    } else {
        // Device 0 owns [0, h), device 1 owns [h, len). Scratch layout: send wire at 0,
        // received wire at `recv` bytes.
        let h = len / 2;
        let owned = [(0usize, h), (h, len - h)];
        let recv = (len.div_ceil(2) * 2).next_multiple_of(128);
        // Reduce-scatter: each sends the peer's half as bf16.
        for (i, m) in [a, b].into_iter().enumerate() {
            let (start, count) = owned[1 - i];
            let args = vec![
                Arg::Ptr(scratch[i]),
                Arg::Ptr(slots[i].ptr + 4 * start as u64),
                Arg::I64(count as i64),
            ];
            launch(m, "k_f32_to_bf16", count, args)?;
        }
        let sent = [a.stream.queue.record()?, b.stream.queue.record()?];
        for (i, m) in [a, b].into_iter().enumerate() {
            let peer = 1 - i;
            m.stream.queue.wait_event(&sent[peer])?;
            let (_, count) = owned[i];
            // SAFETY: the peer's send wire holds `count` bf16 values; the receive area of this
            // member's scratch has room for them (recv + 2 * count <= 4 * len).
            unsafe {
                m.stream.queue.memcpy(
                    (scratch[i] + recv as u64) as *mut u8,
                    scratch[peer] as *const u8,
                    count * 2,
                    false,
                )?
            };
        }
        let received = [a.stream.queue.record()?, b.stream.queue.record()?];
        // All-gather: add what arrived to the owned half, round it (keeping the rounded values)
        // into the send wire once the peer has taken the previous contents.
        for (i, m) in [a, b].into_iter().enumerate() {
            let (start, count) = owned[i];
            let own = slots[i].ptr + 4 * start as u64;
            let args = vec![
                Arg::Ptr(own),
                Arg::Ptr(scratch[i] + recv as u64),
                Arg::I64(count as i64),
            ];
            launch(m, "k_add_bf16", count, args)?;
            m.stream.queue.wait_event(&received[1 - i])?;
            let args = vec![Arg::Ptr(scratch[i]), Arg::Ptr(own), Arg::I64(count as i64)];
            launch(m, "k_round_to_bf16", count, args)?;
        }
        let rounded = [a.stream.queue.record()?, b.stream.queue.record()?];
        for (i, m) in [a, b].into_iter().enumerate() {
            let peer = 1 - i;
            m.stream.queue.wait_event(&rounded[peer])?;
            let (start, count) = owned[peer];
            // SAFETY: as for the first exchange.
            unsafe {
                m.stream.queue.memcpy(
                    (scratch[i] + recv as u64) as *mut u8,
                    scratch[peer] as *const u8,
                    count * 2,
                    false,
                )?
            };
            let args = vec![
                Arg::Ptr(slots[i].ptr + 4 * start as u64),
                Arg::Ptr(scratch[i] + recv as u64),
                Arg::I64(count as i64),
            ];
            launch(m, "k_bf16_to_f32", count, args)?;
        }
        // The peer must finish reading this member's send wire before a later reduction
        // rewrites it.
        let done = [a.stream.queue.record()?, b.stream.queue.record()?];
        a.stream.queue.wait_event(&done[1])?;
        b.stream.queue.wait_event(&done[0])?;
    }
    // Keep the slices' buffers until both queues have passed the reduction.
    ctx.inflight.hold(
        slots.into_iter().map(|s| s.buffer).collect(),
        |evs: &Vec<RawEvent>| evs.iter().all(RawEvent::is_complete),
        || Ok(vec![a.stream.queue.record()?, b.stream.queue.record()?]),
    )?;
    Ok(0)
}

unsafe extern "C" fn comm_free(ctx: *mut c_void) {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init` (a CommCtx).
    unsafe {
        comm_free_with(ctx, |ctx: Box<CommCtx>| {
            for m in &ctx.members {
                if let Err(e) = m.stream.queue.wait() {
                    tracing::warn!(error = %e, "SYCL queue failed while freeing the comm");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::comm::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT};

    #[test]
    fn trio_is_exported() {
        for name in [COMM_INIT, COMM_ALLREDUCE, COMM_FREE] {
            assert!(proc_address(name).is_some_and(|p| !p.as_ptr().is_null()));
        }
        assert!(proc_address("tessera_nope").is_none());
    }

    #[test]
    fn init_declines_without_two_streams() {
        // SAFETY: zero streams: nothing is dereferenced.
        assert!(unsafe { comm_init(std::ptr::null(), 0) }.is_null());
    }
}
