//! Q2_K and Q3_K: the 2- and 3-bit K-quants (super-blocks of 256 in sixteen groups of 16), with
//! reference quantizers bit-exact with ggml's `quantize_row_q2_K_ref` / `quantize_row_q3_K_ref`,
//! ggml's dequantizers, and the portable dot products against Q8_K activations.
//!
//! Both formats store element `e = 128h + 32t + l` (`h < 2`, `t < 4`, `l < 32`) as the 2-bit field
//! `t` of byte `qs[32h + l]`; group `e / 16` owns its scale.
//!
//! * Q2_K (84 bytes): `scales[16]` (low nibble scale, high nibble min), `qs[64]`, f16 `d`, f16
//!   `dmin`; `x = d·sc·q − dmin·m`.
//! * Q3_K (110 bytes): `hmask[32]` (element `e`'s high bit is bit `e / 32` of `hmask[e % 32]`),
//!   `qs[64]`, `scales[12]` (sixteen 6-bit scales: low nibbles in bytes 0–7, top two bits in
//!   bytes 8–11), f16 `d`; `x = d·(sc − 32)·(q − 4)` with `q = low | high << 2`.

use super::kquant::{
    BLOCK_Q8_K_BYTES, GROUP_MAX_EPS, QK_K, check_lengths, f16_at, make_qkx2_quants, nearest_int,
    put_f16,
};

/// Bytes per Q2_K super-block.
pub const BLOCK_Q2_K_BYTES: usize = 84;
/// Bytes per Q3_K super-block.
pub const BLOCK_Q3_K_BYTES: usize = 110;

/// The `qs` byte and bit shift of element `e` of a super-block.
#[inline]
fn qs_pos(e: usize) -> (usize, u32) {
    (32 * (e / 128) + e % 32, 2 * ((e % 128) / 32) as u32)
}

/// Packs 256 two-bit levels into the 64 `qs` bytes.
fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    qs.fill(0);
    for (e, &q) in levels.iter().enumerate() {
        let (at, shift) = qs_pos(e);
        qs[at] |= (q & 3) << shift;
    }
}

/// The 2-bit level of element `e`.
#[inline]
fn level_2bit(qs: &[u8], e: usize) -> u8 {
    let (at, shift) = qs_pos(e);
    (qs[at] >> shift) & 3
}

/// The f32 scale of a Q8_K super-block.
#[inline]
fn q8k_d(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

// ===== Q2_K =====

/// Quantizes `src` to Q2_K, bit-exactly like ggml's `quantize_row_q2_K_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 84`.
pub fn quantize_row_q2_k(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q2_k",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_Q2_K_BYTES,
    );
    const Q4SCALE: f32 = 15.0;
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_Q2_K_BYTES))
    {
        let mut levels = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut weights = [0.0f32; 16];
        let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants::<true>(
                3,
                xs,
                &weights,
                &mut levels[16 * j..16 * j + 16],
                &mut laux,
                -0.5,
                0.1,
                15,
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
        let mut sc = [0u8; 16];
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (b, &s) in sc.iter_mut().zip(&scales) {
                *b = nearest_int(iscale * s) as u8;
            }
            put_f16(y, 80, max_scale / Q4SCALE);
        } else {
            put_f16(y, 80, 0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (b, &m) in sc.iter_mut().zip(&mins) {
                *b |= (nearest_int(iscale * m) << 4) as u8;
            }
            put_f16(y, 82, max_min / Q4SCALE);
        } else {
            put_f16(y, 82, 0.0);
        }
        let (d, dmin) = (f16_at(y, 80), f16_at(y, 82));
        for (j, &s) in sc.iter().enumerate() {
            let dl = d * f32::from(s & 0xF);
            if dl == 0.0 {
                continue;
            }
            let dm = dmin * f32::from(s >> 4);
            for i in 16 * j..16 * j + 16 {
                levels[i] = nearest_int((x[i] + dm) / dl).clamp(0, 3) as u8;
            }
        }
        y[..16].copy_from_slice(&sc);
        pack_2bit(&levels, &mut y[16..80]);
    }
}

/// Dequantizes a Q2_K row (ggml's `dequantize_row_q2_K`).
///
/// # Panics
/// If `src.len()` is not a multiple of 84 or `dst.len() != src.len() / 84 * 256`.
pub fn dequantize_row_q2_k(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q2_k",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_Q2_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q2_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let (d, dmin) = (f16_at(x, 80), f16_at(x, 82));
        for (e, o) in y.iter_mut().enumerate() {
            let sc = x[e / 16];
            let dl = d * f32::from(sc & 0xF);
            let ml = dmin * f32::from(sc >> 4);
            *o = dl * f32::from(level_2bit(&x[16..80], e)) - ml;
        }
    }
}

