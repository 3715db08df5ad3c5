//! [`GgufFile`]: parse a GGUF v2/v3 file (header, metadata, tensor infos) over its mapped bytes and
//! validate every length, type, offset and range before anything is allocated or sliced.

use super::error::{GgufError, GgufErrorKind};
use super::map::GgufBytes;
use super::types::GgmlType;
use super::value::{Array, Metadata, Value, ValueType};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use tessera_core::DType;
use tessera_core::backend::HostMemory;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The metadata key of the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The alignment when [`ALIGNMENT_KEY`] is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting the reader accepts (real files nest at most once); deeper input is an
/// error rather than a deep recursion.
pub const MAX_ARRAY_NESTING: usize = 16;

/// Fewest bytes of one tensor info: name length, `n_dims`, type and offset.
const MIN_TENSOR_INFO: usize = 8 + 4 + 4 + 8;
/// Fewest bytes of one metadata entry: key length, value type and a one-byte value.
const MIN_KV: usize = 8 + 4 + 1;

/// How strictly [`GgufFile::open_with`] treats tensor types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Accept tensors of ggml types Tessera has no dtype for (their [`TensorInfo::dtype`] is an
    /// error), e.g. to read the metadata of a K-quant model. Default `false`: such a file fails
    /// to open with [`GgufErrorKind::UnsupportedTensorType`].
    pub allow_unsupported_types: bool,
}

impl ReadOptions {
    /// Options that accept any tensor type ggml defines.
    pub fn allow_unsupported_types() -> ReadOptions {
        ReadOptions {
            allow_unsupported_types: true,
        }
    }
}

/// One tensor of a GGUF file: name, type, shape and where its bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    source: Arc<str>,
    name: String,
    ggml_type: GgmlType,
    n_dims: usize,
    ne: [usize; MAX_DIMS],
    offset: usize,
    file_offset: usize,
    nbytes: usize,
}

impl TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ggml type as stored.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Tessera's dtype of the tensor.
    ///
    /// # Errors
    /// [`GgufErrorKind::UnsupportedTensorType`] (naming the ggml type and id) when Tessera has no
    /// dtype for it; only possible for files opened with
    /// [`ReadOptions::allow_unsupported_types`].
    pub fn dtype(&self) -> Result<DType, GgufError> {
        self.ggml_type.dtype().ok_or_else(|| {
            GgufError::new(
                &self.source,
                GgufErrorKind::UnsupportedTensorType {
                    tensor: self.name.clone(),
                    type_name: self.ggml_type.name().to_string(),
                    type_id: self.ggml_type.id(),
                },
            )
        })
    }

    /// Dimensions stored in the file (0 to 4).
    pub fn n_dims(&self) -> usize {
        self.n_dims
    }

    /// Sizes of all four dimensions, unused ones 1 (`ne[0]` is the contiguous one, as in ggml).
    pub fn ne(&self) -> [usize; MAX_DIMS] {
        self.ne
    }

    /// The sizes of the stored dimensions only.
    pub fn shape(&self) -> &[usize] {
        &self.ne[..self.n_dims]
    }

    /// Number of elements.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Bytes of the tensor's data.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Offset of the data within the data section (as stored; a multiple of the alignment).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Byte range of the data within the whole file (what to bind in a buffer wrapping
    /// [`GgufFile::host_memory`]).
    pub fn file_range(&self) -> Range<usize> {
        self.file_offset..self.file_offset + self.nbytes
    }
}

