//! [`GgufWriter`]: builds GGUF v3 files (metadata of every type, tensors aligned and padded), for
//! tests and for exporting synthetic models.

use super::error::{GgufError, GgufErrorKind};
use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use super::types::GgmlType;
use super::value::{Array, Metadata, Value};
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;
use tessera_core::DType;

/// The version [`GgufWriter`] writes.
pub const WRITE_VERSION: u32 = 3;

struct PendingTensor {
    name: String,
    type_id: u32,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory and writes it out.
///
/// Keys keep the order they were first set in; tensors are laid out in the order added, each at
/// an offset that is a multiple of the alignment, with zero padding after each (the last
/// included), as llama.cpp writes them.
///
/// ```
/// use tessera_gguf::{GgufFile, GgufWriter, ReadOptions};
/// use tessera_core::DType;
/// let mut w = GgufWriter::new();
/// w.set("general.architecture", "llama").unwrap();
/// w.set("llama.block_count", 2u32).unwrap();
/// w.add_tensor("output_norm.weight", DType::F32, &[4], vec![0u8; 16]).unwrap();
/// let file = GgufFile::from_bytes(w.to_bytes(), "<memory>", &ReadOptions::default()).unwrap();
/// assert_eq!(file.metadata().get_u32("llama.block_count").unwrap(), 2);
/// assert_eq!(file.tensor_bytes("output_norm.weight").unwrap(), &[0u8; 16]);
/// ```
pub struct GgufWriter {
    metadata: Metadata,
    alignment: usize,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> GgufWriter {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty file: no keys, no tensors, alignment 32.
    pub fn new() -> GgufWriter {
        GgufWriter {
            metadata: Metadata::new("<gguf writer>"),
            alignment: DEFAULT_ALIGNMENT,
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Sets metadata `key` (replacing an earlier value in place). Setting `general.alignment`
    /// also changes the data alignment.
    ///
    /// # Errors
    /// [`GgufErrorKind::InvalidWrite`] if `general.alignment` is not a `u32` power of two.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<(), GgufError> {
        let value = value.into();
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = a as usize,
                ref v => {
                    return Err(self.invalid(format!(
                        "{ALIGNMENT_KEY} must be a u32 power of two, got {v:?}"
                    )));
                }
            }
        }
        self.metadata.set(key, value);
        Ok(())
    }

    /// Sets the data alignment (and the `general.alignment` key).
    ///
    /// # Errors
    /// [`GgufErrorKind::InvalidWrite`] if it is not a power of two.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        self.set(ALIGNMENT_KEY, alignment)
    }

    /// The metadata set so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Adds a tensor of Tessera dtype `dtype` with sizes `ne` (`ne[0]` contiguous, at most four).
    ///
    /// # Errors
    /// [`GgufErrorKind::InvalidWrite`] for a duplicate name, more than four dimensions, `ne[0]`
    /// not whole blocks, or `data` of the wrong length.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        data: impl Into<Vec<u8>>,
    ) -> Result<(), GgufError> {
        let data = data.into();
        let g = GgmlType::of(dtype)
            .ok_or_else(|| self.invalid(format!("{name}: {dtype} has no ggml type")))?;
        if ne.len() > MAX_DIMS {
            return Err(self.invalid(format!("{name}: {} dimensions", ne.len())));
        }
        let ne: Vec<u64> = ne.iter().map(|&n| n as u64).collect();
        let want = g.nbytes(&ne).ok_or_else(|| {
            self.invalid(format!(
                "{name}: shape {ne:?} is not whole blocks of {dtype}"
            ))
        })?;
        if want != data.len() as u64 {
            return Err(self.invalid(format!(
                "{name}: {} bytes of data, shape {ne:?} of {dtype} needs {want}",
                data.len()
            )));
        }
        self.push(name, g.id(), ne, data)
    }

    /// Adds a tensor exactly as given: any type id, sizes and data, unchecked (only the name must
    /// be new). For building test files, including invalid ones.
    ///
    /// # Errors
    /// [`GgufErrorKind::InvalidWrite`] for a duplicate name.
    pub fn add_raw_tensor(
        &mut self,
        name: &str,
        type_id: u32,
        ne: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> Result<(), GgufError> {
        self.push(name, type_id, ne.to_vec(), data.into())
    }

    fn push(
        &mut self,
        name: &str,
        type_id: u32,
        ne: Vec<u64>,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        if !self.names.insert(name.to_string()) {
            return Err(self.invalid(format!("duplicate tensor name {name}")));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            type_id,
            ne,
            data,
        });
        Ok(())
    }

    fn invalid(&self, msg: String) -> GgufError {
        GgufError::new(self.metadata.source(), GgufErrorKind::InvalidWrite(msg))
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write_to(&mut out);
        out
    }

    /// Writes the file to `path` (created or truncated).
    ///
    /// # Errors
    /// [`GgufErrorKind::Io`] naming the path.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let io = |e| GgufError::new(&path.display().to_string(), GgufErrorKind::Io(e));
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = io::BufWriter::new(file);
        self.write_to(&mut w).map_err(io)?;
        w.flush().map_err(io)
    }

    /// Writes the file to `w`.
    ///
    /// # Errors
    /// Errors of `w`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        put_u32(&mut head, WRITE_VERSION);
        put_u64(&mut head, self.tensors.len() as u64);
        put_u64(&mut head, self.metadata.len() as u64);
        for (key, value) in self.metadata.iter() {
            put_str(&mut head, key);
            put_u32(&mut head, value.value_type().id());
            put_value(&mut head, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            put_u32(&mut head, t.ne.len() as u32);
            t.ne.iter().for_each(|&n| put_u64(&mut head, n));
            put_u32(&mut head, t.type_id);
            put_u64(&mut head, offset as u64);
            offset += t.data.len().next_multiple_of(self.alignment);
        }
        head.resize(head.len().next_multiple_of(self.alignment), 0);
        w.write_all(&head)?;
        let zeros = vec![0u8; self.alignment];
        for t in &self.tensors {
            w.write_all(&t.data)?;
            let pad = t.data.len().next_multiple_of(self.alignment) - t.data.len();
            w.write_all(&zeros[..pad])?;
        }
        Ok(())
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    put_u32(out, a.elem_type().id());
    put_u64(out, a.len() as u64);
    macro_rules! le {
        ($v:expr) => {
            $v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::Bool(v) => v.iter().for_each(|&b| out.push(u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
    }
}
