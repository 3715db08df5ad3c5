//! Element-wise ops: broadcast binaries, unary maps, gated units. Every row is decoded to f32,
//! transformed, and encoded into the destination, so any float dtype and stride works.

use super::{Exec, ThreadScratch, my_rows};
use tessera_core::{GluOp, Op, TensorId, UnaryOp};
use tessera_kernels::cpu::vecmath::{self, Gate, gelu, silu};

fn unary(f: UnaryOp, x: f32) -> f32 {
    match f {
        UnaryOp::Silu => silu(x),
        UnaryOp::Gelu => gelu(x),
        UnaryOp::GeluQuick => x / (1.0 + (-1.702 * x).exp()),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// `x[i] = f(x[i], y[i mod len(y)])`; without broadcast along ne0 (residual adds, norm weights)
/// it is a plain zip that vectorizes.
#[inline]
fn apply(x: &mut [f32], y: &[f32], f: impl Fn(f32, f32) -> f32) {
    if x.len() == y.len() {
        x.iter_mut().zip(y).for_each(|(v, w)| *v = f(*v, *w));
    } else {
        let n = y.len();
        x.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = f(*v, y[i % n]));
    }
}

pub(crate) fn binary(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a, b) = (exec.view(node), exec.src(node, 0), exec.src(node, 1));
    let op = *exec.desc(node).op();
    let n = dst.ne[0];
    let nb0 = b.ne[0];
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let (x, y, _) = ts.rows(n.max(nb0));
        a.read_row(i1, i2, i3, x);
        b.read_row(i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3], y);
        let x = &mut x[..n];
        let y = &y[..nb0];
        match op {
            Op::Add => apply(x, y, |a, b| a + b),
            Op::Sub => apply(x, y, |a, b| a - b),
            Op::Mul => apply(x, y, |a, b| a * b),
            _ => apply(x, y, |a, b| a / b),
        }
        dst.write_row(i1, i2, i3, x);
    }
}

pub(crate) fn map(exec: &Exec<'_>, node: TensorId, ith: usize, nth: usize, ts: &mut ThreadScratch) {
    let (dst, a) = (exec.view(node), exec.src(node, 0));
    let op = *exec.desc(node).op();
    let n = dst.ne[0];
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let (x, _, _) = ts.rows(n);
        a.read_row(i1, i2, i3, x);
        match op {
            Op::Scale { scale, bias } => x.iter_mut().for_each(|v| *v = *v * scale + bias),
            Op::Sqr => x.iter_mut().for_each(|v| *v *= *v),
            Op::Sqrt => x.iter_mut().for_each(|v| *v = v.sqrt()),
            Op::Clamp { min, max } => x.iter_mut().for_each(|v| *v = v.clamp(min, max)),
            Op::Unary(UnaryOp::Silu) => vecmath::act_row(Gate::Silu, x),
            Op::Unary(UnaryOp::Gelu) => vecmath::act_row(Gate::Gelu, x),
            Op::Unary(f) => x.iter_mut().for_each(|v| *v = unary(f, *v)),
            _ => {}
        }
        dst.write_row(i1, i2, i3, x);
    }
}

pub(crate) fn glu(exec: &Exec<'_>, node: TensorId, ith: usize, nth: usize, ts: &mut ThreadScratch) {
    let dst = exec.view(node);
    let t = exec.desc(node);
    let (act, swapped) = match *t.op() {
        Op::Glu {
            op: GluOp::Swiglu,
            swapped,
        } => (Some(Gate::Silu), swapped),
        Op::Glu {
            op: GluOp::Geglu,
            swapped,
        } => (Some(Gate::Gelu), swapped),
        // SWIGLU_OAI always has two sources.
        _ => (None, false),
    };
    let n = dst.ne[0];
    let split = t.src(1).is_some();
    let a = exec.src(node, 0);
    let b = if split { Some(exec.src(node, 1)) } else { None };
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let (x, y, out) = ts.rows(2 * n);
        let (gate, up): (&[f32], &[f32]) = match b {
            Some(b) => {
                a.read_row(i1, i2, i3, x);
                b.read_row(i1, i2, i3, y);
                (&x[..n], &y[..n])
            }
            None => {
                a.read_row(i1, i2, i3, x);
                let (lo, hi) = x.split_at(n);
                if swapped {
                    (&hi[..n], lo)
                } else {
                    (lo, &hi[..n])
                }
            }
        };
        match (act, *t.op()) {
            (Some(act), _) => vecmath::glu_row(act, gate, up, &mut out[..n]),
            (None, Op::SwigluOai { alpha, limit }) => {
                for ((o, &g), &u) in out[..n].iter_mut().zip(gate).zip(up) {
                    let g = g.min(limit);
                    let u = u.clamp(-limit, limit);
                    *o = g / (1.0 + (-alpha * g).exp()) * (u + 1.0);
                }
            }
            _ => {}
        }
        dst.write_row(i1, i2, i3, out);
    }
}
