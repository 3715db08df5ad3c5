//! The mixture-of-experts feed-forward block of a step graph, op for op as llama.cpp's
//! `build_moe_ffn` (router, top-k, gating, expert matmuls, weighted sum over the chosen slots),
//! so that results and their f32 rounding follow the reference.

use super::config::{Arch, Gating, LlamaConfig};
use super::llama::LayerTensors;
use tessera::{Context, Error, Result, TensorId};

/// gpt-oss's `swiglu_oai` slope and clamp (fixed in llama.cpp too).
const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;
/// The smallest positive normal f16: llama.cpp clamps the sum of the chosen weights to it
/// before renormalising.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// `x` `[n_embd, T]` through the experts of layer `l` → `[n_embd, T]`.
///
/// # Errors
/// [`Error::InvalidArgument`] if `l` is not a mixture-of-experts layer; builder errors.
pub(crate) fn moe_ffn(
    ctx: &mut Context,
    c: &LlamaConfig,
    l: &LayerTensors,
    x: TensorId,
    il: usize,
) -> Result<TensorId> {
    let m = l.moe.ok_or_else(|| {
        Error::InvalidArgument(format!("layer {il} has no mixture-of-experts tensors"))
    })?;
    let (n_expert, n_used) = (c.n_expert, c.n_expert_used);
    let n_embd = c.n_embd;
    let t = ctx.tensor(x)?.ne()[1];

    let mut logits = ctx.mul_mat(m.gate_inp, x)?; // [n_expert, T]
    if let Some(b) = m.gate_inp_b {
        logits = ctx.add(logits, b)?;
    }
    let probs = match c.arch.gating() {
        Gating::Softmax => ctx.soft_max(logits)?,
        Gating::SoftmaxWeight => logits,
    };
    let selected = ctx.top_k(probs, n_used)?; // [n_used, T]
    ctx.set_name(selected, format!("ffn_moe_topk.{il}"))?;
    let probs3 = ctx.reshape(probs, [1, n_expert, t])?;
    let mut weights = ctx.get_rows(probs3, selected)?; // [1, n_used, T]
    if c.arch.gating() == Gating::SoftmaxWeight {
        let w = ctx.reshape(weights, [n_used, t])?;
        let w = ctx.soft_max(w)?;
        weights = ctx.reshape(w, [1, n_used, t])?;
    }
    if c.arch.normalises_expert_weights() {
        let w = ctx.reshape(weights, [n_used, t])?;
        let sum = ctx.sum_rows(w)?;
        let sum = ctx.clamp(sum, MIN_WEIGHT_SUM, f32::INFINITY)?;
        let w = ctx.div(w, sum)?;
        weights = ctx.reshape(w, [1, n_used, t])?;
    }
    ctx.set_name(weights, format!("ffn_moe_weights.{il}"))?;

    let cur = ctx.reshape(x, [n_embd, 1, t])?;
    let [gate_b, up_b, down_b] = m.exps_b.map_or([None; 3], |b| b.map(Some));
    let mut up = ctx.mul_mat_id(l.ffn_up, cur, selected)?; // [n_ff_exp, n_used, T]
    if let Some(b) = up_b {
        up = ctx.add_id(up, b, selected)?;
    }
    let mut gate = ctx.mul_mat_id(l.ffn_gate, cur, selected)?;
    if let Some(b) = gate_b {
        gate = ctx.add_id(gate, b, selected)?;
    }
    let act = match c.arch {
        Arch::GptOss => ctx.swiglu_oai(gate, up, OAI_ALPHA, OAI_LIMIT)?,
        _ => ctx.glu_split(gate, up, c.arch.glu())?,
    };
    let mut experts = ctx.mul_mat_id(l.ffn_down, act, selected)?; // [n_embd, n_used, T]
    if let Some(b) = down_b {
        experts = ctx.add_id(experts, b, selected)?;
    }
    let experts = ctx.mul(experts, weights)?;
    ctx.set_name(experts, format!("ffn_moe_weighted.{il}"))?;

    // The weighted outputs of the slots, summed in slot order.
    let nb = ctx.tensor(experts)?.nb();
    let slot = |ctx: &mut Context, i: usize| {
        ctx.view(experts, [n_embd, t], [nb[2], nb[2], nb[2]], i * nb[1])
    };
    let mut out = slot(ctx, 0)?;
    for i in 1..n_used {
        let s = slot(ctx, i)?;
        out = ctx.add(out, s)?;
    }
    if n_used == 1 {
        out = ctx.cont(out)?;
    }
    ctx.set_name(out, format!("ffn_moe_out.{il}"))?;
    Ok(out)
}
