//! Mixture-of-experts split tests: the expert block of `build_moe_ffn` (router, top-k, gate/up
//! and down MUL_MAT_ID with per-expert biases, weighting, slot sum) under the tensor split
//! (every expert along `n_ff_exp`) and the expert split (whole experts per device), for 2–8
//! devices with uneven ratios and zero-length slices: states of every step and one all-reduce
//! per block, on its `n_embd·T` output.

use super::*;
use std::collections::HashMap;
use tessera::DType;
use tessera::TensorId;
use tessera::meta::*;
use tessera::ops::GluOp;
use tessera::{Context, Graph};

const N_EMBD: usize = 64;
const N_FF_EXP: usize = 64;
const T: usize = 5;

struct Moe {
    ctx: Context,
    graph: Graph,
    ids: HashMap<&'static str, TensorId>,
}

/// The expert block of layer 0 (`n_expert` experts, `n_used` per token), with gpt-oss biases
/// when `biases`, in `wtype` weights.
fn moe_block(n_expert: usize, n_used: usize, biases: bool, wtype: DType) -> Moe {
    let mut c = Context::new();
    let mut ids = HashMap::new();
    let x = c.new_named("x", DType::F32, [N_EMBD, T]).unwrap();
    let router = c
        .new_named("blk.0.ffn_gate_inp.weight", DType::F32, [N_EMBD, n_expert])
        .unwrap();
    let gate = c
        .new_named(
            "blk.0.ffn_gate_exps.weight",
            wtype,
            [N_EMBD, N_FF_EXP, n_expert],
        )
        .unwrap();
    let up = c
        .new_named(
            "blk.0.ffn_up_exps.weight",
            wtype,
            [N_EMBD, N_FF_EXP, n_expert],
        )
        .unwrap();
    let down = c
        .new_named(
            "blk.0.ffn_down_exps.weight",
            wtype,
            [N_FF_EXP, N_EMBD, n_expert],
        )
        .unwrap();
    let logits = c.mul_mat(router, x).unwrap();
    let probs = c.soft_max(logits).unwrap();
    let sel = c.top_k(probs, n_used).unwrap();
    let p3 = c.reshape(probs, [1, n_expert, T]).unwrap();
    let w = c.get_rows(p3, sel).unwrap();
    let cur = c.reshape(x, [N_EMBD, 1, T]).unwrap();
    let mut u = c.mul_mat_id(up, cur, sel).unwrap();
    let mut g = c.mul_mat_id(gate, cur, sel).unwrap();
    ids.insert("up", u);
    let act;
    let mut e;
    if biases {
        let gb = c
            .new_named("blk.0.ffn_gate_exps.bias", DType::F32, [N_FF_EXP, n_expert])
            .unwrap();
        let ub = c
            .new_named("blk.0.ffn_up_exps.bias", DType::F32, [N_FF_EXP, n_expert])
            .unwrap();
        u = c.add_id(u, ub, sel).unwrap();
        g = c.add_id(g, gb, sel).unwrap();
        ids.insert("up_b", u);
        act = c.swiglu_oai(g, u, 1.702, 7.0).unwrap();
        e = c.mul_mat_id(down, act, sel).unwrap();
        ids.insert("down", e);
        let db = c
            .new_named("blk.0.ffn_down_exps.bias", DType::F32, [N_EMBD, n_expert])
            .unwrap();
        e = c.add_id(e, db, sel).unwrap();
        ids.insert("down_b", e);
    } else {
        act = c.glu_split(g, u, GluOp::Swiglu).unwrap();
        e = c.mul_mat_id(down, act, sel).unwrap();
        ids.insert("down", e);
    }
    ids.insert("act", act);
    let weighted = c.mul(e, w).unwrap();
    ids.insert("weighted", weighted);
    let nb = c.tensor(weighted).unwrap().nb();
    let mut out = c
        .view(weighted, [N_EMBD, T], [nb[2], nb[2], nb[2]], 0)
        .unwrap();
    for i in 1..n_used {
        let s = c
            .view(weighted, [N_EMBD, T], [nb[2], nb[2], nb[2]], i * nb[1])
            .unwrap();
        out = c.add(out, s).unwrap();
    }
    if n_used == 1 {
        out = c.cont(out).unwrap();
    }
    ids.insert("out", out);
    // The residual: a non-linear consumer of the block's output.
    let res = c.add(out, x).unwrap();
    let res = c.rms_norm(res, 1e-6).unwrap();
    let graph = c.build_forward(res).unwrap();
    Moe { ctx: c, graph, ids }
}

