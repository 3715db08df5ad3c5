//! [`Sycl`]: the SYCL shim (`sys`) and the run-time kernel compiler (`compile`) behind the shared
//! runtime's [`Driver`] trait. Memory is USM of one device ([`SyclMem`]); a stream is an in-order
//! queue ([`SyclQueue`]); blocking host access goes through the device's I/O queue after every
//! stream queue of the device has finished.
#![allow(unsafe_code)]

use crate::device::DevState;
use crate::sys::{DeviceMem, Kernel, LaunchArg, Program, Queue, RawEvent};
use std::sync::Arc;
use tessera_core::{DeviceType, Error, Result};
use tessera_gpu::{Driver, NoPinned, Unit};
use tessera_kernels::gpu::launch::{Arg, Launch};

/// Alignment of tensor offsets in SYCL buffers.
pub const SYCL_ALIGNMENT: usize = 128;

/// The SYCL runtime, as the shared GPU runtime drives it.
#[derive(Debug)]
pub struct Sycl;

/// USM device memory and the device that allocated it.
#[derive(Debug)]
pub struct SyclMem {
    pub(crate) state: Arc<DevState>,
    pub(crate) raw: DeviceMem,
}

/// A stream's in-order queue and its device.
#[derive(Debug)]
pub struct SyclQueue {
    pub(crate) state: Arc<DevState>,
    pub(crate) queue: Arc<Queue>,
}

fn no_context(what: &str) -> Error {
    Error::InvalidArgument(format!("{what}: SYCL memory of two contexts"))
}

impl Driver for Sycl {
    const NAME: &'static str = "sycl";
    const ALIGNMENT: usize = SYCL_ALIGNMENT;
    // The OpenCL CPU JIT is superlinear in function size: one small program per kernel and
    // launch type set instead of every decoder inlined into every load (see tessera_kernels'
    // `cuda::unit`).
    const UNIT_PER_LAUNCH: bool = true;

    type Gpu = DevState;
    type Mem = SyclMem;
    type Pinned = NoPinned;
    type Stream = SyclQueue;
    type Event = RawEvent;
    type Module = Arc<Program>;
    type Function = Arc<Kernel>;

    fn ordinal(gpu: &DevState) -> usize {
        gpu.index
    }
    fn gpu_name(gpu: &DevState) -> &str {
        &gpu.name
    }
    fn describe(gpu: &DevState) -> String {
        let info = gpu.info();
        let what = match info.root {
            Some(r) => format!("sub-device of {}", gpu.platform.devices[r].name),
            None if gpu.index != gpu.root => "logical device".into(),
            None => "device".into(),
        };
        format!(
            "{} ({what}, {} compute units; {})",
            info.name, info.compute_units, gpu.platform.version
        )
    }
    fn device_type(gpu: &DevState) -> DeviceType {
        match gpu.info().kind {
            0 => DeviceType::Cpu,
            1 => DeviceType::Gpu,
            _ => DeviceType::Accel,
        }
    }
    fn total_mem(gpu: &DevState) -> usize {
        gpu.info().global_mem as usize
    }
    fn mem_info(gpu: &DevState) -> Result<(usize, usize)> {
        // SYCL reports no free memory; the whole device counts as free.
        let total = Sycl::total_mem(gpu);
        Ok((total, total))
    }
    fn can_copy(gpu: &DevState, peer: &DevState) -> bool {
        gpu.same_context(peer)
    }

    fn alloc(gpu: &Arc<DevState>, bytes: usize) -> Result<SyclMem> {
        Ok(SyclMem {
            state: gpu.clone(),
            raw: DeviceMem::alloc(&gpu.platform, gpu.index, bytes)?,
        })
    }
    fn mem_ptr(mem: &SyclMem) -> u64 {
        mem.raw.ptr()
    }
    fn mem_size(mem: &SyclMem) -> usize {
        mem.raw.size()
    }
    fn mem_gpu(mem: &SyclMem) -> &Arc<DevState> {
        &mem.state
    }
    fn write(mem: &SyclMem, offset: usize, src: &[u8]) -> Result<()> {
        let dst = mem.raw.at(offset, src.len())?;
        let q = mem.state.io_queue()?;
        // SAFETY: `dst` spans `src.len()` bytes of this live allocation (checked above) and the
        // copy is blocking, so `src` outlives it.
        unsafe { q.memcpy(dst, src.as_ptr(), src.len(), true) }
    }
    fn read(mem: &SyclMem, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = mem.raw.at(offset, dst.len())?;
        let q = mem.state.io_queue()?;
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { q.memcpy(dst.as_mut_ptr(), src, dst.len(), true) }
    }
    fn memset(mem: &SyclMem, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = mem.raw.at(offset, len)?;
        let q = mem.state.io_queue()?;
        // SAFETY: `dst` spans `len` bytes of this live allocation; the fill is blocking.
        unsafe { q.memset(dst, value, len, true) }
    }
    fn copy(dst: &SyclMem, doff: usize, src: &SyclMem, soff: usize, len: usize) -> Result<()> {
        if !dst.state.same_context(&src.state) {
            return Err(no_context("blocking copy"));
        }
        let (d, s) = (dst.raw.at(doff, len)?, src.raw.at(soff, len)?);
        src.state.io_queue()?;
        let q = dst.state.io_queue()?;
        // SAFETY: both ranges lie in live allocations of one context (checked above), and every
        // queue of both devices has finished; the copy is blocking.
        unsafe { q.memcpy(d, s, len, true) }
    }

