//! Policy and propagation tests: a llama block built with the Context API, checked against the
//! dataflow table of meta-device.md §13.

use super::*;
use std::collections::HashMap;
use tessera::DType;
use tessera::Error;
use tessera::meta::*;
use tessera::ops::{RopeMode, RopeParams};
use tessera::{Context, Graph};
use tessera::{TensorDesc, TensorId};

const T: usize = 4;
const N_CTX: usize = 16;
const N_KV: usize = 8;

fn policy(n: usize, n_head: usize, n_head_kv: usize) -> LlamaSplitPolicy {
    let hd = 32;
    LlamaSplitPolicy::new(n, n_head, n_head_kv, hd, n_head * hd, 256, 2)
}

/// llama-style weights and caches of `n_layer` layers.
fn weights(p: &LlamaSplitPolicy, wtype: DType, fused: bool) -> Vec<(String, TensorDesc)> {
    let mut ctx = Context::new();
    let (e, q) = (p.n_embd, p.n_head * p.head_dim);
    let kv = p.n_head_kv * p.head_dim;
    let mut shapes: Vec<(String, DType, [usize; 2])> = vec![
        ("token_embd.weight".into(), DType::F16, [e, 100]),
        ("output_norm.weight".into(), DType::F32, [e, 1]),
        ("output.weight".into(), wtype, [e, 100]),
    ];
    for i in 0..p.n_layer {
        let b = |s: &str| format!("blk.{i}.{s}");
        shapes.push((b("attn_norm.weight"), DType::F32, [e, 1]));
        if fused {
            shapes.push((b("attn_qkv.weight"), wtype, [e, q + 2 * kv]));
            shapes.push((b("ffn_gate_up.weight"), wtype, [e, 2 * p.n_ff]));
        } else {
            shapes.push((b("attn_q.weight"), wtype, [e, q]));
            shapes.push((b("attn_k.weight"), wtype, [e, kv]));
            shapes.push((b("attn_v.weight"), wtype, [e, kv]));
            shapes.push((b("attn_q.bias"), DType::F32, [q, 1]));
            shapes.push((b("ffn_gate.weight"), wtype, [e, p.n_ff]));
            shapes.push((b("ffn_up.weight"), wtype, [e, p.n_ff]));
        }
        shapes.push((b("attn_q_norm.weight"), DType::F32, [p.head_dim, 1]));
        shapes.push((b("attn_output.weight"), wtype, [q, e]));
        shapes.push((b("attn_output.bias"), DType::F32, [e, 1]));
        shapes.push((b("ffn_norm.weight"), DType::F32, [e, 1]));
        shapes.push((b("ffn_down.weight"), wtype, [p.n_ff, e]));
        shapes.push((format!("cache_k.{i}"), DType::F16, [kv, N_CTX]));
        shapes.push((format!("cache_v_l{i}"), DType::F16, [kv, N_CTX]));
    }
    shapes
        .into_iter()
        .map(|(name, dt, ne)| {
            let id = ctx.new_named(&name, dt, ne).unwrap();
            (name, ctx.tensor(id).unwrap().clone())
        })
        .collect()
}

fn states_by_name(p: &LlamaSplitPolicy, ws: &[(String, TensorDesc)]) -> HashMap<String, String> {
    ws.iter()
        .map(|(n, d)| (n.clone(), p.state_for(n, d).unwrap().to_string()))
        .collect()
}

fn check_totals(p: &LlamaSplitPolicy, ws: &[(String, TensorDesc)]) {
    let per = p.per_device_bytes(ws).unwrap();
    let mut want = 0;
    for (n, d) in ws {
        let full = d.dtype().row_size(d.ne()[0]).unwrap() * d.nrows();
        let s = p.state_for(n, d).unwrap();
        want += if s.split_axis().is_some() {
            full
        } else {
            full * p.n_devices
        };
    }
    assert_eq!(per.iter().sum::<usize>(), want);
}

