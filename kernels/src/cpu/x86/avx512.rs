//! AVX-512 (F/BW/VL/VNNI) kernels.
//!
//! Every function here is `unsafe`: the caller must make sure the CPU
//! supports the [`Isa::Avx512`](crate::cpu::Isa::Avx512) level and that every
//! pointer is valid for the reads the documentation states. No alignment is
//! assumed anywhere.
//!
//! The quantized kernels use `vpdpbusd` (u8 x i8 -> i32). Weights are turned
//! into unsigned bytes (Q8_0: `q + 128`; Q4_0: the raw nibble, i.e. `q + 8`; Q5_0: nibble
//! plus fifth bit, `q + 16`)
//! and the activations stay signed; the offset is removed with a per-block
//! compensation `off * sum(y)` computed from the activations. Q4_1 / Q5_1
//! levels are unsigned already (offset 0); their minimum adds `m * s` per block
//! with Q8_1's `s`.

use std::arch::x86_64::*;

use super::{
    KIND_Q4_0, KIND_Q4_1, KIND_Q5_0, KIND_Q5_1, KQ_Q5_K, KQ_Q6_K, WT_F16, WT_F32, kind_act_bytes,
    kind_act_qs_at, kind_affine, kind_block_bytes, kind_offset, kind_qh_at, kind_qs_at,
    kq_block_bytes,
};
use crate::cpu::kquant::{BLOCK_Q8_K_BYTES, QK_K, kq_scales_mins};

/// Loads 16 weights of type `WT` starting at element `i` as f32.
///
/// # Safety
/// `p` must be valid for reading elements `i..i + 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_w16<const WT: u8>(p: *const u8, i: usize) -> __m512 {
    // SAFETY: the caller guarantees elements `i..i + 16` are readable.
    unsafe {
        match WT {
            WT_F32 => _mm512_loadu_ps(p.add(i * 4) as *const f32),
            WT_F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(i * 2) as *const __m256i)),
            _ => {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(i * 2) as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
            }
        }
    }
}

/// Masked version of [`load_w16`]: lanes outside `m` are zero and not read.
///
/// # Safety
/// `p` must be valid for reading the elements `i + j` for every set bit `j`
/// of `m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_w16_mask<const WT: u8>(p: *const u8, i: usize, m: __mmask16) -> __m512 {
    // SAFETY: masked loads do not touch masked-off elements.
    unsafe {
        match WT {
            WT_F32 => _mm512_maskz_loadu_ps(m, p.add(i * 4) as *const f32),
            WT_F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.add(i * 2) as *const i16)),
            _ => {
                let h =
                    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p.add(i * 2) as *const i16));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
            }
        }
    }
}

/// Dot product of `n` f32 values.
///
/// # Safety
/// AVX-512 must be available; `a` and `b` must be valid for reading `n` f32
/// each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    // SAFETY: every (masked) load reads elements below `n`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 64 <= n {
            for (j, acc) in acc.iter_mut().enumerate() {
                let va = _mm512_loadu_ps(a.add(i + 16 * j));
                let vb = _mm512_loadu_ps(b.add(i + 16 * j));
                *acc = _mm512_fmadd_ps(va, vb, *acc);
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)), acc[0]);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
            let va = _mm512_maskz_loadu_ps(m, a.add(i));
            let vb = _mm512_maskz_loadu_ps(m, b.add(i));
            acc[1] = _mm512_fmadd_ps(va, vb, acc[1]);
        }
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(acc[0], acc[1]),
            _mm512_add_ps(acc[2], acc[3]),
        ))
    }
}

