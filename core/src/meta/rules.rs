//! Per-op propagation rules (meta-device.md §4 with Tessera's changes): given the states a
//! node's sources present to it, the node's own state, or a typed error naming the node, the op
//! and the source states.

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::meta::remap;
use crate::meta::split::{Segment, SplitKind, SplitState};
use crate::ops::{Op, OpKind};
use crate::tensor::{TensorDesc, TensorId};

/// One node being evaluated: its sources (for SET_ROWS the destination is appended) and the
/// states they present.
pub(crate) struct NodeCtx<'a> {
    pub graph: &'a Graph,
    pub id: TensorId,
    pub desc: &'a TensorDesc,
    pub srcs: &'a [TensorId],
    pub states: &'a [SplitState],
}

impl NodeCtx<'_> {
    fn fail(&self, why: impl std::fmt::Display) -> Error {
        let states: Vec<String> = self.states.iter().map(|s| s.to_string()).collect();
        let why = why.to_string();
        Error::InvalidOp {
            op: self.desc.op().name().to_string(),
            tensor: self.graph.label(self.id),
            reason: format!(
                "cannot split: {} with sources in states [{}]{}{}",
                self.desc.op().name(),
                states.join(", "),
                if why.is_empty() { "" } else { ": " },
                why
            ),
        }
    }

    fn st(&self, i: usize) -> Result<&SplitState> {
        self.states
            .get(i)
            .ok_or_else(|| self.fail(format!("missing source {i}")))
    }

    fn src(&self, i: usize) -> Result<&TensorDesc> {
        let id = *self
            .srcs
            .get(i)
            .ok_or_else(|| self.fail(format!("missing source {i}")))?;
        self.graph.tensor(id)
    }

    fn no_partial(&self) -> Result<()> {
        if self.states.iter().any(SplitState::is_partial) {
            Err(self.fail("a PARTIAL source must be reduced first, but it is static"))
        } else {
            Ok(())
        }
    }

    /// `a` and `b` split along their own axes with the same per-device proportions
    /// (`L_a[j]·ne_b == L_b[j]·ne_a`), the condition of ratio takeover.
    fn proportional(a: &SplitState, ne_a: usize, b: &SplitState, ne_b: usize) -> bool {
        let (la, lb) = (a.local_lens(), b.local_lens());
        la.len() == lb.len() && la.iter().zip(&lb).all(|(x, y)| x * ne_b == y * ne_a)
    }
}

/// Every source mirrored → mirrored; otherwise `None`.
fn all_mirrored(c: &NodeCtx<'_>) -> Option<SplitState> {
    c.states
        .iter()
        .all(SplitState::is_mirrored)
        .then(SplitState::mirrored)
}

