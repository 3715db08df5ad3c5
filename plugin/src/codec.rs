//! Conversions between core's types and their flat ABI forms: graphs, tensor descriptors, ops
//! and errors. Encoding borrows from the source (names are not copied); decoding checks every
//! index and code, so a malformed table is a typed error, never a panic or an out-of-range read.
#![allow(unsafe_code)]

use super::abi::{
    NO_TENSOR, RawError, RawGraph, RawOp, RawStr, RawTensor, error_kind as ek, raw_bytes,
};
use std::sync::Arc;
use tessera_core::dtype::DType;
use tessera_core::error::{Error, Result};
use tessera_core::graph::Graph;
use tessera_core::ops::{GluOp, Op, RopeMode, RopeParams, UnaryOp};
use tessera_core::tensor::{
    MAX_DIMS, MAX_SRC, TensorDesc, TensorFlags, TensorId, TensorParts, ViewOf,
};

// Op codes are part of the ABI: append only, never renumber.
const OP_NONE: u32 = 0;
const OP_VIEW: u32 = 1;
const OP_RESHAPE: u32 = 2;
const OP_PERMUTE: u32 = 3;
const OP_TRANSPOSE: u32 = 4;
const OP_CONT: u32 = 5;
const OP_CPY: u32 = 6;
const OP_GET_ROWS: u32 = 7;
const OP_SET_ROWS: u32 = 8;
const OP_CONCAT: u32 = 9;
const OP_ADD: u32 = 10;
const OP_SUB: u32 = 11;
const OP_MUL: u32 = 12;
const OP_DIV: u32 = 13;
const OP_SCALE: u32 = 14;
const OP_SQR: u32 = 15;
const OP_SQRT: u32 = 16;
const OP_CLAMP: u32 = 17;
const OP_UNARY: u32 = 18;
const OP_GLU: u32 = 19;
const OP_RMS_NORM: u32 = 20;
const OP_NORM: u32 = 21;
const OP_SUM_ROWS: u32 = 22;
const OP_ARGMAX: u32 = 23;
const OP_SOFT_MAX: u32 = 24;
const OP_ROPE: u32 = 25;
const OP_MUL_MAT: u32 = 26;
const OP_FLASH_ATTN_EXT: u32 = 27;
const OP_MUL_MAT_ID: u32 = 28;
const OP_ADD_ID: u32 = 29;
const OP_ARGSORT: u32 = 30;
const OP_SWIGLU_OAI: u32 = 31;
/// An op this version of the ABI has no code for (core's `Op` grows; the codec follows with a
/// new code). Every decoder rejects it, so a graph holding one fails with a typed error on the
/// far side instead of running as something else.
/// The plugin suite (tests/tests/plugin.rs) runs every conformance case through a loaded
/// plugin, so an op left without a code fails there by name.
const OP_UNKNOWN: u32 = u32::MAX;

fn unary_code(u: UnaryOp) -> u32 {
    match u {
        UnaryOp::Silu => 0,
        UnaryOp::Gelu => 1,
        UnaryOp::GeluQuick => 2,
        UnaryOp::Relu => 3,
        UnaryOp::Tanh => 4,
        UnaryOp::Neg => 5,
        UnaryOp::Exp => 6,
        UnaryOp::Sigmoid => 7,
    }
}

fn glu_code(g: GluOp) -> u32 {
    match g {
        GluOp::Swiglu => 0,
        GluOp::Geglu => 1,
    }
}

