//! Liveness of a graph's tensors: which tensors the plan must place, the step each is allocated
//! at and the last step that reads or writes it, which are never freed, and which nodes may run
//! in place of their first source.
//!
//! Steps: step 0 allocates leaves and every other tensor no node of the graph produces; step
//! `k + 1` runs node `k`. A tensor is live from its allocation step through its last use
//! inclusive (or to the end when it is kept). Uses follow views: reading or writing a view (or a
//! CPY / SET_ROWS result, which is a view of its destination) uses the view's storage root.

use crate::backend::Bindings;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::OpKind;
use crate::tensor::{TensorDesc, TensorId};

/// One tensor the plan places.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Planned {
    /// The tensor (never a view).
    pub(crate) id: TensorId,
    /// Bytes reserved, a multiple of the alignment (0 only for zero-byte tensors).
    pub(crate) size: usize,
    /// Step it is allocated at.
    pub(crate) start: usize,
    /// Last step it is live at; `None` when it is kept to the end (input, output, param).
    pub(crate) end: Option<usize>,
    /// Index (in [`Liveness::planned`]) of the source whose memory this node takes over.
    pub(crate) in_place_of: Option<usize>,
}

/// Result of [`analyse`].
#[derive(Clone, Debug)]
pub(crate) struct Liveness {
    /// Number of steps: nodes + 1.
    pub(crate) steps: usize,
    /// Tensors to place, in allocation order (by start step; at step 0 kept tensors first, then
    /// longer-lived ones, then by id). Zero-byte tensors have `size` 0.
    pub(crate) planned: Vec<Planned>,
}

/// Where a tensor's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Already placed in the caller's bindings (itself or a tensor its view chain reaches).
    Pre,
    /// The non-view tensor at the end of its view chain, not placed in the bindings.
    Root(TensorId),
}

/// Ops that may write their result over their first source (row-wise, same shape; the CPU
/// kernels stage each row before writing it).
pub fn can_run_in_place(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Div
            | OpKind::Scale
            | OpKind::Sqr
            | OpKind::Sqrt
            | OpKind::Clamp
            | OpKind::Unary
            | OpKind::RmsNorm
            | OpKind::Norm
            | OpKind::SoftMax
            | OpKind::Rope
            | OpKind::Cont
    )
}

fn check_id(tensors: &[TensorDesc], id: TensorId) -> Result<()> {
    if id.index() < tensors.len() {
        Ok(())
    } else {
        Err(Error::UnknownTensor {
            id: id.index(),
            len: tensors.len(),
        })
    }
}

fn owner_of(tensors: &[TensorDesc], pre: &Bindings, id: TensorId) -> Result<Owner> {
    let mut cur = id;
    // Views point to tensors created before them, so the chain ends within `tensors.len()` hops.
    for _ in 0..=tensors.len() {
        check_id(tensors, cur)?;
        if pre.slot(cur).is_some() {
            return Ok(Owner::Pre);
        }
        match tensors[cur.index()].view_of() {
            Some(v) => cur = v.src,
            None => return Ok(Owner::Root(cur)),
        }
    }
    Err(Error::InvalidArgument(format!(
        "view chain of tensor {id} does not end"
    )))
}

/// Per-tensor facts gathered while walking the graph.
#[derive(Clone, Copy, Default)]
struct Facts {
    touched: bool,
    produced_at: Option<usize>,
    first: usize,
    last: usize,
    keep: bool,
}

