//! The plugin's objects behind ggml's handles: what a device, buffer type and buffer of this
//! plugin point at, the registry that owns the devices, and the lookups from a ggml handle to
//! its object. Plain data and lookups; the C entry points live in `registry`, `buffer` and
//! `stream`.

use crate::sys;
use parking_lot::{Mutex, RwLock};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tessera::meta::MetaDevice;
use tessera::{Buffer, BufferType, Device, TensorDesc};
use tessera_model::LlamaSplitPolicy;

/// What a ggml device of this plugin points at.
pub(crate) struct DeviceCtx {
    pub(crate) device: Arc<dyn Device>,
    pub(crate) name: CString,
    pub(crate) description: CString,
    /// The device's buffer type, as ggml sees it (its context is a [`BufferTypeCtx`]).
    pub(crate) buffer_type: *mut sys::ggml_backend_buffer_type,
    /// The meta device's state, for the device `TESSERA_GGML_SPLIT` asks for.
    pub(crate) meta: Option<&'static MetaCtx>,
}

/// The meta device of a process and its bookkeeping.
pub(crate) struct MetaCtx {
    pub(crate) device: MetaDevice,
    /// The policy learned at the latest seal that saw weights (`None`: mirror everything).
    pub(crate) learned: Arc<Mutex<Option<LlamaSplitPolicy>>>,
    /// Staged buffers not sealed yet ([`BufferCtx::key`]s of live buffers).
    pub(crate) pending: Mutex<Vec<usize>>,
    /// Nodes of the latest graph whose values were not written back to ggml's memory.
    pub(crate) lost: Mutex<Vec<Lost>>,
    /// ggml's scheduler was told an op cannot run here, so it may cut a model's graph into
    /// several parts on this device: every node's value is then written back.
    pub(crate) keep_all: AtomicBool,
    /// The translation whose lost values `lost` lists last.
    pub(crate) last_graph: Mutex<u64>,
}

/// Bytes `start..end` of a buffer ([`BufferCtx::key`] `buf`) that ggml's tensor `label` would
/// hold had the meta device written it back.
#[derive(Clone, Debug)]
pub(crate) struct Lost {
    pub(crate) buf: usize,
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) label: Arc<str>,
}

/// What a staged buffer of the meta device holds until it is sealed.
#[derive(Default)]
pub(crate) struct Stage {
    /// ggml's buffer (its usage tells weights, caches and compute memory apart); 0 until known.
    pub(crate) ggml: usize,
    /// Tensors placed in it: offset and descriptor (named as ggml names it).
    pub(crate) tensors: Vec<(usize, TensorDesc)>,
    /// A tensor Tessera cannot describe: the buffer then stays whole (mirrored), with a warning.
    pub(crate) undescribed: Option<String>,
    pub(crate) sealed: bool,
}

/// The registry's objects. Raw pointers to leaked boxes: ggml keeps them as long as the plugin is
/// loaded, and a loaded ggml backend is never unloaded while its objects are in use.
pub(crate) struct Registry {
    pub(crate) reg: *mut sys::ggml_backend_reg,
    pub(crate) devices: Vec<*mut sys::ggml_backend_device>,
}

// SAFETY: the pointed-to objects are immutable after `build` and their contexts are `Sync`
// (Tessera devices are `Send + Sync`); ggml reads them from any thread.
unsafe impl Send for Registry {}
// SAFETY: as above.
unsafe impl Sync for Registry {}

pub(crate) static REGISTRY: OnceLock<Registry> = OnceLock::new();

/// The context of one of this plugin's devices.
///
/// # Safety
/// `dev` is a device this plugin made.
pub(crate) unsafe fn device_ctx<'a>(dev: sys::ggml_backend_dev_t) -> &'a DeviceCtx {
    // SAFETY: the caller's contract; devices and their contexts are never freed.
    unsafe { &*(*dev).context.cast::<DeviceCtx>() }
}

/// Whether `buft` is one of this plugin's buffer types.
pub(crate) fn owns_buffer_type(buft: sys::ggml_backend_buffer_type_t) -> bool {
    !buft.is_null()
        && REGISTRY.get().is_some_and(|r| {
            r.devices
                .iter()
                // SAFETY: devices this plugin made.
                .any(|&d| unsafe { device_ctx(d) }.buffer_type == buft)
        })
}

/// What a ggml buffer type of this plugin points at.
pub(crate) struct BufferTypeCtx {
    /// The device's weight buffer type: buffers come from it (see `weights`).
    pub(crate) tessera: Arc<dyn BufferType>,
    pub(crate) name: CString,
    /// Its buffers may keep weights in the device's own layout (`weights::has_weight_layout`).
    pub(crate) weight_layout: bool,
    /// The meta device whose buffer type this is: `tessera` is then its first device's plain
    /// buffer type, and buffers are staged there until sealed (see `meta_device`).
    pub(crate) meta: Option<&'static MetaCtx>,
}

