//! [`SplitState`]: how one tensor is distributed over the devices of a meta device, plus the
//! host-side reference scatter / gather that set and get of split tensors are defined by.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{MAX_DIMS, TensorDesc, contiguous_strides};
use std::fmt;

/// Most segments one state may hold (upstream allows 16; reshapes of segmented tensors unroll
/// repeats, so Tessera allows a little more).
pub const MAX_SEGMENTS: usize = 64;

/// What kind of distribution a tensor has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitKind {
    /// Device `j` holds its pieces along this axis (0..=3); see [`Segment`].
    Axis(usize),
    /// Every device holds the full tensor, and the copies are identical.
    Mirrored,
    /// Every device holds a full-shape addend; the value is their sum (F32 only).
    Partial,
    /// Expert parallelism: a full-shape `[n, n_used, T]` value whose column `(i, t)` is valid
    /// only on the device holding expert `ids[i, t]` and unspecified elsewhere (the output of an
    /// expert-split MUL_MAT_ID and elementwise ops of it). The one segment holds the experts per
    /// device. Only the down MUL_MAT_ID turns it back into a sum (PARTIAL); it is never static.
    Routed,
}

/// One segment of an axis split: device `j` holds `lens[j]` elements of each of `repeats`
/// consecutive repetitions of the segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Piece length per device, in elements along the split axis.
    pub lens: Vec<usize>,
    /// How often the segment repeats (≥ 1).
    pub repeats: usize,
}

impl Segment {
    /// A segment of `lens` repeated `repeats` times.
    pub fn new(lens: Vec<usize>, repeats: usize) -> Segment {
        Segment { lens, repeats }
    }

    /// Elements of one repetition (Σ lens).
    pub fn period(&self) -> usize {
        self.lens.iter().sum()
    }
}

/// The distribution of one tensor over N devices.
///
/// Invariant (checked by every constructor): for axis kinds, every segment has the same device
/// count N ≥ 1 and `repeats ≥ 1`, and Σ_s Σ_j `lens[s][j]·repeats[s]` equals the tensor's length
/// along the axis. Non-axis kinds have no segments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SplitState {
    kind: SplitKind,
    segments: Vec<Segment>,
}

impl SplitState {
    /// Every device holds the full tensor.
    pub fn mirrored() -> SplitState {
        SplitState {
            kind: SplitKind::Mirrored,
            segments: Vec::new(),
        }
    }

    /// Every device holds an addend of the full tensor.
    pub fn partial() -> SplitState {
        SplitState {
            kind: SplitKind::Partial,
            segments: Vec::new(),
        }
    }

    /// A [`SplitKind::Routed`] value over experts split `expert_lens` per device.
    pub fn routed(expert_lens: Vec<usize>) -> SplitState {
        SplitState {
            kind: SplitKind::Routed,
            segments: vec![Segment::new(expert_lens, 1)],
        }
    }

