//! `tessera bench-ops`: time single-op graphs and report GFLOP/s and GB/s, like
//! `test-backend-ops perf`, and the per-node cost of a backend (`OVERHEAD`: a chain of small
//! element-wise nodes, reported per node).

use super::inputs::{Rng, encode, fill};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tessera::{
    BackendOptions, Context, DType, Device, OpKind, Result, RopeMode, RopeParams, TensorId,
};

/// Builds a benchmark graph (one op, or OVERHEAD's chain) and returns its output.
type BuildFn = Box<dyn Fn(&mut Context) -> Result<TensorId>>;

/// One benchmark: a graph plus its arithmetic and memory traffic.
struct BenchCase {
    op: &'static str,
    label: String,
    build: BuildFn,
    flops: f64,
    bytes: f64,
}

/// Name of the attention benchmarks' mask, which [`time_case`] fills causally (0 up to the
/// query's own position, −∞ above it) instead of with random values.
const CAUSAL_MASK: &str = "bench-ops causal mask";

fn cases(m: usize, k: usize, cols: &[usize]) -> Vec<BenchCase> {
    let mut v = Vec::new();
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q2_K,
        DType::Q3_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ] {
        // K-quants need k in whole super-blocks of 256.
        let Some(row) = dtype.row_size(k) else {
            continue;
        };
        for &n in cols {
            let wbytes = (row * m) as f64;
            v.push(BenchCase {
                op: "MUL_MAT",
                label: format!("MUL_MAT(type_a={dtype},type_b=f32,m={m},n={n},k={k})"),
                build: Box::new(move |c| {
                    let w = c.new_tensor(dtype, [k, m])?;
                    let x = c.new_tensor(DType::F32, [k, n])?;
                    c.mul_mat(w, x)
                }),
                flops: 2.0 * (m * n * k) as f64,
                bytes: wbytes + (4 * k * n + 4 * m * n) as f64,
            });
        }
    }
    // MUL_MAT_ID at test-backend-ops' qwen3-30b-a3b shape: 128 experts of 768 rows, 8 used per
    // token, each slot with its own activation column. The weight traffic counts the experts a
    // step can touch.
    let (n_mats, n_used, m_exp, k_exp) = (128usize, 8usize, 768usize, 2048usize);
    for dtype in [
        DType::F16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        let Some(row) = dtype.row_size(k_exp) else {
            continue;
        };
        for n in [1usize, 32, 512] {
            let touched = n_mats.min(n_used * n);
            v.push(BenchCase {
                op: "MUL_MAT_ID",
                label: format!(
                    "MUL_MAT_ID(type_a={dtype},n_mats={n_mats},n_used={n_used},m={m_exp},n={n},k={k_exp})"
                ),
                build: Box::new(move |c| {
                    let w = c.new_tensor(dtype, [k_exp, m_exp, n_mats])?;
                    let x = c.new_tensor(DType::F32, [k_exp, n_used, n])?;
                    let ids = c.new_tensor(DType::I32, [n_used, n])?;
                    c.mul_mat_id(w, x, ids)
                }),
                flops: 2.0 * (m_exp * k_exp * n_used * n) as f64,
                bytes: (row * m_exp * touched) as f64
                    + (4 * k_exp * n_used * n + 4 * m_exp * n_used * n) as f64,
            });
        }
    }
    let (ne0, rows) = (4096usize, 512usize);
    v.push(BenchCase {
        op: "RMS_NORM",
        label: format!("RMS_NORM(type=f32,ne=[{ne0},{rows}])"),
        build: Box::new(move |c| {
            let a = c.new_tensor(DType::F32, [ne0, rows])?;
            c.rms_norm(a, 1e-6)
        }),
        flops: 3.0 * (ne0 * rows) as f64,
        bytes: 8.0 * (ne0 * rows) as f64,
    });
    v.push(BenchCase {
        op: "SOFT_MAX",
        label: format!("SOFT_MAX(type=f32,ne=[{ne0},{rows}],mask=f16,scale=0.125)"),
        build: Box::new(move |c| {
            let a = c.new_tensor(DType::F32, [ne0, rows])?;
            let mask = c.new_tensor(DType::F16, [ne0, rows])?;
            c.soft_max_ext(a, Some(mask), 0.125, 0.0)
        }),
        flops: 5.0 * (ne0 * rows) as f64,
        bytes: 10.0 * (ne0 * rows) as f64,
    });
    let (hd, heads, toks) = (128usize, 32usize, 512usize);
    v.push(BenchCase {
        op: "ROPE",
        label: format!("ROPE(type=f32,ne=[{hd},{heads},{toks}],mode=neox)"),
        build: Box::new(move |c| {
            let a = c.new_tensor(DType::F32, [hd, heads, toks])?;
            let p = c.new_tensor(DType::I32, [toks])?;
            c.rope(
                a,
                p,
                RopeParams {
                    n_dims: hd,
                    mode: RopeMode::Neox,
                    freq_base: 10000.0,
                    freq_scale: 1.0,
                },
            )
        }),
        flops: 6.0 * (hd * heads * toks) as f64,
        bytes: 8.0 * (hd * heads * toks) as f64,
    });
    // Decode and prompt over a 4096-long cache, and a 2048-token prompt attending to itself (the
    // shape gpu-perf.sh compares with torch's causal scaled_dot_product_attention), each with a
    // causal mask (a prompt's queries are the cache's last positions). FLOPs count every
    // (query, key) pair, as if nothing were masked.
    for (n_q, nkv) in [(1usize, 256usize), (1, 4096), (512, 4096), (2048, 2048)] {
        let (d, h, hkv) = (128usize, 32usize, 8usize);
        v.push(BenchCase {
            op: "FLASH_ATTN_EXT",
            label: format!(
                "FLASH_ATTN_EXT(hs={d},nh={h},nh_kv={hkv},kv={nkv},nb={n_q},type_KV=f16,mask=causal)"
            ),
            build: Box::new(move |c| {
                let q = c.new_tensor(DType::F32, [d, n_q, h])?;
                let kk = c.new_tensor(DType::F16, [d, nkv, hkv])?;
                let vv = c.new_tensor(DType::F16, [d, nkv, hkv])?;
                let mask = c.new_tensor(DType::F16, [nkv, n_q])?;
                c.set_name(mask, CAUSAL_MASK)?;
                c.flash_attn_ext(q, kk, vv, Some(mask), 1.0 / (d as f32).sqrt(), 0.0, 0.0)
            }),
            flops: 4.0 * (d * nkv * h * n_q) as f64,
            bytes: (2 * 2 * d * nkv * hkv + 4 * d * h * n_q * 2) as f64,
        });
    }
    // OVERHEAD: what a node costs when its work is negligible (launch, barrier, argument
    // upload, the backend's per-graph round trips), as one number per backend: a chain of
    // OVERHEAD_NODES element-wise nodes (ADD, MUL, SCALE in turn) on a 4096-element f32 vector,
    // each reading the previous one, timed per node.
    let len = 4096usize;
    v.push(BenchCase {
        op: "OVERHEAD",
        label: format!("OVERHEAD(nodes={OVERHEAD_NODES},ops=add,mul,scale,type=f32,ne=[{len}])"),
        build: Box::new(move |c| {
            let mut x = c.new_tensor(DType::F32, [len])?;
            let b = c.new_tensor(DType::F32, [len])?;
            for i in 0..OVERHEAD_NODES {
                x = match i % 3 {
                    0 => c.add(x, b)?,
                    1 => c.mul(x, b)?,
                    _ => c.scale(x, 0.5)?,
                };
            }
            Ok(x)
        }),
        flops: (OVERHEAD_NODES * len) as f64,
        bytes: (OVERHEAD_NODES * len * 12) as f64,
    });
    v
}

