use super::{Buffer, BufferType};
use crate::dtype::DType;
use crate::error::{Error, Result, check_range};
use crate::graph::{Context, Graph, label_of};
use crate::tensor::{TensorDesc, TensorId};
use std::sync::Arc;

/// Where a tensor's bytes live.
#[derive(Clone, Debug)]
pub struct Slot {
    /// The buffer.
    pub buffer: Arc<dyn Buffer>,
    /// Byte offset of the tensor's first element.
    pub offset: usize,
}

/// Storage of tensors: tensor id → buffer and offset. Views need no entry: they resolve through
/// the tensor they view.
#[derive(Clone, Debug, Default)]
pub struct Bindings {
    slots: Vec<Option<Slot>>,
}

impl Bindings {
    /// No tensor bound.
    pub fn new() -> Bindings {
        Bindings::default()
    }

    /// Places tensor `id` at `offset` of `buffer` (replacing an earlier placement).
    pub fn bind(&mut self, id: TensorId, buffer: Arc<dyn Buffer>, offset: usize) {
        if self.slots.len() <= id.index() {
            self.slots.resize(id.index() + 1, None);
        }
        self.slots[id.index()] = Some(Slot { buffer, offset });
    }

    /// The direct placement of `id`, if any (views have none).
    pub fn slot(&self, id: TensorId) -> Option<&Slot> {
        self.slots.get(id.index()).and_then(Option::as_ref)
    }

    /// Adds every placement of `other`; `other` wins where both place a tensor.
    pub fn extend(&mut self, other: &Bindings) {
        for (i, s) in other.slots.iter().enumerate() {
            if let Some(s) = s {
                self.bind(TensorId::from_index(i), s.buffer.clone(), s.offset);
            }
        }
    }

    /// Buffer and byte offset of `id`'s first element, following views to their base.
    ///
    /// # Errors
    /// [`Error::NotAllocated`] naming the tensor when neither it nor a tensor it views is bound.
    pub fn resolve(
        &self,
        tensors: &[TensorDesc],
        id: TensorId,
    ) -> Result<(Arc<dyn Buffer>, usize)> {
        let mut cur = id;
        let mut offset = 0usize;
        // Views chain to a bound base; the chain is acyclic because views only point backwards.
        loop {
            if let Some(s) = self.slot(cur) {
                return Ok((s.buffer.clone(), s.offset + offset));
            }
            match tensors.get(cur.index()).and_then(|t| t.view) {
                Some(v) => {
                    offset += v.offset;
                    cur = v.src;
                }
                None => {
                    return Err(Error::NotAllocated {
                        tensor: label_of(tensors, id),
                    });
                }
            }
        }
    }

    /// Checks that every tensor `graph` touches is bound and fits inside its buffer.
    ///
    /// # Errors
    /// [`Error::NotAllocated`] or [`Error::OutOfBounds`] naming the first offending tensor.
    pub fn check_graph(&self, graph: &Graph) -> Result<()> {
        let tensors = graph.tensors();
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            let (buf, off) = self.resolve(tensors, id)?;
            let t = &tensors[id.index()];
            check_range(
                &format!("tensor {} in {}", label_of(tensors, id), buf.name()),
                off,
                t.nbytes(),
                buf.size(),
            )?;
        }
        Ok(())
    }

    /// Writes `data` at byte `offset` within tensor `id`; the range must be contiguous in memory,
    /// which holds for contiguous tensors and views.
    ///
    /// # Errors
    /// [`Error::NotAllocated`], [`Error::OutOfBounds`], and the buffer's write errors.
    pub fn write(
        &self,
        tensors: &[TensorDesc],
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        let (buf, base) = self.locate(tensors, id, offset, data.len())?;
        let t = &tensors[id.index()];
        // A whole tensor goes through `set_tensor`, which may store it in the device's layout.
        if offset == 0 && data.len() == t.nbytes() && t.view_of().is_none() {
            buf.set_tensor(t, base, data)
        } else {
            buf.write(base + offset, data)
        }
    }

    /// Reads bytes at `offset` within tensor `id` into `out` (the mirror of [`Bindings::write`]).
    ///
    /// # Errors
    /// As [`Bindings::write`].
    pub fn read(
        &self,
        tensors: &[TensorDesc],
        id: TensorId,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let (buf, base) = self.locate(tensors, id, offset, out.len())?;
        buf.read(base + offset, out)
    }

    fn locate(
        &self,
        tensors: &[TensorDesc],
        id: TensorId,
        offset: usize,
        len: usize,
    ) -> Result<(Arc<dyn Buffer>, usize)> {
        let t = tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: tensors.len(),
        })?;
        if !t.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "tensor {} is not contiguous: copy it with cont() before reading or writing it as bytes",
                label_of(tensors, id)
            )));
        }
        check_range(
            &format!("tensor {}", label_of(tensors, id)),
            offset,
            len,
            t.nbytes(),
        )?;
        self.resolve(tensors, id)
    }
}

