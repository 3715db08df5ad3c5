//! Safe dispatchers for the dot products.
//!
//! Each function picks the implementation for [`active_isa`]; the
//! `_with_isa` variants take an explicit level (lowered to what the CPU
//! supports) so tests can compare every path.

use super::affine::{BLOCK_Q4_1_BYTES, BLOCK_Q5_1_BYTES, BLOCK_Q8_1_BYTES};
use super::features::{Isa, active_isa};
use super::iquant::{BLOCK_IQ4_NL_BYTES, BLOCK_IQ4_XS_BYTES, BLOCK_MXFP4_BYTES};
use super::kquant::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_0_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, BLOCK_Q8_K_BYTES,
};
use super::lowbit::{BLOCK_Q2_K_BYTES, BLOCK_Q3_K_BYTES};
use super::quant::{BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES};
#[cfg(target_arch = "aarch64")]
use super::tile::WeightType;

/// Dot product of two f32 slices (SIMD with FMA where available).
///
/// # Panics
/// If `a.len() != b.len()`.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_with_isa(active_isa(), a, b)
}

/// [`dot_f32`] with an explicit instruction set.
///
/// # Panics
/// If `a.len() != b.len()`.
pub fn dot_f32_with_isa(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::dot_f32(isa, a, b)
    }
    #[cfg(target_arch = "aarch64")]
    {
        super::arm::dot_f32(isa, a, b)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        super::generic::dot_f32(a, b)
    }
}

/// Dot product of two Q8_0 rows with the same number of blocks.
///
/// # Panics
/// If `x.len() != y.len()` or the length is not a multiple of 34.
pub fn vec_dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    vec_dot_q8_0_q8_0_with_isa(active_isa(), x, y)
}

/// [`vec_dot_q8_0_q8_0`] with an explicit instruction set.
///
/// # Panics
/// As [`vec_dot_q8_0_q8_0`].
pub fn vec_dot_q8_0_q8_0_with_isa(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
    assert!(
        x.len() == y.len() && x.len().is_multiple_of(BLOCK_Q8_0_BYTES),
        "vec_dot_q8_0_q8_0: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::vec_dot_q::<{ super::x86::KIND_Q8_0 }>(isa, x, y)
    }
    #[cfg(target_arch = "aarch64")]
    {
        super::arm::vec_dot(
            isa,
            WeightType::Q8_0,
            x,
            y,
            super::generic::vec_dot_q8_0_q8_0,
        )
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        super::generic::vec_dot_q8_0_q8_0(x, y)
    }
}

/// Dot product of a Q4_0 row with a Q8_0 row of the same element count.
///
/// # Panics
/// If the lengths are not whole blocks of the same count
/// (`x.len() / 18 == y.len() / 34`).
pub fn vec_dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    vec_dot_q4_0_q8_0_with_isa(active_isa(), x, y)
}

/// [`vec_dot_q4_0_q8_0`] with an explicit instruction set.
///
/// # Panics
/// As [`vec_dot_q4_0_q8_0`].
pub fn vec_dot_q4_0_q8_0_with_isa(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
    assert!(
        x.len().is_multiple_of(BLOCK_Q4_0_BYTES)
            && y.len().is_multiple_of(BLOCK_Q8_0_BYTES)
            && x.len() / BLOCK_Q4_0_BYTES == y.len() / BLOCK_Q8_0_BYTES,
        "vec_dot_q4_0_q8_0: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::vec_dot_q::<{ super::x86::KIND_Q4_0 }>(isa, x, y)
    }
    #[cfg(target_arch = "aarch64")]
    {
        super::arm::vec_dot(
            isa,
            WeightType::Q4_0,
            x,
            y,
            super::generic::vec_dot_q4_0_q8_0,
        )
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        super::generic::vec_dot_q4_0_q8_0(x, y)
    }
}

/// Dot product of a Q5_0 row with a Q8_0 row of the same element count.
///
/// # Panics
/// If the lengths are not whole blocks of the same count
/// (`x.len() / 22 == y.len() / 34`).
pub fn vec_dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    vec_dot_q5_0_q8_0_with_isa(active_isa(), x, y)
}

