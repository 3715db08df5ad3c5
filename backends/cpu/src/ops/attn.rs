//! FLASH_ATTN_EXT: one task per (query, head, batch), ordered by batch, KV head, query, then the
//! heads sharing the KV head. A thread takes its tasks in blocks of up to [`Q_BLOCK`] that share
//! a KV head and batch (consecutive queries with all their heads), so each block's scores are
//! one tile product of the block's queries with the K rows.
//!
//! K is read where it lies, in its own type: the scores are the MUL_MAT kernels' tile product
//! with the K rows as the weights, so the queries are rounded to K's activation form exactly as
//! ggml rounds them to its `vec_dot_type` (Q8_0 for Q8_0/Q4_0/Q5_0/IQ4_NL keys, Q8_1 for
//! Q4_1/Q5_1, f32 for float keys), and no key is ever decoded. V rows are decoded one at a time
//! and added into the block's outputs; a thread with several blocks on one KV head (a prompt)
//! decodes that head's visible V rows once, transposed, and takes the weighted sums as a tile
//! product too.

use super::norm::alibi_slope;
use super::{Exec, ThreadScratch, split_range};
use crate::tview::TView;
use tessera_core::{DType, Op, TensorId};
use tessera_kernels::cpu as k;

/// Queries whose scores one tile product computes.
const Q_BLOCK: usize = 16;

/// Per-thread buffers of the attention kernel, kept between nodes and runs.
#[derive(Default)]
pub(crate) struct AttnScratch {
    mrow: Vec<f32>,
    /// K decoded to f32, only for keys that are not row-contiguous (strided test views).
    kplane: Vec<f32>,
    /// V decoded and transposed (`dv` rows of the visible keys), for threads with several
    /// blocks on one KV head.
    vplane_t: Vec<f32>,
    vrow: Vec<f32>,
    /// The visible K rows in the tile kernels' packed layout (zero rows pad the last group),
    /// for threads with several blocks on one KV head.
    kpacked: Vec<u8>,
    kgather: Vec<u8>,
    /// Scores of a packed product, `n_pad` apart.
    spad: Vec<f32>,
    qblk: Vec<f32>,
    qact: Vec<u8>,
    scores: Vec<f32>,
    outs: Vec<f32>,
    sink_row: Vec<f32>,
    /// The block's (query, head) columns.
    cols: Vec<(usize, usize)>,
    /// The keys a query's mask row leaves visible, and their mask values (sparse path).
    visible: Vec<usize>,
    mgather: Vec<f32>,
    /// Whether any query of the node sees each key (dense path: unseen V rows are not read).
    seen: Vec<bool>,
}

/// The KV head and batch of a task: a block never spans two.
fn kv_of(task: usize, n_q: usize, n_head: usize, group: usize) -> (usize, usize) {
    (
        (task % (n_q * n_head)) / (n_q * group),
        task / (n_q * n_head),
    )
}

