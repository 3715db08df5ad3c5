//! The graph IR: a [`Context`] of tensor descriptions and the [`Graph`] of ops to run.
//!
//! Invariants: descriptors are created only by the context's checked builders, so a backend may
//! rely on every node's operands having the shapes and dtypes its op requires. A graph owns a
//! snapshot of the context (cheap to clone), so it can be queued on a device and outlive the
//! builder.

mod context;

pub use context::Context;
pub use context::label_of;

use crate::error::{Error, Result};
use crate::tensor::{TensorDesc, TensorId};
use std::collections::HashSet;
use std::sync::Arc;

/// Ops in dependency order plus the descriptors they refer to.
#[derive(Clone, Debug)]
pub struct Graph {
    tensors: Arc<[TensorDesc]>,
    nodes: Vec<TensorId>,
    leafs: Vec<TensorId>,
    outputs: Vec<TensorId>,
}

impl Graph {
    pub(crate) fn build(tensors: Vec<TensorDesc>, outs: &[TensorId]) -> Graph {
        let tensors: Arc<[TensorDesc]> = tensors.into();
        let mut visited = vec![false; tensors.len()];
        let (mut nodes, mut leafs) = (Vec::new(), Vec::new());
        // Iterative post-order DFS: deep graphs (hundreds of layers) must not overflow the stack.
        let mut stack: Vec<(TensorId, bool)> = Vec::new();
        for &o in outs {
            stack.push((o, false));
            while let Some((id, expanded)) = stack.pop() {
                if expanded {
                    let t = &tensors[id.index()];
                    if t.op.kind() == crate::ops::OpKind::None {
                        leafs.push(id)
                    } else {
                        nodes.push(id)
                    }
                    continue;
                }
                if visited[id.index()] {
                    continue;
                }
                visited[id.index()] = true;
                stack.push((id, true));
                let t = &tensors[id.index()];
                // A view's base must be computed before anything reads or writes through the view.
                let deps = t.srcs().chain(t.view.map(|v| v.src));
                let deps: Vec<_> = deps.collect();
                for d in deps.into_iter().rev() {
                    if !visited[d.index()] {
                        stack.push((d, false));
                    }
                }
            }
        }
        Graph {
            tensors,
            nodes,
            leafs,
            outputs: outs.to_vec(),
        }
    }

    /// All descriptors of the context the graph was built from.
    pub fn tensors(&self) -> &[TensorDesc] {
        &self.tensors
    }
    /// Descriptor of `id`.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn tensor(&self, id: TensorId) -> Result<&TensorDesc> {
        self.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: self.tensors.len(),
        })
    }
    /// Nodes (tensors with an op) in execution order.
    pub fn nodes(&self) -> &[TensorId] {
        &self.nodes
    }
    /// Leaves (tensors without an op) the nodes read.
    pub fn leafs(&self) -> &[TensorId] {
        &self.leafs
    }
    /// The tensors the graph was built for.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }
    /// `'name' #3` or `#3`.
    pub fn label(&self, id: TensorId) -> String {
        label_of(&self.tensors, id)
    }
    /// The same graph with every node flagged and listed as an output, for debugging: no
    /// allocator reuses a node's memory, so after a compute every node's value can be read back
    /// (what `--check-finite` does to name the first op producing a NaN or infinity).
    pub fn with_all_outputs(&self) -> Graph {
        let mut tensors: Vec<TensorDesc> = self.tensors.to_vec();
        for &id in &self.nodes {
            tensors[id.index()].flags.output = true;
        }
        Graph {
            tensors: tensors.into(),
            nodes: self.nodes.clone(),
            leafs: self.leafs.clone(),
            outputs: self.nodes.clone(),
        }
    }
    /// Whether `other` is this very graph (or a clone of it): the same descriptor list, not
    /// merely equal descriptors, and the same nodes, leaves and outputs. Descriptors never change
    /// once built, so a backend may reuse what it planned for a graph whenever this holds (and
    /// the tensors' addresses are the same).
    pub fn is_same(&self, other: &Graph) -> bool {
        Arc::ptr_eq(&self.tensors, &other.tensors)
            && self.nodes == other.nodes
            && self.leafs == other.leafs
            && self.outputs == other.outputs
    }
    /// The shared descriptor list (sub-graphs of one graph share it).
    pub(crate) fn tensors_arc(&self) -> &Arc<[TensorDesc]> {
        &self.tensors
    }

    /// A graph over `tensors` with the given nodes (in execution order), leaves and outputs,
    /// for decoders of serialized graphs (the plugin ABI). Ids must index `tensors`; nothing
    /// else is checked, so build graphs with [`Context::build_forward`] where you can. Hidden from
    /// the docs: it exists for `tessera-plugin`'s decoder.
    #[doc(hidden)]
    pub fn from_parts(
        tensors: Arc<[TensorDesc]>,
        nodes: Vec<TensorId>,
        leafs: Vec<TensorId>,
        outputs: Vec<TensorId>,
    ) -> Graph {
        Graph {
            tensors,
            nodes,
            leafs,
            outputs,
        }
    }
}

