//! What a buffer or stream spanning several devices (a meta device's) reports through the plain
//! traits, so that callers read placements and all-reduce counters without knowing its type:
//! [`Buffer::spreads`](super::Buffer::spreads), [`Buffer::device_bytes`](super::Buffer::device_bytes),
//! [`BufferType::with_copies`](super::BufferType::with_copies) and
//! [`Backend::split_report`](super::Backend::split_report).

use std::fmt;

/// How a buffer spanning several devices holds one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spread {
    /// The tensor's name.
    pub tensor: String,
    /// Its offset in the buffer (what its binding says).
    pub offset: usize,
    /// Per device of the buffer, in device order: the tensor's bytes kept in that device's own
    /// memory (0 where the device reads another device's copy, or holds none of it).
    pub held: Vec<usize>,
    /// Every device sees the whole tensor: write it whole, in any pieces.
    pub mirrored: bool,
    /// The tensor whose memory this one's slices are windows into
    /// ([`BufferType::with_copies`](super::BufferType::with_copies)); such a tensor is not written.
    pub window_of: Option<String>,
}

/// Which all-reduce path a stream splitting ops over several devices uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommPath {
    /// One device: nothing to reduce.
    #[default]
    Single,
    /// The devices' backend's own comm functions (found by name through `proc_address`).
    Vendor(String),
    /// Tessera's generic all-reduce over streams and copies.
    Generic,
}

impl fmt::Display for CommPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommPath::Single => f.write_str("none (one device)"),
            CommPath::Vendor(b) => write!(f, "{b} comm"),
            CommPath::Generic => f.write_str("generic"),
        }
    }
}

/// Counters of a stream splitting ops over several devices, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Graphs computed.
    pub graphs: usize,
    /// Per-device sub-graphs enqueued (all devices).
    pub subgraphs: usize,
    /// All-reduces run by the vendor comm.
    pub vendor_reduces: usize,
    /// All-reduces run by the generic path.
    pub generic_reduces: usize,
    /// F32 values summed, over all reduces.
    pub reduced_values: usize,
    /// All-reduces whose sum crossed ranks (a distributed meta device).
    pub dist_reduces: usize,
}

/// What a stream that splits each op over several devices did: its all-reduce path, its
/// counters, and its last graph's all-reduces, host fallbacks and compute memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitReport {
    /// The all-reduce path chosen when the stream was made.
    pub comm_path: CommPath,
    /// Counters since the stream was made.
    pub stats: MetaStats,
    /// The last graph's all-reduces, in order: each reduced node's name and its F32 element count.
    pub reduces: Vec<(String, usize)>,
    /// The last graph's ops that ran on the host CPU instead, per device that has any:
    /// (device name, [(op name, nodes)]).
    pub fallbacks: Vec<(String, Vec<(String, usize)>)>,
    /// Compute-memory bytes each device reserved for the last graph.
    pub compute_bytes: Vec<usize>,
}