/// Nodes of the OVERHEAD chain.
const OVERHEAD_NODES: usize = 64;

/// Options of `bench-ops`.
pub struct Options {
    /// Only ops whose name or label starts with one of these (case-insensitive); empty: all.
    pub op: Vec<String>,
    /// Thread counts to try; empty = the device's default.
    pub threads: Vec<usize>,
    /// Rows m and reduction length k of the MUL_MAT shapes.
    pub m: usize,
    /// Reduction length of the MUL_MAT shapes.
    pub k: usize,
    /// Columns n of the MUL_MAT shapes.
    pub cols: Vec<usize>,
    /// Copies of each MUL_MAT(_ID) weight the runs take in turn, so that a working set larger
    /// than the GPU's L2 cache is read from memory rather than the cache.
    pub rotate: usize,
    /// Minimum measuring time per case.
    pub min_time: Duration,
}

/// Weights already encoded, by dtype and shape: quantizing a large weight takes seconds, and the
/// cases and devices of one run share them.
type EncodedWeights = RefCell<HashMap<(DType, Vec<usize>), Rc<Vec<u8>>>>;

fn time_case(
    dev: &dyn Device,
    case: &BenchCase,
    threads: Option<usize>,
    opts: &Options,
    cache: &EncodedWeights,
) -> anyhow::Result<(usize, f64, usize)> {
    let mut ctx = Context::new();
    let out = (case.build)(&mut ctx)?;
    // MUL_MAT('s and MUL_MAT_ID's) weights live where a model's do: in the device's weight memory (the CPU's
    // repacked layout), the rest in its plain memory.
    let weights: Vec<_> = ctx
        .build_forward(out)?
        .nodes()
        .iter()
        .filter(|&&n| {
            ctx.tensor(n)
                .is_ok_and(|t| matches!(t.op().kind(), OpKind::MulMat | OpKind::MulMatId))
        })
        .filter_map(|&n| ctx.tensor(n).ok().and_then(|t| t.src(0)))
        .collect();
    for (i, &w) in weights.iter().enumerate() {
        ctx.set_name(w, format!("bench-ops weight {i}"))?;
    }
    let is_weight = |t: &tessera::TensorDesc| t.name().starts_with("bench-ops weight");
    let graph = ctx.build_forward(out)?;
    let buf = dev
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| !is_weight(t))?;
    let mut rng = Rng::new(0x7e55e7a);
    for &leaf in graph.leafs() {
        let desc = ctx.tensor(leaf)?;
        if desc.name() == CAUSAL_MASK {
            buf.set(leaf, &causal_mask(desc)?)?;
        } else if !weights.contains(&leaf) {
            fill(&buf, desc, leaf, &mut rng, 100)?;
        }
    }
    // Every copy of the weights holds the same bytes (encoded once): what defeats the cache is
    // the addresses.
    let mut sets = Vec::with_capacity(opts.rotate);
    let mut encoded = Vec::with_capacity(weights.len());
    for copy in 0..opts.rotate.max(1) {
        let wbuf = dev
            .weight_buffer_type()
            .alloc_tensors_where(&ctx, is_weight)?;
        if copy == 0 {
            for &w in &weights {
                let desc = ctx.tensor(w)?;
                let key = (desc.dtype(), desc.ne().to_vec());
                let cached = cache.borrow().get(&key).cloned();
                let bytes = match cached {
                    Some(b) => b,
                    None => {
                        let b = Rc::new(encode(desc, &mut rng)?);
                        cache.borrow_mut().insert(key, Rc::clone(&b));
                        b
                    }
                };
                wbuf.set(w, &bytes)?;
                encoded.push(bytes);
            }
        } else {
            for (&w, bytes) in weights.iter().zip(&encoded) {
                wbuf.set(w, bytes)?;
            }
        }
        let mut bindings = buf.bindings().clone();
        bindings.extend(wbuf.bindings());
        sets.push((wbuf, bindings));
    }
    let bopts = threads
        .map(BackendOptions::with_threads)
        .unwrap_or_default();
    let mut backend = dev.init_backend(&bopts)?;
    for (_, bindings) in &sets {
        backend.compute(&graph, bindings)?;
    }
    backend.synchronize()?;
    // Runs go in batches synchronized once, as a model's graphs are: a GPU's time per run is then
    // its work and launches, not a host round trip per run.
    let (mut runs, start) = (0usize, Instant::now());
    let mut batch = 1usize;
    while runs < 3 || (start.elapsed() < opts.min_time && runs < 100_000) {
        for _ in 0..batch {
            backend.compute(&graph, &sets[runs % sets.len()].1)?;
            runs += 1;
        }
        backend.synchronize()?;
        batch = (batch * 2).min(64);
    }
    let nodes = graph.nodes().len().max(1);
    Ok((runs, start.elapsed().as_secs_f64() / runs as f64, nodes))
}