/// Q2_K × Q8_K dot product over whole super-blocks (ggml's generic kernel: exact integer sums per
/// super-block, the minimums through Q8_K's group sums).
pub(crate) fn vec_dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_Q2_K_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
    {
        let q8 = &by[4..4 + QK_K];
        let (mut isum, mut summs) = (0i32, 0i32);
        for g in 0..16 {
            let sc = bx[g];
            let bsum = i16::from_le_bytes([by[260 + 2 * g], by[261 + 2 * g]]);
            summs += i32::from(bsum) * i32::from(sc >> 4);
            let dot: i32 = (16 * g..16 * g + 16)
                .map(|e| i32::from(level_2bit(&bx[16..80], e)) * i32::from(q8[e] as i8))
                .sum();
            isum += i32::from(sc & 0xF) * dot;
        }
        let dy = q8k_d(by);
        let dall = dy * f16_at(bx, 80);
        let dmin = dy * f16_at(bx, 82);
        sum += dall * isum as f32 - dmin * summs as f32;
    }
    sum
}

// ===== Q3_K =====

/// ggml's `make_q3_quants` with `do_rmse == true`: the symmetric fit of one group to
/// `-nmax..nmax - 1` (weights `x²`), refined by up to five passes that move single levels while
/// the weighted error drops. Writes `level + nmax` to `l` (all zeros for an all-zero group) and
/// returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let cur = f32::from(*li);
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*li) {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// The sixteen 6-bit scales of a Q3_K super-block (its 12 packed bytes), biased by 32.
#[inline]
pub(crate) fn q3k_scale(sc: &[u8], j: usize) -> u8 {
    let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
    low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)
}

/// Quantizes `src` to Q3_K, bit-exactly like ggml's `quantize_row_q3_K_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst.len() != src.len() / 256 * 110`.
pub fn quantize_row_q3_k(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q3_k",
        src.len(),
        dst.len(),
        QK_K,
        BLOCK_Q3_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(BLOCK_Q3_K_BYTES))
    {
        let mut levels = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] =
                make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut sc = [0u8; 12];
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // C stores nearest_int's result in an int8_t before clamping.
                let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    sc[j] = l & 0xF;
                } else {
                    sc[j - 8] |= (l & 0xF) << 4;
                }
                sc[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            put_f16(y, 108, 1.0 / iscale);
        } else {
            put_f16(y, 108, 0.0);
        }
        let d_all = f16_at(y, 108);
        for j in 0..16 {
            let d = d_all * f32::from(q3k_scale(&sc, j) as i8 - 32);
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                levels[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        let mut hmask = [0u8; 32];
        let mut low = [0u8; QK_K];
        for (e, &q) in levels.iter().enumerate() {
            let mut q = q as u8;
            if q > 3 {
                hmask[e % 32] |= 1 << (e / 32);
                q -= 4;
            }
            low[e] = q;
        }
        y[..32].copy_from_slice(&hmask);
        pack_2bit(&low, &mut y[32..96]);
        y[96..108].copy_from_slice(&sc);
    }
}

/// The signed level (`-4..=3`) of element `e` of a Q3_K super-block.
#[inline]
fn q3k_level(b: &[u8], e: usize) -> i32 {
    let high = (b[e % 32] >> (e / 32)) & 1;
    i32::from(level_2bit(&b[32..96], e)) - if high != 0 { 0 } else { 4 }
}

/// Dequantizes a Q3_K row (ggml's `dequantize_row_q3_K`).
///
/// # Panics
/// If `src.len()` is not a multiple of 110 or `dst.len() != src.len() / 110 * 256`.
pub fn dequantize_row_q3_k(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q3_k",
        dst.len(),
        src.len(),
        QK_K,
        BLOCK_Q3_K_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q3_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d_all = f16_at(x, 108);
        for (e, o) in y.iter_mut().enumerate() {
            let dl = d_all * (i32::from(q3k_scale(&x[96..108], e / 16)) - 32) as f32;
            *o = dl * q3k_level(x, e) as f32;
        }
    }
}

