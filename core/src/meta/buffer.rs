//! Meta buffers: one buffer per device holding only that device's slices, behind a virtual
//! address space in which every tensor has its full size (so `Bindings` and `TensorBuffer` work
//! unchanged). Reads and writes of a tensor range are split, gathered, summed or mirrored
//! according to the tensor's split state.

use super::inner::MetaInner;
use super::split::{SplitKind, SplitState, local_runs, slice_desc};
use crate::backend::{Buffer, BufferType};
use crate::dtype::DType;
use crate::error::{Error, Result, check_range};
use crate::tensor::{TensorDesc, dense_bytes};
use std::any::Any;
use std::sync::Arc;

/// The buffer type of a [`super::MetaDevice`]: tensors are laid out in a virtual space at their
/// full size; each device allocates only its slices.
#[derive(Clone, Debug)]
pub struct MetaBufferType {
    inner: Arc<MetaInner>,
    /// Parts come from the devices' weight buffer types ([`crate::Device::weight_buffer_type`]).
    weights: bool,
    /// (copy, original) tensor names: the copy holds the original's values (see
    /// [`MetaBufferType::with_copies`]).
    copies: Vec<(String, String)>,
}

impl MetaBufferType {
    pub(crate) fn new(inner: Arc<MetaInner>) -> MetaBufferType {
        MetaBufferType {
            inner,
            weights: false,
            copies: Vec::new(),
        }
    }
    pub(crate) fn weights(inner: Arc<MetaInner>) -> MetaBufferType {
        MetaBufferType {
            inner,
            weights: true,
            copies: Vec::new(),
        }
    }

    /// This weight buffer type, told that each `(copy, original)` pair of tensor names holds
    /// the same values (a tied output projection untied so that it can split over the
    /// vocabulary while the embedding stays whole for GET_ROWS). Where the original is kept
    /// once for all devices (mirrored, every device reading device 0's memory) and the copy
    /// splits along its rows at multiples of [`COPY_ROW_ALIGN`], each device's slice of the copy
    /// is a window into the original's memory instead of memory of its own. Such a copy is
    /// read-only in this buffer: write the original.
    pub fn with_copies(mut self, copies: &[(&str, &str)]) -> MetaBufferType {
        self.copies = copies
            .iter()
            .map(|(c, o)| (c.to_string(), o.to_string()))
            .collect();
        self
    }
    pub(crate) fn inner(&self) -> &Arc<MetaInner> {
        &self.inner
    }
}

/// Rows at which a copy's slices must start to be windows into its original (so that devices
/// storing rows in groups, as the CPU's packed weights do, find whole groups).
pub const COPY_ROW_ALIGN: usize = 16;

/// Where one tensor of a meta buffer lives.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Offset in the virtual space.
    pub offset: usize,
    /// The tensor (contiguous) as allocated.
    pub desc: TensorDesc,
    /// Its split state.
    pub state: SplitState,
    /// Per device: byte offset of its slice in that device's buffer.
    pub local_offset: Vec<usize>,
    /// Per device: bytes of its slice.
    pub local_bytes: Vec<usize>,
    /// Per device: the part (device index) whose buffer holds its slice. Its own, except for a
    /// MIRRORED weight every device can read from device 0's memory: then one copy serves all.
    pub home: Vec<usize>,
    /// The name of the tensor whose memory this tensor's slices are windows into
    /// ([`MetaBufferType::with_copies`]); such a tensor is not written.
    pub window_of: Option<String>,
}

impl Placement {
    fn virtual_bytes(&self) -> usize {
        self.desc.nbytes()
    }

    /// What [`Buffer::spreads`] reports of it: bytes in each device's own memory (none where a
    /// device reads another's copy or it is a window).
    fn spread(&self) -> crate::backend::Spread {
        crate::backend::Spread {
            tensor: self.desc.name().to_string(),
            offset: self.offset,
            held: (0..self.local_bytes.len())
                .map(|j| {
                    let own = self.home.get(j) == Some(&j) && self.window_of.is_none();
                    if own { self.local_bytes[j] } else { 0 }
                })
                .collect(),
            mirrored: self.state.is_mirrored(),
            window_of: self.window_of.clone(),
        }
    }
}