/// The state of node `c.id` from its sources' states. May return PARTIAL (MUL_MAT of two
/// equivalent A0 operands).
pub(crate) fn rule(c: &NodeCtx<'_>) -> Result<SplitState> {
    c.no_partial()?;
    if let Some(m) = all_mirrored(c) {
        // Every op maps replicated inputs to a replicated output.
        return Ok(m);
    }
    let s0 = c.st(0)?.clone();
    let a0 = s0.split_axis();
    if c.desc.op().kind() != OpKind::MulMatId
        && c.states.iter().any(|s| s.kind() == SplitKind::Routed)
    {
        return routed(c, &s0);
    }
    match *c.desc.op() {
        Op::None => Ok(s0),
        Op::Cont => Ok(s0),
        Op::Permute(axes) => Ok(match a0 {
            Some(a) => s0.with_axis(axes[a]),
            None => s0,
        }),
        Op::Transpose => Ok(match a0 {
            Some(a @ (0 | 1)) => s0.with_axis(1 - a),
            _ => s0,
        }),
        Op::Reshape => view_like(c, &s0, 0),
        Op::View => {
            let offset = c.desc.view_of().map_or(0, |v| v.offset);
            view_like(c, &s0, offset)
        }
        Op::Cpy => cpy(c, &s0),
        Op::Scale { .. } | Op::Sqr | Op::Sqrt | Op::Clamp { .. } | Op::Unary(_) => Ok(s0),
        Op::Add | Op::Sub | Op::Mul | Op::Div => broadcast_binary(c, &s0),
        Op::Glu { .. } => glu(c, &s0),
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::SumRows => per_row(c, &s0),
        Op::Argmax => {
            let s = per_row(c, &s0)?;
            Ok(s.split_axis().map_or(s.clone(), |a| s.with_axis(a - 1)))
        }
        Op::SoftMax { max_bias, .. } => soft_max(c, &s0, max_bias),
        Op::Rope(_) => {
            if !c.st(1)?.is_mirrored() {
                return Err(c.fail("positions must be MIRRORED"));
            }
            if c.states.len() > 2 && !c.st(2)?.is_mirrored() {
                return Err(c.fail("frequency factors must be MIRRORED"));
            }
            match a0 {
                Some(0) => Err(c.fail("ROPE rotates within a row, which A0 splits")),
                Some(2) => Err(c.fail("positions are per ne2 index, which A2 splits")),
                _ => Ok(s0),
            }
        }
        Op::GetRows => {
            if !c.st(1)?.is_mirrored() {
                return Err(c.fail("indices must be MIRRORED"));
            }
            match a0 {
                Some(0) => Ok(s0),
                _ => Err(c.fail("only the columns (A0) of a table may be split")),
            }
        }
        Op::SetRows => set_rows(c, &s0),
        Op::Concat { dim } => {
            let s1 = c.st(1)?;
            match a0 {
                Some(a) if a != dim && s0.equivalent(s1) => Ok(s0),
                _ => Err(c.fail(format!(
                    "both sides must be split alike on an axis other than {dim}"
                ))),
            }
        }
        Op::MulMat => mul_mat(c, &s0),
        Op::MulMatId { first_expert } => mul_mat_id(c, &s0, first_expert),
        Op::AddId => add_id(c, &s0),
        Op::SwigluOai { .. } => glu(c, &s0),
        Op::Argsort { .. } => per_row(c, &s0),
        Op::FlashAttnExt { max_bias, .. } => flash_attn(c, &s0, max_bias),
        #[allow(unreachable_patterns)]
        _ => Err(c.fail("op not supported by the meta device")),
    }
}

fn view_like(c: &NodeCtx<'_>, s0: &SplitState, offset: usize) -> Result<SplitState> {
    let Some(a) = s0.split_axis() else {
        return Ok(s0.clone());
    };
    let (src, dst) = (c.src(0)?, c.desc);
    if dst.ne() == src.ne() && dst.nb() == src.nb() && offset == 0 {
        return Ok(s0.clone());
    }
    if src.is_permuted() {
        return Err(c.fail("a view of a permuted split tensor"));
    }
    if dst.is_permuted() {
        return remap::nested(src, s0, a, dst, offset)
            .map_err(|e| c.fail(format!("as a permuted strided view: {e}")));
    }
    let flat = if src.is_contiguous() && dst.is_contiguous() {
        match remap::flat(src, s0, a, dst, offset) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        }
    } else {
        "not contiguous".into()
    };
    remap::strided(src, s0, a, dst, offset)
        .or_else(|e| remap::nested(src, s0, a, dst, offset).map_err(|n| format!("{e}; {n}")))
        .map_err(|e| c.fail(format!("as a reshape: {flat}; as a strided view: {e}")))
}

fn cpy(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    let (a, b) = (c.src(0)?, c.src(1)?);
    let s1 = c.st(1)?;
    let target = match s0.split_axis() {
        None => s0.clone(),
        Some(_) if a.ne() == b.ne() => s0.clone(),
        Some(ax) if a.is_contiguous() && b.is_contiguous() => {
            remap::flat(a, s0, ax, b, 0).map_err(|e| c.fail(e))?
        }
        Some(_) => return Err(c.fail("reshaping copy of a non-contiguous split tensor")),
    };
    if s1.is_mirrored() {
        if target.is_mirrored() {
            return Ok(target);
        }
        if b.flags().param {
            return Err(c.fail("a split copy into a static MIRRORED tensor"));
        }
        // A plain buffer: each device writes its slice into its own copy.
        return Ok(target);
    }
    if target.equivalent(s1) {
        Ok(s1.clone())
    } else {
        Err(c.fail("the copy and its destination are split differently"))
    }
}

fn broadcast_binary(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    let (t0, t1, s1) = (c.src(0)?, c.src(1)?, c.st(1)?);
    match s0.split_axis() {
        Some(k) if s1.is_mirrored() && t1.ne()[k] == 1 => Ok(s0.clone()),
        Some(k) if t1.ne()[k] == t0.ne()[k] && s0.equivalent(s1) => Ok(s0.clone()),
        _ => Err(
            c.fail("src1 must be split like src0, or MIRRORED and broadcast along the split axis")
        ),
    }
}