/// The flat form of an op.
pub fn encode_op(op: &Op) -> RawOp {
    let mut r = RawOp::default();
    let (kind, sub) = match *op {
        Op::None => (OP_NONE, 0),
        Op::View => (OP_VIEW, 0),
        Op::Reshape => (OP_RESHAPE, 0),
        Op::Permute(axes) => {
            for (d, a) in r.ints.iter_mut().zip(axes) {
                *d = a as u64;
            }
            (OP_PERMUTE, 0)
        }
        Op::Transpose => (OP_TRANSPOSE, 0),
        Op::Cont => (OP_CONT, 0),
        Op::Cpy => (OP_CPY, 0),
        Op::GetRows => (OP_GET_ROWS, 0),
        Op::SetRows => (OP_SET_ROWS, 0),
        Op::Concat { dim } => {
            r.ints[0] = dim as u64;
            (OP_CONCAT, 0)
        }
        Op::Add => (OP_ADD, 0),
        Op::Sub => (OP_SUB, 0),
        Op::Mul => (OP_MUL, 0),
        Op::Div => (OP_DIV, 0),
        Op::Scale { scale, bias } => {
            r.floats[..2].copy_from_slice(&[scale, bias]);
            (OP_SCALE, 0)
        }
        Op::Sqr => (OP_SQR, 0),
        Op::Sqrt => (OP_SQRT, 0),
        Op::Clamp { min, max } => {
            r.floats[..2].copy_from_slice(&[min, max]);
            (OP_CLAMP, 0)
        }
        Op::Unary(u) => (OP_UNARY, unary_code(u)),
        Op::Glu { op, swapped } => {
            r.ints[0] = swapped as u64;
            (OP_GLU, glu_code(op))
        }
        Op::RmsNorm { eps } => {
            r.floats[0] = eps;
            (OP_RMS_NORM, 0)
        }
        Op::Norm { eps } => {
            r.floats[0] = eps;
            (OP_NORM, 0)
        }
        Op::SumRows => (OP_SUM_ROWS, 0),
        Op::Argmax => (OP_ARGMAX, 0),
        Op::SoftMax { scale, max_bias } => {
            r.floats[..2].copy_from_slice(&[scale, max_bias]);
            (OP_SOFT_MAX, 0)
        }
        Op::Rope(p) => {
            r.ints[0] = p.n_dims as u64;
            r.floats[..2].copy_from_slice(&[p.freq_base, p.freq_scale]);
            let mode = match p.mode {
                RopeMode::Normal => 0,
                RopeMode::Neox => 1,
            };
            (OP_ROPE, mode)
        }
        Op::MulMat => (OP_MUL_MAT, 0),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => {
            r.floats[..3].copy_from_slice(&[scale, max_bias, softcap]);
            (OP_FLASH_ATTN_EXT, 0)
        }
        Op::MulMatId { first_expert } => {
            // sub 1: the local-range form, its first expert in ints[0].
            r.ints[0] = first_expert.unwrap_or(0) as u64;
            (OP_MUL_MAT_ID, u32::from(first_expert.is_some()))
        }
        Op::AddId => (OP_ADD_ID, 0),
        Op::Argsort { descending } => (OP_ARGSORT, descending as u32),
        Op::SwigluOai { alpha, limit } => {
            r.floats[..2].copy_from_slice(&[alpha, limit]);
            (OP_SWIGLU_OAI, 0)
        }
        _ => (OP_UNKNOWN, 0),
    };
    r.kind = kind;
    r.sub = sub;
    r
}

