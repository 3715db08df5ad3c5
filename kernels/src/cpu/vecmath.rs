//! Vectorised transcendental row ops: `exp`, and the gated activations SiLU and GELU (tanh
//! form) that feed-forward blocks apply to every element of a `[n_ff, T]` tensor.
//!
//! libm's scalar `expf`/`tanhf` were a fifth of Gemma 3's prompt time. The AVX-512 path
//! evaluates `exp` as `2^n · p(r)` with `r = x − n·ln 2` and a degree-6 polynomial (relative
//! error ≤ 2e-7 over the f32 range, `scalef` handling the exponent, so large negative inputs give
//! 0 and large positive ones +∞ as `expf` does). GELU uses `0.5·(1 + tanh u) = 1 / (1 + e^{−2u})`,
//! the same function as ggml's `ggml_gelu_f32` without the cancellation of `1 − 2/(1 + e^{2u})`.
//! On aarch64 the same evaluation runs on four NEON lanes.
#![allow(unsafe_code)]

use super::features::{Isa, active_isa};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044_715;

/// SiLU, `x · σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU (tanh approximation, as ggml), `x · σ(2u)` with `u = √(2/π)·(x + 0.044715·x³)`.
#[inline]
pub fn gelu(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

/// Which gated activation [`glu_row`] applies to the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU: `gelu(gate) · up`.
    Gelu,
}

/// `out[i] = act(gate[i]) · up[i]` over the common length.
pub fn glu_row(act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if active_isa() == Isa::Avx512 {
        // SAFETY: AVX-512 is available; the kernel touches the first `n / 16 * 16` elements.
        done = unsafe { x86::glu(act, &gate[..n], &up[..n], &mut out[..n]) };
    }
    #[cfg(target_arch = "aarch64")]
    if active_isa() != Isa::Scalar {
        done = arm::glu(act, &gate[..n], &up[..n], &mut out[..n]);
    }
    for i in done..n {
        out[i] = match act {
            Gate::Silu => silu(gate[i]),
            Gate::Gelu => gelu(gate[i]),
        } * up[i];
    }
}

/// `x[i] = act(x[i])` in place.
pub fn act_row(act: Gate, x: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if active_isa() == Isa::Avx512 {
        // SAFETY: AVX-512 is available; the kernel touches the first `len / 16 * 16` elements.
        done = unsafe { x86::act(act, x) };
    }
    #[cfg(target_arch = "aarch64")]
    if active_isa() != Isa::Scalar {
        done = arm::act(act, x);
    }
    for v in &mut x[done..] {
        *v = match act {
            Gate::Silu => silu(*v),
            Gate::Gelu => gelu(*v),
        };
    }
}

/// `x[i] = exp(x[i] − shift)` in place; returns the sum of the results.
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    let mut done = 0;
    let mut sum = 0f32;
    #[cfg(target_arch = "x86_64")]
    if active_isa() == Isa::Avx512 {
        // SAFETY: AVX-512 is available; the kernel touches the first `len / 16 * 16` elements.
        (done, sum) = unsafe { x86::exp_shifted_sum(x, shift) };
    }
    #[cfg(target_arch = "aarch64")]
    if active_isa() != Isa::Scalar {
        (done, sum) = arm::exp_shifted_sum(x, shift);
    }
    for v in &mut x[done..] {
        *v = (*v - shift).exp();
        sum += *v;
    }
    sum
}

