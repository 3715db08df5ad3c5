//! Q5_0 and the K-quant formats (Q4_K, Q5_K, Q6_K, Q8_K) with ggml's reference scalar
//! quantizers and dequantizers, bit for bit.
//!
//! Layouts (ggml-common.h; all little-endian, no padding):
//!
//! * Q5_0, [`QK5_0`] elements in [`BLOCK_Q5_0_BYTES`]: f16 `d`, `qh` (u32: bit `j` is the fifth
//!   bit of element `j`), 16 bytes `qs` (byte `j`: element `j` low nibble, `j + 16` high).
//!   Element = `(q − 16)·d`.
//! * Q4_K, [`QK_K`] elements in [`BLOCK_Q4_K_BYTES`]: f16 `d`, f16 `dmin`, 12 bytes of eight
//!   6-bit scales and eight 6-bit mins (see [`scale_min_k4`]), 128 bytes `qs`: 64-element chunk
//!   `c` is bytes `32c..32c + 32`, low nibbles for sub-block `2c`, high nibbles for `2c + 1`.
//!   Element = `d·sc·q − dmin·m` of its sub-block of 32.
//! * Q5_K, [`BLOCK_Q5_K_BYTES`]: as Q4_K, with 32 bytes `qh` between the scales and `qs`: bit
//!   `s` of `qh[l]` is the fifth bit of element `l` of sub-block `s`.
//! * Q6_K, [`BLOCK_Q6_K_BYTES`]: 128 bytes `ql`, 64 bytes `qh`, 16 × i8 `scales` (one per 16
//!   elements), f16 `d`. In half `h` (128 elements), element `128h + 32t + l` (`t < 4`, `l < 32`)
//!   has low nibble from `ql[64h + 32(t & 1) + l]` (low nibble for `t < 2`, high for `t >= 2`)
//!   and bits 4–5 from `qh[32h + l] >> 2t`. Element = `d·sc·(q − 32)`.
//! * Q8_K, [`BLOCK_Q8_K_BYTES`]: f32 `d`, 256 × i8, 16 × i16 `bsums` (sums of each 16 quants).
//!   Element = `d·q`. Only the activation form of the K-quant dots, as in ggml.

use half::f16;

/// Elements per Q5_0 block.
pub const QK5_0: usize = 32;
/// Bytes per Q5_0 block (f16 scale + 4 bytes of fifth bits + 16 bytes of nibbles).
pub const BLOCK_Q5_0_BYTES: usize = 22;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes per Q4_K super-block.
pub const BLOCK_Q4_K_BYTES: usize = 144;
/// Bytes per Q5_K super-block.
pub const BLOCK_Q5_K_BYTES: usize = 176;
/// Bytes per Q6_K super-block.
pub const BLOCK_Q6_K_BYTES: usize = 210;
/// Bytes per Q8_K super-block (f32 scale + 256 quants + 16 i16 sums).
pub const BLOCK_Q8_K_BYTES: usize = 292;

/// ggml's `GROUP_MAX_EPS`: below this a group counts as all zeros.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline]
pub(crate) fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// ggml's `nearest_int`: adds 1.5·2²³ so the FPU rounds to an integer (ties to even), then reads
/// the mantissa. Kept literally (rather than `round_ties_even`) so out-of-range and NaN inputs give
/// the same bits as ggml too.
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K super-block
/// (ggml's `get_scale_min_k4`): sub-blocks 0–3 keep 6 bits in bytes `j` / `j + 4`; 4–7 put their
/// low 4 bits in byte `j + 4` and their top 2 bits in the spare top bits of bytes `j − 4` / `j`.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K / Q5_K super-block (its 12 packed
/// bytes), as two little-endian byte vectors `(scales, mins)` (ggml's `utmp` unpacking, the
/// vector form of [`crate::cpu::kquant::scale_min_k4`]).
#[inline]
pub(crate) fn kq_scales_mins(b: [u8; 12]) -> (u64, u64) {
    const KM1: u32 = 0x3f3f_3f3f;
    const KM2: u32 = 0x0f0f_0f0f;
    const KM3: u32 = 0x0303_0303;
    let u0 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let u1 = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let u2 = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    let s_lo = u0 & KM1;
    let s_hi = (u2 & KM2) | (((u0 >> 6) & KM3) << 4);
    let m_lo = u1 & KM1;
    let m_hi = ((u2 >> 4) & KM2) | (((u1 >> 6) & KM3) << 4);
    (
        u64::from(s_lo) | (u64::from(s_hi) << 32),
        u64::from(m_lo) | (u64::from(m_hi) << 32),
    )
}