fn glu(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    if c.srcs.len() > 1 {
        return if s0.equivalent(c.st(1)?) {
            Ok(s0.clone())
        } else {
            Err(c.fail("gate and up must be split alike"))
        };
    }
    match s0.split_axis() {
        Some(0) => match s0.segments() {
            // Each device holds [gate_j; up_j]: its local halves are its own pieces.
            [seg] if seg.repeats == 2 => {
                SplitState::axis(0, vec![Segment::new(seg.lens.clone(), 1)], c.desc.ne()[0])
                    .map_err(|e| c.fail(e))
            }
            _ => Err(c.fail("a fused gate/up on A0 must be split as one segment repeated twice")),
        },
        _ => Ok(s0.clone()),
    }
}

fn per_row(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    if s0.split_axis() == Some(0) {
        return Err(c.fail("the op reduces along ne0, which A0 splits"));
    }
    Ok(s0.clone())
}

fn soft_max(c: &NodeCtx<'_>, s0: &SplitState, max_bias: f32) -> Result<SplitState> {
    let s = per_row(c, s0)?;
    if c.srcs.len() < 2 {
        return Ok(s);
    }
    if !c.st(1)?.is_mirrored() {
        return Err(c.fail("the mask must be MIRRORED"));
    }
    let mask = c.src(1)?;
    match s.split_axis() {
        Some(1) => Err(c.fail("mask rows cannot follow an A1 split")),
        Some(2) if max_bias != 0.0 => Err(c.fail("ALiBi slopes are per head, which A2 splits")),
        Some(k) if mask.ne()[k] != 1 => Err(c.fail(format!(
            "the mask is not broadcast along the split axis {k}"
        ))),
        _ => Ok(s),
    }
}

fn set_rows(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    let (ids, st_ids, dst) = (c.src(1)?, c.st(1)?, c.st(2)?);
    if !st_ids.is_mirrored() {
        return Err(c.fail("indices must be MIRRORED"));
    }
    match s0.split_axis() {
        Some(1) => Err(c.fail("the written rows (A1) cannot be split")),
        Some(2) if ids.ne()[1] != 1 => Err(c.fail("per-ne2 indices cannot follow an A2 split")),
        Some(3) if ids.ne()[2] != 1 => Err(c.fail("per-ne3 indices cannot follow an A3 split")),
        _ if s0.equivalent(dst) => Ok(dst.clone()),
        _ => Err(c.fail("data and destination must be split alike")),
    }
}

fn mul_mat(c: &NodeCtx<'_>, w: &SplitState) -> Result<SplitState> {
    let (tw, tx, x) = (c.src(0)?, c.src(1)?, c.st(1)?);
    match (w.kind(), x.kind()) {
        // Column-parallel: each device computes its output features, in its local order.
        (SplitKind::Axis(1), SplitKind::Mirrored) => Ok(w.with_axis(0)),
        (SplitKind::Mirrored, SplitKind::Axis(1)) => Ok(x.clone()),
        (SplitKind::Mirrored, SplitKind::Axis(k @ (2 | 3))) if tw.ne()[k] == 1 => Ok(x.clone()),
        // Row-parallel: partial sums, reduced before non-linear use.
        (SplitKind::Axis(0), SplitKind::Axis(0)) if w.equivalent(x) => Ok(SplitState::partial()),
        (SplitKind::Axis(k @ (2 | 3)), SplitKind::Axis(k2))
            if k == k2 && NodeCtx::proportional(w, tw.ne()[k], x, tx.ne()[k]) =>
        {
            Ok(x.clone())
        }
        _ => Err(c.fail(
            "supported: (M, M), (A1, M), (M, A1..A3), (A0, A0) alike, (A2/A3, A2/A3) proportional",
        )),
    }
}

fn flash_attn(c: &NodeCtx<'_>, q: &SplitState, max_bias: f32) -> Result<SplitState> {
    let (tq, tk) = (c.src(0)?, c.src(1)?);
    let (k, v) = (c.st(1)?, c.st(2)?);
    if c.states.len() > 3 && !c.st(3)?.is_mirrored() {
        return Err(c.fail("the mask must be MIRRORED"));
    }
    if q.split_axis() != Some(2) {
        return Err(c.fail("Q must be split by heads (A2)"));
    }
    if max_bias != 0.0 {
        return Err(c.fail("ALiBi slopes are per head, which A2 splits"));
    }
    let kv_ok = match (k.split_axis(), v.split_axis()) {
        (Some(2), Some(2)) => {
            k.equivalent(v) && NodeCtx::proportional(q, tq.ne()[2], k, tk.ne()[2])
        }
        // MQA: one KV head, replicated, serves every local Q head.
        (None, None) => k.is_mirrored() && v.is_mirrored() && tk.ne()[2] == 1,
        _ => false,
    };
    if !kv_ok {
        return Err(
            c.fail("K and V must be A2 in proportion to Q's heads (or MIRRORED with one KV head)")
        );
    }
    Ok(q.with_axis(1))
}

