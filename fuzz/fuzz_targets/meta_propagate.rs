//! Split-state propagation of the meta device on random graphs: leaves of random shapes and
//! dtypes with random static states (mirrored, partial, axis splits of one or more segments,
//! some that do not fit), random ops built through the `Context` API (invalid ones are skipped
//! as the builder refuses them), then `propagate`. The result is a typed error or a plan whose
//! every state fits its tensor, whose reduce points are PARTIAL nodes of the graph, and whose
//! axis states give every device a slice layout.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::meta::ratio::split_lengths;
use tessera::meta::{Segment, SplitKind, SplitState, propagate, reduce_points, slice_desc};
use tessera::{Context, DType, GluOp, RopeMode, RopeParams, TensorId, UnaryOp};

const DIMS: [usize; 8] = [1, 2, 3, 4, 8, 32, 64, 256];

#[derive(Arbitrary, Debug)]
enum State {
    Mirrored,
    Partial,
    /// An axis split by ratios (valid by construction).
    Ratios {
        axis: u8,
        ratios: Vec<u8>,
        rotation: u8,
    },
    /// An axis split by raw segments (lengths and repeats straight from the input).
    Segments {
        axis: u8,
        segments: Vec<(Vec<u8>, u8)>,
    },
}

#[derive(Arbitrary, Debug)]
struct Leaf {
    dtype: u8,
    ne: [u8; 4],
    state: Option<State>,
}

#[derive(Arbitrary, Debug)]
struct OpSpec {
    kind: u8,
    a: u8,
    b: u8,
    c: u8,
    d: u8,
    x: u8,
    f: f32,
}

#[derive(Arbitrary, Debug)]
struct Input {
    n_devices: u8,
    leaves: Vec<Leaf>,
    ops: Vec<OpSpec>,
    outputs: u8,
}

fn dtype(b: u8) -> DType {
    [
        DType::F32,
        DType::F16,
        DType::Q8_0,
        DType::I32,
        DType::BF16,
        DType::Q4_K,
    ][usize::from(b) % 6]
}

fn state(s: &State, ne: &[usize; 4], n: usize) -> Option<SplitState> {
    Some(match s {
        State::Mirrored => SplitState::mirrored(),
        State::Partial => SplitState::partial(),
        State::Ratios {
            axis,
            ratios,
            rotation,
        } => {
            let axis = usize::from(*axis) % 4;
            let r: Vec<f32> = ratios.iter().take(n).map(|&r| f32::from(r)).collect();
            let r = if r.len() == n { r } else { Vec::new() };
            let lens = split_lengths(ne[axis], n, &r, 1, usize::from(*rotation)).ok()?;
            SplitState::axis_lens(axis, lens).ok()?
        }
        State::Segments { axis, segments } => {
            let segs = segments
                .iter()
                .take(4)
                .map(|(l, r)| {
                    Segment::new(l.iter().map(|&x| usize::from(x)).collect(), usize::from(*r))
                })
                .collect();
            let axis = usize::from(*axis) % 4;
            SplitState::axis(axis, segs, ne[axis]).ok()?
        }
    })
    // A meta device's policy gives every static state its device count.
    .filter(|s| s.n_devices().is_none_or(|d| d == n))
}

