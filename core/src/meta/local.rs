//! Device `j`'s view of a graph: every tensor's descriptor with the split axis cut to the
//! device's length, strides of the device's slice, and view offsets moved into the slice.
//!
//! A non-view tensor is contiguous, so its slice is too ([`slice_desc`]). A view is mapped
//! through the non-view tensor it finally looks at (its root): each stride of the view is a
//! multiple of one of the root's strides, and becomes the same multiple of the root slice's
//! stride; the view's byte offset is split into root coordinates, and the coordinate on the
//! root's split axis becomes the count of the device's own positions before it.

use super::propagate::NodeStates;
use super::split::{SplitKind, SplitState, slice_desc};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::Op;
use crate::tensor::{MAX_DIMS, TensorDesc, TensorId, contiguous_strides};

fn fail(graph: &Graph, id: TensorId, j: usize, why: impl std::fmt::Display) -> Error {
    Error::InvalidOp {
        op: graph.tensor(id).map_or("?", |t| t.op().name()).to_string(),
        tensor: graph.label(id),
        reason: format!("cannot slice it for device {j}: {why}"),
    }
}

/// Device `j`'s descriptors for every tensor of `graph` (tensors outside the graph keep theirs).
///
/// # Errors
/// [`Error::InvalidOp`] naming the tensor when its slice cannot be expressed as a strided view of
/// the device's memory (a view that starts inside a split piece, or strides that do not follow the
/// root's dims).
pub fn local_tensors(
    graph: &Graph,
    states: &[Option<NodeStates>],
    j: usize,
) -> Result<Vec<TensorDesc>> {
    let tensors = graph.tensors();
    let mut out: Vec<TensorDesc> = tensors.to_vec();
    // Per tensor: (root, byte offset from the root) in global and in local terms.
    let mut root_of: Vec<(usize, usize, usize)> = (0..tensors.len()).map(|i| (i, 0, 0)).collect();
    for (i, t) in tensors.iter().enumerate() {
        let id = TensorId::from_index(i);
        let Some(st) = states.get(i).and_then(Option::as_ref) else {
            continue;
        };
        let Some(view) = t.view_of() else {
            let (ne, nb) = slice_desc(t, &st.own, j).map_err(|e| fail(graph, id, j, e))?;
            out[i].ne = ne;
            out[i].nb = nb;
            if let Some(first) = local_expert_range(t, states, j) {
                out[i].op = Op::MulMatId {
                    first_expert: Some(first),
                };
            }
            continue;
        };
        let src = view.src.index();
        let (root, src_goff, src_loff) = root_of[src];
        let goff = src_goff + view.offset;
        let rstate = states
            .get(root)
            .and_then(Option::as_ref)
            .map(|s| s.own.clone())
            .unwrap_or_else(SplitState::mirrored);
        let SplitKind::Axis(ra) = rstate.kind() else {
            // The root is whole on every device: the view is unchanged.
            root_of[i] = (root, goff, goff);
            continue;
        };
        let SplitKind::Axis(a) = st.own.kind() else {
            return Err(fail(
                graph,
                id,
                j,
                format!("a {} view of a {rstate} tensor", st.own),
            ));
        };
        let rg = &tensors[root];
        let rl = &out[root];
        let gstr = contiguous_strides(rg.dtype(), rg.ne());
        let lstr = rl.nb();
        let mut ne = t.ne();
        ne[a] = st.own.local_len(j);
        let mut nb = t.nb();
        for (s, &n) in nb.iter_mut().zip(&t.ne()) {
            if n <= 1 {
                continue;
            }
            let k = (0..MAX_DIMS)
                .rev()
                .find(|&k| gstr[k] <= *s)
                .ok_or_else(|| fail(graph, id, j, "a stride below the element size"))?;
            if gstr[k] == 0 || *s % gstr[k] != 0 {
                return Err(fail(
                    graph,
                    id,
                    j,
                    format!("stride {s} does not follow the root's dims"),
                ));
            }
            *s = *s / gstr[k] * lstr[k];
        }
        // Unit dims carry any stride; give them the dense one so contiguity checks hold.
        let dense = contiguous_strides(t.dtype(), ne);
        for ((s, &n), &want) in nb.iter_mut().zip(&ne).zip(&dense) {
            if n <= 1 {
                *s = want;
            }
        }
        let mut rem = goff;
        let mut idx = [0usize; MAX_DIMS];
        for k in (0..MAX_DIMS).rev() {
            if gstr[k] == 0 {
                continue;
            }
            idx[k] = rem / gstr[k];
            rem -= idx[k] * gstr[k];
        }
        if rem != 0 {
            return Err(fail(graph, id, j, "a view offset inside an element"));
        }
        let g = if ra == 0 {
            idx[0] * rg.dtype().block_size()
        } else {
            idx[ra]
        };
        let local_g: usize = rstate
            .pieces(j)
            .iter()
            .map(|&(s, l)| g.saturating_sub(s).min(l))
            .sum();
        let mut loff = 0usize;
        for k in 0..MAX_DIMS {
            let x = if k == ra {
                if ra == 0 {
                    local_g / rg.dtype().block_size()
                } else {
                    local_g
                }
            } else {
                idx[k]
            };
            loff += x * lstr[k];
        }
        let mut local = t.clone();
        local.ne = ne;
        local.nb = nb;
        let span = local.nbytes();
        if local.nelements() > 0 && loff + span > rl.nbytes() {
            return Err(fail(
                graph,
                id,
                j,
                format!(
                    "bytes {loff}..{} fall outside the device's {} bytes of the root",
                    loff + span,
                    rl.nbytes()
                ),
            ));
        }
        local.view = Some(crate::tensor::ViewOf {
            src: view.src,
            offset: loff
                .checked_sub(src_loff)
                .ok_or_else(|| fail(graph, id, j, "the view starts before its source's slice"))?,
        });
        out[i] = local;
        root_of[i] = (root, goff, loff);
    }
    Ok(out)
}

/// For a MUL_MAT_ID whose expert stack is split by whole experts (A2): the first expert device
/// `j` holds, so that its local op computes only the pairs routed to its own experts.
fn local_expert_range(t: &TensorDesc, states: &[Option<NodeStates>], j: usize) -> Option<usize> {
    if !matches!(t.op(), Op::MulMatId { first_expert: None }) {
        return None;
    }
    let w = states.get(t.src(0)?.index())?.as_ref()?;
    if w.own.kind() != SplitKind::Axis(2) {
        return None;
    }
    // One contiguous range per device (checked by the MUL_MAT_ID rule): the experts before it.
    let seg = w.own.segments().first()?;
    Some(seg.lens.iter().take(j).sum())
}