    /// A split along `axis` with `segments`, for a tensor of `ne_axis` elements on that axis.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the axis is out of range, there are no (or too many) segments,
    /// a segment repeats 0 times, device counts differ or are 0, or the pieces do not add up to
    /// `ne_axis`.
    pub fn axis(axis: usize, segments: Vec<Segment>, ne_axis: usize) -> Result<SplitState> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("split state: {why}")));
        if axis >= MAX_DIMS {
            return bad(format!("axis {axis} out of range"));
        }
        if segments.is_empty() || segments.len() > MAX_SEGMENTS {
            return bad(format!(
                "{} segments (want 1..={MAX_SEGMENTS})",
                segments.len()
            ));
        }
        let n = segments[0].lens.len();
        let mut total = 0usize;
        for (s, seg) in segments.iter().enumerate() {
            if n == 0 || seg.lens.len() != n {
                return bad(format!(
                    "segment {s} has {} devices, segment 0 has {n}",
                    seg.lens.len()
                ));
            }
            if seg.repeats == 0 {
                return bad(format!("segment {s} repeats 0 times"));
            }
            let ext = seg
                .lens
                .iter()
                .try_fold(0usize, |a, &l| a.checked_add(l))
                .and_then(|p| p.checked_mul(seg.repeats))
                .and_then(|e| e.checked_add(total));
            match ext {
                Some(t) => total = t,
                None => return bad("lengths overflow".into()),
            }
        }
        if total != ne_axis {
            return bad(format!(
                "pieces on axis {axis} add up to {total}, the tensor has {ne_axis}"
            ));
        }
        Ok(SplitState {
            kind: SplitKind::Axis(axis),
            segments,
        })
    }

    /// A one-segment split along `axis` with per-device lengths `lens` (the axis length is their
    /// sum).
    ///
    /// # Errors
    /// As [`SplitState::axis`].
    pub fn axis_lens(axis: usize, lens: Vec<usize>) -> Result<SplitState> {
        let ne = lens.iter().sum();
        SplitState::axis(axis, vec![Segment::new(lens, 1)], ne)
    }

    /// The kind of distribution.
    pub fn kind(&self) -> SplitKind {
        self.kind
    }

    /// The split axis, for axis kinds.
    pub fn split_axis(&self) -> Option<usize> {
        match self.kind {
            SplitKind::Axis(a) => Some(a),
            _ => None,
        }
    }

    /// Whether every device holds the full tensor.
    pub fn is_mirrored(&self) -> bool {
        self.kind == SplitKind::Mirrored
    }

    /// Whether the devices hold addends.
    pub fn is_partial(&self) -> bool {
        self.kind == SplitKind::Partial
    }

    /// The segments (empty for non-axis kinds).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The device count an axis or routed state was built for; `None` for mirrored and
    /// partial states, which fit any device count.
    pub fn n_devices(&self) -> Option<usize> {
        self.segments.first().map(|s| s.lens.len())
    }

    /// `L_j = Σ_s lens[s][j]·repeats[s]`, device `j`'s length along the split axis (its expert
    /// count for routed states; 0 for mirrored and partial ones or an out-of-range `j`).
    pub fn local_len(&self, j: usize) -> usize {
        self.segments
            .iter()
            .map(|s| s.lens.get(j).copied().unwrap_or(0) * s.repeats)
            .sum()
    }

    /// `L_j` for every device.
    pub fn local_lens(&self) -> Vec<usize> {
        (0..self.n_devices().unwrap_or(0))
            .map(|j| self.local_len(j))
            .collect()
    }

    /// The tensor's length along the split axis (0 for non-axis kinds).
    pub fn total_len(&self) -> usize {
        self.segments.iter().map(|s| s.period() * s.repeats).sum()
    }

    /// Equality as propagation uses it: same kind (and axis) and the same `L_j` for every device;
    /// the segment layout is ignored.
    pub fn equivalent(&self, other: &SplitState) -> bool {
        self.kind == other.kind && self.local_lens() == other.local_lens()
    }

    /// The same distribution moved to another axis (segments kept).
    pub fn with_axis(&self, axis: usize) -> SplitState {
        match self.kind {
            SplitKind::Axis(_) => SplitState {
                kind: SplitKind::Axis(axis),
                segments: self.segments.clone(),
            },
            _ => self.clone(),
        }
    }

    /// Device `j`'s pieces as `(global_start, len)` along the split axis, in local order (the
    /// order of the device's slice). The global order is: for each segment, for each repeat, for
    /// each device. Zero-length pieces are omitted.
    pub fn pieces(&self, j: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut cursor = 0;
        for seg in &self.segments {
            for _ in 0..seg.repeats {
                for (k, &len) in seg.lens.iter().enumerate() {
                    if k == j && len > 0 {
                        out.push((cursor, len));
                    }
                    cursor += len;
                }
            }
        }
        out
    }
}