/// [`vec_dot_q5_0_q8_0`] with an explicit instruction set.
///
/// # Panics
/// As [`vec_dot_q5_0_q8_0`].
pub fn vec_dot_q5_0_q8_0_with_isa(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
    assert!(
        x.len().is_multiple_of(BLOCK_Q5_0_BYTES)
            && y.len().is_multiple_of(BLOCK_Q8_0_BYTES)
            && x.len() / BLOCK_Q5_0_BYTES == y.len() / BLOCK_Q8_0_BYTES,
        "vec_dot_q5_0_q8_0: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::vec_dot_q::<{ super::x86::KIND_Q5_0 }>(isa, x, y)
    }
    #[cfg(target_arch = "aarch64")]
    {
        super::arm::vec_dot(
            isa,
            WeightType::Q5_0,
            x,
            y,
            super::generic::vec_dot_q5_0_q8_0,
        )
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        super::generic::vec_dot_q5_0_q8_0(x, y)
    }
}

/// Checks that `x` and `y` are whole blocks (of `xblk` and `yblk` bytes) of the same count.
fn check_block_lengths(what: &str, x: &[u8], xblk: usize, y: &[u8], yblk: usize) {
    assert!(
        x.len().is_multiple_of(xblk)
            && y.len().is_multiple_of(yblk)
            && x.len() / xblk == y.len() / yblk,
        "{what}: lengths"
    );
}

/// Generates a public weight-row x activation-row dot product (`$act` activations in blocks of
/// `$act_blk` bytes, through `x86::$x86`, `arm::vec_dot` for `WeightType::$wt` or `$generic`) and its `_with_isa` twin.
macro_rules! block_dot {
    ($name:ident, $with_isa:ident, $ty:literal, $blk:ident, $act:literal, $act_blk:ident,
     $x86:ident, $kind:ident, $wt:ident, $generic:expr) => {
        #[doc = concat!("Dot product of a ", $ty, " row with a ", $act, " row of the same element count.")]
        ///
        /// # Panics
        /// If the lengths are not whole blocks of the same count.
        pub fn $name(x: &[u8], y: &[u8]) -> f32 {
            $with_isa(active_isa(), x, y)
        }

        #[doc = concat!("[`", stringify!($name), "`] with an explicit instruction set.")]
        ///
        /// # Panics
        #[doc = concat!("As [`", stringify!($name), "`].")]
        pub fn $with_isa(isa: Isa, x: &[u8], y: &[u8]) -> f32 {
            check_block_lengths(stringify!($name), x, $blk, y, $act_blk);
            #[cfg(target_arch = "x86_64")]
            {
                super::x86::$x86::<{ super::x86::$kind }>(isa, x, y)
            }
            #[cfg(target_arch = "aarch64")]
            {
                super::arm::vec_dot(isa, WeightType::$wt, x, y, $generic)
            }
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            {
                let _ = isa;
                $generic(x, y)
            }
        }
    };
}

