//! Buffer types and buffers: a ggml buffer of this plugin is a Tessera buffer behind an address
//! range of its own. ggml places tensors at `base + offset` and hands the addresses back; the
//! plugin turns them into offsets. The buffers are not host memory to ggml (`is_host` false), so
//! ggml never dereferences those addresses: every access comes through the functions below.

use crate::ggml::{self, Level};
use crate::objects::{BufferCtx, BufferTypeCtx};
use crate::sys;
use std::ffi::{CString, c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera::{Buffer, Device};

/// Next free address of the ranges handed to ggml as buffer bases: never dereferenced, only
/// distinct, aligned and above the null page.
static NEXT_BASE: AtomicUsize = AtomicUsize::new(1 << 40);
const BASE_ALIGN: usize = 1 << 16;

/// The buffer type of `device` (ggml device `dev`), leaked: ggml keeps it for the process's
/// lifetime.
pub(crate) fn new_buffer_type(
    dev: sys::ggml_backend_dev_t,
    device: Arc<dyn Device>,
) -> *mut sys::ggml_backend_buffer_type {
    // Buffers come from the weight buffer type: it writes like the plain one, and may keep a
    // whole weight in the device's layout when the plugin asks (see `weights`).
    let tessera = device.weight_buffer_type();
    let ctx = Box::into_raw(Box::new(BufferTypeCtx {
        name: CString::new(format!("Tessera{}", tessera.name()).replace('\0', " "))
            .unwrap_or_default(),
        weight_layout: crate::weights::has_weight_layout(device.as_ref()),
        tessera,
        meta: None,
    }));
    Box::into_raw(Box::new(sys::ggml_backend_buffer_type {
        iface: BUFFER_TYPE_IFACE,
        device: dev,
        context: ctx.cast(),
    }))
}

/// The buffer type of the meta device `meta` (ggml device `dev`), leaked: buffers are staged in
/// its first device's memory until sealed (see `meta_device`).
pub(crate) fn new_meta_buffer_type(
    dev: sys::ggml_backend_dev_t,
    meta: &'static crate::objects::MetaCtx,
) -> *mut sys::ggml_backend_buffer_type {
    let ctx = Box::into_raw(Box::new(BufferTypeCtx {
        name: CString::new(format!("Tessera{}", meta.device.name()).replace('\0', " "))
            .unwrap_or_default(),
        weight_layout: false,
        tessera: meta.device.devices()[0].buffer_type(),
        meta: Some(meta),
    }));
    Box::into_raw(Box::new(sys::ggml_backend_buffer_type {
        iface: BUFFER_TYPE_IFACE,
        device: dev,
        context: ctx.cast(),
    }))
}

const BUFFER_TYPE_IFACE: sys::ggml_backend_buffer_type_i = sys::ggml_backend_buffer_type_i {
    get_name: Some(buft_get_name),
    alloc_buffer: Some(buft_alloc_buffer),
    get_alignment: Some(buft_get_alignment),
    get_max_size: Some(buft_get_max_size),
    get_alloc_size: None,
    is_host: Some(buft_is_host),
};

/// The context of one of our buffer types (ggml calls these only on them).
///
/// # Safety
/// `buft` is one of this plugin's buffer types.
unsafe fn buft_ctx<'a>(buft: sys::ggml_backend_buffer_type_t) -> &'a BufferTypeCtx {
    // SAFETY: the caller's contract.
    unsafe { &*(*buft).context.cast::<BufferTypeCtx>() }
}

unsafe extern "C" fn buft_get_name(buft: sys::ggml_backend_buffer_type_t) -> *const c_char {
    crate::ggml::guard("buft_get_name", std::ptr::null(), || {
        // SAFETY: ggml calls it on our buffer type.
        unsafe { buft_ctx(buft) }.name.as_ptr()
    })
}

unsafe extern "C" fn buft_alloc_buffer(
    buft: sys::ggml_backend_buffer_type_t,
    size: usize,
) -> sys::ggml_backend_buffer_t {
    crate::ggml::guard("buft_alloc_buffer", std::ptr::null_mut(), || {
        // SAFETY: as above.
        let ctx = unsafe { buft_ctx(buft) };
        let Some(api) = ggml::api() else {
            return std::ptr::null_mut();
        };
        let buffer = match ctx.tessera.alloc(size) {
            Ok(b) => b,
            Err(e) => {
                ggml::log(Level::Error, &format!("allocating {size} bytes: {e}"));
                return std::ptr::null_mut();
            }
        };
        let span = size.div_ceil(BASE_ALIGN).saturating_add(1) * BASE_ALIGN;
        let base = NEXT_BASE.fetch_add(span, Ordering::Relaxed);
        let bctx = Box::into_raw(Box::new(BufferCtx::new(
            buffer,
            ctx.weight_layout,
            base,
            size,
            ctx.meta,
        )));
        // SAFETY: `buft` is live; BUFFER_IFACE's functions take a `BufferCtx` context, which ggml
        // hands back to `free_buffer` exactly once.
        let b = unsafe { api.buffer_init(buft, BUFFER_IFACE, bctx.cast(), size) };
        if b.is_null() {
            // SAFETY: ggml did not take the context.
            drop(unsafe { Box::from_raw(bctx) });
        } else if let Some(meta) = ctx.meta {
            // SAFETY: ggml owns the context now and frees it only through `buf_free`.
            let bctx = unsafe { &*bctx };
            if let Some(stage) = &bctx.stage {
                stage.lock().ggml = b as usize;
            }
            meta.add_pending(bctx.key());
        }
        b
    })
}

unsafe extern "C" fn buft_get_alignment(buft: sys::ggml_backend_buffer_type_t) -> usize {
    crate::ggml::guard("buft_get_alignment", 0, || {
        // SAFETY: ggml calls it on our buffer type.
        unsafe { buft_ctx(buft) }.tessera.alignment().max(1)
    })
}

unsafe extern "C" fn buft_get_max_size(buft: sys::ggml_backend_buffer_type_t) -> usize {
    crate::ggml::guard("buft_get_max_size", 0, || {
        // SAFETY: as above.
        unsafe { buft_ctx(buft) }.tessera.max_size()
    })
}

unsafe extern "C" fn buft_is_host(_: sys::ggml_backend_buffer_type_t) -> bool {
    crate::ggml::guard("buft_is_host", false, || false)
}

const BUFFER_IFACE: sys::ggml_backend_buffer_i = sys::ggml_backend_buffer_i {
    free_buffer: Some(buf_free),
    get_base: Some(buf_get_base),
    init_tensor: Some(buf_init_tensor),
    memset_tensor: Some(buf_memset_tensor),
    set_tensor: Some(buf_set_tensor),
    get_tensor: Some(buf_get_tensor),
    set_tensor_2d: None,
    get_tensor_2d: None,
    cpy_tensor: Some(buf_cpy_tensor),
    clear: Some(buf_clear),
    reset: None,
};

/// The context of one of our buffers (ggml calls these only on them).
///
/// # Safety
/// `buffer` is one of this plugin's buffers.
unsafe fn buf_ctx<'a>(buffer: sys::ggml_backend_buffer_t) -> &'a BufferCtx {
    // SAFETY: the caller's contract.
    unsafe { &*(*buffer).context.cast::<BufferCtx>() }
}

/// Runs a buffer access, logging its error: ggml's buffer functions return nothing.
fn report(what: &str, r: Result<(), String>) {
    if let Err(e) = r {
        ggml::log(Level::Error, &format!("{what}: {e}"));
    }
}

unsafe extern "C" fn buf_free(buffer: sys::ggml_backend_buffer_t) {
    crate::ggml::guard("buf_free", (), || {
        // SAFETY: ggml frees each buffer once; its context is the box `buft_alloc_buffer` made.
        let ctx = unsafe { Box::from_raw((*buffer).context.cast::<BufferCtx>()) };
        if let Some(meta) = ctx.meta {
            meta.forget(ctx.key());
        }
        drop(ctx);
        crate::objects::note_freed();
    })
}

unsafe extern "C" fn buf_init_tensor(
    buffer: sys::ggml_backend_buffer_t,
    tensor: *mut sys::ggml_tensor,
) -> sys::ggml_status {
    crate::ggml::guard(
        "buf_init_tensor",
        sys::ggml_status_GGML_STATUS_FAILED,
        || {
            // SAFETY: ggml passes our buffer and a tensor it just placed there.
            unsafe { crate::meta_device::record(buf_ctx(buffer), tensor) };
            sys::ggml_status_GGML_STATUS_SUCCESS
        },
    )
}

/// For a buffer of the meta device: ggml wrote `len` bytes at `at`.
pub(crate) fn rewritten(ctx: &BufferCtx, at: usize, len: usize) {
    if let Some(meta) = ctx.meta {
        meta.rewritten(ctx.key(), at, at + len);
    }
}

/// For a buffer of the meta device: an error if `len` bytes at `at` are a node's value the
/// meta device did not write back.
pub(crate) fn check_read(ctx: &BufferCtx, at: usize, len: usize) -> Result<(), String> {
    match ctx.meta {
        Some(meta) => meta.check_read(ctx.key(), at, at + len),
        None => Ok(()),
    }
}

unsafe extern "C" fn buf_get_base(buffer: sys::ggml_backend_buffer_t) -> *mut c_void {
    crate::ggml::guard("buf_get_base", std::ptr::null_mut(), || {
        // SAFETY: ggml calls it on our buffer.
        unsafe { buf_ctx(buffer) }.base as *mut c_void
    })
}

unsafe extern "C" fn buf_memset_tensor(
    buffer: sys::ggml_backend_buffer_t,
    tensor: *mut sys::ggml_tensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    crate::ggml::guard("buf_memset_tensor", (), || {
        // SAFETY: ggml passes our buffer and a tensor in it.
        let ctx = unsafe { buf_ctx(buffer) };
        // SAFETY: as above.
        let r = unsafe { ctx.offset_of(tensor, offset, size) }.and_then(|at| {
            ctx.buffer()
                .memset(at, size, value)
                .map_err(|e| e.to_string())?;
            rewritten(ctx, at, size);
            Ok(())
        });
        report("memset_tensor", r);
    })
}

pub(crate) unsafe extern "C" fn buf_set_tensor(
    buffer: sys::ggml_backend_buffer_t,
    tensor: *mut sys::ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    crate::ggml::guard("buf_set_tensor", (), || {
        if size == 0 {
            return;
        }
        // SAFETY: ggml passes our buffer, a tensor in it and `size` readable bytes at `data`.
        let (ctx, src) = unsafe {
            (
                buf_ctx(buffer),
                std::slice::from_raw_parts(data.cast::<u8>(), size),
            )
        };
        // A whole weight loaded into a buffer ggml marked as holding weights may be kept in
        // the device's layout; anything else is written as it is.
        // SAFETY: ggml passes a live buffer and tensor.
        let weight = unsafe {
            let marked =
                (*buffer).usage == sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
            (ctx.weight_layout && marked)
                .then(|| crate::weights::whole_tensor(tensor, offset, size))
                .flatten()
        };
        // SAFETY: as above.
        let r = unsafe { ctx.offset_of(tensor, offset, size) }.and_then(|at| {
            let buffer = ctx.buffer();
            match &weight {
                Some(desc) => buffer.set_tensor(desc, at, src),
                None => buffer.write(at, src),
            }
            .map_err(|e| e.to_string())?;
            rewritten(ctx, at, size);
            Ok(())
        });
        report("set_tensor", r);
    })
}

pub(crate) unsafe extern "C" fn buf_get_tensor(
    buffer: sys::ggml_backend_buffer_t,
    tensor: *const sys::ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    crate::ggml::guard("buf_get_tensor", (), || {
        if size == 0 {
            return;
        }
        // SAFETY: ggml passes our buffer, a tensor in it and `size` writable bytes at `data`.
        let (ctx, dst) = unsafe {
            (
                buf_ctx(buffer),
                std::slice::from_raw_parts_mut(data.cast::<u8>(), size),
            )
        };
        // SAFETY: as above.
        let r = unsafe { ctx.offset_of(tensor, offset, size) }.and_then(|at| {
            check_read(ctx, at, size)?;
            ctx.buffer().read(at, dst).map_err(|e| e.to_string())
        });
        if r.is_err() {
            // ggml's get has no failure value: NaNs, not whatever `dst` held, reach the reader.
            dst.fill(0xff);
        }
        report("get_tensor", r);
    })
}

unsafe extern "C" fn buf_cpy_tensor(
    buffer: sys::ggml_backend_buffer_t,
    src: *const sys::ggml_tensor,
    dst: *mut sys::ggml_tensor,
) -> bool {
    crate::ggml::guard("buf_cpy_tensor", false, || {
        // SAFETY: ggml passes our buffer (holding `dst`) and live tensors; `src`'s buffer may be
        // anyone's, and only ours are used.
        unsafe {
            let Some(from) = BufferCtx::of((*src).buffer) else {
                return false;
            };
            let to = buf_ctx(buffer);
            let len = crate::layout::nbytes(src);
            let r = from.offset_of(src, 0, len).and_then(|so| {
                let doff = to.offset_of(dst, 0, len)?;
                check_read(from, so, len)?;
                tessera_core::backend::copy_between(
                    from.buffer().as_ref(),
                    so,
                    to.buffer().as_ref(),
                    doff,
                    len,
                )
                .map_err(|e| e.to_string())?;
                rewritten(to, doff, len);
                Ok(())
            });
            let ok = r.is_ok();
            report("cpy_tensor", r);
            ok
        }
    })
}

unsafe extern "C" fn buf_clear(buffer: sys::ggml_backend_buffer_t, value: u8) {
    crate::ggml::guard("buf_clear", (), || {
        // SAFETY: ggml calls it on our buffer.
        let ctx = unsafe { buf_ctx(buffer) };
        let buffer = ctx.buffer();
        // A meta buffer is cleared tensor by tensor: each is split on its own.
        let r = match buffer.as_any().downcast_ref::<tessera::meta::MetaBuffer>() {
            Some(mb) => mb
                .placements()
                .iter()
                .filter(|p| p.window_of.is_none())
                .try_for_each(|p| mb.memset(p.offset, p.desc.nbytes(), value)),
            None => buffer.memset(0, ctx.size, value),
        };
        if r.is_ok() {
            rewritten(ctx, 0, ctx.size);
        }
        report("clear", r.map_err(|e| e.to_string()));
    })
}
