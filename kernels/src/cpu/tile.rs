//! The contract every tile kernel shares (the generic one, the x86 and aarch64 ones, the packed
//! ones): the weight and activation types, their row sizes, the argument checks, the aligned
//! scratch and the row / column pointers of register tiles.
//! Kernels depend on it and the dispatchers ([`super::matmul`], [`super::repack`]) on the
//! kernels, so no kernel reaches back into a dispatcher.

use super::affine::{
    BLOCK_Q4_1_BYTES, BLOCK_Q5_1_BYTES, BLOCK_Q8_1_BYTES, QK4_1, QK5_1, QK8_1, quantize_row_q8_1,
};
use super::iquant::{BLOCK_IQ4_NL_BYTES, BLOCK_IQ4_XS_BYTES, BLOCK_MXFP4_BYTES, QK_MXFP4, QK4_NL};
use super::kquant::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_0_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, BLOCK_Q8_K_BYTES, QK_K,
    QK5_0, quantize_row_q8_k,
};
use super::lowbit::{BLOCK_Q2_K_BYTES, BLOCK_Q3_K_BYTES};
use super::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES, QK4_0, QK8_0, quantize_row_q8_0};
use tessera_core::DType;

/// Weight element type of a matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// ggml's spelling (`Q4_K`), so names match GGUF and test-backend-ops.
#[allow(non_camel_case_types)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q8_0 blocks (32 elements, 34 bytes).
    Q8_0,
    /// ggml Q4_0 blocks (32 elements, 18 bytes).
    Q4_0,
    /// ggml Q5_0 blocks (32 elements, 22 bytes).
    Q5_0,
    /// ggml Q4_1 blocks (32 elements, 20 bytes).
    Q4_1,
    /// ggml Q5_1 blocks (32 elements, 24 bytes).
    Q5_1,
    /// ggml Q4_K super-blocks (256 elements, 144 bytes).
    Q4_K,
    /// ggml Q5_K super-blocks (256 elements, 176 bytes).
    Q5_K,
    /// ggml Q6_K super-blocks (256 elements, 210 bytes).
    Q6_K,
    /// ggml Q2_K super-blocks (256 elements, 84 bytes).
    Q2_K,
    /// ggml Q3_K super-blocks (256 elements, 110 bytes).
    Q3_K,
    /// ggml IQ4_NL blocks (32 elements, 18 bytes).
    IQ4_NL,
    /// ggml IQ4_XS super-blocks (256 elements, 136 bytes).
    IQ4_XS,
    /// ggml MXFP4 blocks (32 elements, 17 bytes).
    MXFP4,
}

impl WeightType {
    /// The weight type of tensors of dtype `d`, or `None` where the kernels have none.
    pub fn of_dtype(d: DType) -> Option<WeightType> {
        Some(match d {
            DType::F32 => WeightType::F32,
            DType::F16 => WeightType::F16,
            DType::BF16 => WeightType::BF16,
            DType::Q8_0 => WeightType::Q8_0,
            DType::Q4_0 => WeightType::Q4_0,
            DType::Q5_0 => WeightType::Q5_0,
            DType::Q4_1 => WeightType::Q4_1,
            DType::Q5_1 => WeightType::Q5_1,
            DType::Q4_K => WeightType::Q4_K,
            DType::Q5_K => WeightType::Q5_K,
            DType::Q6_K => WeightType::Q6_K,
            DType::Q2_K => WeightType::Q2_K,
            DType::Q3_K => WeightType::Q3_K,
            DType::IQ4_NL => WeightType::IQ4_NL,
            DType::IQ4_XS => WeightType::IQ4_XS,
            DType::MXFP4 => WeightType::MXFP4,
            _ => return None,
        })
    }

