//! The non-linear 4-bit formats: IQ4_NL and IQ4_XS (indices into ggml's `kvalues_iq4nl`) and
//! MXFP4 (E2M1 codes under an E8M0 exponent), with reference quantizers bit-exact with ggml's
//! `quantize_row_iq4_nl_ref`, `quantize_row_iq4_xs_ref` (ggml's `quantize_iq4_xs` without an
//! importance matrix) and `quantize_row_mxfp4_ref`, ggml's dequantizers, and the portable dot
//! products (Q8_0 activations for IQ4_NL and MXFP4, Q8_K for IQ4_XS).
//!
//! A 32-element group keeps element `j < 16` in the low nibble of byte `j` and element `16 + j`
//! in its high nibble.
//!
//! * IQ4_NL (18 bytes): f16 `d`, 16 bytes of indices; `x = d·kvalues_iq4nl[i]`.
//! * IQ4_XS (136 bytes): f16 `d`, u16 `scales_h`, `scales_l[4]`, 128 bytes of indices; group
//!   `g < 8` has the 6-bit scale `ls = (scales_l[g/2] >> 4(g%2)) & 15 | ((scales_h >> 2g) & 3) << 4`
//!   and `x = d·(ls − 32)·kvalues_iq4nl[i]`.
//! * MXFP4 (17 bytes): E8M0 exponent `e`, 16 bytes of codes; `x = 2^(e−128)·kvalues_mxfp4[i]`
//!   (the table holds the E2M1 values doubled, hence the halved scale).

use super::kquant::{
    BLOCK_Q8_K_BYTES, GROUP_MAX_EPS, QK_K, check_lengths, f16_at, nearest_int, put_f16,
};
use super::quant::{BLOCK_Q8_0_BYTES, block_scale};

/// Elements per IQ4_NL block.
pub const QK4_NL: usize = 32;
/// Bytes per IQ4_NL block.
pub const BLOCK_IQ4_NL_BYTES: usize = 18;
/// Bytes per IQ4_XS super-block.
pub const BLOCK_IQ4_XS_BYTES: usize = 136;
/// Elements per MXFP4 block.
pub const QK_MXFP4: usize = 32;
/// Bytes per MXFP4 block.
pub const BLOCK_MXFP4_BYTES: usize = 17;

/// ggml's `kvalues_iq4nl`: the sixteen IQ4_NL / IQ4_XS levels.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// ggml's `kvalues_mxfp4`: the E2M1 values doubled.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(e − 128)` (half the E8M0 value), exact for every byte.
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// ggml's `best_index_int8` over a sorted 16-entry table: the index of the level nearest `x`
/// (ties to the upper one; NaN gives the last).
fn best_index(val: &[i8; 16], x: f32) -> u8 {
    if x <= f32::from(val[0]) {
        return 0;
    }
    if x >= f32::from(val[15]) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < f32::from(val[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - f32::from(val[mu - 1]) < f32::from(val[mu]) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// Packs 32 indices of one group into 16 bytes.
fn pack_nibbles(l: &[u8], q: &mut [u8]) {
    for j in 0..16 {
        q[j] = l[j] | (l[16 + j] << 4);
    }
}

/// The index of element `j` (`< 32`) of a group's 16 bytes.
#[inline]
fn nibble(q: &[u8], j: usize) -> usize {
    usize::from(if j < 16 { q[j] & 0xF } else { q[j - 16] >> 4 })
}

/// The per-group fit of ggml's `quantize_row_iq4_nl_impl` (no importance matrix: weights `x²`):
/// a first scale from the extreme value, then `2·ntry + 1` candidate scales. Writes the indices
/// of the first pass to `l` and returns the scale; an all-zero group returns 0 and leaves `l` as
/// it was (as ggml does).
fn fit_group(xb: &[f32], l: &mut [u8], ntry: i32) -> f32 {
    let k = &KVALUES_IQ4NL;
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(k[0]);
    let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (lj, &v) in l.iter_mut().zip(xb) {
        let idx = best_index(k, id * v);
        *lj = idx;
        let q = f32::from(k[usize::from(idx)]);
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        id = (itry + i32::from(k[0])) as f32 / max;
        let (mut sqx, mut sq2) = (0.0f32, 0.0f32);
        for &v in xb {
            let q = f32::from(k[usize::from(best_index(k, id * v))]);
            let w = v * v;
            sqx += w * q * v;
            sq2 += w * q * q;
        }
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    d
}

// ===== IQ4_NL =====

/// Quantizes `src` to IQ4_NL, bit-exactly like ggml's `quantize_row_iq4_nl_ref` (one fitting pass,
/// `ntry = -1`). An all-zero block keeps the previous block's indices (ggml reuses its buffer;
/// for a leading all-zero block it reads uninitialised memory, here zeros): they decode to zeros.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst.len() != src.len() / 32 * 18`.
pub fn quantize_row_iq4_nl(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_iq4_nl",
        src.len(),
        dst.len(),
        QK4_NL,
        BLOCK_IQ4_NL_BYTES,
    );
    let mut l = [0u8; QK4_NL];
    for (x, y) in src
        .chunks_exact(QK4_NL)
        .zip(dst.chunks_exact_mut(BLOCK_IQ4_NL_BYTES))
    {
        let d = fit_group(x, &mut l, -1);
        put_f16(y, 0, d);
        pack_nibbles(&l, &mut y[2..]);
    }
}

/// Dequantizes an IQ4_NL row (ggml's `dequantize_row_iq4_nl`).
///
/// # Panics
/// If `src.len()` is not a multiple of 18 or `dst.len() != src.len() / 18 * 32`.
pub fn dequantize_row_iq4_nl(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_iq4_nl",
        dst.len(),
        src.len(),
        QK4_NL,
        BLOCK_IQ4_NL_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_IQ4_NL_BYTES)
        .zip(dst.chunks_exact_mut(QK4_NL))
    {
        let d = f16_at(x, 0);
        for (j, o) in y.iter_mut().enumerate() {
            *o = d * f32::from(KVALUES_IQ4NL[nibble(&x[2..], j)]);
        }
    }
}

/// Sum over one 32-element group of `table[index_j] · q8_j`.
#[inline]
fn group_dot(table: &[i8; 16], q: &[u8], q8: &[u8]) -> i32 {
    (0..32)
        .map(|j| i32::from(table[nibble(q, j)]) * i32::from(q8[j] as i8))
        .sum()
}

/// IQ4_NL × Q8_0 dot product over whole blocks (ggml's generic kernel).
pub(crate) fn vec_dot_iq4_nl_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_IQ4_NL_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_0_BYTES))
    {
        let d = block_scale(by) * f16_at(bx, 0);
        sum += d * group_dot(&KVALUES_IQ4NL, &bx[2..], &by[2..]) as f32;
    }
    sum
}

