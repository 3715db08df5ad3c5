//! [`Driver`]: the one trait a vendor crate implements. Its associated types are the vendor's
//! own FFI wrappers (a GPU and its context, device and pinned memory, a stream, an event, a
//! loaded module, a kernel handle); each frees itself on drop, so "free" is `Drop`. Everything
//! above them — devices, buffers, streams, events, the kernel cache, the registry and the comm
//! trio — is written once in this crate, generic over the trait.
//!
//! Methods that queue work on raw device addresses are `unsafe fn`s with a `# Safety` contract;
//! the others check ranges against the allocations they are given and return errors, never
//! panic.
// The trait declares `unsafe fn launch`; its contract is documented there, and implementing it
// is the vendor crate's `sys` business.
#![allow(unsafe_code)]

use std::fmt::Debug;
use std::sync::Arc;
use tessera_core::{DeviceType, Error, Result};
use tessera_kernels::gpu::launch::Launch;
use tessera_kernels::gpu::unit::Unit;

/// Alignment of tensor offsets in GPU buffers (the allocation granularity for fast loads, as
/// ggml-cuda).
pub const GPU_ALIGNMENT: usize = 256;

/// A GPU vendor's driver API, as the shared runtime uses it.
pub trait Driver: Debug + Send + Sync + Sized + 'static {
    /// Lower-case backend name (`"cuda"`, `"hip"`, `"sycl"`): registry, features, errors.
    const NAME: &'static str;
    /// Optional. Alignment of tensor offsets in device buffers. Default [`GPU_ALIGNMENT`].
    const ALIGNMENT: usize = GPU_ALIGNMENT;
    /// Optional. Whether the backend has every kernel of `tessera_kernels::gpu`. Default
    /// `true`; a backend still gaining kernels (Vulkan) says `false`, and devices then ask
    /// [`Driver::has_kernel`] for the kernel each node plans.
    const ALL_KERNELS: bool = true;
    /// Optional. Whether [`Driver::alloc_pinned`] gives memory, so devices offer a pinned host
    /// buffer type. Default `false`.
    const PINNED_HOST: bool = false;
    /// Optional. Whether programs are built per kernel and per set of tensor element types
    /// ([`Unit::launch`]) rather than per source file with every type ([`Unit::source`], the
    /// default `false`): for compilers that are slow on large functions (SYCL's OpenCL CPU JIT).
    const UNIT_PER_LAUNCH: bool = false;

    /// One physical GPU with its context, opened once per process.
    type Gpu: Debug + Send + Sync;
    /// Device memory (freed on drop).
    type Mem: Debug + Send + Sync;
    /// Pinned host memory (freed on drop); [`NoPinned`] where the backend has none.
    type Pinned: PinnedMem;
    /// A non-blocking stream (destroyed on drop).
    type Stream: Debug + Send + Sync;
    /// An event recorded on a stream (destroyed on drop).
    type Event: Debug + Send + Sync;
    /// A loaded code object (unloaded on drop).
    type Module: Debug + Send + Sync;
    /// A kernel of a loaded module, valid while the module is.
    type Function: Clone + Debug + Send + Sync;

    // --- device attributes -----------------------------------------------------------------

    /// The driver ordinal of `gpu`.
    fn ordinal(gpu: &Self::Gpu) -> usize;
    /// The GPU's marketing name.
    fn gpu_name(gpu: &Self::Gpu) -> &str;
    /// One line for `tessera devices` (name, ordinal, architecture).
    fn describe(gpu: &Self::Gpu) -> String;
    /// Optional. What kind of device `gpu` is. Default [`DeviceType::Gpu`].
    fn device_type(_gpu: &Self::Gpu) -> DeviceType {
        DeviceType::Gpu
    }
    /// Total device memory in bytes.
    fn total_mem(gpu: &Self::Gpu) -> usize;
    /// Free and total device memory.
    ///
    /// # Errors
    /// The driver's status.
    fn mem_info(gpu: &Self::Gpu) -> Result<(usize, usize)>;
    /// Optional. Whether `gpu` can read and write `peer`'s memory directly. Default `false`:
    /// copies between GPUs go through the driver's peer copy without enabling access first.
    fn can_access_peer(_gpu: &Self::Gpu, _peer: &Self::Gpu) -> bool {
        false
    }
    /// Optional. Whether [`Driver::copy_peer_async`] and [`Driver::copy`] can move bytes between
    /// memory of `gpu` and of `peer` at all (SYCL: only within one context). Default `true`;
    /// otherwise copies go through the host.
    fn can_copy(_gpu: &Self::Gpu, _peer: &Self::Gpu) -> bool {
        true
    }
    /// Optional. Enables direct access from `gpu` to `peer` (idempotent). Default: nothing to
    /// enable.
    ///
    /// # Errors
    /// The driver's status.
    fn enable_peer_access(_gpu: &Self::Gpu, _peer: &Self::Gpu) -> Result<()> {
        Ok(())
    }

    // --- memory ------------------------------------------------------------------------------

    /// Allocates `bytes` (at least one) of device memory on `gpu`; whether it is zeroed is the
    /// driver's choice (CUDA and HIP zero it).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`], or the driver's status.
    fn alloc(gpu: &Arc<Self::Gpu>, bytes: usize) -> Result<Self::Mem>;
    /// The device address of `mem`.
    fn mem_ptr(mem: &Self::Mem) -> u64;
    /// The size of `mem` in bytes.
    fn mem_size(mem: &Self::Mem) -> usize;
    /// The GPU holding `mem`.
    fn mem_gpu(mem: &Self::Mem) -> &Arc<Self::Gpu>;
    /// Blocking write of `src` at `offset`, after all queued work of the GPU.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn write(mem: &Self::Mem, offset: usize, src: &[u8]) -> Result<()>;
    /// Blocking read into `dst` from `offset`, after all queued work of the GPU.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn read(mem: &Self::Mem, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Blocking fill of `len` bytes at `offset`.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn memset(mem: &Self::Mem, offset: usize, len: usize, value: u8) -> Result<()>;
    /// Blocking copy of `len` bytes from `src` (this GPU or a peer), after the queued work of both.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn copy(
        dst: &Self::Mem,
        dst_off: usize,
        src: &Self::Mem,
        src_off: usize,
        len: usize,
    ) -> Result<()>;
    /// Optional. Allocates `bytes` of zeroed pinned host memory registered with `gpu`. Default
    /// `Ok(None)`: no pinned host buffer type.
    ///
    /// # Errors
    /// The driver's status.
    fn alloc_pinned(_gpu: &Arc<Self::Gpu>, _bytes: usize) -> Result<Option<Self::Pinned>> {
        Ok(None)
    }

    // --- streams and copies ------------------------------------------------------------------

    /// A new non-blocking stream on `gpu`.
    ///
    /// # Errors
    /// The driver's status.
    fn stream_create(gpu: &Arc<Self::Gpu>) -> Result<Self::Stream>;
    /// The GPU of `stream`.
    fn stream_gpu(stream: &Self::Stream) -> &Arc<Self::Gpu>;
    /// Waits for the work queued on `stream`.
    ///
    /// # Errors
    /// The driver's status (a failed kernel surfaces here).
    fn stream_sync(stream: &Self::Stream) -> Result<()>;
    /// Makes later work on `stream` wait for `event`.
    ///
    /// # Errors
    /// The driver's status.
    fn stream_wait(stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    /// Queues a copy of `len` bytes between two allocations of the stream's GPU.
    ///
    /// # Errors
    /// Out of range, or the driver's status. The caller keeps both allocations alive until the
    /// stream has run the copy.
    fn copy_async(
        stream: &Self::Stream,
        dst: &Self::Mem,
        dst_off: usize,
        src: &Self::Mem,
        src_off: usize,
        len: usize,
    ) -> Result<()>;
    /// Queues a copy of `len` bytes from `src` on another GPU into `dst`.
    ///
    /// # Errors
    /// As [`Driver::copy_async`].
    fn copy_peer_async(
        stream: &Self::Stream,
        dst: &Self::Mem,
        dst_off: usize,
        src: &Self::Mem,
        src_off: usize,
        len: usize,
    ) -> Result<()>;
    /// Optional. Queues a copy from pinned host memory to the device. Default: unsupported
    /// (never called where [`Driver::alloc_pinned`] gives no memory).
    ///
    /// # Errors
    /// As [`Driver::copy_async`].
    fn copy_to_device_async(
        _stream: &Self::Stream,
        _dst: &Self::Mem,
        _dst_off: usize,
        _src: &Self::Pinned,
        _src_off: usize,
        _len: usize,
    ) -> Result<()> {
        Err(no_pinned::<Self>())
    }
    /// Optional. Queues a copy from the device to pinned host memory. Default: unsupported.
    ///
    /// # Errors
    /// As [`Driver::copy_async`].
    fn copy_to_host_async(
        _stream: &Self::Stream,
        _dst: &Self::Pinned,
        _dst_off: usize,
        _src: &Self::Mem,
        _src_off: usize,
        _len: usize,
    ) -> Result<()> {
        Err(no_pinned::<Self>())
    }
    /// Copies pageable `src` to the device in stream order (staged: `src` may be reused on return).
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn write_staged(
        stream: &Self::Stream,
        dst: &Self::Mem,
        offset: usize,
        src: &[u8],
    ) -> Result<()>;
    /// Copies device bytes into pageable `dst` in stream order and waits for them.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn read_staged(
        stream: &Self::Stream,
        src: &Self::Mem,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<()>;
    /// Queues a fill of `len` bytes at `offset` of `mem`.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn memset_async(
        stream: &Self::Stream,
        mem: &Self::Mem,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()>;

    // --- events ------------------------------------------------------------------------------

    /// A new event recorded on `stream` now.
    ///
    /// # Errors
    /// The driver's status.
    fn event_record(stream: &Self::Stream) -> Result<Self::Event>;
    /// Blocks until `event` completes.
    ///
    /// # Errors
    /// The driver's status.
    fn event_sync(event: &Self::Event) -> Result<()>;
    /// Whether `event` completed (an error counts as completed: [`Driver::event_sync`] reports it).
    fn event_query(event: &Self::Event) -> bool;
    /// Optional. Starts recording the work queued on `stream` into one replayable program
    /// (CUDA graphs, Vulkan command buffers, hipGraph): nothing queued until
    /// [`Driver::record_end`] runs. Default `Ok(false)`: the
    /// driver cannot record, and streams launch every node of every graph.
    ///
    /// # Errors
    /// The driver's status.
    fn record_begin(_stream: &Self::Stream) -> Result<bool> {
        Ok(false)
    }
    /// Optional. Ends the recording [`Driver::record_begin`] started (also after a failed
    /// launch, to leave the stream usable) and returns it, ready to replay. Default: unsupported
    /// (never called where `record_begin` gives `false`).
    ///
    /// # Errors
    /// The driver's status.
    fn record_end(_stream: &Self::Stream) -> Result<Box<dyn std::any::Any + Send + Sync>> {
        Err(Error::InvalidArgument(format!(
            "{}: no recording",
            Self::NAME
        )))
    }
    /// Optional. Queues a recording of [`Driver::record_end`] on `stream`: the same kernels
    /// with the same arguments, in one call. Default: unsupported.
    ///
    /// # Errors
    /// The driver's status.
    fn replay(_stream: &Self::Stream, _recorded: &(dyn std::any::Any + Send + Sync)) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "{}: no recording",
            Self::NAME
        )))
    }
    /// Optional. A new event with a timestamp, recorded on `stream` now, for the kernel profile
    /// (`TESSERA_GPU_PROFILE`). Default `Ok(None)`: the profile then has host times only.
    ///
    /// # Errors
    /// The driver's status.
    fn event_record_timed(_stream: &Self::Stream) -> Result<Option<Self::Event>> {
        Ok(None)
    }
    /// Optional. Milliseconds of device time between two completed events of
    /// [`Driver::event_record_timed`]. Default: unsupported (never called where that gives none).
    ///
    /// # Errors
    /// The driver's status.
    fn event_elapsed_ms(_start: &Self::Event, _end: &Self::Event) -> Result<f32> {
        Err(Error::InvalidArgument(format!(
            "{}: no timed events",
            Self::NAME
        )))
    }

    // --- kernels -----------------------------------------------------------------------------

    /// Compiles (or finds built ahead of time, or in a cache) compile unit `unit` of the sources
    /// of `tessera_kernels::gpu` for `gpu`, and loads it: the vendor's compile step. Called once
    /// per unit and [`GpuContext`](crate::GpuContext), when one of its kernels is first needed.
    /// Units are whole sources ([`Unit::source`]) unless [`Driver::UNIT_PER_LAUNCH`] is set.
    ///
    /// # Errors
    /// The compiler's log, or the driver's status.
    fn load_module(&self, gpu: &Arc<Self::Gpu>, unit: &Unit) -> Result<Self::Module>;
    /// The kernel `name` of `module`.
    ///
    /// # Errors
    /// The driver's status (no such kernel).
    fn function(module: &Self::Module, name: &str) -> Result<Self::Function>;
    /// Optional. Whether kernel `name` exists for `gpu` at all (Vulkan: whether its SPIR-V has
    /// been ported yet), so devices decline the nodes it would run instead of failing them.
    /// Asked only when [`Driver::ALL_KERNELS`] is `false`. Default `true`.
    fn has_kernel(_gpu: &Self::Gpu, _name: &str) -> bool {
        true
    }
    /// Optional. Whether `gpu` multiplies the tiles of `kernels/gpu/mma.cuh` in hardware
    /// (NVIDIA tensor cores, sm_80 and later). Elsewhere the tile kernels (`k_mmq_*`,
    /// `k_flash_attn_mma`) run mma.cuh's emulation, slower than the kernels they replace, so
    /// they are planned only when `TESSERA_GPU_MMA=1` asks for them. Default `false`.
    fn has_mma_tiles(_gpu: &Self::Gpu) -> bool {
        false
    }
    /// Queues `f` on `stream` as `launch` plans it (`grid` blocks of `block` threads, `args`).
    ///
    /// # Safety
    /// `launch.args` must match the kernel's parameter list in count, size and meaning; every device
    /// address in them must point into memory that stays allocated until the stream has run the
    /// kernel, and the ranges the kernel touches must lie inside those allocations.
    ///
    /// # Errors
    /// The driver's status.
    unsafe fn launch(stream: &Self::Stream, f: &Self::Function, launch: &Launch) -> Result<()>;
}