/// An open GGUF file: its metadata and tensor infos, parsed and validated, over the file's
/// memory-mapped bytes.
///
/// Tensor data is never copied: [`GgufFile::tensor_bytes`] slices the map, and
/// [`GgufFile::host_memory`] hands the map itself to a device
/// ([`tessera_core::Device::buffer_from_host`]). The file must not be modified while open (see the
/// module doc).
#[derive(Clone, Debug)]
pub struct GgufFile {
    source: Arc<str>,
    bytes: Arc<GgufBytes>,
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens and maps `path`, parses and validates it; tensors of types Tessera has no dtype
    /// for are refused.
    ///
    /// # Errors
    /// A [`GgufError`] naming the file: i/o, bad magic, unsupported version, truncation, lengths
    /// beyond the file, unknown value types, unknown or unsupported tensor types, misaligned or
    /// out-of-file tensor data, duplicate keys or tensor names.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        GgufFile::open_with(path, &ReadOptions::default())
    }

    /// [`GgufFile::open`] with options.
    ///
    /// # Errors
    /// As [`GgufFile::open`].
    pub fn open_with(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let source = path.display().to_string();
        let io = |e| GgufError::new(&source, GgufErrorKind::Io(e));
        let file = std::fs::File::open(path).map_err(io)?;
        let bytes = GgufBytes::map(&file).map_err(io)?;
        let parsed = GgufFile::parse(source.as_str().into(), Arc::new(bytes), opts)?;
        // The header and metadata (a large vocabulary is tens of MiB) now live in Rust values:
        // their mapped pages need not stay resident.
        parsed.bytes.release(0, parsed.data_offset);
        Ok(parsed)
    }

    /// Parses a GGUF image held in memory; errors name `source`.
    ///
    /// # Errors
    /// As [`GgufFile::open`], i/o aside.
    pub fn from_bytes(
        bytes: Vec<u8>,
        source: &str,
        opts: &ReadOptions,
    ) -> Result<GgufFile, GgufError> {
        GgufFile::parse(source.into(), Arc::new(GgufBytes::from_vec(bytes)), opts)
    }

    fn parse(
        source: Arc<str>,
        bytes: Arc<GgufBytes>,
        opts: &ReadOptions,
    ) -> Result<GgufFile, GgufError> {
        let data = bytes.as_slice();
        let mut cur = Cursor {
            data,
            pos: 0,
            source: &source,
        };
        let magic = cur.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(cur.err(GgufErrorKind::BadMagic {
                found: magic.to_vec(),
            }));
        }
        let version = cur.u32("version")?;
        match version {
            2 | 3 => {}
            v if matches!(v.swap_bytes(), 1..=3) => {
                return Err(cur.err(GgufErrorKind::BigEndian { version: v }));
            }
            v => return Err(cur.err(GgufErrorKind::UnsupportedVersion { version: v })),
        }
        let n_tensors = cur.u64("tensor count")?;
        let n_kv = cur.u64("metadata count")?;
        let n_kv = cur.cap_count(n_kv, MIN_KV, 16, "metadata count")?;
        let mut metadata = Metadata::new(&*source);
        for i in 0..n_kv {
            let key = cur.string(&format!("key of metadata entry {i}"))?;
            let type_id = cur.u32(&format!("value type of key {key}"))?;
            let value = cur.value(type_id, &key, 0)?;
            metadata.insert(key, value)?;
        }
        let alignment = alignment_of(&metadata)?;
        let n_tensors = cur.cap_count(n_tensors, MIN_TENSOR_INFO, 8, "tensor count")?;
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        for i in 0..n_tensors {
            let t = cur.tensor_info(i, alignment, opts, &source)?;
            if by_name.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(cur.err(GgufErrorKind::DuplicateTensor { tensor: t.name }));
            }
            tensors.push(t);
        }
        let data_offset = cur.pos.next_multiple_of(alignment);
        for t in &mut tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.nbytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= data.len() => t.file_offset = s,
                _ => {
                    let start = (data_offset as u64).saturating_add(t.offset as u64);
                    return Err(cur.err(GgufErrorKind::TensorBeyondEnd {
                        tensor: t.name.clone(),
                        start,
                        end: start.saturating_add(t.nbytes as u64),
                        file_size: data.len() as u64,
                    }));
                }
            }
        }
        Ok(GgufFile {
            source,
            bytes: Arc::clone(&bytes),
            version,
            alignment,
            data_offset,
            metadata,
            tensors,
            by_name,
        })
    }

    /// The path (or description) the file was opened from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Offset of the data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> usize {
        self.bytes.as_slice().len()
    }

    /// The metadata, with typed getters (`file.metadata().get_u32("llama.block_count")`).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`.
    ///
    /// # Errors
    /// [`GgufErrorKind::NoSuchTensor`] if absent.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| {
            GgufError::new(
                &self.source,
                GgufErrorKind::NoSuchTensor {
                    tensor: name.to_string(),
                },
            )
        })
    }

    /// The data of tensor `name`, borrowed from the map (no copy).
    ///
    /// # Errors
    /// [`GgufErrorKind::NoSuchTensor`] if absent.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let t = self.tensor_info(name)?;
        // In range: checked against the file size when the file was parsed.
        Ok(&self.bytes.as_slice()[t.file_range()])
    }

    /// Releases the mapped pages of tensor `name` after a loader has copied them
    /// ([`GgufBytes::release`]): peak memory of a load is then the copies, not copies plus file.
    pub fn release_tensor(&self, name: &str) {
        if let Ok(t) = self.tensor_info(name) {
            let r = t.file_range();
            self.bytes.release(r.start, r.end - r.start);
        }
    }

    /// [`GgufFile::release_tensor`] for bytes `range` of tensor `name` only.
    pub fn release_tensor_range(&self, name: &str, range: std::ops::Range<usize>) {
        if let Ok(t) = self.tensor_info(name) {
            let r = t.file_range();
            let start = r.start + range.start.min(r.len());
            let end = r.start + range.end.min(r.len());
            self.bytes.release(start, end.saturating_sub(start));
        }
    }

    /// The whole file as shared host memory, for [`tessera_core::Device::buffer_from_host`]: a
    /// device buffer over it holds each tensor at [`TensorInfo::file_range`]. The map stays alive
    /// while any clone is held.
    pub fn host_memory(&self) -> HostMemory {
        Arc::clone(&self.bytes) as HostMemory
    }

    /// The file's bytes (mapped or owned).
    pub fn bytes(&self) -> &Arc<GgufBytes> {
        &self.bytes
    }
}