pub(crate) fn check_lengths(what: &str, n: usize, bytes: usize, qk: usize, block: usize) {
    assert!(
        n.is_multiple_of(qk),
        "{what}: {n} elements are not a multiple of {qk}"
    );
    assert_eq!(bytes, n / qk * block, "{what}: byte length");
}

// ===== Q5_0 =====

/// Quantizes `src` to Q5_0, bit-exactly like ggml's `quantize_row_q5_0_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst.len() != src.len() / 32 * 22`.
pub fn quantize_row_q5_0(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q5_0",
        src.len(),
        dst.len(),
        QK5_0,
        BLOCK_Q5_0_BYTES,
    );
    for (x, y) in src
        .chunks_exact(QK5_0)
        .zip(dst.chunks_exact_mut(BLOCK_Q5_0_BYTES))
    {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(y, 0, d);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            // (int8_t)(v + 16.5f) then MIN(31, .): truncation (Rust saturates where C is undefined).
            let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let q1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
            y[6 + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= u32::from((q0 & 0x10) >> 4) << j;
            qh |= u32::from((q1 & 0x10) >> 4) << (j + 16);
        }
        y[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Dequantizes a Q5_0 row (ggml's `dequantize_row_q5_0`).
///
/// # Panics
/// If `src.len()` is not a multiple of 22 or `dst.len() != src.len() / 22 * 32`.
pub fn dequantize_row_q5_0(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q5_0",
        dst.len(),
        src.len(),
        QK5_0,
        BLOCK_Q5_0_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q5_0_BYTES)
        .zip(dst.chunks_exact_mut(QK5_0))
    {
        let d = f16_at(x, 0);
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        for j in 0..QK5_0 / 2 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            let q0 = ((u32::from(x[6 + j]) & 0x0F) | h0) as i32 - 16;
            let q1 = ((u32::from(x[6 + j]) >> 4) | h1) as i32 - 16;
            y[j] = q0 as f32 * d;
            y[j + 16] = q1 as f32 * d;
        }
    }
}

// ===== K-quant helpers (ggml's make_qkx2_quants / make_qx_quants) =====

/// ggml's `make_qkx2_quants`: the affine (scale, min) fit of one sub-block to `0..=nmax`,
/// refined over `nstep + 1` candidate scales, with squared errors (`MAD == false`, Q4_K/Q5_K) or
/// absolute ones (`MAD == true`, Q2_K). Writes the levels to `l` and returns `(scale, -min)`.
/// Every operation is in ggml's order (f32, no fused multiply-add) so the result is bit-identical.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants<const MAD: bool>(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * f32::from(l[i]) + min - x[i];
        best_error += weights[i] * if MAD { diff.abs() } else { diff * diff };
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let lf = q as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * if MAD { diff.abs() } else { diff * diff };
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights (weights `x²`): the
/// symmetric fit of one group to `-nmax..nmax - 1`, refined over 18 candidate scales. Writes
/// `level + nmax` to `l` and returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as i8;
        let w = x[i] * x[i];
        let lf = q as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            let lf = q as f32;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
                l[i] = (nmax + q) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The shared first half of the Q4_K / Q5_K quantizers: per sub-block affine fits, the 6-bit
/// scales and mins packed into `scales` (12 bytes), `d` / `dmin` written at bytes 0..4 of `y`,
/// and the final levels (`0..=nmax`) in `l`.
fn quantize_k_affine(
    x: &[f32],
    y: &mut [u8],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) {
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants::<false>(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            rmin,
            0.1,
            nstep,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut y[4..16];
    sc.fill(0);
    for j in 0..8 {
        // uint8_t ls = nearest_int(...): C truncates to 8 bits before MIN(63, .).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, 2, max_min / 63.0);
    let (d_all, dmin_all) = (f16_at(y, 0), f16_at(y, 2));
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &y[4..16]);
        let d = d_all * f32::from(s);
        if d == 0.0 {
            // ggml keeps make_qkx2_quants' levels for a sub-block whose scale rounds to zero.
            continue;
        }
        let dm = dmin_all * f32::from(m);
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
}

// ===== Q4_K =====

/// Quantizes `src` to Q4_K, bit-exactly like ggml's `quantize_row_q4_K_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 144`.
pub fn quantize_row_q4_k(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q4_k",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_Q4_K_BYTES,
    );
    let mut l = [0u8; QK_K];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_Q4_K_BYTES))
    {
        quantize_k_affine(x, y, 15, -1.0, 20, &mut l);
        let q = &mut y[16..];
        for c in 0..4 {
            for i in 0..32 {
                q[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

/// Dequantizes a Q4_K row (ggml's `dequantize_row_q4_K`).
///
/// # Panics
/// If `src.len()` is not a multiple of 144 or `dst.len() != src.len() / 144 * 256`.
pub fn dequantize_row_q4_k(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q4_k",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_Q4_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q4_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
        let q = &x[16..];
        for c in 0..4 {
            let (s1, m1) = scale_min_k4(2 * c, &x[4..16]);
            let (s2, m2) = scale_min_k4(2 * c + 1, &x[4..16]);
            let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
            let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
            for i in 0..32 {
                let b = q[32 * c + i];
                y[64 * c + i] = d1 * f32::from(b & 0xF) - m1;
                y[64 * c + 32 + i] = d2 * f32::from(b >> 4) - m2;
            }
        }
    }
}

// ===== Q5_K =====

/// Quantizes `src` to Q5_K, bit-exactly like ggml's `quantize_row_q5_K_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 176`.
pub fn quantize_row_q5_k(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q5_k",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_Q5_K_BYTES,
    );
    let mut l = [0u8; QK_K];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_Q5_K_BYTES))
    {
        quantize_k_affine(x, y, 31, -0.5, 15, &mut l);
        let (qh, ql) = y[16..].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for i in 0..32 {
                let mut l1 = l[64 * c + i];
                if l1 > 15 {
                    l1 -= 16;
                    qh[i] |= m1;
                }
                let mut l2 = l[64 * c + 32 + i];
                if l2 > 15 {
                    l2 -= 16;
                    qh[i] |= m2;
                }
                ql[32 * c + i] = l1 | (l2 << 4);
            }
        }
    }
}