    /// All weight types.
    pub const ALL: [WeightType; 16] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q5_0,
        WeightType::Q4_1,
        WeightType::Q5_1,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::IQ4_NL,
        WeightType::IQ4_XS,
        WeightType::MXFP4,
    ];

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => 1,
            WeightType::Q8_0 => QK8_0,
            WeightType::Q4_0 => QK4_0,
            WeightType::Q5_0 => QK5_0,
            WeightType::Q4_1 => QK4_1,
            WeightType::Q5_1 => QK5_1,
            WeightType::IQ4_NL => QK4_NL,
            WeightType::MXFP4 => QK_MXFP4,
            WeightType::Q4_K
            | WeightType::Q5_K
            | WeightType::Q6_K
            | WeightType::Q2_K
            | WeightType::Q3_K
            | WeightType::IQ4_XS => QK_K,
        }
    }

    /// Bytes per element for the float types, 0 for the block types.
    pub fn element_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            _ => 0,
        }
    }

    /// Bytes of one row of `k` elements (`k` must be a multiple of
    /// [`block_elems`](Self::block_elems) for the block types).
    pub fn row_bytes(self, k: usize) -> usize {
        match self {
            WeightType::F32 => k * 4,
            WeightType::F16 | WeightType::BF16 => k * 2,
            WeightType::Q8_0 => k / QK8_0 * BLOCK_Q8_0_BYTES,
            WeightType::Q4_0 => k / QK4_0 * BLOCK_Q4_0_BYTES,
            WeightType::Q5_0 => k / QK5_0 * BLOCK_Q5_0_BYTES,
            WeightType::Q4_1 => k / QK4_1 * BLOCK_Q4_1_BYTES,
            WeightType::Q5_1 => k / QK5_1 * BLOCK_Q5_1_BYTES,
            WeightType::Q4_K => k / QK_K * BLOCK_Q4_K_BYTES,
            WeightType::Q5_K => k / QK_K * BLOCK_Q5_K_BYTES,
            WeightType::Q6_K => k / QK_K * BLOCK_Q6_K_BYTES,
            WeightType::Q2_K => k / QK_K * BLOCK_Q2_K_BYTES,
            WeightType::Q3_K => k / QK_K * BLOCK_Q3_K_BYTES,
            WeightType::IQ4_XS => k / QK_K * BLOCK_IQ4_XS_BYTES,
            WeightType::IQ4_NL => k / QK4_NL * BLOCK_IQ4_NL_BYTES,
            WeightType::MXFP4 => k / QK_MXFP4 * BLOCK_MXFP4_BYTES,
        }
    }

    /// Whether this is a block-quantized type.
    pub fn is_quantized(self) -> bool {
        !matches!(self, WeightType::F32 | WeightType::F16 | WeightType::BF16)
    }
}

/// The form the activations must be in for a weight type: F32 for
/// F32/F16/BF16 weights, Q8_0 for Q8_0/Q4_0/Q5_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for
/// the K-quants and IQ4_XS (as ggml's `vec_dot_type`).
// ggml's spelling (`Q8_K`), so names match GGUF and test-backend-ops.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActType {
    /// f32, little-endian.
    F32,
    /// Q8_0 blocks.
    Q8_0,
    /// Q8_1 blocks (Q8_0 plus the scaled block sum the affine weights' minimum multiplies).
    Q8_1,
    /// Q8_K super-blocks.
    Q8_K,
}

/// The activation form the kernels for weight type `w` expect.
pub fn act_type(w: WeightType) -> ActType {
    match w {
        WeightType::F32 | WeightType::F16 | WeightType::BF16 => ActType::F32,
        WeightType::Q8_0
        | WeightType::Q4_0
        | WeightType::Q5_0
        | WeightType::IQ4_NL
        | WeightType::MXFP4 => ActType::Q8_0,
        WeightType::Q4_1 | WeightType::Q5_1 => ActType::Q8_1,
        WeightType::Q4_K
        | WeightType::Q5_K
        | WeightType::Q6_K
        | WeightType::Q2_K
        | WeightType::Q3_K
        | WeightType::IQ4_XS => ActType::Q8_K,
    }
}

/// Bytes of one activation column of `k` elements in form `a`
/// (`k * 4`, `k / 32 * 34`, `k / 32 * 36`, or `k / 256 * 292`).
pub fn act_row_bytes(a: ActType, k: usize) -> usize {
    match a {
        ActType::F32 => k * 4,
        ActType::Q8_0 => k / QK8_0 * BLOCK_Q8_0_BYTES,
        ActType::Q8_1 => k / QK8_1 * BLOCK_Q8_1_BYTES,
        ActType::Q8_K => k / QK_K * BLOCK_Q8_K_BYTES,
    }
}

