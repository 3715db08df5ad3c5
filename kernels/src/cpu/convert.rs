//! f16/bf16 <-> f32 row conversions.
//!
//! These use `half`'s slice conversions (which use F16C on x86-64 when the
//! CPU has it), and AVX-512's sixteen-wide conversion for f16 -> f32 where
//! available. Conversions from f32 round to nearest, ties to even.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Converts a row of f16 values to f32.
///
/// # Panics
/// If `src.len() != dst.len()`.
pub fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32_row: length mismatch");
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut done = 0;
    // Attention decodes whole F16 KV planes per token: sixteen values per instruction (the
    // `half` crate converts eight per call) matter there.
    #[cfg(target_arch = "x86_64")]
    if super::features::active_isa() == super::features::Isa::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F is available; the lengths are equal.
        let n = unsafe { f16_to_f32_avx512(src, dst) };
        done = n;
    }
    src[done..].convert_to_f32_slice(&mut dst[done..]);
}

/// Converts the first `len / 16 * 16` values; returns how many.
///
/// # Safety
/// AVX-512F must be available and `dst.len() >= src.len()`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f")]
unsafe fn f16_to_f32_avx512(src: &[f16], dst: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let n = src.len() / 16 * 16;
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 ≤ n ≤ both lengths; unaligned loads and stores.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    n
}

/// Converts a row of f32 values to f16 (round to nearest even).
///
/// # Panics
/// If `src.len() != dst.len()`.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16_row: length mismatch");
    dst.convert_from_f32_slice(src);
}

/// Converts a row of bf16 values to f32 (exact).
///
/// # Panics
/// If `src.len() != dst.len()`.
pub fn bf16_to_f32_row(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "bf16_to_f32_row: length mismatch");
    src.convert_to_f32_slice(dst);
}

/// Converts a row of f32 values to bf16 (round to nearest even; NaN stays NaN).
///
/// # Panics
/// If `src.len() != dst.len()`.
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_bf16_row: length mismatch");
    dst.convert_from_f32_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip() {
        let src: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 5.0).collect();
        let mut h = vec![f16::ZERO; src.len()];
        f32_to_f16_row(&src, &mut h);
        let mut back = vec![0.0f32; src.len()];
        f16_to_f32_row(&h, &mut back);
        for (a, b) in src.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-6);
        }
        // ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
        let mut one = [f16::ZERO];
        f32_to_f16_row(&[1.0 + 2f32.powi(-11)], &mut one);
        assert_eq!(one[0].to_bits(), 0x3C00);
    }

    #[test]
    fn every_f16_converts_as_half_does() {
        // All 65536 bit patterns (NaNs, infinities, subnormals), in a row long enough for the
        // vector path plus a tail.
        let h: Vec<f16> = (0..=u16::MAX)
            .map(f16::from_bits)
            .chain([f16::ONE; 7])
            .collect();
        let mut got = vec![0f32; h.len()];
        f16_to_f32_row(&h, &mut got);
        for (x, g) in h.iter().zip(&got) {
            assert_eq!(
                x.to_f32().to_bits(),
                g.to_bits(),
                "f16 {:#06x}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn bf16_round_to_nearest_even() {
        // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even -> 1.0.
        // 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: -> 1 + 2^-6.
        // 1 + 2^-8 + 2^-20 is above halfway -> 1 + 2^-7.
        let src = [
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            1.0 + 2f32.powi(-8) + 2f32.powi(-20),
            -2.5,
        ];
        let mut dst = [bf16::ZERO; 4];
        f32_to_bf16_row(&src, &mut dst);
        assert_eq!(dst[0].to_bits(), 0x3F80);
        assert_eq!(dst[1].to_bits(), 0x3F82);
        assert_eq!(dst[2].to_bits(), 0x3F81);
        let mut back = [0.0f32; 4];
        bf16_to_f32_row(&dst, &mut back);
        assert_eq!(back[0], 1.0);
        assert_eq!(back[3], -2.5);
    }
}
