//! The plugin ABI: `#[repr(C)]` tables of function pointers, one per object kind, after ggml's
//! `ggml_backend_*_i` structs.
//!
//! A plugin exports one symbol, [`ENTRY_SYMBOL`], of type [`EntryFn`]: it takes the host's
//! services ([`RawHost`]: the log callback and the host's settings) and returns the [`RawRegistry`] table, which points to
//! the device, buffer type, buffer, backend (stream) and event tables. Every table starts with a
//! [`RawHeader`]: a magic number, the ABI version and the table's size in bytes.
//!
//! Compatibility rules:
//! - [`ABI_VERSION`] changes only for incompatible changes; the host refuses any other version.
//! - Tables grow by appending entries, without a version change. A table must be at least as
//!   large as the host's definition; a host reads an appended entry only when `struct_size`
//!   covers it, so newer plugins keep working with older hosts.
//! - Every entry of version 1 is required (non-null). "Optional" behaviours are expressed by the
//!   [`STATUS_DECLINED`] status, not by missing entries.
//!
//! Objects cross the boundary as opaque handles (`*mut c_void`) owned by the plugin and released
//! through the table's `release`. Handles of the Rust export adapter are boxed trait objects:
//! a backend handle is a `*mut Box<dyn Backend>` and a buffer handle a `*const Arc<dyn Buffer>`,
//! exactly what the comm trio expects, so a plugin's comm runs on its own handles unchanged.
//!
//! Fallible entries return an `i32` status and report errors through a [`RawErrorOut`] sink the
//! host passes in; strings leave the plugin through a [`RawStrOut`] sink. Neither side frees
//! memory the other allocated.
#![allow(unsafe_code)]

use std::ffi::c_void;

/// Name of the entry symbol every plugin exports.
pub const ENTRY_SYMBOL: &str = "tessera_backend_init";
/// Magic number at the start of every table (`"TESSERA\0"` little-endian).
pub const ABI_MAGIC: u64 = u64::from_le_bytes(*b"TESSERA\0");
/// The ABI version this build speaks.
pub const ABI_VERSION: u32 = 2;

/// Success.
pub const STATUS_OK: i32 = 0;
/// An optional operation was declined; nothing happened and the host falls back.
pub const STATUS_DECLINED: i32 = 1;
/// The operation failed; the error was written to the error sink.
pub const STATUS_ERROR: i32 = -1;
/// The plugin panicked; the panic message was written to the error sink.
pub const STATUS_PANIC: i32 = -2;

/// `tessera_backend_init(host) -> registry table` (null when the plugin cannot start).
pub type EntryFn = unsafe extern "C" fn(host: *const RawHost) -> *const RawRegistry;

/// The start of every table.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHeader {
    /// [`ABI_MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`] of the side that built the table.
    pub abi_version: u32,
    /// `size_of` the whole table, header included.
    pub struct_size: u32,
}

impl RawHeader {
    /// The header of a table of type `T` in this build.
    pub const fn of<T>() -> RawHeader {
        RawHeader {
            magic: ABI_MAGIC,
            abi_version: ABI_VERSION,
            struct_size: std::mem::size_of::<T>() as u32,
        }
    }
}