fn policy(n: usize, ratios: &[f32], experts: ExpertSplit, m: &Moe) -> LlamaSplitPolicy {
    let mut p = LlamaSplitPolicy::new(n, 4, 4, 16, N_EMBD, N_FF_EXP, 1).with_expert_split(experts);
    p.ratios = ratios.to_vec();
    let named: Vec<(String, TensorDesc)> = m
        .ctx
        .tensors()
        .iter()
        .filter(|t| t.name().starts_with("blk."))
        .map(|t| (t.name().to_string(), t.clone()))
        .collect();
    p.learn_partner_blocks(&named);
    p
}

fn state_of(p: &LlamaSplitPolicy, m: &Moe, name: &str) -> SplitState {
    let d = m.ctx.tensors().iter().find(|t| t.name() == name).unwrap();
    p.state_for(name, d).unwrap()
}

fn run(p: &LlamaSplitPolicy, m: &Moe) -> tessera::Result<Vec<Option<NodeStates>>> {
    let cb = |id: TensorId| {
        let d = m.ctx.tensor(id).ok()?;
        d.name()
            .starts_with("blk.")
            .then(|| p.state_for(d.name(), d).unwrap())
    };
    propagate(&m.graph, &cb)
}

/// Ratio sets over `n` devices: even, uneven, and with a device of ratio 0 (zero-length slices).
fn ratio_sets(n: usize) -> Vec<Vec<f32>> {
    let uneven: Vec<f32> = (0..n).map(|j| [5.0, 1.0, 3.0, 2.0][j % 4]).collect();
    let mut zero = uneven.clone();
    zero[n / 2] = 0.0;
    vec![Vec::new(), uneven, zero]
}

fn check(n: usize, ratios: &[f32], experts: ExpertSplit, biases: bool, wtype: DType) {
    let m = moe_block(8, 2, biases, wtype);
    let p = policy(n, ratios, experts, &m);
    let ctx = format!("{n} devices, ratios {ratios:?}, {experts:?}, biases {biases}, {wtype}");
    let st = run(&p, &m).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let own = |k: &str| st[m.ids[k].index()].as_ref().unwrap().own.clone();
    let by_expert = p.experts_by_expert(Some(0), 8, N_FF_EXP, wtype.block_size());
    let stack = state_of(&p, &m, "blk.0.ffn_up_exps.weight");
    if by_expert {
        assert_eq!(stack.split_axis(), Some(2), "{ctx}");
        assert_eq!(own("up").kind(), SplitKind::Routed, "{ctx}");
        assert_eq!(own("act").kind(), SplitKind::Routed, "{ctx}");
        assert_eq!(own("up").local_lens(), stack.local_lens(), "{ctx}");
    } else {
        assert_eq!(stack.split_axis(), Some(1), "{ctx}");
        assert_eq!(own("up").split_axis(), Some(0), "{ctx}");
        assert_eq!(own("act").split_axis(), Some(0), "{ctx}");
        assert_eq!(own("up").local_lens(), stack.local_lens(), "{ctx}");
        // Granularity: every piece of a quantized stack holds whole blocks.
        let blk = wtype.block_size();
        assert!(stack.local_lens().iter().all(|l| l % blk == 0), "{ctx}");
    }
    for k in ["down", "weighted", "out"] {
        assert!(own(k).is_partial(), "{ctx}: {k} is {}", own(k));
    }
    if biases {
        assert!(own("down_b").is_partial(), "{ctx}");
    }
    // One all-reduce for the block, after the weighted sum over the slots (n_embd·T values).
    let reduces = reduce_points(&m.graph, &st);
    assert_eq!(reduces, vec![m.ids["out"]], "{ctx}");
    assert_eq!(
        m.graph.tensor(reduces[0]).unwrap().nelements(),
        N_EMBD * T,
        "{ctx}"
    );
}

#[test]
fn expert_blocks_reduce_once_for_2_to_8_devices() {
    for n in 2..=8 {
        for ratios in ratio_sets(n) {
            for experts in [ExpertSplit::Tensor, ExpertSplit::Expert] {
                for biases in [false, true] {
                    check(n, &ratios, experts, biases, DType::F32);
                }
                check(n, &ratios, experts, false, DType::Q8_0);
            }
        }
    }
}

