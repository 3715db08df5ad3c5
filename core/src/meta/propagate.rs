//! The planning pass: split states of every tensor a graph touches, and where the all-reduces go.
//!
//! PARTIAL handling (Tessera's rule, meta-device.md §4–5): a PARTIAL value flows only through
//! linear consumers — `ADD(P, P)`, `SUB(P, P)`, `SCALE` with bias 0, `MUL(P, M)` / `MUL(M, P)`,
//! `ADD_ID(P, P, M)` (expert outputs plus per-expert biases), and `VIEW` / `RESHAPE` /
//! `PERMUTE` / `TRANSPOSE` / `CONT`. Any other consumer reads the reduced (MIRRORED) value, which makes the producer a reduce point. The reduce is in place, so
//! once a node is reduced every consumer reads the reduced value; a reduce needed by a pure view
//! moves to the node the view looks at. The search runs to a fixed point (reduce points only
//! grow), usually in two passes.

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::meta::rules::{NodeCtx, rule};
use crate::meta::split::{SplitKind, SplitState, slice_desc};
use crate::ops::{Op, OpKind};
use crate::tensor::TensorId;

/// The states of one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStates {
    /// The state of the data as the node itself produces it (`assume_sync = false`): PARTIAL for
    /// a row-parallel matmul and for linear ops of PARTIAL values.
    pub own: SplitState,
    /// The state consumers that cannot take PARTIAL see (`assume_sync = true`): MIRRORED whenever
    /// `own` is PARTIAL for a node, `own` otherwise. A static PARTIAL leaf cannot be reduced, so
    /// it shows PARTIAL here too.
    pub seen: SplitState,
    /// Whether an all-reduce of this node goes right after it.
    pub reduce: bool,
}

impl NodeStates {
    fn same(s: SplitState) -> NodeStates {
        NodeStates {
            own: s.clone(),
            seen: s,
            reduce: false,
        }
    }
}

fn internal(graph: &Graph, id: TensorId, why: &str) -> Error {
    Error::InvalidOp {
        op: graph.tensor(id).map_or("?", |t| t.op().name()).to_string(),
        tensor: graph.label(id),
        reason: why.to_string(),
    }
}

/// Sources a node's state depends on: its sources, plus the destination of SET_ROWS.
fn inputs(graph: &Graph, id: TensorId) -> Result<Vec<TensorId>> {
    let desc = graph.tensor(id)?;
    let mut v: Vec<TensorId> = desc.srcs().collect();
    if desc.op().kind() == OpKind::SetRows
        && let Some(view) = desc.view_of()
    {
        v.push(view.src);
    }
    Ok(v)
}

fn states_of<'a>(
    graph: &Graph,
    states: &'a [Option<NodeStates>],
    id: TensorId,
) -> Result<&'a NodeStates> {
    states
        .get(id.index())
        .and_then(Option::as_ref)
        .ok_or_else(|| internal(graph, id, "source has no state (not part of the graph?)"))
}

/// Whether `op` is linear in its PARTIAL sources `p` (flags per input), so it may take them
/// unreduced; `seen` are the other inputs' states.
fn linear_in_partial(op: &Op, p: &[bool], seen: &[&SplitState]) -> bool {
    match *op {
        Op::Add | Op::Sub => p.len() == 2 && p[0] && p[1],
        Op::Scale { bias, .. } => bias == 0.0,
        Op::Mul => {
            p.len() == 2
                && p[0] != p[1]
                && seen.iter().zip(p).all(|(s, &is_p)| is_p || s.is_mirrored())
        }
        Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose | Op::Cont => true,
        // A PARTIAL expert output plus PARTIAL per-expert biases (stored on one device, zero
        // on the others), with MIRRORED ids: a sum of sums.
        Op::AddId => p.len() == 3 && p[0] && p[1] && !p[2] && seen[2].is_mirrored(),
        _ => false,
    }
}

/// One forward pass given the current reduce points; pushes P producers read by non-linear
/// consumers onto `needs`.
fn pass(
    graph: &Graph,
    leaves: &[Option<NodeStates>],
    reduced: &[bool],
    needs: &mut Vec<TensorId>,
) -> Result<Vec<Option<NodeStates>>> {
    let mut states = leaves.to_vec();
    for &id in graph.nodes() {
        let desc = graph.tensor(id)?;
        let ins = inputs(graph, id)?;
        let mut p = Vec::with_capacity(ins.len());
        let mut seen = Vec::with_capacity(ins.len());
        for &s in &ins {
            let st = states_of(graph, &states, s)?;
            p.push(st.own.is_partial() && !reduced[s.index()]);
            seen.push(st.seen.clone());
        }
        if p.iter().any(|&x| x) {
            let seen_refs: Vec<&SplitState> = seen.iter().collect();
            if linear_in_partial(desc.op(), &p, &seen_refs) {
                states[id.index()] = Some(NodeStates {
                    own: SplitState::partial(),
                    seen: SplitState::mirrored(),
                    reduce: false,
                });
                continue;
            }
            for (&s, &is_p) in ins.iter().zip(&p) {
                if is_p && graph.tensor(s)?.op().kind() != OpKind::None {
                    needs.push(s);
                }
            }
        }
        let ctx = NodeCtx {
            graph,
            id,
            desc,
            srcs: &ins,
            states: &seen,
        };
        let out = rule(&ctx)?;
        states[id.index()] = Some(if out.is_partial() {
            NodeStates {
                own: out,
                seen: SplitState::mirrored(),
                reduce: false,
            }
        } else {
            NodeStates::same(out)
        });
    }
    Ok(states)
}