/// A borrowed UTF-8 string (not NUL-terminated), valid for the duration of the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawStr {
    /// First byte (may be null when `len` is 0).
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl RawStr {
    /// Borrows `s`.
    pub fn new(s: &str) -> RawStr {
        RawStr {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// The string, lossily decoded.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable for `'a` (or `len` 0).
    pub unsafe fn to_str_lossy<'a>(self) -> std::borrow::Cow<'a, str> {
        // SAFETY: forwarded to the caller.
        String::from_utf8_lossy(unsafe { raw_bytes(self.ptr, self.len) })
    }
}

/// Bytes at `ptr..ptr+len`; empty for a null pointer or zero length.
///
/// # Safety
/// Unless `len` is 0 or `ptr` null, `ptr..ptr+len` must be readable and unaliased by writes for `'a`.
pub unsafe fn raw_bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// Mutable bytes at `ptr..ptr+len`; empty for a null pointer or zero length.
///
/// # Safety
/// Unless `len` is 0 or `ptr` null, `ptr..ptr+len` must be writable and unaliased for `'a`.
pub unsafe fn raw_bytes_mut<'a>(ptr: *mut u8, len: usize) -> &'a mut [u8] {
    if ptr.is_null() || len == 0 {
        &mut []
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }
}

/// A string sink: the callee calls `write` (any number of times) to append text.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawStrOut {
    /// The caller's state.
    pub ctx: *mut c_void,
    /// Appends `len` bytes at `ptr`.
    pub write: unsafe extern "C" fn(ctx: *mut c_void, ptr: *const u8, len: usize),
}

impl RawStrOut {
    /// A sink appending to `bytes`, valid while `bytes` is (both sides of the ABI collect
    /// strings this way).
    pub(crate) fn into_vec(bytes: &mut Vec<u8>) -> RawStrOut {
        RawStrOut {
            ctx: bytes as *mut Vec<u8> as *mut c_void,
            write: append_to_vec,
        }
    }
}

unsafe extern "C" fn append_to_vec(ctx: *mut c_void, ptr: *const u8, len: usize) {
    // SAFETY: `ctx` is the `Vec<u8>` of `RawStrOut::into_vec`, alive for the call (its
    // contract); the bytes are lent.
    unsafe { (*(ctx as *mut Vec<u8>)).extend_from_slice(raw_bytes(ptr, len)) }
}

/// A handle sink: the callee calls `push` once per handle it returns (devices of a registry).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawHandleOut {
    /// The caller's state.
    pub ctx: *mut c_void,
    /// Takes ownership of one handle.
    pub push: unsafe extern "C" fn(ctx: *mut c_void, handle: *mut c_void),
}

/// Kinds of [`RawError`], one per variant of [`tessera_core::Error`] plus a panic and a catch-all.
#[allow(missing_docs)]
pub mod error_kind {
    pub const OTHER: u32 = 0;
    pub const PANIC: u32 = 1;
    pub const UNAVAILABLE: u32 = 2;
    pub const NO_SUCH_DEVICE: u32 = 3;
    pub const DRIVER: u32 = 4;
    pub const INVALID_OP: u32 = 5;
    pub const UNSUPPORTED: u32 = 6;
    pub const UNKNOWN_TENSOR: u32 = 7;
    pub const NOT_ALLOCATED: u32 = 8;
    pub const FOREIGN: u32 = 9;
    pub const INVALID_ARGUMENT: u32 = 10;
    pub const OUT_OF_BOUNDS: u32 = 11;
    pub const SIZE_MISMATCH: u32 = 12;
    pub const OUT_OF_MEMORY: u32 = 13;
    pub const READ_ONLY: u32 = 14;
    pub const COMPUTE: u32 = 15;
    pub const PLUGIN: u32 = 16;
}

/// An error as it crosses the boundary: a kind and the variant's fields, strings first
/// (see `codec::encode_error` for the field order of each kind).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawError {
    /// One of [`error_kind`].
    pub kind: u32,
    /// String fields, borrowed for the call.
    pub strs: [RawStr; 4],
    /// Numeric fields.
    pub nums: [u64; 3],
}

/// An error sink: the callee calls `set` at most once before returning a negative status.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawErrorOut {
    /// The caller's state.
    pub ctx: *mut c_void,
    /// Records the error; the callee keeps ownership of the strings.
    pub set: unsafe extern "C" fn(ctx: *mut c_void, error: *const RawError),
}

/// Log levels of [`RawLogFn`]: 1 error … 5 trace; 0 = off.
#[allow(missing_docs)]
pub mod log_level {
    pub const OFF: u32 = 0;
    pub const ERROR: u32 = 1;
    pub const WARN: u32 = 2;
    pub const INFO: u32 = 3;
    pub const DEBUG: u32 = 4;
    pub const TRACE: u32 = 5;
}

/// `log(ctx, level, target, message)`: one formatted log event from the plugin.
pub type RawLogFn = unsafe extern "C" fn(ctx: *mut c_void, level: u32, target: RawStr, msg: RawStr);

/// Services the host lends the plugin at init.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawHost {
    /// Header of this table.
    pub header: RawHeader,
    /// Context passed back to `log`.
    pub log_ctx: *mut c_void,
    /// Where the plugin sends its log events (may be called from any thread).
    pub log: RawLogFn,
    /// Most verbose level the host wants ([`log_level`]).
    pub max_log_level: u32,
    /// Appended: the host's value of a settings variable (`tessera_core::settings::var`), so
    /// that values set from the host's code reach the plugin's copy of the settings.
    pub setting: RawSettingFn,
}

