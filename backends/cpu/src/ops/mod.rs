//! The CPU implementation of every op. Each op family has its own file; this one dispatches
//! nodes, answers `supports_op`, and holds the per-run shared state.
//!
//! Threads walk the graph together: every thread calls each node's kernel with its index, the
//! kernel handles that thread's share of the output rows, and a barrier separates a node from
//! the nodes before it whose memory it shares (`schedule`).

mod attn;
mod copy;
mod elementwise;
mod matmul;
mod moe;

mod norm;
mod rope;
mod schedule;

pub(crate) use schedule::{Step, schedule};

use crate::pool::Barrier;
use crate::tview::TView;
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use tessera_core::{Graph, Op, OpKind, Support, TensorDesc, TensorId};

/// State shared by the threads of one graph run.
pub(crate) struct Exec<'a> {
    pub graph: &'a Graph,
    pub views: &'a [Option<TView>],
    pub barrier: &'a Barrier,
    pub shared: &'a SharedScratch,
    /// The computing nodes in order, with the barriers between them.
    pub steps: &'a [Step],
    /// One work counter per step for dynamically scheduled chunks: zero at the start of the
    /// run, so that nodes without a barrier between them never share one.
    pub counters: &'a [Counter],
    /// The first data-dependent failure (e.g. a row index out of range).
    pub error: &'a Mutex<Option<String>>,
}

impl Exec<'_> {
    pub(crate) fn desc(&self, id: TensorId) -> &TensorDesc {
        &self.graph.tensors()[id.index()]
    }
    pub(crate) fn view(&self, id: TensorId) -> TView {
        // Every tensor of the graph was resolved in `prepare`; a missing one is a Tessera bug.
        self.views[id.index()].unwrap_or_else(|| unreachable!("tensor {id} not resolved"))
    }
    pub(crate) fn src(&self, node: TensorId, i: usize) -> TView {
        let id = self
            .desc(node)
            .src(i)
            .unwrap_or_else(|| unreachable!("node {node} lacks source {i}"));
        self.view(id)
    }
    pub(crate) fn fail(&self, msg: String) {
        self.error.lock().get_or_insert(msg);
    }
}

/// A work counter on a cache line of its own: the threads of neighbouring nodes take chunks
/// from theirs at the same time.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Counter(pub AtomicUsize);

/// Per-thread reusable buffers.
#[derive(Default)]
pub(crate) struct ThreadScratch {
    /// MUL_MAT output tile.
    pub tile: Vec<f32>,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub c: Vec<f32>,
    pub bytes: Vec<u8>,
    /// MUL_MAT_ID's expert grouping.
    pub routing: moe::Routing,
    pub attn: attn::AttnScratch,
}

impl ThreadScratch {
    pub(crate) fn rows(&mut self, n: usize) -> (&mut [f32], &mut [f32], &mut [f32]) {
        for v in [&mut self.a, &mut self.b, &mut self.c] {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        }
        (&mut self.a[..n], &mut self.b[..n], &mut self.c[..n])
    }
}

/// Scratch memory shared by the threads of a run (quantized activations of MUL_MAT). Threads
/// write disjoint ranges, separated from the readers by a barrier.
#[derive(Default)]
pub(crate) struct SharedScratch {
    mem: Vec<u64>,
    /// `mem.as_mut_ptr()` taken in `ensure`: writes go through a pointer that allows them.
    ptr: Option<std::ptr::NonNull<u8>>,
}

// SAFETY: the pointer targets `mem`, owned by this value; threads use disjoint ranges separated by
// barriers (see `slice_mut`).
#[allow(unsafe_code)]
unsafe impl Sync for SharedScratch {}
// SAFETY: as for Sync; the memory moves with the value.
#[allow(unsafe_code)]
unsafe impl Send for SharedScratch {}

