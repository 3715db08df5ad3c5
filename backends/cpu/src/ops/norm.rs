//! Row-wise reductions: RMS_NORM, NORM, SUM_ROWS, ARGMAX, SOFT_MAX. Sums accumulate in f64, as
//! ggml's `ggml_float` does, so long rows keep their precision.

use super::{Exec, ThreadScratch, my_rows};
use tessera_core::{Op, TensorId};

pub(crate) fn norm(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a) = (exec.view(node), exec.src(node, 0));
    let op = *exec.desc(node).op();
    let n = dst.ne[0];
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let (x, _, _) = ts.rows(n);
        a.read_row(i1, i2, i3, x);
        match op {
            Op::RmsNorm { eps } => {
                let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
                let scale = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
                x.iter_mut().for_each(|v| *v *= scale);
            }
            Op::Norm { eps } => {
                let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                let scale = 1.0 / (var + eps as f64).sqrt();
                x.iter_mut()
                    .for_each(|v| *v = ((*v as f64 - mean) * scale) as f32);
            }
            _ => {}
        }
        dst.write_row(i1, i2, i3, x);
    }
}

pub(crate) fn sum_rows(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a) = (exec.view(node), exec.src(node, 0));
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let (x, y, _) = ts.rows(a.ne[0].max(1));
        a.read_row(i1, i2, i3, x);
        y[0] = x[..a.ne[0]].iter().map(|&v| v as f64).sum::<f64>() as f32;
        dst.write_row(i1, i2, i3, &y[..1]);
    }
}

pub(crate) fn argmax(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a) = (exec.view(node), exec.src(node, 0));
    // dst is [ne1, ne2, ne3] of a: one element per source row.
    for (i1, i2, i3) in my_rows(a.ne, ith, nth) {
        let (x, _, _) = ts.rows(a.ne[0]);
        a.read_row(i1, i2, i3, x);
        let mut best = 0usize;
        for (i, &v) in x.iter().enumerate() {
            if v > x[best] || (x[best].is_nan() && !v.is_nan()) {
                best = i;
            }
        }
        dst.set_i32([i1, i2, i3, 0], best as i32);
    }
}

/// ALiBi slope of head `h` among `n_head` (1 when `max_bias` is 0).
pub(crate) fn alibi_slope(max_bias: f32, h: usize, n_head: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1usize << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if h < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

pub(crate) fn soft_max(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let t = exec.desc(node);
    let Op::SoftMax { scale, max_bias } = *t.op() else {
        return;
    };
    let (dst, a) = (exec.view(node), exec.src(node, 0));
    let mask = t.src(1).map(|m| exec.view(m));
    let n = dst.ne[0];
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let (x, m, _) = ts.rows(n);
        a.read_row(i1, i2, i3, x);
        let slope = alibi_slope(max_bias, i2, dst.ne[2]);
        if let Some(mv) = mask {
            mv.read_row(i1, i2 % mv.ne[2], i3 % mv.ne[3], m);
            for i in 0..n {
                x[i] = x[i] * scale + slope * m[i];
            }
        } else {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for v in x.iter_mut() {
            *v = if *v == f32::NEG_INFINITY {
                0.0
            } else {
                (*v - max).exp()
            };
            sum += *v as f64;
        }
        let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
        x.iter_mut().for_each(|v| *v *= inv);
        dst.write_row(i1, i2, i3, x);
    }
}
