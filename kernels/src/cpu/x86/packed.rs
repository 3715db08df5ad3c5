//! AVX-512 VNNI kernels over the packed layout of [`crate::cpu::repack`]: sixteen rows per
//! vector lane set, up to eight activation columns per pass.
#![allow(unsafe_code)]
// Column and lane loops index several fixed-size arrays in step; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use super::avx512::f16_at;
use super::{
    KIND_Q4_0, KIND_Q4_1, KIND_Q5_0, KIND_Q5_1, KIND_Q8_0, kind_act_bytes, kind_act_qs_at,
    kind_affine, kind_block_bytes, kind_offset,
};
use crate::cpu::kquant::{BLOCK_Q4_K_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, BLOCK_Q8_K_BYTES};
use crate::cpu::pack_layout::PackLayout;
use crate::cpu::tile::WeightType;
use crate::cpu::tile::scratch_f32;
use std::arch::x86_64::*;

/// Expands `$call!(k)` for the column count `$n` among the listed literals, the last one also
/// taking anything larger (the kernels take the column count as a const parameter).
macro_rules! with_cols {
    ($n:expr; $($k:literal),*; $last:literal; $call:ident) => {
        match $n {
            $($k => $call!($k),)*
            _ => $call!($last),
        }
    };
}

/// The layout these kernels read.
const LAYOUT: PackLayout = PackLayout::Rows16x4;
/// Rows per packed group.
const PACK_ROWS: usize = LAYOUT.rows();

/// Columns one kernel call handles: eight i32 and eight f32 accumulators fit the 32 registers
/// with the weight vectors.
const MAX_COLS: usize = 8;

fn kind_of(wt: WeightType) -> u8 {
    match wt {
        WeightType::Q4_0 => KIND_Q4_0,
        WeightType::Q5_0 => KIND_Q5_0,
        WeightType::Q4_1 => KIND_Q4_1,
        WeightType::Q5_1 => KIND_Q5_1,
        _ => KIND_Q8_0,
    }
}

/// See [`crate::cpu::repack::mul_mat_tile_packed`], which checked the arguments and that the
/// CPU has AVX-512 VNNI.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_mat_tile_packed(
    wt: WeightType,
    w: &[u8],
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
    scratch: &mut Vec<u8>,
) {
    match wt {
        WeightType::Q4_K => return ktile::<0>(w, rows, x, x_stride, cols, k, out, ldo),
        WeightType::Q5_K => return ktile::<1>(w, rows, x, x_stride, cols, k, out, ldo),
        WeightType::Q6_K => return ktile::<2>(w, rows, x, x_stride, cols, k, out, ldo),
        _ => {}
    }
    match kind_of(wt) {
        KIND_Q4_0 => tile::<KIND_Q4_0>(w, rows, x, x_stride, cols, k, out, ldo, scratch),
        KIND_Q5_0 => tile::<KIND_Q5_0>(w, rows, x, x_stride, cols, k, out, ldo, scratch),
        KIND_Q4_1 => tile::<KIND_Q4_1>(w, rows, x, x_stride, cols, k, out, ldo, scratch),
        KIND_Q5_1 => tile::<KIND_Q5_1>(w, rows, x, x_stride, cols, k, out, ldo, scratch),
        _ => tile::<KIND_Q8_0>(w, rows, x, x_stride, cols, k, out, ldo, scratch),
    }
}

