//! Moving an axis split through ops that reinterpret memory (RESHAPE, VIEW, CPY): the
//! cumulative-product rule of meta-device.md §4, with exactness checks instead of aborts.
//!
//! Ownership of a split tensor's elements, read in flat (contiguous) order, is periodic: one
//! period is one repetition of a one-segment split, or the whole axis for several segments.
//! A destination dim `k` can carry the split iff the destination's cumulative element count up to
//! `k` is a multiple of the period, and every piece boundary is a multiple of the cumulative
//! count below `k`.

use crate::meta::split::{MAX_SEGMENTS, Segment, SplitState};
use crate::tensor::{MAX_DIMS, TensorDesc, contiguous_strides};

/// Why a remap failed (turned into a typed error by the caller).
pub(crate) type Why = String;

/// Maps `segs` (on a virtual axis whose elements are each `inner` flat elements, covering the
/// whole flat range) onto the destination dims `dst_ne` (a prefix of the destination's dims).
/// Returns the destination axis and segments.
fn map_pattern(
    inner: usize,
    segs: &[Segment],
    dst_ne: &[usize],
) -> Result<(usize, Vec<Segment>), Why> {
    let (period_segs, period) = match segs {
        [one] => (vec![Segment::new(one.lens.clone(), 1)], one.period()),
        _ => (
            segs.to_vec(),
            segs.iter().map(|s| s.period() * s.repeats).sum(),
        ),
    };
    let base = inner * period;
    if base == 0 {
        return Err("the split axis is empty".into());
    }
    let mut below = 1usize;
    for (k, &ne) in dst_ne.iter().enumerate() {
        let upto = below * ne;
        if upto > 0 && upto.is_multiple_of(base) {
            let nr = upto / base;
            let mut scaled = Vec::with_capacity(period_segs.len());
            for s in &period_segs {
                let mut lens = Vec::with_capacity(s.lens.len());
                for &l in &s.lens {
                    if !(l * inner).is_multiple_of(below) {
                        return Err(format!(
                            "a piece of {} elements does not divide into rows of {below}",
                            l * inner
                        ));
                    }
                    lens.push(l * inner / below);
                }
                scaled.push(Segment::new(lens, s.repeats));
            }
            let out = if let [one] = scaled.as_slice() {
                vec![Segment::new(one.lens.clone(), nr)]
            } else {
                if scaled.len() * nr > MAX_SEGMENTS {
                    return Err(format!("more than {MAX_SEGMENTS} segments"));
                }
                scaled
                    .iter()
                    .cycle()
                    .take(scaled.len() * nr)
                    .cloned()
                    .collect()
            };
            return Ok((k, out));
        }
        below = upto;
    }
    Err(format!(
        "no destination dim is a whole number of split periods ({base} elements)"
    ))
}

fn to_state(axis: usize, segs: Vec<Segment>, ne: usize) -> Result<SplitState, Why> {
    SplitState::axis(axis, segs, ne).map_err(|e| e.to_string())
}

/// Flat rule: `src` and `dst` are both contiguous and `dst` starts `offset` bytes into `src`.
pub(crate) fn flat(
    src: &TensorDesc,
    state: &SplitState,
    a: usize,
    dst: &TensorDesc,
    offset: usize,
) -> Result<SplitState, Why> {
    let (dtype, ts, blk) = (
        src.dtype(),
        src.dtype().type_size(),
        src.dtype().block_size(),
    );
    if !offset.is_multiple_of(ts) {
        return Err(format!("offset {offset} splits a {dtype} block"));
    }
    let e0 = offset / ts * blk;
    let inner: usize = src.ne()[..a].iter().product();
    let segs = state.segments();
    let period = match segs {
        [one] => one.period(),
        _ => state.total_len(),
    };
    if !e0.is_multiple_of((inner * period).max(1)) {
        return Err(format!(
            "offset of {e0} elements is not a whole number of split periods"
        ));
    }
    let (k, out) = map_pattern(inner, segs, &dst.ne())?;
    to_state(k, out, dst.ne()[k])
}

