//! Sizes of ggml tensors as ggml computes them.

use crate::sys;
use tessera::DType;

/// Bytes spanned by `t`'s elements (ggml's `ggml_nbytes`).
///
/// # Safety
/// `t` is a live tensor.
pub unsafe fn nbytes(t: *const sys::ggml_tensor) -> usize {
    // SAFETY: the caller's contract.
    let t = unsafe { &*t };
    let Some(dtype) = DType::from_ggml_type_id(t.type_) else {
        return 0;
    };
    let Ok(ne) =
        t.ne.map(usize::try_from)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
    else {
        return 0;
    };
    span(dtype, [ne[0], ne[1], ne[2], ne[3]], t.nb)
}

pub(crate) fn span(dtype: DType, ne: [usize; 4], nb: [usize; 4]) -> usize {
    if ne.contains(&0) {
        return 0;
    }
    // Saturating: an impossible layout spans "everything" and fails every bounds check.
    let blck = dtype.block_size();
    let mut bytes = if blck == 1 {
        dtype
            .type_size()
            .saturating_add((ne[0] - 1).saturating_mul(nb[0]))
    } else {
        (ne[0] / blck).saturating_mul(nb[0])
    };
    for d in 1..4 {
        bytes = bytes.saturating_add((ne[d] - 1).saturating_mul(nb[d]));
    }
    bytes
}