/// `R` weight rows (type `WT`) times `C` f32 columns, `k` elements each:
/// returns `res[r][c] = dot(w[r], x[c])`.
///
/// # Safety
/// AVX-512 must be available; every `wp[r]` must be valid for reading `k`
/// elements of type `WT` and every `xp[c]` for reading `k` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn f_tile<const WT: u8, const R: usize, const C: usize>(
    wp: &[*const u8; R],
    xp: &[*const u8; C],
    k: usize,
) -> [[f32; C]; R] {
    // SAFETY: all (masked) loads are of elements below `k`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut i = 0;
        while i + 16 <= k {
            let mut xv = [_mm512_setzero_ps(); C];
            for c in 0..C {
                xv[c] = _mm512_loadu_ps((xp[c] as *const f32).add(i));
            }
            for r in 0..R {
                let wv = load_w16::<WT>(wp[r], i);
                for c in 0..C {
                    acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
                }
            }
            i += 16;
        }
        if i < k {
            let m: __mmask16 = ((1u32 << (k - i)) - 1) as u16;
            let mut xv = [_mm512_setzero_ps(); C];
            for c in 0..C {
                xv[c] = _mm512_maskz_loadu_ps(m, (xp[c] as *const f32).add(i));
            }
            for r in 0..R {
                let wv = load_w16_mask::<WT>(wp[r], i, m);
                for c in 0..C {
                    acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
                }
            }
        }
        let mut res = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                res[r][c] = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
        res
    }
}

/// Builds a 512-bit vector from four unaligned 16-byte loads at `p[i] + off`
/// (128-bit lane `i` from `p[i]`).
///
/// # Safety
/// Each `p[i] + off` must be valid for reading 16 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_4x128(p: &[*const u8; 4], off: usize) -> __m512i {
    // SAFETY: the caller guarantees the four 16-byte reads.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(p[0].add(off) as *const __m128i));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[1].add(off) as *const __m128i));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[2].add(off) as *const __m128i));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[3].add(off) as *const __m128i))
    }
}

/// Loads the f16 scales at `p[i] + off` into a vector whose 128-bit lane `i`
/// holds scale `i` (as f32, four times).
///
/// # Safety
/// Each `p[i] + off` must be valid for reading 2 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_scales_4(p: &[*const u8; 4], off: usize) -> __m512 {
    // SAFETY: the caller guarantees the four 2-byte reads.
    unsafe {
        let rd = |i: usize| (p[i].add(off) as *const i16).read_unaligned();
        let h = _mm_set_epi16(0, 0, 0, 0, rd(3), rd(2), rd(1), rd(0));
        let f = _mm_cvtph_ps(h);
        let idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f))
    }
}

/// Loads one block (at `p[i] + off`) from each of four rows as unsigned
/// bytes: returns (elements 0..16, elements 16..32), 128-bit lane `i` from
/// row `i`. Q8_0: `q + 128`; Q4_0 / Q4_1: the nibble (`q + 8` / the level);
/// Q5_0 / Q5_1: nibble and fifth bit (`q + 16` / the level).
///
/// # Safety
/// Each `p[i] + off` must point to a whole readable block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_wq_4<const KIND: u8>(p: &[*const u8; 4], off: usize) -> (__m512i, __m512i) {
    // SAFETY: the nibbles (16 bytes at `kind_qs_at`) and fifth bits (4 bytes at `kind_qh_at`)
    // lie inside the block, as do Q8_0's 32 quant bytes.
    unsafe {
        match KIND {
            KIND_Q4_0 | KIND_Q5_0 | KIND_Q4_1 | KIND_Q5_1 => {
                let z = load_4x128(p, off + kind_qs_at(KIND));
                let m = _mm512_set1_epi8(0x0F);
                let (lo, hi) = (
                    _mm512_and_si512(z, m),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(z), m),
                );
                if KIND == KIND_Q5_0 || KIND == KIND_Q5_1 {
                    // Fifth bits: bit j of row i's qh is element j; its 16-bit halves become the
                    // byte masks of 128-bit lane i.
                    let (mut klo, mut khi) = (0u64, 0u64);
                    for (i, pi) in p.iter().enumerate() {
                        let qh = u64::from(
                            (pi.add(off + kind_qh_at(KIND)) as *const u32).read_unaligned(),
                        );
                        klo |= (qh & 0xFFFF) << (16 * i);
                        khi |= (qh >> 16) << (16 * i);
                    }
                    let sixteen = _mm512_set1_epi8(16);
                    (
                        _mm512_mask_add_epi8(lo, klo, lo, sixteen),
                        _mm512_mask_add_epi8(hi, khi, hi, sixteen),
                    )
                } else {
                    (lo, hi)
                }
            }
            _ => {
                let s = _mm512_set1_epi8(-128);
                (
                    _mm512_xor_si512(load_4x128(p, off + 2), s),
                    _mm512_xor_si512(load_4x128(p, off + 18), s),
                )
            }
        }
    }
}

