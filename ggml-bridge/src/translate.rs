//! ggml graphs as Tessera graphs.
//!
//! Every ggml node becomes the Tessera op of the same semantics, built through
//! [`tessera::Context`]'s checked builders from its sources; a view (VIEW, RESHAPE, PERMUTE,
//! TRANSPOSE) becomes a strided view of the tensor that owns the memory (ggml's `view_src`), at
//! `view_offs`. The result's dtype, shape and strides must then be exactly ggml's, and the
//! device must accept the op ([`tessera::Device::supports_op`]); anything else is a
//! [`Decline`] that names the node and why, never a guess. Tensors that own memory are bound to
//! the Tessera buffer ggml placed them in, at the offset ggml chose, so the Tessera graph reads
//! and writes exactly ggml's memory, in ggml's node order.
//!
//! `supports_op` translates one node with fresh leaves of its sources' shapes and strides;
//! `graph_compute` translates the whole graph and keeps the result for the next graph of the
//! same signature (llama.cpp computes the same graph for every token).

use crate::layout::span;
use crate::objects::BufferCtx;
use crate::sys;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use tessera::Graph;
use tessera::TensorId;
use tessera::ops::{GluOp, RopeMode, RopeParams, UnaryOp};
use tessera::{Bindings, Context, DType, Device, Support, TensorDesc};

/// Why a node has no Tessera translation (or the device refuses it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decline {
    /// ggml's op name and the tensor's name.
    pub node: String,
    /// Why.
    pub reason: String,
}

impl std::fmt::Display for Decline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.node, self.reason)
    }
}

fn op_name(op: sys::ggml_op) -> String {
    crate::ggml::op_name(op)
}

/// The ggml ops this plugin translates (every other op is declined by name).
pub const TRANSLATED_OPS: &[&str] = &[
    "NONE",
    "DUP",
    "ADD",
    "ADD_ID",
    "SUB",
    "MUL",
    "DIV",
    "SQR",
    "SQRT",
    "SUM_ROWS",
    "ARGMAX",
    "CONCAT",
    "NORM",
    "RMS_NORM",
    "MUL_MAT",
    "MUL_MAT_ID",
    "SCALE",
    "CPY",
    "CONT",
    "RESHAPE",
    "VIEW",
    "PERMUTE",
    "TRANSPOSE",
    "GET_ROWS",
    "SET_ROWS",
    "SOFT_MAX",
    "ROPE",
    "CLAMP",
    "ARGSORT",
    "FLASH_ATTN_EXT",
    "UNARY",
    "GLU",
];

fn is_view_op(op: sys::ggml_op) -> bool {
    matches!(
        op,
        sys::ggml_op_GGML_OP_VIEW
            | sys::ggml_op_GGML_OP_RESHAPE
            | sys::ggml_op_GGML_OP_PERMUTE
            | sys::ggml_op_GGML_OP_TRANSPOSE
    )
}

/// A ggml tensor, read through a raw pointer the caller vouches for.
#[derive(Clone, Copy)]
struct G(*const sys::ggml_tensor);

impl G {
    fn t<'a>(self) -> &'a sys::ggml_tensor {
        // SAFETY: `G`s are made only from tensors that stay live while a translation runs (see
        // `supports` and `Cache::get`).
        unsafe { &*self.0 }
    }
    fn label(&self) -> String {
        // SAFETY: ggml's name field is a NUL-terminated array.
        let name = unsafe { CStr::from_ptr(self.t().name.as_ptr()) }.to_string_lossy();
        let op = op_name(self.t().op);
        if name.is_empty() {
            op
        } else {
            format!("{op} '{name}'")
        }
    }
    fn decline(&self, reason: impl Into<String>) -> Decline {
        Decline {
            node: self.label(),
            reason: reason.into(),
        }
    }
    fn dtype(&self) -> Result<DType, Decline> {
        DType::from_ggml_type_id(self.t().type_).ok_or_else(|| {
            self.decline(format!("ggml type {} has no Tessera dtype", self.t().type_))
        })
    }
    fn ne(&self) -> Result<[usize; 4], Decline> {
        let mut ne = [0usize; 4];
        for (d, &n) in ne.iter_mut().zip(&self.t().ne) {
            *d = usize::try_from(n).map_err(|_| self.decline(format!("negative size {n}")))?;
        }
        Ok(ne)
    }
    fn nb(&self) -> [usize; 4] {
        self.t().nb
    }
    fn src(&self, i: usize) -> Option<G> {
        let s = self.t().src[i];
        (!s.is_null()).then_some(G(s))
    }
    fn need(&self, i: usize) -> Result<G, Decline> {
        self.src(i)
            .ok_or_else(|| self.decline(format!("source {i} is missing")))
    }
    fn view_src(&self) -> Option<G> {
        let s = self.t().view_src;
        (!s.is_null()).then_some(G(s))
    }
    fn i32(&self, i: usize) -> i32 {
        self.t().op_params[i]
    }
    fn f32(&self, i: usize) -> f32 {
        f32::from_bits(self.t().op_params[i] as u32)
    }
}

