//! Which nodes of a graph need the threads to meet before they run, decided once per prepared
//! graph from the memory each node reads and writes.
//!
//! A barrier between every pair of nodes is simple and, for a decode step, costly: hundreds of
//! nodes of a few microseconds each, and each barrier waits for the slowest thread. Many
//! neighbours do not depend on each other — the query, key and value products of one input, the
//! two rotations, the two cache writes, the gate and up products — and run back to back without
//! one. MUL_MAT also converts its activations into shared scratch before its own internal
//! barrier; a product of the same activations in the same form as the one before it finds them
//! there and skips both the conversion and that barrier.

use crate::tview::TView;
use std::ops::Range;
use tessera_core::{Graph, Op, TensorId};
use tessera_kernels::cpu::{self as k, ActType};

/// Nodes allowed between two barriers: bounds the overlap checks of a graph of many independent
/// nodes.
const MAX_RUN: usize = 64;

/// How the threads run one computing node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub node: TensorId,
    /// The threads meet at a barrier before this node.
    pub barrier: bool,
    /// MUL_MAT only: the shared scratch already holds this node's activations in the form its
    /// weights take, prepared by an earlier MUL_MAT of the same tensor.
    pub reuse_act: bool,
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// The steps of `graph` (view nodes and empty nodes compute nothing and are left out).
/// `views` holds every tensor's resolved storage, as `prepare` made it.
pub(crate) fn schedule(graph: &Graph, views: &[Option<TView>]) -> Vec<Step> {
    let tensors = graph.tensors();
    let span = |id: TensorId| -> Option<Range<usize>> {
        let v = views.get(id.index()).copied().flatten()?;
        let len = tensors[id.index()].nbytes();
        (len > 0).then(|| v.addr()..v.addr() + len)
    };
    let mut steps = Vec::new();
    // Since the last barrier: the bytes written and read, and whether a node reads the shared
    // scratch (every MUL_MAT and MUL_MAT_ID does).
    let mut written: Vec<Range<usize>> = Vec::new();
    let mut read: Vec<Range<usize>> = Vec::new();
    let mut scratch_read = false;
    let mut run = 0;
    // What the shared scratch holds: the activations of this tensor, in this form, from these bytes.
    let mut held: Option<(TensorId, ActType, Range<usize>)> = None;
    for &node in graph.nodes() {
        let t = &tensors[node.index()];
        if t.op().kind().is_view() || t.nelements() == 0 {
            continue;
        }
        let out = span(node);
        let ins: Vec<Range<usize>> = t.srcs().filter_map(span).collect();
        let (writes_scratch, reads_scratch, reuse_act, act) = match *t.op() {
            Op::MulMat => match (t.src(0), t.src(1)) {
                (Some(w), Some(x)) => match act_of(tensors[w.index()].dtype()) {
                    Some(act) => {
                        let reuse = held
                            .as_ref()
                            .is_some_and(|(id, a, _)| *id == x && *a == act);
                        (!reuse, true, reuse, Some((x, act)))
                    }
                    None => (false, false, false, None),
                },
                _ => (false, false, false, None),
            },
            Op::MulMatId { .. } => (true, true, false, None),
            _ => (false, false, false, None),
        };
        let conflict = run >= MAX_RUN
            || ins.iter().any(|r| written.iter().any(|w| overlaps(r, w)))
            || out
                .as_ref()
                .is_some_and(|o| written.iter().chain(read.iter()).any(|r| overlaps(o, r)))
            || (writes_scratch && scratch_read);
        let barrier = !steps.is_empty() && conflict;
        if barrier {
            written.clear();
            read.clear();
            scratch_read = false;
            run = 0;
        }
        written.extend(out.clone());
        read.extend(ins);
        scratch_read |= reads_scratch;
        run += 1;
        if writes_scratch {
            held = act.and_then(|(x, a)| span(x).map(|r| (x, a, r)));
        }
        // Activations whose source bytes were overwritten are stale.
        if let (Some((_, _, src)), Some(o)) = (&held, &out)
            && overlaps(src, o)
        {
            held = None;
        }
        steps.push(Step {
            node,
            barrier,
            reuse_act,
        });
    }
    steps
}

