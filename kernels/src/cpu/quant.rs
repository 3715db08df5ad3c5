//! Block quantization formats (GGUF/ggml-compatible) and their reference
//! scalar quantization and dequantization.
//!
//! Quantized rows are plain little-endian byte slices made of whole blocks;
//! no alignment is assumed.
//!
//! * Q8_0: blocks of [`QK8_0`] elements, [`BLOCK_Q8_0_BYTES`] bytes each: an
//!   f16 scale `d` followed by 32 `i8` quants; element `i` is `qs[i] * d`.
//! * Q4_0: blocks of [`QK4_0`] elements, [`BLOCK_Q4_0_BYTES`] bytes each: an
//!   f16 scale `d` followed by 16 bytes; byte `j` holds element `j` in its low
//!   nibble and element `j + 16` in its high nibble; an element is
//!   `(nibble - 8) * d`.

use half::f16;

/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;
/// Elements per Q4_0 block.
pub const QK4_0: usize = 32;
/// Bytes per Q8_0 block (f16 scale + 32 quants).
pub const BLOCK_Q8_0_BYTES: usize = 34;
/// Bytes per Q4_0 block (f16 scale + 16 bytes of nibbles).
pub const BLOCK_Q4_0_BYTES: usize = 18;

/// Reads the f16 scale at the start of a block as f32.
#[inline]
pub(crate) fn block_scale(block: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()
}

/// Quantizes `src` to Q8_0, bit-exactly like ggml's `quantize_row_q8_0_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of [`QK8_0`] or
/// `dst.len() != src.len() / 32 * 34`.
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [u8]) {
    assert!(
        src.len().is_multiple_of(QK8_0),
        "quantize_row_q8_0: src length {} not a multiple of 32",
        src.len()
    );
    assert_eq!(
        dst.len(),
        src.len() / QK8_0 * BLOCK_Q8_0_BYTES,
        "quantize_row_q8_0: dst length"
    );
    let simd = Q8Simd::detect();
    for (x, y) in src
        .chunks_exact(QK8_0)
        .zip(dst.chunks_exact_mut(BLOCK_Q8_0_BYTES))
    {
        let (d, _) = quantize_q8_block(x, &mut y[2..], simd);
        y[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    }
}

/// Whether the SIMD block quantizer may run: made only by [`Q8Simd::detect`], so that safe code
/// cannot ask for AVX2 on a CPU without it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q8Simd(bool);

impl Q8Simd {
    /// The quantizer this CPU (and `TESSERA_CPU_ISA`) allows.
    pub(crate) fn detect() -> Q8Simd {
        #[cfg(target_arch = "x86_64")]
        {
            Q8Simd(super::features::active_isa() >= super::features::Isa::Avx2)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Q8Simd(false)
    }
    /// Whether the SIMD path is on.
    pub(crate) fn on(self) -> bool {
        self.0
    }
}

/// The scale and quants of one Q8_0 / Q8_1 block, as ggml's reference quantizers compute them:
/// writes the 32 quants to `qs` and returns the (f32, not yet f16-rounded) scale `d` and the sum
/// of the quants, through the AVX2 quantizer where `simd` allows it.
pub(crate) fn quantize_q8_block(x: &[f32], qs: &mut [u8], simd: Q8Simd) -> (f32, i32) {
    assert!(
        x.len() == QK8_0 && qs.len() == QK8_0,
        "quantize_q8_block: not one block"
    );
    #[cfg(target_arch = "x86_64")]
    if simd.on() {
        // SAFETY: AVX2 is available (`Q8Simd::detect`); 32 values in and 32 bytes out (asserted
        // above).
        #[allow(unsafe_code)]
        if let Some(r) = unsafe { quantize_q8_block_avx2(x.as_ptr(), qs.as_mut_ptr()) } {
            return r;
        }
    }
    let _ = simd.on();
    quantize_q8_block_scalar(x, qs)
}

/// The portable [`quantize_q8_block`], ggml's loop as written.
pub(crate) fn quantize_q8_block_scalar(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let mut amax = 0.0f32;
    for &v in x {
        // ggml: MAX(amax, fabsf(v)) == (amax > |v| ? amax : |v|)
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        // roundf: half away from zero; the float-to-int cast saturates.
        let i = (v * id).round() as i8;
        sum += i32::from(i);
        *q = i as u8;
    }
    (d, sum)
}

/// One Q8_0 / Q8_1 block of 32 values as ggml's reference quantizer computes it (the quants to
/// `qs`, and the unrounded scale and the sum of the quants returned), or `None` when the block
/// holds a NaN or an infinity, whose results only the scalar loop reproduces.
///
/// Rounding is half away from zero like `roundf`: `t + copysign(0.49999997, t)` truncated equals
/// `roundf(t)` for every float of magnitude up to 130 (checked over all of them), and the
/// quantized values are at most 127.
///
/// # Safety
/// AVX2 must be available; `x` must be valid for 32 reads and `qs` for 32 writes.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8_block_avx2(x: *const f32, qs: *mut u8) -> Option<(f32, i32)> {
    use std::arch::x86_64::*;
    // SAFETY: 32 floats readable (caller).
    let v = unsafe {
        [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ]
    };
    let nan = _mm256_or_ps(
        _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[1], v[1]),
        ),
        _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[2]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[3], v[3]),
        ),
    );
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    let sign = _mm256_set1_ps(-0.0);
    let abs = |a: __m256| _mm256_andnot_ps(sign, a);
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let amax = _mm_cvtss_f32(m);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    if !id.is_finite() || amax.is_infinite() {
        // Scaled values of ±inf or NaN (an infinite block; or a largest magnitude under about
        // 3.7e-37, whose scale's inverse overflows): the scalar loop's saturating cast makes
        // them 127, -128 or 0, where the truncation here gives -128 for all.
        return None;
    }
    let id = _mm256_set1_ps(id);
    let half = _mm256_set1_ps(0.49999997);
    let q = v.map(|a| {
        let t = _mm256_mul_ps(a, id);
        let r = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign)));
        _mm256_cvttps_epi32(r)
    });
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256::<1>(sum),
    );
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    // packs work within 128-bit lanes: the permutation puts the 32 bytes back in order.
    let w01 = _mm256_packs_epi32(q[0], q[1]);
    let w23 = _mm256_packs_epi32(q[2], q[3]);
    let b = _mm256_packs_epi16(w01, w23);
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: 32 bytes writable (caller).
    unsafe { _mm256_storeu_si256(qs as *mut __m256i, b) };
    Some((d, _mm_cvtsi128_si32(s)))
}