/// Tensors `nodes` read (sources and viewed tensors) that they do not produce.
pub(crate) fn referenced(tensors: &[TensorDesc], nodes: &[TensorId]) -> Vec<TensorId> {
    let set: HashSet<TensorId> = nodes.iter().copied().collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for &n in nodes {
        let t = &tensors[n.index()];
        for r in t.srcs().chain(t.view_of().map(|v| v.src)) {
            if !set.contains(&r) && seen.insert(r) {
                out.push(r);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    #[test]
    fn topological_order_and_leaves() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, [4, 3]).unwrap();
        let b = ctx.new_tensor(DType::F32, [4]).unwrap();
        let c = ctx.add(a, b).unwrap();
        let d = ctx.silu(c).unwrap();
        let e = ctx.mul(d, c).unwrap();
        let g = ctx.build_forward(e).unwrap();
        assert_eq!(g.nodes(), &[c, d, e]);
        assert_eq!(g.leafs(), &[a, b]);
    }

    #[test]
    fn strided_views_span_their_farthest_element() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, [1 << 10, 4]).unwrap();
        let t = ctx.transpose(a).unwrap();
        // Transposed: ne = [4, 1024], nb = [4096, 4]: the span is the whole source, not 4 rows.
        assert_eq!(
            ctx.tensor(t).unwrap().nbytes(),
            ctx.tensor(a).unwrap().nbytes()
        );
        let b = ctx.new_tensor(DType::F16, [3, 5, 7]).unwrap();
        let p = ctx.permute(b, [2, 0, 1, 3]).unwrap();
        assert_eq!(ctx.tensor(p).unwrap().nbytes(), 3 * 5 * 7 * 2);
        let q = ctx.new_tensor(DType::Q8_0, [64, 3]).unwrap();
        assert_eq!(ctx.tensor(q).unwrap().nbytes(), 2 * 34 * 3);
    }

    #[test]
    fn byte_sizes_that_overflow_are_refused() {
        let mut ctx = Context::new();
        // 2^62 elements fit usize, 2^64 bytes do not.
        assert!(
            ctx.new_tensor(DType::F32, [1 << 21, 1 << 21, 1 << 20])
                .is_err()
        );
        let a = ctx
            .new_tensor(DType::F32, [1, 1 << 31])
            .unwrap_or_else(|e| panic!("{e}"));
        let b = ctx.new_tensor(DType::F32, [1, 1 << 31]).unwrap();
        // [2^31, 2^31] f32 outputs need 2^64 bytes.
        assert!(matches!(ctx.mul_mat(a, b), Err(Error::InvalidOp { .. })));
    }

    #[test]
    fn bad_operands_are_typed_errors() {
        let mut ctx = Context::new();
        let a = ctx.new_named("w", DType::Q8_0, [64, 8]).unwrap();
        let x = ctx.new_tensor(DType::F32, [32, 2]).unwrap();
        let err = ctx.mul_mat(a, x).unwrap_err().to_string();
        assert!(
            err.contains("MUL_MAT") && err.contains("k differs"),
            "{err}"
        );
        assert!(ctx.new_tensor(DType::Q4_0, [33]).is_err());
        assert!(ctx.reshape(x, [5, 5]).is_err());
        let t = ctx.transpose(x).unwrap();
        let err = ctx.reshape(t, [64]).unwrap_err().to_string();
        assert!(err.contains("not contiguous"), "{err}");
        assert!(ctx.view(x, [32, 3], [128, 384, 384], 0).is_err());
        assert!(ctx.permute(x, [0, 0, 1, 2]).is_err());
        assert!(matches!(
            ctx.add(x, TensorId::from_index(999)),
            Err(Error::InvalidOp { .. })
        ));
    }
}
