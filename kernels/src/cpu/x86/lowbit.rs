//! AVX2 and AVX-512 dot products of the low-bit and non-linear weight formats: Q2_K, Q3_K and
//! IQ4_XS against Q8_K activations, IQ4_NL and MXFP4 against Q8_0.
//!
//! Each 32-element chunk of weights becomes 32 bytes: Q2_K / Q3_K levels as unsigned bytes
//! (Q3_K's `q − 4` offset is taken back through Q8_K's group sums), the non-linear formats'
//! levels by a 16-entry `vpshufb` table lookup (signed; `|w|` times `sign(w)·y` keeps
//! `vpmaddubsw`'s operands in range). Products are exact integers; scales are applied per group
//! of 16 or 32 in 16-bit lanes (`vpmaddwd`, or `vpdpwssd` with AVX-512 VNNI) and per block or
//! super-block in f32. The AVX2 and AVX-512 kernels are one body instantiated twice: the
//! AVX-512 one fuses the integer multiply-adds with VNNI (`vpdpbusd`, `vpdpwssd`) on 256-bit
//! vectors.

use std::arch::x86_64::*;

use super::super::features::Isa;
use super::super::iquant::{
    self, BLOCK_IQ4_NL_BYTES, BLOCK_IQ4_XS_BYTES, BLOCK_MXFP4_BYTES, KVALUES_IQ4NL, KVALUES_MXFP4,
    e8m0_to_f32_half, iq4xs_scale,
};
use super::super::kquant::{BLOCK_Q8_K_BYTES, f16_at};
use super::super::lowbit::{self, BLOCK_Q2_K_BYTES, BLOCK_Q3_K_BYTES, q3k_scale};
use super::super::quant::BLOCK_Q8_0_BYTES;
use super::super::tile::{WeightType, act_row_bytes, act_type};

/// Kind of the low-bit kernels: Q2_K weights (Q8_K activations).
pub(crate) const LB_Q2_K: u8 = 0;
/// Kind of the low-bit kernels: Q3_K weights (Q8_K activations).
pub(crate) const LB_Q3_K: u8 = 1;
/// Kind of the low-bit kernels: IQ4_XS weights (Q8_K activations).
pub(crate) const LB_IQ4_XS: u8 = 2;
/// Kind of the low-bit kernels: IQ4_NL weights (Q8_0 activations).
pub(crate) const LB_IQ4_NL: u8 = 3;
/// Kind of the low-bit kernels: MXFP4 weights (Q8_0 activations).
pub(crate) const LB_MXFP4: u8 = 4;

/// Bytes per weight block of a kind.
const fn block_bytes(kind: u8) -> usize {
    match kind {
        LB_Q2_K => BLOCK_Q2_K_BYTES,
        LB_Q3_K => BLOCK_Q3_K_BYTES,
        LB_IQ4_XS => BLOCK_IQ4_XS_BYTES,
        LB_IQ4_NL => BLOCK_IQ4_NL_BYTES,
        _ => BLOCK_MXFP4_BYTES,
    }
}

/// Bytes per activation block of a kind.
const fn act_bytes(kind: u8) -> usize {
    match kind {
        LB_Q2_K | LB_Q3_K | LB_IQ4_XS => BLOCK_Q8_K_BYTES,
        _ => BLOCK_Q8_0_BYTES,
    }
}

/// Dot product of a weight row of a kind with its activation row, over the whole blocks both
/// hold.
pub(crate) fn vec_dot_lb<const KIND: u8>(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
    let nb = (x.len() / block_bytes(KIND)).min(y.len() / act_bytes(KIND));
    let (x, y) = (&x[..nb * block_bytes(KIND)], &y[..nb * act_bytes(KIND)]);
    match isa.clamp_to_supported() {
        // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C are supported (clamped to the
        // detected level); the kernels index only through bounds-checked slices.
        Isa::Avx512 => unsafe { v512::dot::<KIND>(x, y) },
        // SAFETY: AVX2, FMA and F16C are supported (clamped to the detected level).
        Isa::Avx2 => unsafe { v256::dot::<KIND>(x, y) },
        _ => match KIND {
            LB_Q2_K => lowbit::vec_dot_q2_k_q8_k(x, y),
            LB_Q3_K => lowbit::vec_dot_q3_k_q8_k(x, y),
            LB_IQ4_XS => iquant::vec_dot_iq4_xs_q8_k(x, y),
            LB_IQ4_NL => iquant::vec_dot_iq4_nl_q8_0(x, y),
            _ => iquant::vec_dot_mxfp4_q8_0(x, y),
        },
    }
}