impl fmt::Display for SplitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            SplitKind::Mirrored => f.write_str("M"),
            SplitKind::Partial => f.write_str("P"),
            SplitKind::Routed => {
                let lens: Vec<String> = self.local_lens().iter().map(|l| l.to_string()).collect();
                write!(f, "R({})", lens.join(","))
            }
            SplitKind::Axis(a) => {
                write!(f, "A{a}(")?;
                for (s, seg) in self.segments.iter().enumerate() {
                    if s > 0 {
                        f.write_str(" | ")?;
                    }
                    let lens: Vec<String> = seg.lens.iter().map(|l| l.to_string()).collect();
                    f.write_str(&lens.join(","))?;
                    if seg.repeats > 1 {
                        write!(f, " x{}", seg.repeats)?;
                    }
                }
                f.write_str(")")
            }
        }
    }
}

fn tname(desc: &TensorDesc) -> String {
    if desc.name().is_empty() {
        "<unnamed>".into()
    } else {
        format!("'{}'", desc.name())
    }
}

fn invalid(desc: &TensorDesc, why: impl fmt::Display) -> Error {
    Error::InvalidArgument(format!("tensor {}: {why}", tname(desc)))
}

/// Bytes of a densely packed tensor of this dtype and shape.
fn dense_bytes(dtype: DType, ne: [usize; MAX_DIMS]) -> usize {
    ne[0] / dtype.block_size() * dtype.type_size() * ne[1] * ne[2] * ne[3]
}