/// Bytes per index along `a` of a tensor whose dims `0..=a` are packed, if they are.
fn packed_unit(t: &TensorDesc, a: usize) -> Option<usize> {
    let want = contiguous_strides(t.dtype(), t.ne());
    let nb = t.nb();
    (0..=a)
        .all(|d| t.ne()[d] == 1 || nb[d] == want[d])
        .then_some(want[a])
}

/// Restricts `state` to the axis range `[x0, x0 + n)`, which must be a run of whole segment
/// repetitions.
fn restrict(state: &SplitState, x0: usize, n: usize) -> Result<Vec<Segment>, Why> {
    if x0 == 0 && n == state.total_len() {
        return Ok(state.segments().to_vec());
    }
    let mut out: Vec<Segment> = Vec::new();
    let mut cursor = 0;
    let end = x0 + n;
    for (si, seg) in state.segments().iter().enumerate() {
        let p = seg.period();
        for _ in 0..seg.repeats {
            let (b0, b1) = (cursor, cursor + p);
            cursor = b1;
            if b1 <= x0 || b0 >= end || p == 0 {
                continue;
            }
            if b0 < x0 || b1 > end {
                return Err(format!(
                    "the view [{x0}, {end}) cuts through a split piece (segment {si})"
                ));
            }
            match out.last_mut() {
                Some(last) if last.lens == seg.lens => last.repeats += 1,
                _ => out.push(Segment::new(seg.lens.clone(), 1)),
            }
        }
    }
    if out.is_empty() {
        return Err(format!("the view [{x0}, {end}) selects no split piece"));
    }
    Ok(out)
}

/// Strided sub-range rule: `dst` is a view `offset` bytes into `src` (neither permuted) whose
/// leading packed dims cover a range of whole indices of `src`'s split axis `a`, and whose outer
/// dims step over whole outer rows of `src`.
pub(crate) fn strided(
    src: &TensorDesc,
    state: &SplitState,
    a: usize,
    dst: &TensorDesc,
    offset: usize,
) -> Result<SplitState, Why> {
    if src.dtype().is_quantized() {
        return Err("strided views of split quantized tensors are not supported".into());
    }
    let u = packed_unit(src, a).ok_or("the source is not packed up to the split axis")?;
    let ne_a = src.ne()[a];
    let outer_stride = (a + 1..MAX_DIMS)
        .find(|&d| src.ne()[d] > 1)
        .map(|d| src.nb()[d]);
    let r = match outer_stride {
        Some(c) if c > 0 => offset % c,
        _ => offset,
    };
    if !r.is_multiple_of(u) || r / u >= ne_a.max(1) {
        return Err(format!("offset {offset} lies inside a split index"));
    }
    let x0 = r / u;
    // The largest packed prefix 0..=d of dst that stays inside the rest of the split axis.
    let (ne, nb, ts) = (dst.ne(), dst.nb(), dst.dtype().type_size());
    let mut best = None;
    let mut stride = ts;
    for d in 0..MAX_DIMS {
        if ne[d] > 1 && nb[d] != stride {
            break;
        }
        let ext = stride * ne[d];
        if ext > u * (ne_a - x0) {
            break;
        }
        if ext.is_multiple_of(u) && ext > 0 {
            best = Some((d, ext / u));
        }
        stride = ext;
    }
    let (d, n_x) = best.ok_or("no leading dims of the view cover whole split indices")?;
    for k in d + 1..MAX_DIMS {
        if ne[k] > 1 && !outer_stride.is_some_and(|c| c > 0 && nb[k].is_multiple_of(c)) {
            return Err(format!(
                "view dim {k} (stride {}) does not step over whole rows of the source",
                nb[k]
            ));
        }
    }
    let segs = restrict(state, x0, n_x)?;
    let inner: usize = src.ne()[..a].iter().product();
    let (k, out) = map_pattern(inner, &segs, &ne[..=d])?;
    to_state(k, out, ne[k])
}

