//! aarch64 SIMD kernels (NEON, dotprod, i8mm) and the safe wrappers the dispatchers call.
//!
//! With `x86`, one of the two modules of the crate's kernels that contain `unsafe` code. Every
//! wrapper here clamps the requested [`Isa`] to the detected one and relies on the bounds
//! `check_tile_args` (or the dot dispatchers) checked before: each weight row holds `k /
//! block_elems` blocks and each activation column as many activation blocks.
//!
//! | weight | Neon | Dotprod | I8mm |
//! |---|---|---|---|
//! | Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4 | `smull` + `sadalp` | `sdot` | `smmla` 2×2 tiles, `sdot` for an odd column |
//! | Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS | levels decoded once per super-block and row, `smull` + `sadalp` per column | same, `sdot` | as Dotprod |
//! | F32, F16, BF16 | `fmla` dot per row and column (`half`'s `fcvtl` conversion), `gemm` from 8 columns | same | same |
//! | packed Q8_0, Q4_0, IQ4_NL ([`packed`]) | (not packed) | 4 × 4 layout: `sdot` by element, four rows per lane set | 4 × 8 layout: `smmla` 4 rows × 2 columns, `sdot` for an odd column |
//! | packed Q4_K ([`packed`]) | (not packed) | 4 × 4 layout: `sdot` by element, scales unpacked for four rows at once | same (4 × 4) |
#![allow(unsafe_code)]

mod neon;
pub(crate) mod packed;

use neon::{
    B_IQ4_NL, B_MXFP4, B_Q4_0, B_Q4_1, B_Q5_0, B_Q5_1, B_Q8_0, Decoded, K_IQ4_XS, K_Q2_K, K_Q3_K,
    K_Q4_K, K_Q5_K, K_Q6_K, Q8K_BYTES, act_bytes, block_bytes, k_block_bytes,
};

use super::features::Isa;
use super::float_gemm;
use super::generic;
use super::tile::{WeightType, check_tile_args, col_ptrs, row_ptrs, scratch_f32, store};

/// From this many columns on, float tiles go through `gemm`.
const GEMM_MIN_COLS: usize = 8;

/// The kernel level for `isa` on this CPU, or `None` for the scalar code.
fn level(isa: Isa) -> Option<Isa> {
    match isa.clamp_to_supported() {
        Isa::Scalar => None,
        l => Some(l),
    }
}

/// Dot product of the first `min(a.len(), b.len())` elements.
pub(crate) fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    match level(isa) {
        // SAFETY: both slices hold `n` f32; NEON is baseline on aarch64.
        Some(_) => unsafe { neon::dot_f32(a.as_ptr(), b.as_ptr(), n) },
        None => generic::dot_f32(a, b),
    }
}

/// Dot product of a quantized weight row with its activation row (of [`super::tile::act_type`])
/// over the whole blocks both hold; `scalar` is the portable kernel for the scalar level.
pub(crate) fn vec_dot(
    isa: Isa,
    wt: WeightType,
    x: &[u8],
    y: &[u8],
    scalar: fn(&[u8], &[u8]) -> f32,
) -> f32 {
    let Some(l) = level(isa) else {
        return scalar(x, y);
    };
    let dot = l >= Isa::Dotprod;
    macro_rules! q32 {
        ($kind:ident) => {{
            let nb = (x.len() / block_bytes($kind)).min(y.len() / act_bytes($kind));
            // SAFETY: `x` and `y` hold `nb` blocks each; `sdot` only on a dotprod CPU.
            unsafe {
                if dot {
                    row_dot::<$kind, true>(x.as_ptr(), y.as_ptr(), nb)
                } else {
                    row_dot::<$kind, false>(x.as_ptr(), y.as_ptr(), nb)
                }
            }
        }};
    }
    macro_rules! k256 {
        ($kind:ident) => {{
            let nb = (x.len() / k_block_bytes($kind)).min(y.len() / Q8K_BYTES);
            let mut out = [0f32];
            // SAFETY: `x` and `y` hold `nb` super-blocks each; `sdot` only on a dotprod CPU.
            unsafe { k_row_at::<$kind>(dot, x.as_ptr(), &[y.as_ptr()], nb, &mut out) };
            out[0]
        }};
    }
    match wt {
        WeightType::Q8_0 => q32!(B_Q8_0),
        WeightType::Q4_0 => q32!(B_Q4_0),
        WeightType::Q5_0 => q32!(B_Q5_0),
        WeightType::Q4_1 => q32!(B_Q4_1),
        WeightType::Q5_1 => q32!(B_Q5_1),
        WeightType::IQ4_NL => q32!(B_IQ4_NL),
        WeightType::MXFP4 => q32!(B_MXFP4),
        WeightType::Q4_K => k256!(K_Q4_K),
        WeightType::Q5_K => k256!(K_Q5_K),
        WeightType::Q6_K => k256!(K_Q6_K),
        WeightType::Q2_K => k256!(K_Q2_K),
        WeightType::Q3_K => k256!(K_Q3_K),
        WeightType::IQ4_XS => k256!(K_IQ4_XS),
        WeightType::F32 | WeightType::F16 | WeightType::BF16 => scalar(x, y),
    }
}

