//! The CUDA driver API: contexts, memory, streams, events, modules and launches, as safe
//! wrappers over cudarc's `result` layer. Each object keeps the [`Gpu`] it belongs to alive and
//! makes that GPU's context current before touching it.

use cudarc::driver::{result, sys};
use std::ffi::{CString, c_void};
use std::sync::Arc;
use tessera_core::{Error, Result};

/// A driver error as Tessera's error.
pub(crate) fn driver_err(call: &'static str, e: result::DriverError) -> Error {
    let name = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    tracing::debug!(call, error = %name, "CUDA driver call failed");
    Error::Driver {
        backend: "cuda".into(),
        call: format!("{call} ({name})"),
        code: e.0 as i64,
    }
}

/// Whether libcuda can be loaded, then `cuInit` and the device count: `Ok(count)` or the reason
/// the driver cannot be used. Never panics: the library is probed before cudarc touches it.
pub(crate) fn probe() -> std::result::Result<usize, String> {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so.1 not found (no NVIDIA driver on this machine)".into());
    }
    // cudarc panics on a missing symbol (a driver older than the bindings): contain it.
    let res = std::panic::catch_unwind(|| -> std::result::Result<usize, String> {
        result::init().map_err(|e| format!("cuInit failed: {e}"))?;
        let n = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
        Ok(n.max(0) as usize)
    });
    res.unwrap_or_else(|_| Err("the CUDA driver lacks an entry point Tessera needs".into()))
}

/// The driver version as `major * 1000 + minor * 10` (12020 = 12.2).
pub(crate) fn driver_version() -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: `v` is a valid out-pointer; the driver is loaded (probe succeeded before any GPU exists).
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| driver_err("cuDriverGetVersion", e))?;
    Ok(v)
}

/// One physical GPU and its primary context, shared by every logical device on it.
#[derive(Debug)]
pub struct Gpu {
    ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    cc: (i32, i32),
    total_mem: usize,
}