/// Tile matmul for the low-bit weight types: one dot product per (row, column). Arguments were
/// checked by `check_tile_args`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
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
) {
    let (wrow, xrow) = (wt.row_bytes(k), act_row_bytes(act_type(wt), k));
    let dot: fn(Isa, &[u8], &[u8]) -> f32 = match wt {
        WeightType::Q2_K => vec_dot_lb::<LB_Q2_K>,
        WeightType::Q3_K => vec_dot_lb::<LB_Q3_K>,
        WeightType::IQ4_XS => vec_dot_lb::<LB_IQ4_XS>,
        WeightType::IQ4_NL => vec_dot_lb::<LB_IQ4_NL>,
        _ => vec_dot_lb::<LB_MXFP4>,
    };
    for r in 0..rows {
        let wr = &w[r * w_stride..r * w_stride + wrow];
        for c in 0..cols {
            out[c * ldo + r] = dot(isa, wr, &x[c * x_stride..c * x_stride + xrow]);
        }
    }
}

/// 32 bytes of `s` (bounds-checked).
#[inline(always)]
fn load32(s: &[u8]) -> __m256i {
    let s = &s[..32];
    // SAFETY: `s` holds 32 readable bytes; `loadu` takes any alignment.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// 16 bytes of `s` (bounds-checked).
#[inline(always)]
fn load16(s: &[u8]) -> __m128i {
    let s = &s[..16];
    // SAFETY: `s` holds 16 readable bytes; `loadu` takes any alignment.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// The i16 group sum `g` of a Q8_K block.
#[inline(always)]
fn bsum(by: &[u8], g: usize) -> i32 {
    i32::from(i16::from_le_bytes([by[260 + 2 * g], by[261 + 2 * g]]))
}

/// AVX2: Σ of four u8 × i8 products per i32 lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot4_avx2(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// AVX2: `acc + Σ pairs of p × s` per i32 lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn acc16_avx2(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
}

/// AVX-512 VNNI: Σ of four u8 × i8 products per i32 lane (`vpdpbusd`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dot4_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
}

/// AVX-512 VNNI: `acc + Σ pairs of p × s` per i32 lane (`vpdpwssd`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn acc16_vnni(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, s)
}

