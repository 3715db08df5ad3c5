//! The affine 32-element formats Q4_1 and Q5_1 (a scale and a minimum per block) and Q8_1, the
//! activation form their dot products take, with ggml's reference scalar quantizers and
//! dequantizers, bit for bit.
//!
//! Layouts (ggml-common.h; little-endian, no padding):
//!
//! * Q4_1, [`QK4_1`] elements in [`BLOCK_Q4_1_BYTES`]: f16 `d`, f16 `m`, 16 bytes `qs` (byte `j`:
//!   element `j` low nibble, `j + 16` high). Element = `q·d + m`.
//! * Q5_1, [`QK5_1`] elements in [`BLOCK_Q5_1_BYTES`]: f16 `d`, f16 `m`, `qh` (u32: bit `j` is the
//!   fifth bit of element `j`), 16 bytes `qs` as Q4_1. Element = `q·d + m`.
//! * Q8_1, [`QK8_1`] elements in [`BLOCK_Q8_1_BYTES`]: f16 `d`, f16 `s`, 32 × i8. Element =
//!   `q·d`; `s` is `d·Σq` rounded to f16, which the dots multiply by the weight block's `m`
//!   instead of summing the activations again (ggml does the same, so results match its bytes).

use super::kquant::{check_lengths, f16_at, put_f16};
use super::quant::{Q8Simd, quantize_q8_block};

/// Elements per Q4_1 block.
pub const QK4_1: usize = 32;
/// Elements per Q5_1 block.
pub const QK5_1: usize = 32;
/// Elements per Q8_1 block.
pub const QK8_1: usize = 32;
/// Bytes per Q4_1 block (f16 scale + f16 min + 16 bytes of nibbles).
pub const BLOCK_Q4_1_BYTES: usize = 20;
/// Bytes per Q5_1 block (f16 scale + f16 min + 4 bytes of fifth bits + 16 bytes of nibbles).
pub const BLOCK_Q5_1_BYTES: usize = 24;
/// Bytes per Q8_1 block (f16 scale + f16 scaled sum + 32 quants).
pub const BLOCK_Q8_1_BYTES: usize = 36;

/// ggml's running min / max (NaN never replaces either, as in its `<` / `>` comparisons).
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Quantizes one block to `2^BITS - 1` levels above its minimum: writes `d` and `m` to the first
/// four bytes of `y` and returns the levels (ggml's `quantize_row_q{4,5}_1_ref`, which differ
/// only in the level count and in Q4_1's `MIN(15, .)` clamp, a no-op for in-range values but
/// kept for identical bits on inputs like infinities).
fn quantize_affine_block<const BITS: u32>(x: &[f32], y: &mut [u8]) -> [u8; 32] {
    let (min, max) = min_max(x);
    let d = (max - min) / ((1u32 << BITS) - 1) as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(y, 0, d);
    put_f16(y, 2, min);
    std::array::from_fn(|j| {
        let v = (x[j] - min) * id + 0.5;
        if BITS == 4 {
            // (int8_t)(v) then MIN(15, .): truncation (Rust saturates where C is undefined).
            (v as i8).min(15) as u8
        } else {
            v as u8
        }
    })
}

/// Quantizes `src` to Q4_1, bit-exactly like ggml's `quantize_row_q4_1_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst.len() != src.len() / 32 * 20`.
pub fn quantize_row_q4_1(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q4_1",
        src.len(),
        dst.len(),
        QK4_1,
        BLOCK_Q4_1_BYTES,
    );
    for (x, y) in src
        .chunks_exact(QK4_1)
        .zip(dst.chunks_exact_mut(BLOCK_Q4_1_BYTES))
    {
        let q = quantize_affine_block::<4>(x, y);
        for j in 0..QK4_1 / 2 {
            y[4 + j] = q[j] | (q[j + 16] << 4);
        }
    }
}

/// Quantizes `src` to Q5_1, bit-exactly like ggml's `quantize_row_q5_1_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst.len() != src.len() / 32 * 24`.
pub fn quantize_row_q5_1(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q5_1",
        src.len(),
        dst.len(),
        QK5_1,
        BLOCK_Q5_1_BYTES,
    );
    for (x, y) in src
        .chunks_exact(QK5_1)
        .zip(dst.chunks_exact_mut(BLOCK_Q5_1_BYTES))
    {
        let q = quantize_affine_block::<5>(x, y);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            let (q0, q1) = (q[j], q[j + 16]);
            y[8 + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= u32::from((q0 & 0x10) >> 4) << j;
            qh |= u32::from((q1 & 0x10) >> 4) << (j + 16);
        }
        y[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// Level `j` (0..32) of a Q4_1 (`qh == 0`) or Q5_1 block's nibbles `qs` and fifth bits `qh`.
#[inline]
pub(crate) fn affine_level(qs: &[u8], qh: u32, j: usize) -> i32 {
    let nib = if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    };
    i32::from(nib) | ((((qh >> j) & 1) << 4) as i32)
}

/// Dequantizes Q4_1 (`Q5 == false`) or Q5_1 blocks as ggml's `dequantize_row_q{4,5}_1`
/// (`q·d + m` in f32, not fused).
fn dequantize_affine<const Q5: bool>(src: &[u8], dst: &mut [f32]) {
    let (blk, qs_at) = if Q5 {
        (BLOCK_Q5_1_BYTES, 8)
    } else {
        (BLOCK_Q4_1_BYTES, 4)
    };
    for (x, y) in src.chunks_exact(blk).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(x, 0), f16_at(x, 2));
        let qh = if Q5 {
            u32::from_le_bytes([x[4], x[5], x[6], x[7]])
        } else {
            0
        };
        for (j, o) in y.iter_mut().enumerate() {
            *o = affine_level(&x[qs_at..qs_at + 16], qh, j) as f32 * d + m;
        }
    }
}

