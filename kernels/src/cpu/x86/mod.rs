//! x86-64 SIMD kernels (AVX2 and AVX-512) and the safe wrappers the
//! dispatchers call.
//!
//! This is the only module of the crate that contains `unsafe` code. Every
//! wrapper here clamps the requested [`Isa`] to the detected one and checks
//! (or re-checks) every bound the unsafe kernels rely on.
#![allow(unsafe_code)]

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod lowbit;
pub(crate) mod packed;

pub(crate) use lowbit::{LB_IQ4_NL, LB_IQ4_XS, LB_MXFP4, LB_Q2_K, LB_Q3_K, vec_dot_lb};

use super::affine::{BLOCK_Q4_1_BYTES, BLOCK_Q5_1_BYTES, BLOCK_Q8_1_BYTES};
use super::features::Isa;
use super::float_gemm;
use super::generic;
use super::kquant::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_0_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, BLOCK_Q8_K_BYTES, QK_K,
};
use super::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES, QK8_0, block_scale};
use super::tile::scratch_f32;
use super::tile::{WeightType, check_tile_args, col_ptrs, row_ptrs, store};

/// Weight type code of the float kernels: f32.
pub(crate) const WT_F32: u8 = 0;
/// Weight type code of the float kernels: f16.
pub(crate) const WT_F16: u8 = 1;
/// Weight type code of the float kernels: bf16.
pub(crate) const WT_BF16: u8 = 2;

/// Block kind of the 32-element kernels: Q8_0 weights.
pub(crate) const KIND_Q8_0: u8 = 0;
/// Block kind of the 32-element kernels: Q4_0 weights.
pub(crate) const KIND_Q4_0: u8 = 1;
/// Block kind of the 32-element kernels: Q5_0 weights.
pub(crate) const KIND_Q5_0: u8 = 2;

/// Block kind of the 32-element kernels: Q4_1 weights (Q8_1 activations).
pub(crate) const KIND_Q4_1: u8 = 3;
/// Block kind of the 32-element kernels: Q5_1 weights (Q8_1 activations).
pub(crate) const KIND_Q5_1: u8 = 4;

/// Bytes per weight block of a 32-element kind.
pub(crate) const fn kind_block_bytes(kind: u8) -> usize {
    match kind {
        KIND_Q4_0 => BLOCK_Q4_0_BYTES,
        KIND_Q5_0 => BLOCK_Q5_0_BYTES,
        KIND_Q4_1 => BLOCK_Q4_1_BYTES,
        KIND_Q5_1 => BLOCK_Q5_1_BYTES,
        _ => BLOCK_Q8_0_BYTES,
    }
}

/// Whether a kind is affine (unsigned levels times `d` plus a minimum `m` at bytes 2..4), so its
/// activations are Q8_1 and each block adds `m·s`.
pub(crate) const fn kind_affine(kind: u8) -> bool {
    matches!(kind, KIND_Q4_1 | KIND_Q5_1)
}

/// Byte offset of the nibbles (Q8_0: the quants) in a weight block of a kind.
pub(crate) const fn kind_qs_at(kind: u8) -> usize {
    match kind {
        KIND_Q5_0 => 6,
        KIND_Q4_1 => 4,
        KIND_Q5_1 => 8,
        _ => 2,
    }
}

/// Byte offset of the fifth bits in a Q5_0 / Q5_1 block.
pub(crate) const fn kind_qh_at(kind: u8) -> usize {
    if kind == KIND_Q5_1 { 4 } else { 2 }
}

/// Bytes per activation block of a kind (Q8_1 for the affine kinds, else Q8_0).
pub(crate) const fn kind_act_bytes(kind: u8) -> usize {
    if kind_affine(kind) {
        BLOCK_Q8_1_BYTES
    } else {
        BLOCK_Q8_0_BYTES
    }
}

/// Byte offset of the quants in an activation block of a kind (after Q8_1's `d` and `s`).
pub(crate) const fn kind_act_qs_at(kind: u8) -> usize {
    if kind_affine(kind) { 4 } else { 2 }
}

/// The offset that turns a kind's signed quants into the unsigned bytes `vpdpbusd` takes (the
/// affine kinds' levels are unsigned already).
pub(crate) const fn kind_offset(kind: u8) -> i32 {
    match kind {
        KIND_Q4_0 => 8,
        KIND_Q5_0 => 16,
        KIND_Q4_1 | KIND_Q5_1 => 0,
        _ => 128,
    }
}