/// Sums the four f32 of each 128-bit lane: `out[i] = sum(v[4i..4i+4])`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn lane_sums(v: __m512) -> [f32; 4] {
    let mut a = [0.0f32; 16];
    // SAFETY: `a` has room for 16 f32.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) };
    let mut out = [0.0f32; 4];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (a[4 * i] + a[4 * i + 1]) + (a[4 * i + 2] + a[4 * i + 3]);
    }
    out
}

/// `4 * S` quantized weight rows (Q8_0, Q4_0 or Q5_0 by `KIND`) times `C` Q8_0
/// columns of `nb` blocks, or Q4_1 / Q5_1 rows times Q8_1 columns:
/// `res[s][c][i] = dot(w[s][i], x[c])`.
///
/// `comp[c]` points to `4 * nb` i32 (per block, the negated offset
/// compensation of each dword position, see `x86::act_tables`; unread for the
/// affine kinds), `dy[c]` to `nb` f32 (the column's block scales) and `sy[c]`
/// to `nb` f32 (Q8_1's `s`; read for the affine kinds only).
///
/// # Safety
/// AVX-512 must be available; every `wp[s][i]` must be valid for reading
/// `nb` weight blocks, every `xp[c]` for reading `nb` activation blocks, every
/// `comp[c]` for reading `4 * nb` i32 and every `dy[c]` and `sy[c]` for `nb` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn q_tile<const KIND: u8, const S: usize, const C: usize>(
    wp: &[[*const u8; 4]; S],
    xp: &[*const u8; C],
    comp: &[*const i32; C],
    dy: &[*const f32; C],
    sy: &[*const f32; C],
    nb: usize,
) -> [[[f32; 4]; C]; S] {
    let (blk, ab, aq) = (
        kind_block_bytes(KIND),
        kind_act_bytes(KIND),
        kind_act_qs_at(KIND),
    );
    // SAFETY: every read is within the first `nb` blocks of its row/column
    // and the first `nb` entries of its table.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; S];
        for b in 0..nb {
            let mut wlo = [_mm512_setzero_si512(); S];
            let mut whi = [_mm512_setzero_si512(); S];
            let mut dw = [_mm512_setzero_ps(); S];
            let mut mw = [_mm512_setzero_ps(); S];
            for s in 0..S {
                (wlo[s], whi[s]) = load_wq_4::<KIND>(&wp[s], b * blk);
                dw[s] = load_scales_4(&wp[s], b * blk);
                if kind_affine(KIND) {
                    // Row i's `m` in one element of lane i: `lane_sums` adds it once.
                    mw[s] = _mm512_maskz_mov_ps(0x1111, load_scales_4(&wp[s], b * blk + 2));
                }
            }
            for c in 0..C {
                let yp = xp[c].add(b * ab + aq);
                let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(yp as *const __m128i));
                let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(yp.add(16) as *const __m128i));
                let cmp = if kind_affine(KIND) {
                    _mm512_setzero_si512()
                } else {
                    _mm512_broadcast_i32x4(_mm_loadu_si128(comp[c].add(b * 4) as *const __m128i))
                };
                let d = _mm512_set1_ps(*dy[c].add(b));
                for s in 0..S {
                    let t = _mm512_dpbusd_epi32(cmp, wlo[s], ylo);
                    let t = _mm512_dpbusd_epi32(t, whi[s], yhi);
                    acc[s][c] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw[s], d), acc[s][c]);
                    if kind_affine(KIND) {
                        acc[s][c] =
                            _mm512_fmadd_ps(mw[s], _mm512_set1_ps(*sy[c].add(b)), acc[s][c]);
                    }
                }
            }
        }
        let mut res = [[[0.0f32; 4]; C]; S];
        for s in 0..S {
            for c in 0..C {
                res[s][c] = lane_sums(acc[s][c]);
            }
        }
        res
    }
}

