//! AVX2 + FMA + F16C kernels.
//!
//! Every function here is `unsafe`: the caller must make sure the CPU
//! supports AVX2, FMA and F16C and that every pointer is valid for the reads
//! the documentation states. No alignment is assumed anywhere.

use std::arch::x86_64::*;

use super::{
    KIND_Q4_0, KIND_Q4_1, KIND_Q5_0, KIND_Q5_1, KQ_Q5_K, KQ_Q6_K, WT_BF16, WT_F16, WT_F32,
    kind_act_bytes, kind_act_qs_at, kind_affine, kind_block_bytes, kind_qh_at, kind_qs_at,
    kq_block_bytes,
};
use crate::cpu::kquant::{BLOCK_Q8_K_BYTES, QK_K, kq_scales_mins};

/// Horizontal sum of 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Converts one f16 bit pattern to f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn f16_bits_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Reads the (unaligned, little-endian) f16 scale of a block as f32.
///
/// # Safety
/// `p` must be valid for reading 2 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`.
    f16_bits_to_f32(unsafe { (p as *const u16).read_unaligned() })
}

/// Dot product of `n` f32 values.
///
/// # Safety
/// AVX2/FMA/F16C must be available; `a` and `b` must be valid for reading
/// `n` f32 each.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    // SAFETY: every load reads elements below `n` of `a` and `b`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (j, acc) in acc.iter_mut().enumerate() {
                let va = _mm256_loadu_ps(a.add(i + 8 * j));
                let vb = _mm256_loadu_ps(b.add(i + 8 * j));
                *acc = _mm256_fmadd_ps(va, vb, *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc[0]);
            i += 8;
        }
        let mut tail = 0.0f32;
        while i < n {
            tail += *a.add(i) * *b.add(i);
            i += 1;
        }
        hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        )) + tail
    }
}

/// Loads 8 weights of type `WT` starting at element `i` as f32.
///
/// # Safety
/// `p` must be valid for reading elements `i..i + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_w8<const WT: u8>(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees elements `i..i + 8` are readable.
    unsafe {
        match WT {
            WT_F32 => _mm256_loadu_ps(p.add(i * 4) as *const f32),
            WT_F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(i * 2) as *const __m128i)),
            _ => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(i * 2) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
        }
    }
}

/// Scalar load of weight element `i` of type `WT`.
///
/// # Safety
/// `p` must be valid for reading element `i`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_w1<const WT: u8>(p: *const u8, i: usize) -> f32 {
    // SAFETY: the caller guarantees element `i` is readable.
    unsafe {
        match WT {
            WT_F32 => (p.add(i * 4) as *const f32).read_unaligned(),
            WT_F16 => f16_bits_to_f32((p.add(i * 2) as *const u16).read_unaligned()),
            _ => f32::from_bits(((p.add(i * 2) as *const u16).read_unaligned() as u32) << 16),
        }
    }
}

/// `R` weight rows (type `WT`) times `C` f32 columns, `k` elements each:
/// returns `res[r][c] = dot(w[r], x[c])`.
///
/// # Safety
/// AVX2/FMA/F16C must be available; every `wp[r]` must be valid for reading
/// `k` elements of type `WT` and every `xp[c]` for reading `k` f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f_tile<const WT: u8, const R: usize, const C: usize>(
    wp: &[*const u8; R],
    xp: &[*const u8; C],
    k: usize,
) -> [[f32; C]; R] {
    // SAFETY: all loads are of elements below `k` of the rows/columns given.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut i = 0;
        while i + 8 <= k {
            let mut xv = [_mm256_setzero_ps(); C];
            for c in 0..C {
                xv[c] = _mm256_loadu_ps((xp[c] as *const f32).add(i));
            }
            for r in 0..R {
                let wv = load_w8::<WT>(wp[r], i);
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
                }
            }
            i += 8;
        }
        let mut res = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let mut t = 0.0f32;
                for j in i..k {
                    t += load_w1::<WT>(wp[r], j) * (xp[c] as *const f32).add(j).read_unaligned();
                }
                res[r][c] = hsum(acc[r][c]) + t;
            }
        }
        res
    }
}

/// Converts `n` f16 (`BF16 == false`) or bf16 values at `src` to f32 at `dst`.
///
/// # Safety
/// AVX2/FMA/F16C must be available; `src` must be valid for reading `2 * n`
/// bytes and `dst` for writing `n` f32 (no alignment needed).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn convert_half_row<const BF16: bool>(src: *const u8, dst: *mut f32, n: usize) {
    // SAFETY: reads and writes stay below `n` elements.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            let v = if BF16 {
                load_w8::<WT_BF16>(src, i)
            } else {
                load_w8::<WT_F16>(src, i)
            };
            _mm256_storeu_ps(dst.add(i), v);
            i += 8;
        }
        while i < n {
            let v = if BF16 {
                load_w1::<WT_BF16>(src, i)
            } else {
                load_w1::<WT_F16>(src, i)
            };
            dst.add(i).write_unaligned(v);
            i += 1;
        }
    }
}

