//! Graph allocation: where each intermediate tensor of a graph lives in one compute buffer, after
//! ggml-alloc.
//!
//! [`plan`] is the pure part (the scheduler calls it per backend); [`GraphAllocator`] owns a
//! compute buffer of one [`crate::BufferType`], plans each graph into it and returns
//! [`crate::Bindings`] for [`crate::Backend::compute`].
//!
//! Invariants of a plan:
//! - It places every non-view tensor the graph touches that the caller's bindings do not already
//!   place (directly or through a view chain); views resolve through their base and get no entry.
//! - A tensor is live from right before the node that produces it (leaves and tensors no node
//!   produces: from before the first node) through the last node that reads or writes it,
//!   directly or through any chain of views (CPY and SET_ROWS results are views of their
//!   destination). Input, output and param tensors and the graph's outputs are never freed.
//! - Two tensors whose lifetimes overlap never share a byte, except a node running in place of
//!   its first source at the very step that source dies (row-wise same-shape ops only, see
//!   [`can_run_in_place`]).
//! - Offsets are aligned to the buffer type's alignment; freed memory is reused best-fit, with
//!   neighbours coalesced; the plan is a deterministic function of the graph and the bindings.
//!   When that online pass leaves fragmentation (peak above the liveness bound), an offline
//!   placement by decreasing size is tried too and the smaller of the two is kept.
//!
//! ```
//! use tessera_core::alloc::plan;
//! use tessera_core::{Bindings, Context, DType};
//! let mut ctx = Context::new();
//! let x = ctx.new_tensor(DType::F32, [256]).unwrap(); // 1 KiB
//! let y = ctx.sqr(x).unwrap(); // runs in place of x
//! let s = ctx.sum_rows(y).unwrap(); // needs its own 4 bytes (64 aligned)
//! let g = ctx.build_forward(s).unwrap();
//! let p = plan(&g, &Bindings::new(), 64, &|t| t.nbytes()).unwrap();
//! assert_eq!((p.stats.peak, p.stats.in_place), (1024 + 64, 1));
//! assert_eq!(p.offset(y), p.offset(x));
//! ```

mod free_list;
mod graph_allocator;
mod greedy;
mod liveness;
mod planner;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

pub use graph_allocator::GraphAllocator;
pub use liveness::can_run_in_place;
pub use planner::{Plan, PlanStats, plan};
