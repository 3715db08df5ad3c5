//! A host-staged comm trio (`tessera_comm_init` / `tessera_comm_allreduce_tensor` /
//! `tessera_comm_free`) for any [`Driver`]: the backend for GPUs with no collective library
//! (Vulkan), where the generic all-reduce of the meta device would otherwise move every slice
//! through several device-to-device hops.
//!
//! - Each contributing member's slice is read to host memory in its stream's order (one
//!   `read_staged` per member: the wait is the all-reduce's synchronisation point), summed in f32
//!   on the host in member order, and the sum written back to every member's slice in stream
//!   order, so every member ends with the same bits.
//! - The wire between device and host is f32, or bf16 where the driver's variable
//!   (`TESSERA_<NAME>_ALLREDUCE`, e.g. `TESSERA_VULKAN_ALLREDUCE`) says `bf16`: each member rounds
//!   its slice to bf16 on the device (`k_f32_to_bf16`, round to nearest even), the host sums the
//!   bf16 values in f32 and rounds the sum once to bf16, and each member widens it back
//!   (`k_bf16_to_f32`): half the bytes each way, within two bf16 roundings of the exact sum.
//! - Slices that do not contribute are not read (they may hold anything, NaN included) and
//!   receive the sum. Zero-length reductions are done at once.
//! - Declines (the generic all-reduce runs), with the reason logged: the variable set to `none`,
//!   fewer than two streams, or a stream of another backend; a slice not in memory of its
//!   stream's GPU, misaligned or out of range declines that call.
#![allow(unsafe_code)]

use crate::buffer::GpuBuffer;
use crate::comm::Member;
use crate::driver::Driver;
use crate::inflight::InFlight;
use std::ffi::c_void;
use tessera_core::comm::{
    CommCall, RawCommSlice, comm_allreduce_with, comm_free_with, comm_init_with,
};
use tessera_core::{Backend, Error, ProcAddress, Result};

/// The wire between device and host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostWire {
    /// Values cross as f32: the sum is exact f32 arithmetic in member order.
    F32,
    /// Values cross as bf16 (opt-in): half the bytes.
    Bf16,
}

/// The variable that chooses the host-staged all-reduce of driver `D`: `TESSERA_<NAME>_ALLREDUCE`
/// with `none` (decline), `f32` (the default) or `bf16`.
pub fn allreduce_env<D: Driver>() -> String {
    format!("TESSERA_{}_ALLREDUCE", D::NAME.to_ascii_uppercase())
}

/// The wire the variable asks for, `None` for `none`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable and the accepted values.
pub fn wire_from_env<D: Driver>() -> Result<Option<HostWire>> {
    let var = allreduce_env::<D>();
    match tessera_core::settings::var(&var) {
        None => Ok(Some(HostWire::F32)),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "" | "f32" | "host" => Ok(Some(HostWire::F32)),
            "bf16" => Ok(Some(HostWire::Bf16)),
            "none" => Ok(None),
            _ => Err(Error::InvalidArgument(format!(
                "{var}={v}: expected none, f32 or bf16"
            ))),
        },
    }
}

/// `comm_init`'s wire argument: from the driver's variable, or fixed.
const WIRE_FROM_ENV: u8 = 0;
const WIRE_F32: u8 = 1;
const WIRE_BF16: u8 = 2;

/// The comm trio's addresses by name, for driver `D`, with the wire its variable chooses when a
/// comm is made ([`wire_from_env`]).
pub fn proc_address<D: Driver>(name: &str) -> Option<ProcAddress> {
    tessera_core::comm::comm_proc_address(
        name,
        comm_init::<D, WIRE_FROM_ENV>,
        comm_allreduce::<D>,
        comm_free::<D>,
    )
}

/// As [`proc_address`], with the wire fixed (the variable still declines with `none`): for a
/// registry that chooses the wire itself, and for tests.
pub fn proc_address_with_wire<D: Driver>(name: &str, wire: HostWire) -> Option<ProcAddress> {
    let init = match wire {
        HostWire::F32 => comm_init::<D, WIRE_F32>,
        HostWire::Bf16 => comm_init::<D, WIRE_BF16>,
    };
    tessera_core::comm::comm_proc_address(name, init, comm_allreduce::<D>, comm_free::<D>)
}

struct CommCtx<D: Driver> {
    members: Vec<Member<D>>,
    wire: HostWire,
    /// Host staging: the values read, the running sum, and the bytes written back.
    host_in: Vec<u8>,
    host_sum: Vec<f32>,
    host_out: Vec<u8>,
    inflight: InFlight<Vec<D::Event>>,
}

unsafe extern "C" fn comm_init<D: Driver, const WIRE: u8>(
    streams: *const *mut c_void,
    n: usize,
) -> *mut c_void {
    // SAFETY: forwarded from the comm ABI's contract for this function.
    unsafe { comm_init_with(streams, n, init::<D, WIRE>) }
}

fn decline<T>(backend: &str, reason: &str) -> Option<T> {
    crate::comm::decline_as("host-staged", backend, reason)
}