// ===== IQ4_XS =====

/// The 6-bit scale (biased by 32) of group `g` of an IQ4_XS super-block.
#[inline]
pub(crate) fn iq4xs_scale(b: &[u8], g: usize) -> i32 {
    let h = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + g / 2] >> (4 * (g % 2))) & 0xF;
    i32::from(low) | ((i32::from(h >> (2 * g)) & 3) << 4)
}

/// Quantizes `src` to IQ4_XS, bit-exactly like ggml's `quantize_row_iq4_xs_ref`
/// (`quantize_iq4_xs` with no importance matrix: per-group fits with `ntry = 7`, 6-bit group
/// scales under one f16 `d`, then every group re-indexed against its rounded scale).
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 136`.
pub fn quantize_row_iq4_xs(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_iq4_xs",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_IQ4_XS_BYTES,
    );
    let mut l = [0u8; QK_K];
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_IQ4_XS_BYTES))
    {
        let mut scales = [0.0f32; 8];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for (g, s) in scales.iter_mut().enumerate() {
            *s = fit_group(&x[32 * g..32 * g + 32], &mut l[32 * g..32 * g + 32], 7);
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = *s;
            }
        }
        let d = -max_scale / 32.0;
        put_f16(y, 0, d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        let mut scales_l = [0u8; 4];
        for (g, &s) in scales.iter().enumerate() {
            let ls = nearest_int(id * s).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * g..32 * g + 32 {
                l[j] = best_index(&KVALUES_IQ4NL, idl * x[j]);
            }
            let ls = (ls + 32) as u8;
            scales_l[g / 2] |= (ls & 0xF) << (4 * (g % 2));
            scales_h |= u16::from(ls >> 4) << (2 * g);
        }
        y[2..4].copy_from_slice(&scales_h.to_le_bytes());
        y[4..8].copy_from_slice(&scales_l);
        for g in 0..8 {
            pack_nibbles(&l[32 * g..32 * g + 32], &mut y[8 + 16 * g..8 + 16 * g + 16]);
        }
    }
}

/// Dequantizes an IQ4_XS row (ggml's `dequantize_row_iq4_xs`).
///
/// # Panics
/// If `src.len()` is not a multiple of 136 or `dst.len() != src.len() / 136 * 256`.
pub fn dequantize_row_iq4_xs(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_iq4_xs",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_IQ4_XS_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_IQ4_XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f16_at(x, 0);
        for (g, yg) in y.chunks_exact_mut(32).enumerate() {
            let dl = d * (iq4xs_scale(x, g) - 32) as f32;
            let q = &x[8 + 16 * g..];
            for (j, o) in yg.iter_mut().enumerate() {
                *o = dl * f32::from(KVALUES_IQ4NL[nibble(q, j)]);
            }
        }
    }
}

/// IQ4_XS × Q8_K dot product over whole super-blocks (ggml's generic kernel).
pub(crate) fn vec_dot_iq4_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_IQ4_XS_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
    {
        let d4d8 = f16_at(bx, 0) * f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
        for g in 0..8 {
            let dl = d4d8 * (iq4xs_scale(bx, g) - 32) as f32;
            let dot = group_dot(&KVALUES_IQ4NL, &bx[8 + 16 * g..], &by[4 + 32 * g..]);
            sum += dl * dot as f32;
        }
    }
    sum
}

// ===== MXFP4 =====

/// ggml's `best_index_mxfp4`: the first code whose level times `d` is nearest `x`.
fn best_index_mxfp4(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(KVALUES_MXFP4[0]) * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (f32::from(k) * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// Quantizes `src` to MXFP4, bit-exactly like ggml's `quantize_row_mxfp4_ref`: the exponent is
/// `floor(log2(amax)) − 2 + 127` (so the largest value lands on the top E2M1 levels), then each
/// element takes its nearest code.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst.len() != src.len() / 32 * 17`.
pub fn quantize_row_mxfp4(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_mxfp4",
        src.len(),
        dst.len(),
        QK_MXFP4,
        BLOCK_MXFP4_BYTES,
    );
    for (x, y) in src
        .chunks_exact(QK_MXFP4)
        .zip(dst.chunks_exact_mut(BLOCK_MXFP4_BYTES))
    {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // C converts the float to uint8_t; x86 goes through a 32-bit integer and keeps the low
        // byte, which `as i32 as u8` reproduces for every finite input.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        y[0] = e;
        for j in 0..16 {
            y[1 + j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[16 + j], d) << 4);
        }
    }
}

