//! Planning foundation of the tensor-parallel meta device (design: `docs/src/meta-device.md`): split
//! states, uneven split lengths, the [`SplitPolicy`] trait that gives stored tensors their states
//! (the llama-family policy is `tessera_model::LlamaSplitPolicy`), and the propagation pass that
//! assigns a state to every tensor of a graph and places the all-reduces.
//!
//! Invariants:
//! - A [`SplitState`] of an axis kind always satisfies Σ_s Σ_j `lens[s][j]·repeats[s]` =
//!   the tensor's length on that axis (checked when built and when a static state meets its
//!   tensor), every segment has the same device count and repeats at least once. Pieces are
//!   ordered along the axis by segment, then repeat, then device; a device's slice is the
//!   concatenation of its pieces in that order.
//! - [`split::scatter`] and [`split::gather`] are exact inverses for axis and mirrored states,
//!   and for PARTIAL F32 values (the scatter writes `-0.0` to all devices but 0).
//! - [`propagate`] never panics: every unsupported combination is an
//!   [`Error::InvalidOp`](crate::Error::InvalidOp) naming the node, its op and its sources'
//!   states, raised while planning.
//! - A PARTIAL value only flows through linear ops; [`reduce_points`] are exactly the PARTIAL
//!   nodes some consumer (or the graph's output) needs summed, and all consumers of a reduced
//!   node read the sum.
//!
//! Divergences from upstream llama.cpp: MUL_MAT (A1, M) keeps the weight's segments on the
//! A0 result instead of collapsing them (equivalence ignores segments, and views of a fused QKV
//! output can then select their segment); the reshape rule errors instead of guessing when no
//! destination dim holds a whole number of split periods; ROPE rejects A0 and A2; SOFT_MAX
//! rejects A0 and masks or ALiBi that the split would misalign; MQA keeps K/V mirrored.

mod buffer;
mod device;
mod exec;
mod fallback;
mod inner;
mod local;
mod propagate;
pub mod ratio;
mod remap;
mod remote;
mod rules;
pub mod split;

#[cfg(test)]
mod tests_split;

pub use buffer::{COPY_ROW_ALIGN, MetaBuffer, MetaBufferType, Placement};
pub use device::MetaDevice;
pub use exec::{CommPath, MetaBackend, MetaStats};
pub use inner::{SplitLayout, SplitPolicy};
pub use local::local_tensors;
pub use propagate::{NodeStates, propagate, reduce_points};
pub use ratio::split_lengths;
pub use split::{
    MAX_SEGMENTS, Segment, SplitKind, SplitState, gather, local_runs, scatter, slice_desc,
};