fn name_of(desc: &TensorDesc) -> String {
    if desc.name().is_empty() {
        "<unnamed>".into()
    } else {
        format!("'{}'", desc.name())
    }
}

impl BufferType for MetaBufferType {
    fn name(&self) -> &str {
        &self.inner.name
    }
    fn alignment(&self) -> usize {
        self.inner
            .devices
            .iter()
            .map(|d| d.buffer_type().alignment())
            .max()
            .unwrap_or(1)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        if size == 0 {
            return self.alloc_placed(0, &[]);
        }
        Err(Error::InvalidArgument(format!(
            "{} splits each tensor across its devices, so it cannot allocate {size} untyped \
             bytes: allocate tensors with alloc_tensors",
            self.inner.name
        )))
    }
    fn alloc_placed(
        &self,
        size: usize,
        tensors: &[(usize, &TensorDesc)],
    ) -> Result<Arc<dyn Buffer>> {
        let n = self.inner.devices.len();
        let mut totals = vec![0usize; n];
        let mut placements = Vec::with_capacity(tensors.len());
        let aligns: Vec<usize> = self
            .inner
            .devices
            .iter()
            .map(|d| d.buffer_type().alignment().max(1))
            .collect();
        // Weights are only read (the contract of weight buffers): a mirrored one needs a single
        // copy when every device of this process can use its first device's weight memory in
        // place (CPU devices of one process). Devices of other ranks hold nothing here.
        let local = self.inner.local_range();
        let home0 = local.start;
        let first = self.inner.devices[home0].weight_buffer_type();
        let can_share = self.weights
            && self.inner.devices[local.start + 1..local.end]
                .iter()
                .all(|d| d.supports_buffer_type(first.as_ref()));
        for &(offset, desc) in tensors {
            check_range(
                &format!("tensor {} in {}", name_of(desc), self.inner.name),
                offset,
                desc.nbytes(),
                size,
            )?;
            let state = self.inner.policy.split_state(desc, &self.inner.layout)?;
            if let Some(k) = state.n_devices()
                && k != n
            {
                return Err(Error::InvalidArgument(format!(
                    "tensor {}: split state {state} has {k} devices, {} has {n}",
                    name_of(desc),
                    self.inner.name
                )));
            }
            if state.kind() == SplitKind::Routed {
                return Err(Error::InvalidArgument(format!(
                    "tensor {}: {state} is a compute state, a stored tensor cannot have it",
                    name_of(desc)
                )));
            }
            if state.is_partial() && desc.dtype() != DType::F32 {
                return Err(Error::InvalidArgument(format!(
                    "tensor {}: a PARTIAL tensor must be F32, not {}",
                    name_of(desc),
                    desc.dtype()
                )));
            }
            if let Some(p) = self.window(desc, &state, offset, &placements)? {
                placements.push(p);
                continue;
            }
            let mut local_offset = Vec::with_capacity(n);
            let mut local_bytes = Vec::with_capacity(n);
            let shared = can_share && state.is_mirrored();
            let mut home = Vec::with_capacity(n);
            for j in 0..n {
                if shared && j > home0 && local.contains(&j) {
                    home.push(home0);
                    local_offset.push(local_offset[home0]);
                    local_bytes.push(local_bytes[home0]);
                    continue;
                }
                home.push(j);
                let (ne, _) = slice_desc(desc, &state, j)?;
                let bytes = match state.kind() {
                    SplitKind::Axis(_) => dense_bytes(desc.dtype(), ne).unwrap_or(usize::MAX),
                    _ => desc.nbytes(),
                };
                let at = totals[j].div_ceil(aligns[j]) * aligns[j];
                totals[j] = at.checked_add(bytes).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "slice sizes overflow at tensor {}",
                        name_of(desc)
                    ))
                })?;
                local_offset.push(at);
                local_bytes.push(bytes);
            }
            placements.push(Placement {
                offset,
                desc: desc.clone(),
                state,
                local_offset,
                local_bytes,
                home,
                window_of: None,
            });
        }
        placements.sort_by_key(|p| p.offset);
        let parts = self
            .inner
            .devices
            .iter()
            .zip(&totals)
            .map(|(d, &bytes)| {
                let buft = if self.weights {
                    d.weight_buffer_type()
                } else {
                    d.buffer_type()
                };
                buft.alloc(bytes)
            })
            .collect::<Result<Vec<_>>>()?;
        tracing::debug!(
            device = %self.inner.name,
            tensors = placements.len(),
            per_device = ?totals,
            "meta buffer"
        );
        Ok(Arc::new(MetaBuffer {
            inner: self.inner.clone(),
            size,
            parts,
            placements,
        }))
    }
    fn with_copies(&self, copies: &[(&str, &str)]) -> Option<Arc<dyn BufferType>> {
        self.weights
            .then(|| Arc::new(self.clone().with_copies(copies)) as Arc<dyn BufferType>)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl MetaBufferType {
    /// The placement of `desc` as windows into its original's single copy, if it is a declared
    /// copy whose original was placed (earlier) once for all devices and whose row slices
    /// start at multiples of [`COPY_ROW_ALIGN`].
    fn window(
        &self,
        desc: &TensorDesc,
        state: &SplitState,
        offset: usize,
        placed: &[Placement],
    ) -> Result<Option<Placement>> {
        let Some((_, original)) = self.copies.iter().find(|(c, _)| c == desc.name()) else {
            return Ok(None);
        };
        let Some(orig) = placed.iter().find(|p| p.desc.name() == original) else {
            return Ok(None);
        };
        let n = self.inner.devices.len();
        let local = self.inner.local_range();
        let home0 = local.start;
        let single = local.clone().all(|j| orig.home[j] == home0) && n > 1;
        let same = orig.desc.dtype() == desc.dtype()
            && orig.desc.ne() == desc.ne()
            && desc.is_contiguous()
            && desc.ne()[2] == 1
            && desc.ne()[3] == 1;
        if !single || !same || state.kind() != SplitKind::Axis(1) {
            return Ok(None);
        }
        let row = desc.row_bytes();
        let (mut start, mut local_offset, mut local_bytes) = (0usize, Vec::new(), Vec::new());
        for j in 0..n {
            if !start.is_multiple_of(COPY_ROW_ALIGN) {
                return Ok(None);
            }
            let (ne, _) = slice_desc(desc, state, j)?;
            local_offset.push(orig.local_offset[home0] + start * row);
            local_bytes.push(ne[1] * row);
            start += ne[1];
        }
        Ok(Some(Placement {
            offset,
            desc: desc.clone(),
            state: state.clone(),
            local_offset,
            local_bytes,
            home: (0..n)
                .map(|j| if local.contains(&j) { home0 } else { j })
                .collect(),
            window_of: Some(original.clone()),
        }))
    }
}

/// A buffer of a [`super::MetaDevice`]: one buffer per device and the placement of each tensor.
#[derive(Debug)]
pub struct MetaBuffer {
    inner: Arc<MetaInner>,
    size: usize,
    parts: Vec<Arc<dyn Buffer>>,
    placements: Vec<Placement>,
}

impl MetaBuffer {
    pub(crate) fn inner(&self) -> &Arc<MetaInner> {
        &self.inner
    }

    /// The per-device buffers, in device order.
    pub fn parts(&self) -> &[Arc<dyn Buffer>] {
        &self.parts
    }

    /// Bytes each device holds.
    pub fn device_bytes(&self) -> Vec<usize> {
        self.parts.iter().map(|p| p.size()).collect()
    }

    /// Every tensor placed here, by virtual offset.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// The tensor placed exactly at virtual `offset`.
    pub fn placement_at(&self, offset: usize) -> Option<&Placement> {
        self.placements
            .binary_search_by_key(&offset, |p| p.offset)
            .ok()
            .map(|i| &self.placements[i])
    }

    /// The placement holding `offset..offset + len` whole, and the offset within it.
    fn locate(&self, offset: usize, len: usize) -> Result<(&Placement, usize)> {
        check_range(&self.name(), offset, len, self.size)?;
        let i = self.placements.partition_point(|p| p.offset <= offset);
        let found = i
            .checked_sub(1)
            .map(|i| &self.placements[i])
            .filter(|p| offset + len <= p.offset + p.virtual_bytes().max(1));
        match found {
            Some(p) => Ok((p, offset - p.offset)),
            None => Err(Error::InvalidArgument(format!(
                "{}: bytes {offset}..{} are not inside one tensor (a meta buffer splits each \
                 tensor separately)",
                self.name(),
                offset + len
            ))),
        }
    }

    /// A copy placed as windows into its original is read-only here.
    fn check_writable(p: &Placement) -> Result<()> {
        match &p.window_of {
            Some(orig) => Err(Error::ReadOnly(format!(
                "tensor {} shares the memory of '{orig}' in this buffer: write '{orig}'",
                name_of(&p.desc)
            ))),
            None => Ok(()),
        }
    }

    fn check_partial(p: &Placement, rel: usize, len: usize) -> Result<()> {
        if !rel.is_multiple_of(4) || !len.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "tensor {}: PARTIAL data is accessed in whole f32 values, not bytes {rel}..{}",
                name_of(&p.desc),
                rel + len
            )));
        }
        Ok(())
    }
}