#[allow(clippy::too_many_arguments)]
fn tile<const KIND: u8>(
    w: &[u8],
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
    scratch: &mut Vec<u8>,
) {
    let nb = k / 32;
    let (ab, aq) = (kind_act_bytes(KIND), kind_act_qs_at(KIND));
    // Σ of each activation block's quants: the offset kinds store `q + off` and subtract
    // `off · Σy` per block, which starts the block's integer accumulator.
    let sums: &mut [f32] = scratch_f32(scratch, cols * nb);
    let sums: &mut [i32] = bytemuck::cast_slice_mut(sums);
    if kind_offset(KIND) != 0 {
        for c in 0..cols {
            let col = &x[c * x_stride..c * x_stride + nb * ab];
            // SAFETY: AVX2 comes with AVX-512 (the caller checked it); `col` holds `nb` blocks.
            unsafe { block_sums(col.as_ptr(), nb, ab, aq, &mut sums[c * nb..(c + 1) * nb]) };
            for s in &mut sums[c * nb..(c + 1) * nb] {
                *s *= -kind_offset(KIND);
            }
        }
    }
    let group_bytes = PACK_ROWS * nb * kind_block_bytes(KIND);
    for g in 0..rows / PACK_ROWS {
        let wg = w[g * group_bytes..(g + 1) * group_bytes].as_ptr();
        let mut c0 = 0;
        while c0 < cols {
            let n = (cols - c0).min(MAX_COLS);
            macro_rules! call {
                ($c:literal) => {{
                    let xp: [*const u8; $c] =
                        std::array::from_fn(|j| x[(c0 + j) * x_stride..].as_ptr());
                    let sp: [*const i32; $c] =
                        std::array::from_fn(|j| sums[(c0 + j) * nb..].as_ptr());
                    let op: [*mut f32; $c] = std::array::from_fn(|j| {
                        out[(c0 + j) * ldo + g * PACK_ROWS..][..PACK_ROWS].as_mut_ptr()
                    });
                    // SAFETY: the caller checked AVX-512 VNNI; the group holds `nb` packed blocks,
                    // each column `nb` activation blocks and `nb` sums, each output pointer 16
                    // writable floats (slices above are bounds-checked).
                    unsafe { group::<KIND, $c>(wg, nb, &xp, &sp, &op) }
                }};
            }
            with_cols!(n; 1, 2, 3, 4, 5, 6, 7; 8; call);
            c0 += n;
        }
    }
}

/// `out[b]` = Σ of the 32 signed quants of activation block `b` (blocks `ab` bytes apart, quants
/// at byte `aq`).
///
/// # Safety
/// AVX2 must be available and `x` must hold `out.len()` blocks.
#[target_feature(enable = "avx2")]
unsafe fn block_sums(x: *const u8, nb: usize, ab: usize, aq: usize, out: &mut [i32]) {
    // SAFETY: each block's 32 quants are inside `x` (caller).
    unsafe {
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        for (b, o) in out.iter_mut().enumerate().take(nb) {
            // Σ(q + 128) by sums of absolute differences against zero, then minus 32 · 128.
            let q = _mm256_loadu_si256(x.add(b * ab + aq) as *const __m256i);
            let sad = _mm256_sad_epu8(_mm256_xor_si256(q, flip), _mm256_setzero_si256());
            let half = _mm_add_epi64(
                _mm256_castsi256_si128(sad),
                _mm256_extracti128_si256::<1>(sad),
            );
            let total = _mm_cvtsi128_si64(half) + _mm_extract_epi64::<1>(half);
            *o = total as i32 - 32 * 128;
        }
    }
}

/// Four activation quants broadcast to every lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn bcast4(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees the 4-byte read.
    unsafe { _mm512_set1_epi32((p as *const i32).read_unaligned()) }
}