/// One row of a 32-element format against one column (kept out of line: one call per row, and
/// one symbol per format and level for disassembly).
///
/// # Safety
/// As [`neon::q_tile`] with one row and one column.
#[inline(never)]
unsafe fn row_dot<const KIND: u8, const DOT: bool>(x: *const u8, y: *const u8, nb: usize) -> f32 {
    // SAFETY: the caller's guarantees.
    unsafe { neon::q_tile::<KIND, DOT, 1, 1>(&[x], &[y], nb)[0][0] }
}

/// One weight row of a super-block format against `ys.len()` Q8_K columns over `nb`
/// super-blocks: with one column the levels are decoded in registers on the way; with several,
/// each super-block is decoded once into a buffer that serves every column.
///
/// # Safety
/// `w` must hold `nb` super-blocks and every column `nb` Q8_K super-blocks; with `DOT` the CPU
/// must have the dot-product extension.
#[inline(never)]
unsafe fn k_row<const KIND: u8, const DOT: bool>(
    w: *const u8,
    ys: &[*const u8],
    nb: usize,
    out: &mut [f32],
) {
    let mut blk = Decoded::new();
    if let ([y], [o]) = (ys, &mut *out) {
        let mut sum = 0f32;
        for b in 0..nb {
            // SAFETY: the caller's guarantees.
            unsafe {
                let wb = w.add(b * k_block_bytes(KIND));
                neon::header_k::<KIND>(wb, &mut blk);
                sum += neon::dot_k_fused::<KIND, DOT>(wb, &blk, y.add(b * Q8K_BYTES));
            }
        }
        *o = sum;
        return;
    }
    out.fill(0.0);
    for b in 0..nb {
        // SAFETY: the caller's guarantees.
        unsafe {
            neon::decode_k::<KIND>(w.add(b * k_block_bytes(KIND)), &mut blk);
            for (o, y) in out.iter_mut().zip(ys) {
                *o += neon::dot_k::<DOT>(&blk, y.add(b * Q8K_BYTES));
            }
        }
    }
}

/// [`k_row`] at the level `dot` says.
///
/// # Safety
/// As [`k_row`], with `dot` only on a CPU with the dot-product extension.
unsafe fn k_row_at<const KIND: u8>(
    dot: bool,
    w: *const u8,
    ys: &[*const u8],
    nb: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's guarantees.
    unsafe {
        if dot {
            k_row::<KIND, true>(w, ys, nb, out)
        } else {
            k_row::<KIND, false>(w, ys, nb, out)
        }
    }
}

/// SIMD tile matmul (see [`crate::cpu::mul_mat_tile`]); the scalar kernels when `isa` is
/// [`Isa::Scalar`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_mat_tile(
    isa: Isa,
    wt: WeightType,
    w: &[u8],
    w_stride: usize,
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
    scratch: &mut Vec<u8>,
) {
    check_tile_args(wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo);
    let level = level(isa);
    let (Some(l), false) = (level, rows == 0 || cols == 0 || k == 0) else {
        return generic::mul_mat_tile(
            wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        );
    };
    let t = Tile {
        w,
        w_stride,
        rows,
        x,
        x_stride,
        cols,
        k,
    };
    match wt {
        WeightType::F32 | WeightType::F16 | WeightType::BF16 if cols >= GEMM_MIN_COLS => {
            float_gemm::gemm_tile(
                &convert_row,
                wt,
                w,
                w_stride,
                rows,
                x,
                x_stride,
                cols,
                k,
                out,
                ldo,
                scratch,
            )
        }
        WeightType::F32 | WeightType::F16 | WeightType::BF16 => {
            float_small(&t, wt, out, ldo, scratch)
        }
        WeightType::Q8_0 => quant_tile::<B_Q8_0>(&t, l, out, ldo),
        WeightType::Q4_0 => quant_tile::<B_Q4_0>(&t, l, out, ldo),
        WeightType::Q5_0 => quant_tile::<B_Q5_0>(&t, l, out, ldo),
        WeightType::Q4_1 => quant_tile::<B_Q4_1>(&t, l, out, ldo),
        WeightType::Q5_1 => quant_tile::<B_Q5_1>(&t, l, out, ldo),
        WeightType::IQ4_NL => quant_tile::<B_IQ4_NL>(&t, l, out, ldo),
        WeightType::MXFP4 => quant_tile::<B_MXFP4>(&t, l, out, ldo),
        WeightType::Q4_K => kquant_tile::<K_Q4_K>(&t, l, out, ldo),
        WeightType::Q5_K => kquant_tile::<K_Q5_K>(&t, l, out, ldo),
        WeightType::Q6_K => kquant_tile::<K_Q6_K>(&t, l, out, ldo),
        WeightType::Q2_K => kquant_tile::<K_Q2_K>(&t, l, out, ldo),
        WeightType::Q3_K => kquant_tile::<K_Q3_K>(&t, l, out, ldo),
        WeightType::IQ4_XS => kquant_tile::<K_IQ4_XS>(&t, l, out, ldo),
    }
}