#[allow(unsafe_code)]
impl SharedScratch {
    pub(crate) fn ensure(&mut self, bytes: usize) {
        let words = bytes.div_ceil(8);
        if self.mem.len() < words {
            self.mem.resize(words, 0);
        }
        self.ptr = std::ptr::NonNull::new(self.mem.as_mut_ptr() as *mut u8);
    }
    fn len(&self) -> usize {
        if self.ptr.is_some() {
            self.mem.len() * 8
        } else {
            0
        }
    }
    fn base(&self) -> *mut u8 {
        self.ptr.map_or(std::ptr::null_mut(), |p| p.as_ptr())
    }
    /// Mutable access to `range`.
    ///
    /// # Safety
    /// No other thread may access `range` until the next barrier.
    // Threads share `&SharedScratch` and each writes its own range: a mutable slice from a
    // shared reference is the point, with exclusivity as the documented contract.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, range: Range<usize>) -> &mut [u8] {
        assert!(range.end <= self.len(), "shared scratch overrun");
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(range.start), range.len()) }
    }
    /// Read access to `range` once the writers have passed a barrier.
    pub(crate) fn slice(&self, range: Range<usize>) -> &[u8] {
        assert!(range.end <= self.len(), "shared scratch overrun");
        // SAFETY: in bounds; writers finished before the barrier that precedes every reader.
        unsafe {
            std::slice::from_raw_parts(self.base().add(range.start) as *const u8, range.len())
        }
    }
}

/// The rows `ith` handles when `total` rows are split evenly over `nth` threads.
pub(crate) fn split_range(total: usize, ith: usize, nth: usize) -> Range<usize> {
    let per = total.div_ceil(nth.max(1));
    let start = (ith * per).min(total);
    start..(start + per).min(total)
}

/// Thread `ith`'s share of the rows of a tensor with shape `ne`, as `(i1, i2, i3)`.
pub(crate) fn my_rows(
    ne: [usize; 4],
    ith: usize,
    nth: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    split_range(ne[1] * ne[2] * ne[3], ith, nth).map(move |r| row_index(r, ne))
}

/// `(i1, i2, i3)` of flat row `r` of a tensor with shape `ne`.
pub(crate) fn row_index(r: usize, ne: [usize; 4]) -> (usize, usize, usize) {
    (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]))
}

/// Runs every step of the graph on thread `ith` of `nth`.
pub(crate) fn run_nodes(exec: &Exec<'_>, ith: usize, nth: usize) {
    let mut ts = ThreadScratch::default();
    for (step, counter) in exec.steps.iter().zip(exec.counters) {
        if step.barrier {
            exec.barrier.wait();
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compute_node(exec, step, &counter.0, ith, nth, &mut ts)
        }));
        if ok.is_err() {
            // A Tessera bug, not user input: report it and let every other thread run free.
            let t = exec.desc(step.node);
            exec.fail(format!(
                "{} {} panicked on thread {ith}",
                t.op().name(),
                exec.graph.label(step.node)
            ));
            exec.barrier.poison();
            return;
        }
    }
}

fn compute_node(
    exec: &Exec<'_>,
    step: &Step,
    counter: &AtomicUsize,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let node = step.node;
    let t = exec.desc(node);
    match *t.op() {
        Op::Add | Op::Sub | Op::Mul | Op::Div => elementwise::binary(exec, node, ith, nth, ts),
        Op::Scale { .. } | Op::Sqr | Op::Sqrt | Op::Clamp { .. } | Op::Unary(_) => {
            elementwise::map(exec, node, ith, nth, ts)
        }
        Op::Glu { .. } | Op::SwigluOai { .. } => elementwise::glu(exec, node, ith, nth, ts),
        Op::MulMatId { first_expert } => {
            moe::mul_mat_id(exec, node, first_expert, counter, ith, nth, ts)
        }
        Op::AddId => moe::add_id(exec, node, ith, nth, ts),
        Op::Argsort { .. } => moe::argsort(exec, node, ith, nth, ts),
        Op::RmsNorm { .. } | Op::Norm { .. } => norm::norm(exec, node, ith, nth, ts),
        Op::SumRows => norm::sum_rows(exec, node, ith, nth, ts),
        Op::Argmax => norm::argmax(exec, node, ith, nth, ts),
        Op::SoftMax { .. } => norm::soft_max(exec, node, ith, nth, ts),
        Op::Rope(p) => rope::rope(exec, node, &p, ith, nth, ts),
        Op::MulMat => matmul::mul_mat(exec, node, step.reuse_act, counter, ith, nth, ts),
        Op::FlashAttnExt { .. } => attn::flash_attn_ext(exec, node, ith, nth, ts),
        Op::Cont | Op::Cpy => copy::cpy(exec, node, ith, nth, ts),
        Op::GetRows => copy::get_rows(exec, node, ith, nth, ts),
        Op::SetRows => copy::set_rows(exec, node, ith, nth, ts),
        Op::Concat { dim } => copy::concat(exec, node, dim, ith, nth, ts),
        // View-like ops compute nothing; future ops are refused by `supports` before a run.
        _ => {}
    }
}