/// Sixteen rows (one packed group) times `C` columns over `nb` blocks; row `r` of column `c`
/// goes to `out[c][r]`.
///
/// # Safety
/// AVX-512 VNNI must be available; `w` must hold `nb` packed group blocks of `KIND`, `x[c]` `nb`
/// activation blocks, `sums[c]` `nb` i32 (read for the offset kinds) and `out[c]` 16 floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group<const KIND: u8, const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    sums: &[*const i32; C],
    out: &[*mut f32; C],
) {
    let wt = match KIND {
        KIND_Q4_0 => WeightType::Q4_0,
        KIND_Q5_0 => WeightType::Q5_0,
        KIND_Q4_1 => WeightType::Q4_1,
        KIND_Q5_1 => WeightType::Q5_1,
        _ => WeightType::Q8_0,
    };
    let (m_at, qh_at, qs_at) = LAYOUT.packed_offsets(wt);
    let gb = PACK_ROWS * kind_block_bytes(KIND);
    let (ab, aq) = (kind_act_bytes(KIND), kind_act_qs_at(KIND));
    let five = matches!(KIND, KIND_Q5_0 | KIND_Q5_1);
    // SAFETY: all reads stay inside the blocks the caller vouches for.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        let sixteen = _mm512_set1_epi8(16);
        // Fifth bits: chunk `j` takes byte `j` of each row's reordered word to all four bytes of
        // the row's lane, then bit `e` (low nibbles) or `4 + e` (high) marks byte `e`.
        let sel_lo = _mm512_set1_epi32(0x0804_0201);
        let sel_hi = _mm512_set1_epi32(0x8040_2010_u32 as i32);
        // Byte `4t + e` of each 128-bit lane reads byte `4t + j`: bytes 0..4 read 0, 4..8 read 4...
        let (lo64, hi64) = (0x0404_0404_0000_0000_i64, 0x0C0C_0C0C_0808_0808_i64);
        let base = _mm512_set_epi64(hi64, lo64, hi64, lo64, hi64, lo64, hi64, lo64);
        let rep = |j: i8| _mm512_add_epi8(base, _mm512_set1_epi8(j));
        let reps = [rep(0), rep(1), rep(2), rep(3)];
        let mut accf = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let blk = w.add(b * gb);
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let mut acc = [_mm512_setzero_si512(); C];
            if kind_offset(KIND) != 0 {
                for c in 0..C {
                    acc[c] = _mm512_set1_epi32(*sums[c].add(b));
                }
            }
            let xq: [*const u8; C] = std::array::from_fn(|c| x[c].add(b * ab + aq));
            if KIND == KIND_Q8_0 {
                for j in 0..8 {
                    let wv = _mm512_loadu_si512(blk.add(qs_at + 64 * j) as *const _);
                    for c in 0..C {
                        acc[c] = _mm512_dpbusd_epi32(acc[c], wv, bcast4(xq[c].add(4 * j)));
                    }
                }
            } else {
                let qh = if five {
                    _mm512_loadu_si512(blk.add(qh_at) as *const _)
                } else {
                    _mm512_setzero_si512()
                };
                for j in 0..4 {
                    let raw = _mm512_loadu_si512(blk.add(qs_at + 64 * j) as *const _);
                    let mut lo = _mm512_and_si512(raw, low4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low4);
                    if five {
                        let bits = _mm512_shuffle_epi8(qh, reps[j]);
                        let klo = _mm512_test_epi8_mask(bits, sel_lo);
                        let khi = _mm512_test_epi8_mask(bits, sel_hi);
                        lo = _mm512_mask_add_epi8(lo, klo, lo, sixteen);
                        hi = _mm512_mask_add_epi8(hi, khi, hi, sixteen);
                    }
                    for c in 0..C {
                        acc[c] = _mm512_dpbusd_epi32(acc[c], lo, bcast4(xq[c].add(4 * j)));
                        acc[c] = _mm512_dpbusd_epi32(acc[c], hi, bcast4(xq[c].add(16 + 4 * j)));
                    }
                }
            }
            let mv = if kind_affine(KIND) {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(m_at) as *const __m256i))
            } else {
                _mm512_setzero_ps()
            };
            for c in 0..C {
                let xb = x[c].add(b * ab);
                let scale = _mm512_mul_ps(dv, _mm512_set1_ps(f16_at(xb)));
                accf[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[c]), scale, accf[c]);
                if kind_affine(KIND) {
                    accf[c] = _mm512_fmadd_ps(mv, _mm512_set1_ps(f16_at(xb.add(2))), accf[c]);
                }
            }
        }
        for c in 0..C {
            _mm512_storeu_ps(out[c], accf[c]);
        }
    }
}

/// Columns one K-quant kernel call handles: Q4_K/Q5_K keep four accumulators per column, Q6_K
/// six; with the unpacked quants that fills the 32 registers (more columns spill).
const fn max_kcols(kt: u8) -> usize {
    if kt == 2 { 4 } else { 6 }
}

/// K-quant tiles: `KT` 0 = Q4_K, 1 = Q5_K, 2 = Q6_K; activations are Q8_K.
#[allow(clippy::too_many_arguments)]
fn ktile<const KT: u8>(
    w: &[u8],
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let nb = k / 256;
    let bb = match KT {
        0 => BLOCK_Q4_K_BYTES,
        1 => BLOCK_Q5_K_BYTES,
        _ => BLOCK_Q6_K_BYTES,
    };
    let group_bytes = PACK_ROWS * nb * bb;
    for g in 0..rows / PACK_ROWS {
        let wg = w[g * group_bytes..(g + 1) * group_bytes].as_ptr();
        let mut c0 = 0;
        while c0 < cols {
            let n = (cols - c0).min(max_kcols(KT));
            macro_rules! call {
                ($c:literal) => {{
                    let xp: [*const u8; $c] = std::array::from_fn(|j| {
                        x[(c0 + j) * x_stride..][..nb * BLOCK_Q8_K_BYTES].as_ptr()
                    });
                    let op: [*mut f32; $c] = std::array::from_fn(|j| {
                        out[(c0 + j) * ldo + g * PACK_ROWS..][..PACK_ROWS].as_mut_ptr()
                    });
                    // SAFETY: AVX-512 VNNI was checked by the caller; the group holds `nb`
                    // packed super-blocks, each column `nb` Q8_K blocks, each output 16 floats
                    // (bounds-checked slices above).
                    unsafe {
                        match KT {
                            0 => kgroup_q45::<false, $c>(wg, nb, &xp, &op),
                            1 => kgroup_q45::<true, $c>(wg, nb, &xp, &op),
                            _ => kgroup_q6::<$c>(wg, nb, &xp, &op),
                        }
                    }
                }};
            }
            with_cols!(n; 1, 2, 3, 4, 5; 6; call);
            c0 += n;
        }
    }
}