/// The op of a flat form.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `what` for an unknown code or an out-of-range parameter.
pub fn decode_op(r: &RawOp, what: &str) -> Result<Op> {
    let bad = |field: &str| {
        Error::InvalidArgument(format!(
            "{what}: op code {} has an invalid {field} ({:?})",
            r.kind, r
        ))
    };
    let small = |v: u64, max: usize, field: &str| {
        usize::try_from(v)
            .ok()
            .filter(|&v| v < max)
            .ok_or_else(|| bad(field))
    };
    let f = r.floats;
    Ok(match r.kind {
        OP_NONE => Op::None,
        OP_VIEW => Op::View,
        OP_RESHAPE => Op::Reshape,
        OP_PERMUTE => {
            let mut axes = [0usize; 4];
            for (a, &v) in axes.iter_mut().zip(&r.ints) {
                *a = small(v, MAX_DIMS, "axis")?;
            }
            Op::Permute(axes)
        }
        OP_TRANSPOSE => Op::Transpose,
        OP_CONT => Op::Cont,
        OP_CPY => Op::Cpy,
        OP_GET_ROWS => Op::GetRows,
        OP_SET_ROWS => Op::SetRows,
        OP_CONCAT => Op::Concat {
            dim: small(r.ints[0], MAX_DIMS, "dim")?,
        },
        OP_ADD => Op::Add,
        OP_SUB => Op::Sub,
        OP_MUL => Op::Mul,
        OP_DIV => Op::Div,
        OP_SCALE => Op::Scale {
            scale: f[0],
            bias: f[1],
        },
        OP_SQR => Op::Sqr,
        OP_SQRT => Op::Sqrt,
        OP_CLAMP => Op::Clamp {
            min: f[0],
            max: f[1],
        },
        OP_UNARY => Op::Unary(
            *UnaryOp::ALL
                .iter()
                .find(|u| unary_code(**u) == r.sub)
                .ok_or_else(|| bad("unary function"))?,
        ),
        OP_GLU => Op::Glu {
            op: [GluOp::Swiglu, GluOp::Geglu]
                .into_iter()
                .find(|g| glu_code(*g) == r.sub)
                .ok_or_else(|| bad("GLU function"))?,
            swapped: r.ints[0] != 0,
        },
        OP_RMS_NORM => Op::RmsNorm { eps: f[0] },
        OP_NORM => Op::Norm { eps: f[0] },
        OP_SUM_ROWS => Op::SumRows,
        OP_ARGMAX => Op::Argmax,
        OP_SOFT_MAX => Op::SoftMax {
            scale: f[0],
            max_bias: f[1],
        },
        OP_ROPE => Op::Rope(RopeParams {
            n_dims: usize::try_from(r.ints[0]).map_err(|_| bad("n_dims"))?,
            mode: match r.sub {
                0 => RopeMode::Normal,
                1 => RopeMode::Neox,
                _ => return Err(bad("rope mode")),
            },
            freq_base: f[0],
            freq_scale: f[1],
        }),
        OP_MUL_MAT => Op::MulMat,
        OP_FLASH_ATTN_EXT => Op::FlashAttnExt {
            scale: f[0],
            max_bias: f[1],
            softcap: f[2],
        },
        OP_MUL_MAT_ID => Op::MulMatId {
            first_expert: match r.sub {
                0 => None,
                1 => Some(usize::try_from(r.ints[0]).map_err(|_| bad("first expert"))?),
                _ => return Err(bad("mul_mat_id form")),
            },
        },
        OP_ADD_ID => Op::AddId,
        OP_ARGSORT => Op::Argsort {
            descending: match r.sub {
                0 => false,
                1 => true,
                _ => return Err(bad("sort order")),
            },
        },
        OP_SWIGLU_OAI => Op::SwigluOai {
            alpha: f[0],
            limit: f[1],
        },
        _ => return Err(bad("kind")),
    })
}

fn id_code(id: Option<TensorId>, remap: &dyn Fn(TensorId) -> Option<u32>) -> u32 {
    id.and_then(remap).unwrap_or(NO_TENSOR)
}

/// The flat form of one descriptor; `remap` turns ids into indices of the flat array (a source
/// outside the array becomes [`NO_TENSOR`]). The name is borrowed from `t`.
pub fn encode_tensor(t: &TensorDesc, remap: &dyn Fn(TensorId) -> Option<u32>) -> RawTensor {
    let mut src = [NO_TENSOR; MAX_SRC];
    for (i, d) in src.iter_mut().enumerate() {
        *d = id_code(t.src(i), remap);
    }
    let (flags, view) = (t.flags(), t.view_of());
    RawTensor {
        dtype: t.dtype().ggml_id(),
        flags: flags.input as u32 | (flags.output as u32) << 1 | (flags.param as u32) << 2,
        op: encode_op(t.op()),
        ne: t.ne().map(|v| v as u64),
        nb: t.nb().map(|v| v as u64),
        src,
        view_src: id_code(view.map(|v| v.src), remap),
        view_offset: view.map_or(0, |v| v.offset as u64),
        name: RawStr::new(t.name()),
    }
}

fn to_usize(v: u64, what: &str) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| Error::InvalidArgument(format!("{what}: {v} does not fit in usize")))
}