/// One buffer holding a set of a context's tensors, with typed set/get by tensor id.
#[derive(Clone, Debug)]
pub struct TensorBuffer {
    buffer: Arc<dyn Buffer>,
    bindings: Bindings,
    tensors: Arc<[TensorDesc]>,
}

impl TensorBuffer {
    /// The underlying buffer.
    pub fn buffer(&self) -> &Arc<dyn Buffer> {
        &self.buffer
    }
    /// The placements, to pass to [`crate::Backend::compute`] (or merge with others).
    pub fn bindings(&self) -> &Bindings {
        &self.bindings
    }
    /// The description of tensor `id` of the context the buffer was allocated for.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`] for an id outside that context.
    pub fn desc(&self, id: TensorId) -> Result<&TensorDesc> {
        self.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: self.tensors.len(),
        })
    }
    /// Whether `id` (or the tensor it views) lives in this buffer.
    pub fn contains(&self, id: TensorId) -> bool {
        self.bindings.resolve(&self.tensors, id).is_ok()
    }
    fn expect_len(&self, id: TensorId, got: usize) -> Result<()> {
        let t = self.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: self.tensors.len(),
        })?;
        if got != t.nbytes() {
            return Err(Error::SizeMismatch {
                tensor: label_of(&self.tensors, id),
                got,
                expected: t.nbytes(),
            });
        }
        Ok(())
    }
    fn expect_dtype(&self, id: TensorId, want: DType) -> Result<()> {
        let t = self.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: self.tensors.len(),
        })?;
        if t.dtype != want {
            return Err(Error::InvalidArgument(format!(
                "tensor {} is {}, not {want}",
                label_of(&self.tensors, id),
                t.dtype
            )));
        }
        Ok(())
    }
    /// Writes a whole tensor's bytes (exactly [`TensorDesc::nbytes`]).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`], [`Error::NotAllocated`], buffer errors.
    pub fn set(&self, id: TensorId, data: &[u8]) -> Result<()> {
        self.expect_len(id, data.len())?;
        self.bindings.write(&self.tensors, id, 0, data)
    }
    /// Writes whole rows `row0..row0 + data.len() / row_bytes` of a contiguous 2-D tensor as a
    /// tensor of their own ([`crate::Buffer::set_tensor`]), so a buffer may store them in its
    /// layout: a loader can upload a large weight piece by piece.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a tensor that is not 2-D and contiguous or data that is not
    /// whole rows inside it; as [`TensorBuffer::set`].
    pub fn set_rows(&self, id: TensorId, row0: usize, data: &[u8]) -> Result<()> {
        let t = self.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: self.tensors.len(),
        })?;
        let ne = t.ne();
        let rb = t.row_bytes();
        let rows = data.len().checked_div(rb).unwrap_or(0);
        if !t.is_contiguous()
            || ne[2] != 1
            || ne[3] != 1
            || rb == 0
            || !data.len().is_multiple_of(rb)
            || row0.checked_add(rows).is_none_or(|end| end > ne[1])
        {
            return Err(Error::InvalidArgument(format!(
                "set_rows: {} bytes at row {row0} are not whole rows of the 2-D contiguous tensor {}",
                data.len(),
                label_of(&self.tensors, id)
            )));
        }
        let (buf, base) = self.bindings.resolve(&self.tensors, id)?;
        let mut piece = t.clone();
        piece.ne = [ne[0], rows, 1, 1];
        piece.nb = crate::tensor::contiguous_strides(t.dtype, piece.ne);
        buf.set_tensor(&piece, base + row0 * rb, data)
    }
    /// Writes bytes at `offset` inside a tensor.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`], [`Error::NotAllocated`], buffer errors.
    pub fn set_at(&self, id: TensorId, offset: usize, data: &[u8]) -> Result<()> {
        self.bindings.write(&self.tensors, id, offset, data)
    }
    /// Reads a whole tensor's bytes into `out` (exactly [`TensorDesc::nbytes`] long).
    ///
    /// # Errors
    /// As [`TensorBuffer::set`].
    pub fn get(&self, id: TensorId, out: &mut [u8]) -> Result<()> {
        self.expect_len(id, out.len())?;
        self.bindings.read(&self.tensors, id, 0, out)
    }
    /// Reads bytes at `offset` inside a tensor.
    ///
    /// # Errors
    /// As [`TensorBuffer::set_at`].
    pub fn get_at(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        self.bindings.read(&self.tensors, id, offset, out)
    }
    /// Writes an f32 tensor from a slice.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the tensor is not f32; otherwise as [`TensorBuffer::set`].
    pub fn set_f32(&self, id: TensorId, data: &[f32]) -> Result<()> {
        self.expect_dtype(id, DType::F32)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.set(id, &bytes)
    }
    /// Writes an i32 tensor from a slice.
    ///
    /// # Errors
    /// As [`TensorBuffer::set_f32`] for i32.
    pub fn set_i32(&self, id: TensorId, data: &[i32]) -> Result<()> {
        self.expect_dtype(id, DType::I32)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.set(id, &bytes)
    }
    /// Reads an f32 tensor.
    ///
    /// # Errors
    /// As [`TensorBuffer::set_f32`].
    pub fn get_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        self.expect_dtype(id, DType::F32)?;
        let t = &self.tensors[id.index()];
        let mut bytes = vec![0u8; t.nbytes()];
        self.get(id, &mut bytes)?;
        Ok(crate::dtype::f32_from_le_bytes(&bytes))
    }
    /// Reads an i32 tensor.
    ///
    /// # Errors
    /// As [`TensorBuffer::set_i32`].
    pub fn get_i32(&self, id: TensorId) -> Result<Vec<i32>> {
        self.expect_dtype(id, DType::I32)?;
        let t = &self.tensors[id.index()];
        let mut bytes = vec![0u8; t.nbytes()];
        self.get(id, &mut bytes)?;
        Ok(crate::dtype::i32_from_le_bytes(&bytes))
    }
}

