//! Tensor descriptors: dtype, shape (`ne`), byte strides (`nb`), op, sources, view origin, name
//! and flags. Storage is not part of a descriptor: [`crate::backend::Bindings`] place tensors
//! in buffers, so one graph can run against several allocations.
//!
//! Conventions are ggml's: `ne[0]` is the contiguous axis, `nb[0]` is the byte size of one block,
//! and unused trailing axes have length 1.

use crate::dtype::DType;
use crate::ops::Op;
use std::fmt;

/// Maximum rank.
pub const MAX_DIMS: usize = 4;
/// Maximum number of sources of one op.
pub const MAX_SRC: usize = 5;

/// Index of a tensor in its [`crate::graph::Context`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub(crate) u32);

impl TensorId {
    /// The index as `usize`.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The id of index `i`; only meaningful for the context it came from.
    pub const fn from_index(i: usize) -> TensorId {
        TensorId(i as u32)
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Role flags of a tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags {
    /// Written by the user before each compute.
    pub input: bool,
    /// Read by the user after compute; its memory is never reused for other tensors.
    pub output: bool,
    /// Static data (weights, caches) rather than an activation.
    pub param: bool,
}

/// Where a view's data lives: `offset` bytes into `src`'s data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewOf {
    /// The viewed tensor.
    pub src: TensorId,
    /// Byte offset into it.
    pub offset: usize,
}

/// Everything about a tensor but its storage.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub(crate) dtype: DType,
    pub(crate) ne: [usize; MAX_DIMS],
    pub(crate) nb: [usize; MAX_DIMS],
    pub(crate) op: Op,
    pub(crate) src: [Option<TensorId>; MAX_SRC],
    pub(crate) view: Option<ViewOf>,
    pub(crate) name: String,
    pub(crate) flags: TensorFlags,
}

/// Every field of a [`TensorDesc`], for code that rebuilds descriptors from a serialized form
/// (the plugin ABI's flat graphs). A [`crate::Context`] is the checked way to make descriptors;
/// one rebuilt from parts is only as consistent as what it was decoded from. Hidden from the
/// docs: it exists for `tessera-plugin`'s decoder and may grow fields in any release.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct TensorParts {
    /// Element type.
    pub dtype: DType,
    /// Sizes, innermost first.
    pub ne: [usize; MAX_DIMS],
    /// Strides in bytes.
    pub nb: [usize; MAX_DIMS],
    /// The op that computes it ([`Op::None`] for leaves).
    pub op: Op,
    /// Sources of the op.
    pub src: [Option<TensorId>; MAX_SRC],
    /// The tensor whose storage this one views, if any.
    pub view: Option<ViewOf>,
    /// Name (may be empty).
    pub name: String,
    /// Input / output / parameter flags.
    pub flags: TensorFlags,
}

impl TensorDesc {
    /// A descriptor from its parts (see [`TensorParts`]).
    #[doc(hidden)]
    pub fn from_parts(p: TensorParts) -> TensorDesc {
        TensorDesc {
            dtype: p.dtype,
            ne: p.ne,
            nb: p.nb,
            op: p.op,
            src: p.src,
            view: p.view,
            name: p.name,
            flags: p.flags,
        }
    }