/// Sixteen bytes, one per row, widened to sixteen i32 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn widen_u8(v: __m128i) -> __m512i {
    _mm512_cvtepu8_epi32(v)
}

/// Bytes `t` of the packed scales (one per row): `p` is the scales part of a group super-block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scale_bytes(p: *const u8, t: usize) -> __m128i {
    // SAFETY: the caller guarantees 16 readable bytes per scale byte index.
    unsafe { _mm_loadu_si128(p.add(16 * t) as *const __m128i) }
}

/// The 6-bit scale (`MIN` false) or minimum (`MIN` true) of sub-block `j` for sixteen rows, as
/// ggml's `get_scale_min_k4` decodes them, from the transposed 12 scale bytes at `p`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scale_min<const MIN: bool>(p: *const u8, j: usize) -> __m512i {
    // SAFETY: 12 × 16 scale bytes at `p` (caller).
    unsafe {
        let m63 = _mm_set1_epi8(63);
        let m0f = _mm_set1_epi8(0x0F);
        let m30 = _mm_set1_epi8(0x30);
        let v = if j < 4 {
            _mm_and_si128(scale_bytes(p, if MIN { j + 4 } else { j }), m63)
        } else {
            let q = scale_bytes(p, j + 4);
            let low = if MIN {
                _mm_and_si128(_mm_srli_epi16::<4>(q), m0f)
            } else {
                _mm_and_si128(q, m0f)
            };
            // (byte >> 6) << 4 within each byte: bits 6, 7 move to 4, 5.
            let top = scale_bytes(p, if MIN { j } else { j - 4 });
            _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16::<2>(top), m30))
        };
        widen_u8(v)
    }
}

/// Q4_K (`FIVE` false) or Q5_K (`FIVE` true): sixteen rows times `C` Q8_K columns, with
/// GFNI for Q5_K's fifth bits where the CPU has it.
///
/// # Safety
/// AVX-512 VNNI; `w` holds `nb` packed group super-blocks, `x[c]` `nb` Q8_K blocks, `out[c]` 16
/// floats.
unsafe fn kgroup_q45<const FIVE: bool, const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: the caller checked AVX-512 VNNI; GFNI is checked here.
    unsafe {
        if FIVE && has_gfni() {
            kgroup_q45_gfni::<FIVE, C>(w, nb, x, out)
        } else {
            kgroup_q45_plain::<FIVE, C>(w, nb, x, out)
        }
    }
}

/// # Safety
/// As [`kgroup_q45`], and GFNI must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,gfni")]
unsafe fn kgroup_q45_gfni<const FIVE: bool, const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: as the caller guarantees.
    unsafe { kgroup_q45_body::<FIVE, C, true>(w, nb, x, out) }
}

/// # Safety
/// As [`kgroup_q45`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kgroup_q45_plain<const FIVE: bool, const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: as the caller guarantees.
    unsafe { kgroup_q45_body::<FIVE, C, false>(w, nb, x, out) }
}

