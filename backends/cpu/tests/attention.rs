//! FLASH_ATTN_EXT on cache cells no query may see: a cache shared by several sequences holds rows
//! another sequence wrote or freed, and whatever they hold (a NaN, an infinity) must not reach a
//! query whose mask hides them, on every path of the kernel (one query, a prompt block whose
//! thread takes several blocks on one KV head, and the path that scores visible keys alone).

use tessera_core::{BackendOptions, Context, DType, Device};
use tessera_cpu::CpuDevice;

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

/// `n_q` queries over 64 cells whose odd cells hold NaN keys and values and are masked for
/// every query (the even ones are visible to all, up to the query's causal bound when
/// `causal`); the outputs must be finite and equal to the same attention with the odd cells
/// holding zeros.
fn run(n_q: usize, causal: bool, threads: usize) {
    let (d, n_kv, h) = (64, 64, 4);
    let dev = CpuDevice::new("CPU", vec![]);
    let mut ctx = Context::new();
    let q = ctx.new_tensor(DType::F32, [d, n_q, h, 1]).unwrap();
    let k = ctx.new_tensor(DType::F16, [d, n_kv, 1, 1]).unwrap();
    let v = ctx.new_tensor(DType::F16, [d, n_kv, 1, 1]).unwrap();
    let m = ctx.new_tensor(DType::F16, [n_kv, n_q]).unwrap();
    let y = ctx
        .flash_attn_ext(q, k, v, Some(m), 0.125, 0.0, 0.0)
        .unwrap();
    let graph = ctx.build_forward(y).unwrap();
    let qv: Vec<f32> = (0..d * n_q * h)
        .map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5)
        .collect();
    let mask: Vec<f32> = (0..n_kv * n_q)
        .map(|i| {
            let (j, iq) = (i % n_kv, i / n_kv);
            let visible = j % 2 == 0 && (!causal || j <= 2 * iq + 2);
            if visible { 0.0 } else { f32::NEG_INFINITY }
        })
        .collect();
    let mut outs = Vec::new();
    for poison in [0.0, f32::NAN] {
        let kvv: Vec<f32> = (0..d * n_kv)
            .map(|i| {
                if (i / d) % 2 == 1 {
                    poison
                } else {
                    ((i * 5) % 13) as f32 / 13.0 - 0.5
                }
            })
            .collect();
        let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
        buf.set_f32(q, &qv).unwrap();
        buf.set(k, &f16_bytes(&kvv)).unwrap();
        buf.set(v, &f16_bytes(&kvv)).unwrap();
        buf.set(m, &f16_bytes(&mask)).unwrap();
        let mut be = dev
            .init_backend(&BackendOptions::with_threads(threads))
            .unwrap();
        be.compute(&graph, buf.bindings()).unwrap();
        be.synchronize().unwrap();
        outs.push(buf.get_f32(y).unwrap());
    }
    assert!(
        outs[1].iter().all(|x| x.is_finite()),
        "n_q {n_q} causal {causal} threads {threads}: a masked NaN cell reached the output"
    );
    assert_eq!(
        outs[0], outs[1],
        "n_q {n_q} causal {causal} threads {threads}"
    );
}

#[test]
fn masked_cells_never_reach_the_output() {
    for threads in [1, 2] {
        for (n_q, causal) in [(1, false), (8, false), (40, false), (40, true)] {
            run(n_q, causal, threads);
        }
    }
}
