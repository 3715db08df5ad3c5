//! Portable scalar implementations (the reference the SIMD paths are tested
//! against, and the fallback on CPUs without AVX2).

use super::affine::{BLOCK_Q4_1_BYTES, BLOCK_Q5_1_BYTES, BLOCK_Q8_1_BYTES, affine_level};
use super::kquant::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_0_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, BLOCK_Q8_K_BYTES, QK_K,
    scale_min_k4,
};
use super::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES, QK8_0, block_scale};
use super::tile::{WeightType, act_row_bytes, act_type, scratch_f32};

/// Plain dot product, 8 interleaved partial sums.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Q8_0 x Q8_0 dot product over `min(x, y)` whole blocks.
pub(crate) fn vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_Q8_0_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_0_BYTES))
    {
        let mut isum = 0i32;
        for (&a, &b) in bx[2..].iter().zip(&by[2..]) {
            isum += (a as i8 as i32) * (b as i8 as i32);
        }
        sum += isum as f32 * (block_scale(bx) * block_scale(by));
    }
    sum
}

/// Q4_0 x Q8_0 dot product over whole blocks.
pub(crate) fn vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_Q4_0_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_0_BYTES))
    {
        let mut isum = 0i32;
        for j in 0..QK8_0 / 2 {
            let q = bx[2 + j];
            let lo = (q & 0x0F) as i32 - 8;
            let hi = (q >> 4) as i32 - 8;
            isum += lo * (by[2 + j] as i8 as i32) + hi * (by[2 + j + QK8_0 / 2] as i8 as i32);
        }
        sum += isum as f32 * (block_scale(bx) * block_scale(by));
    }
    sum
}

/// Q5_0 x Q8_0 dot product over whole blocks.
pub(crate) fn vec_dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_Q5_0_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_0_BYTES))
    {
        let qh = u32::from_le_bytes([bx[2], bx[3], bx[4], bx[5]]);
        let mut isum = 0i32;
        for j in 0..16 {
            let q = bx[6 + j];
            let lo = ((q & 0x0F) as i32 | (((qh >> j) & 1) << 4) as i32) - 16;
            let hi = ((q >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32) - 16;
            isum += lo * (by[2 + j] as i8 as i32) + hi * (by[2 + j + 16] as i8 as i32);
        }
        sum += isum as f32 * (block_scale(bx) * block_scale(by));
    }
    sum
}

/// Q4_1 (`Q5 == false`) or Q5_1 x Q8_1 dot product over whole blocks, as ggml's generic kernel:
/// the integer sum times both scales, plus the weight minimum times the activation's `s`.
pub(crate) fn vec_dot_affine_q8_1<const Q5: bool>(x: &[u8], y: &[u8]) -> f32 {
    let (blk, qs_at) = if Q5 {
        (BLOCK_Q5_1_BYTES, 8)
    } else {
        (BLOCK_Q4_1_BYTES, 4)
    };
    let mut sum = 0.0f32;
    for (bx, by) in x.chunks_exact(blk).zip(y.chunks_exact(BLOCK_Q8_1_BYTES)) {
        let qh = if Q5 {
            u32::from_le_bytes([bx[4], bx[5], bx[6], bx[7]])
        } else {
            0
        };
        let qs = &bx[qs_at..qs_at + 16];
        let mut isum = 0i32;
        for (j, &q8) in by[4..].iter().enumerate() {
            isum += affine_level(qs, qh, j) * i32::from(q8 as i8);
        }
        let m = f16_bits_to_f32(u16::from_le_bytes([bx[2], bx[3]]));
        let s = f16_bits_to_f32(u16::from_le_bytes([by[2], by[3]]));
        sum += (block_scale(bx) * block_scale(by)) * isum as f32 + m * s;
    }
    sum
}

/// The f32 scale of a Q8_K super-block.
#[inline]
pub(crate) fn q8k_scale(by: &[u8]) -> f32 {
    f32::from_le_bytes([by[0], by[1], by[2], by[3]])
}

/// Sum `s` (of 16) of a Q8_K super-block's quants.
#[inline]
pub(crate) fn q8k_bsum(by: &[u8], s: usize) -> i32 {
    i16::from_le_bytes([by[4 + QK_K + 2 * s], by[4 + QK_K + 2 * s + 1]]) as i32
}

/// Q4_K (`Q5 == false`) or Q5_K x Q8_K dot product over whole super-blocks, as ggml's generic
/// kernel: integer sums per sub-block times the 6-bit scales, minus the mins times the
/// activation sums, scaled per super-block.
pub(crate) fn vec_dot_qk_affine_q8_k<const Q5: bool>(x: &[u8], y: &[u8]) -> f32 {
    let blk = if Q5 {
        BLOCK_Q5_K_BYTES
    } else {
        BLOCK_Q4_K_BYTES
    };
    let mut sum = 0.0f32;
    for (bx, by) in x.chunks_exact(blk).zip(y.chunks_exact(BLOCK_Q8_K_BYTES)) {
        let sc = &bx[4..16];
        let (qh, qs) = if Q5 {
            (&bx[16..48], &bx[48..])
        } else {
            (&bx[..0], &bx[16..])
        };
        let q8 = &by[4..4 + QK_K];
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (s, m) = scale_min_k4(j, sc);
            let (c, hi) = (j / 2, j % 2 == 1);
            let mut dot = 0i32;
            for l in 0..32 {
                let b = qs[32 * c + l];
                let mut q = if hi { b >> 4 } else { b & 0xF } as i32;
                if Q5 && (qh[l] >> j) & 1 != 0 {
                    q += 16;
                }
                dot += q * (q8[32 * j + l] as i8 as i32);
            }
            isum += s as i32 * dot;
            imin += m as i32 * (q8k_bsum(by, 2 * j) + q8k_bsum(by, 2 * j + 1));
        }
        let dy = q8k_scale(by);
        sum += block_scale(bx) * dy * isum as f32
            - f16_bits_to_f32(u16::from_le_bytes([bx[2], bx[3]])) * dy * imin as f32;
    }
    sum
}