/// Whether two layouts agree on every axis that has more than one element.
fn same_layout(ne: [usize; 4], nb: [usize; 4], other_ne: [usize; 4], other_nb: [usize; 4]) -> bool {
    ne == other_ne && (0..4).all(|d| ne[d] <= 1 || nb[d] == other_nb[d])
}

/// How sources outside the node list are made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every source of the probed node is a fresh leaf of its layout (`supports_op`).
    Probe,
    /// Sources are translated from what they are, leaves bound to their memory.
    Compute,
}

/// A ggml graph (or one node) being translated.
struct Translator<'d> {
    device: &'d dyn Device,
    mode: Mode,
    ctx: Context,
    ids: HashMap<*const sys::ggml_tensor, TensorId>,
    /// Non-leaf tensors in creation order: ggml's node order, with views a node reads inserted
    /// before it.
    nodes: Vec<TensorId>,
    /// Tensors owning memory, with the ggml tensor whose memory it is.
    owners: Vec<(TensorId, G)>,
    /// Compute mode: the graph's nodes. Any other computed tensor a node reads was computed
    /// before (an earlier part of the graph, on this device or another): it is read from its
    /// memory, never computed again.
    graph_nodes: HashSet<*const sys::ggml_tensor>,
}

impl<'d> Translator<'d> {
    fn new(device: &'d dyn Device, mode: Mode) -> Translator<'d> {
        Translator {
            device,
            mode,
            ctx: Context::new(),
            ids: HashMap::new(),
            nodes: Vec::new(),
            owners: Vec::new(),
            graph_nodes: HashSet::new(),
        }
    }

    /// `t` as a Tessera tensor, translated once.
    fn tensor(&mut self, t: G) -> Result<TensorId, Decline> {
        if let Some(&id) = self.ids.get(&t.0) {
            return Ok(id);
        }
        let id = self.make(t)?;
        self.ids.insert(t.0, id);
        Ok(id)
    }

    fn make(&mut self, t: G) -> Result<TensorId, Decline> {
        let op = t.t().op;
        let computed_before = self.mode == Mode::Compute && !self.graph_nodes.contains(&t.0);
        if computed_before && op != sys::ggml_op_GGML_OP_NONE && !is_view_op(op) {
            return self.leaf(t, true);
        }
        if op == sys::ggml_op_GGML_OP_NONE || is_view_op(op) {
            return match t.view_src() {
                Some(root) => {
                    let root = self.tensor(root)?;
                    let id = self.strided(t, root, t.t().view_offs)?;
                    self.nodes.push(id);
                    Ok(id)
                }
                None if op == sys::ggml_op_GGML_OP_NONE => self.leaf(t, self.mode == Mode::Compute),
                None => Err(t.decline("a view without the tensor it views")),
            };
        }
        let id = self.op(t)?;
        let got = &self.ctx.tensors()[id.index()];
        if got.dtype() != t.dtype()? || !same_layout(got.ne(), got.nb(), t.ne()?, t.nb()) {
            return Err(t.decline(format!(
                "Tessera's {} gives {} {:?} strides {:?}, ggml's {} {:?} strides {:?}",
                got.op().name(),
                got.dtype(),
                got.ne(),
                got.nb(),
                t.dtype()?,
                t.ne()?,
                t.nb()
            )));
        }
        if let Support::No(why) = self.device.supports_op(self.ctx.tensors(), id) {
            return Err(t.decline(format!("{}: {why}", self.device.name())));
        }
        if !got.is_view() {
            self.owners.push((id, t));
        }
        self.nodes.push(id);
        Ok(id)
    }

    /// A leaf with `t`'s dtype and layout; bound to `t`'s memory when `bind`.
    fn leaf(&mut self, t: G, bind: bool) -> Result<TensorId, Decline> {
        let (dtype, ne, nb) = (t.dtype()?, t.ne()?, t.nb());
        let contiguous = tessera_core::tensor::contiguous_strides(dtype, ne);
        if same_layout(ne, nb, ne, contiguous) {
            let id = self
                .ctx
                .new_tensor(dtype, ne)
                .map_err(|e| t.decline(e.to_string()))?;
            if bind {
                self.owners.push((id, t));
            }
            return Ok(id);
        }
        // A strided tensor owning memory (a probed source that is a view): a flat leaf covering
        // its span, viewed with its strides.
        let bytes = span(dtype, ne, nb);
        let per_block = dtype.type_size();
        if !bytes.is_multiple_of(per_block) {
            return Err(t.decline("strides that split a block"));
        }
        let flat = [bytes / per_block * dtype.block_size(), 1, 1, 1];
        let root = self
            .ctx
            .new_tensor(dtype, flat)
            .map_err(|e| t.decline(e.to_string()))?;
        if bind {
            self.owners.push((root, t));
        }
        let id = self.strided(t, root, 0)?;
        self.nodes.push(id);
        Ok(id)
    }

    /// ggml's I64 row indices `t` (a contiguous leaf of at most three axes, as llama.cpp's KV
    /// writes use) as Tessera i32 indices: the low halves of the little-endian values, a view
    /// with 8-byte strides. Row numbers are below 2^31; a larger value reads as a negative or
    /// another index, which the op's bounds check or the cache size bounds.
    fn i64_indices(&mut self, t: G, bind: bool) -> Result<TensorId, Decline> {
        let err = |e: tessera::Error| t.decline(e.to_string());
        let ne = t.ne()?;
        let dense = [
            8,
            ne[0].saturating_mul(8),
            ne[0].saturating_mul(ne[1]).saturating_mul(8),
            ne[0]
                .saturating_mul(ne[1])
                .saturating_mul(ne[2])
                .saturating_mul(8),
        ];
        if t.t().op != sys::ggml_op_GGML_OP_NONE
            || t.view_src().is_some()
            || ne[3] != 1
            || !same_layout(ne, t.nb(), ne, dense)
        {
            return Err(t.decline("i64 indices other than a contiguous leaf are not translated"));
        }
        let root = self
            .ctx
            .new_tensor(DType::I32, [ne[0].saturating_mul(2), ne[1], ne[2], 1])
            .map_err(err)?;
        if bind {
            self.owners.push((root, t));
        }
        let low = self
            .ctx
            .view(root, [1, ne[0], ne[1], ne[2]], [8, dense[1], dense[2]], 0)
            .map_err(err)?;
        let ids = self.ctx.permute(low, [3, 0, 1, 2]).map_err(err)?;
        self.nodes.extend([low, ids]);
        Ok(ids)
    }

    /// A view of `root` with `t`'s shape and strides at byte `offset`: a plain view when rows are
    /// contiguous, else a view in stride order permuted into place.
    fn strided(&mut self, t: G, root: TensorId, offset: usize) -> Result<TensorId, Decline> {
        let (dtype, ne, nb) = (t.dtype()?, t.ne()?, t.nb());
        let err = |e: tessera::Error| t.decline(e.to_string());
        // Axes in order of increasing stride (axes of one element last: their stride is free).
        let mut order = [0usize, 1, 2, 3];
        order.sort_by_key(|&d| (ne[d] <= 1, nb[d], d));
        let id = if order == [0, 1, 2, 3] || dtype.block_size() > 1 {
            self.ctx
                .view(root, ne, [nb[1], nb[2], nb[3]], offset)
                .map_err(err)?
        } else {
            let cne = order.map(|d| ne[d]);
            let cnb = order.map(|d| nb[d]);
            let v = self
                .ctx
                .view(root, cne, [cnb[1], cnb[2], cnb[3]], offset)
                .map_err(err)?;
            self.nodes.push(v);
            self.ctx.permute(v, order).map_err(err)?
        };
        let got = &self.ctx.tensors()[id.index()];
        if !same_layout(got.ne(), got.nb(), ne, nb) {
            return Err(t.decline(format!(
                "strides {nb:?} of {ne:?} are not a view Tessera can express"
            )));
        }
        Ok(id)
    }

    fn src(&mut self, t: G, i: usize) -> Result<TensorId, Decline> {
        let s = t.need(i)?;
        self.tensor(s)
    }

    fn opt_src(&mut self, t: G, i: usize) -> Result<Option<TensorId>, Decline> {
        t.src(i).map(|s| self.tensor(s)).transpose()
    }

    /// The Tessera op of node `t`.
    fn op(&mut self, t: G) -> Result<TensorId, Decline> {
        let err = |e: tessera::Error| t.decline(e.to_string());
        let op = t.t().op;
        Ok(match op {
            sys::ggml_op_GGML_OP_DUP | sys::ggml_op_GGML_OP_CONT => {
                let a = self.src(t, 0)?;
                let c = self.ctx.cont(a).map_err(err)?;
                let ne = t.ne()?;
                if self.ctx.tensors()[c.index()].ne() == ne {
                    c
                } else {
                    // ggml_cont_2d/3d/4d: the contiguous copy in ggml's memory, seen in ggml's
                    // shape (llama.cpp merges the heads of attention's output so).
                    if let Support::No(why) = self.device.supports_op(self.ctx.tensors(), c) {
                        return Err(t.decline(format!("{}: {why}", self.device.name())));
                    }
                    self.owners.push((c, t));
                    self.nodes.push(c);
                    self.ctx.reshape(c, ne).map_err(err)?
                }
            }
            sys::ggml_op_GGML_OP_CPY => {
                let from = t.need(0)?.dtype()?;
                if matches!(from, DType::BF16 | DType::F16) && t.dtype()?.is_quantized() {
                    // Tessera quantizes with ties rounded to even, as ggml's x86 kernels do;
                    // ggml's reference (what test-backend-ops compares with) rounds them away
                    // from zero, and the short mantissas of f16 and bf16 make ties common.
                    return Err(t.decline(format!(
                        "{from} quantized on the fly rounds ties unlike ggml's reference quantizer"
                    )));
                }
                let a = self.src(t, 0)?;
                // ggml_cast's destination is the node itself.
                if t.src(1).is_some_and(|b| b.0 == t.0) {
                    self.ctx.cast(a, t.dtype()?).map_err(err)?
                } else {
                    let b = self.src(t, 1)?;
                    self.ctx.cpy(a, b).map_err(err)?
                }
            }
            sys::ggml_op_GGML_OP_ADD
            | sys::ggml_op_GGML_OP_SUB
            | sys::ggml_op_GGML_OP_MUL
            | sys::ggml_op_GGML_OP_DIV => {
                let (a, b) = (self.src(t, 0)?, self.src(t, 1)?);
                match op {
                    sys::ggml_op_GGML_OP_ADD => self.ctx.add(a, b),
                    sys::ggml_op_GGML_OP_SUB => self.ctx.sub(a, b),
                    sys::ggml_op_GGML_OP_MUL => self.ctx.mul(a, b),
                    _ => self.ctx.div(a, b),
                }
                .map_err(err)?
            }
            sys::ggml_op_GGML_OP_ADD_ID => {
                let (a, b, ids) = (self.src(t, 0)?, self.src(t, 1)?, self.src(t, 2)?);
                self.ctx.add_id(a, b, ids).map_err(err)?
            }
            sys::ggml_op_GGML_OP_SQR => {
                let a = self.src(t, 0)?;
                self.ctx.sqr(a).map_err(err)?
            }
            sys::ggml_op_GGML_OP_SQRT => {
                let a = self.src(t, 0)?;
                self.ctx.sqrt(a).map_err(err)?
            }
            sys::ggml_op_GGML_OP_SUM_ROWS => {
                let a = self.src(t, 0)?;
                self.ctx.sum_rows(a).map_err(err)?
            }
            sys::ggml_op_GGML_OP_ARGMAX => {
                let a = self.src(t, 0)?;
                self.ctx.argmax(a).map_err(err)?
            }
            sys::ggml_op_GGML_OP_CONCAT => {
                let dim = usize::try_from(t.i32(0)).map_err(|_| t.decline("negative dim"))?;
                let (a, b) = (self.src(t, 0)?, self.src(t, 1)?);
                self.ctx.concat(a, b, dim).map_err(err)?
            }
            sys::ggml_op_GGML_OP_NORM => {
                let a = self.src(t, 0)?;
                self.ctx.norm(a, t.f32(0)).map_err(err)?
            }
            sys::ggml_op_GGML_OP_RMS_NORM => {
                let a = self.src(t, 0)?;
                self.ctx.rms_norm(a, t.f32(0)).map_err(err)?
            }
            sys::ggml_op_GGML_OP_MUL_MAT => {
                let (a, b) = (self.src(t, 0)?, self.src(t, 1)?);
                self.ctx.mul_mat(a, b).map_err(err)?
            }
            sys::ggml_op_GGML_OP_MUL_MAT_ID => {
                let (a, b, ids) = (self.src(t, 0)?, self.src(t, 1)?, self.src(t, 2)?);
                self.ctx.mul_mat_id(a, b, ids).map_err(err)?
            }
            sys::ggml_op_GGML_OP_SCALE => {
                let a = self.src(t, 0)?;
                self.ctx.scale_bias(a, t.f32(0), t.f32(1)).map_err(err)?
            }
            sys::ggml_op_GGML_OP_CLAMP => {
                let a = self.src(t, 0)?;
                self.ctx.clamp(a, t.f32(0), t.f32(1)).map_err(err)?
            }
            sys::ggml_op_GGML_OP_GET_ROWS => {
                let (a, ids) = (self.src(t, 0)?, self.src(t, 1)?);
                self.ctx.get_rows(a, ids).map_err(err)?
            }
            sys::ggml_op_GGML_OP_SET_ROWS => {
                // ggml's order: the rows, their indices, then the destination.
                let idx = t.need(1)?;
                let ids = match self.ids.get(&idx.0) {
                    Some(&id) => id,
                    None if idx.t().type_ == sys::ggml_type_GGML_TYPE_I64 => {
                        let id = self.i64_indices(idx, self.mode == Mode::Compute)?;
                        self.ids.insert(idx.0, id);
                        id
                    }
                    None => self.src(t, 1)?,
                };
                let (rows, dst) = (self.src(t, 0)?, self.src(t, 2)?);
                self.ctx.set_rows(dst, rows, ids).map_err(err)?
            }
            sys::ggml_op_GGML_OP_SOFT_MAX => {
                if t.src(2).is_some() {
                    return Err(t.decline("attention sinks on SOFT_MAX are not translated"));
                }
                let a = self.src(t, 0)?;
                let mask = self.opt_src(t, 1)?;
                self.ctx
                    .soft_max_ext(a, mask, t.f32(0), t.f32(1))
                    .map_err(err)?
            }
            sys::ggml_op_GGML_OP_ROPE => self.rope(t)?,
            sys::ggml_op_GGML_OP_ARGSORT => {
                let a = self.src(t, 0)?;
                // GGML_SORT_ORDER_ASC = 0, GGML_SORT_ORDER_DESC = 1.
                let descending = match t.i32(0) {
                    0 => false,
                    1 => true,
                    o => return Err(t.decline(format!("sort order {o}"))),
                };
                self.ctx.argsort(a, descending).map_err(err)?
            }
            sys::ggml_op_GGML_OP_FLASH_ATTN_EXT => {
                let (q, k, v) = (self.src(t, 0)?, self.src(t, 1)?, self.src(t, 2)?);
                let mask = self.opt_src(t, 3)?;
                let fa = self
                    .ctx
                    .flash_attn_ext(q, k, v, mask, t.f32(0), t.f32(1), t.f32(2))
                    .map_err(err)?;
                if let Some(sinks) = self.opt_src(t, 4)? {
                    self.ctx.flash_attn_ext_add_sinks(fa, sinks).map_err(err)?;
                }
                fa
            }
            sys::ggml_op_GGML_OP_UNARY => {
                let f = unary(t.i32(0)).ok_or_else(|| {
                    t.decline(format!("unary op {} has no Tessera translation", t.i32(0)))
                })?;
                let a = self.src(t, 0)?;
                self.ctx.unary(a, f).map_err(err)?
            }
            sys::ggml_op_GGML_OP_GLU => self.glu(t)?,
            _ => {
                return Err(t.decline(format!(
                    "ggml op {} has no Tessera translation",
                    op_name(op)
                )));
            }
        })
    }

    fn rope(&mut self, t: G) -> Result<TensorId, Decline> {
        let err = |e: tessera::Error| t.decline(e.to_string());
        let (n_dims, mode) = (t.i32(1), t.i32(2));
        let (ext_factor, attn_factor) = (t.f32(7), t.f32(8));
        // GGML_ROPE_TYPE_NEOX = 2; multi-section, vision and imrope modes are declined.
        let mode = match mode {
            0 => RopeMode::Normal,
            2 => RopeMode::Neox,
            m => return Err(t.decline(format!("rope mode {m}"))),
        };
        if ext_factor != 0.0 || attn_factor != 1.0 {
            return Err(t.decline(format!(
                "YaRN (ext_factor {ext_factor}, attn_factor {attn_factor}) is not translated"
            )));
        }
        if t.i32(15) != 0 {
            return Err(t.decline("position offsets are not translated"));
        }
        let n_dims = usize::try_from(n_dims).map_err(|_| t.decline("negative n_dims"))?;
        let p = RopeParams {
            n_dims,
            mode,
            freq_base: t.f32(5),
            freq_scale: t.f32(6),
        };
        let (a, pos) = (self.src(t, 0)?, self.src(t, 1)?);
        let freqs = self.opt_src(t, 2)?;
        self.ctx.rope_ext(a, pos, freqs, p).map_err(err)
    }

    fn glu(&mut self, t: G) -> Result<TensorId, Decline> {
        let err = |e: tessera::Error| t.decline(e.to_string());
        // enum ggml_glu_op: REGLU, GEGLU, SWIGLU, SWIGLU_OAI, GEGLU_ERF, GEGLU_QUICK, SWIGLU_CLAMP.
        let (kind, swapped) = (t.i32(0), t.i32(1) != 0);
        let a = self.src(t, 0)?;
        let b = self.opt_src(t, 1)?;
        if kind == 3 {
            let Some(b) = b else {
                return Err(t.decline("SWIGLU_OAI of one source is not translated"));
            };
            return self.ctx.swiglu_oai(a, b, t.f32(2), t.f32(3)).map_err(err);
        }
        let f = match kind {
            1 => GluOp::Geglu,
            2 => GluOp::Swiglu,
            k => return Err(t.decline(format!("glu op {k} has no Tessera translation"))),
        };
        match b {
            None => self.ctx.glu(a, f, swapped).map_err(err),
            Some(_) if swapped => Err(t.decline("a swapped two-source GLU is not translated")),
            Some(b) => self.ctx.glu_split(a, b, f).map_err(err),
        }
    }
}

/// ggml's `enum ggml_unary_op` → Tessera's.
fn unary(op: i32) -> Option<UnaryOp> {
    Some(match op {
        2 => UnaryOp::Neg,
        4 => UnaryOp::Tanh,
        6 => UnaryOp::Relu,
        7 => UnaryOp::Sigmoid,
        8 => UnaryOp::Gelu,
        9 => UnaryOp::GeluQuick,
        10 => UnaryOp::Silu,
        13 => UnaryOp::Exp,
        _ => return None,
    })
}

/// Whether `device` runs ggml node `op`: its Tessera translation, over fresh leaves of its
/// sources' layouts, exists and the device accepts it.
///
/// # Errors
/// The [`Decline`] naming the node and the reason.
///
/// # Safety
/// `op` and its sources are live tensors.
pub unsafe fn supports(device: &dyn Device, op: *const sys::ggml_tensor) -> Result<(), Decline> {
    let t = G(op);
    let mut tr = Translator::new(device, Mode::Probe);
    if t.t().op == sys::ggml_op_GGML_OP_NONE && t.t().type_ == sys::ggml_type_GGML_TYPE_I64 {
        // Stored as bytes; only SET_ROWS reads i64 (as indices, see `i64_indices`).
        return Ok(());
    }
    if t.t().op == sys::ggml_op_GGML_OP_NONE || is_view_op(t.t().op) {
        // A leaf or a view computes nothing: the device needs the dtype and the layout.
        let id = tr.leaf(t, false)?;
        return match device.supports_op(tr.ctx.tensors(), id) {
            Support::No(why)
                if tr.ctx.tensors()[id.index()].op().kind() != tessera::ops::OpKind::None =>
            {
                Err(t.decline(why))
            }
            _ => Ok(()),
        };
    }
    for i in 0..sys::GGML_MAX_SRC as usize {
        if let Some(s) = t.src(i) {
            if s.0 == op {
                continue;
            }
            let id = if t.t().op == sys::ggml_op_GGML_OP_SET_ROWS
                && i == 1
                && s.t().type_ == sys::ggml_type_GGML_TYPE_I64
            {
                tr.i64_indices(s, false)?
            } else {
                tr.leaf(s, false)?
            };
            tr.ids.insert(s.0, id);
        }
    }
    tr.tensor(t).map(|_| ())
}

/// A translated graph with its bindings; `graph` is `None` when the ggml graph has nothing to
/// compute (only views).
pub(crate) struct Translated {
    pub(crate) graph: Option<Graph>,
    pub(crate) bindings: Bindings,
    /// On a meta device: the graph's inputs in ggml's memory, as (buffer key, start, end).
    pub(crate) reads: Vec<(usize, usize, usize)>,
    /// On a meta device: the nodes it does not write back to ggml's memory.
    pub(crate) lost: Vec<crate::objects::Lost>,
    /// On a meta device: what it writes back to ggml's memory, as `reads`.
    pub(crate) written: Vec<(usize, usize, usize)>,
    /// This translation among all of the process's (the meta device's lost values are kept per
    /// graph part).
    pub(crate) id: u64,
}

/// Translations made so far (their ids).
static TRANSLATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Translations a stream keeps: llama.cpp hands a device one or a few parts of its graph per
/// token (more when ops between them run elsewhere), each the same every token.
const CACHED: usize = 4;

/// The latest graphs' translations, each reused while a graph has its signature.
#[derive(Default)]
pub(crate) struct Cache {
    /// (signature, translation), oldest first.
    entries: Vec<(Vec<u64>, Translated)>,
    /// The next graph's signature, built here so that a step allocates no new vector once warm.
    next: Vec<u64>,
    index: HashMap<*const sys::ggml_tensor, u64>,
    /// [`crate::objects::freed`] when the entries were made: a buffer freed since may be held
    /// alive only by a translation's bindings, so the entries are dropped with it.
    freed: u64,
}

impl Cache {
    /// The translation of `nodes` on `device`; on a meta device with `keep_all`, every node's
    /// value is written back to ggml's memory (see `meta_device`).
    ///
    /// # Safety
    /// `nodes` and every tensor they reach are live.
    pub(crate) unsafe fn get(
        &mut self,
        device: &dyn Device,
        nodes: &[*mut sys::ggml_tensor],
        keep_all: bool,
    ) -> Result<&Translated, String> {
        signature(nodes, &mut self.index, &mut self.next);
        let freed = crate::objects::freed();
        if freed != self.freed {
            self.entries.clear();
            self.freed = freed;
        }
        let at = match self.entries.iter().position(|(sig, _)| *sig == self.next) {
            Some(at) => at,
            None => {
                // SAFETY: the caller's contract.
                let t = unsafe { translate(device, nodes, keep_all) }.map_err(|d| d.to_string())?;
                if self.entries.len() == CACHED {
                    self.entries.remove(0);
                }
                self.entries.push((self.next.clone(), t));
                self.entries.len() - 1
            }
        };
        Ok(&self.entries[at].1)
    }
}

/// Everything about `nodes` a translation depends on: per tensor reached, its op, dtype, layout,
/// op parameters, memory and which tensors it reads. Tensors are numbered in the order first
/// met; their addresses only identify them within one walk.
fn signature(
    nodes: &[*mut sys::ggml_tensor],
    index: &mut HashMap<*const sys::ggml_tensor, u64>,
    sig: &mut Vec<u64>,
) {
    index.clear();
    sig.clear();
    let mut todo: Vec<*const sys::ggml_tensor> =
        nodes.iter().rev().map(|&n| n.cast_const()).collect();
    while let Some(p) = todo.pop() {
        if p.is_null() || index.contains_key(&p) {
            continue;
        }
        let t = G(p).t();
        index.insert(p, index.len() as u64);
        sig.extend([
            u64::from(t.op),
            u64::from(t.type_),
            t.data as u64,
            t.view_offs as u64,
        ]);
        sig.extend(t.ne.iter().map(|&n| n as u64));
        sig.extend(t.nb.iter().map(|&n| n as u64));
        sig.extend(t.op_params.iter().map(|&p| u64::from(p as u32)));
        sig.push(t.buffer as u64);
        // Which values a meta device writes back depends on ggml's output flags.
        sig.push(u64::from(t.flags as u32));
        for &s in t.src.iter().chain(std::iter::once(&t.view_src)) {
            // A source met before is named by its number, a new one is described when popped
            // (its place in the walk follows from the order pushed).
            sig.push(if s.is_null() {
                u64::MAX
            } else {
                index.get(&s.cast_const()).copied().unwrap_or(u64::MAX - 1)
            });
            if !s.is_null() {
                todo.push(s.cast_const());
            }
        }
    }
}

/// The Tessera graph of `nodes`, in their order, bound to their memory.
///
/// # Safety
/// `nodes` and every tensor they reach are live.
unsafe fn translate(
    device: &dyn Device,
    nodes_in: &[*mut sys::ggml_tensor],
    keep_all: bool,
) -> Result<Translated, Decline> {
    let mut tr = Translator::new(device, Mode::Compute);
    tr.graph_nodes = nodes_in.iter().map(|&n| n.cast_const()).collect();
    for &n in nodes_in {
        // ggml's scheduler may hand a view of a weight to the device that holds the weight
        // without asking `supports_op` (views take their source's device). A view computes
        // nothing and whoever reads it through ggml gets unpacked bytes, but a Tessera graph
        // may not view a weight held in the device's layout: it is left out. Every op reading
        // it was declined, so nothing here reads it.
        let g = G(n);
        // SAFETY: live tensors (the caller's contract).
        if unsafe { is_empty(n) } {
            continue;
        }
        if is_view_op(g.t().op)
            && g.view_src()
                // SAFETY: live tensors (the caller's contract).
                .is_some_and(|root| unsafe { crate::weights::held_in_device_layout(root.t()) })
        {
            continue;
        }
        tr.tensor(g)?;
    }
    let meta = device.kind() == tessera::DeviceType::Meta;
    if meta {
        for &n in nodes_in {
            // SAFETY: live tensors (the caller's contract).
            unsafe { transposed_split_write(G(n)) }?;
        }
    }
    let mut bindings = Bindings::new();
    let mut places = Vec::with_capacity(tr.owners.len());
    for &(id, g) in &tr.owners {
        // SAFETY: live tensors (the caller's contract).
        let buffer = unsafe { BufferCtx::of(g.t().buffer) }
            // A meta device reads other memory as its inputs (copied to the devices that cannot
            // read it) and writes its outputs back there.
            .filter(|b| meta || device.can_access(b.buffer().as_ref()))
            .ok_or_else(|| g.decline("its memory is not a Tessera buffer this device reads"))?;
        let len = tr.ctx.tensors()[id.index()].nbytes();
        // SAFETY: as above.
        let at = unsafe { buffer.offset_of(g.0, 0, len) }.map_err(|e| g.decline(e))?;
        bindings.bind(id, buffer.buffer(), at);
        places.push((buffer, at, len));
    }
    let computes = tr
        .nodes
        .iter()
        .any(|&id| !tr.ctx.tensors()[id.index()].op().kind().is_view());
    let nodes: HashSet<TensorId> = tr.nodes.iter().copied().collect();
    let (mut outputs, mut reads, mut lost) = (tr.nodes.clone(), Vec::new(), Vec::new());
    if meta {
        // SAFETY: as above.
        let kept = unsafe { kept_nodes(nodes_in) };
        outputs.clear();
        for (&(id, g), &(buffer, at, len)) in tr.owners.iter().zip(&places) {
            let range = (buffer.key(), at, at + len);
            if device.owns_buffer(buffer.buffer().as_ref()) {
                // Weights and caches are read in place; a node's value stored there (an op
                // writing its source in place, a result ggml placed beside its inputs) is
                // written back, split as the tensor it lands in.
                if nodes.contains(&id) {
                    outputs.push(id);
                }
                continue;
            }
            if !nodes.contains(&id) {
                reads.push(range);
            } else if keep_all || kept.contains(&g.0) {
                outputs.push(id);
            } else {
                lost.push(crate::objects::Lost {
                    buf: range.0,
                    start: range.1,
                    end: range.2,
                    label: g.label().into(),
                });
            }
        }
    }
    // An in-place node shares its source's memory: what it writes back is not lost.
    let written: Vec<(usize, usize, usize)> = if meta {
        let at: HashMap<TensorId, usize> = tr
            .owners
            .iter()
            .enumerate()
            .map(|(i, &(id, _))| (id, i))
            .collect();
        outputs
            .iter()
            .filter_map(|o| {
                let (b, at, len) = places[*at.get(o)?];
                Some((b.key(), at, at + len))
            })
            .collect()
    } else {
        Vec::new()
    };
    lost.retain(|l| {
        !written
            .iter()
            .any(|&(b, s, e)| b == l.buf && s < l.end && l.start < e)
    });
    let graph = computes.then(|| {
        let tensors: std::sync::Arc<[TensorDesc]> = tr.ctx.tensors().to_vec().into();
        let leafs = tr
            .owners
            .iter()
            .map(|&(id, _)| id)
            .filter(|id| !nodes.contains(id))
            .collect();
        Graph::from_parts(tensors, tr.nodes.clone(), leafs, outputs)
    });
    Ok(Translated {
        graph,
        bindings,
        reads,
        lost,
        written,
        id: TRANSLATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    })
}

/// On a meta device: a row write (SET_ROWS) must land in a tensor the meta device placed, and a
/// write of one element per row into a tensor split along its rows' width is llama.cpp's
/// transposed V cache (flash attention off), which a split by heads cannot hold; both are
/// declined with what to do.
///
/// # Safety
/// `g` and its view source are live.
unsafe fn transposed_split_write(g: G) -> Result<(), Decline> {
    let t = g.t();
    if t.op != sys::ggml_op_GGML_OP_SET_ROWS {
        return Ok(());
    }
    let Some(root) = g.view_src() else {
        return Ok(());
    };
    // SAFETY: the caller's contract.
    let Some(buffer) = (unsafe { BufferCtx::of(root.t().buffer) }) else {
        return Ok(());
    };
    let held = buffer.buffer();
    let Some(mb) = held.as_any().downcast_ref::<tessera::meta::MetaBuffer>() else {
        // Every device would write the same rows into one copy (or a copy of its own that
        // nobody reads back): rows go only into tensors the meta device placed.
        return Err(root.decline(
            "the meta device writes rows only into tensors it placed (weights and caches), \
             not into graph memory or a buffer it could not describe",
        ));
    };
    if t.ne[0] != 1 {
        return Ok(());
    }
    // SAFETY: as above.
    let split = unsafe { buffer.offset_of(root.0, 0, 1) }
        .ok()
        .and_then(|at| mb.placement_at(at))
        .is_some_and(|p| p.state.split_axis() == Some(0));
    if split {
        return Err(root.decline(
            "the V cache is split by heads as flash attention lays it out, but llama.cpp \
             stores it transposed without flash attention: run with flash attention on \
             (-fa on, or llama.cpp's default -fa auto)",
        ));
    }
    Ok(())
}

/// Whether `t` has no elements: an op on it computes nothing.
///
/// # Safety
/// `t` is a live tensor.
pub(crate) unsafe fn is_empty(t: *const sys::ggml_tensor) -> bool {
    // SAFETY: the caller's contract.
    unsafe { (*t).ne.contains(&0) }
}

/// The nodes of a graph part whose values ggml may read after it: those no node of the part
/// reads, ggml's outputs, and the tensors that unread views show.
///
/// # Safety
/// `nodes` and every tensor they reach are live.
pub(crate) unsafe fn kept_nodes(
    nodes: &[*mut sys::ggml_tensor],
) -> HashSet<*const sys::ggml_tensor> {
    let mut read = HashSet::new();
    for &n in nodes {
        // SAFETY: the caller's contract.
        let t = unsafe { &*n };
        read.extend(
            t.src
                .iter()
                .filter(|s| !s.is_null())
                .map(|&s| s.cast_const()),
        );
    }
    let mut kept = HashSet::new();
    for &n in nodes {
        let n = n.cast_const();
        // SAFETY: as above.
        let t = unsafe { &*n };
        let output = t.flags & sys::ggml_tensor_flag_GGML_TENSOR_FLAG_OUTPUT as i32 != 0;
        if read.contains(&n) && !output {
            continue;
        }
        kept.insert(n);
        if !t.view_src.is_null() {
            kept.insert(t.view_src.cast_const());
        }
    }
    kept
}