/// Dot product of one quantized row (Q8_0, Q4_0 or Q5_0 by `KIND`) with one
/// Q8_0 row, or of a Q4_1 / Q5_1 row with a Q8_1 row, `nb` blocks each. Four
/// consecutive blocks are processed per step, one per 128-bit lane.
///
/// # Safety
/// AVX-512 must be available; `x` must be valid for reading `nb` weight
/// blocks and `y` for reading `nb` activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn vec_dot_q<const KIND: u8>(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let (blk, ab, aq) = (
        kind_block_bytes(KIND),
        kind_act_bytes(KIND),
        kind_act_qs_at(KIND),
    );
    // SAFETY: lanes past the end re-read the last valid block group's first
    // block (their contribution is masked to zero); all reads are within `nb`
    // blocks.
    unsafe {
        let off = _mm512_set1_epi8(kind_offset(KIND) as i8);
        let mut acc = _mm512_setzero_ps();
        let mut b = 0;
        while b < nb {
            let n = (nb - b).min(4);
            let blocks = [
                b,
                b + 1usize.min(n - 1),
                b + 2usize.min(n - 1),
                b + 3usize.min(n - 1),
            ];
            let xp = blocks.map(|i| x.add(i * blk));
            let yp = blocks.map(|i| y.add(i * ab));
            let (wlo, whi) = load_wq_4::<KIND>(&xp, 0);
            let ylo = load_4x128(&yp, aq);
            let yhi = load_4x128(&yp, aq + 16);
            let zero = _mm512_setzero_si512();
            let cmp = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, off, ylo), off, yhi);
            let t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, wlo, ylo), whi, yhi);
            let t = _mm512_sub_epi32(t, cmp);
            let lanes: __mmask16 = ((1u32 << (4 * n)) - 1) as u16;
            let sc = _mm512_maskz_mul_ps(lanes, load_scales_4(&xp, 0), load_scales_4(&yp, 0));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sc, acc);
            if kind_affine(KIND) {
                // m·s once per valid block: one element of each lane.
                let ms = _mm512_maskz_mul_ps(
                    lanes & 0x1111,
                    load_scales_4(&xp, 2),
                    load_scales_4(&yp, 2),
                );
                acc = _mm512_add_ps(acc, ms);
            }
            b += 4;
        }
        _mm512_reduce_add_ps(acc)
    }
}

/// f16 at `p` as f32.
///
/// # Safety
/// `p` must be valid for reading 2 bytes; F16C must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees the 2-byte read.
    unsafe {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (p as *const u16).read_unaligned() as i32,
        )))
    }
}

/// `R` Q8_0 weight rows times one Q8_0 column of `nb` blocks (GEMV). Each row is read two blocks
/// per 512-bit register (one 256-bit insert), signs are moved onto the activations
/// (`|w| · (y · sign w)`), so there are no lane shuffles and no offset tables: the loop streams
/// the weights.
///
/// # Safety
/// AVX-512 (F, BW, VL, VNNI) must be available; every `w[i]` must be valid for reading `nb` Q8_0
/// blocks and `y` for reading `nb` Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q8_0<const R: usize>(
    w: &[*const u8; R],
    y: *const u8,
    nb: usize,
) -> [f32; R] {
    // SAFETY: every block index used is below `nb`; blocks are 34 bytes (2 scale + 32 quants).
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = 0;
        while b + 2 <= nb {
            let (o0, o1) = (b * 34, (b + 1) * 34);
            let yv = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(y.add(o0 + 2) as *const __m256i)),
                _mm256_loadu_si256(y.add(o1 + 2) as *const __m256i),
            );
            let (dy0, dy1) = (f16_at(y.add(o0)), f16_at(y.add(o1)));
            for r in 0..R {
                let wv = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(w[r].add(o0 + 2) as *const __m256i)),
                    _mm256_loadu_si256(w[r].add(o1 + 2) as *const __m256i),
                );
                let neg = _mm512_movepi8_mask(wv);
                let sy = _mm512_mask_sub_epi8(yv, neg, zero, yv);
                let t = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wv), sy);
                let sc = _mm512_mask_blend_ps(
                    0xFF00,
                    _mm512_set1_ps(f16_at(w[r].add(o0)) * dy0),
                    _mm512_set1_ps(f16_at(w[r].add(o1)) * dy1),
                );
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sc, acc[r]);
            }
            b += 2;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]);
        }
        if b < nb {
            let o = b * 34;
            let yv = _mm256_loadu_si256(y.add(o + 2) as *const __m256i);
            let dy = f16_at(y.add(o));
            for r in 0..R {
                let wv = _mm256_loadu_si256(w[r].add(o + 2) as *const __m256i);
                let neg = _mm256_movepi8_mask(wv);
                let sy = _mm256_mask_sub_epi8(yv, neg, _mm256_setzero_si256(), yv);
                let t = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), sy);
                let mut lanes = [0i32; 8];
                _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, t);
                out[r] += lanes.iter().sum::<i32>() as f32 * f16_at(w[r].add(o)) * dy;
            }
        }
        out
    }
}

