//! Collectives between devices: the generic all-reduce every device set can use, and the comm
//! trio (`comm_init`, `comm_allreduce_tensor`, `comm_free`) through which a backend offers its
//! own, found by name with [`crate::Registry::proc_address`].
//!
//! [`AllReduce`] sums one f32 slice per device in place using only what every backend offers:
//! queued copies ([`crate::Backend::copy_async`]), a one-node ADD graph, and events. Nothing
//! blocks the host. Small tensors use recursive doubling (⌈log2 N⌉ exchanges of the whole slice,
//! with a fold for non-power-of-two N); large ones a ring reduce-scatter + all-gather, whose
//! busiest device sends 2(N−1)/N of the slice. Every device ends bit-identical: each pair adds
//! the same two operands, and in the ring each chunk is reduced once and then broadcast.
//!
//! Invariants: every write into a device's scratch or slice by another stream waits for an event
//! recorded after that device's last use of the region (one scratch region per step, so no step
//! overwrites what an earlier step still reads); slices that do not contribute are overwritten
//! with zeros copied from a zero buffer, never scaled by 0 (stale NaN · 0 = NaN).

mod dist;
mod generic;
mod vendor;
mod vendor_export;

pub use dist::{DistComm, ThreadGroup, allreduce_bf16, check_same, fnv1a};
pub use generic::{Algorithm, AllReduce, CommSlice, DEFAULT_RING_THRESHOLD, ReducePath, Wire};
pub use vendor::{
    COMM_ALLREDUCE, COMM_FREE, COMM_ID_BYTES, COMM_INIT, COMM_INIT_RANKS, COMM_UNIQUE_ID,
    CommAllReduceFn, CommApi, CommFreeFn, CommInitFn, CommInitRanksFn, CommOutcome, CommUniqueIdFn,
    RanksCommApi, RawCommSlice, VendorComm,
};
pub use vendor_export::{
    CommCall, comm_allreduce_with, comm_free_with, comm_init_with, comm_proc_address,
};