/// Q3_K × Q8_K dot product over whole super-blocks (exact integer sum per super-block, scaled
/// once by `d·d8`, as ggml's generic kernel up to the f32 summation order).
pub(crate) fn vec_dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (bx, by) in x
        .chunks_exact(BLOCK_Q3_K_BYTES)
        .zip(y.chunks_exact(BLOCK_Q8_K_BYTES))
    {
        let q8 = &by[4..4 + QK_K];
        let mut isum = 0i32;
        for g in 0..16 {
            let dot: i32 = (16 * g..16 * g + 16)
                .map(|e| q3k_level(bx, e) * i32::from(q8[e] as i8))
                .sum();
            isum += (i32::from(q3k_scale(&bx[96..108], g)) - 32) * dot;
        }
        sum += f16_at(bx, 108) * q8k_d(by) * isum as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kquant::{dequantize_row_q8_k, quantize_row_q8_k};
    use crate::cpu::matmul::tests::rand_vec;

    /// Hand-built super-blocks decode to the values the format defines.
    #[test]
    fn hand_built_blocks_dequantize_exactly() {
        let mut b = [0u8; BLOCK_Q2_K_BYTES];
        b[3] = 0x52; // group 3: scale 2, min 5
        b[16 + 32 + 5] = 0b11 << 4; // element 128 + 64 + 5 (group 12) = 3; scale 0 there
        b[16 + 20] = 0b10 << 2; // element 32 + 20 = 52 (group 3) = 2
        put_f16(&mut b, 80, 0.5);
        put_f16(&mut b, 82, 0.25);
        let mut out = [0.0f32; QK_K];
        dequantize_row_q2_k(&b, &mut out);
        assert_eq!(out[52], 0.5 * 2.0 * 2.0 - 0.25 * 5.0);
        assert_eq!(out[48], -0.25 * 5.0);
        assert_eq!(out[197], 0.0);

        let mut b = [0u8; BLOCK_Q3_K_BYTES];
        // Scale 13 (6 bits 0b001101): low nibble of byte 13 - 8 high half, top bits in byte 9.
        b[96 + 5] = 0xD0;
        b[96 + 9] = 0;
        b[5] = 1 << 6; // element 6·32 + 5 = 197 has its high bit
        b[32 + 32 + 5] = 0b10 << 4; // element 197: low bits 2
        put_f16(&mut b, 108, 2.0);
        let mut out = [0.0f32; QK_K];
        dequantize_row_q3_k(&b, &mut out);
        // Group 12 = scale index 12 (bytes 4 high nibble, top bits byte 8 + 0 shift 6).
        let s12 = (i32::from(q3k_scale(&b[96..108], 12)) - 32) as f32;
        assert_eq!(out[197], 2.0 * s12 * 2.0);
        assert_eq!(q3k_scale(&b[96..108], 13), 13);
        // Without high bit the level is low − 4.
        assert_eq!(
            out[0],
            2.0 * (q3k_scale(&b[96..108], 0) as f32 - 32.0) * -4.0
        );
    }

    #[test]
    fn round_trips_and_scalar_dots() {
        for nb in [1usize, 3] {
            let n = nb * QK_K;
            let xf = rand_vec(n, 7 + nb as u64);
            let af = rand_vec(n, 99 + nb as u64);
            let mut a = vec![0u8; nb * BLOCK_Q8_K_BYTES];
            quantize_row_q8_k(&af, &mut a);
            let mut ad = vec![0.0f32; n];
            dequantize_row_q8_k(&a, &mut ad);
            type Codec = (usize, fn(&[f32], &mut [u8]), fn(&[u8], &mut [f32]), f64);
            type Dot = fn(&[u8], &[u8]) -> f32;
            let codecs: [(Codec, Dot); 2] = [
                (
                    (
                        BLOCK_Q2_K_BYTES,
                        quantize_row_q2_k,
                        dequantize_row_q2_k,
                        0.12,
                    ),
                    vec_dot_q2_k_q8_k,
                ),
                (
                    (
                        BLOCK_Q3_K_BYTES,
                        quantize_row_q3_k,
                        dequantize_row_q3_k,
                        0.04,
                    ),
                    vec_dot_q3_k_q8_k,
                ),
            ];
            for ((bs, q, dq, max_nmse), dot) in codecs {
                let mut b = vec![0u8; nb * bs];
                q(&xf, &mut b);
                let mut y = vec![0.0f32; n];
                dq(&b, &mut y);
                let err: f64 = xf
                    .iter()
                    .zip(&y)
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum();
                let norm: f64 = xf.iter().map(|a| f64::from(*a).powi(2)).sum();
                assert!(err / norm < max_nmse, "bs {bs}: nmse {}", err / norm);
                let exact: f64 = y
                    .iter()
                    .zip(&ad)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let mag: f64 = y.iter().zip(&ad).map(|(a, b)| f64::from(a * b).abs()).sum();
                let got = f64::from(dot(&b, &a));
                assert!(
                    (got - exact).abs() <= 1e-5 * mag,
                    "bs {bs}: {got} vs {exact}"
                );
            }
        }
    }
}
