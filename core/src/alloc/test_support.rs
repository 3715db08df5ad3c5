//! Test helpers: a Vec-backed buffer type, a seeded RNG, graph builders, and an independent
//! checker of plans.

use super::planner::Plan;
use crate::backend::{Bindings, Buffer, BufferType};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::ops::{OpKind, RopeMode, RopeParams};
use crate::tensor::{TensorFlags, TensorId};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Host memory in a `Vec`.
#[derive(Debug)]
pub(crate) struct VecBuffer(Mutex<Vec<u8>>);

impl Buffer for VecBuffer {
    fn size(&self) -> usize {
        self.0.lock().map_or(0, |v| v.len())
    }
    fn name(&self) -> String {
        "VEC buffer".into()
    }
    fn is_host(&self) -> bool {
        true
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let mut v = self
            .0
            .lock()
            .map_err(|_| Error::InvalidArgument("poisoned".into()))?;
        let size = v.len();
        let end = offset.saturating_add(src.len());
        v.get_mut(offset..end)
            .ok_or(Error::OutOfBounds {
                what: "VEC".into(),
                offset,
                end,
                size,
            })?
            .copy_from_slice(src);
        Ok(())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let v = self
            .0
            .lock()
            .map_err(|_| Error::InvalidArgument("poisoned".into()))?;
        let end = offset.saturating_add(dst.len());
        dst.copy_from_slice(v.get(offset..end).ok_or(Error::OutOfBounds {
            what: "VEC".into(),
            offset,
            end,
            size: v.len(),
        })?);
        Ok(())
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.write(offset, &vec![value; len])
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer type of [`VecBuffer`]s that counts its allocations.
#[derive(Debug)]
pub(crate) struct VecBufferType {
    alignment: usize,
    max_size: usize,
    pub(crate) allocs: AtomicUsize,
}

impl VecBufferType {
    pub(crate) fn new(alignment: usize) -> VecBufferType {
        VecBufferType::with_max(alignment, usize::MAX)
    }
    pub(crate) fn with_max(alignment: usize, max_size: usize) -> VecBufferType {
        VecBufferType {
            alignment,
            max_size,
            allocs: AtomicUsize::new(0),
        }
    }
}

impl BufferType for VecBufferType {
    fn name(&self) -> &str {
        "VEC"
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        self.allocs.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(VecBuffer(Mutex::new(vec![0; size]))))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Places every param tensor of `ctx` in one Vec buffer.
pub(crate) fn params_in_pre(ctx: &Context) -> Bindings {
    let buft: Arc<dyn BufferType> = Arc::new(VecBufferType::new(32));
    let tb = buft.alloc_tensors_where(ctx, |t| t.flags().param).unwrap();
    tb.bindings().clone()
}

/// SplitMix64.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub(crate) fn param(ctx: &mut Context, name: &str, dtype: DType, ne: [usize; 2]) -> TensorId {
    let id = ctx.new_named(name, dtype, ne).unwrap();
    let flags = TensorFlags {
        param: true,
        ..Default::default()
    };
    ctx.set_flags(id, flags).unwrap();
    id
}

/// `n_layers` llama blocks (attention with flash attention, SwiGLU FFN) over `n_tok` tokens.
pub(crate) fn llama(n_layers: usize, dim: usize, n_head: usize, n_tok: usize) -> (Context, Graph) {
    let (hd, ffn) = (dim / n_head, dim * 8 / 3);
    let mut ctx = Context::new();
    let inp = ctx.new_named("inp", DType::F32, [dim, n_tok]).unwrap();
    let pos = ctx.new_named("pos", DType::I32, [n_tok]).unwrap();
    let mask = ctx.new_named("mask", DType::F16, [n_tok, n_tok]).unwrap();
    for id in [inp, pos, mask] {
        ctx.set_input(id).unwrap();
    }
    let rope = RopeParams {
        n_dims: hd,
        mode: RopeMode::Neox,
        freq_base: 10000.0,
        freq_scale: 1.0,
    };
    let mut x = inp;
    for l in 0..n_layers {
        let c = &mut ctx;
        let attn_norm = param(c, &format!("blk.{l}.attn_norm"), DType::F32, [dim, 1]);
        let [wq, wk, wv, wo] = ["q", "k", "v", "o"]
            .map(|n| param(c, &format!("blk.{l}.{n}"), DType::Q8_0, [dim, dim]));
        let ffn_norm = param(c, &format!("blk.{l}.ffn_norm"), DType::F32, [dim, 1]);
        let wg = param(c, &format!("blk.{l}.gate"), DType::Q8_0, [dim, ffn]);
        let wu = param(c, &format!("blk.{l}.up"), DType::Q8_0, [dim, ffn]);
        let wd = param(c, &format!("blk.{l}.down"), DType::F16, [ffn, dim]);

        let h = c.rms_norm(x, 1e-5).unwrap();
        let h = c.mul(h, attn_norm).unwrap();
        let mut heads = |w, roped: bool| {
            let t = c.mul_mat(w, h).unwrap();
            let t = c.reshape(t, [hd, n_head, n_tok]).unwrap();
            let t = if roped {
                c.rope(t, pos, rope).unwrap()
            } else {
                t
            };
            c.permute(t, [0, 2, 1, 3]).unwrap()
        };
        let (q, k, v) = (heads(wq, true), heads(wk, true), heads(wv, false));
        let scale = 1.0 / (hd as f32).sqrt();
        let a = c
            .flash_attn_ext(q, k, v, Some(mask), scale, 0.0, 0.0)
            .unwrap();
        let a = c.reshape(a, [dim, n_tok]).unwrap();
        let o = c.mul_mat(wo, a).unwrap();
        let x_attn = c.add(o, x).unwrap();
        let h = c.rms_norm(x_attn, 1e-5).unwrap();
        let h = c.mul(h, ffn_norm).unwrap();
        let g = c.mul_mat(wg, h).unwrap();
        let u = c.mul_mat(wu, h).unwrap();
        let s = c.swiglu(g, u).unwrap();
        let d = c.mul_mat(wd, s).unwrap();
        x = c.add(d, x_attn).unwrap();
    }
    let out = ctx.rms_norm(x, 1e-5).unwrap();
    ctx.set_output(out).unwrap();
    let g = ctx.build_forward(out).unwrap();
    (ctx, g)
}

/// A random DAG of about `n` element-wise, matmul, view and copy nodes over f32 activations.
pub(crate) fn random_dag(rng: &mut Rng, n: usize) -> (Context, Graph) {
    const DIMS: [usize; 4] = [32, 64, 96, 128];
    let mut ctx = Context::new();
    let n_tok = 1 + rng.below(8);
    let mut pool = Vec::new();
    let mut unread: Vec<TensorId> = Vec::new();
    for i in 0..1 + rng.below(3) {
        let x = ctx.new_named(&format!("in{i}"), DType::F32, [DIMS[rng.below(4)], n_tok]);
        let x = x.unwrap();
        if rng.below(2) == 0 {
            ctx.set_input(x).unwrap();
        }
        pool.push(x);
        unread.push(x);
    }
    let mut made = 0;
    while made < n {
        // Prefer tensors nobody read yet, so most of what is made ends up in the graph.
        let pick = |rng: &mut Rng, pool: &[TensorId], unread: &[TensorId]| {
            if !unread.is_empty() && rng.below(2) == 0 {
                unread[rng.below(unread.len())]
            } else {
                pool[pool.len() - 1 - rng.below(pool.len().min(6))]
            }
        };
        let a = pick(rng, &pool, &unread);
        let ta = ctx.tensors()[a.index()].clone();
        let same: Vec<TensorId> = pool
            .iter()
            .copied()
            .filter(|&b| b != a && ctx.tensors()[b.index()].ne() == ta.ne())
            .collect();
        let c = &mut ctx;
        let (y, read) = match rng.below(10) {
            0 => (c.silu(a).unwrap(), vec![a]),
            1 => (c.scale(a, 0.5).unwrap(), vec![a]),
            2 => (c.rms_norm(a, 1e-5).unwrap(), vec![a]),
            3 => (c.soft_max(a).unwrap(), vec![a]),
            4 | 5 if !same.is_empty() => {
                let b = same[rng.below(same.len())];
                let y = match rng.below(3) {
                    0 => c.add(a, b),
                    1 => c.mul(a, b),
                    _ => c.swiglu(a, b),
                };
                (y.unwrap(), vec![a, b])
            }
            6 if ta.ne()[1] > 1 => {
                // A transposed view read back through a copy.
                let t = c.transpose(a).unwrap();
                (c.cont(t).unwrap(), vec![a])
            }
            7 => {
                // A view of the first row, added back to the whole.
                let v = c.view(a, [ta.ne()[0]], [ta.nb()[1]; 3], 0).unwrap();
                (c.add(a, v).unwrap(), vec![a])
            }
            _ => {
                let m = DIMS[rng.below(4)];
                let w = param(c, &format!("w{made}"), DType::F32, [ta.ne()[0], m]);
                (c.mul_mat(w, a).unwrap(), vec![a])
            }
        };
        made = c
            .tensors()
            .iter()
            .filter(|t| t.op().kind() != OpKind::None)
            .count();
        unread.retain(|t| !read.contains(t));
        pool.push(y);
        unread.push(y);
    }
    // Fold every dangling branch into the result so nothing made is dropped from the graph.
    let total = |c: &mut Context, t: TensorId| {
        let r = c.sum_rows(t).unwrap();
        let n = c.tensors()[r.index()].nelements();
        let r = c.reshape(r, [n]).unwrap();
        c.sum_rows(r).unwrap()
    };
    let mut acc = total(&mut ctx, *pool.last().unwrap());
    for &t in unread.iter().rev().skip(1) {
        let r = total(&mut ctx, t);
        acc = ctx.add(acc, r).unwrap();
    }
    let mut outs = vec![acc];
    for _ in 0..rng.below(3) {
        let o = pool[rng.below(pool.len())];
        if !outs.contains(&o) {
            outs.push(o);
        }
    }
    if rng.below(2) == 0 {
        ctx.set_output(outs[0]).unwrap();
    }
    let g = ctx.build_forward_multi(&outs).unwrap();
    (ctx, g)
}

/// Checks `plan` against lifetimes recomputed here from first principles: every tensor that needs
/// memory has an aligned offset inside the peak, and tensors live at the same step share no byte
/// unless one runs in place of the other. Returns the number of in-place pairs seen.
pub(crate) fn check_plan(g: &Graph, pre: &Bindings, plan: &Plan, alignment: usize) -> usize {
    let ts = g.tensors();
    let root = |mut id: TensorId| loop {
        if pre.slot(id).is_some() {
            return None;
        }
        match ts[id.index()].view_of() {
            Some(v) => id = v.src,
            None => return Some(id),
        }
    };
    let steps = g.nodes().len() + 1;
    let mut touched = g.leafs().to_vec();
    touched.extend(g.nodes());
    for &n in g.nodes() {
        touched.extend(ts[n.index()].srcs());
    }
    let mut life = std::collections::BTreeMap::new();
    for &id in &touched {
        let Some(r) = root(id) else { continue };
        if ts[r.index()].nbytes() == 0 || life.contains_key(&r) {
            continue;
        }
        let start = g.nodes().iter().position(|&n| n == r).map_or(0, |k| k + 1);
        let kept = touched.iter().chain(g.outputs()).any(|&t| {
            let f = ts[t.index()].flags();
            root(t) == Some(r) && (f.input || f.output || f.param || g.outputs().contains(&t))
        });
        let mut end = start;
        for (k, &n) in g.nodes().iter().enumerate() {
            if root(n) == Some(r) || ts[n.index()].srcs().any(|s| root(s) == Some(r)) {
                end = k + 1;
            }
        }
        let off = plan
            .offset(r)
            .unwrap_or_else(|| panic!("{} has no offset", g.label(r)));
        assert_eq!(off % alignment, 0, "{} misaligned", g.label(r));
        assert!(off + ts[r.index()].nbytes() <= plan.stats.peak);
        life.insert(r, (start, if kept { steps } else { end }, off));
    }
    assert_eq!(life.len(), plan.stats.tensors, "planned tensors");
    let (mut pairs, items): (usize, Vec<_>) = (0, life.iter().collect());
    for (i, &(&a, &(sa, ea, oa))) in items.iter().enumerate() {
        for &(&b, &(sb, eb, ob)) in &items[i + 1..] {
            let (na, nb) = (ts[a.index()].nbytes(), ts[b.index()].nbytes());
            if sa > eb || sb > ea || oa >= ob + nb || ob >= oa + na {
                continue;
            }
            // Overlap in time and bytes: only legal as a node taking over its dying src0.
            let in_place = |src: TensorId, end_src: usize, node: TensorId, start_node: usize| {
                let t = &ts[node.index()];
                t.src(0) == Some(src)
                    && end_src == start_node
                    && oa == ob
                    && super::can_run_in_place(t.op().kind())
                    && t.srcs().skip(1).all(|s| root(s) != Some(src))
                    && ts[src.index()].nbytes() == t.nbytes()
            };
            assert!(
                in_place(a, ea, b, sb) || in_place(b, eb, a, sa),
                "{} [{sa}, {ea}] @{oa}+{na} overlaps {} [{sb}, {eb}] @{ob}+{nb}",
                g.label(a),
                g.label(b)
            );
            pairs += 1;
        }
    }
    assert!(plan.stats.peak >= plan.stats.liveness_bound);
    pairs
}