/// `setting(name, out)`: writes the host's value of settings variable `name` (e.g.
/// `TESSERA_CPU_REPACK`) to `out` and returns 1, or returns 0 when it has none.
pub type RawSettingFn = unsafe extern "C" fn(name: RawStr, out: *const RawStrOut) -> i32;

/// Host memory lent to a plugin's `buffer_from_host`: the plugin calls `release` once, when its
/// buffer no longer needs the bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawHostMemory {
    /// First byte.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
    /// The host's owner of the memory.
    pub ctx: *mut c_void,
    /// Drops the owner.
    pub release: unsafe extern "C" fn(ctx: *mut c_void),
}

/// A host event lent to a plugin stream's `wait_host_event`; `release` is called once.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawHostEvent {
    /// The host's event.
    pub ctx: *mut c_void,
    /// Blocks until the event completes: [`STATUS_OK`] or negative with a message in `msg`.
    pub synchronize: unsafe extern "C" fn(ctx: *mut c_void, msg: *const RawStrOut) -> i32,
    /// 1 if complete.
    pub is_complete: unsafe extern "C" fn(ctx: *mut c_void) -> u8,
    /// Drops the host's reference.
    pub release: unsafe extern "C" fn(ctx: *mut c_void),
}

/// Marks "no tensor" in [`RawTensor::src`] and [`RawTensor::view_src`].
pub const NO_TENSOR: u32 = u32::MAX;

/// An op and its parameters (codes in `codec`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RawOp {
    /// The op.
    pub kind: u32,
    /// Sub-kind: unary function, GLU function, ROPE mode.
    pub sub: u32,
    /// Integer parameters (permute axes, concat dim, rope dims, GLU swap).
    pub ints: [u64; 4],
    /// Float parameters in declaration order of the op's fields.
    pub floats: [f32; 4],
}

/// One tensor descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawTensor {
    /// ggml type id.
    pub dtype: u32,
    /// Role flags: bit 0 input, bit 1 output, bit 2 param.
    pub flags: u32,
    /// The op producing it.
    pub op: RawOp,
    /// Shape.
    pub ne: [u64; 4],
    /// Byte strides.
    pub nb: [u64; 4],
    /// Sources, [`NO_TENSOR`] where absent.
    pub src: [u32; 5],
    /// The viewed tensor, or [`NO_TENSOR`].
    pub view_src: u32,
    /// Byte offset into the viewed tensor.
    pub view_offset: u64,
    /// Name (may be empty).
    pub name: RawStr,
}

/// A graph in flat form, owned by the caller and valid for the call: every descriptor of its
/// context plus the node, leaf and output lists (indices into `tensors`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawGraph {
    /// Descriptors.
    pub tensors: *const RawTensor,
    /// Number of descriptors.
    pub n_tensors: usize,
    /// Nodes in execution order.
    pub nodes: *const u32,
    /// Number of nodes.
    pub n_nodes: usize,
    /// Leaves.
    pub leafs: *const u32,
    /// Number of leaves.
    pub n_leafs: usize,
    /// Outputs.
    pub outputs: *const u32,
    /// Number of outputs.
    pub n_outputs: usize,
}

/// One placement of [`tessera_core::Bindings`]: tensor → the plugin's buffer handle + offset.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawBinding {
    /// Tensor index.
    pub tensor: u32,
    /// Buffer handle of the same plugin.
    pub buffer: *mut c_void,
    /// Byte offset.
    pub offset: usize,
}

/// Free and total memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RawMemoryInfo {
    /// Bytes free.
    pub free: usize,
    /// Bytes in all.
    pub total: usize,
}

/// [`tessera_core::DeviceCaps`] bits.
#[allow(missing_docs)]
pub mod caps_bit {
    pub const IS_ASYNC: u32 = 1;
    pub const HOST_BUFFER: u32 = 2;
    pub const BUFFER_FROM_HOST: u32 = 4;
    pub const EVENTS: u32 = 8;
}

type H = *mut c_void;
type Err = *const RawErrorOut;
type Str = *const RawStrOut;