impl Buffer for MetaBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        format!("{} buffer", self.inner.name)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let (p, rel) = self.locate(offset, src.len())?;
        Self::check_writable(p)?;
        match p.state.kind() {
            SplitKind::Mirrored => {
                for (j, part) in self.parts.iter().enumerate() {
                    if p.home[j] == j {
                        part.write(p.local_offset[j] + rel, src)?;
                    }
                }
            }
            SplitKind::Partial => {
                // Device 0 holds the value and the others the additive identity: exact for any N
                // (dividing by N is not).
                Self::check_partial(p, rel, src.len())?;
                let zeros: Vec<u8> = std::iter::repeat_n((-0.0f32).to_le_bytes(), src.len() / 4)
                    .flatten()
                    .collect();
                for (j, part) in self.parts.iter().enumerate() {
                    let data = if j == 0 { src } else { &zeros };
                    part.write(p.local_offset[j] + rel, data)?;
                }
            }
            SplitKind::Routed => return Err(routed_storage(p)),
            SplitKind::Axis(_) => {
                for (j, part) in self.parts.iter().enumerate() {
                    let (lo, runs) = local_runs(&p.desc, &p.state, j, rel, src.len())?;
                    if runs.is_empty() {
                        continue;
                    }
                    let mut bytes = Vec::with_capacity(runs.iter().map(|r| r.1).sum());
                    for (g, l) in runs {
                        bytes.extend_from_slice(&src[g - rel..g - rel + l]);
                    }
                    part.write(p.local_offset[j] + lo, &bytes)?;
                }
            }
        }
        Ok(())
    }
    fn set_tensor(&self, t: &TensorDesc, offset: usize, src: &[u8]) -> Result<()> {
        let (p, rel) = self.locate(offset, src.len())?;
        Self::check_writable(p)?;
        // Whole rows of a mirrored tensor (a loader's piece): the same rows on every device
        // that stores a copy, as a tensor of their own.
        let row = p.desc.row_bytes();
        if p.state.is_mirrored()
            && row > 0
            && t.dtype() == p.desc.dtype()
            && t.ne()[0] == p.desc.ne()[0]
            && rel.is_multiple_of(row)
            && src.len() == t.nbytes()
            && (rel != 0 || src.len() != p.desc.nbytes())
        {
            for (j, part) in self.parts.iter().enumerate() {
                if p.home[j] == j {
                    part.set_tensor(t, p.local_offset[j] + rel, src)?;
                }
            }
            return Ok(());
        }
        if rel != 0 || src.len() != p.desc.nbytes() || p.desc.dtype() != t.dtype() {
            return self.write(offset, src);
        }
        // Each device gets its slice as a whole tensor of its own shape, so its buffer may keep
        // it in its weight layout.
        match p.state.kind() {
            SplitKind::Mirrored => {
                for (j, part) in self.parts.iter().enumerate() {
                    if p.home[j] == j {
                        part.set_tensor(&p.desc, p.local_offset[j], src)?;
                    }
                }
            }
            SplitKind::Partial => return self.write(offset, src),
            SplitKind::Routed => return Err(routed_storage(p)),
            SplitKind::Axis(_) => {
                for (j, part) in self.parts.iter().enumerate() {
                    let (lo, runs) = local_runs(&p.desc, &p.state, j, 0, src.len())?;
                    if runs.is_empty() {
                        continue;
                    }
                    let mut bytes = Vec::with_capacity(runs.iter().map(|r| r.1).sum());
                    for (g, l) in runs {
                        bytes.extend_from_slice(&src[g..g + l]);
                    }
                    let (ne, nb) = slice_desc(&p.desc, &p.state, j)?;
                    let mut local = p.desc.clone();
                    (local.ne, local.nb) = (ne, nb);
                    part.set_tensor(&local, p.local_offset[j] + lo, &bytes)?;
                }
            }
        }
        Ok(())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let (p, rel) = self.locate(offset, dst.len())?;
        match p.state.kind() {
            SplitKind::Mirrored => {
                let j = self.inner.local_range().start;
                self.parts[j].read(p.local_offset[j] + rel, dst)?
            }
            SplitKind::Partial => {
                Self::check_partial(p, rel, dst.len())?;
                let mut acc = vec![0f32; dst.len() / 4];
                let mut tmp = vec![0u8; dst.len()];
                for (j, part) in self.parts.iter().enumerate() {
                    part.read(p.local_offset[j] + rel, &mut tmp)?;
                    for (a, c) in acc.iter_mut().zip(tmp.chunks_exact(4)) {
                        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        *a = if j == 0 { v } else { *a + v };
                    }
                }
                for (d, a) in dst.chunks_exact_mut(4).zip(acc) {
                    d.copy_from_slice(&a.to_le_bytes());
                }
            }
            SplitKind::Routed => return Err(routed_storage(p)),
            SplitKind::Axis(_) => {
                for (j, part) in self.parts.iter().enumerate() {
                    let (lo, runs) = local_runs(&p.desc, &p.state, j, rel, dst.len())?;
                    if runs.is_empty() {
                        continue;
                    }
                    let mut bytes = vec![0u8; runs.iter().map(|r| r.1).sum()];
                    part.read(p.local_offset[j] + lo, &mut bytes)?;
                    let mut cur = 0;
                    for (g, l) in runs {
                        dst[g - rel..g - rel + l].copy_from_slice(&bytes[cur..cur + l]);
                        cur += l;
                    }
                }
            }
        }
        Ok(())
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (p, rel) = self.locate(offset, len)?;
        Self::check_writable(p)?;
        match p.state.kind() {
            SplitKind::Mirrored => {
                for (j, part) in self.parts.iter().enumerate() {
                    if p.home[j] == j {
                        part.memset(p.local_offset[j] + rel, len, value)?;
                    }
                }
            }
            SplitKind::Partial => {
                // The value on device 0 and zeros elsewhere keeps the sum equal to the memset.
                Self::check_partial(p, rel, len)?;
                for (j, part) in self.parts.iter().enumerate() {
                    let v = if j == 0 { value } else { 0 };
                    part.memset(p.local_offset[j] + rel, len, v)?;
                }
            }
            SplitKind::Routed => return Err(routed_storage(p)),
            SplitKind::Axis(_) => {
                for (j, part) in self.parts.iter().enumerate() {
                    let (lo, runs) = local_runs(&p.desc, &p.state, j, rel, len)?;
                    let bytes: usize = runs.iter().map(|r| r.1).sum();
                    if bytes > 0 {
                        part.memset(p.local_offset[j] + lo, bytes, value)?;
                    }
                }
            }
        }
        Ok(())
    }
    fn device_bytes(&self) -> Vec<usize> {
        MetaBuffer::device_bytes(self)
    }
    fn spreads(&self) -> Vec<crate::backend::Spread> {
        self.placements.iter().map(Placement::spread).collect()
    }
    fn spread_at(&self, offset: usize) -> Option<crate::backend::Spread> {
        self.placement_at(offset).map(Placement::spread)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A placement never holds [`SplitKind::Routed`] (refused when placed); kept as an error for
/// completeness of the matches.
fn routed_storage(p: &Placement) -> Error {
    Error::InvalidArgument(format!(
        "tensor {}: {} is a compute state, not stored",
        name_of(&p.desc),
        p.state
    ))
}
