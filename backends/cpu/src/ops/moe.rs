//! Mixture-of-experts ops: MUL_MAT_ID (expert-indexed matmul), ADD_ID (per-expert biases) and
//! ARGSORT (the router's top-k).
//!
//! MUL_MAT_ID groups the `(slot, token)` pairs by expert, so each expert's weights stream once
//! per step for all the tokens routed to it (as ggml does): every thread derives the same grouping
//! from the ids, prepares a share of the activation columns in expert order into shared scratch,
//! and then takes (expert × row-block × column-block) chunks from a shared counter.

use super::matmul::{
    GEMM_COLS, GEMM_ROWS, GEMV_ROWS, PACKED_GEMV_MAX_ROWS, prepare_column, tile_product,
};
use super::{Exec, ThreadScratch, my_rows, split_range};
use crate::tview::TView;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_core::{Op, TensorDesc, TensorId};
use tessera_kernels::cpu as k;

/// `(slot, token)` pairs grouped by local expert: `pairs[start[e]..start[e + 1]]` route to
/// expert `e` of the weight stack; `foreign` are the pairs routed to experts another device holds
/// (local-range form only). Kept in each thread's scratch so that a step allocates nothing once
/// warm; `next` and `first_chunk` are working space of `route` and the chunk table.
#[derive(Default)]
pub(crate) struct Routing {
    pairs: Vec<(usize, usize)>,
    start: Vec<usize>,
    foreign: Vec<(usize, usize)>,
    next: Vec<usize>,
    first_chunk: Vec<usize>,
}

/// Groups the pairs of `ids` `[n_used, T]` by expert into `r`. Plain form (`first` = `None`):
/// every id must lie in `0..n_expert`. Local-range form: the stack holds experts
/// `first..first + n_expert`, other non-negative ids are foreign. Names the first bad id.
fn route(
    r: &mut Routing,
    ids: &TView,
    n_expert: usize,
    first: Option<usize>,
) -> Result<(), String> {
    let (n_used, n_tok) = (ids.ne[0], ids.ne[1]);
    let base = first.unwrap_or(0);
    // The local expert of an id, `Ok(None)` for a foreign one.
    let local = |e: i32| -> Result<Option<usize>, ()> {
        let g = usize::try_from(e).map_err(|_| ())?;
        match g.checked_sub(base).filter(|&l| l < n_expert) {
            Some(l) => Ok(Some(l)),
            None if first.is_some() => Ok(None),
            None => Err(()),
        }
    };
    r.start.clear();
    r.start.resize(n_expert + 1, 0);
    r.foreign.clear();
    for t in 0..n_tok {
        for i in 0..n_used {
            let e = ids.get_i32([i, t, 0, 0]);
            match local(e) {
                Ok(Some(l)) => r.start[l + 1] += 1,
                Ok(None) => r.foreign.push((i, t)),
                Err(()) => {
                    return Err(match first {
                        None => format!(
                            "expert id {e} at slot {i} of token {t} is outside 0..{n_expert}"
                        ),
                        Some(_) => format!("expert id {e} at slot {i} of token {t} is negative"),
                    });
                }
            }
        }
    }
    for e in 0..n_expert {
        r.start[e + 1] += r.start[e];
    }
    r.next.clear();
    r.next.extend_from_slice(&r.start);
    r.pairs.clear();
    r.pairs.resize(r.start[n_expert], (0, 0));
    for t in 0..n_tok {
        for i in 0..n_used {
            if let Ok(Some(l)) = local(ids.get_i32([i, t, 0, 0])) {
                r.pairs[r.next[l]] = (i, t);
                r.next[l] += 1;
            }
        }
    }
    Ok(())
}

/// Shared scratch bytes for the prepared activations of MUL_MAT_ID node `t`: one column per
/// `(slot, token)` pair.
pub(crate) fn act_bytes(tensors: &[TensorDesc], t: &TensorDesc) -> usize {
    let (Some(a), Some(b)) = (t.src(0), t.src(1)) else {
        return 0;
    };
    let (a, b) = (&tensors[a.index()], &tensors[b.index()]);
    let Some(wt) = k::WeightType::of_dtype(a.dtype()) else {
        return 0;
    };
    k::act_row_bytes(k::act_type(wt), b.ne()[0]) * t.ne()[1] * t.ne()[2]
}

pub(crate) fn mul_mat_id(
    exec: &Exec<'_>,
    node: TensorId,
    first_expert: Option<usize>,
    counter: &AtomicUsize,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    // The routing tables live in the thread's scratch (taken out while the rest of it is used).
    let mut routing = std::mem::take(&mut ts.routing);
    mul_mat_id_routed(
        exec,
        node,
        first_expert,
        counter,
        ith,
        nth,
        ts,
        &mut routing,
    );
    ts.routing = routing;
}