/// The descriptor of a flat form at index `index` of an array of `n` descriptors.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the tensor for an unknown dtype or op, or a source or view
/// index outside `0..n` (a view must point to an earlier tensor).
///
/// # Safety
/// `r.name` must be readable for the call.
pub unsafe fn decode_tensor(r: &RawTensor, index: usize, n: usize) -> Result<TensorDesc> {
    // SAFETY: forwarded to the caller.
    let name = unsafe { r.name.to_str_lossy() }.into_owned();
    let what = if name.is_empty() {
        format!("tensor #{index}")
    } else {
        format!("tensor '{name}' #{index}")
    };
    let dtype = DType::from_ggml_id(r.dtype)
        .ok_or_else(|| Error::InvalidArgument(format!("{what}: unknown dtype id {}", r.dtype)))?;
    let op = decode_op(&r.op, &what)?;
    let idx = |v: u32, limit: usize, field: &str| -> Result<Option<TensorId>> {
        if v == NO_TENSOR {
            return Ok(None);
        }
        if (v as usize) < limit {
            Ok(Some(TensorId::from_index(v as usize)))
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: {field} index {v} is out of range 0..{limit}"
            )))
        }
    };
    let mut src = [None; MAX_SRC];
    for (d, &s) in src.iter_mut().zip(&r.src) {
        *d = idx(s, n, "source")?;
    }
    let view = match idx(r.view_src, index, "view source")? {
        Some(s) => Some(ViewOf {
            src: s,
            offset: to_usize(r.view_offset, &what)?,
        }),
        None => None,
    };
    let mut ne = [0usize; MAX_DIMS];
    let mut nb = [0usize; MAX_DIMS];
    for d in 0..MAX_DIMS {
        ne[d] = to_usize(r.ne[d], &what)?;
        nb[d] = to_usize(r.nb[d], &what)?;
    }
    Ok(TensorDesc::from_parts(TensorParts {
        dtype,
        ne,
        nb,
        op,
        src,
        view,
        name,
        flags: TensorFlags {
            input: r.flags & 1 != 0,
            output: r.flags & 2 != 0,
            param: r.flags & 4 != 0,
        },
    }))
}

/// A graph (or a part of a context) in flat form, borrowing names from the descriptors.
#[derive(Debug)]
pub struct FlatGraph<'a> {
    tensors: Vec<RawTensor>,
    nodes: Vec<u32>,
    leafs: Vec<u32>,
    outputs: Vec<u32>,
    _names: std::marker::PhantomData<&'a TensorDesc>,
}

fn ids(v: &[TensorId]) -> Vec<u32> {
    v.iter().map(|i| i.index() as u32).collect()
}

impl<'a> FlatGraph<'a> {
    /// Every descriptor of `graph` with its node, leaf and output lists.
    pub fn from_graph(graph: &'a Graph) -> FlatGraph<'a> {
        let same = |id: TensorId| Some(id.index() as u32);
        FlatGraph {
            tensors: graph
                .tensors()
                .iter()
                .map(|t| encode_tensor(t, &same))
                .collect(),
            nodes: ids(graph.nodes()),
            leafs: ids(graph.leafs()),
            outputs: ids(graph.outputs()),
            _names: std::marker::PhantomData,
        }
    }

    /// The part of `tensors` that decides whether `node` can run: the node, its sources, and
    /// the tensors they view (transitively), renumbered densely in their original order. The
    /// node's new index is returned with it; sources of sources are cut ([`NO_TENSOR`]).
    ///
    /// # Errors
    /// [`Error::UnknownTensor`] if `node` or a tensor it refers to is not in `tensors`.
    pub fn around_node(tensors: &'a [TensorDesc], node: TensorId) -> Result<(FlatGraph<'a>, u32)> {
        let unknown = |id: TensorId| Error::UnknownTensor {
            id: id.index(),
            len: tensors.len(),
        };
        let get = |id: TensorId| tensors.get(id.index()).ok_or_else(|| unknown(id));
        let mut keep: Vec<TensorId> = vec![node];
        keep.extend(get(node)?.srcs());
        let mut i = 0;
        // Views point strictly backwards, so following them terminates.
        while i < keep.len() {
            if let Some(v) = get(keep[i])?.view_of()
                && !keep.contains(&v.src)
            {
                keep.push(v.src);
            }
            i += 1;
        }
        keep.sort_unstable();
        keep.dedup();
        let remap = |id: TensorId| keep.binary_search(&id).ok().map(|p| p as u32);
        let flat: Vec<RawTensor> = keep
            .iter()
            .map(|&id| {
                let mut r = encode_tensor(&tensors[id.index()], &remap);
                if id != node {
                    r.src = [NO_TENSOR; MAX_SRC];
                }
                r
            })
            .collect();
        let at = remap(node).ok_or_else(|| unknown(node))?;
        Ok((
            FlatGraph {
                tensors: flat,
                nodes: vec![at],
                leafs: Vec::new(),
                outputs: vec![at],
                _names: std::marker::PhantomData,
            },
            at,
        ))
    }

    /// The ABI view, valid while `self` lives.
    pub fn raw(&self) -> RawGraph {
        RawGraph {
            tensors: self.tensors.as_ptr(),
            n_tensors: self.tensors.len(),
            nodes: self.nodes.as_ptr(),
            n_nodes: self.nodes.len(),
            leafs: self.leafs.as_ptr(),
            n_leafs: self.leafs.len(),
            outputs: self.outputs.as_ptr(),
            n_outputs: self.outputs.len(),
        }
    }
}

fn id_list(ptr: *const u32, n: usize, limit: usize, what: &str) -> Result<Vec<TensorId>> {
    if n > 0 && ptr.is_null() {
        return Err(Error::InvalidArgument(format!(
            "flat graph: {what} list is null"
        )));
    }
    let list = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the caller of `decode_graph` guarantees `n` readable entries.
        unsafe { std::slice::from_raw_parts(ptr, n) }
    };
    list.iter()
        .map(|&i| {
            if (i as usize) < limit {
                Ok(TensorId::from_index(i as usize))
            } else {
                Err(Error::InvalidArgument(format!(
                    "flat graph: {what} index {i} is out of range 0..{limit}"
                )))
            }
        })
        .collect()
}

