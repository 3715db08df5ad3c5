//! ROPE, normal (adjacent pairs) and NeoX (halves) modes, with ggml's θ schedule and optional
//! per-pair frequency factors (third source).

use super::{Exec, ThreadScratch, my_rows};
use tessera_core::{RopeMode, RopeParams, TensorId};

pub(crate) fn rope(
    exec: &Exec<'_>,
    node: TensorId,
    p: &RopeParams,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a, pos) = (exec.view(node), exec.src(node, 0), exec.src(node, 1));
    let n = dst.ne[0];
    let half = p.n_dims / 2;
    // Checked at graph build: the factors are f32 [n_dims / 2].
    let factors: Vec<f64> = match exec.desc(node).src(2) {
        Some(_) => {
            let mut f = vec![0f32; half];
            exec.src(node, 2).read_row(0, 0, 0, &mut f);
            f.iter().map(|&v| f64::from(v)).collect()
        }
        None => vec![1.0; half],
    };
    let theta_scale = (p.freq_base as f64).powf(-2.0 / p.n_dims as f64);
    let mut cos_sin: Vec<(f32, f32)> = vec![(1.0, 0.0); half];
    let mut cached_pos: Option<i32> = None;
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let position = pos.get_i32([i2, 0, 0, 0]);
        if cached_pos != Some(position) {
            let mut theta = position as f64 * p.freq_scale as f64;
            for (cs, f) in cos_sin.iter_mut().zip(&factors) {
                let t = theta / f;
                *cs = (t.cos() as f32, t.sin() as f32);
                theta *= theta_scale;
            }
            cached_pos = Some(position);
        }
        let (x, _, _) = ts.rows(n);
        a.read_row(i1, i2, i3, x);
        for (i, &(c, s)) in cos_sin.iter().enumerate() {
            let (j0, j1) = match p.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (x0, x1) = (x[j0], x[j1]);
            x[j0] = x0 * c - x1 * s;
            x[j1] = x0 * s + x1 * c;
        }
        dst.write_row(i1, i2, i3, x);
    }
}