/// Pinned host memory, as the shared host buffer type uses it.
pub trait PinnedMem: Debug + Send + Sync {
    /// Size in bytes.
    fn size(&self) -> usize;
    /// The host address (for buffer names).
    fn addr(&self) -> usize;
    /// Copies `src` to `offset`, after the GPU's queued work.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn write(&self, offset: usize, src: &[u8]) -> Result<()>;
    /// Copies from `offset` into `dst`, after the GPU's queued work.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Fills `len` bytes at `offset`, after the GPU's queued work.
    ///
    /// # Errors
    /// Out of range, or the driver's status.
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()>;
}

/// The [`Driver::Pinned`] of a backend without pinned host memory: no value exists.
#[derive(Debug)]
pub enum NoPinned {}

impl PinnedMem for NoPinned {
    fn size(&self) -> usize {
        match *self {}
    }
    fn addr(&self) -> usize {
        match *self {}
    }
    fn write(&self, _: usize, _: &[u8]) -> Result<()> {
        match *self {}
    }
    fn read(&self, _: usize, _: &mut [u8]) -> Result<()> {
        match *self {}
    }
    fn memset(&self, _: usize, _: usize, _: u8) -> Result<()> {
        match *self {}
    }
}

fn no_pinned<D: Driver>() -> Error {
    Error::InvalidArgument(format!("{}: no pinned host memory", D::NAME))
}