block_dot!(
    vec_dot_q4_1_q8_1,
    vec_dot_q4_1_q8_1_with_isa,
    "Q4_1",
    BLOCK_Q4_1_BYTES,
    "Q8_1",
    BLOCK_Q8_1_BYTES,
    vec_dot_q,
    KIND_Q4_1,
    Q4_1,
    super::generic::vec_dot_affine_q8_1::<false>
);
block_dot!(
    vec_dot_q5_1_q8_1,
    vec_dot_q5_1_q8_1_with_isa,
    "Q5_1",
    BLOCK_Q5_1_BYTES,
    "Q8_1",
    BLOCK_Q8_1_BYTES,
    vec_dot_q,
    KIND_Q5_1,
    Q5_1,
    super::generic::vec_dot_affine_q8_1::<true>
);
block_dot!(
    vec_dot_q4_k_q8_k,
    vec_dot_q4_k_q8_k_with_isa,
    "Q4_K",
    BLOCK_Q4_K_BYTES,
    "Q8_K",
    BLOCK_Q8_K_BYTES,
    vec_dot_k,
    KQ_Q4_K,
    Q4_K,
    super::generic::vec_dot_qk_affine_q8_k::<false>
);
block_dot!(
    vec_dot_q5_k_q8_k,
    vec_dot_q5_k_q8_k_with_isa,
    "Q5_K",
    BLOCK_Q5_K_BYTES,
    "Q8_K",
    BLOCK_Q8_K_BYTES,
    vec_dot_k,
    KQ_Q5_K,
    Q5_K,
    super::generic::vec_dot_qk_affine_q8_k::<true>
);
block_dot!(
    vec_dot_q6_k_q8_k,
    vec_dot_q6_k_q8_k_with_isa,
    "Q6_K",
    BLOCK_Q6_K_BYTES,
    "Q8_K",
    BLOCK_Q8_K_BYTES,
    vec_dot_k,
    KQ_Q6_K,
    Q6_K,
    super::generic::vec_dot_q6_k_q8_k
);
block_dot!(
    vec_dot_q2_k_q8_k,
    vec_dot_q2_k_q8_k_with_isa,
    "Q2_K",
    BLOCK_Q2_K_BYTES,
    "Q8_K",
    BLOCK_Q8_K_BYTES,
    vec_dot_lb,
    LB_Q2_K,
    Q2_K,
    super::lowbit::vec_dot_q2_k_q8_k
);
block_dot!(
    vec_dot_q3_k_q8_k,
    vec_dot_q3_k_q8_k_with_isa,
    "Q3_K",
    BLOCK_Q3_K_BYTES,
    "Q8_K",
    BLOCK_Q8_K_BYTES,
    vec_dot_lb,
    LB_Q3_K,
    Q3_K,
    super::lowbit::vec_dot_q3_k_q8_k
);
block_dot!(
    vec_dot_iq4_xs_q8_k,
    vec_dot_iq4_xs_q8_k_with_isa,
    "IQ4_XS",
    BLOCK_IQ4_XS_BYTES,
    "Q8_K",
    BLOCK_Q8_K_BYTES,
    vec_dot_lb,
    LB_IQ4_XS,
    IQ4_XS,
    super::iquant::vec_dot_iq4_xs_q8_k
);
block_dot!(
    vec_dot_iq4_nl_q8_0,
    vec_dot_iq4_nl_q8_0_with_isa,
    "IQ4_NL",
    BLOCK_IQ4_NL_BYTES,
    "Q8_0",
    BLOCK_Q8_0_BYTES,
    vec_dot_lb,
    LB_IQ4_NL,
    IQ4_NL,
    super::iquant::vec_dot_iq4_nl_q8_0
);
block_dot!(
    vec_dot_mxfp4_q8_0,
    vec_dot_mxfp4_q8_0_with_isa,
    "MXFP4",
    BLOCK_MXFP4_BYTES,
    "Q8_0",
    BLOCK_Q8_0_BYTES,
    vec_dot_lb,
    LB_MXFP4,
    MXFP4,
    super::iquant::vec_dot_mxfp4_q8_0
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quant::{
        dequantize_row_q4_0, dequantize_row_q8_0, quantize_row_q4_0, quantize_row_q8_0,
    };

    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn supported_isas() -> Vec<Isa> {
        Isa::ALL
            .iter()
            .copied()
            .filter(|isa| {
                let ok = isa.is_supported();
                if !ok {
                    println!("skipping {isa}: not supported by this CPU");
                }
                ok
            })
            .collect()
    }

    #[test]
    fn dot_f32_paths_agree() {
        for n in [0usize, 1, 7, 15, 16, 17, 31, 63, 64, 65, 100, 1000, 4099] {
            let a = rand_vec(n + 1, n as u64 + 1);
            let b = rand_vec(n + 1, n as u64 + 1000);
            // Offset by one element: no 64-byte alignment.
            let (a, b) = (&a[1..], &b[1..]);
            let exact: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let mag: f64 = a
                .iter()
                .zip(b)
                .map(|(x, y)| (*x as f64 * *y as f64).abs())
                .sum();
            let scalar = dot_f32_with_isa(Isa::Scalar, a, b);
            for isa in supported_isas() {
                let v = dot_f32_with_isa(isa, a, b);
                // 1e-5 relative to the sum of |a_i b_i| (the scale of the rounding errors).
                assert!(
                    ((v - scalar) as f64).abs() <= 1e-5 * mag + 1e-30,
                    "{isa} n={n}: {v} vs scalar {scalar}"
                );
                assert!(
                    (v as f64 - exact).abs() <= 1e-5 * mag + 1e-30,
                    "{isa} n={n}: {v} vs exact {exact}"
                );
            }
        }
    }

    /// Checks every supported path of `f` against the scalar one (within `tol_scalar · mag`) and
    /// against the f64 dot of the decoded operands `dx`, `dy` (within `tol_exact · mag`, where
    /// `mag` is the sum of `|dx_i dy_i|`, the scale of the rounding errors).
    fn check_paths(
        what: &str,
        f: impl Fn(Isa) -> f32,
        dx: &[f32],
        dy: &[f32],
        tol_scalar: f64,
        tol_exact: f64,
    ) {
        let exact: f64 = dx.iter().zip(dy).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mag: f64 = dx
            .iter()
            .zip(dy)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        let scalar = f(Isa::Scalar);
        for isa in supported_isas() {
            let v = f(isa);
            assert!(
                ((v - scalar) as f64).abs() <= tol_scalar * mag,
                "{isa} {what}: {v} vs {scalar}"
            );
            assert!(
                (v as f64 - exact).abs() <= tol_exact * mag,
                "{isa} {what}: {v} vs {exact}"
            );
        }
    }

    #[test]
    fn quant_dots_paths_agree() {
        for nb in [1usize, 2, 3, 4, 5, 7, 8, 9, 33] {
            let n = nb * 32;
            let xf = rand_vec(n, nb as u64 * 3 + 1);
            let yf: Vec<f32> = rand_vec(n, nb as u64 * 7 + 2)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            // Leading byte so the blocks are at odd addresses.
            let mut x8 = vec![0u8; 1 + nb * 34];
            let mut x4 = vec![0u8; 1 + nb * 18];
            let mut y8 = vec![0u8; 1 + nb * 34];
            quantize_row_q8_0(&xf, &mut x8[1..]);
            quantize_row_q4_0(&xf, &mut x4[1..]);
            quantize_row_q8_0(&yf, &mut y8[1..]);
            let (x8, x4, y8) = (&x8[1..], &x4[1..], &y8[1..]);
            let mut dx8 = vec![0.0f32; n];
            let mut dx4 = vec![0.0f32; n];
            let mut dy = vec![0.0f32; n];
            dequantize_row_q8_0(x8, &mut dx8);
            dequantize_row_q4_0(x4, &mut dx4);
            dequantize_row_q8_0(y8, &mut dy);
            for (x, dx, q4) in [(x8, &dx8, false), (x4, &dx4, true)] {
                let f = |isa| {
                    if q4 {
                        vec_dot_q4_0_q8_0_with_isa(isa, x, y8)
                    } else {
                        vec_dot_q8_0_q8_0_with_isa(isa, x, y8)
                    }
                };
                // 1e-4 relative to sum |x_i y_i| (integer block sums are exact;
                // only the f32 scaling/accumulation order differs).
                check_paths(&format!("q4={q4} nb={nb}"), f, dx, &dy, 1e-4, 1e-4);
            }
        }
    }

    #[test]
    fn affine_dots_paths_agree() {
        use crate::cpu::affine::*;
        for nb in [1usize, 2, 3, 4, 5, 7, 8, 9, 33] {
            let n = nb * 32;
            // Offset weights, so the minimum term matters.
            let xf: Vec<f32> = rand_vec(n, nb as u64 * 5 + 3)
                .iter()
                .map(|v| v + 0.7)
                .collect();
            let yf = rand_vec(n, nb as u64 * 11 + 4);
            let mut y = vec![0u8; 1 + nb * 36];
            quantize_row_q8_1(&yf, &mut y[1..]);
            let y = &y[1..];
            let mut dy = vec![0.0f32; n];
            dequantize_row_q8_1(y, &mut dy);
            type Codec = (QuantFn, DequantFn, fn(Isa, &[u8], &[u8]) -> f32, usize);
            type QuantFn = fn(&[f32], &mut [u8]);
            type DequantFn = fn(&[u8], &mut [f32]);
            let codecs: [(&str, Codec); 2] = [
                (
                    "q4_1",
                    (
                        quantize_row_q4_1,
                        dequantize_row_q4_1,
                        vec_dot_q4_1_q8_1_with_isa,
                        20,
                    ),
                ),
                (
                    "q5_1",
                    (
                        quantize_row_q5_1,
                        dequantize_row_q5_1,
                        vec_dot_q5_1_q8_1_with_isa,
                        24,
                    ),
                ),
            ];
            for (name, (q, dq, dot, bs)) in codecs {
                let mut x = vec![0u8; 1 + nb * bs];
                q(&xf, &mut x[1..]);
                let x = &x[1..];
                let mut dx = vec![0.0f32; n];
                dq(x, &mut dx);
                // Q8_1's `s` is `d·Σq` rounded to f16: the minimum term is ~1e-3 off exact.
                let f = |isa| dot(isa, x, y);
                check_paths(&format!("{name} nb={nb}"), f, &dx, &dy, 1e-5, 3e-3);
            }
        }
    }
}
