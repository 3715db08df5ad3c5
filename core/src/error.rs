//! The one error type of Tessera. Variants are grouped by what the caller can do about them.

use crate::dtype::DType;

/// Every fallible Tessera call returns this error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // === The environment ===
    /// The backend cannot run here (no driver, library or device). Tests report it as a skip.
    #[error("{backend} unavailable: {reason}")]
    Unavailable {
        /// Backend name ("cpu", "cuda", ...).
        backend: String,
        /// Why, in words a user can act on.
        reason: String,
    },
    /// No device matches a name or selector.
    #[error("no device matches '{wanted}' (available: {available})")]
    NoSuchDevice {
        /// What was asked for.
        wanted: String,
        /// The device names that exist.
        available: String,
    },
    /// A vendor call failed; `code` is the vendor's own status.
    #[error("{backend}: {call} returned {code}")]
    Driver {
        /// Backend name.
        backend: String,
        /// The failing call.
        call: String,
        /// Vendor status code.
        code: i64,
    },
    /// A backend plugin broke its contract or panicked; the library file is named.
    #[error("plugin {file}: {call}: {reason}")]
    Plugin {
        /// The shared library.
        file: String,
        /// The ABI entry that failed.
        call: String,
        /// What happened (a panic's message, a contract breach).
        reason: String,
    },

    // === Planning: raised before anything is enqueued ===
    /// An op was built with operands it cannot take (shapes, dtypes, parameters).
    #[error("{op}: invalid operands for tensor {tensor}: {reason}")]
    InvalidOp {
        /// Op name in ggml spelling.
        op: String,
        /// The offending tensor (name and id).
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A device cannot run an op on these dtypes.
    #[error("{op} on {dtype} is not supported by {device}: {reason}")]
    Unsupported {
        /// Op name in ggml spelling.
        op: String,
        /// The dtype of the node's first source (or the node).
        dtype: DType,
        /// Device name.
        device: String,
        /// Why not.
        reason: String,
    },
    /// A tensor id that does not belong to the context or graph.
    #[error("unknown tensor id {id} (context has {len} tensors)")]
    UnknownTensor {
        /// The id.
        id: usize,
        /// Tensors in the context.
        len: usize,
    },
    /// A graph touches a tensor that has no storage in the bindings.
    #[error("tensor {tensor} is not allocated in any buffer")]
    NotAllocated {
        /// The tensor (name and id).
        tensor: String,
    },
    /// A buffer object of another backend was passed where this backend's own was required.
    #[error("{backend} cannot use a foreign object: {what}")]
    Foreign {
        /// The backend that refused.
        backend: String,
        /// What was passed.
        what: String,
    },
    /// A caller-supplied argument is invalid (and nothing more specific applies).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    // === Memory ===
    /// A read or write that does not fit its buffer or tensor.
    #[error("{what}: range {offset}..{end} is outside 0..{size}")]
    OutOfBounds {
        /// The buffer or tensor.
        what: String,
        /// Start of the range.
        offset: usize,
        /// End of the range.
        end: usize,
        /// Size of the object.
        size: usize,
    },
    /// A host slice whose length does not match what the tensor needs.
    #[error("tensor {tensor}: host data has {got} bytes, expected {expected}")]
    SizeMismatch {
        /// The tensor.
        tensor: String,
        /// Bytes supplied.
        got: usize,
        /// Bytes needed.
        expected: usize,
    },
    /// May succeed later, once memory is freed.
    #[error("out of memory on {device}: {requested} bytes requested")]
    OutOfMemory {
        /// Device name.
        device: String,
        /// Bytes requested.
        requested: usize,
    },
    /// The buffer cannot be written (it wraps read-only host memory).
    #[error("buffer {0} is read-only")]
    ReadOnly(String),

    // === Model files ===
    /// A model file could not be read or written, or lacks what was asked of it. It holds the
    /// file format crate's own error (`tessera_gguf::GgufError` for GGUF), which converts into
    /// this variant with `?`; [`Error::file_error`] gives it back typed.
    #[error(transparent)]
    File(Box<dyn std::error::Error + Send + Sync + 'static>),

    // === Several processes ===
    /// A collective between the processes (ranks) of a distributed job failed or timed out;
    /// `rank` is the rank reporting it, `reason` names the peers and the collective.
    #[error("{engine} rank {rank}: {reason}")]
    Dist {
        /// The engine ("mpi", "threads").
        engine: String,
        /// The rank that raised it.
        rank: usize,
        /// What failed, naming the ranks concerned.
        reason: String,
    },

    // === Execution ===
    /// A graph failed while running on a device; later calls on that stream report it once.
    #[error("compute failed on {device}: {reason}")]
    Compute {
        /// Device name.
        device: String,
        /// What failed.
        reason: String,
    },
}

impl Error {
    /// The file format error inside an [`Error::File`], if it is a `T`
    /// (`e.file_error::<tessera_gguf::GgufError>()` to match on its kind).
    pub fn file_error<T: std::error::Error + 'static>(&self) -> Option<&T> {
        match self {
            Error::File(e) => e.downcast_ref::<T>(),
            _ => None,
        }
    }
}

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that `offset..offset+len` lies inside `0..size`.
///
/// # Errors
/// [`Error::OutOfBounds`] naming `what` when it does not (overflow included).
pub fn check_range(
    what: &dyn std::fmt::Display,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        end => Err(Error::OutOfBounds {
            what: what.to_string(),
            offset,
            end: end.unwrap_or(usize::MAX),
            size,
        }),
    }
}