/// Dequantizes an MXFP4 row (ggml's `dequantize_row_mxfp4`).
///
/// # Panics
/// If `src.len()` is not a multiple of 17 or `dst.len() != src.len() / 17 * 32`.
pub fn dequantize_row_mxfp4(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_mxfp4",
        dst.len(),
        src.len(),
        QK_MXFP4,
        BLOCK_MXFP4_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_MXFP4_BYTES)
        .zip(dst.chunks_exact_mut(QK_MXFP4))
    {
        let d = e8m0_to_f32_half(x[0]);
        for (j, o) in y.iter_mut().enumerate() {
            *o = f32::from(KVALUES_MXFP4[nibble(&x[1..], j)]) * d;
        }
    }
}

/// MXFP4 × Q8_0 dot product over whole blocks (ggml's generic kernel).
pub(crate) fn vec_dot_mxfp4_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_MXFP4_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_0_BYTES))
    {
        let d = block_scale(by) * e8m0_to_f32_half(bx[0]);
        sum += d * group_dot(&KVALUES_MXFP4, &bx[1..], &by[2..]) as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_a_power_of_two() {
        for e in 0..=254u8 {
            assert_eq!(
                e8m0_to_f32_half(e) as f64,
                2f64.powi(i32::from(e) - 128),
                "{e}"
            );
        }
    }

    #[test]
    fn best_index_picks_nearest_level() {
        let k = &KVALUES_IQ4NL;
        assert_eq!(best_index(k, -1000.0), 0);
        assert_eq!(best_index(k, 1000.0), 15);
        assert_eq!(best_index(k, 0.0), 8); // 1 is nearer than -10
        assert_eq!(best_index(k, -4.5), 8); // tie at -4.5 goes up
        assert_eq!(best_index(k, -5.0), 7);
        assert_eq!(best_index(k, f32::NAN), 15);
        for (i, &v) in k.iter().enumerate() {
            assert_eq!(usize::from(best_index(k, f32::from(v))), i);
        }
    }

    #[test]
    fn hand_built_blocks_dequantize_exactly() {
        let mut b = [0u8; BLOCK_MXFP4_BYTES];
        b[0] = 130; // d = 2^2
        b[1] = 0x7D; // element 0: code 13 (-6), element 16: code 7 (12)
        let mut out = [0.0f32; 32];
        dequantize_row_mxfp4(&b, &mut out);
        assert_eq!((out[0], out[16], out[1]), (-24.0, 48.0, 0.0));

        let mut b = [0u8; BLOCK_IQ4_XS_BYTES];
        put_f16(&mut b, 0, 0.5);
        // Group 3: ls = 0b10_0101 = 37 (low nibble 5 in the high half of scales_l[1]).
        b[4 + 1] = 0x50;
        b[2] = 0b10 << 6;
        b[8 + 16 * 3 + 2] = 0xF0; // group 3 element 18: index 15 (113)
        let mut out = [0.0f32; QK_K];
        dequantize_row_iq4_xs(&b, &mut out);
        assert_eq!(iq4xs_scale(&b, 3), 37);
        assert_eq!(out[96 + 18], 0.5 * 5.0 * 113.0);
        assert_eq!(out[96 + 2], 0.5 * 5.0 * -127.0);
    }
}