impl BufferTypeCtx {
    /// The context of `buft` if it is one of this plugin's buffer types.
    ///
    /// # Safety
    /// `buft` is null or a live buffer type.
    pub(crate) unsafe fn of<'a>(
        buft: sys::ggml_backend_buffer_type_t,
    ) -> Option<&'a BufferTypeCtx> {
        if !owns_buffer_type(buft) {
            return None;
        }
        // SAFETY: one of ours, whose context is a `BufferTypeCtx` that is never freed.
        unsafe { Some(&*(*buft).context.cast::<BufferTypeCtx>()) }
    }
}

/// What a ggml buffer of this plugin points at.
pub(crate) struct BufferCtx {
    /// Replaced once, when a meta device's staged buffer is sealed.
    buffer: RwLock<Arc<dyn Buffer>>,
    /// Whole weights written here may be kept in the device's own layout.
    pub(crate) weight_layout: bool,
    /// The address ggml sees as the buffer's start.
    pub(crate) base: usize,
    pub(crate) size: usize,
    /// A buffer of the meta device: its tensors until it is sealed (see `meta_device`).
    pub(crate) stage: Option<Mutex<Stage>>,
    /// The meta device this buffer belongs to (read without the stage's lock).
    pub(crate) meta: Option<&'static MetaCtx>,
}

impl BufferCtx {
    pub(crate) fn new(
        buffer: Arc<dyn Buffer>,
        weight_layout: bool,
        base: usize,
        size: usize,
        meta: Option<&'static MetaCtx>,
    ) -> BufferCtx {
        BufferCtx {
            buffer: RwLock::new(buffer),
            weight_layout,
            base,
            size,
            meta,
            stage: meta.map(|_| Mutex::new(Stage::default())),
        }
    }

    /// The Tessera buffer holding the data now.
    pub(crate) fn buffer(&self) -> Arc<dyn Buffer> {
        self.buffer.read().clone()
    }

    /// Makes `buffer` the one holding the data (its contents already copied there).
    pub(crate) fn replace(&self, buffer: Arc<dyn Buffer>) {
        *self.buffer.write() = buffer;
    }

    /// This context's identity, as the meta device's bookkeeping names buffers.
    pub(crate) fn key(&self) -> usize {
        self as *const BufferCtx as usize
    }

    /// The context of `buffer` if it is one of this plugin's buffers.
    ///
    /// # Safety
    /// `buffer` is null or a live ggml buffer.
    pub(crate) unsafe fn of<'a>(buffer: sys::ggml_backend_buffer_t) -> Option<&'a BufferCtx> {
        // SAFETY: the caller's contract. A buffer of one of our types has a `BufferCtx` context,
        // except ggml's empty stand-in for a zero-byte allocation, whose context is null.
        unsafe {
            let b = buffer.as_ref()?;
            if !owns_buffer_type(b.buft) || b.context.is_null() {
                return None;
            }
            Some(&*b.context.cast::<BufferCtx>())
        }
    }

    /// The byte offset in the Tessera buffer of `len` bytes at `offset` into `tensor`'s data.
    ///
    /// # Safety
    /// `tensor` is a live tensor.
    pub(crate) unsafe fn offset_of(
        &self,
        tensor: *const sys::ggml_tensor,
        offset: usize,
        len: usize,
    ) -> Result<usize, String> {
        // SAFETY: the caller's contract.
        let data = unsafe { (*tensor).data } as usize;
        let at = data
            .checked_sub(self.base)
            .and_then(|o| o.checked_add(offset))
            .filter(|o| o.checked_add(len).is_some_and(|e| e <= self.size));
        at.ok_or_else(|| {
            format!(
                "{len} bytes at offset {offset} of a tensor at {data:#x} fall outside {} \
                 ({} bytes at {:#x})",
                self.buffer().name(),
                self.size,
                self.base
            )
        })
    }
}

/// Buffers freed so far.
static FREED: AtomicU64 = AtomicU64::new(0);

/// How many of this plugin's buffers ggml has freed (translations holding a freed buffer's
/// memory through their bindings are dropped when this changes).
pub(crate) fn freed() -> u64 {
    FREED.load(Ordering::Acquire)
}

/// Counts a buffer ggml has freed.
pub(crate) fn note_freed() {
    FREED.fetch_add(1, Ordering::Release);
}