/// The (query, head) of a task. Within a KV head the heads sharing it come fastest, so a block
/// holds every head of its queries: a query's keys, gathered once, serve all its heads.
fn col_of(task: usize, n_q: usize, n_head: usize, group: usize) -> (usize, usize) {
    let r = task % (n_q * n_head);
    let (hk, w) = (r / (n_q * group), r % (n_q * group));
    (w / group, hk * group + w % group)
}

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
    let (d, n_q, n_head, n_batch) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (dv, n_kv, n_head_kv) = (vt.ne[0], kt.ne[1], kt.ne[2]);
    let group = n_head / n_head_kv;
    let (scale, softcap) = if softcap != 0.0 {
        (scale / softcap, softcap)
    } else {
        (scale, 0.0)
    };
    // Keys read in place: row-contiguous and in ggml's layout (`supports` guarantees a type the
    // tile kernels take). Otherwise they are decoded to f32 first.
    let k_direct = kt.row_contiguous() && kt.packed.is_none() && kt.nb[1] >= kt.row_bytes();
    let k_wt = if k_direct {
        k::WeightType::of_dtype(kt.dtype).unwrap_or(k::WeightType::F32)
    } else {
        k::WeightType::F32
    };
    let act = k::act_type(k_wt);
    let isa = k::active_isa();
    let mut k_packed: Option<(k::PackLayout, usize)> = None;
    let s = &mut ts.attn;
    s.mrow.resize(if mask.is_some() { n_kv } else { 0 }, 0.0);
    s.vrow.resize(dv, 0.0);
    let mut cols = std::mem::take(&mut s.cols);
    let mut cached: Option<(usize, usize)> = None;
    let mut v_planed = false;
    let mut n_seen = n_kv;
    let tasks = split_range(n_q * n_head * n_batch, ith, nth);
    let mut task = tasks.start;
    while task < tasks.end {
        let (hk, b) = kv_of(task, n_q, n_head, group);
        cols.clear();
        while task < tasks.end && cols.len() < Q_BLOCK && kv_of(task, n_q, n_head, group) == (hk, b)
        {
            cols.push(col_of(task, n_q, n_head, group));
            task += 1;
        }
        let more_on_head = task < tasks.end && kv_of(task, n_q, n_head, group) == (hk, b);
        // A mask of one plane per batch (several sequences' KV streams) or one for all.
        let mb = mask.map_or(0, |mv| if mv.ne[3] == 1 { 0 } else { b });
        if cached != Some((hk, b)) {
            // Keys no query of the node sees (the causal future, a padded span) are never
            // scored or read: the span ends after the last key any mask row shows.
            n_seen = match mask {
                Some(mv) => visible_keys(&mv, n_q, mb, &mut s.mrow, &mut s.seen),
                None => n_kv,
            };
            if !k_direct {
                s.kplane.resize(n_seen * d, 0.0);
                for j in 0..n_seen {
                    kt.read_row(j, hk, b, &mut s.kplane[j * d..(j + 1) * d]);
                }
            }
            // Several blocks on this head (a prompt): the keys once in the packed layout of
            // the weight kernels, whose GEMM is several times faster than the row kernels'.
            k_packed = None;
            if k_direct
                && more_on_head
                && n_seen > 0
                && let Some(layout) = k::PackLayout::for_isa(isa, k_wt)
            {
                let (pr, rb) = (layout.rows(), kt.row_bytes());
                let n_pad = n_seen.div_ceil(pr) * pr;
                s.kgather.clear();
                s.kgather.resize(n_pad * rb, 0);
                for j in 0..n_seen {
                    s.kgather[j * rb..(j + 1) * rb].copy_from_slice(kt.row_raw(j, hk, b));
                }
                s.kpacked.resize(n_pad * rb, 0);
                for (src, dst) in s
                    .kgather
                    .chunks_exact(pr * rb)
                    .zip(s.kpacked.chunks_exact_mut(pr * rb))
                {
                    k::pack_group(layout, k_wt, d, src, dst);
                }
                k_packed = Some((layout, n_pad));
            }
            cached = Some((hk, b));
            v_planed = false;
        }
        let nc = cols.len();
        // Several sequences in one cache: each query sees its own sequence's keys, a fraction
        // of the span. Scoring only those keys, one query at a time, beats the dense tile.
        if let Some(mv) = mask
            && k_direct
            && n_seen > 0
            && sparse_pays(&mv, &cols, mb, n_seen, &mut s.mrow)
        {
            let shape = SparseShape {
                d,
                dv,
                n_seen,
                n_head,
                hk,
                b,
                mb,
                k_wt,
                act,
                scale,
                softcap,
                max_bias,
            };
            sparse_block(
                &shape,
                &q,
                &kt,
                &vt,
                &mv,
                sinks.as_ref(),
                &cols,
                s,
                &mut ts.bytes,
            );
            for (c, &(iq, h)) in cols.iter().enumerate() {
                dst.write_row(h, iq, b, &s.outs[c * dv..(c + 1) * dv]);
            }
            continue;
        }
        s.scores.resize(nc * n_seen, 0.0);
        s.outs.resize(nc * dv, 0.0);
        if n_seen > 0 {
            s.qblk.resize(nc * d, 0.0);
            for (c, &(iq, h)) in cols.iter().enumerate() {
                q.read_row(iq, h, b, &mut s.qblk[c * d..(c + 1) * d]);
            }
            // BF16 keys: ggml takes their dot products in bf16, so the queries are rounded to
            // it first (block keys round them in `prepare_act`). F16 keys keep f32 queries:
            // rounding them too moved Tessera further from llama.cpp's logits.
            if kt.dtype == DType::BF16 {
                for v in &mut s.qblk {
                    *v = half::bf16::from_f32(*v).to_f32();
                }
            }
            let arow = k::act_row_bytes(act, d);
            s.qact.resize(nc * arow, 0);
            for c in 0..nc {
                k::prepare_act(
                    act,
                    &s.qblk[c * d..(c + 1) * d],
                    &mut s.qact[c * arow..(c + 1) * arow],
                );
            }
            if let Some((layout, n_pad)) = k_packed {
                s.spad.resize(nc * n_pad, 0.0);
                k::mul_mat_tile_packed(
                    isa,
                    layout,
                    k_wt,
                    &s.kpacked,
                    n_pad,
                    &s.qact,
                    arow,
                    nc,
                    d,
                    &mut s.spad,
                    n_pad,
                    &mut ts.bytes,
                );
                for c in 0..nc {
                    s.scores[c * n_seen..(c + 1) * n_seen]
                        .copy_from_slice(&s.spad[c * n_pad..c * n_pad + n_seen]);
                }
            } else {
                let (keys, k_stride) = if k_direct {
                    (kt.rows_raw(0, n_seen, hk, b), kt.nb[1])
                } else {
                    (bytemuck::cast_slice(&s.kplane[..n_seen * d]), d * 4)
                };
                k::mul_mat_tile(
                    k_wt,
                    keys,
                    k_stride,
                    n_seen,
                    &s.qact,
                    arow,
                    nc,
                    d,
                    &mut s.scores,
                    n_seen,
                    &mut ts.bytes,
                );
            }
        }
        for (c, &(iq, h)) in cols.iter().enumerate() {
            let sc = &mut s.scores[c * n_seen..(c + 1) * n_seen];
            if let Some(mv) = mask {
                mv.read_row(iq, 0, mb, &mut s.mrow);
            }
            let slope = alibi_slope(max_bias, h, n_head);
            // An attention sink is one more logit in the denominator (as is, not scaled), with
            // no value.
            let sink = sinks.map(|sv| {
                s.sink_row.resize(sv.ne[0], 0.0);
                sv.read_row(0, 0, 0, &mut s.sink_row);
                s.sink_row[h]
            });
            softmax_row(sc, &s.mrow, mask.is_some(), scale, softcap, slope, sink);
        }
        if n_seen == 0 {
            s.outs.fill(0.0);
        } else if more_on_head || v_planed {
            if !v_planed {
                s.vplane_t.resize(n_seen * dv, 0.0);
                for j in 0..n_seen {
                    // A key no query sees weighs exactly 0, but 0 × a stale NaN is NaN: a
                    // cell another sequence freed is never read.
                    if mask.is_some() && !s.seen.get(j).copied().unwrap_or(true) {
                        for i in 0..dv {
                            s.vplane_t[i * n_seen + j] = 0.0;
                        }
                        continue;
                    }
                    vt.read_row(j, hk, b, &mut s.vrow);
                    for (i, v) in s.vrow.iter().enumerate() {
                        s.vplane_t[i * n_seen + j] = *v;
                    }
                }
                v_planed = true;
            }
            k::mul_mat_tile(
                k::WeightType::F32,
                bytemuck::cast_slice(&s.vplane_t),
                n_seen * 4,
                dv,
                bytemuck::cast_slice(&s.scores),
                n_seen * 4,
                nc,
                n_seen,
                &mut s.outs,
                dv,
                &mut ts.bytes,
            );
        } else {
            // One block on this head: each visible V row is decoded once and added into every
            // query's output with its weight.
            s.outs.fill(0.0);
            let mut p = [0f32; Q_BLOCK];
            for j in 0..n_seen {
                for (c, w) in p[..nc].iter_mut().enumerate() {
                    *w = s.scores[c * n_seen + j];
                }
                if p[..nc].iter().all(|&w| w == 0.0) {
                    continue;
                }
                vt.read_row(j, hk, b, &mut s.vrow);
                k::vecmath::axpy_columns(&mut s.outs, &p[..nc], &s.vrow);
            }
        }
        for (c, &(iq, h)) in cols.iter().enumerate() {
            dst.write_row(h, iq, b, &s.outs[c * dv..(c + 1) * dv]);
        }
    }
    ts.attn.cols = cols;
}

