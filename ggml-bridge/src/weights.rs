//! Model weights in the device's own layout.
//!
//! A Tessera device may keep weights in a faster layout of its own: the CPU device's weight
//! buffer type repacks quantized matrices into the row groups its kernels read (as ggml's CPU
//! backend repacks into its `CPU_REPACK` buffer type). Buffers of this plugin come from that
//! buffer type, and a whole tensor written into a buffer ggml marked as holding weights
//! (`GGML_BACKEND_BUFFER_USAGE_WEIGHTS`, which llama.cpp sets on its model buffers before loading
//! them) goes through [`tessera::Buffer::set_tensor`], which may repack it. Every other write is a
//! plain one, so caches, compute memory and the tensors of `test-backend-ops` keep ggml's layout.
//!
//! A repacked weight may be read only as the first operand of MUL_MAT, MUL_MAT_ID or GET_ROWS,
//! whole: `supports_op` declines any other read of a weight held by such a buffer (a view of
//! it, another op), so ggml's scheduler runs that op on its own CPU backend, from a copy that
//! [`tessera::Buffer::read`] unpacks. `TESSERA_CPU_REPACK=0` turns repacking off, as ggml's
//! `--no-repack` does.

use crate::objects::BufferCtx;
use crate::sys;
use std::sync::Arc;
use tessera::{Context, DType, Device, TensorDesc};

/// Whether `device` keeps weights in a layout of its own (its weight buffer type is not its
/// plain one).
pub(crate) fn has_weight_layout(device: &dyn Device) -> bool {
    let plain = device.buffer_type();
    let weights = device.weight_buffer_type();
    !std::ptr::addr_eq(Arc::as_ptr(&plain), Arc::as_ptr(&weights))
}

/// The Tessera descriptor of `tensor` when `size` bytes at `offset` are all of it, contiguous,
/// in a Tessera dtype and owning its memory: a write [`tessera::Buffer::set_tensor`] may take.
///
/// # Safety
/// `tensor` is a live ggml tensor.
pub(crate) unsafe fn whole_tensor(
    tensor: *const sys::ggml_tensor,
    offset: usize,
    size: usize,
) -> Option<TensorDesc> {
    if offset != 0 {
        return None;
    }
    // SAFETY: the caller's contract.
    unsafe { describe(tensor) }.filter(|d| d.nbytes() == size)
}

/// The Tessera descriptor of `tensor`, named as ggml names it, when it owns its memory (no
/// view, no op), is contiguous and has a Tessera dtype.
///
/// # Safety
/// `tensor` is a live ggml tensor.
pub(crate) unsafe fn describe(tensor: *const sys::ggml_tensor) -> Option<TensorDesc> {
    // SAFETY: the caller's contract.
    let t = unsafe { &*tensor };
    if t.op != sys::ggml_op_GGML_OP_NONE {
        return None;
    }
    // SAFETY: as above.
    unsafe { describe_memory(tensor) }
}

/// The Tessera descriptor of the memory `tensor` owns (no view; an op's result too), named as
/// ggml names it, when it is contiguous and has a Tessera dtype.
///
/// # Safety
/// `tensor` is a live ggml tensor.
pub(crate) unsafe fn describe_memory(tensor: *const sys::ggml_tensor) -> Option<TensorDesc> {
    // SAFETY: the caller's contract.
    let t = unsafe { &*tensor };
    if !t.view_src.is_null() {
        return None;
    }
    let mut ne = [0usize; 4];
    for (d, &n) in ne.iter_mut().zip(&t.ne) {
        *d = usize::try_from(n).ok()?;
    }
    let dtype = match DType::from_ggml_type_id(t.type_) {
        Some(d) => d,
        // Row indices of SET_ROWS: read as pairs of i32 (see `translate`).
        None if t.type_ == sys::ggml_type_GGML_TYPE_I64 => {
            if t.nb != tessera_core::tensor::contiguous_strides(DType::I32, ne).map(|b| b * 2) {
                return None;
            }
            ne[0] = ne[0].checked_mul(2)?;
            DType::I32
        }
        None => return None,
    };
    if t.nb != tessera_core::tensor::contiguous_strides(dtype, ne)
        && t.type_ != sys::ggml_type_GGML_TYPE_I64
    {
        return None;
    }
    let mut ctx = Context::new();
    let id = ctx.new_tensor(dtype, ne).ok()?;
    // SAFETY: ggml's names are NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(t.name.as_ptr()) };
    ctx.set_name(id, name.to_string_lossy()).ok()?;
    Some(ctx.tensors()[id.index()].clone())
}

/// Whether a kernel that knows a device's weight layout reads source `i` of an `op` node: the
/// first operand of MUL_MAT, MUL_MAT_ID and GET_ROWS, itself and not a view of it.
pub(crate) fn reads_weight_layout(op: sys::ggml_op, i: usize, is_view: bool) -> bool {
    i == 0
        && !is_view
        && matches!(
            op,
            sys::ggml_op_GGML_OP_MUL_MAT
                | sys::ggml_op_GGML_OP_MUL_MAT_ID
                | sys::ggml_op_GGML_OP_GET_ROWS
        )
}

/// Why `op` may not run here: it reads a weight that a buffer of this plugin holds in its
/// device's layout, other than as [`reads_weight_layout`] allows. A view of such a weight is
/// itself declined.
///
/// # Safety
/// `op` is a live tensor whose sources (and their `view_src`) are live.
pub(crate) unsafe fn misread_weight(op: *const sys::ggml_tensor) -> Option<String> {
    // SAFETY: the caller's contract.
    unsafe { misread(op, |owner| held_in_device_layout(owner)) }
}

/// Whether `owner` (a tensor owning its memory) lies in a buffer of this plugin that holds it in
/// its device's layout.
///
/// # Safety
/// `owner` is a live tensor.
pub(crate) unsafe fn held_in_device_layout(owner: &sys::ggml_tensor) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        let len = crate::layout::nbytes(owner);
        BufferCtx::of(owner.buffer).is_some_and(|b| {
            b.weight_layout
                && b.offset_of(owner, 0, len)
                    .is_ok_and(|at| b.buffer().holds_device_layout(at, len))
        })
    }
}

/// [`misread_weight`] with `held` saying which tensors owning memory are in a device layout.
///
/// # Safety
/// As [`misread_weight`].
pub(crate) unsafe fn misread(
    op: *const sys::ggml_tensor,
    held: impl Fn(&sys::ggml_tensor) -> bool,
) -> Option<String> {
    // SAFETY: the caller's contract.
    let t = unsafe { &*op };
    let in_device_layout = |g: *const sys::ggml_tensor| -> bool {
        // SAFETY: the caller's contract covers every source and view source.
        let g = unsafe { &*g };
        let owner = if g.view_src.is_null() {
            g
        } else {
            // SAFETY: as above.
            unsafe { &*g.view_src }
        };
        held(owner)
    };
    if !t.view_src.is_null() && in_device_layout(op) {
        return Some("a view of a weight held in the device's weight layout".into());
    }
    for (i, &s) in t.src.iter().enumerate() {
        if s.is_null() || !in_device_layout(s) {
            continue;
        }
        // SAFETY: a live source.
        let is_view = unsafe { !(*s).view_src.is_null() };
        if !reads_weight_layout(t.op, i, is_view) {
            return Some(format!(
                "source {i} is a weight held in the device's weight layout, which only \
                 MUL_MAT, MUL_MAT_ID and GET_ROWS read (as their first operand, whole)"
            ));
        }
    }
    None
}