/// The registry: the table [`ENTRY_SYMBOL`] returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawRegistry {
    /// Header.
    pub header: RawHeader,
    /// The plugin's registry object.
    pub ctx: H,
    /// Table of device handles.
    pub device: *const RawDeviceTable,
    /// Table of buffer type handles.
    pub buffer_type: *const RawBufferTypeTable,
    /// Table of buffer handles.
    pub buffer: *const RawBufferTable,
    /// Table of backend (stream) handles.
    pub backend: *const RawBackendTable,
    /// Table of event handles.
    pub event: *const RawEventTable,
    /// Lower-case backend name.
    pub name: unsafe extern "C" fn(ctx: H, out: Str),
    /// Cheap availability check.
    pub probe: unsafe extern "C" fn(ctx: H, err: Err) -> i32,
    /// Pushes device handles: the default set for `count` 0, else exactly `count` devices.
    pub devices:
        unsafe extern "C" fn(ctx: H, count: usize, out: *const RawHandleOut, err: Err) -> i32,
    /// An optional function by name, or null.
    pub proc_address: unsafe extern "C" fn(ctx: H, name: RawStr) -> *const c_void,
}

/// Device entries.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawDeviceTable {
    /// Header.
    pub header: RawHeader,
    /// Drops the handle.
    pub release: unsafe extern "C" fn(dev: H),
    /// Device name.
    pub name: unsafe extern "C" fn(dev: H, out: Str),
    /// Description.
    pub description: unsafe extern "C" fn(dev: H, out: Str),
    /// Kind: 0 CPU, 1 GPU, 2 IGPU, 3 ACCEL, 4 META.
    pub kind: unsafe extern "C" fn(dev: H) -> u32,
    /// Free and total memory.
    pub memory: unsafe extern "C" fn(dev: H, out: *mut RawMemoryInfo),
    /// [`caps_bit`] flags.
    pub caps: unsafe extern "C" fn(dev: H) -> u32,
    /// A new handle to the device's buffer type.
    pub buffer_type: unsafe extern "C" fn(dev: H) -> H,
    /// A new handle to the pinned host buffer type, or null.
    pub host_buffer_type: unsafe extern "C" fn(dev: H) -> H,
    /// 1 yes, 0 no (reason written to `reason`).
    pub supports_op:
        unsafe extern "C" fn(dev: H, graph: *const RawGraph, node: u32, reason: Str) -> u8,
    /// Whether the device's streams use buffers of this buffer type handle.
    pub supports_buffer_type: unsafe extern "C" fn(dev: H, buft: H) -> u8,
    /// Whether the buffer handle is the device's own memory.
    pub owns_buffer: unsafe extern "C" fn(dev: H, buf: H) -> u8,
    /// Whether the device's streams address the buffer handle directly.
    pub can_access: unsafe extern "C" fn(dev: H, buf: H) -> u8,
    /// Whether the op is worth moving here.
    pub offload_op: unsafe extern "C" fn(dev: H, graph: *const RawGraph, node: u32) -> u8,
    /// Wraps host memory: OK with a buffer handle in `out`, DECLINED, or an error.
    pub buffer_from_host:
        unsafe extern "C" fn(dev: H, mem: *const RawHostMemory, out: *mut H, err: Err) -> i32,
    /// A new stream; `n_threads` 0 = the device's default.
    pub init_backend: unsafe extern "C" fn(dev: H, n_threads: usize, out: *mut H, err: Err) -> i32,
}

/// Buffer type entries.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawBufferTypeTable {
    /// Header.
    pub header: RawHeader,
    /// Drops the handle.
    pub release: unsafe extern "C" fn(buft: H),
    /// Name.
    pub name: unsafe extern "C" fn(buft: H, out: Str),
    /// Alignment of tensor offsets.
    pub alignment: unsafe extern "C" fn(buft: H) -> usize,
    /// Largest allocation.
    pub max_size: unsafe extern "C" fn(buft: H) -> usize,
    /// Bytes a tensor needs (sources and view of the descriptor are not set).
    pub alloc_size: unsafe extern "C" fn(buft: H, tensor: *const RawTensor) -> usize,
    /// Whether the memory is host memory.
    pub is_host: unsafe extern "C" fn(buft: H) -> u8,
    /// Allocates `size` bytes; the buffer handle goes to `out`.
    pub alloc: unsafe extern "C" fn(buft: H, size: usize, out: *mut H, err: Err) -> i32,
}