// SAFETY: a CUcontext is usable from any thread once made current there (`bind` does that
// before every call); the other fields are plain data.
unsafe impl Send for Gpu {}
// SAFETY: as for Send; the driver serialises access to a context internally.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Retains the primary context of GPU `ordinal`. The driver must have been probed.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let dev = result::device::get(ordinal as i32).map_err(|e| driver_err("cuDeviceGet", e))?;
        // SAFETY: `dev` came from cuDeviceGet; the retained context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(|e| driver_err("cuDevicePrimaryCtxRetain", e))?;
        let attr = |a| {
            // SAFETY: `dev` is a valid device handle.
            unsafe { result::device::get_attribute(dev, a) }
                .map_err(|e| driver_err("cuDeviceGetAttribute", e))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| format!("GPU {ordinal}"));
        // SAFETY: `dev` is a valid device handle.
        let total_mem = unsafe { result::device::total_mem(dev) }
            .map_err(|e| driver_err("cuDeviceTotalMem", e))?;
        Ok(Arc::new(Gpu {
            ordinal,
            dev,
            ctx,
            name,
            cc: (major, minor),
            total_mem,
        }))
    }

    /// The driver's ordinal of this GPU.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// Marketing name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
    /// Compute capability (major, minor).
    pub(crate) fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }
    /// Total memory in bytes.
    pub(crate) fn total_mem(&self) -> usize {
        self.total_mem
    }

    /// Makes this GPU's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the life of `self`.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| driver_err("cuCtxSetCurrent", e))
    }

    /// Free and total memory.
    pub(crate) fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))
    }

    /// Waits for all work of every stream on this GPU.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        result::ctx::synchronize().map_err(|e| driver_err("cuCtxSynchronize", e))
    }

    /// Whether this GPU can read and write `peer`'s memory directly.
    pub(crate) fn can_access_peer(&self, peer: &Gpu) -> bool {
        let mut ok = 0i32;
        // SAFETY: both handles are valid devices; `ok` is a valid out-pointer.
        let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut ok, self.dev, peer.dev) };
        rc == sys::CUresult::CUDA_SUCCESS && ok != 0
    }

    /// Enables access from this GPU's context to `peer`'s memory (idempotent).
    pub(crate) fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        self.bind()?;
        // SAFETY: `peer.ctx` is a retained context.
        let rc = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
        match rc {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            other => Err(driver_err(
                "cuCtxEnablePeerAccess",
                result::DriverError(other),
            )),
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`; nothing uses the context after this.
        if let Err(e) = unsafe { result::primary_ctx::release(self.dev) } {
            tracing::warn!(error = %e, "cuDevicePrimaryCtxRelease failed");
        }
    }
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceMem {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    size: usize,
}

impl DeviceMem {
    /// Allocates `size` bytes (at least one, so every buffer has a distinct address) and zeroes them.
    pub(crate) fn alloc(gpu: &Arc<Gpu>, size: usize) -> Result<DeviceMem> {
        gpu.bind()?;
        // SAFETY: the context is current; the pointer is freed exactly once in Drop.
        let ptr = unsafe { result::malloc_sync(size.max(1)) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory {
                    device: format!("CUDA GPU {}", gpu.ordinal),
                    requested: size,
                }
            } else {
                driver_err("cuMemAlloc", e)
            }
        })?;
        let mem = DeviceMem {
            gpu: gpu.clone(),
            ptr,
            size,
        };
        // SAFETY: `ptr` spans `size` bytes just allocated.
        unsafe { result::memset_d8_sync(ptr, 0, size) }.map_err(|e| driver_err("cuMemsetD8", e))?;
        // cuMemsetD8 may return before it runs, and Tessera's streams do not wait for the
        // legacy stream: finish it before any stream can use the memory.
        gpu.synchronize()?;
        Ok(mem)
    }
    /// The device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
    /// The GPU the memory is on.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        tessera_core::error::check_range(&"CUDA buffer", offset, len, self.size)
    }

    /// Blocking write of `src` at `offset`, after all queued work of the GPU.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.gpu.synchronize()?;
        // SAFETY: the range is inside the allocation (checked); the copy is synchronous for
        // pageable memory once the context is synchronized below.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, src) }
            .map_err(|e| driver_err("cuMemcpyHtoD", e))?;
        self.gpu.synchronize()
    }

    /// Blocking read into `dst` from `offset`, after all queued work of the GPU.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.gpu.synchronize()?;
        // SAFETY: the range is inside the allocation (checked); cuMemcpyDtoH returns when done.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset as u64) }
            .map_err(|e| driver_err("cuMemcpyDtoH", e))
    }

    /// Blocking fill of `len` bytes at `offset`.
    pub(crate) fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.gpu.synchronize()?;
        // SAFETY: the range is inside the allocation (checked).
        unsafe { result::memset_d8_sync(self.ptr + offset as u64, value, len) }
            .map_err(|e| driver_err("cuMemsetD8", e))?;
        self.gpu.synchronize()
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated in `alloc`, freed once; cuMemFree waits for work using it.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!(error = %e, "cuMemFree failed");
            }
        }
    }
}

/// Page-locked host memory, freed on drop.
#[derive(Debug)]
pub struct PinnedMem {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    size: usize,
    lock: parking_lot::Mutex<()>,
}

// SAFETY: the pointer is owned by this value; reads and writes through `&self` are serialised by
// `lock` or ordered by the caller's streams and events, as for device memory.
unsafe impl Send for PinnedMem {}
// SAFETY: as for Send.
unsafe impl Sync for PinnedMem {}

impl PinnedMem {
    /// Allocates `size` bytes of pinned, portable host memory, zeroed.
    pub(crate) fn alloc(gpu: &Arc<Gpu>, size: usize) -> Result<PinnedMem> {
        gpu.bind()?;
        // SAFETY: the context is current; freed once in Drop.
        let ptr = unsafe { result::malloc_host(size.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| driver_err("cuMemHostAlloc", e))? as *mut u8;
        // SAFETY: `ptr` spans `size.max(1)` bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, size.max(1)) };
        Ok(PinnedMem {
            gpu: gpu.clone(),
            ptr,
            size,
            lock: parking_lot::Mutex::new(()),
        })
    }
    /// Size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
    /// The host address as an integer (for async copies).
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }
    /// Copies `src` to `offset`, after the GPU's queued work (async copies may read this memory).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        tessera_core::error::check_range(&"CUDA host buffer", offset, src.len(), self.size)?;
        self.gpu.synchronize()?;
        let _g = self.lock.lock();
        // SAFETY: the range is inside the allocation (checked); queued copies finished above.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
        Ok(())
    }

    /// Copies from `offset` into `dst`, after the GPU's queued work.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        tessera_core::error::check_range(&"CUDA host buffer", offset, dst.len(), self.size)?;
        self.gpu.synchronize()?;
        let _g = self.lock.lock();
        // SAFETY: the range is inside the allocation (checked).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Fills `len` bytes at `offset`.
    pub(crate) fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        tessera_core::error::check_range(&"CUDA host buffer", offset, len, self.size)?;
        self.gpu.synchronize()?;
        let _g = self.lock.lock();
        // SAFETY: the range is inside the allocation (checked).
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), value, len) };
        Ok(())
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        if self.gpu.synchronize().is_ok() {
            // SAFETY: allocated in `alloc`, freed once, after queued copies finished.
            if let Err(e) = unsafe { result::free_host(self.ptr as *mut c_void) } {
                tracing::warn!(error = %e, "cuMemFreeHost failed");
            }
        }
    }
}

/// A non-blocking stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    gpu: Arc<Gpu>,
    raw: sys::CUstream,
}

// SAFETY: a CUstream may be used from any thread with its context current (every method binds).
unsafe impl Send for Stream {}
// SAFETY: the driver serialises work submitted to one stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream on `gpu`.
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<Stream> {
        gpu.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_err("cuStreamCreate", e))?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw,
        })
    }
    /// The GPU.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
    /// The raw handle (for NCCL).
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// Waits for the stream's work.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the stream is alive.
        unsafe { result::stream::synchronize(self.raw) }
            .map_err(|e| driver_err("cuStreamSynchronize", e))
    }

    /// Makes later work wait for `event`.
    pub(crate) fn wait(&self, event: &RawEvent) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: stream and event are alive.
        unsafe {
            result::stream::wait_event(
                self.raw,
                event.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| driver_err("cuStreamWaitEvent", e))
    }

    /// Queues a copy of `len` bytes between device addresses of this GPU.
    pub(crate) fn copy_dtod(
        &self,
        dst: &DeviceMem,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        dst.check(dst_off, len)?;
        src.check(src_off, len)?;
        self.gpu.bind()?;
        // SAFETY: both ranges are inside live allocations (checked); the caller keeps them alive
        // until the stream has run the copy.
        unsafe {
            result::memcpy_dtod_async(
                dst.ptr + dst_off as u64,
                src.ptr + src_off as u64,
                len,
                self.raw,
            )
        }
        .map_err(|e| driver_err("cuMemcpyDtoDAsync", e))
    }

    /// Queues a copy between GPUs (`src` on another GPU's context).
    pub(crate) fn copy_peer(
        &self,
        dst: &DeviceMem,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        dst.check(dst_off, len)?;
        src.check(src_off, len)?;
        self.gpu.bind()?;
        // SAFETY: both ranges are inside live allocations (checked), kept alive by the caller.
        unsafe {
            result::memcpy_peer_async(
                dst.gpu.ctx,
                dst.ptr + dst_off as u64,
                src.gpu.ctx,
                src.ptr + src_off as u64,
                len,
                self.raw,
            )
        }
        .map_err(|e| driver_err("cuMemcpyPeerAsync", e))
    }

    /// Queues a copy from pinned host memory to the device.
    pub(crate) fn copy_htod_pinned(
        &self,
        dst: &DeviceMem,
        dst_off: usize,
        src: &PinnedMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        dst.check(dst_off, len)?;
        tessera_core::error::check_range(&"CUDA host buffer", src_off, len, src.size)?;
        self.gpu.bind()?;
        // SAFETY: both ranges are inside live allocations (checked), kept alive by the caller.
        let rc = unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr + dst_off as u64,
                src.ptr.add(src_off) as *const c_void,
                len,
                self.raw,
            )
        };
        rc.result().map_err(|e| driver_err("cuMemcpyHtoDAsync", e))
    }

    /// Queues a copy from the device to pinned host memory.
    pub(crate) fn copy_dtoh_pinned(
        &self,
        dst: &PinnedMem,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        src.check(src_off, len)?;
        tessera_core::error::check_range(&"CUDA host buffer", dst_off, len, dst.size)?;
        self.gpu.bind()?;
        // SAFETY: both ranges are inside live allocations (checked), kept alive by the caller.
        let rc = unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.ptr.add(dst_off) as *mut c_void,
                src.ptr + src_off as u64,
                len,
                self.raw,
            )
        };
        rc.result().map_err(|e| driver_err("cuMemcpyDtoHAsync", e))
    }

    /// Copies pageable `src` to the device in stream order; `src` is consumed before return.
    pub(crate) fn write(&self, dst: &DeviceMem, offset: usize, src: &[u8]) -> Result<()> {
        dst.check(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the range is inside the allocation (checked). From pageable memory the call
        // returns once `src` has been staged, so the borrow may end afterwards.
        unsafe { result::memcpy_htod_async(dst.ptr + offset as u64, src, self.raw) }
            .map_err(|e| driver_err("cuMemcpyHtoDAsync", e))
    }

    /// Copies device bytes into pageable `dst` in stream order and waits for them.
    pub(crate) fn read(&self, src: &DeviceMem, offset: usize, dst: &mut [u8]) -> Result<()> {
        src.check(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the range is inside the allocation (checked); the stream is synchronized
        // before `dst` is released.
        unsafe { result::memcpy_dtoh_async(dst, src.ptr + offset as u64, self.raw) }
            .map_err(|e| driver_err("cuMemcpyDtoHAsync", e))?;
        self.synchronize()
    }

    /// Queues a fill of `len` bytes at device address `ptr` (inside memory the caller keeps alive).
    pub(crate) fn memset(
        &self,
        mem: &DeviceMem,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        mem.check(offset, len)?;
        self.gpu.bind()?;
        // SAFETY: the range is inside a live allocation (checked).
        unsafe { result::memset_d8_async(mem.ptr + offset as u64, value, len, self.raw) }
            .map_err(|e| driver_err("cuMemsetD8Async", e))
    }
}

impl Stream {
    /// Queues `f` on this stream.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in count, size and meaning, every device
    /// address in them must point into memory that stays allocated until the stream has run the
    /// kernel, and the ranges the kernel touches must lie inside those allocations.
    pub(crate) unsafe fn launch(
        &self,
        f: Function,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut tessera_kernels::gpu::launch::ArgSlots,
    ) -> Result<()> {
        self.gpu.bind()?;
        let mut ptrs = args.pointers();
        // SAFETY: the argument contract is the caller's (see # Safety); `ptrs` point into `args`,
        // which outlives the call (the driver copies arguments at launch).
        unsafe { result::launch_kernel(f.raw, grid, (block, 1, 1), 0, self.raw, &mut ptrs) }
            .map_err(|e| driver_err("cuLaunchKernel", e))
    }
}

impl Stream {
    /// Starts recording this stream's work into a CUDA graph (nothing queued while recording
    /// runs until the graph is launched).
    pub(crate) fn begin_capture(&self) -> Result<()> {
        self.gpu.bind()?;
        // Thread-local: another thread's unrelated driver calls neither join nor break this
        // recording.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the stream is alive.
        unsafe { result::stream::begin_capture(self.raw, mode) }
            .map_err(|e| driver_err("cuStreamBeginCapture", e))
    }

    /// Ends the recording and instantiates it.
    pub(crate) fn end_capture(&self) -> Result<GraphExec> {
        // End the capture even if binding fails: a stream left capturing would record, not run,
        // what comes next.
        let bound = self.gpu.bind();
        // SAFETY: the stream is alive and recording (begin_capture succeeded).
        let graph = unsafe { result::stream::end_capture(self.raw) }
            .map_err(|e| driver_err("cuStreamEndCapture", e))?;
        bound?;
        // SAFETY: `graph` was just made by the driver.
        match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok(GraphExec {
                gpu: self.gpu.clone(),
                graph,
                exec,
            }),
            Err(e) => {
                // SAFETY: made above, destroyed once.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(driver_err("cuGraphInstantiate", e))
            }
        }
    }

    /// Queues a recorded graph.
    pub(crate) fn launch_graph(&self, g: &GraphExec) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: stream and graph are alive; the graph's kernels were checked when recorded.
        unsafe { result::graph::launch(g.exec, self.raw) }
            .map_err(|e| driver_err("cuGraphLaunch", e))
    }
}

/// A recorded and instantiated CUDA graph, destroyed on drop.
#[derive(Debug)]
pub struct GraphExec {
    gpu: Arc<Gpu>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: an executable graph may be launched from any thread with its context bound; launches
// are serialized by the streams they go to.
unsafe impl Send for GraphExec {}
// SAFETY: as for Send.
unsafe impl Sync for GraphExec {}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: made by end_capture, destroyed once; launched work still completes.
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once; pending work still completes.
            if let Err(e) = unsafe { result::stream::destroy(self.raw) } {
                tracing::warn!(error = %e, "cuStreamDestroy failed");
            }
        }
    }
}

/// An event (without timing unless made by [`RawEvent::record_timed`]), destroyed on drop.
#[derive(Debug)]
pub struct RawEvent {
    gpu: Arc<Gpu>,
    raw: sys::CUevent,
}

// SAFETY: events may be queried, waited on and recorded from any thread with the context bound.
unsafe impl Send for RawEvent {}
// SAFETY: as for Send.
unsafe impl Sync for RawEvent {}

impl RawEvent {
    /// A new event recorded on `stream` now.
    pub(crate) fn record(stream: &Stream) -> Result<RawEvent> {
        Self::record_with(stream, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    /// A new event with a timestamp, recorded on `stream` now (for [`RawEvent::elapsed_ms`]).
    pub(crate) fn record_timed(stream: &Stream) -> Result<RawEvent> {
        Self::record_with(stream, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    /// Milliseconds between `start` and `end`, both timed and completed.
    pub(crate) fn elapsed_ms(start: &RawEvent, end: &RawEvent) -> Result<f32> {
        start.gpu.bind()?;
        // SAFETY: both events are alive.
        unsafe { result::event::elapsed(start.raw, end.raw) }
            .map_err(|e| driver_err("cuEventElapsedTime", e))
    }

    fn record_with(stream: &Stream, flags: sys::CUevent_flags) -> Result<RawEvent> {
        stream.gpu.bind()?;
        let raw = result::event::create(flags).map_err(|e| driver_err("cuEventCreate", e))?;
        let ev = RawEvent {
            gpu: stream.gpu.clone(),
            raw,
        };
        // SAFETY: event and stream are alive.
        unsafe { result::event::record(ev.raw, stream.raw) }
            .map_err(|e| driver_err("cuEventRecord", e))?;
        Ok(ev)
    }

    /// Blocks until the event completes.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: the event is alive.
        unsafe { result::event::synchronize(self.raw) }
            .map_err(|e| driver_err("cuEventSynchronize", e))
    }

    /// Whether the event has completed (an error counts as completed: synchronize reports it).
    pub(crate) fn is_complete(&self) -> bool {
        if self.gpu.bind().is_err() {
            return true;
        }
        // SAFETY: the event is alive.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => true,
            Err(e) => e.0 != sys::CUresult::CUDA_ERROR_NOT_READY,
        }
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created in `record`, destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

/// A loaded module (CUBIN or PTX image), unloaded on drop.
#[derive(Debug)]
pub struct Module {
    gpu: Arc<Gpu>,
    raw: sys::CUmodule,
}

// SAFETY: module handles are context-bound data usable from any thread once the context is current.
unsafe impl Send for Module {}
// SAFETY: as for Send; lookups do not mutate the module.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a CUBIN or (NUL-terminated) PTX image.
    pub(crate) fn load(gpu: &Arc<Gpu>, image: &[u8], is_ptx: bool) -> Result<Module> {
        let mut owned;
        let bytes = if is_ptx && image.last() != Some(&0) {
            owned = image.to_vec();
            owned.push(0);
            &owned[..]
        } else {
            image
        };
        gpu.bind()?;
        // SAFETY: `bytes` is a complete CUBIN or NUL-terminated PTX image that outlives the call.
        let raw = unsafe { result::module::load_data(bytes.as_ptr() as *const c_void) }
            .map_err(|e| driver_err("cuModuleLoadData", e))?;
        Ok(Module {
            gpu: gpu.clone(),
            raw,
        })
    }

    /// The kernel `name`.
    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        self.gpu.bind()?;
        // SAFETY: the module is loaded; the function lives as long as the module.
        let raw = unsafe { result::module::get_function(self.raw, c) }
            .map_err(|e| driver_err("cuModuleGetFunction", e))?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: loaded in `load`, unloaded once after every Function user (they hold the Arc).
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// A kernel handle; valid while its [`Module`] is loaded (owners keep both together).
#[derive(Debug, Clone, Copy)]
pub struct Function {
    raw: sys::CUfunction,
}

// SAFETY: a function handle is immutable data of a loaded module.
unsafe impl Send for Function {}
// SAFETY: as for Send.
unsafe impl Sync for Function {}

impl DeviceMem {
    /// Blocking copy of `len` bytes from `src` (this GPU or a peer) into this memory, after all
    /// queued work of both GPUs.
    pub(crate) fn copy_from(
        &self,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        self.check(dst_off, len)?;
        src.check(src_off, len)?;
        if len == 0 {
            return Ok(());
        }
        src.gpu.synchronize()?;
        self.gpu.synchronize()?;
        // SAFETY: both ranges are inside live allocations (checked); both GPUs are idle and the
        // synchronous copies return when done.
        let rc = unsafe {
            if Arc::ptr_eq(&self.gpu, &src.gpu) {
                sys::cuMemcpyDtoD_v2(self.ptr + dst_off as u64, src.ptr + src_off as u64, len)
            } else {
                sys::cuMemcpyPeer(
                    self.ptr + dst_off as u64,
                    self.gpu.ctx,
                    src.ptr + src_off as u64,
                    src.gpu.ctx,
                    len,
                )
            }
        };
        rc.result()
            .map_err(|e| driver_err("cuMemcpy(DtoD|Peer)", e))?;
        self.gpu.synchronize()
    }
}