/// Expands the 32 bits at `p` to 32 bytes: byte `i` is 0xFF if bit `i` is set, else 0.
///
/// # Safety
/// `p` must be valid for reading 4 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes.
    let bits = unsafe { (p as *const u32).read_unaligned() };
    let v = _mm256_set1_epi32(bits as i32);
    // Byte i takes byte i / 8 of the word, then every bit but bit i % 8 is forced on.
    let v = _mm256_shuffle_epi8(
        v,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1))
}

/// Loads one block's 32 quants (`KIND`): Q8_0, Q4_0 or Q5_0 as signed i8, Q4_1 or Q5_1 as their
/// unsigned levels.
///
/// # Safety
/// `p` must point to a whole readable block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_q<const KIND: u8>(p: *const u8) -> __m256i {
    // SAFETY: the nibbles (16 bytes at `kind_qs_at`) and fifth bits (4 bytes at `kind_qh_at`)
    // lie inside the block, as do Q8_0's 32 quant bytes.
    unsafe {
        match KIND {
            KIND_Q4_0 | KIND_Q5_0 | KIND_Q4_1 | KIND_Q5_1 => {
                let q = _mm_loadu_si128(p.add(kind_qs_at(KIND)) as *const __m128i);
                let v = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
                let v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                match KIND {
                    // q − 16 = nibble when the fifth bit is set, nibble − 16 (= nibble | 0xF0
                    // as i8) when it is clear.
                    KIND_Q5_0 => {
                        let hb = bytes_from_bits_32(p.add(kind_qh_at(KIND)));
                        _mm256_or_si256(v, _mm256_andnot_si256(hb, _mm256_set1_epi8(-16)))
                    }
                    KIND_Q5_1 => {
                        let hb = bytes_from_bits_32(p.add(kind_qh_at(KIND)));
                        _mm256_or_si256(v, _mm256_and_si256(hb, _mm256_set1_epi8(16)))
                    }
                    KIND_Q4_1 => v,
                    _ => _mm256_sub_epi8(v, _mm256_set1_epi8(8)),
                }
            }
            _ => _mm256_loadu_si256(p.add(2) as *const __m256i),
        }
    }
}

/// `R` quantized weight rows (Q8_0, Q4_0 or Q5_0 by `KIND`) times `C` Q8_0
/// columns of `nb` blocks, or Q4_1 / Q5_1 rows times Q8_1 columns:
/// `res[r][c] = dot(w[r], x[c])`.
///
/// # Safety
/// AVX2/FMA/F16C must be available; every `wp[r]` must be valid for reading
/// `nb` weight blocks and every `xp[c]` for reading `nb` activation blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q_tile<const KIND: u8, const R: usize, const C: usize>(
    wp: &[*const u8; R],
    xp: &[*const u8; C],
    nb: usize,
) -> [[f32; C]; R] {
    let (blk, ab, aq) = (
        kind_block_bytes(KIND),
        kind_act_bytes(KIND),
        kind_act_qs_at(KIND),
    );
    // SAFETY: every block read is below `nb` blocks of its row/column.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // The affine kinds' `m·s` per block, summed apart as ggml's `summs`.
        let mut summs = [[0.0f32; C]; R];
        for b in 0..nb {
            let mut wv = [_mm256_setzero_si256(); R];
            let mut ax = [_mm256_setzero_si256(); R];
            let mut dw = [0.0f32; R];
            let mut mw = [0.0f32; R];
            for r in 0..R {
                let p = wp[r].add(b * blk);
                dw[r] = scale_at(p);
                wv[r] = load_q::<KIND>(p);
                if kind_affine(KIND) {
                    mw[r] = scale_at(p.add(2));
                } else {
                    ax[r] = _mm256_abs_epi8(wv[r]);
                }
            }
            for c in 0..C {
                let p = xp[c].add(b * ab);
                let dy = scale_at(p);
                let y = _mm256_loadu_si256(p.add(aq) as *const __m256i);
                let sy = if kind_affine(KIND) {
                    scale_at(p.add(2))
                } else {
                    0.0
                };
                for r in 0..R {
                    // maddubs takes unsigned × signed: the affine levels are unsigned already,
                    // signed quants move their sign onto the activations.
                    let p16 = if kind_affine(KIND) {
                        summs[r][c] += mw[r] * sy;
                        _mm256_maddubs_epi16(wv[r], y)
                    } else {
                        _mm256_maddubs_epi16(ax[r], _mm256_sign_epi8(y, wv[r]))
                    };
                    let s = _mm256_madd_epi16(p16, ones);
                    acc[r][c] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(s),
                        _mm256_set1_ps(dw[r] * dy),
                        acc[r][c],
                    );
                }
            }
        }
        let mut res = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                res[r][c] = hsum(acc[r][c]) + summs[r][c];
            }
        }
        res
    }
}