/// Whether the CPU kernels implement node `node` for its dtypes.
pub(crate) fn supports(tensors: &[TensorDesc], node: TensorId) -> Support {
    let Some(t) = tensors.get(node.index()) else {
        return Support::No(format!("unknown tensor {node}"));
    };
    let src_dtype = |i: usize| {
        t.src(i)
            .and_then(|s| tensors.get(s.index()))
            .map(|s| s.dtype())
    };
    match t.op().kind() {
        OpKind::FlashAttnExt
            if ![1, 2].into_iter().all(|i| {
                t.src(i)
                    .and_then(|s| tensors.get(s.index()))
                    .is_some_and(|s| attn::kv_supported(s.dtype(), s.ne()[0]))
            }) =>
        {
            Support::No(format!(
                "FLASH_ATTN_EXT has no CPU kernel for K {} / V {} (or rows of partial blocks)",
                src_dtype(1).map_or("?", |d| d.name()),
                src_dtype(2).map_or("?", |d| d.name())
            ))
        }
        // Q8_K is an activation format (as in ggml): no weight kernel takes it.
        k @ (OpKind::MulMat | OpKind::MulMatId)
            if src_dtype(0)
                .is_some_and(|d| tessera_kernels::cpu::WeightType::of_dtype(d).is_none()) =>
        {
            Support::No(format!(
                "{k} has no CPU kernel for {} weights",
                src_dtype(0).map_or("unknown".into(), |d| d.to_string())
            ))
        }
        OpKind::None
        | OpKind::View
        | OpKind::Reshape
        | OpKind::Permute
        | OpKind::Transpose
        | OpKind::Cont
        | OpKind::Cpy
        | OpKind::GetRows
        | OpKind::SetRows
        | OpKind::Concat
        | OpKind::Add
        | OpKind::Sub
        | OpKind::Mul
        | OpKind::Div
        | OpKind::Scale
        | OpKind::Sqr
        | OpKind::Sqrt
        | OpKind::Clamp
        | OpKind::Unary
        | OpKind::Glu
        | OpKind::RmsNorm
        | OpKind::Norm
        | OpKind::SumRows
        | OpKind::Argmax
        | OpKind::SoftMax
        | OpKind::Rope
        | OpKind::MulMat
        | OpKind::FlashAttnExt
        | OpKind::MulMatId
        | OpKind::AddId
        | OpKind::Argsort
        | OpKind::SwigluOai => Support::Yes,
        other => Support::No(format!("{other} has no CPU kernel")),
    }
}

/// Bytes of shared scratch the graph's nodes need (the largest MUL_MAT activation set).
pub(crate) fn shared_scratch_bytes(graph: &Graph) -> usize {
    graph
        .nodes()
        .iter()
        .map(|&n| {
            let t = &graph.tensors()[n.index()];
            match t.op().kind() {
                OpKind::MulMat => matmul::act_bytes(graph.tensors(), t),
                OpKind::MulMatId => moe::act_bytes(graph.tensors(), t),
                _ => 0,
            }
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::{Context, DType};

    #[test]
    fn mul_mat_weights_need_a_kernel() {
        for (dtype, ok) in [
            (DType::Q4_K, true),
            (DType::Q5_0, true),
            (DType::Q4_1, true),
            (DType::Q5_1, true),
            (DType::Q6_K, true),
            (DType::Q2_K, true),
            (DType::Q3_K, true),
            (DType::IQ4_NL, true),
            (DType::IQ4_XS, true),
            (DType::MXFP4, true),
            (DType::Q8_K, false),
        ] {
            let mut ctx = Context::new();
            let w = ctx.new_tensor(dtype, [256, 4]).unwrap();
            let x = ctx.new_tensor(DType::F32, [256, 2]).unwrap();
            let y = ctx.mul_mat(w, x).unwrap();
            let g = ctx.build_forward(y).unwrap();
            let s = supports(g.tensors(), y);
            assert_eq!(matches!(s, Support::Yes), ok, "{dtype}: {s:?}");
        }
    }
}