/// `out[c·n + i] += p[c] · x[i]` for every column `c < p.len()` and `i < n = x.len()`: one row
/// `x` added into several accumulators with their weights (attention's weighted sums of V),
/// each element of `x` loaded once.
///
/// # Panics
/// If `out` is shorter than `p.len() · x.len()`.
pub fn axpy_columns(out: &mut [f32], p: &[f32], x: &[f32]) {
    let n = x.len();
    assert!(out.len() >= p.len() * n, "axpy_columns: out too short");
    #[cfg(target_arch = "x86_64")]
    let done = match active_isa() {
        // SAFETY: AVX-512 is available; lengths checked above.
        Isa::Avx512 => unsafe { x86::axpy_columns_avx512(out, p, x) },
        // SAFETY: AVX2 and FMA are available; lengths checked above.
        Isa::Avx2 => unsafe { x86::axpy_columns_avx2(out, p, x) },
        _ => 0,
    };
    // Elsewhere the loop below vectorises for the baseline (NEON on aarch64).
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (c, &w) in p.iter().enumerate() {
        let o = &mut out[c * n..(c + 1) * n];
        for i in done..n {
            o[i] += w * x[i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{GELU_COEF_A, Gate, SQRT_2_OVER_PI};
    use std::arch::x86_64::*;

    /// [`super::axpy_columns`] over the first `x.len() / 16 * 16` elements; returns that count.
    #[target_feature(enable = "avx512f")]
    pub(super) fn axpy_columns_avx512(out: &mut [f32], p: &[f32], x: &[f32]) -> usize {
        let n = x.len();
        let done = n / 16 * 16;
        for i in (0..done).step_by(16) {
            // SAFETY: i + 16 <= n, and every column's row lies in `out` (checked by the caller).
            unsafe {
                let xv = _mm512_loadu_ps(x.as_ptr().add(i));
                for (c, &w) in p.iter().enumerate() {
                    let o = out.as_mut_ptr().add(c * n + i);
                    _mm512_storeu_ps(
                        o,
                        _mm512_fmadd_ps(_mm512_set1_ps(w), xv, _mm512_loadu_ps(o)),
                    );
                }
            }
        }
        done
    }

    /// [`super::axpy_columns`] over the first `x.len() / 8 * 8` elements; returns that count.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn axpy_columns_avx2(out: &mut [f32], p: &[f32], x: &[f32]) -> usize {
        let n = x.len();
        let done = n / 8 * 8;
        for i in (0..done).step_by(8) {
            // SAFETY: i + 8 <= n, and every column's row lies in `out` (checked by the caller).
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(i));
                for (c, &w) in p.iter().enumerate() {
                    let o = out.as_mut_ptr().add(c * n + i);
                    _mm256_storeu_ps(
                        o,
                        _mm256_fmadd_ps(_mm256_set1_ps(w), xv, _mm256_loadu_ps(o)),
                    );
                }
            }
        }
        done
    }

    /// `e^x` for sixteen lanes; exactly 0 below the smallest normal result (and for −∞), so
    /// masked attention scores contribute nothing.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn exp16(x_in: __m512) -> __m512 {
        let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x_in, _mm512_set1_ps(-87.336_54));
        let x = x_in;
        // Above this e^x is +inf in f32; clamping keeps n finite for scalef.
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-88.0)),
            _mm512_set1_ps(89.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        // r = x − n·ln 2 in two parts (Cody–Waite) so r keeps full precision.
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        // Taylor terms 1/6! .. 1/1! for e^r on |r| ≤ ln2/2.
        let mut p = _mm512_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let e = _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
        // The clamps above replaced NaN lanes by a bound: put the NaNs back.
        _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x_in, x_in), x_in)
    }

    /// `1 / (1 + e^{−z})` for sixteen lanes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn sigmoid16(z: __m512) -> __m512 {
        let one = _mm512_set1_ps(1.0);
        _mm512_div_ps(
            one,
            _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), z))),
        )
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn act16(act: Gate, x: __m512) -> __m512 {
        match act {
            Gate::Silu => _mm512_mul_ps(x, sigmoid16(x)),
            Gate::Gelu => {
                let x2 = _mm512_mul_ps(x, x);
                let inner = _mm512_fmadd_ps(x2, _mm512_set1_ps(GELU_COEF_A), _mm512_set1_ps(1.0));
                let u = _mm512_mul_ps(
                    _mm512_mul_ps(x, inner),
                    _mm512_set1_ps(2.0 * SQRT_2_OVER_PI),
                );
                _mm512_mul_ps(x, sigmoid16(u))
            }
        }
    }

    /// # Safety
    /// AVX-512F; the three slices have the same length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn glu(act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        let n = gate.len() / 16 * 16;
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 ≤ n ≤ each slice's length.
            unsafe {
                let g = _mm512_loadu_ps(gate.as_ptr().add(i));
                let u = _mm512_loadu_ps(up.as_ptr().add(i));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(act16(act, g), u));
            }
        }
        n
    }

    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn act(act: Gate, x: &mut [f32]) -> usize {
        let n = x.len() / 16 * 16;
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 ≤ n ≤ x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, act16(act, _mm512_loadu_ps(p)));
            }
        }
        n
    }

    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted_sum(x: &mut [f32], shift: f32) -> (usize, f32) {
        let n = x.len() / 16 * 16;
        let s = _mm512_set1_ps(shift);
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            // SAFETY: i + 16 ≤ n ≤ x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p), s));
                _mm512_storeu_ps(p, e);
                acc = _mm512_add_ps(acc, e);
            }
        }
        (n, _mm512_reduce_add_ps(acc))
    }
}