/// Computes what to place and when. `size` gives the aligned bytes of a tensor (`None` on
/// overflow).
pub(crate) fn analyse(
    graph: &Graph,
    pre: &Bindings,
    size: &dyn Fn(&TensorDesc) -> Option<usize>,
) -> Result<Liveness> {
    let tensors = graph.tensors();
    let steps = graph.nodes().len() + 1;
    let mut facts = vec![Facts::default(); tensors.len()];
    let mut owners: Vec<Option<Owner>> = vec![None; tensors.len()];
    let mut owner = |id: TensorId| -> Result<Owner> {
        check_id(tensors, id)?;
        if let Some(o) = owners[id.index()] {
            return Ok(o);
        }
        let o = owner_of(tensors, pre, id)?;
        owners[id.index()] = Some(o);
        Ok(o)
    };
    let use_at = |facts: &mut [Facts], o: Owner, step: usize, keep: bool| {
        if let Owner::Root(r) = o {
            let f = &mut facts[r.index()];
            if !f.touched {
                *f = Facts {
                    touched: true,
                    produced_at: None,
                    first: step,
                    last: step,
                    keep: false,
                };
            }
            f.first = f.first.min(step);
            f.last = f.last.max(step);
            f.keep |= keep;
        }
    };
    let kept = |t: &TensorDesc| {
        let fl = t.flags();
        fl.input || fl.output || fl.param
    };
    for &id in graph.leafs() {
        let o = owner(id)?;
        use_at(&mut facts, o, 0, kept(&tensors[id.index()]));
    }
    for (k, &id) in graph.nodes().iter().enumerate() {
        let step = k + 1;
        let o = owner(id)?;
        let t = &tensors[id.index()];
        use_at(&mut facts, o, step, kept(t));
        if o == Owner::Root(id) {
            let f = &mut facts[id.index()];
            f.produced_at = Some(f.produced_at.map_or(step, |p| p.min(step)));
        }
        for s in t.srcs() {
            let so = owner(s)?;
            use_at(&mut facts, so, step, kept(&tensors[s.index()]));
        }
    }
    for &id in graph.outputs() {
        if let Owner::Root(r) = owner(id)?
            && facts[r.index()].touched
        {
            facts[r.index()].keep = true;
        }
    }

    // Start: the producing step (or an earlier use, for a badly ordered node list), else 0.
    let mut planned = Vec::new();
    let mut slot_of = vec![usize::MAX; tensors.len()];
    for (i, f) in facts.iter().enumerate() {
        if !f.touched {
            continue;
        }
        let id = TensorId::from_index(i);
        let t = &tensors[i];
        let start = f.produced_at.map_or(0, |p| p.min(f.first));
        let bytes = size(t).ok_or_else(|| {
            Error::InvalidArgument(format!("size of tensor {} overflows", graph.label(id)))
        })?;
        let p = Planned {
            id,
            size: bytes,
            start,
            end: (!f.keep).then_some(f.last),
            in_place_of: None,
        };
        planned.push(if t.nbytes() == 0 {
            Planned { size: 0, ..p }
        } else {
            p
        });
    }
    planned.sort_by_key(|p| {
        let kept_first = p.end.is_some();
        let longer_first = std::cmp::Reverse(p.end.unwrap_or(usize::MAX));
        (p.start, kept_first, longer_first, p.id)
    });
    for (j, p) in planned.iter().enumerate() {
        slot_of[p.id.index()] = j;
    }

    // In place: node `k` takes over src0 when src0 dies at this very step.
    for (k, &id) in graph.nodes().iter().enumerate() {
        let step = k + 1;
        let t = &tensors[id.index()];
        let (Some(src0), j) = (t.src(0), slot_of[id.index()]) else {
            continue;
        };
        if j == usize::MAX
            || planned[j].size == 0
            || planned[j].start != step
            || !can_run_in_place(t.op().kind())
        {
            continue;
        }
        let i = slot_of[src0.index()];
        if i == usize::MAX || owner(src0)? != Owner::Root(src0) {
            continue;
        }
        let s = &tensors[src0.index()];
        let mut aliased = false;
        for other in t.srcs().skip(1) {
            aliased |= owner(other)? == Owner::Root(src0);
        }
        let legal = planned[i].end == Some(step)
            && planned[i].start < step
            && !aliased
            && s.dtype() == t.dtype()
            && s.nbytes() == t.nbytes()
            && planned[i].size == planned[j].size
            && s.is_contiguous()
            && t.is_contiguous();
        if legal {
            planned[j].in_place_of = Some(i);
        }
    }
    Ok(Liveness { steps, planned })
}