/// Q6_K x Q8_K dot product over whole super-blocks (ggml's generic kernel).
pub(crate) fn vec_dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_Q6_K_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
    {
        let (ql, qh, sc) = (&bx[..128], &bx[128..192], &bx[192..208]);
        let q8 = &by[4..4 + QK_K];
        let mut isum = 0i32;
        for h in 0..2 {
            for t in 0..4 {
                let mut dots = [0i32; 2];
                for l in 0..32 {
                    let lb = ql[64 * h + 32 * (t & 1) + l];
                    let low = if t < 2 { lb & 0xF } else { lb >> 4 };
                    let q = (low | (((qh[32 * h + l] >> (2 * t)) & 3) << 4)) as i32 - 32;
                    dots[l / 16] += q * (q8[128 * h + 32 * t + l] as i8 as i32);
                }
                for (g, dot) in dots.iter().enumerate() {
                    isum += (sc[8 * h + 2 * t + g] as i8 as i32) * dot;
                }
            }
        }
        let d = f16_bits_to_f32(u16::from_le_bytes([bx[208], bx[209]]));
        sum += d * q8k_scale(by) * isum as f32;
    }
    sum
}

/// Exact f16 -> f32 conversion in plain integer/float arithmetic (fast
/// without F16C; handles subnormals, infinities and NaN).
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let mut o = (h & 0x7FFF) << 13;
    let exp = o & (0x7C00 << 13);
    o += (127 - 15) << 23;
    if exp == 0x7C00 << 13 {
        o += (128 - 16) << 23; // Inf / NaN
    } else if exp == 0 {
        // Zero / subnormal: renormalize through a float subtraction.
        o += 1 << 23;
        o = (f32::from_bits(o) - f32::from_bits(113 << 23)).to_bits();
    }
    f32::from_bits(o | sign)
}

/// Decodes one weight row of `k` float-type elements into `dst`.
fn decode_float_row(wt: WeightType, src: &[u8], dst: &mut [f32]) {
    match wt {
        WeightType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        WeightType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        WeightType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
            }
        }
        // Not float types: callers never pass them here.
        _ => {}
    }
}

/// Scalar tile matmul; arguments are validated by the caller
/// (`matmul::mul_mat_tile`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_mat_tile(
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
    let wrow = wt.row_bytes(k);
    match wt {
        WeightType::Q8_0
        | WeightType::Q4_0
        | WeightType::Q5_0
        | WeightType::Q4_1
        | WeightType::Q5_1
        | WeightType::Q4_K
        | WeightType::Q5_K
        | WeightType::Q6_K
        | WeightType::Q2_K
        | WeightType::Q3_K
        | WeightType::IQ4_NL
        | WeightType::IQ4_XS
        | WeightType::MXFP4 => {
            let xrow = act_row_bytes(act_type(wt), k);
            let dot: fn(&[u8], &[u8]) -> f32 = match wt {
                WeightType::Q8_0 => vec_dot_q8_0_q8_0,
                WeightType::Q4_0 => vec_dot_q4_0_q8_0,
                WeightType::Q5_0 => vec_dot_q5_0_q8_0,
                WeightType::Q4_1 => vec_dot_affine_q8_1::<false>,
                WeightType::Q5_1 => vec_dot_affine_q8_1::<true>,
                WeightType::Q4_K => vec_dot_qk_affine_q8_k::<false>,
                WeightType::Q5_K => vec_dot_qk_affine_q8_k::<true>,
                WeightType::Q2_K => super::lowbit::vec_dot_q2_k_q8_k,
                WeightType::Q3_K => super::lowbit::vec_dot_q3_k_q8_k,
                WeightType::IQ4_NL => super::iquant::vec_dot_iq4_nl_q8_0,
                WeightType::IQ4_XS => super::iquant::vec_dot_iq4_xs_q8_k,
                WeightType::MXFP4 => super::iquant::vec_dot_mxfp4_q8_0,
                _ => vec_dot_q6_k_q8_k,
            };
            for r in 0..rows {
                let wr = &w[r * w_stride..r * w_stride + wrow];
                for c in 0..cols {
                    let xc = &x[c * x_stride..c * x_stride + xrow];
                    out[c * ldo + r] = dot(wr, xc);
                }
            }
        }
        WeightType::F32 | WeightType::F16 | WeightType::BF16 => {
            let buf = scratch_f32(scratch, (cols + 1) * k);
            let (xs, wbuf) = buf.split_at_mut(cols * k);
            for c in 0..cols {
                decode_float_row(
                    WeightType::F32,
                    &x[c * x_stride..c * x_stride + k * 4],
                    &mut xs[c * k..(c + 1) * k],
                );
            }
            for r in 0..rows {
                decode_float_row(wt, &w[r * w_stride..r * w_stride + wrow], wbuf);
                for c in 0..cols {
                    out[c * ldo + r] = dot_f32(wbuf, &xs[c * k..(c + 1) * k]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_all_bit_patterns() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            let got = f16_bits_to_f32(bits);
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#x}");
            }
        }
    }
}