/// The NEON twins of the AVX-512 kernels (four lanes; NEON is baseline on aarch64, so the
/// functions are safe). `2^n` is applied as two exact powers of two, as `vscalefps` would.
#[cfg(target_arch = "aarch64")]
mod arm {
    use super::{GELU_COEF_A, Gate, SQRT_2_OVER_PI};
    use std::arch::aarch64::*;

    /// `e^x` for four lanes; exactly 0 below the smallest normal result (and for −∞).
    #[inline(always)]
    fn exp4(x_in: float32x4_t) -> float32x4_t {
        // SAFETY: register-only baseline NEON.
        unsafe {
            let keep = vcgeq_f32(x_in, vdupq_n_f32(-87.336_54));
            let x = vminq_f32(vmaxq_f32(x_in, vdupq_n_f32(-88.0)), vdupq_n_f32(89.0));
            let n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(std::f32::consts::LOG2_E)));
            // r = x − n·ln 2 in two parts (Cody–Waite) so r keeps full precision.
            let r = vfmsq_f32(x, n, vdupq_n_f32(0.693_145_75));
            let r = vfmsq_f32(r, n, vdupq_n_f32(1.428_606_8e-6));
            let mut p = vdupq_n_f32(1.0 / 720.0);
            for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
                p = vfmaq_f32(vdupq_n_f32(c), p, r);
            }
            // n ∈ [−127, 129]: two factors 2^(n/2) keep both exponents normal.
            let ni = vcvtq_s32_f32(n);
            let n1 = vshrq_n_s32::<1>(ni);
            let n2 = vsubq_s32(ni, n1);
            let bias = vdupq_n_s32(127);
            let s1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n1, bias)));
            let s2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n2, bias)));
            let e = vmulq_f32(vmulq_f32(p, s1), s2);
            let e = vbslq_f32(keep, e, vdupq_n_f32(0.0));
            // The clamps replaced NaN lanes by a bound: put the NaNs back.
            vbslq_f32(vceqq_f32(x_in, x_in), e, x_in)
        }
    }

    /// `1 / (1 + e^{−z})` for four lanes.
    #[inline(always)]
    fn sigmoid4(z: float32x4_t) -> float32x4_t {
        // SAFETY: register-only baseline NEON.
        unsafe {
            let one = vdupq_n_f32(1.0);
            vdivq_f32(one, vaddq_f32(one, exp4(vnegq_f32(z))))
        }
    }

    #[inline(always)]
    fn act4(act: Gate, x: float32x4_t) -> float32x4_t {
        // SAFETY: register-only baseline NEON.
        unsafe {
            match act {
                Gate::Silu => vmulq_f32(x, sigmoid4(x)),
                Gate::Gelu => {
                    let inner =
                        vfmaq_f32(vdupq_n_f32(1.0), vmulq_f32(x, x), vdupq_n_f32(GELU_COEF_A));
                    let u = vmulq_f32(vmulq_f32(x, inner), vdupq_n_f32(2.0 * SQRT_2_OVER_PI));
                    vmulq_f32(x, sigmoid4(u))
                }
            }
        }
    }

    /// `out = act(gate) · up` over the first `len / 4 * 4` elements; returns how many.
    pub(super) fn glu(act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        let n = gate.len().min(up.len()).min(out.len()) / 4 * 4;
        for i in (0..n).step_by(4) {
            // SAFETY: i + 4 ≤ n ≤ each slice's length.
            unsafe {
                let g = vld1q_f32(gate.as_ptr().add(i));
                let u = vld1q_f32(up.as_ptr().add(i));
                vst1q_f32(out.as_mut_ptr().add(i), vmulq_f32(act4(act, g), u));
            }
        }
        n
    }

    /// `x = act(x)` over the first `len / 4 * 4` elements; returns how many.
    pub(super) fn act(act: Gate, x: &mut [f32]) -> usize {
        let n = x.len() / 4 * 4;
        for i in (0..n).step_by(4) {
            // SAFETY: i + 4 ≤ n ≤ x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                vst1q_f32(p, act4(act, vld1q_f32(p)));
            }
        }
        n
    }

    /// `x = e^(x − shift)` over the first `len / 4 * 4` elements; returns how many and their
    /// sum.
    pub(super) fn exp_shifted_sum(x: &mut [f32], shift: f32) -> (usize, f32) {
        let n = x.len() / 4 * 4;
        // SAFETY: register-only baseline NEON.
        let (s, mut acc) = unsafe { (vdupq_n_f32(shift), vdupq_n_f32(0.0)) };
        for i in (0..n).step_by(4) {
            // SAFETY: i + 4 ≤ n ≤ x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let e = exp4(vsubq_f32(vld1q_f32(p), s));
                vst1q_f32(p, e);
                acc = vaddq_f32(acc, e);
            }
        }
        // SAFETY: register-only baseline NEON.
        (n, unsafe { vaddvq_f32(acc) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every SIMD width and its scalar tail against f64 sums, three columns at once.
    #[test]
    fn axpy_columns_adds_each_weighted_row() {
        for n in [1, 7, 8, 15, 16, 17, 64, 100, 256] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let p = [0.5f32, -2.0, 0.0];
            let mut out: Vec<f32> = (0..3 * n).map(|i| i as f32 * 0.01).collect();
            let before = out.clone();
            axpy_columns(&mut out, &p, &x);
            for c in 0..3 {
                for i in 0..n {
                    let want = f64::from(before[c * n + i]) + f64::from(p[c]) * f64::from(x[i]);
                    let got = f64::from(out[c * n + i]);
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "n {n} c {c} i {i}"
                    );
                }
            }
        }
    }

    /// Relative error against f64 references over a wide range, including the clamps and the
    /// scalar tail (lengths not a multiple of 16).
    #[test]
    fn vector_paths_match_f64_references() {
        let xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.013).collect();
        let rel = |got: f32, want: f64| ((got as f64 - want).abs() / want.abs().max(1e-30)) as f32;
        for act in [Gate::Silu, Gate::Gelu] {
            let up: Vec<f32> = xs.iter().map(|x| 1.0 + x.abs() * 0.1).collect();
            let mut out = vec![0f32; xs.len()];
            glu_row(act, &xs, &up, &mut out);
            let mut inplace = xs.clone();
            act_row(act, &mut inplace);
            for (i, &x) in xs.iter().enumerate() {
                let xd = x as f64;
                let want = match act {
                    Gate::Silu => xd / (1.0 + (-xd).exp()),
                    Gate::Gelu => {
                        0.5 * xd
                            * (1.0 + (0.797_884_560_8 * xd * (1.0 + 0.044_715 * xd * xd)).tanh())
                    }
                };
                // Near the zero of the output only absolute error is meaningful.
                let tol = |g: f32, w: f64| rel(g, w) <= 2e-6 || (g as f64 - w).abs() <= 1e-7;
                assert!(
                    tol(inplace[i], want),
                    "{act:?}({x}) = {} vs {want}",
                    inplace[i]
                );
                assert!(tol(out[i], want * up[i] as f64), "{act:?} glu at {x}");
            }
        }
        let mut e: Vec<f32> = (0..1003).map(|i| (i as f32 - 700.0) * 0.17).collect();
        let orig = e.clone();
        let sum = exp_shifted_sum(&mut e, 3.0);
        let mut want_sum = 0f64;
        for (g, x) in e.iter().zip(&orig) {
            let w = ((*x - 3.0) as f64).exp();
            want_sum += w;
            if w > 1e-37 && w < 1e38 {
                assert!(rel(*g, w) <= 2e-6, "exp({x} - 3) = {g} vs {w}");
            }
        }
        assert!(rel(sum, want_sum) <= 1e-5, "sum {sum} vs {want_sum}");
        let mut masked = vec![f32::NEG_INFINITY; 17];
        masked[3] = 0.5;
        let s = exp_shifted_sum(&mut masked, 0.5);
        assert_eq!(s, 1.0);
        let mut nan = vec![0.0f32; 16];
        nan[5] = f32::NAN;
        assert!(exp_shifted_sum(&mut nan, 0.0).is_nan() && nan[5].is_nan() && nan[4] == 1.0);
        assert!(
            masked
                .iter()
                .enumerate()
                .all(|(i, &v)| v == if i == 3 { 1.0 } else { 0.0 })
        );
    }
}