    pub(crate) fn new(dtype: DType, ne: [usize; MAX_DIMS], op: Op) -> TensorDesc {
        TensorDesc {
            dtype,
            ne,
            nb: contiguous_strides(dtype, ne),
            op,
            src: [None; MAX_SRC],
            view: None,
            name: String::new(),
            flags: TensorFlags::default(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape, `ne[0]` innermost.
    pub fn ne(&self) -> [usize; MAX_DIMS] {
        self.ne
    }
    /// Byte strides.
    pub fn nb(&self) -> [usize; MAX_DIMS] {
        self.nb
    }
    /// The op that produces this tensor.
    pub fn op(&self) -> &Op {
        &self.op
    }
    /// Source `i`, if present.
    pub fn src(&self, i: usize) -> Option<TensorId> {
        self.src.get(i).copied().flatten()
    }
    /// All present sources in order.
    pub fn srcs(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.src.iter().flatten().copied()
    }
    /// The tensor this one is a view of, if any.
    pub fn view_of(&self) -> Option<ViewOf> {
        self.view
    }
    /// Name (may be empty).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Role flags.
    pub fn flags(&self) -> TensorFlags {
        self.flags
    }
    /// Number of elements.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }
    /// Number of rows (elements / ne0).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
    /// Bytes one contiguous row of `ne[0]` elements takes.
    pub fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.type_size()
    }
    /// Bytes spanned from the first to one past the last element, following the strides
    /// (ggml's rule: a transposed or permuted view spans more than its row bytes suggest).
    /// Saturates instead of wrapping, so an impossible layout fails every bounds check.
    pub fn nbytes(&self) -> usize {
        if self.ne.contains(&0) {
            return 0;
        }
        let blck = self.dtype.block_size();
        let mut bytes = if blck == 1 {
            // Element 0 plus the farthest element along every axis, axis 0 included.
            self.dtype
                .type_size()
                .saturating_add((self.ne[0] - 1).saturating_mul(self.nb[0]))
        } else {
            // Quantized rows are always dense: whole blocks of nb[0] bytes.
            (self.ne[0] / blck).saturating_mul(self.nb[0])
        };
        for d in 1..MAX_DIMS {
            bytes = bytes.saturating_add((self.ne[d] - 1).saturating_mul(self.nb[d]));
        }
        bytes
    }
    /// Whether elements are densely packed in the natural order.
    pub fn is_contiguous(&self) -> bool {
        self.nb == contiguous_strides(self.dtype, self.ne) || self.nelements() == 0 || {
            // Axes of length 1 may carry any stride.
            let want = contiguous_strides(self.dtype, self.ne);
            (0..MAX_DIMS).all(|d| self.ne[d] == 1 || self.nb[d] == want[d])
        }
    }
    /// Whether each row (`ne[0]` elements) is contiguous, whatever the outer strides.
    pub fn is_row_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.type_size() || self.ne[0] == 1
    }
    /// Whether this tensor's data is another tensor's (a view, reshape, permute, copy target...).
    pub fn is_view(&self) -> bool {
        self.view.is_some()
    }
    /// Whether axes are in a non-monotonic stride order (a permuted view).
    pub fn is_permuted(&self) -> bool {
        self.nb[0] > self.nb[1] || self.nb[1] > self.nb[2] || self.nb[2] > self.nb[3]
    }
    /// Byte offset of element `(i0, i1, i2, i3)`; `i0` must be a multiple of the block size.
    pub fn offset_of(&self, i: [usize; MAX_DIMS]) -> usize {
        i[0] / self.dtype.block_size() * self.nb[0]
            + i[1] * self.nb[1]
            + i[2] * self.nb[2]
            + i[3] * self.nb[3]
    }
    /// Whether two tensors have identical shapes.
    pub fn same_shape(&self, other: &TensorDesc) -> bool {
        self.ne == other.ne
    }
    /// Whether `other` can be broadcast to this tensor's shape (each length divides).
    pub fn can_broadcast(&self, other: &TensorDesc) -> bool {
        (0..MAX_DIMS).all(|d| other.ne[d] != 0 && self.ne[d].is_multiple_of(other.ne[d]))
    }
}

/// Byte strides of a densely packed tensor (saturating: shapes whose size does not fit are
/// refused by [`dense_bytes`] before a tensor is made).
pub fn contiguous_strides(dtype: DType, ne: [usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let mut nb = [0; MAX_DIMS];
    nb[0] = dtype.type_size();
    nb[1] = nb[0].saturating_mul(ne[0] / dtype.block_size());
    nb[2] = nb[1].saturating_mul(ne[1]);
    nb[3] = nb[2].saturating_mul(ne[2]);
    nb
}

/// Bytes of a densely packed tensor, or `None` if that does not fit in `usize`.
pub fn dense_bytes(dtype: DType, ne: [usize; MAX_DIMS]) -> Option<usize> {
    (ne[0] / dtype.block_size())
        .checked_mul(dtype.type_size())?
        .checked_mul(ne[1])?
        .checked_mul(ne[2])?
        .checked_mul(ne[3])
}

/// Shape argument accepted by tensor constructors: `[a]`, `[a, b]`, `[a, b, c]`, `[a, b, c, d]`.
pub trait Shape {
    /// The shape padded with ones to four axes.
    fn dims(&self) -> [usize; MAX_DIMS];
}

macro_rules! impl_shape {
    ($($n:literal),*) => {$(
        impl Shape for [usize; $n] {
            fn dims(&self) -> [usize; MAX_DIMS] {
                let mut d = [1; MAX_DIMS];
                d[..$n].copy_from_slice(self);
                d
            }
        }
    )*};
}
impl_shape!(1, 2, 3, 4);