/// Checks `state` against `desc` (axis length, block alignment on axis 0) and returns the axis.
fn check_axis_state(desc: &TensorDesc, state: &SplitState, a: usize) -> Result<()> {
    if !desc.is_contiguous() {
        return Err(invalid(desc, format!("{state} needs a contiguous tensor")));
    }
    if state.total_len() != desc.ne()[a] {
        return Err(invalid(
            desc,
            format!(
                "{state} covers {} elements, axis {a} has {}",
                state.total_len(),
                desc.ne()[a]
            ),
        ));
    }
    let blk = desc.dtype().block_size();
    if a == 0 && blk > 1 {
        for seg in state.segments() {
            if let Some(l) = seg.lens.iter().find(|&&l| l % blk != 0) {
                return Err(invalid(
                    desc,
                    format!(
                        "{state}: piece of {l} elements splits a {} block of {blk}",
                        desc.dtype()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The per-device slice layout `(ne, nb)` of device `j` for a contiguous tensor: `ne[axis] = L_j`
/// and contiguous strides (every stride above the axis scaled). Mirrored and partial slices are
/// the full tensor.
///
/// # Errors
/// [`Error::InvalidArgument`] if the tensor is not contiguous, the state does not fit it, `j` is
/// not a device of the state, or an axis-0 piece of a quantized tensor is not whole blocks.
pub fn slice_desc(
    desc: &TensorDesc,
    state: &SplitState,
    j: usize,
) -> Result<([usize; MAX_DIMS], [usize; MAX_DIMS])> {
    let a = match state.kind() {
        SplitKind::Axis(a) => a,
        SplitKind::Mirrored | SplitKind::Partial | SplitKind::Routed => {
            return Ok((desc.ne(), desc.nb()));
        }
    };
    check_axis_state(desc, state, a)?;
    let n = state.n_devices().unwrap_or(0);
    if j >= n {
        return Err(invalid(
            desc,
            format!("device {j} of {state} ({n} devices)"),
        ));
    }
    let mut ne = desc.ne();
    ne[a] = state.local_len(j);
    Ok((ne, contiguous_strides(desc.dtype(), ne)))
}

/// Byte geometry of an axis split of a contiguous tensor: bytes per `x` indices along the axis,
/// bytes of one full chunk (all of the axis and below), and the outer repetition count.
struct Geometry {
    axis: usize,
    dtype: DType,
    nb_axis: usize,
    chunk: usize,
    outer: usize,
}

impl Geometry {
    fn new(desc: &TensorDesc, a: usize) -> Geometry {
        let ne = desc.ne();
        let nb = contiguous_strides(desc.dtype(), ne);
        let mut g = Geometry {
            axis: a,
            dtype: desc.dtype(),
            nb_axis: nb[a],
            chunk: 0,
            outer: ne[a + 1..].iter().product(),
        };
        g.chunk = g.bytes(ne[a]);
        g
    }

    fn bytes(&self, x: usize) -> usize {
        if self.axis == 0 {
            x / self.dtype.block_size() * self.dtype.type_size()
        } else {
            x * self.nb_axis
        }
    }

    /// Device `j`'s pieces as byte ranges within one chunk.
    fn ranges(&self, state: &SplitState, j: usize) -> Vec<(usize, usize)> {
        state
            .pieces(j)
            .into_iter()
            .map(|(s, l)| (self.bytes(s), self.bytes(l)))
            .collect()
    }
}

fn check_len(desc: &TensorDesc, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::SizeMismatch {
            tensor: tname(desc),
            got,
            expected,
        })
    }
}

/// Splits the full contents of a contiguous tensor into `n` per-device slices.
///
/// Mirrored: every device gets a copy. Partial (F32 only): device 0 gets the value and the others
/// `-0.0`, the additive identity, so a [`gather`] sum gives back the exact bytes (upstream divides
/// by N, which is inexact for N ≥ 3). Axis states: each device gets its pieces, in local order.
///
/// # Errors
/// [`Error::SizeMismatch`] if `full` is not the tensor's size; [`Error::InvalidArgument`] for a
/// state that does not fit the tensor, `n` different from the state's device count, or a
/// non-F32 partial tensor.
pub fn scatter(
    desc: &TensorDesc,
    state: &SplitState,
    n: usize,
    full: &[u8],
) -> Result<Vec<Vec<u8>>> {
    if n == 0 {
        return Err(invalid(desc, "scatter over 0 devices"));
    }
    check_len(desc, full.len(), dense_bytes(desc.dtype(), desc.ne()))?;
    let a = match state.kind() {
        SplitKind::Mirrored => return Ok(vec![full.to_vec(); n]),
        SplitKind::Partial => {
            if desc.dtype() != DType::F32 {
                return Err(invalid(desc, format!("P needs F32, not {}", desc.dtype())));
            }
            let zeros: Vec<u8> = std::iter::repeat_n((-0.0f32).to_le_bytes(), full.len() / 4)
                .flatten()
                .collect();
            let mut out = vec![full.to_vec()];
            out.resize(n, zeros);
            return Ok(out);
        }
        SplitKind::Routed => {
            return Err(invalid(desc, format!("{state} is a compute state only")));
        }
        SplitKind::Axis(a) => a,
    };
    if state.n_devices() != Some(n) {
        return Err(invalid(desc, format!("{state} scattered over {n} devices")));
    }
    check_axis_state(desc, state, a)?;
    let geo = Geometry::new(desc, a);
    let mut out = Vec::with_capacity(n);
    for j in 0..n {
        let ranges = geo.ranges(state, j);
        let mut dev = Vec::with_capacity(geo.bytes(state.local_len(j)) * geo.outer);
        for o in 0..geo.outer {
            let base = o * geo.chunk;
            for &(s, l) in &ranges {
                dev.extend_from_slice(&full[base + s..base + s + l]);
            }
        }
        out.push(dev);
    }
    Ok(out)
}

/// Reassembles the full contents of a contiguous tensor from its per-device slices.
///
/// Mirrored: device 0's copy. Partial (F32 only): the element-wise sum in device order. Axis
/// states: every device's pieces put back in place.
///
/// # Errors
/// [`Error::SizeMismatch`] if a slice has the wrong size; [`Error::InvalidArgument`] for a state
/// that does not fit the tensor, a slice count different from the state's device count, or a
/// non-F32 partial tensor.
pub fn gather(desc: &TensorDesc, state: &SplitState, parts: &[Vec<u8>]) -> Result<Vec<u8>> {
    let total = dense_bytes(desc.dtype(), desc.ne());
    if parts.is_empty() {
        return Err(invalid(desc, "gather from 0 devices"));
    }
    let a = match state.kind() {
        SplitKind::Mirrored => {
            check_len(desc, parts[0].len(), total)?;
            return Ok(parts[0].clone());
        }
        SplitKind::Partial => {
            if desc.dtype() != DType::F32 {
                return Err(invalid(desc, format!("P needs F32, not {}", desc.dtype())));
            }
            for p in parts {
                check_len(desc, p.len(), total)?;
            }
            let mut acc: Vec<f32> = parts[0]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            for p in &parts[1..] {
                for (x, c) in acc.iter_mut().zip(p.chunks_exact(4)) {
                    *x += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            return Ok(acc.iter().flat_map(|x| x.to_le_bytes()).collect());
        }
        SplitKind::Routed => {
            return Err(invalid(
                desc,
                format!(
                    "{state}: each column is valid on one device only; read the sum after the down MUL_MAT_ID"
                ),
            ));
        }
        SplitKind::Axis(a) => a,
    };
    if state.n_devices() != Some(parts.len()) {
        return Err(invalid(
            desc,
            format!("{state} gathered from {} devices", parts.len()),
        ));
    }
    check_axis_state(desc, state, a)?;
    let geo = Geometry::new(desc, a);
    let mut full = vec![0u8; total];
    for (j, part) in parts.iter().enumerate() {
        check_len(desc, part.len(), geo.bytes(state.local_len(j)) * geo.outer)?;
        let ranges = geo.ranges(state, j);
        let mut cur = 0;
        for o in 0..geo.outer {
            let base = o * geo.chunk;
            for &(s, l) in &ranges {
                full[base + s..base + s + l].copy_from_slice(&part[cur..cur + l]);
                cur += l;
            }
        }
    }
    Ok(full)
}

/// Device `j`'s share of the byte range `start..start + len` of a contiguous axis-split tensor:
/// the local byte offset where that share begins, and the global byte runs `(offset, len)` it is
/// made of, in local order. Device `j`'s bytes of any global range are one contiguous local
/// range, because a device's slice keeps the global order of its pieces.
///
/// # Errors
/// [`Error::InvalidArgument`] for a non-axis state or one that does not fit the tensor;
/// [`Error::OutOfBounds`] for a range outside the tensor.
pub fn local_runs(
    desc: &TensorDesc,
    state: &SplitState,
    j: usize,
    start: usize,
    len: usize,
) -> Result<(usize, Vec<(usize, usize)>)> {
    let SplitKind::Axis(a) = state.kind() else {
        return Err(invalid(desc, format!("{state} has no per-device runs")));
    };
    check_axis_state(desc, state, a)?;
    let total = dense_bytes(desc.dtype(), desc.ne());
    crate::error::check_range(&format!("tensor {}", tname(desc)), start, len, total)?;
    let geo = Geometry::new(desc, a);
    let ranges = geo.ranges(state, j);
    let local_chunk = geo.bytes(state.local_len(j));
    let end = start + len;
    let mut runs = Vec::new();
    let mut local_lo = None;
    if len == 0 || geo.chunk == 0 {
        return Ok((0, runs));
    }
    for o in start / geo.chunk..end.div_ceil(geo.chunk) {
        let mut cur = o * local_chunk;
        for &(s, l) in &ranges {
            let (gs, ge) = (o * geo.chunk + s, o * geo.chunk + s + l);
            let (lo, hi) = (gs.max(start), ge.min(end));
            if lo < hi {
                local_lo.get_or_insert(cur + (lo - gs));
                runs.push((lo, hi - lo));
            }
            cur += l;
        }
    }
    // A range holding none of the device's bytes starts where its next piece would.
    let local_lo = local_lo.unwrap_or_else(|| {
        let o = start / geo.chunk;
        let within = start - o * geo.chunk;
        let before: usize = ranges
            .iter()
            .map(|&(s, l)| within.saturating_sub(s).min(l))
            .sum();
        o * local_chunk + before
    });
    Ok((local_lo, runs))
}