/// The Q4_K/Q5_K kernel, inlined into a wrapper that enables the instruction sets it uses.
///
/// # Safety
/// As [`kgroup_q45`]; GFNI when `GFNI`.
#[inline(always)]
unsafe fn kgroup_q45_body<const FIVE: bool, const C: usize, const GFNI: bool>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    let wt = if FIVE {
        WeightType::Q5_K
    } else {
        WeightType::Q4_K
    };
    let (pm, psc, pqh, pqs) = LAYOUT.kquant_parts(wt);
    let gb = PACK_ROWS
        * if FIVE {
            BLOCK_Q5_K_BYTES
        } else {
            BLOCK_Q4_K_BYTES
        };
    // SAFETY: reads stay inside the blocks the caller vouches for.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        let sixteen = _mm512_set1_epi8(16);
        let mut accf = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let blk = w.add(b * gb);
            let xb: [*const u8; C] = std::array::from_fn(|c| x[c].add(b * BLOCK_Q8_K_BYTES));
            let mut isum = [_mm512_setzero_si512(); C];
            for cc in 0..4 {
                let mut lo_acc = [_mm512_setzero_si512(); C];
                let mut hi_acc = [_mm512_setzero_si512(); C];
                for p in 0..8 {
                    let raw = _mm512_loadu_si512(blk.add(pqs + (cc * 8 + p) * 64) as *const _);
                    let mut lo = _mm512_and_si512(raw, low4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low4);
                    if FIVE && GFNI {
                        // Bit 2cc (2cc + 1) of each fifth-bit byte to bit 4, then merged under
                        // the nibble: one affine and one ternary op each.
                        let h = _mm512_loadu_si512(blk.add(pqh + p * 64) as *const _);
                        let g_lo = _mm512_gf2p8affine_epi64_epi8::<0>(
                            h,
                            _mm512_set1_epi64((((1u64 << (2 * cc)) & 0xFF) << 24) as i64),
                        );
                        let g_hi = _mm512_gf2p8affine_epi64_epi8::<0>(
                            h,
                            _mm512_set1_epi64((((2u64 << (2 * cc)) & 0xFF) << 24) as i64),
                        );
                        lo = _mm512_ternarylogic_epi32::<0xE4>(raw, g_lo, low4);
                        hi = _mm512_ternarylogic_epi32::<0xE4>(
                            _mm512_srli_epi16::<4>(raw),
                            g_hi,
                            low4,
                        );
                    } else if FIVE {
                        let h = _mm512_loadu_si512(blk.add(pqh + p * 64) as *const _);
                        let klo =
                            _mm512_test_epi8_mask(h, _mm512_set1_epi8((1u8 << (2 * cc)) as i8));
                        let khi =
                            _mm512_test_epi8_mask(h, _mm512_set1_epi8((2u8 << (2 * cc)) as i8));
                        lo = _mm512_mask_add_epi8(lo, klo, lo, sixteen);
                        hi = _mm512_mask_add_epi8(hi, khi, hi, sixteen);
                    }
                    for c in 0..C {
                        let y = xb[c].add(4 + 64 * cc + 4 * p);
                        lo_acc[c] = _mm512_dpbusd_epi32(lo_acc[c], lo, bcast4(y));
                        hi_acc[c] = _mm512_dpbusd_epi32(hi_acc[c], hi, bcast4(y.add(32)));
                    }
                }
                let s_lo = scale_min::<false>(blk.add(psc), 2 * cc);
                let s_hi = scale_min::<false>(blk.add(psc), 2 * cc + 1);
                for c in 0..C {
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(lo_acc[c], s_lo));
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(hi_acc[c], s_hi));
                }
            }
            // Minimums: Σ_j m_j · (bsums[2j] + bsums[2j + 1]).
            let mut msum = [_mm512_setzero_si512(); C];
            for j in 0..8 {
                let m = scale_min::<true>(blk.add(psc), j);
                for c in 0..C {
                    let bs = xb[c].add(260 + 4 * j);
                    let pair = (bs as *const i16).read_unaligned() as i32
                        + (bs.add(2) as *const i16).read_unaligned() as i32;
                    msum[c] =
                        _mm512_add_epi32(msum[c], _mm512_mullo_epi32(m, _mm512_set1_epi32(pair)));
                }
            }
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let mv = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(pm) as *const __m256i));
            for c in 0..C {
                let dy = _mm512_set1_ps((xb[c] as *const f32).read_unaligned());
                accf[c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dv, dy), accf[c]);
                accf[c] =
                    _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[c]), _mm512_mul_ps(mv, dy), accf[c]);
            }
        }
        for c in 0..C {
            _mm512_storeu_ps(out[c], accf[c]);
        }
    }
}

