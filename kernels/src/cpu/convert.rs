//! f16/bf16 <-> f32 row conversions.
//!
//! These use `half`'s slice conversions (which use F16C on x86-64 when the
//! CPU has it). Conversions from f32 round to nearest, ties to even.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Converts a row of f16 values to f32.
///
/// # Panics
/// If `src.len() != dst.len()`.
pub fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32_row: length mismatch");
    src.convert_to_f32_slice(dst);
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