/// Dequantizes a Q5_K row (ggml's `dequantize_row_q5_K`).
///
/// # Panics
/// If `src.len()` is not a multiple of 176 or `dst.len() != src.len() / 176 * 256`.
pub fn dequantize_row_q5_k(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q5_k",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_Q5_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q5_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let (d, dmin) = (f16_at(x, 0), f16_at(x, 2));
        let (qh, ql) = (&x[16..48], &x[48..]);
        for c in 0..4 {
            let (s1, m1) = scale_min_k4(2 * c, &x[4..16]);
            let (s2, m2) = scale_min_k4(2 * c + 1, &x[4..16]);
            let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
            let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for i in 0..32 {
                let b = ql[32 * c + i];
                let h1 = if qh[i] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[i] & u2 != 0 { 16 } else { 0 };
                y[64 * c + i] = d1 * f32::from((b & 0xF) + h1) - m1;
                y[64 * c + 32 + i] = d2 * f32::from((b >> 4) + h2) - m2;
            }
        }
    }
}

// ===== Q6_K =====

/// Quantizes `src` to Q6_K, bit-exactly like ggml's `quantize_row_q6_K_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 210`.
pub fn quantize_row_q6_k(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q6_k",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_Q6_K_BYTES,
    );
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_Q6_K_BYTES))
    {
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            y.fill(0);
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        put_f16(y, 208, 1.0 / iscale);
        for ib in 0..16 {
            // MIN(127, nearest_int(.)) stored in an int8_t: C keeps the low 8 bits.
            y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let d_all = f16_at(y, 208);
        for j in 0..16 {
            let d = d_all * f32::from(y[192 + j] as i8);
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        let (ql, rest) = y.split_at_mut(128);
        let qh = &mut rest[..64];
        for h in 0..2 {
            let lh = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                let q = |t: usize| lh[32 * t + i] as u8;
                ql[64 * h + i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
                ql[64 * h + 32 + i] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
                qh[32 * h + i] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

/// Dequantizes a Q6_K row (ggml's `dequantize_row_q6_K`).
///
/// # Panics
/// If `src.len()` is not a multiple of 210 or `dst.len() != src.len() / 210 * 256`.
pub fn dequantize_row_q6_k(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q6_k",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_Q6_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q6_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f16_at(x, 208);
        let (ql, qh, sc) = (&x[..128], &x[128..192], &x[192..208]);
        for h in 0..2 {
            for i in 0..32 {
                let (lo, hi, b) = (ql[64 * h + i], ql[64 * h + 32 + i], qh[32 * h + i]);
                let q = [
                    (lo & 0xF) | ((b & 3) << 4),
                    (hi & 0xF) | (((b >> 2) & 3) << 4),
                    (lo >> 4) | (((b >> 4) & 3) << 4),
                    (hi >> 4) | (((b >> 6) & 3) << 4),
                ];
                for (t, &qt) in q.iter().enumerate() {
                    let s = sc[8 * h + i / 16 + 2 * t] as i8;
                    y[128 * h + 32 * t + i] = d * f32::from(s) * f32::from(qt as i8 - 32);
                }
            }
        }
    }
}

// ===== Q8_K =====

/// Quantizes `src` to Q8_K, bit-exactly like ggml's `quantize_row_q8_K_ref` (which is also what
/// ggml's x86 CPU backend uses for activations). An all-zero super-block gets zero sums, where
/// ggml leaves them unwritten.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 292`.
pub fn quantize_row_q8_k(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q8_k",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_Q8_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_Q8_K_BYTES))
    {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        let (head, sums) = y.split_at_mut(4 + QK_K);
        for (q, &v) in head[4..].iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for (g, s) in sums.chunks_exact_mut(2).enumerate() {
            let sum: i32 = head[4 + 16 * g..4 + 16 * g + 16]
                .iter()
                .map(|&q| i32::from(q as i8))
                .sum();
            s.copy_from_slice(&(sum as i16).to_le_bytes());
        }
        head[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// Dequantizes a Q8_K row (ggml's `dequantize_row_q8_K`).
///
/// # Panics
/// If `src.len()` is not a multiple of 292 or `dst.len() != src.len() / 292 * 256`.
pub fn dequantize_row_q8_k(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q8_k",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_Q8_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q8_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        for (o, &q) in y.iter_mut().zip(&x[4..4 + QK_K]) {
            *o = d * f32::from(q as i8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn scale_min_packing() {
        // Distinct 6-bit scales and mins, packed as ggml's quantizers pack them, read back.
        let (sc, mn) = (
            [1u8, 17, 33, 63, 5, 40, 62, 16],
            [0u8, 9, 63, 31, 48, 2, 33, 60],
        );
        let mut q = [0u8; 12];
        for j in 0..8 {
            let (ls, lm) = (sc[j], mn[j]);
            if j < 4 {
                q[j] = ls;
                q[j + 4] = lm;
            } else {
                q[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                q[j - 4] |= (ls >> 4) << 6;
                q[j] |= (lm >> 4) << 6;
            }
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (sc[j], mn[j]), "sub-block {j}");
        }
    }

    #[test]
    fn hand_built_blocks_dequantize_exactly() {
        // Q5_0: d = 0.5, element j = (j mod 32) − 16 through nibble + fifth bit.
        let mut b = [0u8; 22];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        let mut qh = 0u32;
        for j in 0..16 {
            let (q0, q1) = (j as u8, (j + 16) as u8);
            b[6 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
            qh |= u32::from(q0 >> 4) << j | u32::from(q1 >> 4) << (j + 16);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
        let mut y = [0.0f32; 32];
        dequantize_row_q5_0(&b, &mut y);
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, (j as f32 - 16.0) * 0.5);
        }

        // Q4_K: d = 0.25, dmin = 0.5, sub-block s has scale s + 1 and min s; level = l mod 16.
        let mut b = [0u8; 144];
        b[..2].copy_from_slice(&f16::from_f32(0.25).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        for s in 0..4 {
            b[4 + s] = s as u8 + 1;
            b[8 + s] = s as u8;
        }
        for s in 4..8 {
            b[8 + s] = (s as u8 + 1) | ((s as u8) << 4);
        }
        for c in 0..4 {
            for l in 0..32 {
                b[16 + 32 * c + l] = (l as u8 % 16) | ((15 - l as u8 % 16) << 4);
            }
        }
        let mut y = [0.0f32; 256];
        dequantize_row_q4_k(&b, &mut y);
        for (e, v) in y.iter().enumerate() {
            let (s, l) = (e / 32, e % 32);
            let q = if s % 2 == 0 { l % 16 } else { 15 - l % 16 };
            let want = 0.25 * (s + 1) as f32 * q as f32 - 0.5 * s as f32;
            assert_eq!(*v, want, "q4_K element {e}");
        }
        // The same block as Q5_K with every fifth bit of sub-block 3 set.
        let mut b5 = [0u8; 176];
        b5[..16].copy_from_slice(&b[..16]);
        b5[16..48].fill(1 << 3);
        b5[48..].copy_from_slice(&b[16..]);
        dequantize_row_q5_k(&b5, &mut y);
        for (e, v) in y.iter().enumerate() {
            let (s, l) = (e / 32, e % 32);
            let q = if s % 2 == 0 { l % 16 } else { 15 - l % 16 } + if s == 3 { 16 } else { 0 };
            let want = 0.25 * (s + 1) as f32 * q as f32 - 0.5 * s as f32;
            assert_eq!(*v, want, "q5_K element {e}");
        }

        // Q6_K: d = 2, scale of group g = g − 8, level of element e = e mod 64.
        let mut b = [0u8; 210];
        let lv = |e: usize| (e % 64) as u8;
        for h in 0..2 {
            for l in 0..32 {
                let e = |t: usize| 128 * h + 32 * t + l;
                b[64 * h + l] = (lv(e(0)) & 0xF) | ((lv(e(2)) & 0xF) << 4);
                b[64 * h + 32 + l] = (lv(e(1)) & 0xF) | ((lv(e(3)) & 0xF) << 4);
                b[128 + 32 * h + l] = (lv(e(0)) >> 4)
                    | ((lv(e(1)) >> 4) << 2)
                    | ((lv(e(2)) >> 4) << 4)
                    | ((lv(e(3)) >> 4) << 6);
            }
        }
        for g in 0..16 {
            b[192 + g] = (g as i8 - 8) as u8;
        }
        b[208..].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        dequantize_row_q6_k(&b, &mut y);
        for (e, v) in y.iter().enumerate() {
            let want = 2.0 * ((e / 16) as f32 - 8.0) * (lv(e) as f32 - 32.0);
            assert_eq!(*v, want, "q6_K element {e}");
        }
    }

    #[test]
    fn round_trip_errors_are_typical() {
        let x = rand_vec(256 * 16, 11);
        // RMS error relative to the RMS of x (uniform in [-1, 1): 1/√3): about a third of a
        // quantization step (range / levels / √12), with headroom.
        type Codec = (
            fn(&[f32], &mut [u8]),
            fn(&[u8], &mut [f32]),
            usize,
            usize,
            f64,
        );
        let codecs: [(&str, Codec); 5] = [
            (
                "q5_0",
                (quantize_row_q5_0, dequantize_row_q5_0, 22, 32, 0.04),
            ),
            (
                "q4_K",
                (quantize_row_q4_k, dequantize_row_q4_k, 144, 256, 0.07),
            ),
            (
                "q5_K",
                (quantize_row_q5_k, dequantize_row_q5_k, 176, 256, 0.035),
            ),
            (
                "q6_K",
                (quantize_row_q6_k, dequantize_row_q6_k, 210, 256, 0.02),
            ),
            (
                "q8_K",
                (quantize_row_q8_k, dequantize_row_q8_k, 292, 256, 0.006),
            ),
        ];
        let rms_x = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
        for (name, (q, dq, bs, qk, bound)) in codecs {
            let mut b = vec![0u8; x.len() / qk * bs];
            q(&x, &mut b);
            let mut y = vec![0.0f32; x.len()];
            dq(&b, &mut y);
            let rms = (x
                .iter()
                .zip(&y)
                .map(|(a, c)| ((a - c) as f64).powi(2))
                .sum::<f64>()
                / x.len() as f64)
                .sqrt();
            assert!(
                rms / rms_x <= bound,
                "{name}: relative RMS error {}",
                rms / rms_x
            );
            // Zeros stay zeros.
            let z = vec![0.0f32; qk];
            let mut bz = vec![0xAAu8; bs];
            q(&z, &mut bz);
            let mut yz = vec![1.0f32; qk];
            dq(&bz, &mut yz);
            assert!(yz.iter().all(|v| *v == 0.0), "{name}: zeros");
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }
}
