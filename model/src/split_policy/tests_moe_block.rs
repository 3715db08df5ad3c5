//! A mixture-of-experts block on a meta device of 2–8 CPU devices, under the llama policy's
//! tensor split (every expert along `n_ff_exp`) and expert split (whole experts per device), with
//! even, uneven and zero-length ratios: the output matches one device and the block does one
//! all-reduce, of its `n_embd·T` output.

use super::*;
use crate::nmse;
use std::sync::Arc;
use tessera::meta::MetaDevice;
use tessera::{Backend, BackendOptions, Bindings, Context, DType, Device, TensorId};

fn devices(n: usize) -> Vec<Arc<dyn Device>> {
    tessera::registry().select(&format!("cpu:{n}")).unwrap()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// The expert block of `build_moe_ffn` with gpt-oss biases: router, top-2 of 8 experts, gate/up
/// MUL_MAT_ID + ADD_ID, SWIGLU_OAI, down MUL_MAT_ID + ADD_ID, weighting and the slot sum.
struct MoeBlock {
    ctx: Context,
    x: TensorId,
    out: TensorId,
}

const MOE_EMBD: usize = 64;
const MOE_FF: usize = 64;
const MOE_T: usize = 7;

fn moe_block(n_expert: usize, n_used: usize) -> MoeBlock {
    let mut c = Context::new();
    let x = c.new_named("x", DType::F32, [MOE_EMBD, MOE_T]).unwrap();
    let w = |c: &mut Context, name: &str, ne: [usize; 3]| {
        c.new_named(&format!("blk.0.{name}"), DType::F32, ne)
            .unwrap()
    };
    let router = w(&mut c, "ffn_gate_inp.weight", [MOE_EMBD, n_expert, 1]);
    let gate = w(&mut c, "ffn_gate_exps.weight", [MOE_EMBD, MOE_FF, n_expert]);
    let up = w(&mut c, "ffn_up_exps.weight", [MOE_EMBD, MOE_FF, n_expert]);
    let down = w(&mut c, "ffn_down_exps.weight", [MOE_FF, MOE_EMBD, n_expert]);
    let gb = w(&mut c, "ffn_gate_exps.bias", [MOE_FF, n_expert, 1]);
    let ub = w(&mut c, "ffn_up_exps.bias", [MOE_FF, n_expert, 1]);
    let db = w(&mut c, "ffn_down_exps.bias", [MOE_EMBD, n_expert, 1]);
    let logits = c.mul_mat(router, x).unwrap();
    let probs = c.soft_max(logits).unwrap();
    let sel = c.top_k(probs, n_used).unwrap();
    let p3 = c.reshape(probs, [1, n_expert, MOE_T]).unwrap();
    let weights = c.get_rows(p3, sel).unwrap();
    let cur = c.reshape(x, [MOE_EMBD, 1, MOE_T]).unwrap();
    let u = c.mul_mat_id(up, cur, sel).unwrap();
    let u = c.add_id(u, ub, sel).unwrap();
    let g = c.mul_mat_id(gate, cur, sel).unwrap();
    let g = c.add_id(g, gb, sel).unwrap();
    let act = c.swiglu_oai(g, u, 1.702, 7.0).unwrap();
    let e = c.mul_mat_id(down, act, sel).unwrap();
    let e = c.add_id(e, db, sel).unwrap();
    let e = c.mul(e, weights).unwrap();
    let nb = c.tensor(e).unwrap().nb();
    let mut out = c
        .view(e, [MOE_EMBD, MOE_T], [nb[2], nb[2], nb[2]], 0)
        .unwrap();
    for i in 1..n_used {
        let s = c
            .view(e, [MOE_EMBD, MOE_T], [nb[2], nb[2], nb[2]], i * nb[1])
            .unwrap();
        out = c.add(out, s).unwrap();
    }
    c.set_name(out, "ffn_moe_out.0").unwrap();
    let out = c.add(out, x).unwrap();
    c.set_output(out).unwrap();
    MoeBlock { ctx: c, x, out }
}

/// Runs the block on a meta device over `devs` with `ratios`; returns the output, the reduces
/// of the run (name, values) and the all-reduce counters.
fn run_moe(
    devs: &[Arc<dyn Device>],
    ratios: &[f32],
    experts: ExpertSplit,
    m: &MoeBlock,
) -> (Vec<f32>, Vec<(String, usize)>, usize) {
    let graph = m.ctx.build_forward(m.out).unwrap();
    let mut policy =
        LlamaSplitPolicy::new(devs.len(), 4, 4, 16, MOE_EMBD, MOE_FF, 1).with_expert_split(experts);
    let named: Vec<(String, TensorDesc)> = m
        .ctx
        .tensors()
        .iter()
        .map(|t| (t.name().to_string(), t.clone()))
        .collect();
    policy.learn_partner_blocks(&named);
    let mut meta = MetaDevice::new(devs, policy).unwrap();
    if !ratios.is_empty() {
        meta = meta.with_ratios(ratios).unwrap();
    }
    let weights = meta
        .buffer_type()
        .alloc_tensors_where(&m.ctx, |t| t.name().starts_with("blk."))
        .unwrap();
    for (i, t) in m.ctx.tensors().iter().enumerate() {
        if t.name().starts_with("blk.") {
            let id = TensorId::from_index(i);
            weights
                .set_f32(id, &values(t.nelements(), 100 + i as u32))
                .unwrap();
        }
    }
    let io = devs[0]
        .buffer_type()
        .alloc_tensors_where(&m.ctx, |t| t.name() == "x" || t.flags().output)
        .unwrap();
    let nx = m.ctx.tensor(m.x).unwrap().nelements();
    io.set_f32(m.x, &values(nx, 7)).unwrap();
    let mut b = Bindings::new();
    b.extend(weights.bindings());
    b.extend(io.bindings());
    let mut be = meta
        .init_meta_backend(&BackendOptions::with_threads(1))
        .unwrap();
    be.compute(&graph, &b).unwrap();
    be.synchronize().unwrap();
    let st = be.stats();
    (
        io.get_f32(m.out).unwrap(),
        be.reduces(),
        st.vendor_reduces + st.generic_reduces,
    )
}

#[test]
fn moe_blocks_match_one_device_with_one_reduce_for_2_to_8_devices() {
    let m = moe_block(8, 2);
    let (want, _, _) = run_moe(&devices(1), &[], ExpertSplit::Tensor, &m);
    for n in 2..=8 {
        let uneven: Vec<f32> = (0..n).map(|j| [5.0, 1.0, 3.0, 2.0][j % 4]).collect();
        let mut zero = uneven.clone();
        zero[n / 2] = 0.0;
        for ratios in [Vec::new(), uneven, zero] {
            for experts in [ExpertSplit::Tensor, ExpertSplit::Expert] {
                let (got, reduces, count) = run_moe(&devices(n), &ratios, experts, &m);
                let e = nmse(&got, &want);
                let ctx = format!("N={n} ratios {ratios:?} {experts:?}");
                assert!(e <= 1e-12, "{ctx}: nmse {e:e}");
                assert_eq!(
                    reduces,
                    vec![("ffn_moe_out.0".to_string(), MOE_EMBD * MOE_T)],
                    "{ctx}"
                );
                assert_eq!(count, 1, "{ctx}");
            }
        }
    }
}