/// Dequantizes a Q8_0 row.
///
/// # Panics
/// If `src.len()` is not a multiple of [`BLOCK_Q8_0_BYTES`] or
/// `dst.len() != src.len() / 34 * 32`.
pub fn dequantize_row_q8_0(src: &[u8], dst: &mut [f32]) {
    assert!(
        src.len().is_multiple_of(BLOCK_Q8_0_BYTES),
        "dequantize_row_q8_0: src length"
    );
    assert_eq!(
        dst.len(),
        src.len() / BLOCK_Q8_0_BYTES * QK8_0,
        "dequantize_row_q8_0: dst length"
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q8_0_BYTES)
        .zip(dst.chunks_exact_mut(QK8_0))
    {
        let d = block_scale(x);
        for (o, &q) in y.iter_mut().zip(&x[2..]) {
            *o = (q as i8) as f32 * d;
        }
    }
}

/// Quantizes `src` to Q4_0, bit-exactly like ggml's `quantize_row_q4_0_ref`.
///
/// # Panics
/// If `src.len()` is not a multiple of [`QK4_0`] or
/// `dst.len() != src.len() / 32 * 18`.
pub fn quantize_row_q4_0(src: &[f32], dst: &mut [u8]) {
    assert!(
        src.len().is_multiple_of(QK4_0),
        "quantize_row_q4_0: src length {} not a multiple of 32",
        src.len()
    );
    assert_eq!(
        dst.len(),
        src.len() / QK4_0 * BLOCK_Q4_0_BYTES,
        "quantize_row_q4_0: dst length"
    );
    for (x, y) in src
        .chunks_exact(QK4_0)
        .zip(dst.chunks_exact_mut(BLOCK_Q4_0_BYTES))
    {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for j in 0..QK4_0 / 2 {
            let x0 = x[j] * id;
            let x1 = x[j + QK4_0 / 2] * id;
            // (int8_t)(v + 8.5f): truncating (saturating in Rust) cast, then MIN(15, .)
            let q0 = ((x0 + 8.5) as i8).min(15) as u8;
            let q1 = ((x1 + 8.5) as i8).min(15) as u8;
            y[2 + j] = q0 | (q1 << 4);
        }
    }
}

