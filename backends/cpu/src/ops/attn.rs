//! FLASH_ATTN_EXT: one task per (query, head, batch). Tasks are ordered query-fastest, so a
//! thread's consecutive tasks share a KV head: the K/V plane is decoded to f32 once per thread and
//! KV head, not once per query, and a block of up to [`Q_BLOCK`] queries gets its scores from one
//! f32 tile product with the K plane, a vectorised softmax per query, and the weighted sums of V
//! as a second tile product.

use super::norm::alibi_slope;
use super::{Exec, ThreadScratch, split_range};
use tessera_core::{Op, TensorId};
use tessera_kernels::cpu as k;

/// Queries whose scores one tile product computes.
const Q_BLOCK: usize = 16;

pub(crate) fn flash_attn_ext(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let t = exec.desc(node);
    let Op::FlashAttnExt {
        scale,
        max_bias,
        softcap,
    } = *t.op()
    else {
        return;
    };
    let (dst, q, kt, vt) = (
        exec.view(node),
        exec.src(node, 0),
        exec.src(node, 1),
        exec.src(node, 2),
    );
    let mask = t.src(3).map(|m| exec.view(m));
    let sinks = t.src(4).map(|m| exec.view(m));
    let mut sink_row = Vec::new();
    let (d, n_q, n_head, n_batch) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (dv, n_kv, n_head_kv) = (vt.ne[0], kt.ne[1], kt.ne[2]);
    let group = n_head / n_head_kv;
    let (scale, softcap) = if softcap != 0.0 {
        (scale / softcap, softcap)
    } else {
        (scale, 0.0)
    };
    let mut mrow = vec![0f32; if mask.is_some() { n_kv } else { 0 }];
    let mut acc = vec![0f32; dv];
    // V is kept transposed (`dv` rows of `n_kv`) so that the weighted sums of a block are a tile
    // product too.
    let (mut kplane, mut vplane_t) = (Vec::<f32>::new(), Vec::<f32>::new());
    let (mut qblk, mut scores, mut outs) =
        (Vec::<f32>::new(), Vec::<f32>::new(), Vec::<f32>::new());
    let mut cached: Option<(usize, usize)> = None;
    let mut n_seen = n_kv;
    let tasks = split_range(n_q * n_head * n_batch, ith, nth);
    let mut task = tasks.start;
    while task < tasks.end {
        let iq0 = task % n_q;
        let h = (task / n_q) % n_head;
        let b = task / (n_q * n_head);
        // A block of consecutive queries of one head: their scores are one tile product.
        let nqb = Q_BLOCK.min(tasks.end - task).min(n_q - iq0);
        task += nqb;
        let hk = h / group;
        let slope = alibi_slope(max_bias, h, n_head);
        // An attention sink is one more logit in the denominator (as is, not scaled), with no
        // value.
        let sink = sinks.map(|sv| {
            sink_row.resize(sv.ne[0], 0.0);
            sv.read_row(0, 0, 0, &mut sink_row);
            sink_row[h]
        });
        // A mask of one plane per batch (several sequences' KV streams) or one for all.
        let mb = mask.map_or(0, |mv| if mv.ne[3] == 1 { 0 } else { b });
        if cached != Some((hk, b)) {
            // Keys no query of the node sees (the causal future, a padded span) are never
            // decoded or scored: the span ends after the last key any mask row shows.
            n_seen = match mask {
                Some(mv) => visible_keys(&mv, n_q, mb, &mut mrow),
                None => n_kv,
            };
            kplane.resize(n_seen * d, 0.0);
            vplane_t.resize(n_seen * dv, 0.0);
            for j in 0..n_seen {
                kt.read_row(j, hk, b, &mut kplane[j * d..(j + 1) * d]);
                vt.read_row(j, hk, b, &mut acc);
                for (i, v) in acc.iter().enumerate() {
                    vplane_t[i * n_seen + j] = *v;
                }
            }
            cached = Some((hk, b));
        }
        qblk.resize(nqb * d, 0.0);
        for c in 0..nqb {
            q.read_row(iq0 + c, h, b, &mut qblk[c * d..(c + 1) * d]);
        }
        scores.resize(nqb * n_seen, 0.0);
        k::mul_mat_tile(
            k::WeightType::F32,
            bytemuck::cast_slice(&kplane),
            d * 4,
            n_seen,
            bytemuck::cast_slice(&qblk),
            d * 4,
            nqb,
            d,
            &mut scores,
            n_seen,
            &mut ts.bytes,
        );
        for c in 0..nqb {
            let iq = iq0 + c;
            let s = &mut scores[c * n_seen..(c + 1) * n_seen];
            if let Some(mv) = mask {
                mv.read_row(iq, 0, mb, &mut mrow);
            }
            let mut smax = f32::NEG_INFINITY;
            for (j, v) in s.iter_mut().enumerate() {
                let mut x = *v * scale;
                if softcap != 0.0 {
                    x = softcap * x.tanh();
                }
                if mask.is_some() {
                    // A −∞ mask entry hides the key whatever its score (a slope of 0 included).
                    x = if mrow[j] == f32::NEG_INFINITY {
                        f32::NEG_INFINITY
                    } else {
                        x + slope * mrow[j]
                    };
                }
                *v = x;
                smax = smax.max(x);
            }
            // Normalised probabilities; a query that sees no key gets zeros.
            if let Some(sink) = sink.filter(|&x| x > f32::NEG_INFINITY) {
                let m = smax.max(sink);
                let sum = k::vecmath::exp_shifted_sum(s, m) + (sink - m).exp();
                let inv = 1.0 / sum;
                s.iter_mut().for_each(|p| *p *= inv);
            } else if smax > f32::NEG_INFINITY {
                let inv = 1.0 / k::vecmath::exp_shifted_sum(s, smax);
                s.iter_mut().for_each(|p| *p *= inv);
            } else {
                s.fill(0.0);
            }
        }
        outs.resize(nqb * dv, 0.0);
        k::mul_mat_tile(
            k::WeightType::F32,
            bytemuck::cast_slice(&vplane_t),
            n_seen * 4,
            dv,
            bytemuck::cast_slice(&scores),
            n_seen * 4,
            nqb,
            n_seen,
            &mut outs,
            dv,
            &mut ts.bytes,
        );
        for c in 0..nqb {
            dst.write_row(h, iq0 + c, b, &outs[c * dv..(c + 1) * dv]);
        }
    }
}

/// One past the last key any of the `n_q` mask rows of batch plane `b` leaves visible (0 if
/// none); `row` is scratch of the mask's row length.
fn visible_keys(mask: &crate::tview::TView, n_q: usize, b: usize, row: &mut [f32]) -> usize {
    let mut seen = 0;
    for iq in 0..n_q {
        mask.read_row(iq, 0, b, row);
        if let Some(last) = row.iter().rposition(|&m| m != f32::NEG_INFINITY) {
            seen = seen.max(last + 1);
        }
    }
    seen
}