    fn stream_create(gpu: &Arc<DevState>) -> Result<SyclQueue> {
        Ok(SyclQueue {
            state: gpu.clone(),
            queue: gpu.new_queue()?,
        })
    }
    fn stream_gpu(stream: &SyclQueue) -> &Arc<DevState> {
        &stream.state
    }
    fn stream_sync(stream: &SyclQueue) -> Result<()> {
        stream.queue.wait()
    }
    fn stream_wait(stream: &SyclQueue, event: &RawEvent) -> Result<()> {
        stream.queue.wait_event(event)
    }
    fn copy_async(
        s: &SyclQueue,
        dst: &SyclMem,
        doff: usize,
        src: &SyclMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        if !dst.state.same_context(&src.state) {
            return Err(no_context("queued copy"));
        }
        let (d, sp) = (dst.raw.at(doff, len)?, src.raw.at(soff, len)?);
        // SAFETY: both ranges lie in live allocations of one context (checked); the caller holds
        // the buffers until the queue passes the copy.
        unsafe { s.queue.memcpy(d, sp, len, false) }
    }
    fn copy_peer_async(
        s: &SyclQueue,
        dst: &SyclMem,
        doff: usize,
        src: &SyclMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        // Devices of one context address each other's USM directly.
        Sycl::copy_async(s, dst, doff, src, soff, len)
    }
    fn write_staged(s: &SyclQueue, dst: &SyclMem, offset: usize, src: &[u8]) -> Result<()> {
        let p = dst.raw.at(offset, src.len())?;
        // SAFETY: `p` spans `src.len()` live bytes; the copy is blocking (in queue order), so
        // `src` outlives it.
        unsafe { s.queue.memcpy(p, src.as_ptr(), src.len(), true) }
    }
    fn read_staged(s: &SyclQueue, src: &SyclMem, offset: usize, dst: &mut [u8]) -> Result<()> {
        let p = src.raw.at(offset, dst.len())?;
        // SAFETY: as in `write_staged`, with the roles swapped.
        unsafe { s.queue.memcpy(dst.as_mut_ptr(), p, dst.len(), true) }
    }
    fn memset_async(s: &SyclQueue, mem: &SyclMem, off: usize, len: usize, value: u8) -> Result<()> {
        let p = mem.raw.at(off, len)?;
        // SAFETY: `p` spans `len` live bytes, held by the caller until the queue passes the fill.
        unsafe { s.queue.memset(p, value, len, false) }
    }

    fn event_record(stream: &SyclQueue) -> Result<RawEvent> {
        stream.queue.record()
    }
    fn event_sync(event: &RawEvent) -> Result<()> {
        event.synchronize()
    }
    fn event_query(event: &RawEvent) -> bool {
        event.is_complete()
    }

    fn load_module(&self, gpu: &Arc<DevState>, unit: &Unit) -> Result<Arc<Program>> {
        gpu.programs.program(unit)
    }
    fn function(module: &Arc<Program>, name: &str) -> Result<Arc<Kernel>> {
        module.kernel(name).map(Arc::new)
    }
    unsafe fn launch(s: &SyclQueue, f: &Arc<Kernel>, launch: &Launch) -> Result<()> {
        let args: Vec<LaunchArg> = launch
            .args
            .iter()
            .map(|a| LaunchArg {
                is_ptr: matches!(a, Arg::Ptr(_)),
                bytes: a.bytes(),
            })
            .collect();
        // SAFETY: the caller's contract (`Driver::launch`): the arguments match the kernel's
        // parameters in order, kind and size, and every pointer stays valid until it has run.
        unsafe { s.queue.launch(f, launch.grid, launch.block, &args) }
    }
}