/// The operands of one tile (checked by `check_tile_args`, none of the sizes zero).
struct Tile<'a> {
    w: &'a [u8],
    w_stride: usize,
    rows: usize,
    x: &'a [u8],
    x_stride: usize,
    cols: usize,
    k: usize,
}

/// Decodes one float-type weight row into f32 (`half` converts with the CPU's `fcvtl` where
/// it has FP16).
fn convert_row(wt: WeightType, src: &[u8], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let n = dst.len().min(src.len() / wt.element_bytes().max(1));
    match wt {
        WeightType::F16 => match bytemuck::try_cast_slice::<u8, half::f16>(&src[..2 * n]) {
            Ok(h) => h.convert_to_f32_slice(&mut dst[..n]),
            Err(_) => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = generic::f16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
                }
            }
        },
        WeightType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
            }
        }
        _ => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
    }
}

/// Float weights, few columns: each weight row converted once, then one NEON dot per column.
fn float_small(t: &Tile, wt: WeightType, out: &mut [f32], ldo: usize, scratch: &mut Vec<u8>) {
    let k = t.k;
    let buf = scratch_f32(scratch, (t.cols + 1) * k);
    let (xs, wbuf) = buf.split_at_mut(t.cols * k);
    for c in 0..t.cols {
        convert_row(
            WeightType::F32,
            &t.x[c * t.x_stride..c * t.x_stride + 4 * k],
            &mut xs[c * k..(c + 1) * k],
        );
    }
    let wrow = wt.row_bytes(k);
    for r in 0..t.rows {
        convert_row(wt, &t.w[r * t.w_stride..r * t.w_stride + wrow], wbuf);
        for c in 0..t.cols {
            let xc = &xs[c * k..(c + 1) * k];
            // SAFETY: both slices hold `k` f32; NEON is baseline on aarch64.
            out[c * ldo + r] = unsafe { neon::dot_f32(wbuf.as_ptr(), xc.as_ptr(), k) };
        }
    }
}

/// A 32-element format: four rows per pass for one column (GEMV), 2×2 `smmla` tiles with i8mm,
/// else 2×2 register tiles. Out of line: one call per tile, one symbol per format.
#[inline(never)]
fn quant_tile<const KIND: u8>(t: &Tile, l: Isa, out: &mut [f32], ldo: usize) {
    let nb = t.k / 32;
    let (w, ws, rows, x, xs) = (t.w, t.w_stride, t.rows, t.x, t.x_stride);
    macro_rules! q {
        ($R:literal, $C:literal, $r0:expr, $c0:expr) => {{
            let (wp, xp) = (row_ptrs::<$R>(w, ws, rows, $r0), col_ptrs::<$C>(x, xs, $c0));
            // SAFETY: every row pointer starts a row of `nb` blocks and every column pointer a
            // column of `nb` activation blocks (check_tile_args); `sdot` only on a dotprod CPU.
            let res = unsafe {
                if l >= Isa::Dotprod {
                    neon::q_tile::<KIND, true, $R, $C>(&wp, &xp, nb)
                } else {
                    neon::q_tile::<KIND, false, $R, $C>(&wp, &xp, nb)
                }
            };
            store(out, ldo, rows, $r0, $c0, &res);
        }};
    }
    if t.cols == 1 {
        for r0 in (0..rows).step_by(4) {
            q!(4, 1, r0, 0);
        }
        return;
    }
    for c0 in (0..t.cols).step_by(2) {
        for r0 in (0..rows).step_by(2) {
            if c0 + 1 == t.cols {
                q!(2, 1, r0, c0);
            } else if l >= Isa::I8mm {
                let (wp, xp) = (row_ptrs::<2>(w, ws, rows, r0), col_ptrs::<2>(x, xs, c0));
                // SAFETY: as above, two rows by two columns; i8mm is supported.
                let res = unsafe { neon::mm_tile::<KIND>(&wp, &xp, nb) };
                store(out, ldo, rows, r0, c0, &res);
            } else {
                q!(2, 2, r0, c0);
            }
        }
    }
}

/// A super-block format: each weight row decoded once per super-block for up to eight columns.
/// Out of line: one call per tile, one symbol per format.
#[inline(never)]
fn kquant_tile<const KIND: u8>(t: &Tile, l: Isa, out: &mut [f32], ldo: usize) {
    let nb = t.k / 256;
    let mut res = [0f32; 8];
    for r in 0..t.rows {
        let wp = t.w[r * t.w_stride..].as_ptr();
        for c0 in (0..t.cols).step_by(8) {
            let n = (t.cols - c0).min(8);
            let ys: [*const u8; 8] =
                std::array::from_fn(|j| t.x[(c0 + j.min(n - 1)) * t.x_stride..].as_ptr());
            // SAFETY: row `r` holds `nb` super-blocks and every column `nb` Q8_K super-blocks
            // (check_tile_args); `sdot` only on a dotprod CPU.
            unsafe { k_row_at::<KIND>(l >= Isa::Dotprod, wp, &ys[..n], nb, &mut res[..n]) };
            for (j, v) in res[..n].iter().enumerate() {
                out[(c0 + j) * ldo + r] = *v;
            }
        }
    }
}
