//! Mixture-of-experts checks beyond the reference suite: the suite's MoE models route their
//! tokens to varied experts (a router that sends everything to the same few experts would let
//! a wrong routing path agree with llama.cpp by accident), and a MoE model gives the same
//! logits with the CPU's packed weight layout as without.

use super::reference::{PROMPT_LEN, reference_models};
use super::*;
use std::collections::HashSet;
use tessera::alloc::GraphAllocator;
use tessera::sched::SchedOptions;
use tessera::{BackendOptions, TensorId, registry};

/// Logits of `tokens` and the expert sets they choose in every layer, evaluated on one CPU
/// device with the weights in its packed weight layout (`packed`) or in plain memory.
fn eval_direct(model: &LlamaModel, tokens: &[i32], packed: bool) -> (Vec<f32>, Vec<Vec<Vec<i32>>>) {
    let c = model.config();
    let mut ctx = model.context().clone();
    let step = model
        .build(&mut ctx, tokens.len(), 0, Outputs::All)
        .unwrap();
    // The top-k views' sources are the ARGSORT nodes; keep them as outputs.
    let sorted: Vec<TensorId> = (0..c.n_layer)
        .map(|il| {
            let name = format!("ffn_moe_topk.{il}");
            let id = ctx
                .tensors()
                .iter()
                .position(|t| t.name() == name)
                .map(TensorId::from_index)
                .unwrap_or_else(|| panic!("no {name}"));
            ctx.tensor(id).unwrap().view_of().unwrap().src
        })
        .collect();
    for &s in &sorted {
        ctx.set_output(s).unwrap();
    }
    let mut outs = vec![step.logits];
    outs.extend(&sorted);
    let graph = ctx.build_forward_multi(&outs).unwrap();
    let dev = registry().device("CPU").unwrap();
    let buft = if packed {
        dev.weight_buffer_type()
    } else {
        dev.buffer_type()
    };
    let weights = buft
        .alloc_tensors_where(model.context(), |t| t.flags().param)
        .unwrap();
    for (id, _) in model.params() {
        model.upload(id, &weights).unwrap();
    }
    let n_packed = weights
        .buffer()
        .as_any()
        .downcast_ref::<tessera::cpu::CpuBuffer>()
        .map_or(0, |b| b.packed_tensors());
    // With repacking available (AVX-512 VNNI or aarch64 dotprod, and not opted out), every
    // expert stack packs.
    let packs_q8_0 = buft
        .as_any()
        .downcast_ref::<tessera::cpu::CpuBufferType>()
        .is_some_and(|b| b.pack_layout(tessera::DType::Q8_0).is_some());
    if packed && packs_q8_0 {
        assert!(
            n_packed >= 3 * c.n_layer || std::env::var("TESSERA_CPU_REPACK").is_ok(),
            "only {n_packed} tensors packed"
        );
    } else if !packed {
        assert_eq!(n_packed, 0);
    }
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    let mut all = alloc.alloc_graph(&graph, weights.bindings()).unwrap();
    all.extend(weights.bindings());
    let inputs = model.step_inputs(&step, tokens, 0).unwrap();
    let mut backend = dev.init_backend(&BackendOptions::default()).unwrap();
    for (id, bytes) in &inputs {
        all.write(graph.tensors(), *id, 0, bytes).unwrap();
    }
    backend.compute(&graph, &all).unwrap();
    backend.synchronize().unwrap();
    let read = |id: TensorId| {
        let mut out = vec![0u8; graph.tensors()[id.index()].nbytes()];
        all.read(graph.tensors(), id, 0, &mut out).unwrap();
        out
    };
    let logits = read(step.logits)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let routing = sorted
        .iter()
        .map(|&s| {
            let ids: Vec<i32> = read(s)
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            ids.chunks(c.n_expert)
                .map(|row| {
                    let mut chosen = row[..c.n_expert_used].to_vec();
                    chosen.sort_unstable();
                    chosen
                })
                .collect()
        })
        .collect();
    (logits, routing)
}

#[test]
fn moe_reference_models_route_tokens_to_varied_experts() {
    let mut checked = 0;
    for m in reference_models().into_iter().filter(|m| m.config.is_moe()) {
        let model = m.model().unwrap();
        let prompt = m.prompt();
        assert_eq!(prompt.len(), PROMPT_LEN);
        for (il, layer) in eval_direct(&model, &prompt, false).1.iter().enumerate() {
            let sets: HashSet<&Vec<i32>> = layer.iter().collect();
            let used: HashSet<i32> = layer.iter().flatten().copied().collect();
            // 16 tokens over 8 experts: at least 5 distinct expert sets and 6 experts in use.
            assert!(
                sets.len() >= 5 && used.len() >= 6,
                "{} layer {il}: {} expert sets, {} experts used: {layer:?}",
                m.name,
                sets.len(),
                used.len()
            );
        }
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} MoE reference models");
}

#[test]
fn moe_logits_do_not_depend_on_the_packed_weight_layout() {
    // Q8_0 experts of 256 rows per plane: the CPU packs them (16-row groups per expert on x86,
    // 4-row groups on aarch64).
    let model = LlamaModel::new(LlamaConfig::tiny_moe(Arch::Qwen3Moe, 8, 2, 256), 3).unwrap();
    let tokens = [1, 7, 42, 99, 5, 200, 17];
    let (packed, route_packed) = eval_direct(&model, &tokens, true);
    let (plain, route_plain) = eval_direct(&model, &tokens, false);
    assert_eq!(route_packed, route_plain);
    let e = nmse(&packed, &plain);
    assert!(e < 1e-10, "packed vs plain NMSE {e:e}");
    // And a session (weights packed, tokens one at a time) agrees at the last position.
    let devs = registry().select("cpu:1").unwrap();
    let mut s = Session::on_devices(&model, &devs, &[0, 0], SchedOptions::default()).unwrap();
    let last = s.eval(&tokens).unwrap();
    let n_vocab = model.config().n_vocab;
    let e = nmse(
        &last[last.len() - n_vocab..],
        &plain[plain.len() - n_vocab..],
    );
    assert!(e < 1e-10, "session vs direct NMSE {e:e}");
}