#[allow(clippy::too_many_arguments)]
fn mul_mat_id_routed(
    exec: &Exec<'_>,
    node: TensorId,
    first_expert: Option<usize>,
    counter: &AtomicUsize,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
    routing: &mut Routing,
) {
    let (dst, w, x, ids) = (
        exec.view(node),
        exec.src(node, 0),
        exec.src(node, 1),
        exec.src(node, 2),
    );
    let label = || exec.graph.label(node);
    let Some(wt) = k::WeightType::of_dtype(w.dtype) else {
        if ith == 0 {
            exec.fail(format!(
                "MUL_MAT_ID {}: no kernel for {} weights",
                label(),
                w.dtype
            ));
        }
        return;
    };
    // Every thread sees the same ids, so all of them skip the barrier below together on error.
    match route(routing, &ids, w.ne[2], first_expert) {
        Ok(()) => {}
        Err(e) => {
            if ith == 0 {
                exec.fail(format!("MUL_MAT_ID {}: {e}", label()));
            }
            return;
        }
    }
    let kdim = w.ne[0];
    let act = k::act_type(wt);
    let arb = k::act_row_bytes(act, kdim);
    let n_b = x.ne[1];

    // Phase 1: activation columns in expert order.
    for p in split_range(routing.pairs.len(), ith, nth) {
        let (i, t) = routing.pairs[p];
        let (row, _, _) = ts.rows(kdim);
        x.read_row(i % n_b, t, 0, row);
        // SAFETY: column `p`'s range is written by this thread alone before the barrier below.
        #[allow(unsafe_code)]
        let out = unsafe { exec.shared.slice_mut(p * arb..(p + 1) * arb) };
        prepare_column(act, row, out);
    }
    // Columns of experts held elsewhere (expert parallelism) are zero, and never computed.
    if !routing.foreign.is_empty() {
        let (zeros, _, _) = ts.rows(dst.ne[0]);
        zeros.fill(0.0);
        for p in split_range(routing.foreign.len(), ith, nth) {
            let (i, t) = routing.foreign[p];
            dst.write_f32_at(0, i, t, 0, zeros);
        }
    }
    exec.barrier.wait();

    // Phase 2: chunks of each used expert. A decode step routes one column to most experts, so
    // those run as GEMV chunks; prompt steps gather many columns per expert.
    let m = dst.ne[0];
    let n_expert = w.ne[2];
    let packed = w.packed.is_some();
    let shape = |cols: usize| -> (usize, usize) {
        if cols == 1 && packed {
            // As MUL_MAT: the x86 packed kernel sums each activation block once per call, so
            // larger row chunks amortise it while leaving several chunks per thread.
            let per = (m / (nth * 8)).clamp(GEMV_ROWS, PACKED_GEMV_MAX_ROWS);
            (per - per % GEMV_ROWS, 1)
        } else if cols == 1 {
            (GEMV_ROWS, 1)
        } else {
            (GEMM_ROWS, GEMM_COLS)
        }
    };
    // First chunk index of each expert (every thread computes the same table).
    let mut first_chunk = std::mem::take(&mut routing.first_chunk);
    first_chunk.clear();
    let mut total = 0usize;
    for e in 0..n_expert {
        first_chunk.push(total);
        let cols = routing.start[e + 1] - routing.start[e];
        if cols > 0 {
            let (rp, cp) = shape(cols);
            total += m.div_ceil(rp) * cols.div_ceil(cp);
        }
    }
    first_chunk.push(total);
    let tile = &mut ts.tile;
    loop {
        let chunk = counter.fetch_add(1, Ordering::Relaxed);
        if chunk >= total {
            break;
        }
        let e = first_chunk.partition_point(|&c| c <= chunk) - 1;
        let cols_e = routing.start[e + 1] - routing.start[e];
        let (rows_per, cols_per) = shape(cols_e);
        let col_blocks = cols_e.div_ceil(cols_per);
        let local = chunk - first_chunk[e];
        let (rb, cb) = (local / col_blocks, local % col_blocks);
        let r0 = rb * rows_per;
        let rows = rows_per.min(m - r0);
        let c0 = cb * cols_per;
        let cols = cols_per.min(cols_e - c0);
        let wbytes = w.rows_raw(r0, rows, e, 0);
        let p0 = routing.start[e] + c0;
        let xbytes = exec.shared.slice(p0 * arb..(p0 + cols) * arb);
        tile_product(wt, &w, wbytes, rows, xbytes, arb, cols, tile, &mut ts.bytes);
        for c in 0..cols {
            let (i, t) = routing.pairs[p0 + c];
            dst.write_f32_at(r0, i, t, 0, &tile[c * rows..(c + 1) * rows]);
        }
    }
    routing.first_chunk = first_chunk;
}

pub(crate) fn add_id(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a, b, ids) = (
        exec.view(node),
        exec.src(node, 0),
        exec.src(node, 1),
        exec.src(node, 2),
    );
    let n = dst.ne[0];
    let n_expert = b.ne[1];
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let e = ids.get_i32([i1, i2, 0, 0]);
        let Some(e) = usize::try_from(e).ok().filter(|&e| e < n_expert) else {
            exec.fail(format!(
                "ADD_ID {}: expert id {e} at slot {i1} of token {i2} is outside 0..{n_expert}",
                exec.graph.label(node)
            ));
            continue;
        };
        let (x, y, _) = ts.rows(n);
        a.read_row(i1, i2, i3, x);
        b.read_row(e, 0, 0, y);
        x.iter_mut().zip(y.iter()).for_each(|(v, w)| *v += *w);
        dst.write_row(i1, i2, i3, x);
    }
}

pub(crate) fn argsort(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a) = (exec.view(node), exec.src(node, 0));
    let Op::Argsort { descending } = *exec.desc(node).op() else {
        return;
    };
    let n = a.ne[0];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for (i1, i2, i3) in my_rows(a.ne, ith, nth) {
        let (x, _, _) = ts.rows(n);
        a.read_row(i1, i2, i3, x);
        order.clear();
        order.extend(0..n);
        // Stable, so ties keep index order; NaNs sort last either way.
        if descending {
            order.sort_by(|&p, &q| {
                x[q].partial_cmp(&x[p])
                    .unwrap_or(x[p].is_nan().cmp(&x[q].is_nan()))
            });
        } else {
            order.sort_by(|&p, &q| {
                x[p].partial_cmp(&x[q])
                    .unwrap_or(x[p].is_nan().cmp(&x[q].is_nan()))
            });
        }
        for (j, &o) in order.iter().enumerate() {
            dst.set_i32([j, i1, i2, i3], o as i32);
        }
    }
}