/// `general.alignment`, checked: a `u32` power of two.
fn alignment_of(md: &Metadata) -> Result<usize, GgufError> {
    let bad = |reason: String| {
        GgufError::new(
            md.source(),
            GgufErrorKind::InvalidValue {
                key: ALIGNMENT_KEY.into(),
                reason,
            },
        )
    };
    match md.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => {
            usize::try_from(*a).map_err(|_| bad(format!("{a} does not fit in usize")))
        }
        Some(Value::U32(a)) => Err(bad(format!("{a} is not a power of two"))),
        Some(v) => Err(bad(format!("type {} (expected u32)", v.type_description()))),
    }
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    source: &'a str,
}

impl<'a> Cursor<'a> {
    fn err(&self, kind: GgufErrorKind) -> GgufError {
        GgufError::new(self.source, kind)
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err(GgufErrorKind::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n as u64,
                file_size: self.data.len() as u64,
            }));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each fit in the rest of the file
    /// (`len_pos` bytes back is where the count was read, for the error).
    fn cap_count(
        &self,
        count: u64,
        min_size: usize,
        len_pos: usize,
        what: &str,
    ) -> Result<usize, GgufError> {
        let remaining = self.remaining() as u64;
        match count.checked_mul(min_size as u64) {
            Some(bytes) if bytes <= remaining => Ok(count as usize),
            _ => Err(self.err(GgufErrorKind::LengthBeyondFile {
                what: what.to_string(),
                offset: (self.pos - len_pos) as u64,
                len: count,
                remaining,
            })),
        }
    }

    /// Reads a `u64` count of items of at least `min_size` bytes, capped by the file size.
    fn count(&mut self, min_size: usize, what: &str) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        self.cap_count(n, min_size, 8, what)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.count(1, what)?;
        let bytes = self.take(n, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        let t = ValueType::from_id(type_id).ok_or_else(|| {
            self.err(GgufErrorKind::UnknownValueType {
                key: key.to_string(),
                type_id,
            })
        })?;
        let what = || format!("value of key {key}");
        Ok(match t {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(&what())?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what())?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            ValueType::Bool => Value::Bool(self.array::<1>(&what())?[0] != 0),
            ValueType::String => Value::String(self.string(&what())?),
            ValueType::Array => Value::Array(self.array_value(key, depth)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(self.err(GgufErrorKind::NestingTooDeep {
                key: key.to_string(),
                max_depth: MAX_ARRAY_NESTING,
            }));
        }
        let what = format!("array of key {key}");
        let type_id = self.u32(&what)?;
        let t = ValueType::from_id(type_id).ok_or_else(|| {
            self.err(GgufErrorKind::UnknownValueType {
                key: key.to_string(),
                type_id,
            })
        })?;
        let n = self.count(t.min_encoded_size(), &what)?;
        // Fixed-size elements: the count was capped by the file size, so these slices exist.
        let fixed = |cur: &mut Cursor<'a>, size: usize| cur.take(n * size, &what);
        macro_rules! le {
            ($ty:ty, $size:expr) => {
                fixed(self, $size)?
                    .chunks_exact($size)
                    .map(|c| {
                        let mut b = [0u8; $size];
                        b.copy_from_slice(c);
                        <$ty>::from_le_bytes(b)
                    })
                    .collect()
            };
        }
        Ok(match t {
            ValueType::U8 => Array::U8(fixed(self, 1)?.to_vec()),
            ValueType::I8 => Array::I8(le!(i8, 1)),
            ValueType::U16 => Array::U16(le!(u16, 2)),
            ValueType::I16 => Array::I16(le!(i16, 2)),
            ValueType::U32 => Array::U32(le!(u32, 4)),
            ValueType::I32 => Array::I32(le!(i32, 4)),
            ValueType::F32 => Array::F32(le!(f32, 4)),
            ValueType::Bool => Array::Bool(fixed(self, 1)?.iter().map(|&b| b != 0).collect()),
            ValueType::U64 => Array::U64(le!(u64, 8)),
            ValueType::I64 => Array::I64(le!(i64, 8)),
            ValueType::F64 => Array::F64(le!(f64, 8)),
            ValueType::String => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(self.string(&what)?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(
        &mut self,
        i: usize,
        alignment: usize,
        opts: &ReadOptions,
        source: &Arc<str>,
    ) -> Result<TensorInfo, GgufError> {
        let name = self.string(&format!("name of tensor info {i}"))?;
        let what = format!("tensor info of {name}");
        let n_dims = self.u32(&what)?;
        if n_dims as usize > MAX_DIMS {
            return Err(self.err(GgufErrorKind::TooManyDims {
                tensor: name,
                n_dims,
            }));
        }
        let mut ne64 = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne64.push(self.u64(&what)?);
        }
        let type_id = self.u32(&what)?;
        let offset = self.u64(&what)?;
        let bad_shape = |cur: &Self, reason: &str| {
            cur.err(GgufErrorKind::BadShape {
                tensor: name.clone(),
                ne: ne64.clone(),
                reason: reason.to_string(),
            })
        };
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            self.err(GgufErrorKind::UnknownTensorType {
                tensor: name.clone(),
                type_id,
            })
        })?;
        if ggml_type.dtype().is_none() && !opts.allow_unsupported_types {
            return Err(self.err(GgufErrorKind::UnsupportedTensorType {
                tensor: name,
                type_name: ggml_type.name().to_string(),
                type_id,
            }));
        }
        // ggml stores sizes as i64 and requires the element count to fit in one.
        let count = ne64.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
        if count.is_none_or(|c| c > i64::MAX as u64) {
            return Err(bad_shape(self, "element count overflows"));
        }
        let bs = ggml_type.block_size() as u64;
        if !ne64.first().copied().unwrap_or(1).is_multiple_of(bs) {
            return Err(bad_shape(
                self,
                &format!(
                    "ne[0] is not a multiple of {}'s block size {bs}",
                    ggml_type.name()
                ),
            ));
        }
        let nbytes = ggml_type
            .nbytes(&ne64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| bad_shape(self, "byte size overflows"))?;
        let mut ne = [1usize; MAX_DIMS];
        for (d, &n) in ne.iter_mut().zip(&ne64) {
            *d = usize::try_from(n).map_err(|_| bad_shape(self, "size does not fit in usize"))?;
        }
        if !offset.is_multiple_of(alignment as u64) {
            return Err(self.err(GgufErrorKind::MisalignedOffset {
                tensor: name,
                offset,
                alignment: alignment as u64,
            }));
        }
        let offset = usize::try_from(offset).map_err(|_| {
            self.err(GgufErrorKind::TensorBeyondEnd {
                tensor: name.clone(),
                start: offset,
                end: offset,
                file_size: self.data.len() as u64,
            })
        })?;
        Ok(TensorInfo {
            source: Arc::clone(source),
            name,
            ggml_type,
            n_dims: n_dims as usize,
            ne,
            offset,
            file_offset: 0,
            nbytes,
        })
    }
}