#[test]
fn policy_gqa_states_and_totals() {
    // 8 heads, 2 KV heads, head_dim 32: n_gqa·head_dim = 128.
    let mut p = policy(2, 8, 2);
    let ws = weights(&p, DType::Q8_0, false);
    p.learn_partner_blocks(&ws);
    let s = states_by_name(&p, &ws);
    for (name, want) in [
        ("token_embd.weight", "M"),
        ("output_norm.weight", "M"),
        ("output.weight", "A1(50,50)"),
        ("blk.0.attn_norm.weight", "M"),
        ("blk.0.attn_q.weight", "A1(128,128)"),
        ("blk.0.attn_q.bias", "A0(128,128)"),
        ("blk.0.attn_k.weight", "A1(32,32)"),
        ("blk.0.attn_q_norm.weight", "M"),
        ("blk.0.attn_output.weight", "A0(128,128)"),
        ("blk.0.attn_output.bias", "M"),
        ("blk.0.ffn_gate.weight", "A1(128,128)"),
        ("blk.1.ffn_up.weight", "A1(128,128)"),
        ("blk.1.ffn_down.weight", "A0(128,128)"),
        ("cache_k.0", "A0(32,32)"),
        ("cache_v_l1", "A0(32,32)"),
    ] {
        assert_eq!(s[name], want, "{name}");
    }
    check_totals(&p, &ws);

    // N = 3: two KV groups over three devices; the zero slice rotates with the layer.
    let mut p3 = policy(3, 8, 2);
    p3.learn_partner_blocks(&ws);
    let s3 = states_by_name(&p3, &ws);
    assert_eq!(s3["blk.0.attn_q.weight"], "A1(0,128,128)");
    assert_eq!(s3["blk.0.attn_k.weight"], "A1(0,32,32)");
    assert_eq!(s3["cache_k.0"], "A0(0,32,32)");
    assert_eq!(s3["blk.1.attn_q.weight"], "A1(128,0,128)");
    assert_eq!(s3["blk.1.attn_output.weight"], "A0(128,0,128)");
    assert_eq!(s3["cache_v_l1"], "A0(32,0,32)");
    // The FFN keeps only ffn_down's Q8_0 blocks (32) whole: 256 = 64 + 96 + 96.
    assert_eq!(s3["blk.0.ffn_down.weight"], "A0(64,96,96)");
    // Not a layer tensor: rotation n_layer mod N = 2 puts the remainder on device 1.
    assert_eq!(s3["output.weight"], "A1(33,34,33)");
    check_totals(&p3, &ws);

    // Unlearned partner blocks are caught on the partner itself.
    let fresh = policy(2, 8, 2);
    let (name, d) = ws
        .iter()
        .find(|(n, _)| n == "blk.0.attn_output.weight")
        .unwrap();
    assert!(fresh.state_for(name, d).is_err());
}

#[test]
fn policy_fused_and_mqa() {
    let p = policy(2, 8, 2);
    let ws = weights(&p, DType::F16, true);
    let s = states_by_name(&p, &ws);
    assert_eq!(s["blk.0.attn_qkv.weight"], "A1(128,128 | 32,32 x2)");
    assert_eq!(s["blk.0.ffn_gate_up.weight"], "A1(128,128 x2)");
    check_totals(&p, &ws);

    // MQA, 4 heads / 1 KV head: K/V and caches mirrored, Q split by whole heads.
    for n in [2, 3] {
        let p = policy(n, 4, 1);
        let ws = weights(&p, DType::F16, false);
        let s = states_by_name(&p, &ws);
        assert_eq!(s["blk.0.attn_k.weight"], "M");
        assert_eq!(s["cache_k.0"], "M");
        let want_q = if n == 2 { "A1(64,64)" } else { "A1(32,32,64)" };
        assert_eq!(s["blk.0.attn_q.weight"], want_q);
        assert_eq!(s["blk.0.attn_output.weight"].replace("A0", "A1"), want_q);
        check_totals(&p, &ws);
        let fused = weights(&p, DType::F16, true);
        let (name, d) = fused.iter().find(|(n, _)| n.contains("qkv")).unwrap();
        assert!(p.state_for(name, d).is_err());
    }
}

/// Names of the nodes of one llama block.
struct Block {
    ctx: Context,
    graph: Graph,
    ids: HashMap<&'static str, TensorId>,
}