/// A causal mask of `desc`'s shape [n_kv, n_q] and type: query i is the cache's position
/// n_kv - n_q + i and sees the keys up to it.
fn causal_mask(desc: &tessera::TensorDesc) -> Result<Vec<u8>> {
    let (n_kv, n_q) = (desc.ne()[0], desc.ne()[1]);
    let past = n_kv.saturating_sub(n_q);
    let v: Vec<f32> = (0..n_q)
        .flat_map(|i| {
            (0..n_kv).map(move |j| {
                if j <= past + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    tessera::encode_f32(desc.dtype(), &v)
}

/// Runs the benchmarks on `devices` and prints one table row per case, device and thread count:
/// the time per run (graph computed and synchronized) and per node of the graph.
pub fn run(devices: &[std::sync::Arc<dyn Device>], opts: &Options) -> anyhow::Result<()> {
    let all = cases(opts.m, opts.k, &opts.cols);
    let cache = EncodedWeights::default();
    let selected: Vec<&BenchCase> = all
        .iter()
        .filter(|c| {
            opts.op.is_empty()
                || opts.op.iter().any(|o| {
                    c.op.eq_ignore_ascii_case(o)
                        || c.label.to_lowercase().starts_with(&o.to_lowercase())
                })
        })
        .collect();
    if selected.is_empty() {
        anyhow::bail!("no benchmark matches -o {}", opts.op.join(" -o "));
    }
    println!(
        "| {:<62} | {:<6} | {:>3} | {:>6} | {:>11} | {:>9} | {:>9} | {:>8} |",
        "case", "device", "thr", "runs", "us/run", "us/node", "GFLOP/s", "GB/s"
    );
    println!(
        "|{:-<64}|{:-<8}|{:-<5}|{:-<8}|{:-<13}|{:-<11}|{:-<11}|{:-<10}|",
        "", "", "", "", "", "", "", ""
    );
    let thread_opts: Vec<Option<usize>> = if opts.threads.is_empty() {
        vec![None]
    } else {
        opts.threads.iter().map(|&t| Some(t)).collect()
    };
    for dev in devices {
        for case in &selected {
            for &t in &thread_opts {
                let shown = t.map(|t| t.to_string()).unwrap_or_else(|| "def".into());
                match time_case(dev.as_ref(), case, t, opts, &cache) {
                    Ok((runs, secs, nodes)) => println!(
                        "| {:<62} | {:<6} | {:>3} | {:>6} | {:>11.1} | {:>9.2} | {:>9.2} | {:>8.2} |",
                        case.label,
                        dev.name(),
                        shown,
                        runs,
                        secs * 1e6,
                        secs * 1e6 / nodes as f64,
                        case.flops / secs / 1e9,
                        case.bytes / secs / 1e9
                    ),
                    Err(e) => println!(
                        "| {:<62} | {:<6} | {:>3} | error: {e}",
                        case.label,
                        dev.name(),
                        shown
                    ),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three queries at the end of a five-key cache see the two cached keys and themselves.
    #[test]
    fn causal_mask_hides_the_future() {
        let mut ctx = Context::new();
        let m = ctx.new_tensor(DType::F32, [5, 3]).unwrap();
        let bytes = causal_mask(ctx.tensor(m).unwrap()).unwrap();
        let seen: Vec<usize> = bytes
            .chunks(4 * 5)
            .map(|row| {
                row.chunks(4)
                    .filter(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) == 0.0)
                    .count()
            })
            .collect();
        assert_eq!(seen, [3, 4, 5]);
        let masked = f32::from_ne_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        assert_eq!(masked, f32::NEG_INFINITY);
    }

    /// The MUL_MAT shapes take the columns asked for.
    #[test]
    fn mul_mat_cases_take_the_columns() {
        let labels: Vec<String> = cases(64, 256, &[16, 2048])
            .into_iter()
            .filter(|c| c.label.starts_with("MUL_MAT(type_a=q4_0"))
            .map(|c| c.label)
            .collect();
        assert_eq!(
            labels,
            [
                "MUL_MAT(type_a=q4_0,type_b=f32,m=64,n=16,k=256)",
                "MUL_MAT(type_a=q4_0,type_b=f32,m=64,n=2048,k=256)"
            ]
        );
    }
}
