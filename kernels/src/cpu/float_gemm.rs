//! Float weights times many activation columns through the `gemm` crate (which has its own
//! run-time dispatch: AVX2/AVX-512 on x86-64, NEON on aarch64), shared by the SIMD tile kernels
//! of every architecture. Its one `unsafe` block is the `gemm` call, whose bounds it asserts.
#![allow(unsafe_code)]

use super::tile::{WeightType, scratch_f32};

/// Decodes one float-type weight row into f32 (the architecture's fastest conversion).
pub(crate) type ConvertRow<'a> = &'a dyn Fn(WeightType, &[u8], &mut [f32]);

/// Rows of weights converted per `gemm` call (bounded scratch).
fn gemm_row_block(k: usize) -> usize {
    ((2 << 20) / (4 * k.max(1))).clamp(16, 512)
}

/// Float weights, many columns: weights converted to f32 panels (unless they
/// are already aligned f32) and multiplied with `gemm`.
/// Arguments were checked by `check_tile_args`; `convert` decodes a float-type weight row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile(
    convert: ConvertRow<'_>,
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
    let x_direct = x.as_ptr().align_offset(4) == 0 && x_stride.is_multiple_of(4);
    let w_direct =
        wt == WeightType::F32 && w.as_ptr().align_offset(4) == 0 && w_stride.is_multiple_of(4);
    let rb = if w_direct {
        rows
    } else {
        gemm_row_block(k).min(rows)
    };
    let x_len = if x_direct { 0 } else { cols * k };
    let w_len = if w_direct { 0 } else { rb * k };
    let buf = scratch_f32(scratch, x_len + w_len);
    let (xbuf, wbuf) = buf.split_at_mut(x_len);
    let (xs, x_cs): (&[f32], usize) = if x_direct {
        (
            bytemuck::cast_slice(&x[..(cols - 1) * x_stride + k * 4]),
            x_stride / 4,
        )
    } else {
        for c in 0..cols {
            let src = &x[c * x_stride..c * x_stride + k * 4];
            for (d, s) in xbuf[c * k..(c + 1) * k].iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        (&*xbuf, k)
    };
    let wrow = wt.row_bytes(k);
    for r0 in (0..rows).step_by(rb) {
        let n = rb.min(rows - r0);
        let (ws, w_rs): (&[f32], usize) = if w_direct {
            (
                bytemuck::cast_slice(&w[r0 * w_stride..(r0 + n - 1) * w_stride + k * 4]),
                w_stride / 4,
            )
        } else {
            for i in 0..n {
                let src = &w[(r0 + i) * w_stride..(r0 + i) * w_stride + wrow];
                convert(wt, src, &mut wbuf[i * k..(i + 1) * k]);
            }
            (&wbuf[..n * k], k)
        };
        gemm_f32(n, cols, k, ws, w_rs, xs, x_cs, &mut out[r0..], ldo);
    }
}

/// `dst[c * ldo + r] = sum_i lhs[r * lhs_rs + i] * rhs[c * rhs_cs + i]` for
/// `r < m`, `c < n`, `i < k`, single-threaded `gemm`.
///
/// # Panics
/// If a slice is too short for the given shape and strides.
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    lhs: &[f32],
    lhs_rs: usize,
    rhs: &[f32],
    rhs_cs: usize,
    dst: &mut [f32],
    ldo: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(k > 0);
    assert!(lhs.len() >= (m - 1) * lhs_rs + k && (m == 1 || lhs_rs >= k));
    assert!(rhs.len() >= (n - 1) * rhs_cs + k && (n == 1 || rhs_cs >= k));
    assert!(dst.len() >= (n - 1) * ldo + m && (n == 1 || ldo >= m));
    let to_i = |v: usize| isize::try_from(v).unwrap_or(isize::MAX);
    // SAFETY: the asserts above keep every element gemm reads or writes
    // inside the slices; slices of f32 are properly aligned; `dst` is
    // exclusively borrowed and does not overlap the inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            to_i(ldo),
            1,
            false,
            lhs.as_ptr(),
            1,
            to_i(lhs_rs),
            rhs.as_ptr(),
            to_i(rhs_cs),
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}
