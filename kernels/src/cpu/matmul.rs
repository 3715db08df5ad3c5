//! Tile-level matrix multiplication entry points.
//!
//! [`mul_mat_tile`] computes `out[c * ldo + r] = sum_i W[r][i] * X[c][i]` for
//! one (rows x columns) tile; the backend splits a matmul into tiles and
//! runs them on its worker threads. Activations are first brought into the
//! form [`act_type`] of the weight type asks for, with [`prepare_act`].

use super::features::{Isa, active_isa};
use super::tile::check_tile_args;
pub use super::tile::{ActType, WeightType, act_row_bytes, act_type, prepare_act};

/// Tile matmul: for `r < rows`, `c < cols`:
/// `out[c * ldo + r] = sum_{i<k} W[r][i] * X[c][i]`.
///
/// * `w`: `rows` rows of `k` elements of type `wt`; row `r` starts at byte
///   `r * w_stride` (`w_stride >= wt.row_bytes(k)`).
/// * `x`: `cols` activation columns already in [`act_type`]`(wt)` form
///   (see [`prepare_act`]); column `c` starts at byte `c * x_stride`.
/// * `scratch`: a per-thread buffer the kernel grows and reuses.
///
/// Single-threaded; uses the instruction set [`active_isa`] picks.
/// No alignment of `w` or `x` is assumed.
///
/// # Panics
/// If `k` is not a multiple of the block size of `wt`, if a stride is
/// smaller than a row/column (when there is more than one), if `ldo < rows`
/// (when `cols > 1`), or if `w`, `x` or `out` is too short for the shape.
#[allow(clippy::too_many_arguments)]
pub fn mul_mat_tile(
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
    mul_mat_tile_with_isa(
        active_isa(),
        wt,
        w,
        w_stride,
        rows,
        x,
        x_stride,
        cols,
        k,
        out,
        ldo,
        scratch,
    )
}

