//! [`plan`]: offsets for a graph's intermediate tensors in one buffer, without allocating.

use super::free_list::FreeList;
use super::greedy::place_by_size;
use super::liveness::{Liveness, analyse, liveness_bound};
use crate::backend::Bindings;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{TensorDesc, TensorId};

/// Figures of one plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// Bytes the buffer needs: the highest end any placed tensor reaches.
    pub peak: usize,
    /// Sum of the (aligned) sizes of all placed tensors: the buffer size without any reuse.
    pub total_tensor_bytes: usize,
    /// The largest sum of (aligned) sizes of tensors live at one step: what a perfect allocator
    /// would need, ignoring fragmentation. A node running in place of its source counts once.
    pub liveness_bound: usize,
    /// Tensors placed (zero-byte tensors not counted).
    pub tensors: usize,
    /// Nodes that run in place of their first source.
    pub in_place: usize,
}

/// Where every tensor the plan places goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Tensor → byte offset in the compute buffer, sorted by tensor id. Holds every non-view
    /// tensor the graph touches that the `pre` bindings do not place; zero-byte tensors sit at
    /// offset 0 and occupy nothing.
    pub offsets: Vec<(TensorId, usize)>,
    /// Figures of the plan.
    pub stats: PlanStats,
}

impl Plan {
    /// The planned offset of `id`, if the plan places it.
    pub fn offset(&self, id: TensorId) -> Option<usize> {
        self.offsets
            .binary_search_by_key(&id, |&(t, _)| t)
            .ok()
            .map(|i| self.offsets[i].1)
    }
}

/// Plans the compute buffer of `graph`: every tensor the graph touches that is neither a view nor
/// placed (directly or through its view chain) in `pre` gets an offset, aligned to `alignment`,
/// of `alloc_size(t)` bytes (at least [`TensorDesc::nbytes`]).
///
/// A tensor is allocated right before the node producing it (leaves and tensors no node produces:
/// before the first node) and freed right after the last node reading or writing it, directly or
/// through views; input, output and param tensors and [`Graph::outputs`] are never freed. Freed
/// memory is reused best-fit; a row-wise op whose first source dies at it runs in place.
///
/// # Errors
/// [`Error::UnknownTensor`] for a node or source outside the graph's tensors;
/// [`Error::InvalidArgument`] when sizes overflow `usize`.
pub fn plan(
    graph: &Graph,
    pre: &Bindings,
    alignment: usize,
    alloc_size: &dyn Fn(&TensorDesc) -> usize,
) -> Result<Plan> {
    plan_detailed(graph, pre, alignment, alloc_size).map(|(p, _)| p)
}

/// [`plan`], also returning the liveness it was made from.
pub(crate) fn plan_detailed(
    graph: &Graph,
    pre: &Bindings,
    alignment: usize,
    alloc_size: &dyn Fn(&TensorDesc) -> usize,
) -> Result<(Plan, Liveness)> {
    let align = FreeList::new(alignment);
    let size = |t: &TensorDesc| align.aligned(alloc_size(t).max(t.nbytes()));
    let live = analyse(graph, pre, &size)?;
    let overflow = || Error::InvalidArgument("compute buffer size overflows".into());
    let bound = liveness_bound(&live);
    let (mut offsets, mut peak) = place_best_fit(&live, alignment).ok_or_else(overflow)?;
    if peak > bound {
        // Fragmentation: try the offline placement and keep whichever needs less.
        let (o, p) = place_by_size(&live).ok_or_else(overflow)?;
        if p < peak {
            (offsets, peak) = (o, p);
        }
    }

    let sized = live.planned.iter().filter(|p| p.size > 0);
    let stats = PlanStats {
        peak,
        total_tensor_bytes: sized
            .clone()
            .try_fold(0usize, |a, p| a.checked_add(p.size))
            .ok_or_else(overflow)?,
        liveness_bound: bound,
        tensors: sized.clone().count(),
        in_place: sized.filter(|p| p.in_place_of.is_some()).count(),
    };
    let mut offs: Vec<(TensorId, usize)> = live
        .planned
        .iter()
        .zip(&offsets)
        .map(|(p, &o)| (p.id, o))
        .collect();
    offs.sort_unstable();
    Ok((
        Plan {
            offsets: offs,
            stats,
        },
        live,
    ))
}