/// The graph of a flat form.
///
/// # Errors
/// [`Error::InvalidArgument`] for a null table, or as [`decode_tensor`] for any descriptor.
///
/// # Safety
/// `raw`'s pointers must be readable for their lengths during the call.
pub unsafe fn decode_graph(raw: &RawGraph) -> Result<Graph> {
    let n = raw.n_tensors;
    if n > 0 && raw.tensors.is_null() {
        return Err(Error::InvalidArgument(
            "flat graph: tensor table is null".into(),
        ));
    }
    if n >= NO_TENSOR as usize {
        return Err(Error::InvalidArgument(format!(
            "flat graph: {n} tensors exceed the ABI's index range"
        )));
    }
    let flat = if n == 0 {
        &[][..]
    } else {
        // SAFETY: the caller guarantees `n` readable descriptors.
        unsafe { std::slice::from_raw_parts(raw.tensors, n) }
    };
    let mut tensors = Vec::with_capacity(n);
    for (i, r) in flat.iter().enumerate() {
        // SAFETY: names are readable for the call (caller's guarantee).
        tensors.push(unsafe { decode_tensor(r, i, n) }?);
    }
    let tensors: Arc<[TensorDesc]> = tensors.into();
    Ok(Graph::from_parts(
        tensors,
        id_list(raw.nodes, raw.n_nodes, n, "node")?,
        id_list(raw.leafs, raw.n_leafs, n, "leaf")?,
        id_list(raw.outputs, raw.n_outputs, n, "output")?,
    ))
}

/// Strings an encoded error borrows from.
#[derive(Debug, Default)]
pub struct ErrorStrings {
    strs: [String; 4],
}