/// In-register transpose of a 16 x 16 f32 matrix (`r[i]` = row `i`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for p in 0..8 {
        t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
    }
    // u[4g + j]: lane L holds element 4L + j of rows 4g..4g+4.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (lo0, hi0, lo1, hi1) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = _mm512_shuffle_ps::<0x44>(lo0, lo1);
        u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(lo0, lo1);
        u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(hi0, hi1);
        u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(hi0, hi1);
    }
    for j in 0..4 {
        let s = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
        let s2 = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
        let q = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
        let q2 = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
        r[j] = _mm512_shuffle_f32x4::<0x88>(s, q);
        r[8 + j] = _mm512_shuffle_f32x4::<0xDD>(s, q);
        r[4 + j] = _mm512_shuffle_f32x4::<0x88>(s2, q2);
        r[12 + j] = _mm512_shuffle_f32x4::<0xDD>(s2, q2);
    }
}

/// Rows per packed weight panel of the float GEMM kernel.
pub(crate) const PANEL_ROWS: usize = 32;

/// Packs elements `k0..k0 + kc` of 32 weight rows (type `WT`) into `wp` as
/// f32, k-major: `wp[kk * 32 + i] = w[i][k0 + kk]`. `kc` is rounded up to a
/// multiple of 16; elements at or past `k` are stored as zeros.
///
/// # Safety
/// AVX-512 must be available; every `rp[i]` must be valid for reading `k`
/// elements of type `WT`; `k0 + kc <= k`; `wp` must be valid for writing
/// `32 * kc.next_multiple_of(16)` f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn pack_panel<const WT: u8>(
    rp: &[*const u8; PANEL_ROWS],
    k0: usize,
    kc: usize,
    k: usize,
    wp: *mut f32,
) {
    // SAFETY: loads are (masked to) elements below `k`; stores stay within
    // `32 * kc.next_multiple_of(16)` f32 of `wp`.
    unsafe {
        let mut kk = 0;
        while kk < kc {
            let i = k0 + kk;
            let n = (k - i).min(16);
            let m: __mmask16 = ((1u32 << n) - 1) as u16;
            for h in 0..2 {
                let mut r = [_mm512_setzero_ps(); 16];
                for (j, rj) in r.iter_mut().enumerate() {
                    *rj = if n == 16 {
                        load_w16::<WT>(rp[16 * h + j], i)
                    } else {
                        load_w16_mask::<WT>(rp[16 * h + j], i, m)
                    };
                }
                transpose16(&mut r);
                for (e, re) in r.iter().enumerate() {
                    _mm512_storeu_ps(wp.add((kk + e) * PANEL_ROWS + 16 * h), *re);
                }
            }
            kk += 16;
        }
    }
}