/// The online pass (ggml-alloc): walk the steps, allocating each tensor best-fit right before its
/// producer and freeing it right after its last use. Offsets indexed like `live.planned`, and
/// the peak; `None` on overflow.
pub(crate) fn place_best_fit(live: &Liveness, alignment: usize) -> Option<(Vec<usize>, usize)> {
    let mut fl = FreeList::new(alignment);
    // Frees per step; a source taken over in place is freed through the node that took it.
    let mut frees: Vec<Vec<usize>> = vec![Vec::new(); live.steps];
    let mut handed_over = vec![false; live.planned.len()];
    for p in &live.planned {
        if let Some(i) = p.in_place_of {
            handed_over[i] = true;
        }
    }
    for (i, p) in live.planned.iter().enumerate() {
        if let Some(end) = p.end
            && !handed_over[i]
            && p.size > 0
        {
            frees[end].push(i);
        }
    }
    let mut offsets = vec![0usize; live.planned.len()];
    let mut next = 0;
    for (step, to_free) in frees.iter().enumerate() {
        while let Some(p) = live.planned.get(next).filter(|p| p.start == step) {
            offsets[next] = match p.in_place_of {
                Some(src) => offsets[src],
                None if p.size == 0 => 0,
                None => fl.alloc(p.size)?,
            };
            next += 1;
        }
        for &i in to_free {
            fl.free(offsets[i], live.planned[i].size);
        }
    }
    debug_assert_eq!(next, live.planned.len());
    Some((offsets, fl.peak()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::test_support::{check_plan, param, params_in_pre};
    use crate::dtype::DType;
    use crate::graph::Context;

    const S: usize = 16 * 16 * 4; // bytes of one [16, 16] f32 activation

    fn plan_of(ctx: &Context, g: &Graph) -> (Plan, Bindings) {
        let pre = params_in_pre(ctx);
        let p = plan(g, &pre, 32, &|t: &TensorDesc| t.nbytes()).unwrap();
        check_plan(g, &pre, &p, 32);
        (p, pre)
    }

    fn overlaps(p: &Plan, a: TensorId, b: TensorId) -> bool {
        let (oa, ob) = (p.offset(a).unwrap(), p.offset(b).unwrap());
        oa < ob + S && ob < oa + S
    }

    /// x → b → c → d through matmuls (never in place).
    #[test]
    fn chain_peaks_at_two_tensors() {
        let mut ctx = Context::new();
        let w = param(&mut ctx, "w", DType::F32, [16, 16]);
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        let b = ctx.mul_mat(w, x).unwrap();
        let c = ctx.mul_mat(w, b).unwrap();
        let d = ctx.mul_mat(w, c).unwrap();
        let g = ctx.build_forward(d).unwrap();
        let (p, _) = plan_of(&ctx, &g);
        let want = PlanStats {
            peak: 2 * S,
            total_tensor_bytes: 4 * S,
            liveness_bound: 2 * S,
            tensors: 4,
            in_place: 0,
        };
        assert_eq!(p.stats, want);
        assert_eq!(p.offsets, [(x, 0), (b, S), (c, 0), (d, S)]);
        assert_eq!(p.offset(w), None, "params in pre are left alone");
    }

    #[test]
    fn chain_in_place_peaks_at_one_tensor() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        let b = ctx.silu(x).unwrap();
        let c = ctx.scale(b, 2.0).unwrap();
        let d = ctx.rms_norm(c, 1e-5).unwrap();
        let g = ctx.build_forward(d).unwrap();
        let (p, _) = plan_of(&ctx, &g);
        assert_eq!((p.stats.peak, p.stats.liveness_bound), (S, S));
        assert_eq!((p.stats.in_place, p.stats.total_tensor_bytes), (3, 4 * S));
        assert!(p.offsets.iter().all(|&(_, o)| o == 0));
    }

    /// x → (a, b) → c = a + b: c runs in place of a; a, b and x are live together.
    #[test]
    fn diamond() {
        let mut ctx = Context::new();
        let w1 = param(&mut ctx, "w1", DType::F32, [16, 16]);
        let w2 = param(&mut ctx, "w2", DType::F32, [16, 16]);
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        let a = ctx.mul_mat(w1, x).unwrap();
        let b = ctx.mul_mat(w2, x).unwrap();
        let c = ctx.add(a, b).unwrap();
        let e = ctx.mul_mat(w1, c).unwrap();
        let g = ctx.build_forward(e).unwrap();
        let (p, _) = plan_of(&ctx, &g);
        assert_eq!((p.stats.peak, p.stats.liveness_bound), (3 * S, 3 * S));
        assert_eq!(p.stats.in_place, 1);
        assert_eq!(p.offset(c), p.offset(a));
        assert!(!overlaps(&p, a, b) && !overlaps(&p, x, a) && !overlaps(&p, x, b));
        assert_eq!(
            p.offset(e),
            p.offset(x),
            "e reuses the first freed block (x's)"
        );
    }

    #[test]
    fn outputs_and_inputs_are_never_reused() {
        let mut ctx = Context::new();
        let w = param(&mut ctx, "w", DType::F32, [16, 16]);
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        ctx.set_input(x).unwrap();
        let mut chain = vec![x];
        for i in 0..6 {
            let t = ctx.mul_mat(w, *chain.last().unwrap()).unwrap();
            if i == 1 {
                ctx.set_output(t).unwrap();
            }
            chain.push(t);
        }
        let extra = chain[4]; // an output by graph.outputs() only
        let g = ctx
            .build_forward_multi(&[*chain.last().unwrap(), extra])
            .unwrap();
        let (p, _) = plan_of(&ctx, &g);
        for kept in [x, chain[2], extra] {
            for &t in &chain {
                assert!(t == kept || !overlaps(&p, t, kept), "{t} reuses {kept}");
            }
        }
        // x, chain[2] and chain[4] are kept; at most two others live at once.
        assert_eq!(p.stats.liveness_bound, 5 * S);
        assert_eq!(p.stats.peak, 5 * S);
    }

    /// `a`'s only direct reader comes early; a transposed view of it is read last.
    #[test]
    fn views_keep_their_base_alive() {
        let mut ctx = Context::new();
        let w = param(&mut ctx, "w", DType::F32, [16, 16]);
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        let a = ctx.mul_mat(w, x).unwrap();
        let b = ctx.mul_mat(w, a).unwrap();
        let c = ctx.mul_mat(w, b).unwrap();
        let t = ctx.transpose(a).unwrap();
        let d = ctx.cont(t).unwrap();
        let out = ctx.add(c, d).unwrap();
        let g = ctx.build_forward(out).unwrap();
        assert_eq!(g.nodes(), &[a, b, c, t, d, out]);
        let (p, _) = plan_of(&ctx, &g);
        assert!(!overlaps(&p, a, b) && !overlaps(&p, a, c) && !overlaps(&p, a, d));
        assert_eq!(p.offset(t), None, "views get no offset");
        assert_eq!(p.offset(out), p.offset(c), "c dies at out: in place");
        assert_eq!(p.stats.liveness_bound, 3 * S);
    }

    #[test]
    fn in_place_only_when_legal() {
        let mut ctx = Context::new();
        let w = param(&mut ctx, "w", DType::F32, [16, 16]);
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        let a = ctx.mul_mat(w, x).unwrap();
        let b = ctx.silu(a).unwrap(); // a is read again by c: not in place
        let c = ctx.add(b, a).unwrap(); // b dies here: in place
        let r = ctx.view(c, [16], [64, 64, 64], 0).unwrap();
        let d = ctx.add(c, r).unwrap(); // src1 is a view of src0: not in place
        let e = ctx.swiglu(d, d).unwrap(); // GLU: never in place
        let f = ctx.mul_mat(w, e).unwrap(); // MUL_MAT: never in place
        let h = ctx.sum_rows(f).unwrap();
        let g = ctx.build_forward(h).unwrap();
        let (p, _) = plan_of(&ctx, &g);
        assert_ne!(p.offset(b), p.offset(a));
        assert_eq!(p.offset(c), p.offset(b));
        assert!(!overlaps(&p, d, c));
        assert!(!overlaps(&p, e, d) && !overlaps(&p, f, e));
        assert_eq!(p.stats.in_place, 1);
    }

    #[test]
    fn pre_placed_sources_are_not_overwritten() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
        let y = ctx.silu(x).unwrap();
        let g = ctx.build_forward(y).unwrap();
        let buft: std::sync::Arc<dyn crate::BufferType> =
            std::sync::Arc::new(crate::alloc::test_support::VecBufferType::new(32));
        let pre = buft.alloc_tensors_where(&ctx, |t| t.op().kind() == crate::OpKind::None);
        let pre = pre.unwrap().bindings().clone();
        let p = plan(&g, &pre, 32, &|t: &TensorDesc| t.nbytes()).unwrap();
        assert_eq!(p.offsets, [(y, 0)]);
        assert_eq!((p.stats.in_place, p.stats.peak), (0, S));
    }

    #[test]
    fn alignment_and_alloc_size_are_honoured() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [3]).unwrap();
        let y = ctx.sum_rows(x).unwrap();
        let z = ctx.sqr(y).unwrap();
        let g = ctx.build_forward(z).unwrap();
        let p = plan(&g, &Bindings::new(), 64, &|t: &TensorDesc| t.nbytes() + 100).unwrap();
        assert_eq!(p.offsets, [(x, 0), (y, 128), (z, 128)]);
        assert_eq!((p.stats.peak, p.stats.total_tensor_bytes), (256, 3 * 128));
    }

    #[test]
    fn same_shape_same_plan() {
        let build = |extra: bool| {
            let mut ctx = Context::new();
            if extra {
                ctx.new_tensor(DType::F32, [8]).unwrap();
            }
            let w = param(&mut ctx, "w", DType::F32, [16, 16]);
            let x = ctx.new_tensor(DType::F32, [16, 16]).unwrap();
            let a = ctx.mul_mat(w, x).unwrap();
            let b = ctx.silu(a).unwrap();
            let c = ctx.add(b, a).unwrap();
            let g = ctx.build_forward(c).unwrap();
            let p = plan_of(&ctx, &g).0;
            p.offsets.iter().map(|&(_, o)| o).collect::<Vec<_>>()
        };
        assert_eq!(build(false), build(false));
        assert_eq!(build(false), build(true), "ids shifted, same plan");
    }
}