/// The flat form of `e` plus the strings it borrows (keep both alive while `RawError` is used).
pub fn encode_error(e: &Error, keep: &mut ErrorStrings) -> RawError {
    let mut nums = [0u64; 3];
    let (kind, strs): (u32, Vec<String>) = match e {
        Error::Unavailable { backend, reason } => {
            (ek::UNAVAILABLE, vec![backend.clone(), reason.clone()])
        }
        Error::NoSuchDevice { wanted, available } => {
            (ek::NO_SUCH_DEVICE, vec![wanted.clone(), available.clone()])
        }
        Error::Driver {
            backend,
            call,
            code,
        } => {
            nums[0] = *code as u64;
            (ek::DRIVER, vec![backend.clone(), call.clone()])
        }
        Error::InvalidOp { op, tensor, reason } => (
            ek::INVALID_OP,
            vec![op.clone(), tensor.clone(), reason.clone()],
        ),
        Error::Unsupported {
            op,
            dtype,
            device,
            reason,
        } => {
            nums[0] = dtype.ggml_id() as u64;
            (
                ek::UNSUPPORTED,
                vec![op.clone(), device.clone(), reason.clone()],
            )
        }
        Error::UnknownTensor { id, len } => {
            nums[..2].copy_from_slice(&[*id as u64, *len as u64]);
            (ek::UNKNOWN_TENSOR, vec![])
        }
        Error::NotAllocated { tensor } => (ek::NOT_ALLOCATED, vec![tensor.clone()]),
        Error::Foreign { backend, what } => (ek::FOREIGN, vec![backend.clone(), what.clone()]),
        Error::InvalidArgument(s) => (ek::INVALID_ARGUMENT, vec![s.clone()]),
        Error::OutOfBounds {
            what,
            offset,
            end,
            size,
        } => {
            nums = [*offset as u64, *end as u64, *size as u64];
            (ek::OUT_OF_BOUNDS, vec![what.clone()])
        }
        Error::SizeMismatch {
            tensor,
            got,
            expected,
        } => {
            nums[..2].copy_from_slice(&[*got as u64, *expected as u64]);
            (ek::SIZE_MISMATCH, vec![tensor.clone()])
        }
        Error::OutOfMemory { device, requested } => {
            nums[0] = *requested as u64;
            (ek::OUT_OF_MEMORY, vec![device.clone()])
        }
        Error::ReadOnly(s) => (ek::READ_ONLY, vec![s.clone()]),
        Error::Compute { device, reason } => (ek::COMPUTE, vec![device.clone(), reason.clone()]),
        Error::Plugin { file, call, reason } => {
            (ek::PLUGIN, vec![file.clone(), call.clone(), reason.clone()])
        }
        // Variants added after this codec cross as their message.
        #[allow(unreachable_patterns)]
        other => (ek::OTHER, vec![other.to_string()]),
    };
    for (k, s) in keep.strs.iter_mut().zip(strs) {
        *k = s;
    }
    RawError {
        kind,
        strs: [
            RawStr::new(&keep.strs[0]),
            RawStr::new(&keep.strs[1]),
            RawStr::new(&keep.strs[2]),
            RawStr::new(&keep.strs[3]),
        ],
        nums,
    }
}