/// The node a reduce of `id` must happen on: through pure views of PARTIAL data, to the node
/// that owns the memory.
fn reduce_root(graph: &Graph, states: &[Option<NodeStates>], mut id: TensorId) -> Result<TensorId> {
    loop {
        let desc = graph.tensor(id)?;
        match desc.op().kind() {
            OpKind::View | OpKind::Reshape | OpKind::Permute | OpKind::Transpose => {
                match desc.view_of() {
                    Some(v) if states_of(graph, states, v.src)?.own.is_partial() => id = v.src,
                    _ => return Ok(id),
                }
            }
            OpKind::None => {
                return Err(internal(
                    graph,
                    id,
                    "a static PARTIAL tensor is read by an op that needs its sum",
                ));
            }
            _ => return Ok(id),
        }
    }
}

/// Checks a static state against its tensor.
fn check_static(graph: &Graph, id: TensorId, state: &SplitState) -> Result<()> {
    let desc = graph.tensor(id)?;
    let bad = |why: String| Error::InvalidOp {
        op: "NONE".into(),
        tensor: graph.label(id),
        reason: format!("static state {state}: {why}"),
    };
    match state.kind() {
        SplitKind::Mirrored => Ok(()),
        SplitKind::Partial if desc.dtype() == crate::dtype::DType::F32 => Ok(()),
        SplitKind::Partial => Err(bad(format!("PARTIAL needs F32, not {}", desc.dtype()))),
        SplitKind::Routed => Err(bad("ROUTED is a compute state, never static".into())),
        SplitKind::Axis(_) => slice_desc(desc, state, 0)
            .map(|_| ())
            .map_err(|e| bad(e.to_string())),
    }
}

/// Split states of every tensor `graph` touches, indexed by [`TensorId::index`] (`None` for
/// tensors outside the graph).
///
/// Leaves take their state from `static_states` (weights, caches) or are MIRRORED (graph
/// inputs); nodes get theirs from the rules of meta-device.md §4 with Tessera's changes.
///
/// # Errors
/// [`Error::InvalidOp`] naming the node, its op and its sources' states when no rule applies
/// (e.g. SOFT_MAX or RMS_NORM on A0, MUL_MAT of A1·A1, a ratio takeover that does not divide),
/// or when a static state does not fit its tensor.
pub fn propagate(
    graph: &Graph,
    static_states: &dyn Fn(TensorId) -> Option<SplitState>,
) -> Result<Vec<Option<NodeStates>>> {
    let n = graph.tensors().len();
    let mut leaves: Vec<Option<NodeStates>> = vec![None; n];
    for &leaf in graph.leafs() {
        let state = match static_states(leaf) {
            Some(s) => {
                check_static(graph, leaf, &s)?;
                s
            }
            None => SplitState::mirrored(),
        };
        leaves[leaf.index()] = Some(NodeStates::same(state));
    }
    let mut outputs: Vec<TensorId> = graph.outputs().to_vec();
    for &id in graph.nodes() {
        if graph.tensor(id)?.flags().output {
            outputs.push(id);
        }
    }
    let mut reduced = vec![false; n];
    loop {
        let mut needs = Vec::new();
        let mut states = pass(graph, &leaves, &reduced, &mut needs)?;
        for &o in &outputs {
            if states_of(graph, &states, o)?.own.is_partial() && !reduced[o.index()] {
                needs.push(o);
            }
        }
        let mut changed = false;
        for id in needs {
            let root = reduce_root(graph, &states, id)?;
            changed |= !std::mem::replace(&mut reduced[root.index()], true);
        }
        if !changed {
            for (i, st) in states.iter_mut().enumerate() {
                if let Some(st) = st {
                    st.reduce = reduced[i] && st.own.is_partial();
                }
            }
            return Ok(states);
        }
    }
}

/// The nodes, in execution order, after which an all-reduce goes (`reduce` set by
/// [`propagate`]).
pub fn reduce_points(graph: &Graph, states: &[Option<NodeStates>]) -> Vec<TensorId> {
    graph
        .nodes()
        .iter()
        .copied()
        .filter(|id| {
            states
                .get(id.index())
                .and_then(Option::as_ref)
                .is_some_and(|s| s.reduce)
        })
        .collect()
}