/// What [`sparse_block`] needs of the node besides its views.
struct SparseShape {
    d: usize,
    dv: usize,
    n_seen: usize,
    n_head: usize,
    hk: usize,
    b: usize,
    mb: usize,
    k_wt: k::WeightType,
    act: k::ActType,
    scale: f32,
    softcap: f32,
    max_bias: f32,
}

/// Whether scoring each query's visible keys alone costs less than half the dense tile over
/// `n_seen` keys (a cache shared by several sequences); `row` is mask-row scratch.
fn sparse_pays(
    mask: &TView,
    cols: &[(usize, usize)],
    mb: usize,
    n_seen: usize,
    row: &mut [f32],
) -> bool {
    let mut visible = 0;
    let mut last_q = usize::MAX;
    let mut n_q_visible = 0;
    for &(iq, _) in cols {
        if iq != last_q {
            mask.read_row(iq, 0, mb, row);
            n_q_visible = row[..n_seen]
                .iter()
                .filter(|&&m| m != f32::NEG_INFINITY)
                .count();
            last_q = iq;
        }
        visible += n_q_visible;
    }
    visible * 2 < cols.len() * n_seen
}

/// The block's outputs (`s.outs`, `dv` per column), computed query by query over the keys each
/// query's mask row leaves visible: the keys gathered in their own type, scored by one tile
/// product per query (its columns are the heads sharing the KV head), softmax over them, and
/// their V rows added in key order, as the dense path adds them.
#[allow(clippy::too_many_arguments)]
fn sparse_block(
    sh: &SparseShape,
    q: &TView,
    kt: &TView,
    vt: &TView,
    mask: &TView,
    sinks: Option<&TView>,
    cols: &[(usize, usize)],
    s: &mut AttnScratch,
    bytes: &mut Vec<u8>,
) {
    let (d, dv) = (sh.d, sh.dv);
    s.outs.resize(cols.len() * dv, 0.0);
    s.outs.fill(0.0);
    let rb = kt.row_bytes();
    let arow = k::act_row_bytes(sh.act, d);
    let mut start = 0;
    while start < cols.len() {
        let iq = cols[start].0;
        let end = start + cols[start..].iter().take_while(|c| c.0 == iq).count();
        let group = &cols[start..end];
        let ng = group.len();
        mask.read_row(iq, 0, sh.mb, &mut s.mrow);
        s.visible.clear();
        s.visible
            .extend((0..sh.n_seen).filter(|&j| s.mrow[j] != f32::NEG_INFINITY));
        let nv = s.visible.len();
        if nv == 0 && sinks.is_none() {
            start = end;
            continue;
        }
        s.kgather.clear();
        for &j in &s.visible {
            s.kgather.extend_from_slice(kt.row_raw(j, sh.hk, sh.b));
        }
        s.qblk.resize(ng * d, 0.0);
        for (c, &(iq, h)) in group.iter().enumerate() {
            q.read_row(iq, h, sh.b, &mut s.qblk[c * d..(c + 1) * d]);
        }
        if kt.dtype == DType::BF16 {
            for v in &mut s.qblk {
                *v = half::bf16::from_f32(*v).to_f32();
            }
        }
        s.qact.resize(ng * arow, 0);
        for c in 0..ng {
            k::prepare_act(
                sh.act,
                &s.qblk[c * d..(c + 1) * d],
                &mut s.qact[c * arow..(c + 1) * arow],
            );
        }
        s.scores.resize(ng * nv, 0.0);
        if nv > 0 {
            k::mul_mat_tile(
                sh.k_wt,
                &s.kgather,
                rb,
                nv,
                &s.qact,
                arow,
                ng,
                d,
                &mut s.scores,
                nv,
                bytes,
            );
        }
        s.mgather.clear();
        s.mgather.extend(s.visible.iter().map(|&j| s.mrow[j]));
        for (c, &(_, h)) in group.iter().enumerate() {
            let slope = alibi_slope(sh.max_bias, h, sh.n_head);
            let sink = sinks.map(|sv| {
                s.sink_row.resize(sv.ne[0], 0.0);
                sv.read_row(0, 0, 0, &mut s.sink_row);
                s.sink_row[h]
            });
            softmax_row(
                &mut s.scores[c * nv..(c + 1) * nv],
                &s.mgather,
                true,
                sh.scale,
                sh.softcap,
                slope,
                sink,
            );
        }
        let outs = &mut s.outs[start * dv..end * dv];
        let mut p = [0f32; Q_BLOCK];
        for (r, &j) in s.visible.iter().enumerate() {
            for (c, w) in p[..ng].iter_mut().enumerate() {
                *w = s.scores[c * nv + r];
            }
            if p[..ng].iter().all(|&w| w == 0.0) {
                continue;
            }
            vt.read_row(j, sh.hk, sh.b, &mut s.vrow);
            k::vecmath::axpy_columns(outs, &p[..ng], &s.vrow);
        }
        start = end;
    }
}