/// Writes the [`Driver`] items that only forward to the vendor's FFI wrappers, for a vendor
/// whose wrapper types follow the shared naming (as `tessera-cuda`'s and `tessera-hip`'s do):
/// the associated types from the arguments, and the methods
/// `Gpu::{ordinal, name, total_mem, mem_info}`, `Mem::{alloc, ptr, size, gpu, write, read,
/// memset, copy_from}`, `Stream::{new, gpu, synchronize, wait, copy_dtod, copy_peer, write, read,
/// memset, launch}`, `Event::{record, synchronize, is_complete}` and `Module::function`, where
/// `Stream::launch(&self, f, grid, block, &mut ArgSlots)` is an `unsafe fn` with
/// [`Driver::launch`]'s contract. Invoke it inside `impl Driver for Vendor { ... }` and write the
/// rest (name, description, peer access, pinned memory, the compile step) by hand.
#[macro_export]
macro_rules! forward_driver_methods {
    (Gpu = $gpu:ty, Mem = $mem:ty, Pinned = $pinned:ty, Stream = $stream:ty, Event = $event:ty,
     Module = $module:ty, Function = $function:ty $(,)?) => {
        type Gpu = $gpu;
        type Mem = $mem;
        type Pinned = $pinned;
        type Stream = $stream;
        type Event = $event;
        type Module = $module;
        type Function = $function;

        fn ordinal(gpu: &Self::Gpu) -> usize {
            gpu.ordinal()
        }
        fn gpu_name(gpu: &Self::Gpu) -> &str {
            gpu.name()
        }
        fn total_mem(gpu: &Self::Gpu) -> usize {
            gpu.total_mem()
        }
        fn mem_info(gpu: &Self::Gpu) -> $crate::__private::Result<(usize, usize)> {
            gpu.mem_info()
        }
        fn alloc(
            gpu: &$crate::__private::Arc<Self::Gpu>,
            bytes: usize,
        ) -> $crate::__private::Result<Self::Mem> {
            <$mem>::alloc(gpu, bytes)
        }
        fn mem_ptr(mem: &Self::Mem) -> u64 {
            mem.ptr()
        }
        fn mem_size(mem: &Self::Mem) -> usize {
            mem.size()
        }
        fn mem_gpu(mem: &Self::Mem) -> &$crate::__private::Arc<Self::Gpu> {
            mem.gpu()
        }
        fn write(mem: &Self::Mem, offset: usize, src: &[u8]) -> $crate::__private::Result<()> {
            mem.write(offset, src)
        }
        fn read(mem: &Self::Mem, offset: usize, dst: &mut [u8]) -> $crate::__private::Result<()> {
            mem.read(offset, dst)
        }
        fn memset(
            mem: &Self::Mem,
            offset: usize,
            len: usize,
            value: u8,
        ) -> $crate::__private::Result<()> {
            mem.memset(offset, len, value)
        }
        fn copy(
            dst: &Self::Mem,
            dst_off: usize,
            src: &Self::Mem,
            src_off: usize,
            len: usize,
        ) -> $crate::__private::Result<()> {
            dst.copy_from(dst_off, src, src_off, len)
        }
        fn stream_create(
            gpu: &$crate::__private::Arc<Self::Gpu>,
        ) -> $crate::__private::Result<Self::Stream> {
            <$stream>::new(gpu)
        }
        fn stream_gpu(stream: &Self::Stream) -> &$crate::__private::Arc<Self::Gpu> {
            stream.gpu()
        }
        fn stream_sync(stream: &Self::Stream) -> $crate::__private::Result<()> {
            stream.synchronize()
        }
        fn stream_wait(
            stream: &Self::Stream,
            event: &Self::Event,
        ) -> $crate::__private::Result<()> {
            stream.wait(event)
        }
        fn copy_async(
            stream: &Self::Stream,
            dst: &Self::Mem,
            dst_off: usize,
            src: &Self::Mem,
            src_off: usize,
            len: usize,
        ) -> $crate::__private::Result<()> {
            stream.copy_dtod(dst, dst_off, src, src_off, len)
        }
        fn copy_peer_async(
            stream: &Self::Stream,
            dst: &Self::Mem,
            dst_off: usize,
            src: &Self::Mem,
            src_off: usize,
            len: usize,
        ) -> $crate::__private::Result<()> {
            stream.copy_peer(dst, dst_off, src, src_off, len)
        }
        fn write_staged(
            stream: &Self::Stream,
            dst: &Self::Mem,
            offset: usize,
            src: &[u8],
        ) -> $crate::__private::Result<()> {
            stream.write(dst, offset, src)
        }
        fn read_staged(
            stream: &Self::Stream,
            src: &Self::Mem,
            offset: usize,
            dst: &mut [u8],
        ) -> $crate::__private::Result<()> {
            stream.read(src, offset, dst)
        }
        fn memset_async(
            stream: &Self::Stream,
            mem: &Self::Mem,
            offset: usize,
            len: usize,
            value: u8,
        ) -> $crate::__private::Result<()> {
            stream.memset(mem, offset, len, value)
        }
        fn event_record(stream: &Self::Stream) -> $crate::__private::Result<Self::Event> {
            <$event>::record(stream)
        }
        fn event_sync(event: &Self::Event) -> $crate::__private::Result<()> {
            event.synchronize()
        }
        fn event_query(event: &Self::Event) -> bool {
            event.is_complete()
        }
        fn function(
            module: &Self::Module,
            name: &str,
        ) -> $crate::__private::Result<Self::Function> {
            module.function(name)
        }
        #[allow(unsafe_code)]
        unsafe fn launch(
            stream: &Self::Stream,
            f: &Self::Function,
            launch: &$crate::__private::Launch,
        ) -> $crate::__private::Result<()> {
            let mut args = $crate::__private::ArgSlots::from_launch(launch);
            // SAFETY: the caller's contract (`Driver::launch`) is `Stream::launch`'s, for the
            // arguments `launch` lists, packed in order.
            unsafe { stream.launch(f.clone(), launch.grid, launch.block, &mut args) }
        }
    };
}

/// Writes a [`RegistryDriver`](crate::RegistryDriver)'s `runtime` (opened once by `$open`, a
/// `fn() -> Result<Runtime<$vendor>, String>`, and kept in a `static`) and `stream_raw` (the
/// stream's `raw()`). Invoke it inside `impl RegistryDriver for $vendor { ... }`.
#[macro_export]
macro_rules! forward_registry_methods {
    ($vendor:ty, $open:path) => {
        fn runtime() -> &'static ::std::result::Result<$crate::Runtime<$vendor>, String> {
            static RUNTIME: ::std::sync::OnceLock<
                ::std::result::Result<$crate::Runtime<$vendor>, String>,
            > = ::std::sync::OnceLock::new();
            RUNTIME.get_or_init($open)
        }
        fn stream_raw(stream: &Self::Stream) -> *mut ::std::ffi::c_void {
            stream.raw()
        }
        fn bind_gpu(gpu: &Self::Gpu) -> $crate::__private::Result<()> {
            gpu.bind()
        }
    };
}