/// Dequantizes a Q4_0 row.
///
/// # Panics
/// If `src.len()` is not a multiple of [`BLOCK_Q4_0_BYTES`] or
/// `dst.len() != src.len() / 18 * 32`.
pub fn dequantize_row_q4_0(src: &[u8], dst: &mut [f32]) {
    assert!(
        src.len().is_multiple_of(BLOCK_Q4_0_BYTES),
        "dequantize_row_q4_0: src length"
    );
    assert_eq!(
        dst.len(),
        src.len() / BLOCK_Q4_0_BYTES * QK4_0,
        "dequantize_row_q4_0: dst length"
    );
    for (x, y) in src
        .chunks_exact(BLOCK_Q4_0_BYTES)
        .zip(dst.chunks_exact_mut(QK4_0))
    {
        let d = block_scale(x);
        let (lo, hi) = y.split_at_mut(QK4_0 / 2);
        for j in 0..QK4_0 / 2 {
            let q = x[2 + j];
            lo[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
            hi[j] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD block quantizer against ggml's loop, byte for byte: random blocks at many
    /// magnitudes, blocks of exact halves (the ties `roundf` breaks away from zero), zeros,
    /// and blocks with a NaN or an infinity (where the SIMD path must hand over to the loop).
    #[test]
    fn q8_block_simd_matches_the_reference_loop() {
        let simd = Q8Simd::detect();
        if !simd.on() {
            println!("skipped: this CPU (or TESSERA_CPU_ISA) has no SIMD quantizer");
            return;
        }
        let mut seed = 0x2545_f491_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        let mut blocks: Vec<[f32; 32]> = Vec::new();
        // 1e-38 and 1e-41: largest magnitudes whose scale's inverse overflows.
        for scale in [
            1e-41f32, 1e-38, 1e-36, 1e-30, 1e-6, 0.01, 1.0, 3.7, 100.0, 1e6, 1e30,
        ] {
            for _ in 0..200 {
                blocks.push(std::array::from_fn(|_| {
                    (next() as f32 / u32::MAX as f32 - 0.5) * scale
                }));
            }
        }
        for k in 0..64 {
            // amax 127 makes the scale 1: every value a half lands on a tie.
            let mut b: [f32; 32] = std::array::from_fn(|i| (i as f32 + k as f32) * 0.5 - 40.0);
            b[k % 32] = if k % 2 == 0 { 127.0 } else { -127.0 };
            // The float just below one half, which adding 0.5 would round up to 1.
            b[(k + 1) % 32] = if k % 4 < 2 { 0.49999997 } else { -0.49999997 };
            blocks.push(b);
        }
        blocks.push([0.0; 32]);
        blocks.push([-0.0; 32]);
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut b = blocks[7];
            b[13] = special;
            blocks.push(b);
        }
        for b in &blocks {
            let (mut want, mut got) = ([0u8; 32], [0u8; 32]);
            let w = quantize_q8_block_scalar(b, &mut want);
            let g = quantize_q8_block(b, &mut got, simd);
            assert_eq!(want, got, "quants of {b:?}");
            assert_eq!(w.0.to_bits(), g.0.to_bits(), "scale of {b:?}");
            assert_eq!(w.1, g.1, "sum of {b:?}");
        }
    }

    #[test]
    fn q8_0_known_vector() {
        // amax = 127 -> d = 1.0 exactly, id = 1.0.
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = i as f32 - 16.0;
        }
        x[0] = -127.0;
        x[1] = 2.5; // rounds away from zero -> 3
        x[2] = -2.5; // -> -3
        x[3] = 0.49; // -> 0
        let mut q = [0u8; 34];
        quantize_row_q8_0(&x, &mut q);
        assert_eq!(&q[..2], &[0x00, 0x3C]); // f16 1.0 = 0x3C00
        assert_eq!(q[2] as i8, -127);
        assert_eq!(q[3] as i8, 3);
        assert_eq!(q[4] as i8, -3);
        assert_eq!(q[5] as i8, 0);
        for i in 4..32 {
            assert_eq!(q[2 + i] as i8, i as i8 - 16);
        }
        // All zeros: d = 0, quants 0.
        let mut q0 = [0xFFu8; 34];
        quantize_row_q8_0(&[0.0; 32], &mut q0);
        assert!(q0.iter().all(|&b| b == 0));
    }

    #[test]
    fn q4_0_known_vector() {
        // max-magnitude element is -16 -> d = -16 / -8 = 2.0, id = 0.5.
        let mut x = [0.0f32; 32];
        x[0] = -16.0; // q = (int)(-8 + 8.5) = 0
        x[1] = 14.0; // 7 + 8.5 = 15.5 -> 15
        x[2] = 1.0; // 0.5 + 8.5 = 9
        x[3] = -1.0; // -0.5 + 8.5 = 8
        x[16] = 15.9; // 7.95 + 8.5 = 16.45 -> 16 -> min 15
        x[17] = -3.0; // -1.5 + 8.5 = 7
        let mut q = [0u8; 18];
        quantize_row_q4_0(&x, &mut q);
        assert_eq!(&q[..2], &[0x00, 0x40]); // f16 2.0 = 0x4000
        assert_eq!(q[2], 15 << 4);
        assert_eq!(q[3], 15 | (7 << 4));
        assert_eq!(q[4], 9 | (8 << 4));
        assert_eq!(q[5], 8 | (8 << 4));
        assert_eq!(q[6], 8 | (8 << 4)); // zeros -> 8
        let mut y = [0.0f32; 32];
        dequantize_row_q4_0(&q, &mut y);
        assert_eq!(y[0], -16.0);
        assert_eq!(y[1], 14.0);
        assert_eq!(y[2], 2.0);
        assert_eq!(y[3], 0.0);
        assert_eq!(y[16], 14.0);
        assert_eq!(y[17], -2.0);
        // Positive max: d negative.
        let mut x2 = [0.0f32; 32];
        x2[5] = 8.0; // d = -1, id = -1: 8 -> -8 + 8.5 = 0.5 -> 0 -> value (0-8)*-1 = 8
        let mut q2 = [0u8; 18];
        quantize_row_q4_0(&x2, &mut q2);
        assert_eq!(&q2[..2], &[0x00, 0xBC]); // f16 -1.0 = 0xBC00
        assert_eq!(q2[2 + 5] & 0x0F, 0);
        dequantize_row_q4_0(&q2, &mut y);
        assert_eq!(y[5], 8.0);
    }

    fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn round_trips() {
        let x = pseudo_random(32 * 40, 7);
        let mut q8 = vec![0u8; 40 * 34];
        quantize_row_q8_0(&x, &mut q8);
        let mut y = vec![0.0f32; x.len()];
        dequantize_row_q8_0(&q8, &mut y);
        for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = block_scale(&q8[b * 34..]);
            for (a, c) in xb.iter().zip(yb) {
                assert!((a - c).abs() <= 0.5 * d * 1.01 + amax * 1e-3, "{a} vs {c}");
            }
        }
        let mut q4 = vec![0u8; 40 * 18];
        quantize_row_q4_0(&x, &mut q4);
        dequantize_row_q4_0(&q4, &mut y);
        for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let d = block_scale(&q4[b * 18..]).abs();
            for (a, c) in xb.iter().zip(yb) {
                // The largest bucket is clamped at 15: error up to 1 step there.
                assert!((a - c).abs() <= d * 1.01, "{a} vs {c} (d={d})");
            }
        }
        // Re-quantizing dequantized Q8_0 data reproduces it exactly.
        let mut q8b = vec![0u8; q8.len()];
        dequantize_row_q8_0(&q8, &mut y);
        quantize_row_q8_0(&y, &mut q8b);
        assert_eq!(q8, q8b);
    }
}