/// MUL_MAT_ID (weights src0 `[k, m, n_expert]`, activations src1, ids src2, which must be
/// MIRRORED). Tensor parallelism splits every expert: gate/up on A1 give A0 outputs, down on A0
/// with A0 activations gives PARTIAL. Expert parallelism splits the stack on A2 (whole experts
/// per device, one contiguous range each): gate/up give ROUTED outputs and down, reading them,
/// gives PARTIAL (every column is computed on the device holding its expert, zero elsewhere).
fn mul_mat_id(c: &NodeCtx<'_>, w: &SplitState, first_expert: Option<usize>) -> Result<SplitState> {
    let (x, ids) = (c.st(1)?, c.st(2)?);
    if !ids.is_mirrored() {
        return Err(c.fail("the expert ids must be MIRRORED"));
    }
    if first_expert.is_some() {
        return Err(c.fail("the local-range form is made per device by the meta device"));
    }
    match (w.kind(), x.kind()) {
        (SplitKind::Axis(1), SplitKind::Mirrored) => Ok(w.with_axis(0)),
        (SplitKind::Axis(0), SplitKind::Axis(0)) if w.equivalent(x) => Ok(SplitState::partial()),
        (SplitKind::Axis(2), _) if w.segments().len() != 1 || w.segments()[0].repeats != 1 => {
            Err(c.fail("an expert split must give each device one contiguous range"))
        }
        (SplitKind::Axis(2), SplitKind::Mirrored) => Ok(SplitState::routed(w.local_lens())),
        (SplitKind::Axis(2), SplitKind::Routed) if x.local_lens() == w.local_lens() => {
            Ok(SplitState::partial())
        }
        _ => Err(c.fail(
            "supported: (A1, M), (A0, A0) alike, (A2, M) and (A2, ROUTED) over the same experts",
        )),
    }
}

/// ADD_ID: `src0 + bias[ids]` with MIRRORED ids. Split alike (A0: the expert FFN's own
/// columns, with the bias split the same way) keeps the split. A PARTIAL sum and a PARTIAL bias
/// are handled as linear ops before this rule.
fn add_id(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    let (b, ids) = (c.st(1)?, c.st(2)?);
    if !ids.is_mirrored() {
        return Err(c.fail("the expert ids must be MIRRORED"));
    }
    match s0.split_axis() {
        Some(0) if s0.equivalent(b) => Ok(s0.clone()),
        _ => Err(c.fail("src0 and the biases must be split alike along ne0")),
    }
}

/// Consumers of a ROUTED value: only ops that keep every `(slot, token)` column on its own
/// (elementwise ops of same-shape ROUTED operands, ADD_ID of MIRRORED biases, copies) keep it
/// ROUTED, since a column is valid on one device and unspecified on the others.
fn routed(c: &NodeCtx<'_>, s0: &SplitState) -> Result<SplitState> {
    let r = c
        .states
        .iter()
        .find(|s| s.kind() == SplitKind::Routed)
        .cloned()
        .unwrap_or_else(|| s0.clone());
    let same_shape_routed =
        |i: usize| -> Result<bool> { Ok(c.st(i)?.equivalent(&r) && c.src(i)?.ne() == c.desc.ne()) };
    let ok = match *c.desc.op() {
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } | Op::Sqr | Op::Sqrt | Op::Cont => {
            same_shape_routed(0)?
        }
        Op::Glu { .. } if c.srcs.len() == 1 => s0.equivalent(&r),
        Op::Glu { .. } | Op::SwigluOai { .. } => same_shape_routed(0)? && same_shape_routed(1)?,
        Op::AddId => same_shape_routed(0)? && c.st(1)?.is_mirrored() && c.st(2)?.is_mirrored(),
        _ => false,
    };
    if ok {
        Ok(r)
    } else {
        Err(c.fail(
            "a ROUTED (expert-parallel) value only feeds elementwise ops, ADD_ID of MIRRORED \
             biases and the down MUL_MAT_ID",
        ))
    }
}
