//! Offline placement by decreasing size (TFLite's "greedy by size"), the fallback of the planner
//! when the online best-fit pass leaves fragmentation behind.
//!
//! Because every lifetime is known before anything is placed, the largest tensors are placed
//! first, each in the smallest gap between already placed tensors that are live at the same time
//! (or above them all). A node running in place of its source forms one object with it: the
//! whole chain shares an offset and spans the union of the lifetimes.

use super::liveness::Liveness;

/// Offsets (indexed like `live.planned`) and the peak, `None` on overflow.
pub(crate) fn place_by_size(live: &Liveness) -> Option<(Vec<usize>, usize)> {
    let n = live.planned.len();
    // Objects: chains of in-place nodes, named by their first member.
    let mut head: Vec<usize> = (0..n).collect();
    for (j, p) in live.planned.iter().enumerate() {
        if let Some(i) = p.in_place_of {
            // Sources are planned before the nodes that take them over, so heads are final.
            head[j] = head[i];
        }
    }
    let last = live.steps; // "never freed" outlives every step
    let mut span: Vec<Option<(usize, usize, usize)>> = vec![None; n]; // (size, start, end)
    for (j, p) in live.planned.iter().enumerate() {
        let end = p.end.unwrap_or(last);
        let s = &mut span[head[j]];
        *s = Some(match *s {
            None => (p.size, p.start, end),
            Some((size, start, e)) => (size.max(p.size), start.min(p.start), e.max(end)),
        });
    }
    let mut order: Vec<usize> = (0..n)
        .filter(|&i| span[i].is_some_and(|s| s.0 > 0))
        .collect();
    order.sort_by_key(|&i| {
        let (size, start, end) = span[i].unwrap_or_default();
        (std::cmp::Reverse(size), start, std::cmp::Reverse(end), i)
    });

    let mut offset = vec![0usize; n];
    let mut placed: Vec<(usize, usize, usize, usize)> = Vec::new(); // (offset, size, start, end)
    let mut peak = 0usize;
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for &i in &order {
        let (size, start, end) = span[i]?;
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|&&(_, _, s, e)| s <= end && start <= e)
                .map(|&(o, sz, _, _)| (o, o + sz)),
        );
        busy.sort_unstable();
        // Smallest gap that fits (lowest on ties), else right above everything live.
        let (mut best, mut floor) = (None::<(usize, usize)>, 0usize);
        for &(lo, hi) in &busy {
            if lo >= floor {
                let gap = lo - floor;
                if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, floor));
                }
            }
            floor = floor.max(hi);
        }
        let at = best.map_or(floor, |(_, o)| o);
        peak = peak.max(at.checked_add(size)?);
        offset[i] = at;
        placed.push((at, size, start, end));
    }
    for j in 0..n {
        offset[j] = if live.planned[j].size == 0 {
            0
        } else {
            offset[head[j]]
        };
    }
    Some((offset, peak))
}