/// The activation form MUL_MAT prepares for weights of this dtype (`None`: no CPU kernel).
pub(crate) fn act_of(dtype: tessera_core::DType) -> Option<ActType> {
    k::WeightType::of_dtype(dtype).map(k::act_type)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::{Context, DType};

    /// Views of every tensor of `graph` at the byte offsets `at` gives, in one arena: `at` may
    /// place two tensors on the same bytes, as an allocator that reuses memory does.
    fn schedule_at(graph: &Graph, at: impl Fn(TensorId) -> usize) -> Vec<Step> {
        let tensors = graph.tensors();
        let arena = vec![0u8; 1 << 20];
        let mut views = vec![None; tensors.len()];
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            let off = at(id);
            assert!(off + tensors[id.index()].nbytes() <= arena.len());
            // SAFETY: inside `arena`; the schedule only takes addresses, never dereferences.
            #[allow(unsafe_code)]
            let v = unsafe { TView::new(arena.as_ptr().add(off) as *mut u8, &tensors[id.index()]) };
            views[id.index()] = Some(v);
        }
        schedule(graph, &views)
    }

    /// Every tensor on bytes of its own.
    fn apart(id: TensorId) -> usize {
        id.index() * 16384
    }

    fn brief(steps: &[Step]) -> Vec<(bool, bool)> {
        steps.iter().map(|s| (s.barrier, s.reuse_act)).collect()
    }

    /// q, k and v: three products of one input x, then their sum, in that order.
    fn qkv(dtypes: [DType; 3]) -> (Graph, [TensorId; 6]) {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [64, 2]).unwrap();
        let mut outs = [x; 3];
        for (o, dt) in outs.iter_mut().zip(dtypes) {
            let w = ctx.new_tensor(dt, [64, 32]).unwrap();
            *o = ctx.mul_mat(w, x).unwrap();
        }
        let s = ctx.add(outs[0], outs[1]).unwrap();
        let y = ctx.add(s, outs[2]).unwrap();
        let g = ctx
            .build_forward_multi(&[outs[0], outs[1], outs[2], y])
            .unwrap();
        (g, [x, outs[0], outs[1], outs[2], s, y])
    }

    #[test]
    fn products_of_one_input_share_its_activations_and_need_no_barrier() {
        let (g, _) = qkv([DType::Q4_1, DType::Q4_1, DType::Q4_1]);
        let steps = schedule_at(&g, apart);
        // q, k, v without barriers (k and v reuse q's activations); each sum reads a product.
        assert_eq!(
            brief(&steps),
            [
                (false, false),
                (false, true),
                (false, true),
                (true, false),
                (true, false)
            ]
        );
    }

    #[test]
    fn another_activation_form_is_prepared_again_after_a_barrier() {
        // Q8_0 weights take Q8_0 activations, Q4_1 weights Q8_1: the second product would
        // overwrite the scratch the first still reads, and so would the third. q + k reads
        // nothing the third wrote.
        let (g, _) = qkv([DType::Q4_1, DType::Q8_0, DType::Q4_1]);
        let steps = schedule_at(&g, apart);
        assert_eq!(
            brief(&steps),
            [
                (false, false),
                (true, false),
                (true, false),
                (false, false),
                (true, false)
            ]
        );
    }

    #[test]
    fn reused_memory_orders_an_independent_writer_after_the_readers() {
        // v = z * 2 on the bytes of x, which the products q and k read: v waits for them.
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [64, 2]).unwrap();
        let z = ctx.new_tensor(DType::F32, [32, 2]).unwrap();
        let wq = ctx.new_tensor(DType::Q4_1, [64, 32]).unwrap();
        let wk = ctx.new_tensor(DType::Q4_1, [64, 32]).unwrap();
        let q = ctx.mul_mat(wq, x).unwrap();
        let k = ctx.mul_mat(wk, x).unwrap();
        let v = ctx.scale(z, 2.0).unwrap();
        let s = ctx.add(q, k).unwrap();
        let y = ctx.add(s, v).unwrap();
        let g = ctx.build_forward_multi(&[q, k, v, y]).unwrap();
        let steps = schedule_at(&g, |id| if id == v { apart(x) } else { apart(id) });
        assert_eq!(
            brief(&steps),
            [
                (false, false),
                (false, true),
                (true, false),
                (false, false),
                (true, false)
            ]
        );
        let apart_steps = schedule_at(&g, apart);
        assert!(!apart_steps[2].barrier, "{apart_steps:?}");
    }

    #[test]
    fn overwritten_activations_are_not_reused() {
        // x2 = x * 2 written over x between two products of x.
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [64, 1]).unwrap();
        let w1 = ctx.new_tensor(DType::Q8_0, [64, 32]).unwrap();
        let w2 = ctx.new_tensor(DType::Q8_0, [64, 32]).unwrap();
        let a = ctx.mul_mat(w1, x).unwrap();
        let x2 = ctx.scale(a, 2.0).unwrap();
        let b = ctx.mul_mat(w2, x).unwrap();
        let y = ctx.add(x2, b).unwrap();
        let g = ctx.build_forward(y).unwrap();
        let fresh = schedule_at(&g, apart);
        assert_eq!(
            brief(&fresh),
            [(false, false), (true, false), (false, true), (true, false)]
        );
        let over = schedule_at(&g, |id| if id == x2 { apart(x) } else { apart(id) });
        assert!(!over[2].reuse_act, "{over:?}");
        assert!(over[2].barrier, "b reads x, which x2 wrote: {over:?}");
    }

    #[test]
    fn long_runs_of_independent_nodes_are_cut() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [4]).unwrap();
        let outs: Vec<TensorId> = (0..150).map(|i| ctx.scale(x, i as f32).unwrap()).collect();
        let g = ctx.build_forward_multi(&outs).unwrap();
        let steps = schedule_at(&g, |id| id.index() * 64);
        let barriers: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].barrier).collect();
        assert_eq!(barriers, [MAX_RUN, 2 * MAX_RUN]);
    }
}