/// Dequantizes a Q4_1 row (ggml's `dequantize_row_q4_1`).
///
/// # Panics
/// If `src.len()` is not a multiple of 20 or `dst.len() != src.len() / 20 * 32`.
pub fn dequantize_row_q4_1(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q4_1",
        dst.len(),
        src.len(),
        QK4_1,
        BLOCK_Q4_1_BYTES,
    );
    dequantize_affine::<false>(src, dst);
}

/// Dequantizes a Q5_1 row (ggml's `dequantize_row_q5_1`).
///
/// # Panics
/// If `src.len()` is not a multiple of 24 or `dst.len() != src.len() / 24 * 32`.
pub fn dequantize_row_q5_1(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q5_1",
        dst.len(),
        src.len(),
        QK5_1,
        BLOCK_Q5_1_BYTES,
    );
    dequantize_affine::<true>(src, dst);
}

/// Quantizes `src` to Q8_1, bit-exactly like ggml's `quantize_row_q8_1_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32 or `dst.len() != src.len() / 32 * 36`.
pub fn quantize_row_q8_1(src: &[f32], dst: &mut [u8]) {
    check_lengths(
        "quantize_row_q8_1",
        src.len(),
        dst.len(),
        QK8_1,
        BLOCK_Q8_1_BYTES,
    );
    let simd = Q8Simd::detect();
    for (x, y) in src
        .chunks_exact(QK8_1)
        .zip(dst.chunks_exact_mut(BLOCK_Q8_1_BYTES))
    {
        let (d, sum) = quantize_q8_block(x, &mut y[4..], simd);
        put_f16(y, 0, d);
        // The unrounded f32 `d`, as ggml's `sum*d`.
        put_f16(y, 2, sum as f32 * d);
    }
}

/// Dequantizes a Q8_1 row (`q·d`; `s` is redundant). ggml has no Q8_1 dequantizer: this is for
/// tests and references.
///
/// # Panics
/// If `src.len()` is not a multiple of 36 or `dst.len() != src.len() / 36 * 32`.
pub fn dequantize_row_q8_1(src: &[u8], dst: &mut [f32]) {
    check_lengths(
        "dequantize_row_q8_1",
        dst.len(),
        src.len(),
        QK8_1,
        BLOCK_Q8_1_BYTES,
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q8_1_BYTES)
        .zip(dst.chunks_exact_mut(QK8_1))
    {
        let d = f16_at(x, 0);
        for (o, &q) in y.iter_mut().zip(&x[4..]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn known_vectors() {
        // min = -1, max = 14: d = 1, levels = x + 1.
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i % 16) as f32 - 1.0;
        }
        let mut q = [0u8; 20];
        quantize_row_q4_1(&x, &mut q);
        assert_eq!(&q[..4], &[h(1.0), h(-1.0)].concat()[..]);
        for j in 0..16 {
            assert_eq!(q[4 + j], (j as u8) | ((j as u8) << 4));
        }
        let mut y = [0.0f32; 32];
        dequantize_row_q4_1(&q, &mut y);
        assert_eq!(x, y);

        // min = 0, max = 31: d = 1, every level through nibble + fifth bit.
        let x: [f32; 32] = std::array::from_fn(|i| i as f32);
        let mut q = [0u8; 24];
        quantize_row_q5_1(&x, &mut q);
        assert_eq!(&q[..4], &[h(1.0), h(0.0)].concat()[..]);
        assert_eq!(u32::from_le_bytes([q[4], q[5], q[6], q[7]]), 0xFFFF_0000);
        dequantize_row_q5_1(&q, &mut y);
        assert_eq!(x, y);

        // Q8_1: amax = 127 -> d = 1; s = d · Σq.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = -2.5; // -> -3 (half away from zero)
        x[2] = 10.0;
        let mut q = [0u8; 36];
        quantize_row_q8_1(&x, &mut q);
        assert_eq!(&q[..4], &[h(1.0), h(134.0)].concat()[..]);
        assert_eq!([q[4] as i8, q[5] as i8, q[6] as i8], [127, -3, 10]);
        dequantize_row_q8_1(&q, &mut y);
        assert_eq!(y[1], -3.0);
    }

    #[test]
    fn constant_and_zero_blocks() {
        for v in [0.0f32, 2.5, -3.0] {
            let x = [v; 32];
            let mut q4 = [0xAAu8; 20];
            let mut q5 = [0xAAu8; 24];
            quantize_row_q4_1(&x, &mut q4);
            quantize_row_q5_1(&x, &mut q5);
            let mut y = [1.0f32; 32];
            dequantize_row_q4_1(&q4, &mut y);
            assert!(y.iter().all(|&e| e == v), "q4_1 {v}");
            dequantize_row_q5_1(&q5, &mut y);
            assert!(y.iter().all(|&e| e == v), "q5_1 {v}");
        }
    }
}
