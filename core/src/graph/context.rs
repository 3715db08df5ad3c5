//! [`Context`]: the arena in which a user describes tensors and ops.
//!
//! Every builder method checks its operands the way ggml's asserts do, but returns
//! [`Error::InvalidOp`] naming the op and tensor instead of aborting. A context only ever grows,
//! so ids stay valid and graphs built earlier remain consistent.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::{GluOp, Op, RopeParams, UnaryOp};
use crate::tensor::{
    MAX_DIMS, Shape, TensorDesc, TensorFlags, TensorId, ViewOf, contiguous_strides, dense_bytes,
};

/// Tensor descriptions and the ops between them.
#[derive(Clone, Debug, Default)]
pub struct Context {
    tensors: Vec<TensorDesc>,
}

fn invalid(op: &Op, tensor: String, reason: impl Into<String>) -> Error {
    Error::InvalidOp {
        op: op.name().to_string(),
        tensor,
        reason: reason.into(),
    }
}

impl Context {
    /// An empty context.
    pub fn new() -> Context {
        Context::default()
    }

    /// All descriptors, indexed by [`TensorId::index`].
    pub fn tensors(&self) -> &[TensorDesc] {
        &self.tensors
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the context holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The descriptor of `id`.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`] if `id` is not from this context.
    pub fn tensor(&self, id: TensorId) -> Result<&TensorDesc> {
        self.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: self.tensors.len(),
        })
    }

    /// `'name' #3` or `#3`, for messages.
    pub fn label(&self, id: TensorId) -> String {
        label_of(&self.tensors, id)
    }

    /// Names a tensor (names appear in errors, debug output and reports).
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn set_name(&mut self, id: TensorId, name: impl Into<String>) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.index()].name = name.into();
        Ok(())
    }

    /// Replaces a tensor's role flags.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn set_flags(&mut self, id: TensorId, flags: TensorFlags) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.index()].flags = flags;
        Ok(())
    }

    /// Marks a tensor as a graph input.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn set_input(&mut self, id: TensorId) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.index()].flags.input = true;
        Ok(())
    }

    /// Marks a tensor as a graph output.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn set_output(&mut self, id: TensorId) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.index()].flags.output = true;
        Ok(())
    }

    fn push(&mut self, t: TensorDesc) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(t);
        id
    }

    fn node(
        &mut self,
        op: Op,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        src: &[TensorId],
    ) -> Result<TensorId> {
        if dense_bytes(dtype, ne).is_none() {
            let first = src.first().map(|&s| self.label(s)).unwrap_or_default();
            return Err(invalid(
                &op,
                first,
                format!("the result {ne:?} of {dtype} overflows usize bytes"),
            ));
        }
        let mut t = TensorDesc::new(dtype, ne, op);
        for (slot, s) in t.src.iter_mut().zip(src) {
            *slot = Some(*s);
        }
        Ok(self.push(t))
    }

    fn get(&self, op: &Op, id: TensorId) -> Result<&TensorDesc> {
        self.tensors.get(id.index()).ok_or_else(|| {
            invalid(
                op,
                id.to_string(),
                format!(
                    "unknown tensor id (context has {} tensors)",
                    self.tensors.len()
                ),
            )
        })
    }

    fn check(
        &self,
        op: &Op,
        id: TensorId,
        ok: bool,
        reason: impl FnOnce() -> String,
    ) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(invalid(op, self.label(id), reason()))
        }
    }

    fn check_float(&self, op: &Op, id: TensorId) -> Result<&TensorDesc> {
        let t = self.get(op, id)?;
        self.check(op, id, t.dtype.is_float(), || {
            format!("dtype {} is not a float type", t.dtype)
        })?;
        Ok(t)
    }

    // ===== Leaves =====

    /// A new leaf tensor (weights, inputs, caches) of `dtype` and `shape`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if `shape[0]` is not a multiple of the dtype's block size.
    pub fn new_tensor(&mut self, dtype: DType, shape: impl Shape) -> Result<TensorId> {
        let ne = shape.dims();
        if dtype.row_size(ne[0]).is_none() {
            return Err(invalid(
                &Op::None,
                format!("#{}", self.tensors.len()),
                format!(
                    "ne0 = {} is not a multiple of {}'s block size {}",
                    ne[0],
                    dtype,
                    dtype.block_size()
                ),
            ));
        }
        if ne
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .is_none()
            || dense_bytes(dtype, ne).is_none()
        {
            return Err(invalid(
                &Op::None,
                format!("#{}", self.tensors.len()),
                "the tensor's byte size overflows usize",
            ));
        }
        Ok(self.push(TensorDesc::new(dtype, ne, Op::None)))
    }

    /// A new leaf with a name.
    ///
    /// # Errors
    /// As [`Context::new_tensor`].
    pub fn new_named(&mut self, name: &str, dtype: DType, shape: impl Shape) -> Result<TensorId> {
        let id = self.new_tensor(dtype, shape)?;
        self.tensors[id.index()].name = name.to_string();
        Ok(id)
    }

    // ===== Views =====

    fn push_view(
        &mut self,
        op: Op,
        src: TensorId,
        offset: usize,
        ne: [usize; MAX_DIMS],
        nb: [usize; MAX_DIMS],
    ) -> TensorId {
        let base = &self.tensors[src.index()];
        let mut t = TensorDesc::new(base.dtype, ne, op);
        t.nb = nb;
        t.src[0] = Some(src);
        t.view = Some(ViewOf { src, offset });
        t.name = if base.name.is_empty() {
            String::new()
        } else {
            format!("{} ({})", base.name, op.name().to_lowercase())
        };
        self.push(t)
    }

    /// A strided window onto `a`: shape `shape`, strides `nb1..nb3` (bytes), starting `offset` bytes
    /// into `a`'s data. The innermost stride is the dtype's block size.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if the window reaches past `a`'s data or splits a quant block.
    pub fn view(
        &mut self,
        a: TensorId,
        shape: impl Shape,
        nb: [usize; 3],
        offset: usize,
    ) -> Result<TensorId> {
        let op = Op::View;
        let t = self.get(&op, a)?;
        let ne = shape.dims();
        self.check(&op, a, t.dtype.row_size(ne[0]).is_some(), || {
            format!("ne0 {} splits a {} block", ne[0], t.dtype)
        })?;
        let strides = [t.dtype.type_size(), nb[0], nb[1], nb[2]];
        let mut probe = TensorDesc::new(t.dtype, ne, op);
        probe.nb = strides;
        let end = offset.checked_add(probe.nbytes());
        let avail = t.nbytes();
        self.check(&op, a, end.is_some_and(|e| e <= avail), || {
            format!(
                "view of {} bytes at offset {offset} exceeds the source's {avail} bytes",
                probe.nbytes()
            )
        })?;
        Ok(self.push_view(op, a, offset, ne, strides))
    }

    /// The same data with a new shape; `a` must be contiguous.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if `a` is not contiguous or the element counts differ.
    pub fn reshape(&mut self, a: TensorId, shape: impl Shape) -> Result<TensorId> {
        let op = Op::Reshape;
        let t = self.get(&op, a)?;
        let ne = shape.dims();
        self.check(&op, a, t.is_contiguous(), || {
            "source is not contiguous (use cont first)".into()
        })?;
        self.check(
            &op,
            a,
            ne.iter().product::<usize>() == t.nelements(),
            || {
                format!(
                    "{:?} has {} elements, source {:?} has {}",
                    ne,
                    ne.iter().product::<usize>(),
                    t.ne,
                    t.nelements()
                )
            },
        )?;
        self.check(&op, a, t.dtype.row_size(ne[0]).is_some(), || {
            format!("ne0 {} splits a {} block", ne[0], t.dtype)
        })?;
        let nb = contiguous_strides(t.dtype, ne);
        Ok(self.push_view(op, a, 0, ne, nb))
    }

    /// Reorders axes: axis `i` of `a` becomes axis `axes[i]` of the result (ggml's convention).
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if `axes` is not a permutation of 0..4 or would move a quant block axis.
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        let op = Op::Permute(axes);
        let t = self.get(&op, a)?;
        let mut seen = [false; 4];
        for &x in &axes {
            if x >= 4 || seen[x] {
                return Err(invalid(
                    &op,
                    self.label(a),
                    format!("{axes:?} is not a permutation of 0..4"),
                ));
            }
            seen[x] = true;
        }
        self.check(&op, a, !t.dtype.is_quantized() || axes[0] == 0, || {
            "cannot move the block axis of a quantized tensor".into()
        })?;
        let (mut ne, mut nb) = ([0; 4], [0; 4]);
        for i in 0..4 {
            ne[axes[i]] = t.ne[i];
            nb[axes[i]] = t.nb[i];
        }
        Ok(self.push_view(op, a, 0, ne, nb))
    }

    /// Swaps axes 0 and 1.
    ///
    /// # Errors
    /// As [`Context::permute`].
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        let t = self.get(&Op::Transpose, a)?;
        self.check(&Op::Transpose, a, !t.dtype.is_quantized(), || {
            "cannot transpose a quantized tensor".into()
        })?;
        let (mut ne, mut nb) = (t.ne, t.nb);
        ne.swap(0, 1);
        nb.swap(0, 1);
        Ok(self.push_view(Op::Transpose, a, 0, ne, nb))
    }

    // ===== Copies =====

    /// A contiguous copy of `a` with the same dtype.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] for a quantized source whose rows are not contiguous.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let op = Op::Cont;
        let t = self.get(&op, a)?;
        self.check(
            &op,
            a,
            !t.dtype.is_quantized() || t.is_row_contiguous(),
            || "quantized rows must be contiguous".into(),
        )?;
        let (dtype, ne) = (t.dtype, t.ne);
        self.node(op, dtype, ne, &[a])
    }

    /// Copies `a` into `b`'s storage converting the dtype; returns a view of `b` to use as the result.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if element counts differ, I32 meets another dtype, or a quantized side
    /// has a different row length than the other.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let op = Op::Cpy;
        let (ta, tb) = (self.get(&op, a)?, self.get(&op, b)?);
        self.check(&op, a, ta.nelements() == tb.nelements(), || {
            format!(
                "{} elements into {} with {}",
                ta.nelements(),
                self.label(b),
                tb.nelements()
            )
        })?;
        self.check(
            &op,
            a,
            (ta.dtype == DType::I32) == (tb.dtype == DType::I32),
            || format!("cannot convert {} to {}", ta.dtype, tb.dtype),
        )?;
        if ta.dtype.is_quantized() || tb.dtype.is_quantized() {
            self.check(
                &op,
                a,
                ta.ne == tb.ne && ta.is_row_contiguous() && tb.is_row_contiguous(),
                || {
                    "copies to or from quantized tensors need equal shapes and contiguous rows"
                        .into()
                },
            )?;
        }
        let (dtype, ne, nb) = (tb.dtype, tb.ne, tb.nb);
        let mut t = TensorDesc::new(dtype, ne, op);
        t.nb = nb;
        t.src = [Some(a), Some(b), None, None, None];
        t.view = Some(ViewOf { src: b, offset: 0 });
        Ok(self.push(t))
    }

    /// A copy of `a` converted to `dtype` (a new contiguous tensor).
    ///
    /// # Errors
    /// As [`Context::cpy`].
    pub fn cast(&mut self, a: TensorId, dtype: DType) -> Result<TensorId> {
        let t = self.get(&Op::Cpy, a)?;
        let ne = t.ne;
        let dst = self.new_tensor(dtype, ne)?;
        self.cpy(a, dst)
    }

    // ===== Rows =====

    /// Rows of `a` selected by i32 indices `ids` `[n, a.ne2, a.ne3]` → `[a.ne0, n, a.ne2, a.ne3]`
    /// (f32, or i32 when `a` is i32).
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-i32 index or mismatched batch axes.
    pub fn get_rows(&mut self, a: TensorId, ids: TensorId) -> Result<TensorId> {
        let op = Op::GetRows;
        let (ta, ti) = (self.get(&op, a)?, self.get(&op, ids)?);
        self.check(&op, ids, ti.dtype == DType::I32, || {
            format!("indices must be i32, got {}", ti.dtype)
        })?;
        self.check(
            &op,
            ids,
            ti.ne[1] == ta.ne[2] && ti.ne[2] == ta.ne[3] && ti.ne[3] == 1,
            || {
                format!(
                    "indices {:?} do not match table {:?} (want [n, {}, {}, 1])",
                    ti.ne, ta.ne, ta.ne[2], ta.ne[3]
                )
            },
        )?;
        self.check(&op, a, ta.is_row_contiguous(), || {
            "table rows must be contiguous".into()
        })?;
        let dtype = if ta.dtype == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        let ne = [ta.ne[0], ti.ne[0], ti.ne[1], ti.ne[2]];
        self.node(op, dtype, ne, &[a, ids])
    }

    /// Writes the rows of `src` into `dst` at the i32 row indices `ids` `[n, ...]` (broadcast over
    /// `src`'s axes 2 and 3); returns a view of `dst`. The KV-cache write.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on mismatched shapes, non-i32 indices, or a non-float source.
    pub fn set_rows(&mut self, dst: TensorId, src: TensorId, ids: TensorId) -> Result<TensorId> {
        let op = Op::SetRows;
        let (td, ts, ti) = (
            self.get(&op, dst)?,
            self.check_float(&op, src)?,
            self.get(&op, ids)?,
        );
        self.check(&op, ids, ti.dtype == DType::I32, || {
            format!("indices must be i32, got {}", ti.dtype)
        })?;
        self.check(
            &op,
            src,
            td.ne[0] == ts.ne[0] && td.ne[2] == ts.ne[2] && td.ne[3] == ts.ne[3],
            || format!("rows {:?} do not fit destination {:?}", ts.ne, td.ne),
        )?;
        self.check(
            &op,
            ids,
            ts.ne[1] == ti.ne[0]
                && ti.ne[1] != 0
                && ti.ne[2] != 0
                && ts.ne[2] % ti.ne[1] == 0
                && ts.ne[3] % ti.ne[2] == 0
                && ti.ne[3] == 1,
            || format!("indices {:?} do not match rows {:?}", ti.ne, ts.ne),
        )?;
        self.check(
            &op,
            dst,
            td.is_row_contiguous() && td.dtype != DType::I32,
            || "destination rows must be contiguous floats or blocks".into(),
        )?;
        let (dtype, ne, nb) = (td.dtype, td.ne, td.nb);
        let mut t = TensorDesc::new(dtype, ne, op);
        t.nb = nb;
        t.src = [Some(src), Some(ids), None, None, None];
        t.view = Some(ViewOf {
            src: dst,
            offset: 0,
        });
        Ok(self.push(t))
    }

    /// `a` and `b` joined along `dim`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if dtypes differ or other axes disagree.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let op = Op::Concat { dim };
        let (ta, tb) = (self.get(&op, a)?, self.get(&op, b)?);
        self.check(&op, a, dim < MAX_DIMS, || format!("dim {dim} out of range"))?;
        self.check(
            &op,
            b,
            ta.dtype == tb.dtype && !ta.dtype.is_quantized(),
            || format!("dtypes {} and {}", ta.dtype, tb.dtype),
        )?;
        self.check(
            &op,
            b,
            (0..MAX_DIMS).all(|d| d == dim || ta.ne[d] == tb.ne[d]),
            || {
                format!(
                    "shapes {:?} and {:?} differ outside axis {dim}",
                    ta.ne, tb.ne
                )
            },
        )?;
        let mut ne = ta.ne;
        ne[dim] += tb.ne[dim];
        let dtype = ta.dtype;
        self.node(op, dtype, ne, &[a, b])
    }

    // ===== Element-wise =====

    fn binary(&mut self, op: Op, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ta = self.check_float(&op, a)?;
        let tb = self.check_float(&op, b)?;
        self.check(&op, b, ta.can_broadcast(tb), || {
            format!("{:?} cannot be broadcast to {:?}", tb.ne, ta.ne)
        })?;
        let (dtype, ne) = (ta.dtype, ta.ne);
        self.node(op, dtype, ne, &[a, b])
    }

    /// `a + b`, `b` broadcast to `a`'s shape.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on non-float operands or shapes that do not broadcast.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Add, a, b)
    }
    /// `a − b`, broadcasting as [`Context::add`].
    ///
    /// # Errors
    /// As [`Context::add`].
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Sub, a, b)
    }
    /// `a · b`, broadcasting as [`Context::add`].
    ///
    /// # Errors
    /// As [`Context::add`].
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Mul, a, b)
    }
    /// `a / b`, broadcasting as [`Context::add`].
    ///
    /// # Errors
    /// As [`Context::add`].
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Div, a, b)
    }

    fn map(&mut self, op: Op, a: TensorId) -> Result<TensorId> {
        let t = self.check_float(&op, a)?;
        let (dtype, ne) = (t.dtype, t.ne);
        self.node(op, dtype, ne, &[a])
    }

    /// `a · s`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-float operand.
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        self.map(
            Op::Scale {
                scale: s,
                bias: 0.0,
            },
            a,
        )
    }
    /// `a · s + b`.
    ///
    /// # Errors
    /// As [`Context::scale`].
    pub fn scale_bias(&mut self, a: TensorId, s: f32, b: f32) -> Result<TensorId> {
        self.map(Op::Scale { scale: s, bias: b }, a)
    }
    /// `a²`.
    ///
    /// # Errors
    /// As [`Context::scale`].
    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId> {
        self.map(Op::Sqr, a)
    }
    /// `√a`.
    ///
    /// # Errors
    /// As [`Context::scale`].
    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId> {
        self.map(Op::Sqrt, a)
    }
    /// `a` clamped to `[min, max]`.
    ///
    /// # Errors
    /// As [`Context::scale`], and when `min > max`.
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        let op = Op::Clamp { min, max };
        self.check(&op, a, min <= max, || format!("min {min} > max {max}"))?;
        self.map(op, a)
    }
    /// An element-wise function.
    ///
    /// # Errors
    /// As [`Context::scale`].
    pub fn unary(&mut self, a: TensorId, f: UnaryOp) -> Result<TensorId> {
        self.map(Op::Unary(f), a)
    }
    /// SiLU.
    ///
    /// # Errors
    /// As [`Context::scale`].
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Silu)
    }
    /// GELU (tanh approximation).
    ///
    /// # Errors
    /// As [`Context::scale`].
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Gelu)
    }

    /// Fused gated unit on one tensor: gate and up are the halves of axis 0.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-float operand or an odd `ne0`.
    pub fn glu(&mut self, a: TensorId, f: GluOp, swapped: bool) -> Result<TensorId> {
        let op = Op::Glu { op: f, swapped };
        let t = self.check_float(&op, a)?;
        self.check(&op, a, t.ne[0] % 2 == 0, || {
            format!("ne0 {} is odd", t.ne[0])
        })?;
        let (dtype, mut ne) = (t.dtype, t.ne);
        ne[0] /= 2;
        self.node(op, dtype, ne, &[a])
    }

    /// Gated unit with separate tensors: `f(gate) · up`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on non-float operands or different shapes.
    pub fn glu_split(&mut self, gate: TensorId, up: TensorId, f: GluOp) -> Result<TensorId> {
        let op = Op::Glu {
            op: f,
            swapped: false,
        };
        let tg = self.check_float(&op, gate)?;
        let tu = self.check_float(&op, up)?;
        self.check(&op, up, tg.ne == tu.ne, || {
            format!("gate {:?} and up {:?} differ", tg.ne, tu.ne)
        })?;
        let (dtype, ne) = (tg.dtype, tg.ne);
        self.node(op, dtype, ne, &[gate, up])
    }
    /// `silu(gate) · up`.
    ///
    /// # Errors
    /// As [`Context::glu_split`].
    pub fn swiglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.glu_split(gate, up, GluOp::Swiglu)
    }

    // ===== Rows-wise reductions =====

    /// RMS normalisation of each row.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-float operand or a negative `eps`.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        let op = Op::RmsNorm { eps };
        self.check(&op, a, eps >= 0.0, || format!("eps {eps} < 0"))?;
        self.map(op, a)
    }
    /// Mean/variance normalisation of each row.
    ///
    /// # Errors
    /// As [`Context::rms_norm`].
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        let op = Op::Norm { eps };
        self.check(&op, a, eps >= 0.0, || format!("eps {eps} < 0"))?;
        self.map(op, a)
    }
    /// Sum of each row → `[1, ne1, ne2, ne3]`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-float operand.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        let t = self.check_float(&Op::SumRows, a)?;
        let (dtype, mut ne) = (t.dtype, t.ne);
        ne[0] = 1;
        self.node(Op::SumRows, dtype, ne, &[a])
    }
    /// Index of each row's maximum → i32 `[ne1, ne2, ne3]`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-float operand or an empty row.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        let t = self.check_float(&Op::Argmax, a)?;
        self.check(&Op::Argmax, a, t.ne[0] > 0, || "rows are empty".into())?;
        let ne = [t.ne[1], t.ne[2], t.ne[3], 1];
        self.node(Op::Argmax, DType::I32, ne, &[a])
    }

    /// `softmax(a)` of each row.
    ///
    /// # Errors
    /// As [`Context::soft_max_ext`].
    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// `softmax(a · scale + slope · mask)` per row; `mask` `[ne0, ≥ne1, ...]` (f16/f32) is broadcast
    /// over axes 2 and 3; `max_bias > 0` enables ALiBi slopes per head (axis 2).
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on non-float operands or a mask that does not cover `a`.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        let op = Op::SoftMax { scale, max_bias };
        let t = self.check_float(&op, a)?;
        let (dtype, ne) = (t.dtype, t.ne);
        if let Some(m) = mask {
            let tm = self.check_float(&op, m)?;
            self.check(&op, m, tm.dtype != DType::BF16, || {
                "mask must be f16 or f32".into()
            })?;
            self.check(
                &op,
                m,
                tm.ne[0] == ne[0]
                    && tm.ne[1] >= ne[1]
                    && tm.ne[2] != 0
                    && tm.ne[3] != 0
                    && ne[2] % tm.ne[2] == 0
                    && ne[3] % tm.ne[3] == 0,
                || format!("mask {:?} does not cover {:?}", tm.ne, ne),
            )?;
            self.node(op, dtype, ne, &[a, m])
        } else {
            self.node(op, dtype, ne, &[a])
        }
    }

    // ===== Attention =====

    /// Rotary embedding of `a` `[head_dim, n_head, n_tokens, b]` at i32 positions `pos` `[n_tokens]`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on non-float `a`, non-i32 positions, a position count other than `ne2`,
    /// or an odd / too large `n_dims`.
    pub fn rope(&mut self, a: TensorId, pos: TensorId, p: RopeParams) -> Result<TensorId> {
        self.rope_ext(a, pos, None, p)
    }

    /// [`Context::rope`] with per-pair frequency factors (ggml's `ggml_rope_ext` `c` operand,
    /// Llama 3.1's `rope_freqs.weight`): pair `i` turns by `θ_i / freqs[i]`. `freqs` is f32
    /// `[n_dims / 2]`.
    ///
    /// # Errors
    /// As [`Context::rope`]; [`Error::InvalidOp`] when `freqs` is not f32 `[n_dims / 2]`.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freqs: Option<TensorId>,
        p: RopeParams,
    ) -> Result<TensorId> {
        let op = Op::Rope(p);
        let t = self.check_float(&op, a)?;
        let tp = self.get(&op, pos)?;
        self.check(
            &op,
            pos,
            tp.dtype == DType::I32 && tp.ne[0] == t.ne[2] && tp.nelements() == tp.ne[0],
            || {
                format!(
                    "positions must be i32 [{}], got {} {:?}",
                    t.ne[2], tp.dtype, tp.ne
                )
            },
        )?;
        self.check(
            &op,
            a,
            p.n_dims.is_multiple_of(2) && p.n_dims <= t.ne[0] && p.n_dims > 0,
            || {
                format!(
                    "n_dims {} must be even, positive and ≤ ne0 {}",
                    p.n_dims, t.ne[0]
                )
            },
        )?;
        if let Some(f) = freqs {
            let tf = self.get(&op, f)?;
            self.check(
                &op,
                f,
                tf.dtype == DType::F32
                    && tf.nelements() == p.n_dims / 2
                    && tf.ne[0] == p.n_dims / 2,
                || {
                    format!(
                        "frequency factors must be f32 [{}], got {} {:?}",
                        p.n_dims / 2,
                        tf.dtype,
                        tf.ne
                    )
                },
            )?;
        }
        let (dtype, ne) = (t.dtype, t.ne);
        match freqs {
            Some(f) => self.node(op, dtype, ne, &[a, pos, f]),
            None => self.node(op, dtype, ne, &[a, pos]),
        }
    }

    /// `aᵀ·b`: `a` `[k, m, a2, a3]` (any weight dtype), `b` `[k, n, b2, b3]` (float) → f32
    /// `[m, n, b2, b3]`; `a` is broadcast over axes 2 and 3.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on mismatched `k`, non-broadcastable batches, i32 operands, or a
    /// transposed `a`.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let op = Op::MulMat;
        let ta = self.get(&op, a)?;
        let tb = self.check_float(&op, b)?;
        self.check(&op, a, ta.dtype != DType::I32, || {
            "weights cannot be i32".into()
        })?;
        self.check(&op, a, ta.is_row_contiguous(), || {
            "weight rows must be contiguous (transposed weights are not supported)".into()
        })?;
        self.check(&op, b, ta.ne[0] == tb.ne[0], || {
            format!("k differs: {:?} vs {:?}", ta.ne, tb.ne)
        })?;
        self.check(
            &op,
            b,
            ta.ne[2] != 0 && ta.ne[3] != 0 && tb.ne[2] % ta.ne[2] == 0 && tb.ne[3] % ta.ne[3] == 0,
            || format!("batch axes {:?} do not broadcast to {:?}", ta.ne, tb.ne),
        )?;
        let ne = [ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3]];
        self.node(op, DType::F32, ne, &[a, b])
    }

    /// Expert-indexed `aᵀ·b` (ggml's `mul_mat_id`): `a` `[k, m, n_expert]` weights, `b`
    /// `[k, n_b, T]` float activations, `ids` i32 `[n_used, T]` with `n_used` a multiple of
    /// `n_b` → f32 `[m, n_used, T]`; column `(i, t)` is `a[ids[i, t]]ᵀ · b[:, i mod n_b, t]`.
    /// An id outside `0..n_expert` is a run-time error of the backend.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on mismatched `k`, token counts or expert slots, a non-i32 `ids`,
    /// or 4-D operands.
    pub fn mul_mat_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        self.mul_mat_id_impl(a, b, ids, None)
    }

    /// The local-range form of [`Context::mul_mat_id`] (expert parallelism): `a` holds experts
    /// `first..first + ne2` of a larger set; a pair routed to another expert gets a zero column
    /// and is not computed, and only a negative id is an error.
    ///
    /// # Errors
    /// As [`Context::mul_mat_id`].
    pub fn mul_mat_id_local(
        &mut self,
        a: TensorId,
        b: TensorId,
        ids: TensorId,
        first: usize,
    ) -> Result<TensorId> {
        self.mul_mat_id_impl(a, b, ids, Some(first))
    }

    fn mul_mat_id_impl(
        &mut self,
        a: TensorId,
        b: TensorId,
        ids: TensorId,
        first_expert: Option<usize>,
    ) -> Result<TensorId> {
        let op = Op::MulMatId { first_expert };
        let ta = self.get(&op, a)?;
        let tb = self.check_float(&op, b)?;
        let ti = self.get(&op, ids)?;
        self.check(&op, a, ta.dtype != DType::I32 && ta.ne[3] == 1, || {
            format!(
                "weights must be a 3-D non-i32 stack, got {} {:?}",
                ta.dtype, ta.ne
            )
        })?;
        self.check(&op, a, ta.is_row_contiguous(), || {
            "weight rows must be contiguous".into()
        })?;
        self.check(&op, b, ta.ne[0] == tb.ne[0] && tb.ne[3] == 1, || {
            format!("activations {:?} do not match weights {:?}", tb.ne, ta.ne)
        })?;
        self.check(
            &op,
            ids,
            ti.dtype == DType::I32
                && ti.ne[1] == tb.ne[2]
                && ti.ne[2] == 1
                && ti.ne[3] == 1
                && tb.ne[1] != 0
                && ti.ne[0] % tb.ne[1] == 0,
            || {
                format!(
                    "ids must be i32 [n_used, {}] with n_used a multiple of {}, got {} {:?}",
                    tb.ne[2], tb.ne[1], ti.dtype, ti.ne
                )
            },
        )?;
        let ne = [ta.ne[1], ti.ne[0], ti.ne[1], 1];
        self.node(op, DType::F32, ne, &[a, b, ids])
    }

    /// `a` `[n, n_used, T]` plus row `ids[i, t]` of `b` `[n, n_expert]` (ggml's `add_id`:
    /// per-expert biases after [`Context::mul_mat_id`]) → f32 `[n, n_used, T]`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on mismatched shapes or a non-i32 `ids`.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        let op = Op::AddId;
        let ta = self.check_float(&op, a)?;
        let tb = self.check_float(&op, b)?;
        let ti = self.get(&op, ids)?;
        self.check(
            &op,
            b,
            ta.dtype == DType::F32
                && tb.dtype == DType::F32
                && tb.ne[0] == ta.ne[0]
                && tb.ne[2] == 1
                && tb.ne[3] == 1
                && ta.ne[3] == 1,
            || format!("biases {:?} do not match {:?} (both f32)", tb.ne, ta.ne),
        )?;
        self.check(
            &op,
            ids,
            ti.dtype == DType::I32 && ti.ne[0] == ta.ne[1] && ti.ne[1] == ta.ne[2] && ti.ne[2] == 1,
            || {
                format!(
                    "ids {} {:?} must be i32 [{}, {}]",
                    ti.dtype, ti.ne, ta.ne[1], ta.ne[2]
                )
            },
        )?;
        let ne = ta.ne;
        self.node(op, DType::F32, ne, &[a, b, ids])
    }

    /// The i32 indices that sort each row of `a`, largest first when `descending`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on a non-float operand or rows longer than `i32::MAX`.
    pub fn argsort(&mut self, a: TensorId, descending: bool) -> Result<TensorId> {
        let op = Op::Argsort { descending };
        let t = self.check_float(&op, a)?;
        self.check(&op, a, i32::try_from(t.ne[0]).is_ok(), || {
            "rows are longer than i32::MAX".into()
        })?;
        let ne = t.ne;
        self.node(op, DType::I32, ne, &[a])
    }

    /// The indices of the `k` largest elements of each row, largest first (ggml's
    /// `argsort_top_k`: a descending [`Context::argsort`] and a view of its first `k` columns).
    ///
    /// # Errors
    /// As [`Context::argsort`]; [`Error::InvalidOp`] if `k` is 0 or exceeds the row length.
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        let op = Op::Argsort { descending: true };
        let t = self.check_float(&op, a)?;
        self.check(&op, a, k > 0 && k <= t.ne[0], || {
            format!("top-k of {k} from rows of {}", t.ne[0])
        })?;
        let sorted = self.argsort(a, true)?;
        let st = &self.tensors[sorted.index()];
        let (mut ne, nb) = (st.ne, st.nb);
        ne[0] = k;
        self.view(sorted, ne, [nb[1], nb[2], nb[3]], 0)
    }

    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): `g·σ(α·g)·(u + 1)` with
    /// `g = min(gate, limit)` and `u = clamp(up, −limit, limit)`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on non-float operands or different shapes.
    pub fn swiglu_oai(
        &mut self,
        gate: TensorId,
        up: TensorId,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId> {
        let op = Op::SwigluOai { alpha, limit };
        let tg = self.check_float(&op, gate)?;
        let tu = self.check_float(&op, up)?;
        self.check(&op, up, tg.ne == tu.ne, || {
            format!("gate {:?} and up {:?} differ", tg.ne, tu.ne)
        })?;
        self.check(&op, gate, alpha.is_finite() && limit.is_finite(), || {
            format!("alpha {alpha} and limit {limit} must be finite")
        })?;
        let (dtype, ne) = (tg.dtype, tg.ne);
        self.node(op, dtype, ne, &[gate, up])
    }

    /// Gives the FLASH_ATTN_EXT node `fa` attention sinks (ggml's `flash_attn_ext_add_sinks`):
    /// f32 `[n_head]`, one logit per head that joins each softmax denominator with no value.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] if `fa` is not FLASH_ATTN_EXT or `sinks` is not f32 `[n_head]`.
    pub fn flash_attn_ext_add_sinks(&mut self, fa: TensorId, sinks: TensorId) -> Result<()> {
        let tf = self.tensor(fa)?;
        let op = *tf.op();
        let n_head = tf.ne[1];
        // Sources are also read as a dense list (`srcs()`): the sinks are the fifth only after a
        // mask.
        let has_mask = tf.src[3].is_some();
        self.check(
            &op,
            fa,
            op.kind() == crate::ops::OpKind::FlashAttnExt && has_mask,
            || "sinks go on a FLASH_ATTN_EXT node with a mask".into(),
        )?;
        let ts = self.get(&op, sinks)?;
        self.check(
            &op,
            sinks,
            ts.dtype == DType::F32 && ts.ne == [n_head, 1, 1, 1],
            || format!("sinks must be f32 [{n_head}], got {} {:?}", ts.dtype, ts.ne),
        )?;
        self.tensors[fa.index()].src[4] = Some(sinks);
        Ok(())
    }

    /// Fused attention: `softmax(scale·q·kᵀ + mask)·v` per head with grouped KV heads.
    /// q `[d, n_q, h, b]` f32; k `[d, n_kv, h_kv, b]` and v `[dv, n_kv, h_kv, b]` each of any
    /// float or block type (rows of whole blocks, which `new_tensor` already requires); mask `[n_kv, ≥n_q, 1, 1 or b]` f16/f32 (one for every batch, or one per batch: the
    /// KV streams of several sequences) → f32 `[dv, h, n_q, b]`.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] on any shape or dtype mismatch.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        let op = Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        };
        let (tq, tk, tv) = (
            self.check_float(&op, q)?,
            self.get(&op, k)?,
            self.get(&op, v)?,
        );
        self.check(&op, q, tq.dtype == DType::F32, || {
            format!("q must be f32, got {}", tq.dtype)
        })?;
        // A KV cache of any float or block type, K and V independently (llama.cpp's -ctk/-ctv).
        for (id, t, which) in [(k, tk, "k"), (v, tv, "v")] {
            self.check(
                &op,
                id,
                t.dtype.is_float() || t.dtype.is_quantized(),
                || format!("{which} must be a float or block type, got {}", t.dtype),
            )?;
        }
        self.check(&op, k, tk.ne[0] == tq.ne[0], || {
            format!("head size {} vs q {}", tk.ne[0], tq.ne[0])
        })?;
        self.check(
            &op,
            v,
            tv.ne[1] == tk.ne[1] && tv.ne[2] == tk.ne[2] && tv.ne[3] == tk.ne[3],
            || format!("v {:?} does not match k {:?}", tv.ne, tk.ne),
        )?;
        self.check(
            &op,
            k,
            tk.ne[2] != 0 && tq.ne[2] % tk.ne[2] == 0 && tk.ne[3] == tq.ne[3],
            || format!("q heads {:?} not a multiple of kv heads {:?}", tq.ne, tk.ne),
        )?;
        self.check(
            &op,
            q,
            tk.is_row_contiguous() && tv.is_row_contiguous(),
            || "k/v rows must be contiguous".into(),
        )?;
        let mut src = vec![q, k, v];
        if let Some(m) = mask {
            let tm = self.check_float(&op, m)?;
            self.check(
                &op,
                m,
                tm.dtype != DType::BF16
                    && tm.ne[0] == tk.ne[1]
                    && tm.ne[1] >= tq.ne[1]
                    && tm.ne[2] == 1
                    && (tm.ne[3] == 1 || tm.ne[3] == tq.ne[3]),
                || {
                    format!(
                        "mask {} {:?} must be f16/f32 [{}, ≥{}, 1, 1 or {}]",
                        tm.dtype, tm.ne, tk.ne[1], tq.ne[1], tq.ne[3]
                    )
                },
            )?;
            src.push(m);
        }
        let ne = [tv.ne[0], tq.ne[2], tq.ne[1], tq.ne[3]];
        self.node(op, DType::F32, ne, &src)
    }

    // ===== Graphs =====

    /// The graph computing `out` and everything it depends on.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn build_forward(&self, out: TensorId) -> Result<Graph> {
        self.build_forward_multi(&[out])
    }

    /// The graph computing all of `outs`, in order of first need.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn build_forward_multi(&self, outs: &[TensorId]) -> Result<Graph> {
        for &o in outs {
            self.tensor(o)?;
        }
        Ok(Graph::build(self.tensors.clone(), outs))
    }
}

/// How errors name a tensor of `tensors`: `'name' #3`, or `#3` for an unnamed tensor.
pub fn label_of(tensors: &[TensorDesc], id: TensorId) -> String {
    match tensors.get(id.index()) {
        Some(t) if !t.name.is_empty() => format!("'{}' {}", t.name, id),
        _ => id.to_string(),
    }
}