/// Converts one activation column (`src`, f32, `k` elements) into form `a`
/// in `dst` (length [`act_row_bytes`]). Q8_0, Q8_1 and Q8_K use the reference
/// quantizers (bit-exact with ggml's `quantize_row_q8_0_ref` /
/// `quantize_row_q8_1_ref` / `quantize_row_q8_K_ref`).
///
/// # Panics
/// If `dst.len() != act_row_bytes(a, src.len())`, or for Q8_0 / Q8_1 / Q8_K if
/// `src.len()` is not a multiple of 32 / 32 / 256.
pub fn prepare_act(a: ActType, src: &[f32], dst: &mut [u8]) {
    match a {
        ActType::F32 => {
            assert_eq!(dst.len(), src.len() * 4, "prepare_act: dst length");
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        ActType::Q8_0 => quantize_row_q8_0(src, dst),
        ActType::Q8_1 => quantize_row_q8_1(src, dst),
        ActType::Q8_K => quantize_row_q8_k(src, dst),
    }
}

fn span(count: usize, stride: usize, last: usize) -> Option<usize> {
    if count == 0 {
        return Some(0);
    }
    (count - 1).checked_mul(stride)?.checked_add(last)
}

/// Checks the arguments of a tile matmul; panics with a message if they are
/// inconsistent.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_tile_args(
    wt: WeightType,
    w: &[u8],
    w_stride: usize,
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &[f32],
    ldo: usize,
) {
    assert!(
        k.is_multiple_of(wt.block_elems()),
        "mul_mat_tile: k = {k} is not a multiple of the {wt:?} block size"
    );
    if rows == 0 || cols == 0 {
        return;
    }
    let wrow = wt.row_bytes(k);
    let xrow = act_row_bytes(act_type(wt), k);
    assert!(
        rows == 1 || w_stride >= wrow,
        "mul_mat_tile: w_stride {w_stride} < row bytes {wrow}"
    );
    assert!(
        span(rows, w_stride, wrow).is_some_and(|n| n <= w.len()),
        "mul_mat_tile: w too short"
    );
    assert!(
        cols == 1 || x_stride >= xrow,
        "mul_mat_tile: x_stride {x_stride} < column bytes {xrow}"
    );
    assert!(
        span(cols, x_stride, xrow).is_some_and(|n| n <= x.len()),
        "mul_mat_tile: x too short"
    );
    assert!(
        cols == 1 || ldo >= rows,
        "mul_mat_tile: ldo {ldo} < rows {rows}"
    );
    assert!(
        span(cols, ldo, rows).is_some_and(|n| n <= out.len()),
        "mul_mat_tile: out too short"
    );
}

/// Returns a 64-byte aligned `f32` region of `n` elements inside `scratch`,
/// growing it as needed.
pub(crate) fn scratch_f32(scratch: &mut Vec<u8>, n: usize) -> &mut [f32] {
    let need = n * 4 + 64;
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let off = scratch.as_ptr().align_offset(64).min(63) & !3;
    bytemuck::cast_slice_mut(&mut scratch[off..off + n * 4])
}

/// Pointers to rows `r0..r0 + R`, clamped to the last row (the extra rows'
/// results are discarded).
pub(crate) fn row_ptrs<const R: usize>(
    w: &[u8],
    stride: usize,
    rows: usize,
    r0: usize,
) -> [*const u8; R] {
    std::array::from_fn(|i| w[(r0 + i).min(rows - 1) * stride..].as_ptr())
}

/// Pointers to columns `c0..c0 + C` (all must exist).
pub(crate) fn col_ptrs<const C: usize>(x: &[u8], stride: usize, c0: usize) -> [*const u8; C] {
    std::array::from_fn(|j| x[(c0 + j) * stride..].as_ptr())
}

/// Writes `res[i][j]` to `out[(c0 + j) * ldo + r0 + i]` for the rows that exist.
pub(crate) fn store<const R: usize, const C: usize>(
    out: &mut [f32],
    ldo: usize,
    rows: usize,
    r0: usize,
    c0: usize,
    res: &[[f32; C]; R],
) {
    for (i, row) in res.iter().enumerate() {
        let r = r0 + i;
        if r >= rows {
            break;
        }
        for (j, v) in row.iter().enumerate() {
            out[(c0 + j) * ldo + r] = *v;
        }
    }
}