impl AsRef<Bindings> for TensorBuffer {
    fn as_ref(&self) -> &Bindings {
        &self.bindings
    }
}

pub(super) fn alloc_tensors(
    buft: &dyn BufferType,
    ctx: &Context,
    keep: impl Fn(&TensorDesc) -> bool,
) -> Result<TensorBuffer> {
    let align = buft.alignment().max(1);
    let mut placements = Vec::new();
    let mut size = 0usize;
    for (i, t) in ctx.tensors().iter().enumerate() {
        if t.is_view() || !keep(t) {
            continue;
        }
        let offset = size.div_ceil(align) * align;
        size = offset.checked_add(buft.alloc_size(t)).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "tensor sizes overflow at {}",
                ctx.label(TensorId::from_index(i))
            ))
        })?;
        placements.push((TensorId::from_index(i), offset));
    }
    if size > buft.max_size() {
        return Err(Error::OutOfMemory {
            device: buft.name().to_string(),
            requested: size,
        });
    }
    tracing::debug!(
        buffer_type = buft.name(),
        bytes = size,
        tensors = placements.len(),
        "alloc_tensors"
    );
    let placed: Vec<(usize, &TensorDesc)> = placements
        .iter()
        .map(|&(id, off)| (off, &ctx.tensors()[id.index()]))
        .collect();
    let buffer = buft.alloc_placed(size, &placed)?;
    let mut bindings = Bindings::new();
    for (id, off) in placements {
        bindings.bind(id, buffer.clone(), off);
    }
    Ok(TensorBuffer {
        buffer,
        bindings,
        tensors: ctx.tensors().to_vec().into(),
    })
}