/// From this many columns on, AVX2 float tiles go through `gemm`.
pub(crate) const GEMM_MIN_COLS: usize = 8;

/// Dot product of the first `min(a.len(), b.len())` elements.
pub(crate) fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    match isa.clamp_to_supported() {
        Isa::Avx512 => {
            // SAFETY: AVX-512 is supported (clamped); both slices hold `n` f32.
            unsafe { avx512::dot_f32(a.as_ptr(), b.as_ptr(), n) }
        }
        Isa::Avx2 => {
            // SAFETY: AVX2 is supported (clamped); both slices hold `n` f32.
            unsafe { avx2::dot_f32(a.as_ptr(), b.as_ptr(), n) }
        }
        _ => generic::dot_f32(a, b),
    }
}

/// Dot product of a Q8_0, Q4_0 or Q5_0 row (by `KIND`) with a Q8_0 row, or of a Q4_1 or Q5_1
/// row with a Q8_1 row, over the whole blocks both hold.
pub(crate) fn vec_dot_q<const KIND: u8>(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
    let blk = kind_block_bytes(KIND);
    let nb = (x.len() / blk).min(y.len() / kind_act_bytes(KIND));
    match isa.clamp_to_supported() {
        Isa::Avx512 => {
            // SAFETY: AVX-512 is supported; `x` and `y` hold `nb` blocks each.
            unsafe { avx512::vec_dot_q::<KIND>(x.as_ptr(), y.as_ptr(), nb) }
        }
        Isa::Avx2 => {
            // SAFETY: AVX2 is supported; `x` and `y` hold `nb` blocks each.
            unsafe { avx2::q_tile::<KIND, 1, 1>(&[x.as_ptr()], &[y.as_ptr()], nb)[0][0] }
        }
        _ => match KIND {
            KIND_Q4_0 => generic::vec_dot_q4_0_q8_0(x, y),
            KIND_Q5_0 => generic::vec_dot_q5_0_q8_0(x, y),
            KIND_Q4_1 => generic::vec_dot_affine_q8_1::<false>(x, y),
            KIND_Q5_1 => generic::vec_dot_affine_q8_1::<true>(x, y),
            _ => generic::vec_dot_q8_0_q8_0(x, y),
        },
    }
}

/// Expands `$body` with the const `$C` set to `$cc` (1 to 4).
macro_rules! by_cols {
    ($cc:expr, $C:ident => $body:block) => {
        match $cc {
            1 => {
                const $C: usize = 1;
                $body
            }
            2 => {
                const $C: usize = 2;
                $body
            }
            3 => {
                const $C: usize = 3;
                $body
            }
            _ => {
                const $C: usize = 4;
                $body
            }
        }
    };
}