#[test]
fn zero_length_slices_keep_the_block_linear() {
    // Device 1 gets no share: an empty n_ff_exp slice (tensor) or no experts (expert).
    for experts in [ExpertSplit::Tensor, ExpertSplit::Expert] {
        let m = moe_block(8, 2, true, DType::F32);
        let p = policy(3, &[1.0, 0.0, 1.0], experts, &m);
        let s = state_of(&p, &m, "blk.0.ffn_down_exps.weight");
        assert_eq!(s.local_len(1), 0, "{experts:?}: {s}");
        let st = run(&p, &m).unwrap();
        assert_eq!(reduce_points(&m.graph, &st), vec![m.ids["out"]]);
        let j1 = local_tensors(&m.graph, &st, 1).unwrap();
        let down = &j1[m.ids["down"].index()];
        // The down output keeps its full shape (a zero addend), so the reduce may sum it.
        assert_eq!(down.ne(), m.graph.tensor(m.ids["down"]).unwrap().ne());
        if experts == ExpertSplit::Expert {
            assert_eq!(
                *down.op(),
                tessera::ops::Op::MulMatId {
                    first_expert: Some(s.local_len(0))
                }
            );
        }
    }
}

#[test]
fn expert_split_gives_each_device_its_own_expert_range() {
    let m = moe_block(8, 2, false, DType::F32);
    let p = policy(3, &[5.0, 1.0, 3.0], ExpertSplit::Expert, &m);
    let st = run(&p, &m).unwrap();
    let lens = state_of(&p, &m, "blk.0.ffn_gate_exps.weight").local_lens();
    assert_eq!(lens.iter().sum::<usize>(), 8);
    let mut first = 0;
    for (j, &l) in lens.iter().enumerate() {
        let local = local_tensors(&m.graph, &st, j).unwrap();
        for k in ["up", "down"] {
            assert_eq!(
                *local[m.ids[k].index()].op(),
                tessera::ops::Op::MulMatId {
                    first_expert: Some(first)
                },
                "device {j} {k}"
            );
        }
        first += l;
    }
    // The tensor split leaves the op in its plain form.
    let p = policy(3, &[5.0, 1.0, 3.0], ExpertSplit::Tensor, &m);
    let st = run(&p, &m).unwrap();
    let local = local_tensors(&m.graph, &st, 1).unwrap();
    assert_eq!(
        *local[m.ids["up"].index()].op(),
        tessera::ops::Op::MulMatId { first_expert: None }
    );
}

#[test]
fn the_per_layer_choice_prefers_the_cheaper_split() {
    let m = moe_block(8, 2, false, DType::F32);
    // 8 experts over 2 devices: 4 + 4, as even as the width split.
    let p = policy(2, &[], ExpertSplit::Expert, &m);
    assert!(p.experts_by_expert(Some(0), 8, N_FF_EXP, 1));
    assert_eq!(p.describe_experts(), "experts (expert split): EP layers 0");
    // Fewer experts than devices: some device would idle, the width split is kept.
    let p8 = policy(8, &[], ExpertSplit::Expert, &m);
    assert!(!p8.experts_by_expert(Some(0), 4, N_FF_EXP, 1));
    // 8 experts over 3 devices: the busiest gets 3/8 of the experts against 22/64 of the width.
    let p3 = policy(3, &[], ExpertSplit::Expert, &m);
    assert!(!p3.experts_by_expert(Some(0), 8, N_FF_EXP, 1));
    assert_eq!(p3.describe_experts(), "experts (expert split): TP layers 0");
    // The tensor mode never splits whole experts.
    let pt = policy(2, &[], ExpertSplit::Tensor, &m);
    assert!(!pt.experts_by_expert(Some(0), 8, N_FF_EXP, 1));
}

#[test]
fn a_routed_value_feeds_only_elementwise_ops_and_the_down_matmul() {
    let mut c = Context::new();
    let x = c.new_named("x", DType::F32, [N_EMBD, 1, T]).unwrap();
    let sel = c.new_named("sel", DType::I32, [2, T]).unwrap();
    let up = c
        .new_named(
            "blk.0.ffn_up_exps.weight",
            DType::F32,
            [N_EMBD, N_FF_EXP, 4],
        )
        .unwrap();
    let u = c.mul_mat_id(up, x, sel).unwrap();
    let bad = c.soft_max(u).unwrap();
    let g = c.build_forward(bad).unwrap();
    let st = SplitState::axis_lens(2, vec![2, 2]).unwrap();
    let err = propagate(&g, &|id| (id == up).then(|| st.clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("SOFT_MAX") && err.contains("R(2,2)"), "{err}");

    // Ids split anyhow, or an A2 stack cut into several ranges per device, are errors.
    let g = c.build_forward(u).unwrap();
    let err = propagate(&g, &|id| {
        (id == sel).then(|| SplitState::axis_lens(1, vec![2, 3]).unwrap())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("MUL_MAT_ID") && err.contains("ids"), "{err}");
    let two = SplitState::axis(2, vec![Segment::new(vec![1, 1], 2)], 4).unwrap();
    let err = propagate(&g, &|id| (id == up).then(|| two.clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("contiguous range"), "{err}");
}