fn leaf(ctx: &mut Context, ws: &[(String, TensorDesc)], name: &str) -> TensorId {
    let (_, d) = ws.iter().find(|(n, _)| n == name).unwrap();
    ctx.new_named(name, d.dtype(), d.ne()).unwrap()
}

fn llama_block(p: &LlamaSplitPolicy, fused: bool) -> Block {
    let ws = weights(p, DType::F16, fused);
    let (hd, nh, nkv) = (p.head_dim, p.n_head, p.n_head_kv);
    let mut c = Context::new();
    let mut ids = HashMap::new();
    let mut name = |c: &mut Context, id: TensorId, n: &'static str| {
        c.set_name(id, n).unwrap();
        ids.insert(n, id);
        id
    };
    let x = c.new_named("inp_embd", DType::F32, [p.n_embd, T]).unwrap();
    let pos = c.new_named("inp_pos", DType::I32, [T]).unwrap();
    let idx = c.new_named("kv_idxs", DType::I32, [T]).unwrap();
    let mask = c.new_named("kq_mask", DType::F16, [N_KV, T]).unwrap();
    let an = leaf(&mut c, &ws, "blk.0.attn_norm.weight");
    let cur = c.rms_norm(x, 1e-6).unwrap();
    let cur = c.mul(cur, an).unwrap();
    let cur = name(&mut c, cur, "attn_norm");
    let (q, k, v) = if fused {
        let w = leaf(&mut c, &ws, "blk.0.attn_qkv.weight");
        let qkv = c.mul_mat(w, cur).unwrap();
        let qkv = name(&mut c, qkv, "qkv");
        let nb1 = c.tensor(qkv).unwrap().nb()[1];
        let view = |c: &mut Context, heads: usize, off: usize| {
            c.view(qkv, [hd, heads, T], [hd * 4, nb1, nb1 * T], off * 4)
                .unwrap()
        };
        let q = view(&mut c, nh, 0);
        let k = view(&mut c, nkv, nh * hd);
        let v = view(&mut c, nkv, (nh + nkv) * hd);
        (q, k, v)
    } else {
        let mut proj = |c: &mut Context, w: &str, n: &'static str, heads: usize| {
            let w = leaf(c, &ws, w);
            let y = c.mul_mat(w, cur).unwrap();
            name(c, y, n);
            c.reshape(y, [hd, heads, T]).unwrap()
        };
        let q = proj(&mut c, "blk.0.attn_q.weight", "q_mm", nh);
        let k = proj(&mut c, "blk.0.attn_k.weight", "k_mm", nkv);
        let v = proj(&mut c, "blk.0.attn_v.weight", "v_mm", nkv);
        (q, k, v)
    };
    let q = name(&mut c, q, "q_heads");
    let rp = RopeParams {
        n_dims: hd,
        mode: RopeMode::Neox,
        freq_base: 10000.0,
        freq_scale: 1.0,
    };
    let q = c.rope(q, pos, rp).unwrap();
    let q = name(&mut c, q, "q_rope");
    let k = c.rope(k, pos, rp).unwrap();
    let k = name(&mut c, k, "k_rope");
    let mut cache = |c: &mut Context, data: TensorId, cache: &str, n: &'static str| {
        let dst = leaf(c, &ws, cache);
        let rows = c.reshape(data, [hd * nkv, T]).unwrap();
        let w = c.set_rows(dst, rows, idx).unwrap();
        name(c, w, n);
        let row = hd * nkv * 2;
        let view = c
            .view(w, [hd, nkv, N_KV], [hd * 2, row, row * N_KV], 0)
            .unwrap();
        c.permute(view, [0, 2, 1, 3]).unwrap()
    };
    let v = c.cont(v).unwrap();
    let kc = cache(&mut c, k, "cache_k.0", "k_store");
    let vc = cache(&mut c, v, "cache_v_l0", "v_store");
    let kc = name(&mut c, kc, "k_attn");
    let q = c.permute(q, [0, 2, 1, 3]).unwrap();
    let q = name(&mut c, q, "q_attn");
    let fa = c
        .flash_attn_ext(q, kc, vc, Some(mask), 0.125, 0.0, 0.0)
        .unwrap();
    let fa = name(&mut c, fa, "fa");
    let o = c.reshape(fa, [nh * hd, T]).unwrap();
    let o = name(&mut c, o, "fa_flat");
    let wo = leaf(&mut c, &ws, "blk.0.attn_output.weight");
    let attn = c.mul_mat(wo, o).unwrap();
    let attn = name(&mut c, attn, "attn_out");
    let h = c.add(attn, x).unwrap();
    let h = name(&mut c, h, "h");
    let fnw = leaf(&mut c, &ws, "blk.0.ffn_norm.weight");
    let cur = c.rms_norm(h, 1e-6).unwrap();
    let cur = c.mul(cur, fnw).unwrap();
    let g = if fused {
        let w = leaf(&mut c, &ws, "blk.0.ffn_gate_up.weight");
        let gu = c.mul_mat(w, cur).unwrap();
        name(&mut c, gu, "gate_up");
        c.glu(gu, tessera::ops::GluOp::Swiglu, false).unwrap()
    } else {
        let wg = leaf(&mut c, &ws, "blk.0.ffn_gate.weight");
        let wu = leaf(&mut c, &ws, "blk.0.ffn_up.weight");
        let gate = c.mul_mat(wg, cur).unwrap();
        let up = c.mul_mat(wu, cur).unwrap();
        name(&mut c, gate, "gate");
        name(&mut c, up, "up");
        c.swiglu(gate, up).unwrap()
    };
    let g = name(&mut c, g, "glu");
    let wd = leaf(&mut c, &ws, "blk.0.ffn_down.weight");
    let down = c.mul_mat(wd, g).unwrap();
    let down = name(&mut c, down, "ffn_down");
    let out = c.add(down, h).unwrap();
    let out = name(&mut c, out, "l_out");
    let graph = c.build_forward(out).unwrap();
    Block { ctx: c, graph, ids }
}