/// Turns one query's raw scores into normalised probabilities: scale, soft-cap, mask (with its
/// ALiBi slope), then a softmax with an optional sink logit. A query that sees no key gets zeros.
fn softmax_row(
    s: &mut [f32],
    mrow: &[f32],
    masked: bool,
    scale: f32,
    softcap: f32,
    slope: f32,
    sink: Option<f32>,
) {
    let mut smax = f32::NEG_INFINITY;
    for (j, v) in s.iter_mut().enumerate() {
        let mut x = *v * scale;
        if softcap != 0.0 {
            x = softcap * x.tanh();
        }
        if masked {
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

/// Whether the kernel reads K and V of these types in place: any type the tile kernels take
/// (every float and block type but Q8_K), with rows of whole blocks.
pub(crate) fn kv_supported(kv: DType, d: usize) -> bool {
    k::WeightType::of_dtype(kv).is_some() && d.is_multiple_of(kv.block_size())
}

/// One past the last key any of the `n_q` mask rows of batch plane `b` leaves visible (0 if
/// none), with `any[j]` set for each key some row shows; `row` is scratch of the mask's row
/// length.
fn visible_keys(mask: &TView, n_q: usize, b: usize, row: &mut [f32], any: &mut Vec<bool>) -> usize {
    any.clear();
    any.resize(row.len(), false);
    let mut seen = 0;
    for iq in 0..n_q {
        mask.read_row(iq, 0, b, row);
        for (a, &m) in any.iter_mut().zip(row.iter()) {
            *a |= m != f32::NEG_INFINITY;
        }
        if let Some(last) = row.iter().rposition(|&m| m != f32::NEG_INFINITY) {
            seen = seen.max(last + 1);
        }
    }
    seen
}