/// SIMD tile matmul (see [`crate::cpu::mul_mat_tile`]); falls back to the
/// scalar kernels when `isa` is [`Isa::Scalar`].
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
    if rows == 0 || cols == 0 || k == 0 {
        return generic::mul_mat_tile(
            wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        );
    }
    let isa = isa.clamp_to_supported();
    if isa == Isa::Scalar {
        return generic::mul_mat_tile(
            wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        );
    }
    match wt {
        WeightType::F32 | WeightType::F16 | WeightType::BF16
            if isa == Isa::Avx512 && cols >= PANEL_MIN_COLS =>
        {
            match wt {
                WeightType::F32 => {
                    panel_tile::<WT_F32>(w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch)
                }
                WeightType::F16 => {
                    panel_tile::<WT_F16>(w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch)
                }
                _ => panel_tile::<WT_BF16>(
                    w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
                ),
            }
        }
        WeightType::F32 | WeightType::F16 | WeightType::BF16 if cols >= GEMM_MIN_COLS => {
            float_gemm::gemm_tile(
                &|wt, src, dst| convert_row(isa, wt, src, dst),
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
        WeightType::F32 => {
            float_small::<WT_F32>(isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
        WeightType::F16 => {
            float_small::<WT_F16>(isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
        WeightType::BF16 => {
            float_small::<WT_BF16>(isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
        WeightType::Q8_0 => quant_tile::<KIND_Q8_0>(
            isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        ),
        WeightType::Q4_0 => quant_tile::<KIND_Q4_0>(
            isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        ),
        WeightType::Q5_0 => quant_tile::<KIND_Q5_0>(
            isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        ),
        WeightType::Q4_1 => quant_tile::<KIND_Q4_1>(
            isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        ),
        WeightType::Q5_1 => quant_tile::<KIND_Q5_1>(
            isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        ),
        WeightType::Q4_K => {
            kquant_tile::<KQ_Q4_K>(isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
        WeightType::Q5_K => {
            kquant_tile::<KQ_Q5_K>(isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
        WeightType::Q6_K => {
            kquant_tile::<KQ_Q6_K>(isa, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
        WeightType::Q2_K
        | WeightType::Q3_K
        | WeightType::IQ4_NL
        | WeightType::IQ4_XS
        | WeightType::MXFP4 => {
            lowbit::tile(isa, wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo)
        }
    }
}

/// Float weights, few columns: register-blocked dot products.
/// Arguments were checked by `check_tile_args`; `isa` is a supported SIMD level.
#[allow(clippy::too_many_arguments)]
fn float_small<const WT: u8>(
    isa: Isa,
    w: &[u8],
    w_stride: usize,
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
) {
    if isa == Isa::Avx512 {
        if cols == 1 {
            let xp = col_ptrs::<1>(x, x_stride, 0);
            for r0 in (0..rows).step_by(8) {
                let wp = row_ptrs::<8>(w, w_stride, rows, r0);
                // SAFETY: AVX-512 is supported; every row pointer starts a row of
                // `k` weights and the column holds `k` f32 (checked by check_tile_args).
                let res = unsafe { avx512::f_tile::<WT, 8, 1>(&wp, &xp, k) };
                store(out, ldo, rows, r0, 0, &res);
            }
            return;
        }
        for c0 in (0..cols).step_by(4) {
            by_cols!((cols - c0).min(4), C => {
                let xp = col_ptrs::<C>(x, x_stride, c0);
                for r0 in (0..rows).step_by(4) {
                    let wp = row_ptrs::<4>(w, w_stride, rows, r0);
                    // SAFETY: AVX-512 is supported; rows hold `k` weights and
                    // columns `k` f32 (checked by check_tile_args).
                    let res = unsafe { avx512::f_tile::<WT, 4, C>(&wp, &xp, k) };
                    store(out, ldo, rows, r0, c0, &res);
                }
            });
        }
    } else {
        for c0 in (0..cols).step_by(2) {
            let xp1 = col_ptrs::<1>(x, x_stride, c0);
            for r0 in (0..rows).step_by(4) {
                let wp = row_ptrs::<4>(w, w_stride, rows, r0);
                if c0 + 1 < cols {
                    let xp = col_ptrs::<2>(x, x_stride, c0);
                    // SAFETY: AVX2 is supported; rows hold `k` weights and
                    // columns `k` f32 (checked by check_tile_args).
                    let res = unsafe { avx2::f_tile::<WT, 4, 2>(&wp, &xp, k) };
                    store(out, ldo, rows, r0, c0, &res);
                } else {
                    // SAFETY: as above, with one column.
                    let res = unsafe { avx2::f_tile::<WT, 4, 1>(&wp, &xp1, k) };
                    store(out, ldo, rows, r0, c0, &res);
                }
            }
        }
    }
}

/// Per-column activation tables for the AVX-512 quantized kernel (by `KIND`):
/// for column `c` and block `b`, `comp[(c * nb + b) * 4 + t]` is
/// `-off * (sum of y[4t..4t + 4] and y[16 + 4t..16 + 4t + 4])`, `dy[c * nb + b]`
/// the block scale and, for the affine kinds, `sy[c * nb + b]` Q8_1's `s`.
#[allow(clippy::type_complexity)]
fn act_tables<'a, const KIND: u8>(
    x: &[u8],
    x_stride: usize,
    cols: usize,
    nb: usize,
    scratch: &'a mut Vec<u8>,
) -> (&'a [i32], &'a [f32], &'a [f32]) {
    let (off, ab) = (kind_offset(KIND), kind_act_bytes(KIND));
    let buf = scratch_f32(scratch, cols * nb * 6);
    let (cbuf, rest) = buf.split_at_mut(cols * nb * 4);
    let (dbuf, sbuf) = rest.split_at_mut(cols * nb);
    let cbuf: &mut [i32] = bytemuck::cast_slice_mut(cbuf);
    for c in 0..cols {
        let col = &x[c * x_stride..c * x_stride + nb * ab];
        for (b, blk) in col.chunks_exact(ab).enumerate() {
            dbuf[c * nb + b] = block_scale(blk);
            if kind_affine(KIND) {
                sbuf[c * nb + b] = block_scale(&blk[2..]);
                continue;
            }
            let q = &blk[2..];
            for t in 0..4 {
                let mut s = 0i32;
                for e in 0..4 {
                    s += q[4 * t + e] as i8 as i32 + q[16 + 4 * t + e] as i8 as i32;
                }
                cbuf[(c * nb + b) * 4 + t] = -off * s;
            }
        }
    }
    (cbuf, dbuf, sbuf)
}

/// Quantized weights (Q8_0, Q4_0 or Q5_0 by `KIND`) times Q8_0 activations, or Q4_1 / Q5_1
/// times Q8_1.
/// Arguments were checked by `check_tile_args`; `isa` is a supported SIMD level.
#[allow(clippy::too_many_arguments)]
fn quant_tile<const KIND: u8>(
    isa: Isa,
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
    let nb = k / QK8_0;
    if isa == Isa::Avx512 && KIND == KIND_Q8_0 && cols == 1 {
        // GEMV: stream each row with the shuffle-free kernel.
        let yp = x.as_ptr();
        for r0 in (0..rows).step_by(8) {
            let wp = row_ptrs::<8>(w, w_stride, rows, r0);
            // SAFETY: AVX-512 is supported; rows hold `nb` weight blocks and the column `nb`
            // Q8_0 blocks (check_tile_args).
            let res = unsafe { avx512::gemv_q8_0::<8>(&wp, yp, nb) };
            let t: [[f32; 1]; 8] = std::array::from_fn(|i| [res[i]]);
            store(out, ldo, rows, r0, 0, &t);
        }
    } else if isa == Isa::Avx512 {
        let (comp, dy, sy) = act_tables::<KIND>(x, x_stride, cols, nb, scratch);
        for r0 in (0..rows).step_by(8) {
            let wp = [
                row_ptrs::<4>(w, w_stride, rows, r0),
                row_ptrs::<4>(w, w_stride, rows, r0 + 4),
            ];
            for c0 in (0..cols).step_by(4) {
                by_cols!((cols - c0).min(4), C => {
                    let xp = col_ptrs::<C>(x, x_stride, c0);
                    let cp: [*const i32; C] = std::array::from_fn(|j| comp[(c0 + j) * nb * 4..].as_ptr());
                    let dp: [*const f32; C] = std::array::from_fn(|j| dy[(c0 + j) * nb..].as_ptr());
                    let sp: [*const f32; C] = std::array::from_fn(|j| sy[(c0 + j) * nb..].as_ptr());
                    // SAFETY: AVX-512 is supported; rows hold `nb` weight blocks and
                    // columns `nb` activation blocks (check_tile_args); the tables hold
                    // `4 * nb`, `nb` and `nb` entries per column.
                    let res = unsafe { avx512::q_tile::<KIND, 2, C>(&wp, &xp, &cp, &dp, &sp, nb) };
                    for (s, rs) in res.iter().enumerate() {
                        let t: [[f32; C]; 4] = std::array::from_fn(|i| std::array::from_fn(|j| rs[j][i]));
                        store(out, ldo, rows, r0 + 4 * s, c0, &t);
                    }
                });
            }
        }
    } else if cols == 1 {
        let xp = col_ptrs::<1>(x, x_stride, 0);
        for r0 in (0..rows).step_by(4) {
            let wp = row_ptrs::<4>(w, w_stride, rows, r0);
            // SAFETY: AVX2 is supported; rows hold `nb` weight blocks and the
            // column `nb` activation blocks (check_tile_args).
            let res = unsafe { avx2::q_tile::<KIND, 4, 1>(&wp, &xp, nb) };
            store(out, ldo, rows, r0, 0, &res);
        }
    } else {
        for c0 in (0..cols).step_by(2) {
            for r0 in (0..rows).step_by(2) {
                let wp = row_ptrs::<2>(w, w_stride, rows, r0);
                if c0 + 1 < cols {
                    let xp = col_ptrs::<2>(x, x_stride, c0);
                    // SAFETY: as above, two rows by two columns.
                    let res = unsafe { avx2::q_tile::<KIND, 2, 2>(&wp, &xp, nb) };
                    store(out, ldo, rows, r0, c0, &res);
                } else {
                    let xp = col_ptrs::<1>(x, x_stride, c0);
                    // SAFETY: as above, two rows by one column.
                    let res = unsafe { avx2::q_tile::<KIND, 2, 1>(&wp, &xp, nb) };
                    store(out, ldo, rows, r0, c0, &res);
                }
            }
        }
    }
}

/// From this many columns on, float tiles use the packed-panel AVX-512 kernel.
/// From this many columns on, AVX-512 float tiles use the packed-panel
/// kernel (below, register-blocked dot products are faster: the packing is
/// not amortized).
pub(crate) const PANEL_MIN_COLS: usize = 8;

/// k elements per packed panel of the AVX-512 float kernel.
const PANEL_KC: usize = 256;

/// Float weights, many columns, AVX-512: 32-row panels of weights are
/// converted to f32 and packed k-major (`PANEL_KC` elements at a time), then
/// multiplied by up to 12 columns at a time with register-resident 32 x C
/// accumulators (activations are broadcast straight from `x`).
/// Arguments were checked by `check_tile_args`; AVX-512 is supported.
#[allow(clippy::too_many_arguments)]
fn panel_tile<const WT: u8>(
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
    use avx512::{PANEL_ROWS, pack_panel, panel_kernel};
    let wp = scratch_f32(scratch, PANEL_ROWS * PANEL_KC).as_mut_ptr();
    let ob = out.as_mut_ptr();
    for k0 in (0..k).step_by(PANEL_KC) {
        let kc = PANEL_KC.min(k - k0);
        for r0 in (0..rows).step_by(PANEL_ROWS) {
            let rp = row_ptrs::<PANEL_ROWS>(w, w_stride, rows, r0);
            // SAFETY: AVX-512 is supported; rows hold `k` elements
            // (check_tile_args); `k0 + kc <= k`; the panel buffer holds
            // 32 * PANEL_KC f32 and PANEL_KC is a multiple of 16.
            unsafe { pack_panel::<WT>(&rp, k0, kc, k, wp) };
            let valid = (rows - r0).min(PANEL_ROWS);
            let mask = if valid == 32 {
                u32::MAX
            } else {
                (1u32 << valid) - 1
            };
            let mut c0 = 0;
            while c0 < cols {
                let rem = cols - c0;
                macro_rules! run {
                    ($c:literal) => {{
                        let xp: [*const f32; $c] = std::array::from_fn(|j| {
                            x[(c0 + j) * x_stride + 4 * k0..].as_ptr() as *const f32
                        });
                        // Column bases: `(c0 + j) * ldo + r0 < out.len()` (check_tile_args).
                        let op: [*mut f32; $c] = std::array::from_fn(|j| {
                            let idx = (c0 + j) * ldo + r0;
                            assert!(idx < out.len());
                            ob.wrapping_add(idx)
                        });
                        // SAFETY: AVX-512 is supported; the panel holds 32 * kc
                        // packed f32; each column has `k - k0 >= kc` f32 left
                        // from `xp[j]`; for every row `r0 + i` with its mask bit
                        // set, `op[j] + i` is inside `out`, which is exclusively
                        // borrowed and not otherwise accessed meanwhile.
                        unsafe { panel_kernel::<$c>(wp, &xp, kc, &op, mask, k0 > 0) };
                        c0 += $c;
                    }};
                }
                if rem >= 12 {
                    run!(12)
                } else if rem >= 8 {
                    run!(8)
                } else if rem >= 4 {
                    run!(4)
                } else if rem >= 2 {
                    run!(2)
                } else {
                    run!(1)
                }
            }
        }
    }
}

/// Decodes one float-type weight row into f32.
fn convert_row(isa: Isa, wt: WeightType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / wt.element_bytes().max(1));
    match wt {
        WeightType::F16 | WeightType::BF16 if isa >= Isa::Avx2 && isa.is_supported() => {
            // SAFETY: AVX2 is supported; `src` holds `n` 2-byte elements and
            // `dst` has room for `n` f32.
            unsafe {
                if wt == WeightType::BF16 {
                    avx2::convert_half_row::<true>(src.as_ptr(), dst.as_mut_ptr(), n)
                } else {
                    avx2::convert_half_row::<false>(src.as_ptr(), dst.as_mut_ptr(), n)
                }
            }
        }
        _ => {
            for (d, s) in dst
                .iter_mut()
                .zip(src.chunks_exact(wt.element_bytes().max(1)))
            {
                *d = match wt {
                    WeightType::F16 => {
                        half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32()
                    }
                    WeightType::BF16 => {
                        f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16)
                    }
                    _ => f32::from_le_bytes([s[0], s[1], s[2], s[3]]),
                };
            }
        }
    }
}

/// K-quant kind of the super-block kernels: Q4_K weights.
pub(crate) const KQ_Q4_K: u8 = 0;
/// K-quant kind of the super-block kernels: Q5_K weights.
pub(crate) const KQ_Q5_K: u8 = 1;
/// K-quant kind of the super-block kernels: Q6_K weights.
pub(crate) const KQ_Q6_K: u8 = 2;

/// Bytes per super-block of a K-quant kind.
pub(crate) const fn kq_block_bytes(kind: u8) -> usize {
    match kind {
        KQ_Q4_K => BLOCK_Q4_K_BYTES,
        KQ_Q5_K => BLOCK_Q5_K_BYTES,
        _ => BLOCK_Q6_K_BYTES,
    }
}

/// Dot product of a K-quant row (by `KIND`) with a Q8_K row, over the whole super-blocks both
/// hold.
pub(crate) fn vec_dot_k<const KIND: u8>(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
    let nb = (x.len() / kq_block_bytes(KIND)).min(y.len() / BLOCK_Q8_K_BYTES);
    let (x, y) = (&x[..nb * kq_block_bytes(KIND)], &y[..nb * BLOCK_Q8_K_BYTES]);
    match isa.clamp_to_supported() {
        Isa::Avx512 => {
            // SAFETY: AVX-512 is supported; `x` and `y` hold `nb` super-blocks each.
            unsafe { avx512::kq_tile::<KIND, 1>(x.as_ptr(), &[y.as_ptr()], nb)[0] }
        }
        Isa::Avx2 => {
            // SAFETY: AVX2 is supported; `x` and `y` hold `nb` super-blocks each.
            unsafe { avx2::kq_tile::<KIND, 1>(x.as_ptr(), &[y.as_ptr()], nb)[0] }
        }
        _ => match KIND {
            KQ_Q4_K => generic::vec_dot_qk_affine_q8_k::<false>(x, y),
            KQ_Q5_K => generic::vec_dot_qk_affine_q8_k::<true>(x, y),
            _ => generic::vec_dot_q6_k_q8_k(x, y),
        },
    }
}

/// K-quant weights (by `KIND`) times Q8_K activations: each row against up to 8 (AVX-512) or 2
/// (AVX2) columns at a time, so a super-block's unpacked weights serve several columns.
/// Arguments were checked by `check_tile_args`; `isa` is a supported SIMD level.
#[allow(clippy::too_many_arguments)]
fn kquant_tile<const KIND: u8>(
    isa: Isa,
    w: &[u8],
    w_stride: usize,
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let nb = k / QK_K;
    for r in 0..rows {
        let wp = w[r * w_stride..].as_ptr();
        let mut c0 = 0;
        while c0 < cols {
            let rem = cols - c0;
            macro_rules! run {
                ($c:literal, $arch:ident) => {{
                    let xp = col_ptrs::<$c>(x, x_stride, c0);
                    // SAFETY: the ISA is supported (clamped by the caller); row `r` holds `nb`
                    // super-blocks and every column `nb` Q8_K super-blocks (check_tile_args).
                    let res = unsafe { $arch::kq_tile::<KIND, $c>(wp, &xp, nb) };
                    for (j, v) in res.iter().enumerate() {
                        out[(c0 + j) * ldo + r] = *v;
                    }
                    c0 += $c;
                }};
            }
            if isa == Isa::Avx512 {
                if rem >= 8 {
                    run!(8, avx512)
                } else if rem >= 4 {
                    run!(4, avx512)
                } else if rem >= 2 {
                    run!(2, avx512)
                } else {
                    run!(1, avx512)
                }
            } else if rem >= 2 {
                run!(2, avx2)
            } else {
                run!(1, avx2)
            }
        }
    }
}