fn run(p: &LlamaSplitPolicy, b: &Block) -> tessera::Result<Vec<Option<NodeStates>>> {
    let cb = |id: TensorId| {
        let d = b.ctx.tensor(id).ok()?;
        let n = d.name();
        (n.starts_with("blk.") || n.starts_with("cache_")).then(|| p.state_for(n, d).unwrap())
    };
    propagate(&b.graph, &cb)
}

fn check_block(n: usize, fused: bool) {
    let p = policy(n, 8, 2);
    let b = llama_block(&p, fused);
    let st = run(&p, &b).unwrap();
    let get = |n: &str| st[b.ids[n].index()].clone().unwrap();
    let (q, kv, ff) = if n == 2 {
        ("128,128", "32,32", "128,128")
    } else {
        // F32 weights: the FFN splits to the element (256 = 85 + 85 + 86).
        ("0,128,128", "0,32,32", "85,85,86")
    };
    let heads = |l: &str| {
        l.split(',')
            .map(|x| (x.parse::<usize>().unwrap() / 32).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (qh, kvh) = (heads(q), heads(kv));
    let mut want: Vec<(&str, String)> = vec![
        ("attn_norm", "M".into()),
        ("q_heads", format!("A1({qh})")),
        ("q_rope", format!("A1({qh})")),
        ("k_rope", format!("A1({kvh})")),
        ("k_store", format!("A0({kv})")),
        ("v_store", format!("A0({kv})")),
        ("k_attn", format!("A2({kvh})")),
        ("q_attn", format!("A2({qh})")),
        ("fa", format!("A1({qh})")),
        ("fa_flat", format!("A0({q})")),
        ("h", "M".into()),
        ("glu", format!("A0({ff})")),
        ("l_out", "M".into()),
    ];
    if fused {
        want.push(("qkv", format!("A0({q} | {kv} x2)")));
        want.push(("gate_up", format!("A0({ff} x2)")));
    } else {
        want.push(("q_mm", format!("A0({q})")));
        want.push(("k_mm", format!("A0({kv})")));
        want.push(("gate", format!("A0({ff})")));
    }
    for (node, s) in want {
        let ns = get(node);
        assert_eq!(ns.own.to_string(), s, "{node} (n = {n}, fused = {fused})");
        assert_eq!(ns.own, ns.seen, "{node}");
    }
    for node in ["attn_out", "ffn_down"] {
        let ns = get(node);
        assert!(
            ns.own.is_partial() && ns.seen.is_mirrored() && ns.reduce,
            "{node}"
        );
    }
    assert_eq!(
        reduce_points(&b.graph, &st),
        vec![b.ids["attn_out"], b.ids["ffn_down"]]
    );
}

#[test]
fn llama_block_follows_the_dataflow_table() {
    for n in [2, 3] {
        check_block(n, false);
    }
}

#[test]
fn fused_qkv_and_gate_up_propagate_through_segments() {
    for n in [2, 3] {
        check_block(n, true);
    }
}

fn expect_cannot_split(r: tessera::Result<Vec<Option<NodeStates>>>, op: &str, state: &str) {
    match r {
        Err(Error::InvalidOp {
            op: o,
            reason,
            tensor,
        }) => {
            assert_eq!(o, op, "{reason}");
            assert!(
                reason.contains("cannot split") && reason.contains(state),
                "{reason}"
            );
            assert!(!tensor.is_empty());
        }
        other => panic!("expected a {op} error, got {other:?}"),
    }
}

/// `mul_mat(W A1, x M)` → A0 with the given lengths, then `f` on it.
fn a0_then(
    lens: Vec<usize>,
    f: impl Fn(&mut Context, TensorId) -> TensorId,
) -> tessera::Result<Vec<Option<NodeStates>>> {
    let m: usize = lens.iter().sum();
    let mut c = Context::new();
    let w = c.new_named("w", DType::F32, [16, m]).unwrap();
    let x = c.new_named("x", DType::F32, [16, T]).unwrap();
    let y = c.mul_mat(w, x).unwrap();
    let out = f(&mut c, y);
    c.set_name(out, "out").unwrap();
    let g = c.build_forward(out).unwrap();
    let s = SplitState::axis_lens(1, lens).unwrap();
    propagate(&g, &|id| (id == w).then(|| s.clone()))
}

#[test]
fn per_row_ops_reject_a0() {
    expect_cannot_split(
        a0_then(vec![4, 4], |c, y| c.soft_max(y).unwrap()),
        "SOFT_MAX",
        "A0(4,4)",
    );
    expect_cannot_split(
        a0_then(vec![4, 4], |c, y| c.rms_norm(y, 1e-5).unwrap()),
        "RMS_NORM",
        "A0(4,4)",
    );
    // On A1 (rows split) they are fine.
    let ok = a0_then(vec![4, 4], |c, y| {
        let t = c.transpose(y).unwrap();
        let t = c.cont(t).unwrap();
        c.soft_max(t).unwrap()
    })
    .unwrap();
    assert!(ok.iter().flatten().any(|s| s.own.to_string() == "A1(4,4)"));
}

#[test]
fn ratio_takeover_must_divide() {
    // [8, T] split 3/5 reshaped to [2, 4, T]: pieces of 3 rows do not fill pairs.
    expect_cannot_split(
        a0_then(vec![3, 5], |c, y| c.reshape(y, [2, 4, T]).unwrap()),
        "RESHAPE",
        "A0(3,5)",
    );
    let ok = a0_then(vec![2, 6], |c, y| c.reshape(y, [2, 4, T]).unwrap()).unwrap();
    assert!(ok.iter().flatten().any(|s| s.own.to_string() == "A1(1,3)"));
    // Flattening everything keeps the split, one repeat per token.
    let flat = a0_then(vec![2, 6], |c, y| c.reshape(y, [8 * T]).unwrap()).unwrap();
    assert!(
        flat.iter()
            .flatten()
            .any(|s| s.own.to_string() == "A0(2,6 x4)")
    );
}

#[test]
fn mul_mat_of_a1_by_a1_is_an_error() {
    let mut c = Context::new();
    let w = c.new_named("w", DType::F32, [16, 8]).unwrap();
    let x = c.new_named("x", DType::F32, [16, 4]).unwrap();
    let y = c.mul_mat(w, x).unwrap();
    let g = c.build_forward(y).unwrap();
    let s = SplitState::axis_lens(1, vec![2, 2]).unwrap();
    let ws = SplitState::axis_lens(1, vec![4, 4]).unwrap();
    let r = propagate(&g, &|id| {
        if id == w {
            Some(ws.clone())
        } else {
            Some(s.clone())
        }
    });
    expect_cannot_split(r, "MUL_MAT", "A1(4,4), A1(2,2)");
    // A static state that does not fit its tensor is rejected up front.
    let bad = SplitState::axis_lens(1, vec![3, 3]).unwrap();
    assert!(propagate(&g, &|id| (id == w).then(|| bad.clone())).is_err());
}

#[test]
fn partial_flows_through_linear_ops_only() {
    // P → scale → add(P, P) → mul(·, M) stays P; the reduce goes after the mul, before silu.
    let mut c = Context::new();
    let w = c.new_named("w", DType::F32, [8, 16]).unwrap();
    let x = c.new_named("x", DType::F32, [8, T]).unwrap();
    let m = c.new_named("m", DType::F32, [16, T]).unwrap();
    let y = c.mul_mat(w, x).unwrap();
    let s = c.scale(y, 0.5).unwrap();
    let a = c.add(s, y).unwrap();
    let z = c.mul(a, m).unwrap();
    let out = c.silu(z).unwrap();
    let g = c.build_forward(out).unwrap();
    let (ws, xs) = (
        SplitState::axis_lens(0, vec![4, 4]).unwrap(),
        SplitState::axis_lens(0, vec![4, 4]).unwrap(),
    );
    let cb = |id: TensorId| {
        if id == w {
            Some(ws.clone())
        } else if id == x {
            Some(xs.clone())
        } else {
            None
        }
    };
    let st = propagate(&g, &cb).unwrap();
    for id in [y, s, a, z] {
        assert!(st[id.index()].as_ref().unwrap().own.is_partial());
    }
    assert!(st[out.index()].as_ref().unwrap().own.is_mirrored());
    assert_eq!(reduce_points(&g, &st), vec![z]);

    // A P node with a non-linear consumer is reduced, and then every consumer reads the sum.
    let mut c2 = c.clone();
    let sq = c2.sqr(y).unwrap();
    let both = c2.add(sq, a).unwrap();
    let g2 = c2.build_forward(both).unwrap();
    let st2 = propagate(&g2, &cb).unwrap();
    assert_eq!(reduce_points(&g2, &st2), vec![y]);
    assert!(st2[a.index()].as_ref().unwrap().own.is_mirrored());

    // A P graph output is reduced.
    let g3 = c.build_forward(a).unwrap();
    let st3 = propagate(&g3, &cb).unwrap();
    assert_eq!(reduce_points(&g3, &st3), vec![a]);

    // A static PARTIAL leaf cannot be reduced: a non-linear use of it is an error.
    let mut c4 = Context::new();
    let b = c4.new_named("bias", DType::F32, [16]).unwrap();
    let e = c4.unary(b, tessera::ops::UnaryOp::Exp).unwrap();
    let g4 = c4.build_forward(e).unwrap();
    assert!(propagate(&g4, &|id| (id == b).then(SplitState::partial)).is_err());
}

#[test]
fn mqa_block_keeps_kv_mirrored() {
    for n in [2, 3] {
        let p = policy(n, 4, 1);
        let b = llama_block(&p, false);
        let st = run(&p, &b).unwrap();
        let get = |k: &str| st[b.ids[k].index()].clone().unwrap().own.to_string();
        assert_eq!(get("k_store"), "M");
        assert_eq!(get("k_attn"), "M");
        let q = if n == 2 { "2,2" } else { "1,1,2" };
        assert_eq!(get("q_attn"), format!("A2({q})"));
        assert_eq!(get("fa"), format!("A1({q})"));
        assert_eq!(
            reduce_points(&b.graph, &st),
            vec![b.ids["attn_out"], b.ids["ffn_down"]]
        );
    }
}