/// Micro-kernel: 32 packed rows x `C` columns over `kc` elements:
/// `out[c][i] (+)= sum_kk wp[kk * 32 + i] * x[c][kk]`, rows masked by
/// `mask` (bits 0..16: rows 0..16, bits 16..32: rows 16..32). With
/// `accumulate`, the current `out` values are added to.
///
/// # Safety
/// AVX-512 must be available; `wp` must be valid for reading `32 * kc` f32;
/// every `xp[c]` for reading `kc` f32 (unaligned); every `op[c] + i` for
/// reading and writing, for each row `i` whose mask bit is set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn panel_kernel<const C: usize>(
    wp: *const f32,
    xp: &[*const f32; C],
    kc: usize,
    op: &[*mut f32; C],
    mask: u32,
    accumulate: bool,
) {
    // SAFETY: see the function's contract; masked loads/stores only touch
    // the rows whose mask bit is set.
    unsafe {
        let m = [mask as u16, (mask >> 16) as u16];
        let mut acc = [[_mm512_setzero_ps(); C]; 2];
        if accumulate {
            for s in 0..2 {
                for c in 0..C {
                    acc[s][c] = _mm512_maskz_loadu_ps(m[s], op[c].wrapping_add(16 * s));
                }
            }
        }
        for kk in 0..kc {
            let w0 = _mm512_loadu_ps(wp.add(kk * PANEL_ROWS));
            let w1 = _mm512_loadu_ps(wp.add(kk * PANEL_ROWS + 16));
            for c in 0..C {
                let b = _mm512_set1_ps(xp[c].add(kk).read_unaligned());
                acc[0][c] = _mm512_fmadd_ps(w0, b, acc[0][c]);
                acc[1][c] = _mm512_fmadd_ps(w1, b, acc[1][c]);
            }
        }
        for s in 0..2 {
            for c in 0..C {
                _mm512_mask_storeu_ps(op[c].wrapping_add(16 * s), m[s], acc[s][c]);
            }
        }
    }
}

/// `vpermw` index tables spreading per-group i16 scales over the 32 i16 lanes of the `maddubs`
/// result of 64-element chunk `u`: Q4_K / Q5_K lane `l` takes sub-block `2u + l / 16`, Q6_K lane
/// `l` takes group `4u + l / 8`.
const fn scale_idx(q6: bool) -> [[i16; 32]; 4] {
    let mut t = [[0i16; 32]; 4];
    let mut u = 0;
    while u < 4 {
        let mut l = 0;
        while l < 32 {
            t[u][l] = if q6 { 4 * u + l / 8 } else { 2 * u + l / 16 } as i16;
            l += 1;
        }
        u += 1;
    }
    t
}
static SCALE_IDX_K4: [[i16; 32]; 4] = scale_idx(false);
static SCALE_IDX_K6: [[i16; 32]; 4] = scale_idx(true);

/// One K-quant super-block unpacked for the AVX-512 dot: 4 × 64 unsigned levels in element
/// order, the matching per-lane i16 scales, the i16 factors of the 16 activation sums, and the
/// f32 factors of the scaled sum (`d`) and of the correction (`dm`).
struct KqBlock {
    w: [__m512i; 4],
    s: [__m512i; 4],
    corr: __m256i,
    d: f32,
    dm: f32,
}

