//! Whole-graph checks: a llama-style model and randomised DAGs.

use super::liveness::liveness_bound;
use super::planner::{place_best_fit, plan, plan_detailed};
use super::test_support::{Rng, VecBufferType, check_plan, llama, params_in_pre, random_dag};
use super::{GraphAllocator, PlanStats};
use crate::backend::BufferType;
use crate::tensor::TensorDesc;
use std::sync::Arc;

#[test]
fn llama_blocks_reuse_memory() {
    let (ctx, g) = llama(4, 256, 8, 32);
    let pre = params_in_pre(&ctx);
    let buft: Arc<dyn BufferType> = Arc::new(VecBufferType::new(32));
    let mut ga = GraphAllocator::new(buft);
    let bindings = ga.alloc_graph(&g, &pre).unwrap();
    bindings.check_graph(&g).unwrap();
    let s: PlanStats = ga.last_plan().unwrap().clone();
    let p = plan(&g, &pre, 32, &|t: &TensorDesc| t.nbytes()).unwrap();
    assert_eq!(p.stats, s);
    let pairs = check_plan(&g, &pre, &p, 32);
    println!(
        "llama 4 layers: peak {} B, liveness bound {} B ({:.3}x), total {} B (peak = {:.3} of total), \
         {} tensors, {} in place ({pairs} checked pairs)",
        s.peak,
        s.liveness_bound,
        s.peak as f64 / s.liveness_bound as f64,
        s.total_tensor_bytes,
        s.peak as f64 / s.total_tensor_bytes as f64,
        s.tensors,
        s.in_place,
    );
    assert!(s.peak * 10 <= s.liveness_bound * 11, "{s:?}");
    assert!(s.peak * 3 < s.total_tensor_bytes, "{s:?}");
    assert!(
        s.in_place >= 4 * 3,
        "rms_norm·mul, both residual adds: {s:?}"
    );
    assert_eq!(ga.buffer_size(), s.peak);
}

#[test]
fn random_dags_never_share_live_bytes() {
    let mut rng = Rng(0x5EED_1234);
    let (mut sum_ratio, mut worst, mut in_place) = (0.0f64, (0.0f64, 0usize), 0);
    let (mut online_sum, mut online_worst, mut nodes) = (0.0f64, 0.0f64, (usize::MAX, 0));
    let n_graphs = 50;
    for i in 0..n_graphs {
        let n = 30 + rng.below(71);
        let (ctx, g) = random_dag(&mut rng, n);
        let pre = params_in_pre(&ctx);
        let align = [1, 16, 64, 256][i % 4];
        let p = plan(&g, &pre, align, &|t: &TensorDesc| t.nbytes()).unwrap();
        in_place += check_plan(&g, &pre, &p, align);
        let s = &p.stats;
        let ratio = s.peak as f64 / s.liveness_bound as f64;
        sum_ratio += ratio;
        if ratio > worst.0 {
            worst = (ratio, i);
        }
        assert!(
            g.nodes().len() >= 20,
            "graph {i}: {} nodes",
            g.nodes().len()
        );
        nodes = (nodes.0.min(g.nodes().len()), nodes.1.max(g.nodes().len()));
        // The online best-fit pass alone, for comparison.
        let (_, live) = plan_detailed(&g, &pre, align, &|t: &TensorDesc| t.nbytes()).unwrap();
        let online = place_best_fit(&live, align).unwrap().1 as f64 / liveness_bound(&live) as f64;
        online_sum += online;
        online_worst = online_worst.max(online);
        assert_eq!(
            p,
            plan(&g, &pre, align, &|t: &TensorDesc| t.nbytes()).unwrap()
        );
    }
    let mean = sum_ratio / n_graphs as f64;
    println!(
        "random DAGs ({}..={} nodes): peak / liveness bound mean {mean:.4}, worst {:.4} (graph {}); \
         online best-fit alone: mean {:.4}, worst {online_worst:.4}; {in_place} in-place pairs",
        nodes.0,
        nodes.1,
        worst.0,
        worst.1,
        online_sum / n_graphs as f64,
    );
    assert!(mean <= 1.10, "mean peak / bound {mean}");
    assert!(in_place > 0);
}

#[test]
fn depth_does_not_grow_the_peak() {
    let peak_of = |layers| {
        let (ctx, g) = llama(layers, 128, 4, 16);
        let pre = params_in_pre(&ctx);
        let t = std::time::Instant::now();
        let p = plan(&g, &pre, 64, &|t: &TensorDesc| t.nbytes()).unwrap();
        (p.stats, g.nodes().len(), t.elapsed())
    };
    let (shallow, _, _) = peak_of(2);
    let (deep, nodes, took) = peak_of(120);
    println!("llama 120 layers: {nodes} nodes planned in {took:?}; {deep:?}");
    assert_eq!(deep.peak, shallow.peak);
    assert_eq!(deep.liveness_bound, shallow.liveness_bound);
    assert_eq!(deep.tensors, 1 + (shallow.tensors - 1 - 3) * 60 + 3);
}