/// One K-quant row (by `KIND`) times `C` Q8_K columns of `nb` super-blocks:
/// `res[c] = dot(w, x[c])`. Each super-block is unpacked once into eight vectors of 32 unsigned
/// levels plus per-lane i16 scales; `maddubs` / `madd` give the scaled integer sum, and the
/// activation sums (`bsums`) times the mins (Q4_K / Q5_K) or `32·scale` (Q6_K's offset) give the
/// correction.
///
/// # Safety
/// AVX2/FMA/F16C must be available; `w` must be valid for reading `nb` super-blocks of the kind
/// and every `xp[c]` for reading `nb` Q8_K super-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kq_tile<const KIND: u8, const C: usize>(
    w: *const u8,
    xp: &[*const u8; C],
    nb: usize,
) -> [f32; C] {
    let blk = kq_block_bytes(KIND);
    // SAFETY: every read is inside super-block `b < nb` of the row or of a column (Q6_K: ql at
    // 0..128, qh 128..192, scales 192..208, d 208; Q4_K / Q5_K: d, dmin 0..4, scales 4..16, Q5_K
    // qh 16..48, qs up to the block end; Q8_K: d 0..4, qs 4..260, bsums 260..292).
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); C];
        let mut accm = [_mm256_setzero_ps(); C];
        for b in 0..nb {
            let p = w.add(b * blk);
            let mut wv = [_mm256_setzero_si256(); 8];
            let mut sv = [_mm256_setzero_si256(); 8];
            let (corr, d, dm);
            if KIND == KQ_Q6_K {
                d = scale_at(p.add(208));
                dm = d;
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
                corr = _mm256_slli_epi16::<5>(sc16);
                let three = _mm256_set1_epi8(3);
                for h in 0..2 {
                    let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
                    let l0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
                    let l1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
                    let hb = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, three));
                    wv[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, low4), hb(qh));
                    wv[4 * h + 1] =
                        _mm256_or_si256(_mm256_and_si256(l1, low4), hb(_mm256_srli_epi16::<2>(qh)));
                    wv[4 * h + 2] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(l0), low4),
                        hb(_mm256_srli_epi16::<4>(qh)),
                    );
                    wv[4 * h + 3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(l1), low4),
                        hb(_mm256_srli_epi16::<6>(qh)),
                    );
                }
                let sc = p.add(192) as *const i8;
                for (t, s) in sv.iter_mut().enumerate() {
                    *s = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(*sc.add(2 * t + 1))),
                        _mm_set1_epi16(i16::from(*sc.add(2 * t))),
                    );
                }
            } else {
                d = scale_at(p);
                dm = scale_at(p.add(2));
                let (sc8, m8) = kq_scales_mins((p.add(4) as *const [u8; 12]).read_unaligned());
                let mins = _mm_cvtsi64_si128(m8 as i64);
                corr = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
                let qs = p.add(if KIND == KQ_Q5_K { 48 } else { 16 });
                for c in 0..4 {
                    let q = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
                    wv[2 * c] = _mm256_and_si256(q, low4);
                    wv[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
                }
                if KIND == KQ_Q5_K {
                    let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
                    let sixteen = _mm256_set1_epi8(16);
                    for (t, v) in wv.iter_mut().enumerate() {
                        let bit = _mm256_set1_epi8((1u8 << t) as i8);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                        *v = _mm256_or_si256(*v, _mm256_and_si256(set, sixteen));
                    }
                }
                for (t, s) in sv.iter_mut().enumerate() {
                    *s = _mm256_set1_epi16(((sc8 >> (8 * t)) & 0xFF) as i16);
                }
            }
            for c in 0..C {
                let y = xp[c].add(b * BLOCK_Q8_K_BYTES);
                let dy = (y as *const f32).read_unaligned();
                let mut isum = _mm256_setzero_si256();
                for t in 0..8 {
                    let yv = _mm256_loadu_si256(y.add(4 + 32 * t) as *const __m256i);
                    let p16 = _mm256_maddubs_epi16(wv[t], yv);
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, sv[t]));
                }
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dy), acc[c]);
                let bs = _mm256_loadu_si256(y.add(4 + QK_K) as *const __m256i);
                accm[c] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, corr)),
                    _mm256_set1_ps(dm * dy),
                    accm[c],
                );
            }
        }
        std::array::from_fn(|c| hsum(acc[c]) - hsum(accm[c]))
    }
}