/// The largest sum of sizes of tensors live at one step; a node running in place of its source
/// counts once at the step it takes the memory over.
pub(crate) fn liveness_bound(l: &Liveness) -> usize {
    let mut add = vec![0u128; l.steps + 1];
    let mut sub = vec![0u128; l.steps + 1];
    for p in &l.planned {
        let begin = p.start + usize::from(p.in_place_of.is_some());
        let stop = p.end.unwrap_or(l.steps - 1);
        if begin <= stop {
            add[begin] += p.size as u128;
            sub[stop] += p.size as u128;
        }
    }
    let (mut live, mut best) = (0u128, 0u128);
    for s in 0..l.steps {
        live += add[s];
        best = best.max(live);
        live -= sub[s];
    }
    usize::try_from(best).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::Context;

    fn analyse_plain(g: &Graph, pre: &Bindings) -> Liveness {
        analyse(g, pre, &|t: &TensorDesc| Some(t.nbytes())).unwrap()
    }

    fn find(l: &Liveness, id: TensorId) -> &Planned {
        l.planned.iter().find(|p| p.id == id).unwrap()
    }

    #[test]
    fn lifetimes_follow_views_and_copies() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [8, 8]).unwrap();
        let a = ctx.silu(x).unwrap(); // step 1
        let b = ctx.sqr(a).unwrap(); // step 2
        let c = ctx.sqr(b).unwrap(); // step 3
        let h = ctx.cast(c, DType::F16).unwrap(); // leaf dst + step 4 (CPY into it)
        let e = ctx.cast(h, DType::F32).unwrap(); // step 5 reads the copy target
        let t = ctx.transpose(a).unwrap(); // step 6: a view of a
        let d = ctx.cont(t).unwrap(); // step 7: reads a through the view
        let out = ctx.add(e, d).unwrap(); // step 8
        let g = ctx.build_forward(out).unwrap();
        let cpy_h = g.tensors()[h.index()].view_of().unwrap().src;
        assert_eq!(g.nodes(), &[a, b, c, h, e, t, d, out]);
        assert!(g.leafs().contains(&cpy_h));
        let l = analyse_plain(&g, &Bindings::new());
        assert_eq!(l.steps, 9);
        let step = |id| g.nodes().iter().position(|&n| n == id).unwrap() + 1;
        assert_eq!(find(&l, a).start, step(a));
        assert_eq!(
            find(&l, a).end,
            Some(step(d)),
            "the view's reader keeps a alive"
        );
        let h_dst = g.tensors()[h.index()].view_of().unwrap().src;
        assert_eq!(
            find(&l, h_dst).start,
            0,
            "a leaf copy target is allocated up front"
        );
        assert_eq!(
            find(&l, h_dst).end,
            Some(step(e)),
            "read through the CPY result"
        );
        assert_eq!(find(&l, out).end, None, "outputs are kept");
        assert!(
            l.planned
                .iter()
                .all(|p| !g.tensors()[p.id.index()].is_view())
        );
        // b → c runs in place (b dies at c); a → b does not (a is read later through the view).
        assert!(find(&l, c).in_place_of.is_some());
        assert!(find(&l, b).in_place_of.is_none());
        assert_eq!(find(&l, x).end, Some(step(a)));
    }

    #[test]
    fn tensors_in_pre_and_flags() {
        let mut ctx = Context::new();
        let w = ctx.new_tensor(DType::F32, [8, 8]).unwrap();
        let x = ctx.new_tensor(DType::F32, [8, 2]).unwrap();
        ctx.set_input(x).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let v = ctx.view(y, [8], [32, 32, 32], 0).unwrap();
        ctx.set_output(v).unwrap();
        let z = ctx.scale(y, 2.0).unwrap();
        let g = ctx.build_forward_multi(&[z, v]).unwrap();
        let buft: std::sync::Arc<dyn crate::BufferType> =
            std::sync::Arc::new(crate::alloc::test_support::VecBufferType::new(16));
        let pre = buft
            .alloc_tensors_where(&ctx, |t| {
                t.op().kind() == OpKind::None && t.flags() == Default::default()
            })
            .unwrap();
        let l = analyse_plain(&g, pre.bindings());
        let ids: Vec<_> = l.planned.iter().map(|p| p.id).collect();
        assert_eq!(ids, [x, y, z], "w is in pre; views are never planned");
        assert_eq!(find(&l, x).end, None, "inputs are kept");
        assert_eq!(find(&l, y).end, None, "an output view keeps its base");
        assert!(
            find(&l, z).in_place_of.is_none(),
            "a kept source is never overwritten"
        );
        assert_eq!(liveness_bound(&l), 3 * 64);
    }

    #[test]
    fn bound_counts_in_place_pairs_once() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [16]).unwrap();
        let mut cur = x;
        for _ in 0..4 {
            cur = ctx.sqr(cur).unwrap();
        }
        let g = ctx.build_forward(cur).unwrap();
        let l = analyse_plain(&g, &Bindings::new());
        assert_eq!(
            l.planned.iter().filter(|p| p.in_place_of.is_some()).count(),
            4
        );
        assert_eq!(liveness_bound(&l), 64);
    }
}