/// The error of a flat form, as raised by the plugin in `file` during `call`. Panics and
/// unknown kinds become [`Error::Plugin`].
///
/// # Safety
/// The strings of `r` must be readable for the call.
pub unsafe fn decode_error(r: &RawError, file: &str, call: &str) -> Error {
    let s = |i: usize| {
        // SAFETY: forwarded to the caller.
        unsafe { String::from_utf8_lossy(raw_bytes(r.strs[i].ptr, r.strs[i].len)) }.into_owned()
    };
    let n = |i: usize| usize::try_from(r.nums[i]).unwrap_or(usize::MAX);
    let plugin = |reason: String| Error::Plugin {
        file: file.to_string(),
        call: call.to_string(),
        reason,
    };
    match r.kind {
        ek::UNAVAILABLE => Error::Unavailable {
            backend: s(0),
            reason: s(1),
        },
        ek::NO_SUCH_DEVICE => Error::NoSuchDevice {
            wanted: s(0),
            available: s(1),
        },
        ek::DRIVER => Error::Driver {
            backend: s(0),
            call: s(1),
            code: r.nums[0] as i64,
        },
        ek::INVALID_OP => Error::InvalidOp {
            op: s(0),
            tensor: s(1),
            reason: s(2),
        },
        ek::UNSUPPORTED => match u32::try_from(r.nums[0]).ok().and_then(DType::from_ggml_id) {
            Some(dtype) => Error::Unsupported {
                op: s(0),
                dtype,
                device: s(1),
                reason: s(2),
            },
            None => plugin(format!("{} is not supported by {}: {}", s(0), s(1), s(2))),
        },
        ek::UNKNOWN_TENSOR => Error::UnknownTensor {
            id: n(0),
            len: n(1),
        },
        ek::NOT_ALLOCATED => Error::NotAllocated { tensor: s(0) },
        ek::FOREIGN => Error::Foreign {
            backend: s(0),
            what: s(1),
        },
        ek::INVALID_ARGUMENT => Error::InvalidArgument(s(0)),
        ek::OUT_OF_BOUNDS => Error::OutOfBounds {
            what: s(0),
            offset: n(0),
            end: n(1),
            size: n(2),
        },
        ek::SIZE_MISMATCH => Error::SizeMismatch {
            tensor: s(0),
            got: n(0),
            expected: n(1),
        },
        ek::OUT_OF_MEMORY => Error::OutOfMemory {
            device: s(0),
            requested: n(0),
        },
        ek::READ_ONLY => Error::ReadOnly(s(0)),
        ek::COMPUTE => Error::Compute {
            device: s(0),
            reason: s(1),
        },
        ek::PLUGIN => Error::Plugin {
            file: s(0),
            call: s(1),
            reason: s(2),
        },
        ek::PANIC => plugin(format!("panicked: {}", s(0))),
        _ => plugin(s(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::graph::Context;

    #[test]
    fn graphs_round_trip_with_every_field() {
        let mut ctx = Context::new();
        let a = ctx.new_named("a", DType::F32, [8, 4, 2]).unwrap();
        let pos = ctx.new_tensor(DType::I32, [2]).unwrap();
        ctx.set_input(a).unwrap();
        let p = ctx.permute(a, [1, 0, 2, 3]).unwrap();
        let c = ctx.cont(p).unwrap();
        let r = ctx.reshape(c, [8, 4, 2]).unwrap();
        let rope = ctx
            .rope(
                r,
                pos,
                RopeParams {
                    n_dims: 8,
                    mode: RopeMode::Neox,
                    freq_base: 1e4,
                    freq_scale: 0.5,
                },
            )
            .unwrap();
        let s = ctx.soft_max_ext(rope, None, 0.25, 8.0).unwrap();
        let g = ctx.glu(s, GluOp::Geglu, true).unwrap();
        let out = ctx.clamp(g, -1.0, 2.0).unwrap();
        let graph = ctx.build_forward(out).unwrap();
        let flat = FlatGraph::from_graph(&graph);
        // SAFETY: `flat` borrows `graph`, both alive.
        let back = unsafe { decode_graph(&flat.raw()) }.unwrap();
        assert_eq!(back.nodes(), graph.nodes());
        assert_eq!(back.leafs(), graph.leafs());
        assert_eq!(back.outputs(), graph.outputs());
        for (x, y) in graph.tensors().iter().zip(back.tensors()) {
            let parts = |t: &TensorDesc| {
                let src: Vec<_> = (0..MAX_SRC).map(|i| t.src(i)).collect();
                let f = t.flags();
                let view = t.view_of().map(|v| (v.src, v.offset));
                let (dtype, ne, nb, op, name) = (t.dtype(), t.ne(), t.nb(), *t.op(), t.name());
                (
                    dtype,
                    ne,
                    nb,
                    op,
                    src,
                    view,
                    name.to_string(),
                    (f.input, f.output, f.param),
                )
            };
            assert_eq!(parts(x), parts(y));
        }
    }

    #[test]
    fn malformed_tables_are_typed_errors() {
        let mut ctx = Context::new();
        let a = ctx.new_named("w", DType::F32, [4]).unwrap();
        let b = ctx.silu(a).unwrap();
        let graph = ctx.build_forward(b).unwrap();
        let flat = FlatGraph::from_graph(&graph);
        let mut tensors = flat.tensors.clone();
        tensors[1].src[0] = 7;
        let mut raw = flat.raw();
        raw.tensors = tensors.as_ptr();
        // SAFETY: `tensors` and `flat` are alive.
        let err = unsafe { decode_graph(&raw) }.unwrap_err().to_string();
        assert!(err.contains("#1") && err.contains("out of range"), "{err}");
        tensors[1].src[0] = 0;
        tensors[0].dtype = 999;
        // SAFETY: as above.
        let err = unsafe { decode_graph(&raw) }.unwrap_err().to_string();
        assert!(err.contains("'w'") && err.contains("dtype"), "{err}");
        tensors[0].dtype = 0;
        tensors[1].op.kind = 9999;
        // SAFETY: as above.
        assert!(unsafe { decode_graph(&raw) }.is_err());
    }

    #[test]
    fn errors_round_trip() {
        let errors = [
            Error::OutOfBounds {
                what: "buf".into(),
                offset: 1,
                end: 9,
                size: 4,
            },
            Error::Unsupported {
                op: "ROPE".into(),
                dtype: DType::BF16,
                device: "X".into(),
                reason: "no".into(),
            },
            Error::Driver {
                backend: "cuda".into(),
                call: "cuMemAlloc".into(),
                code: -7,
            },
        ];
        for e in errors {
            let mut keep = ErrorStrings::default();
            let raw = encode_error(&e, &mut keep);
            // SAFETY: `keep` is alive.
            let back = unsafe { decode_error(&raw, "lib.so", "call") };
            assert_eq!(back.to_string(), e.to_string());
        }
    }
}