/// Unpacks the super-block at `p` (see [`KqBlock`]).
///
/// # Safety
/// `p` must be valid for reading one super-block of the kind.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn kq_unpack<const KIND: u8>(p: *const u8) -> KqBlock {
    // SAFETY: all reads are inside the super-block (see `avx2::kq_tile` for the offsets).
    unsafe {
        let low4 = _mm512_set1_epi8(0x0F);
        if KIND == KQ_Q6_K {
            let d = f16_at(p.add(208));
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
            let scz = _mm512_castsi256_si512(sc16);
            // Bits 4–5 of the levels: lower 256 bits from qh bits 0–1 (then 4–5), upper from
            // bits 2–3 (then 6–7).
            let cnt_lo = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
            let cnt_hi = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
            let m30 = _mm512_set1_epi8(0x30);
            let mut w = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let l = _mm512_loadu_si512(p.add(64 * h) as *const _);
                let qh =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h) as *const _));
                let hb_lo = _mm512_and_si512(_mm512_sllv_epi16(qh, cnt_lo), m30);
                let hb_hi = _mm512_and_si512(_mm512_srlv_epi16(qh, cnt_hi), m30);
                w[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low4), hb_lo);
                w[2 * h + 1] =
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), low4), hb_hi);
            }
            let s = std::array::from_fn(|u| {
                _mm512_permutexvar_epi16(
                    _mm512_loadu_si512(SCALE_IDX_K6[u].as_ptr() as *const _),
                    scz,
                )
            });
            KqBlock {
                w,
                s,
                corr: _mm256_slli_epi16::<5>(sc16),
                d,
                dm: d,
            }
        } else {
            let (d, dmin) = (f16_at(p), f16_at(p.add(2)));
            let (sc8, m8) = kq_scales_mins((p.add(4) as *const [u8; 12]).read_unaligned());
            let scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64)));
            let mins = _mm_cvtsi64_si128(m8 as i64);
            let qs = p.add(if KIND == KQ_Q5_K { 48 } else { 16 });
            let a = _mm512_loadu_si512(qs as *const _);
            let b = _mm512_loadu_si512(qs.add(64) as *const _);
            let (alo, ahi) = (
                _mm512_and_si512(a, low4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(a), low4),
            );
            let (blo, bhi) = (
                _mm512_and_si512(b, low4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(b), low4),
            );
            // Chunk c of 64 elements is (low nibbles, high nibbles) of bytes 32c..32c + 32.
            let mut w = [
                _mm512_shuffle_i64x2::<0x44>(alo, ahi),
                _mm512_shuffle_i64x2::<0xEE>(alo, ahi),
                _mm512_shuffle_i64x2::<0x44>(blo, bhi),
                _mm512_shuffle_i64x2::<0xEE>(blo, bhi),
            ];
            if KIND == KQ_Q5_K {
                // Sub-block s takes bit s of qh[l]: lower half of chunk u tests bit 2u of qh,
                // upper half bit 2u of qh >> 1.
                let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
                let qh2 =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qh), _mm256_srli_epi16::<1>(qh));
                let sixteen = _mm512_set1_epi8(16);
                for (u, wu) in w.iter_mut().enumerate() {
                    let k = _mm512_test_epi8_mask(qh2, _mm512_set1_epi8(1 << (2 * u)));
                    *wu = _mm512_mask_add_epi8(*wu, k, *wu, sixteen);
                }
            }
            let s = std::array::from_fn(|u| {
                _mm512_permutexvar_epi16(
                    _mm512_loadu_si512(SCALE_IDX_K4[u].as_ptr() as *const _),
                    scz,
                )
            });
            KqBlock {
                w,
                s,
                corr: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
                d,
                dm: dmin,
            }
        }
    }
}

/// Horizontal sum of 8 f32 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// One K-quant row (by `KIND`) times `C` Q8_K columns of `nb` super-blocks:
/// `res[c] = dot(w, x[c])`. Each super-block is unpacked once ([`kq_unpack`]) for all columns;
/// per column, `maddubs` (u8 levels × i8 activations) and `vpdpwssd` (× i16 scales) accumulate
/// the scaled integer sum, and the activation sums times the mins (or Q6_K's `32·scale` offset)
/// give the correction.
///
/// # Safety
/// AVX-512 must be available; `w` must be valid for reading `nb` super-blocks of the kind and
/// every `xp[c]` for reading `nb` Q8_K super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn kq_tile<const KIND: u8, const C: usize>(
    w: *const u8,
    xp: &[*const u8; C],
    nb: usize,
) -> [f32; C] {
    let blk = kq_block_bytes(KIND);
    // SAFETY: every read is inside super-block `b < nb` of the row or of a column (Q8_K: d at
    // 0..4, quants 4..260, sums 260..292).
    unsafe {
        let mut acc = [_mm512_setzero_ps(); C];
        let mut accm = [_mm256_setzero_ps(); C];
        for b in 0..nb {
            let u = kq_unpack::<KIND>(w.add(b * blk));
            for c in 0..C {
                let y = xp[c].add(b * BLOCK_Q8_K_BYTES);
                let dy = (y as *const f32).read_unaligned();
                let mut isum = _mm512_setzero_si512();
                for t in 0..4 {
                    let yv = _mm512_loadu_si512(y.add(4 + 64 * t) as *const _);
                    isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u.w[t], yv), u.s[t]);
                }
                acc[c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(u.d * dy), acc[c]);
                let bs = _mm256_loadu_si256(y.add(4 + QK_K) as *const __m256i);
                accm[c] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, u.corr)),
                    _mm256_set1_ps(u.dm * dy),
                    accm[c],
                );
            }
        }
        std::array::from_fn(|c| _mm512_reduce_add_ps(acc[c]) - hsum256(accm[c]))
    }
}