/// [`mul_mat_tile`] with an explicit instruction set (lowered to the best one
/// the CPU supports). Used by tests and benchmarks to cover every path.
///
/// # Panics
/// As [`mul_mat_tile`].
#[allow(clippy::too_many_arguments)]
pub fn mul_mat_tile_with_isa(
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
    scratch: &mut Vec<u8>,
) {
    check_tile_args(wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo);
    if rows == 0 || cols == 0 {
        return;
    }
    if k == 0 {
        for c in 0..cols {
            out[c * ldo..c * ldo + rows].fill(0.0);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::mul_mat_tile(
            isa, wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        )
    }
    #[cfg(target_arch = "aarch64")]
    {
        super::arm::mul_mat_tile(
            isa, wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        )
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = isa;
        super::generic::mul_mat_tile(
            wt, w, w_stride, rows, x, x_stride, cols, k, out, ldo, scratch,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cpu::affine::*;
    use crate::cpu::iquant::*;
    use crate::cpu::kquant::*;
    use crate::cpu::lowbit::*;
    use crate::cpu::quant::{
        dequantize_row_q4_0, dequantize_row_q8_0, quantize_row_q4_0, quantize_row_q8_0,
    };

    pub(crate) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
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

    /// Encodes `vals` (one row) as weight type `wt`; returns the bytes and
    /// the values the bytes decode to.
    pub(crate) fn encode_row(wt: WeightType, vals: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let k = vals.len();
        let mut bytes = vec![0u8; wt.row_bytes(k)];
        let mut dec = vec![0.0f32; k];
        match wt {
            WeightType::F32 => {
                for (b, v) in bytes.chunks_exact_mut(4).zip(vals) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
                dec.copy_from_slice(vals);
            }
            WeightType::F16 => {
                for ((b, v), d) in bytes.chunks_exact_mut(2).zip(vals).zip(dec.iter_mut()) {
                    let h = half::f16::from_f32(*v);
                    b.copy_from_slice(&h.to_bits().to_le_bytes());
                    *d = h.to_f32();
                }
            }
            WeightType::BF16 => {
                for ((b, v), d) in bytes.chunks_exact_mut(2).zip(vals).zip(dec.iter_mut()) {
                    let h = half::bf16::from_f32(*v);
                    b.copy_from_slice(&h.to_bits().to_le_bytes());
                    *d = h.to_f32();
                }
            }
            WeightType::Q8_0 => {
                quantize_row_q8_0(vals, &mut bytes);
                dequantize_row_q8_0(&bytes, &mut dec);
            }
            WeightType::Q4_0 => {
                quantize_row_q4_0(vals, &mut bytes);
                dequantize_row_q4_0(&bytes, &mut dec);
            }
            WeightType::Q5_0 => {
                quantize_row_q5_0(vals, &mut bytes);
                dequantize_row_q5_0(&bytes, &mut dec);
            }
            WeightType::Q4_1 => {
                quantize_row_q4_1(vals, &mut bytes);
                dequantize_row_q4_1(&bytes, &mut dec);
            }
            WeightType::Q5_1 => {
                quantize_row_q5_1(vals, &mut bytes);
                dequantize_row_q5_1(&bytes, &mut dec);
            }
            WeightType::Q4_K => {
                quantize_row_q4_k(vals, &mut bytes);
                dequantize_row_q4_k(&bytes, &mut dec);
            }
            WeightType::Q5_K => {
                quantize_row_q5_k(vals, &mut bytes);
                dequantize_row_q5_k(&bytes, &mut dec);
            }
            WeightType::Q6_K => {
                quantize_row_q6_k(vals, &mut bytes);
                dequantize_row_q6_k(&bytes, &mut dec);
            }
            WeightType::Q2_K => {
                quantize_row_q2_k(vals, &mut bytes);
                dequantize_row_q2_k(&bytes, &mut dec);
            }
            WeightType::Q3_K => {
                quantize_row_q3_k(vals, &mut bytes);
                dequantize_row_q3_k(&bytes, &mut dec);
            }
            WeightType::IQ4_NL => {
                quantize_row_iq4_nl(vals, &mut bytes);
                dequantize_row_iq4_nl(&bytes, &mut dec);
            }
            WeightType::IQ4_XS => {
                quantize_row_iq4_xs(vals, &mut bytes);
                dequantize_row_iq4_xs(&bytes, &mut dec);
            }
            WeightType::MXFP4 => {
                quantize_row_mxfp4(vals, &mut bytes);
                dequantize_row_mxfp4(&bytes, &mut dec);
            }
        }
        (bytes, dec)
    }

    /// Builds a tile's operands with the given strides and leading offsets,
    /// runs `mul_mat_tile_with_isa` and returns the NMSE against an f64
    /// reference over the decoded operands (and checks that `out` entries
    /// outside the tile are untouched).
    #[allow(clippy::too_many_arguments)]
    fn run_case(
        isa: Isa,
        wt: WeightType,
        rows: usize,
        cols: usize,
        k: usize,
        w_off: usize,
        x_off: usize,
        pad: usize,
    ) -> f64 {
        let at = act_type(wt);
        let wrow = wt.row_bytes(k);
        let xrow = act_row_bytes(at, k);
        let w_stride = wrow + pad;
        let x_stride = xrow + pad + 2;
        let ldo = rows + 3;
        let mut w = vec![0xA5u8; w_off + rows * w_stride];
        let mut wdec = vec![0.0f32; rows * k];
        for r in 0..rows {
            let vals = rand_vec(k, (r * 31 + k) as u64 + wt as u64 * 1000);
            let (bytes, dec) = encode_row(wt, &vals);
            w[w_off + r * w_stride..w_off + r * w_stride + wrow].copy_from_slice(&bytes);
            wdec[r * k..(r + 1) * k].copy_from_slice(&dec);
        }
        let mut x = vec![0x5Au8; x_off + cols * x_stride];
        let mut xdec = vec![0.0f32; cols * k];
        for c in 0..cols {
            let vals: Vec<f32> = rand_vec(k, (c * 17 + 5) as u64)
                .iter()
                .map(|v| v * 2.0)
                .collect();
            let dst = &mut x[x_off + c * x_stride..x_off + c * x_stride + xrow];
            prepare_act(at, &vals, dst);
            match at {
                ActType::F32 => xdec[c * k..(c + 1) * k].copy_from_slice(&vals),
                ActType::Q8_0 => dequantize_row_q8_0(dst, &mut xdec[c * k..(c + 1) * k]),
                ActType::Q8_1 => dequantize_row_q8_1(dst, &mut xdec[c * k..(c + 1) * k]),
                ActType::Q8_K => dequantize_row_q8_k(dst, &mut xdec[c * k..(c + 1) * k]),
            }
        }
        let mut out = vec![f32::NAN; cols * ldo];
        let mut scratch = Vec::new();
        mul_mat_tile_with_isa(
            isa,
            wt,
            &w[w_off..],
            w_stride,
            rows,
            &x[x_off..],
            x_stride,
            cols,
            k,
            &mut out,
            ldo,
            &mut scratch,
        );
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for c in 0..cols {
            for r in 0..ldo {
                let v = out[c * ldo + r];
                if r >= rows {
                    assert!(v.is_nan(), "out[{c}*ldo+{r}] outside the tile was written");
                    continue;
                }
                let wr = &w[w_off + r * w_stride..];
                let xc = &x[x_off + c * x_stride..];
                let reference: f64 = (0..k)
                    .map(|i| wdec[r * k + i] as f64 * xdec[c * k + i] as f64)
                    .sum::<f64>()
                    + q8_1_sum_correction(wt, wr, xc, k);
                err += (v as f64 - reference).powi(2);
                norm += reference * reference;
            }
        }
        err / norm.max(1e-300)
    }

    /// NMSE bound against the f64 reference: the float types only differ by f32 accumulation
    /// order; the quantized types compute exact integer block sums, scaled and accumulated in f32.
    fn tolerance(wt: WeightType) -> f64 {
        if wt.is_quantized() { 1e-8 } else { 1e-10 }
    }

    /// What Q4_1 / Q5_1 dots add beyond the decoded operands' product: they take each activation
    /// block's sum from Q8_1's `s` (`d·Σq` rounded to f16, as ggml does), not from the decoded
    /// quants, so the reference does too: `Σ_b m_b·(s_b − d_b·Σq_b)`. Zero for other types.
    fn q8_1_sum_correction(wt: WeightType, w: &[u8], x: &[u8], k: usize) -> f64 {
        if act_type(wt) != ActType::Q8_1 {
            return 0.0;
        }
        let f16_at = |b: &[u8], at: usize| {
            half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f64()
        };
        let wb = wt.row_bytes(32);
        (0..k / 32)
            .map(|b| {
                let xb = &x[b * BLOCK_Q8_1_BYTES..(b + 1) * BLOCK_Q8_1_BYTES];
                let isum: i32 = xb[4..].iter().map(|&q| i32::from(q as i8)).sum();
                let s = f16_at(xb, 2) - f16_at(xb, 0) * f64::from(isum);
                f16_at(&w[b * wb..], 2) * s
            })
            .sum()
    }

    #[test]
    fn mul_mat_tile_matches_reference() {
        for &isa in Isa::ALL {
            if !isa.is_supported() {
                println!("skipping {isa}: not supported by this CPU");
                continue;
            }
            for wt in WeightType::ALL {
                let tol = tolerance(wt);
                let ks: &[usize] = if wt.block_elems() == QK_K {
                    &[256, 512, 768]
                } else {
                    &[32, 64, 288]
                };
                for &k in ks {
                    for &rows in &[1usize, 5, 37] {
                        for &cols in &[1usize, 3, 17, 33] {
                            for (w_off, x_off, pad) in [(0, 0, 0), (1, 3, 6)] {
                                let nmse = run_case(isa, wt, rows, cols, k, w_off, x_off, pad);
                                assert!(
                                    nmse <= tol,
                                    "{isa} {wt:?} rows={rows} cols={cols} k={k} offsets=({w_off},{x_off},{pad}): NMSE {nmse:e} > {tol:e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn float_k_not_multiple_of_simd_width() {
        for isa in Isa::ALL.iter().copied().filter(|i| i.is_supported()) {
            for wt in [WeightType::F32, WeightType::F16, WeightType::BF16] {
                for k in [1usize, 7, 13, 31, 45] {
                    for cols in [1usize, 2, 9] {
                        let nmse = run_case(isa, wt, 6, cols, k, 1, 1, 2);
                        assert!(nmse <= 1e-10, "{isa} {wt:?} k={k} cols={cols}: {nmse:e}");
                    }
                }
            }
        }
    }

    #[test]
    fn large_k_single_column() {
        for isa in Isa::ALL.iter().copied().filter(|i| i.is_supported()) {
            for wt in WeightType::ALL {
                let nmse = run_case(isa, wt, 9, 1, 4096, 0, 0, 0);
                let tol = tolerance(wt);
                assert!(nmse <= tol, "{isa} {wt:?}: {nmse:e}");
            }
        }
    }

    #[test]
    fn empty_and_zero_k() {
        let mut out = vec![1.0f32; 6];
        let mut scratch = Vec::new();
        mul_mat_tile(
            WeightType::F32,
            &[],
            0,
            3,
            &[],
            0,
            2,
            0,
            &mut out,
            3,
            &mut scratch,
        );
        assert!(out.iter().all(|&v| v == 0.0));
        mul_mat_tile(
            WeightType::Q8_0,
            &[],
            0,
            0,
            &[],
            0,
            0,
            64,
            &mut [],
            0,
            &mut scratch,
        );
    }

    #[test]
    fn act_helpers() {
        assert_eq!(act_type(WeightType::F16), ActType::F32);
        assert_eq!(act_type(WeightType::Q4_0), ActType::Q8_0);
        assert_eq!(act_row_bytes(ActType::F32, 64), 256);
        assert_eq!(act_row_bytes(ActType::Q8_0, 64), 68);
        let mut d = [0u8; 8];
        prepare_act(ActType::F32, &[1.0, -2.0], &mut d);
        assert_eq!(&d[..4], &1.0f32.to_le_bytes());
    }

    #[test]
    #[should_panic(expected = "w too short")]
    fn short_weights_panic() {
        let mut out = vec![0.0f32; 4];
        mul_mat_tile(
            WeightType::F32,
            &[0u8; 15],
            16,
            1,
            &[0u8; 16],
            16,
            1,
            4,
            &mut out,
            1,
            &mut Vec::new(),
        );
    }
}