/// Stride rule for views whose dims may come in any order (a KV-cache view `[head_dim, n_kv,
/// n_head_kv]` of a `[n_embd_kv, n_ctx]` cache): `src` is contiguous; each view dim steps over
/// one source dim by a whole multiple of its stride. The dims stepping over the split axis must
/// nest densely (each one's step is the extent of the ones inside it); the split goes to the
/// outermost of them, whose step every piece must be a whole multiple of.
pub(crate) fn nested(
    src: &TensorDesc,
    state: &SplitState,
    a: usize,
    dst: &TensorDesc,
    offset: usize,
) -> Result<SplitState, Why> {
    if !src.is_contiguous() {
        return Err("needs a contiguous source".into());
    }
    let g = contiguous_strides(src.dtype(), src.ne());
    let (mut ne, nb) = (dst.ne(), dst.nb());
    // A block type is mapped in whole blocks (the strides count them along dim 0): dim 0 of
    // the view and a split of dim 0 are counted in blocks, and a result on dim 0 scaled back.
    let bs = src.dtype().block_size();
    let blocks = bs > 1;
    let scaled;
    let state = if blocks {
        if nb[0] != src.dtype().type_size() || !ne[0].is_multiple_of(bs) {
            return Err(format!(
                "a view of a {} tensor must keep whole blocks along dim 0",
                src.dtype()
            ));
        }
        ne[0] /= bs;
        if a == 0 {
            let mut segs = Vec::new();
            for seg in state.segments() {
                if seg.lens.iter().any(|l| !l.is_multiple_of(bs)) {
                    return Err(format!(
                        "a piece of {:?} elements is not whole {} blocks of {bs}",
                        seg.lens,
                        src.dtype()
                    ));
                }
                segs.push(Segment::new(
                    seg.lens.iter().map(|l| l / bs).collect(),
                    seg.repeats,
                ));
            }
            scaled = to_state(0, segs, state.total_len() / bs)?;
            &scaled
        } else {
            state
        }
    } else {
        state
    };
    // (step along the split axis, view dim) of the dims that move along it.
    let mut on_axis: Vec<(usize, usize)> = Vec::new();
    for d in 0..MAX_DIMS {
        if ne[d] <= 1 {
            continue;
        }
        let k = (0..MAX_DIMS)
            .rev()
            .find(|&k| g[k] <= nb[d] && g[k] > 0)
            .ok_or("a stride below the element size")?;
        if !nb[d].is_multiple_of(g[k]) {
            return Err(format!(
                "stride {} is not a multiple of a source stride",
                nb[d]
            ));
        }
        if k == a {
            on_axis.push((nb[d] / g[k], d));
        }
    }
    on_axis.sort_unstable();
    let Some(&(step_out, d_out)) = on_axis.last() else {
        return Err("no view dim moves along the split axis".into());
    };
    let mut inner = 1;
    for &(step, d) in &on_axis {
        if step != inner {
            return Err(format!(
                "view dims along the split axis do not nest densely (dim {d} steps {step}, \
                 {inner} expected)"
            ));
        }
        inner *= ne[d];
    }
    let outer_row = if a + 1 < MAX_DIMS {
        g[a + 1]
    } else {
        usize::MAX
    };
    let x0 = (offset % outer_row) / g[a];
    if !(offset % outer_row).is_multiple_of(g[a]) {
        return Err(format!("offset {offset} lies inside an element"));
    }
    let segs = restrict(state, x0, inner)?;
    let mut out = Vec::with_capacity(segs.len());
    for s in segs {
        let mut lens = Vec::with_capacity(s.lens.len());
        for &l in &s.lens {
            if !l.is_multiple_of(step_out) {
                return Err(format!(
                    "a piece of {l} splits view dim {d_out}, which steps {step_out} at a time"
                ));
            }
            lens.push(l / step_out);
        }
        out.push(Segment::new(lens, s.repeats));
    }
    if blocks && d_out == 0 {
        let out = out
            .into_iter()
            .map(|s| Segment::new(s.lens.iter().map(|l| l * bs).collect(), s.repeats))
            .collect();
        return to_state(0, out, ne[0] * bs);
    }
    to_state(d_out, out, ne[d_out])
}