/// Buffer entries.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawBufferTable {
    /// Header.
    pub header: RawHeader,
    /// Drops the handle.
    pub release: unsafe extern "C" fn(buf: H),
    /// Size in bytes.
    pub size: unsafe extern "C" fn(buf: H) -> usize,
    /// Name for messages.
    pub name: unsafe extern "C" fn(buf: H, out: Str),
    /// Whether the CPU addresses it.
    pub is_host: unsafe extern "C" fn(buf: H) -> u8,
    /// Blocking write.
    pub write:
        unsafe extern "C" fn(buf: H, offset: usize, src: *const u8, len: usize, err: Err) -> i32,
    /// Blocking read.
    pub read:
        unsafe extern "C" fn(buf: H, offset: usize, dst: *mut u8, len: usize, err: Err) -> i32,
    /// Fill.
    pub memset: unsafe extern "C" fn(buf: H, offset: usize, len: usize, value: u8, err: Err) -> i32,
    /// Strided write (`Buffer::write_2d` argument order, host slice as pointer + length).
    #[allow(clippy::type_complexity)]
    pub write_2d: unsafe extern "C" fn(
        buf: H,
        offset: usize,
        src: *const u8,
        src_len: usize,
        block: usize,
        n_blocks: usize,
        dst_stride: usize,
        src_stride: usize,
        err: Err,
    ) -> i32,
    /// Strided read (`Buffer::read_2d` argument order).
    #[allow(clippy::type_complexity)]
    pub read_2d: unsafe extern "C" fn(
        buf: H,
        offset: usize,
        dst: *mut u8,
        dst_len: usize,
        block: usize,
        n_blocks: usize,
        src_stride: usize,
        dst_stride: usize,
        err: Err,
    ) -> i32,
    /// Device-side copy from another buffer handle of the plugin: OK, DECLINED, or an error.
    pub copy_from: unsafe extern "C" fn(
        buf: H,
        src: H,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
        err: Err,
    ) -> i32,
}

/// Backend (stream) entries.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawBackendTable {
    /// Header.
    pub header: RawHeader,
    /// Drops the handle (and the stream).
    pub release: unsafe extern "C" fn(be: H),
    /// Device name.
    pub name: unsafe extern "C" fn(be: H, out: Str),
    /// Enqueues a graph with its placements.
    pub compute: unsafe extern "C" fn(
        be: H,
        graph: *const RawGraph,
        bindings: *const RawBinding,
        n_bindings: usize,
        err: Err,
    ) -> i32,
    /// Waits for queued work.
    pub synchronize: unsafe extern "C" fn(be: H, err: Err) -> i32,
    /// Ordered write (the data is consumed before return).
    pub write_async: unsafe extern "C" fn(
        be: H,
        buf: H,
        offset: usize,
        src: *const u8,
        len: usize,
        err: Err,
    ) -> i32,
    /// Ordered read.
    pub read_async: unsafe extern "C" fn(
        be: H,
        buf: H,
        offset: usize,
        dst: *mut u8,
        len: usize,
        err: Err,
    ) -> i32,
    /// Ordered copy between two buffer handles of the plugin.
    pub copy_async: unsafe extern "C" fn(
        be: H,
        src: H,
        src_offset: usize,
        dst: H,
        dst_offset: usize,
        len: usize,
        err: Err,
    ) -> i32,
    /// OK with an event handle in `out`, or DECLINED (no events).
    pub record_event: unsafe extern "C" fn(be: H, out: *mut H, err: Err) -> i32,
    /// Makes later work wait for an event handle of the plugin.
    pub wait_event: unsafe extern "C" fn(be: H, ev: H, err: Err) -> i32,
    /// Makes later work wait for a host event (the plugin releases it when done).
    pub wait_host_event: unsafe extern "C" fn(be: H, ev: *const RawHostEvent, err: Err) -> i32,
}

/// Event entries.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawEventTable {
    /// Header.
    pub header: RawHeader,
    /// Drops the handle.
    pub release: unsafe extern "C" fn(ev: H),
    /// Blocks until complete.
    pub synchronize: unsafe extern "C" fn(ev: H, err: Err) -> i32,
    /// 1 if complete.
    pub is_complete: unsafe extern "C" fn(ev: H) -> u8,
}