fn build(ctx: &mut Context, ids: &[TensorId], o: &OpSpec) -> Option<TensorId> {
    let pick = |i: u8| ids[usize::from(i) % ids.len()];
    let (a, b, c) = (pick(o.a), pick(o.b), pick(o.c));
    let unary = [
        UnaryOp::Silu,
        UnaryOp::Gelu,
        UnaryOp::GeluQuick,
        UnaryOp::Relu,
        UnaryOp::Tanh,
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Sigmoid,
    ];
    let shape = [
        DIMS[usize::from(o.d) % 8],
        DIMS[usize::from(o.d / 8) % 8],
        DIMS[usize::from(o.x) % 8],
        1,
    ];
    let r = match o.kind % 32 {
        0 => ctx.add(a, b),
        1 => ctx.sub(a, b),
        2 => ctx.mul(a, b),
        3 => ctx.div(a, b),
        4 => ctx.scale(a, o.f),
        5 => ctx.scale_bias(a, o.f, 1.0),
        6 => ctx.sqr(a),
        7 => ctx.sqrt(a),
        8 => ctx.unary(a, unary[usize::from(o.x) % 8]),
        9 => ctx.rms_norm(a, 1e-5),
        10 => ctx.norm(a, 1e-5),
        11 => ctx.mul_mat(a, b),
        12 => ctx.soft_max(a),
        13 => ctx.soft_max_ext(a, Some(b), 0.5, 0.0),
        14 => ctx.get_rows(a, b),
        15 => ctx.cont(a),
        16 => ctx.transpose(a),
        17 => ctx.reshape(a, shape),
        18 => {
            let p = [
                [0, 1, 2, 3],
                [1, 0, 2, 3],
                [0, 2, 1, 3],
                [2, 1, 0, 3],
                [0, 1, 3, 2],
            ];
            ctx.permute(a, p[usize::from(o.x) % 5])
        }
        19 => {
            // The source's own strides: a window of rows, columns or planes of it.
            let nb = ctx.tensor(a).ok()?.nb();
            ctx.view(a, shape, [nb[1], nb[2], nb[3]], usize::from(o.x) * 4)
        }
        20 => ctx.cpy(a, b),
        21 => ctx.concat(a, b, usize::from(o.x) % 4),
        22 => ctx.glu(a, GluOp::Swiglu, o.x & 1 == 1),
        23 => ctx.swiglu(a, b),
        24 => ctx.rope(
            a,
            b,
            RopeParams {
                n_dims: DIMS[usize::from(o.x) % 8],
                mode: if o.d & 1 == 0 {
                    RopeMode::Normal
                } else {
                    RopeMode::Neox
                },
                freq_base: 10000.0,
                freq_scale: 1.0,
            },
        ),
        25 => ctx.sum_rows(a),
        26 => ctx.argmax(a),
        27 => ctx.set_rows(a, b, c),
        28 => ctx.flash_attn_ext(a, b, c, None, 0.125, 0.0, 0.0),
        29 => ctx.mul_mat_id(a, b, c),
        30 => ctx.add_id(a, b, c),
        _ => ctx.cast(a, dtype(o.x)),
    };
    r.ok()
}

fuzz_target!(|inp: Input| {
    let n = 1 + usize::from(inp.n_devices) % 4;
    let mut ctx = Context::new();
    let mut ids = Vec::new();
    let mut statics = Vec::new();
    for leaf in inp.leaves.iter().take(8) {
        let ne = leaf.ne.map(|d| DIMS[usize::from(d) % 8]);
        let ne = [ne[0], ne[1], ne[2] % 4, 1].map(|d| d.max(1));
        let Ok(id) = ctx.new_tensor(dtype(leaf.dtype), ne) else {
            continue;
        };
        ids.push(id);
        if let Some(s) = leaf.state.as_ref().and_then(|s| state(s, &ne, n)) {
            statics.push((id, s));
        }
    }
    if ids.is_empty() {
        return;
    }
    for o in inp.ops.iter().take(24) {
        if let Some(id) = build(&mut ctx, &ids, o) {
            ids.push(id);
        }
    }
    let k = 1 + usize::from(inp.outputs) % 3;
    let outs: Vec<TensorId> = ids.iter().rev().take(k).copied().collect();
    let Ok(graph) = ctx.build_forward_multi(&outs) else {
        return;
    };
    let lookup = |id: TensorId| {
        statics
            .iter()
            .find(|(t, _)| *t == id)
            .map(|(_, s)| s.clone())
    };
    let Ok(states) = propagate(&graph, &lookup) else {
        return;
    };
    assert_eq!(states.len(), graph.tensors().len());
    for &id in graph.nodes().iter().chain(graph.leafs()) {
        let st = states[id.index()]
            .as_ref()
            .expect("every graph tensor has a state");
        let desc = graph.tensor(id).expect("a graph tensor");
        for s in [&st.own, &st.seen] {
            if let SplitKind::Axis(a) = s.kind() {
                assert_eq!(s.total_len(), desc.ne()[a], "{}: {s}", graph.label(id));
                assert_eq!(s.n_devices(), Some(n), "{}: {s}", graph.label(id));
                if desc.is_contiguous() && s == &st.own {
                    for j in 0..n {
                        let _ = slice_desc(desc, s, j);
                    }
                }
            }
        }
    }
    for r in reduce_points(&graph, &states) {
        assert!(graph.nodes().contains(&r));
        assert!(
            states[r.index()]
                .as_ref()
                .is_some_and(|s| s.own.is_partial())
        );
    }
});