/// Instantiates the kernels for one instruction set: `$feat` is its feature list, `$dot4` and
/// `$acc16` its integer primitives.
macro_rules! kernels {
    ($m:ident, $feat:literal, $dot4:ident, $acc16:ident) => {
        pub(super) mod $m {
            use super::*;

            /// Horizontal sum of 8 lanes.
            #[target_feature(enable = $feat)]
            #[inline]
            fn hsum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
            }

            /// The 32 table levels a group's 16 index bytes select (low nibbles first).
            #[target_feature(enable = $feat)]
            #[inline]
            fn lookup(table: __m256i, q: __m128i) -> __m256i {
                let m4 = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(q, m4);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
                _mm256_shuffle_epi8(table, _mm256_set_m128i(hi, lo))
            }

            /// A 16-entry i8 table in both 128-bit lanes.
            #[target_feature(enable = $feat)]
            #[inline]
            fn table(t: &[i8; 16]) -> __m256i {
                let b: [u8; 16] = t.map(|v| v as u8);
                _mm256_broadcastsi128_si256(load16(&b))
            }

            /// Two groups' 16-bit scales: the low 128-bit lane gets `s0`, the high one `s1`.
            #[target_feature(enable = $feat)]
            #[inline]
            fn scales2(s0: i32, s1: i32) -> __m256i {
                _mm256_set_m128i(_mm_set1_epi16(s1 as i16), _mm_set1_epi16(s0 as i16))
            }

            /// Dot product over whole blocks of `x` and `y` (lengths already matched).
            ///
            /// # Safety
            /// The CPU must support every feature in this module's feature list.
            #[target_feature(enable = $feat)]
            pub(crate) fn dot<const KIND: u8>(x: &[u8], y: &[u8]) -> f32 {
                match KIND {
                    LB_Q2_K => q2_k(x, y),
                    LB_Q3_K => q3_k(x, y),
                    LB_IQ4_XS => iq4_xs(x, y),
                    _ => nl_q8_0::<KIND>(x, y),
                }
            }

            #[target_feature(enable = $feat)]
            fn q2_k(x: &[u8], y: &[u8]) -> f32 {
                let m3 = _mm256_set1_epi8(3);
                let mut acc = _mm256_setzero_ps();
                let mut mins = 0.0f32;
                for (bx, by) in x
                    .chunks_exact(BLOCK_Q2_K_BYTES)
                    .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
                {
                    let dy = f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
                    let summs: i32 = (0..16).map(|g| bsum(by, g) * i32::from(bx[g] >> 4)).sum();
                    let mut isum = _mm256_setzero_si256();
                    for h in 0..2 {
                        let q = load32(&bx[16 + 32 * h..]);
                        for t in 0..4 {
                            let c = 4 * h + t;
                            let shift = _mm_cvtsi32_si128(2 * t as i32);
                            let lv = _mm256_and_si256(_mm256_srl_epi16(q, shift), m3);
                            let p = _mm256_maddubs_epi16(lv, load32(&by[4 + 32 * c..]));
                            let s =
                                scales2(i32::from(bx[2 * c] & 0xF), i32::from(bx[2 * c + 1] & 0xF));
                            isum = $acc16(isum, p, s);
                        }
                    }
                    let dall = dy * f16_at(bx, 80);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dall), acc);
                    mins += dy * f16_at(bx, 82) * summs as f32;
                }
                hsum(acc) - mins
            }

            #[target_feature(enable = $feat)]
            fn q3_k(x: &[u8], y: &[u8]) -> f32 {
                let m3 = _mm256_set1_epi8(3);
                let four = _mm256_set1_epi8(4);
                let mut acc = _mm256_setzero_ps();
                let mut corr = 0.0f32;
                for (bx, by) in x
                    .chunks_exact(BLOCK_Q3_K_BYTES)
                    .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
                {
                    let sc: [i32; 16] =
                        std::array::from_fn(|j| i32::from(q3k_scale(&bx[96..108], j)) - 32);
                    // Levels are stored as q + 4: take back 4·Σy per group.
                    let offset: i32 = (0..16).map(|g| 4 * sc[g] * bsum(by, g)).sum();
                    let hm = load32(bx);
                    let mut isum = _mm256_setzero_si256();
                    for h in 0..2 {
                        let q = load32(&bx[32 + 32 * h..]);
                        for t in 0..4 {
                            let c = 4 * h + t;
                            let shift = _mm_cvtsi32_si128(2 * t as i32);
                            let low = _mm256_and_si256(_mm256_srl_epi16(q, shift), m3);
                            let bit = _mm256_set1_epi8((1u8 << c) as i8);
                            let unset = _mm256_cmpeq_epi8(
                                _mm256_and_si256(hm, bit),
                                _mm256_setzero_si256(),
                            );
                            let lv = _mm256_or_si256(low, _mm256_andnot_si256(unset, four));
                            let p = _mm256_maddubs_epi16(lv, load32(&by[4 + 32 * c..]));
                            isum = $acc16(isum, p, scales2(sc[2 * c], sc[2 * c + 1]));
                        }
                    }
                    let d = f32::from_le_bytes([by[0], by[1], by[2], by[3]]) * f16_at(bx, 108);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
                    corr += d * offset as f32;
                }
                hsum(acc) - corr
            }

            #[target_feature(enable = $feat)]
            fn iq4_xs(x: &[u8], y: &[u8]) -> f32 {
                let tbl = table(&KVALUES_IQ4NL);
                let mut acc = _mm256_setzero_ps();
                for (bx, by) in x
                    .chunks_exact(BLOCK_IQ4_XS_BYTES)
                    .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
                {
                    let mut isum = _mm256_setzero_si256();
                    for g in 0..8 {
                        let w = lookup(tbl, load16(&bx[8 + 16 * g..]));
                        let yv = load32(&by[4 + 32 * g..]);
                        let p =
                            _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(yv, w));
                        let s = _mm256_set1_epi16((iq4xs_scale(bx, g) - 32) as i16);
                        isum = $acc16(isum, p, s);
                    }
                    let d = f16_at(bx, 0) * f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
                }
                hsum(acc)
            }

            /// IQ4_NL or MXFP4 (by `KIND`) against Q8_0.
            #[target_feature(enable = $feat)]
            fn nl_q8_0<const KIND: u8>(x: &[u8], y: &[u8]) -> f32 {
                let mxfp4 = KIND == LB_MXFP4;
                let tbl = table(if mxfp4 {
                    &KVALUES_MXFP4
                } else {
                    &KVALUES_IQ4NL
                });
                let (blk, qs_at) = if mxfp4 {
                    (BLOCK_MXFP4_BYTES, 1)
                } else {
                    (BLOCK_IQ4_NL_BYTES, 2)
                };
                let mut acc = _mm256_setzero_ps();
                for (bx, by) in x.chunks_exact(blk).zip(y.chunks_exact(BLOCK_Q8_0_BYTES)) {
                    let w = lookup(tbl, load16(&bx[qs_at..]));
                    let yv = load32(&by[2..]);
                    let dot = $dot4(_mm256_sign_epi8(w, w), _mm256_sign_epi8(yv, w));
                    let dw = if mxfp4 {
                        e8m0_to_f32_half(bx[0])
                    } else {
                        f16_at(bx, 0)
                    };
                    let d = f16_at(by, 0) * dw;
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d), acc);
                }
                hsum(acc)
            }
        }
    };
}

kernels!(v256, "avx2,fma,f16c", dot4_avx2, acc16_avx2);
kernels!(
    v512,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dot4_vnni,
    acc16_vnni
);