fn init<D: Driver, const WIRE: u8>(streams: Vec<&mut Box<dyn Backend>>) -> Option<CommCtx<D>> {
    let wire = match (wire_from_env::<D>(), WIRE) {
        (Ok(None), _) => return decline(D::NAME, &format!("{}=none", allreduce_env::<D>())),
        (Ok(Some(_)), WIRE_F32) => HostWire::F32,
        (Ok(Some(_)), WIRE_BF16) => HostWire::Bf16,
        (Ok(Some(w)), _) => w,
        (Err(e), _) => return decline(D::NAME, &e.to_string()),
    };
    if streams.len() < 2 {
        return None;
    }
    let mut members = Vec::with_capacity(streams.len());
    for backend in streams {
        let Some(m) = Member::of(backend) else {
            return decline(D::NAME, "a stream is of another backend");
        };
        members.push(m);
    }
    tracing::debug!(
        backend = D::NAME,
        members = members.len(),
        ?wire,
        "host-staged all-reduce ready"
    );
    Some(CommCtx {
        members,
        wire,
        host_in: Vec::new(),
        host_sum: Vec::new(),
        host_out: Vec::new(),
        inflight: InFlight::new(),
    })
}

unsafe extern "C" fn comm_allreduce<D: Driver>(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
) -> i32 {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init::<D>`.
    unsafe { comm_allreduce_with(ctx, slices, n, allreduce::<D>) }
}

fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

fn allreduce<D: Driver>(ctx: &mut CommCtx<D>, calls: Vec<CommCall>) -> Result<i32> {
    let result = allreduce_queued(ctx, calls);
    if result.is_err() {
        crate::comm::drain::<D>(ctx.members.iter().map(|m| &m.stream));
    }
    result
}

fn allreduce_queued<D: Driver>(ctx: &mut CommCtx<D>, calls: Vec<CommCall>) -> Result<i32> {
    let usable = |m: &Member<D>, gpu: &D::Gpu| std::ptr::eq(m.gpu.as_ref(), gpu);
    let (len, slots) = match crate::comm::validate_slices::<D, _>(calls, &ctx.members, usable) {
        Ok(v) => v,
        Err(status) => return Ok(status),
    };
    if len == 0 {
        return Ok(0);
    }
    let wire_bytes = match ctx.wire {
        HostWire::F32 => 4,
        HostWire::Bf16 => 2,
    };
    if ctx.wire == HostWire::Bf16 {
        for m in ctx.members.iter_mut() {
            if m.scratch.as_ref().is_none_or(|s| D::mem_size(s) < len * 2) {
                D::stream_sync(&m.stream)?;
                m.scratch = Some(D::alloc(&m.gpu, len * 2)?);
            }
        }
    }
    let mems: Vec<&D::Mem> = slots
        .iter()
        .map(|s| {
            s.buffer
                .as_any()
                .downcast_ref::<GpuBuffer<D>>()
                .map(|b| &b.mem)
                .ok_or_else(|| Error::Compute {
                    device: D::NAME.into(),
                    reason: "an all-reduce slice is not GPU memory".into(),
                })
        })
        .collect::<Result<_>>()?;
    // Every member rounds to the wire first, so the devices convert while the host reads.
    if ctx.wire == HostWire::Bf16 {
        for (slot, m) in slots.iter().zip(&ctx.members) {
            if slot.contributes {
                let s = m.scratch.as_ref().map_or(0, D::mem_ptr);
                m.convert("k_f32_to_bf16", s, slot.ptr, len)?;
            }
        }
    }
    ctx.host_in.resize(len * wire_bytes, 0);
    ctx.host_sum.clear();
    ctx.host_sum.resize(len, 0.0);
    for ((slot, m), mem) in slots.iter().zip(&ctx.members).zip(&mems) {
        if !slot.contributes {
            continue;
        }
        match (ctx.wire, m.scratch.as_ref()) {
            (HostWire::Bf16, Some(s)) => {
                D::read_staged(&m.stream, s, 0, &mut ctx.host_in)?;
                for (acc, b) in ctx.host_sum.iter_mut().zip(ctx.host_in.chunks_exact(2)) {
                    *acc += f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            }
            _ => {
                D::read_staged(&m.stream, mem, slot.offset, &mut ctx.host_in)?;
                for (acc, b) in ctx.host_sum.iter_mut().zip(ctx.host_in.chunks_exact(4)) {
                    *acc += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }
    ctx.host_out.clear();
    match ctx.wire {
        HostWire::F32 => {
            for v in &ctx.host_sum {
                ctx.host_out.extend_from_slice(&v.to_le_bytes());
            }
        }
        HostWire::Bf16 => {
            for v in &ctx.host_sum {
                ctx.host_out.extend_from_slice(&bf16_bits(*v).to_le_bytes());
            }
        }
    }
    for ((slot, m), mem) in slots.iter().zip(&ctx.members).zip(&mems) {
        match (ctx.wire, m.scratch.as_ref()) {
            (HostWire::Bf16, Some(s)) => {
                D::write_staged(&m.stream, s, 0, &ctx.host_out)?;
                m.convert("k_bf16_to_f32", slot.ptr, D::mem_ptr(s), len)?;
            }
            _ => D::write_staged(&m.stream, mem, slot.offset, &ctx.host_out)?,
        }
    }
    // Keep the slices' buffers until every member's stream has passed the write-back.
    crate::comm::hold_until_passed(&mut ctx.inflight, &ctx.members, slots)?;
    Ok(0)
}

unsafe extern "C" fn comm_free<D: Driver>(ctx: *mut c_void) {
    // SAFETY: forwarded from the comm ABI's contract; `ctx` came from `comm_init::<D>`.
    unsafe {
        comm_free_with(ctx, |ctx: Box<CommCtx<D>>| {
            crate::comm::drain::<D>(ctx.members.iter().map(|m| &m.stream));
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        // Exactly halfway between 0x3f80 and 0x3f81: to the even one.
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    }
}
