//! FLASH_ATTN_EXT: one task per (query, head, batch); a single pass over the keys with an online
//! softmax. Tasks are ordered query-fastest, so a thread's consecutive tasks share a KV head: the
//! K/V plane is decoded to f32 once per thread and KV head, not once per query.

use super::norm::alibi_slope;
use super::{Exec, ThreadScratch, split_range};
use tessera_core::{Op, TensorId};
use tessera_kernels::cpu as k;

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
    let (mut kplane, mut vplane) = (Vec::<f32>::new(), Vec::<f32>::new());
    let mut cached: Option<(usize, usize)> = None;
    for task in split_range(n_q * n_head * n_batch, ith, nth) {
        let iq = task % n_q;
        let h = (task / n_q) % n_head;
        let b = task / (n_q * n_head);
        let hk = h / group;
        let slope = alibi_slope(max_bias, h, n_head);
        if cached != Some((hk, b)) {
            kplane.resize(n_kv * d, 0.0);
            vplane.resize(n_kv * dv, 0.0);
            for j in 0..n_kv {
                kt.read_row(j, hk, b, &mut kplane[j * d..(j + 1) * d]);
                vt.read_row(j, hk, b, &mut vplane[j * dv..(j + 1) * dv]);
            }
            cached = Some((hk, b));
        }
        let (qrow, _, _) = ts.rows(d);
        q.read_row(iq, h, b, qrow);
        if let Some(mv) = mask {
            mv.read_row(iq, 0, 0, &mut mrow);
        }
        let (mut mmax, mut sum) = (f32::NEG_INFINITY, 0f32);
        acc.fill(0.0);
        for j in 0..n_kv {
            let mval = if mask.is_some() { slope * mrow[j] } else { 0.0 };
            if mval == f32::NEG_INFINITY {
                continue;
            }
            let mut s = k::dot_f32(&qrow[..d], &kplane[j * d..(j + 1) * d]) * scale;
            if softcap != 0.0 {
                s = softcap * s.tanh();
            }
            s += mval;
            let vrow = &vplane[j * dv..(j + 1) * dv];
            if s > mmax {
                let corr = (mmax - s).exp();
                acc.iter_mut().for_each(|a| *a *= corr);
                sum = sum * corr + 1.0;
                mmax = s;
                acc.iter_mut().zip(vrow).for_each(|(a, v)| *a += v);
            } else {
                let p = (s - mmax).exp();
                sum += p;
                acc.iter_mut().zip(vrow).for_each(|(a, v)| *a += p * v);
            }
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        acc.iter_mut().for_each(|a| *a *= inv);
        dst.write_row(h, iq, b, &acc);
    }
}