/// Q6_K: sixteen rows times `C` Q8_K columns, with GFNI where the CPU has it.
///
/// # Safety
/// As [`kgroup_q45`].
unsafe fn kgroup_q6<const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: the caller checked AVX-512 VNNI; GFNI is checked here.
    unsafe {
        if has_gfni() {
            kgroup_q6_gfni::<C>(w, nb, x, out)
        } else {
            kgroup_q6_plain::<C>(w, nb, x, out)
        }
    }
}

fn has_gfni() -> bool {
    static GFNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GFNI.get_or_init(|| std::arch::is_x86_feature_detected!("gfni"))
}

/// # Safety
/// As [`kgroup_q45`], and GFNI must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,gfni")]
unsafe fn kgroup_q6_gfni<const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: as the caller guarantees.
    unsafe { kgroup_q6_body::<C, true>(w, nb, x, out) }
}

/// # Safety
/// As [`kgroup_q45`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kgroup_q6_plain<const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: as the caller guarantees.
    unsafe { kgroup_q6_body::<C, false>(w, nb, x, out) }
}

/// The Q6_K kernel, inlined into a wrapper that enables the instruction sets it uses.
///
/// # Safety
/// As [`kgroup_q45`]; GFNI when `GFNI`.
#[inline(always)]
unsafe fn kgroup_q6_body<const C: usize, const GFNI: bool>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    let (_, psc, pqh, pqs) = LAYOUT.kquant_parts(WeightType::Q6_K);
    let gb = PACK_ROWS * BLOCK_Q6_K_BYTES;
    // SAFETY: reads stay inside the blocks the caller vouches for.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        let m30 = _mm512_set1_epi8(0x30);
        let mut accf = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let blk = w.add(b * gb);
            let xb: [*const u8; C] = std::array::from_fn(|c| x[c].add(b * BLOCK_Q8_K_BYTES));
            let mut isum = [_mm512_setzero_si512(); C];
            for n in 0..2 {
                for pp in 0..2 {
                    // Sub-blocks of 16 fed by parts 4pp..4pp+4 of half n: q1..q4 land in
                    // 8n + pp, + 2, + 4, + 6. Each starts at -32 · its activation sum (levels are
                    // stored + 32).
                    let subs = [8 * n + pp, 8 * n + 2 + pp, 8 * n + 4 + pp, 8 * n + 6 + pp];
                    let mut acc = [[_mm512_setzero_si512(); 4]; C];
                    for c in 0..C {
                        for t in 0..4 {
                            let bs = (xb[c].add(260 + 2 * subs[t]) as *const i16).read_unaligned();
                            acc[c][t] = _mm512_set1_epi32(-32 * bs as i32);
                        }
                    }
                    for p in 4 * pp..4 * pp + 4 {
                        let qa =
                            _mm512_loadu_si512(blk.add(pqs + ((n * 8 + p) * 2) * 64) as *const _);
                        let qb = _mm512_loadu_si512(
                            blk.add(pqs + ((n * 8 + p) * 2 + 1) * 64) as *const _
                        );
                        let h = _mm512_loadu_si512(blk.add(pqh + (n * 8 + p) * 64) as *const _);
                        // Low nibble from ql, bits 4-5 from the right pair of qh: `select(low4,
                        // ql, hi)` is one ternary-logic op; GFNI moves each 2-bit pair in one.
                        let (h1, h2, h3, h4) = if GFNI {
                            (
                                _mm512_gf2p8affine_epi64_epi8::<0>(
                                    h,
                                    _mm512_set1_epi64(0x0102_0000),
                                ),
                                _mm512_gf2p8affine_epi64_epi8::<0>(
                                    h,
                                    _mm512_set1_epi64(0x0408_0000),
                                ),
                                _mm512_and_si512(h, m30),
                                _mm512_gf2p8affine_epi64_epi8::<0>(
                                    h,
                                    _mm512_set1_epi64(0x4080_0000),
                                ),
                            )
                        } else {
                            (
                                _mm512_and_si512(_mm512_slli_epi16::<4>(h), m30),
                                _mm512_and_si512(_mm512_slli_epi16::<2>(h), m30),
                                _mm512_and_si512(h, m30),
                                _mm512_and_si512(_mm512_srli_epi16::<2>(h), m30),
                            )
                        };
                        let q1 = _mm512_ternarylogic_epi32::<0xE4>(qa, h1, low4);
                        let q2 = _mm512_ternarylogic_epi32::<0xE4>(qb, h2, low4);
                        let q3 =
                            _mm512_ternarylogic_epi32::<0xE4>(_mm512_srli_epi16::<4>(qa), h3, low4);
                        let q4 =
                            _mm512_ternarylogic_epi32::<0xE4>(_mm512_srli_epi16::<4>(qb), h4, low4);
                        for c in 0..C {
                            let y = xb[c].add(4 + 128 * n + 4 * p);
                            acc[c][0] = _mm512_dpbusd_epi32(acc[c][0], q1, bcast4(y));
                            acc[c][1] = _mm512_dpbusd_epi32(acc[c][1], q2, bcast4(y.add(32)));
                            acc[c][2] = _mm512_dpbusd_epi32(acc[c][2], q3, bcast4(y.add(64)));
                            acc[c][3] = _mm512_dpbusd_epi32(acc[c][3], q4, bcast4(y.add(96)));
                        }
                    }
                    for t in 0..4 {
                        let sc = _mm512_cvtepi8_epi32(scale_bytes(blk.add(psc), subs[t]));
                        for c in 0..C {
                            isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(acc[c][t], sc));
                        }
                    }
                }
            }
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            for c in 0..C {
                let dy = _mm512_set1_ps((xb[c] as *const f32).read_unaligned());
                accf[c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(dv, dy), accf[c]);
            }
        }
        for c in 0..C {
            _mm512_storeu_ps(out[c], accf[c]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::features::{Isa, detected_isa};
    use crate::cpu::{act_row_bytes, act_type, pack_group, prepare_act};

    /// The GFNI and plain variants of the K-quant kernels give bit-identical results (the same
    /// integer sums in the same order); on CPUs without both there is nothing to compare.
    #[test]
    fn gfni_and_plain_kquant_kernels_agree_bit_for_bit() {
        if detected_isa() != Isa::Avx512 || !has_gfni() {
            eprintln!("skipped: needs AVX-512 VNNI and GFNI");
            return;
        }
        let k = 512;
        for wt in [WeightType::Q5_K, WeightType::Q6_K] {
            let rb = wt.row_bytes(k);
            let vals: Vec<f32> = (0..PACK_ROWS * k)
                .map(|i| ((i * 7919 % 2001) as f32 / 1000.0 - 1.0) * (1 + i % 3) as f32)
                .collect();
            let mut raw = vec![0u8; PACK_ROWS * rb];
            for (s, d) in vals.chunks_exact(k).zip(raw.chunks_exact_mut(rb)) {
                match wt {
                    WeightType::Q5_K => crate::cpu::quantize_row_q5_k(s, d),
                    _ => crate::cpu::quantize_row_q6_k(s, d),
                }
            }
            let mut packed = vec![0u8; raw.len()];
            pack_group(LAYOUT, wt, k, &raw, &mut packed);
            let xr = act_row_bytes(act_type(wt), k);
            let mut x = vec![0u8; 3 * xr];
            for c in 0..3 {
                let v: Vec<f32> = (0..k).map(|i| ((i + 37 * c) % 17) as f32 - 8.0).collect();
                prepare_act(act_type(wt), &v, &mut x[c * xr..(c + 1) * xr]);
            }
            let xp: [*const u8; 3] = std::array::from_fn(|c| x[c * xr..].as_ptr());
            let (mut a, mut b) = ([[0f32; 16]; 3], [[0f32; 16]; 3]);
            let ap: [*mut f32; 3] = std::array::from_fn(|c| a[c].as_mut_ptr());
            let bp: [*mut f32; 3] = std::array::from_fn(|c| b[c].as_mut_ptr());
            // SAFETY: AVX-512 VNNI and GFNI checked above; one packed group of `k / 256`
            // super-blocks, three Q8_K columns, three 16-float outputs.
            unsafe {
                if wt == WeightType::Q5_K {
                    kgroup_q45_gfni::<true, 3>(packed.as_ptr(), k / 256, &xp, &ap);
                    kgroup_q45_plain::<true, 3>(packed.as_ptr(), k / 256, &xp, &bp);
                } else {
                    kgroup_q6_gfni::<3>(packed.as_ptr(), k / 256, &xp, &ap);
                    kgroup_q6_plain::<3>(packed.as_ptr(), k / 256, &xp, &bp);
                }
            }
            assert_eq!(a, b, "{wt:?}");
            assert!(
                a.iter().flatten().any(|v| *v != 0.0),
                "{wt:?}: a real product"
            );
        }
    }
}
