//! [`GgufError`]: what went wrong reading, querying or writing a GGUF file, and in which file.

use std::fmt;

/// A GGUF error: the file (or description) it concerns and what went wrong.
///
/// Small on purpose (a boxed kind) so `Result<_, GgufError>` stays cheap; match on
/// [`GgufError::kind`].
#[derive(Debug)]
pub struct GgufError {
    source: String,
    kind: Box<GgufErrorKind>,
}

impl GgufError {
    /// An error about `source` (a path or a description such as `<memory>`).
    pub fn new(source: &str, kind: GgufErrorKind) -> GgufError {
        GgufError {
            source: source.to_string(),
            kind: Box::new(kind),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> &GgufErrorKind {
        &self.kind
    }

    /// What went wrong, by value.
    pub fn into_kind(self) -> GgufErrorKind {
        *self.kind
    }

    /// The file or description the error concerns.
    pub fn file(&self) -> &str {
        &self.source
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source, self.kind)
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.kind {
            GgufErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// The kinds of [`GgufError`]. Offsets and sizes are in bytes from the start of the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    // === The file as a whole ===
    /// The file could not be opened, sized, mapped or written.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?}: not a GGUF file")]
    BadMagic {
        /// The bytes found.
        found: Vec<u8>,
    },
    /// The version is not 2 or 3 (version 1 used 32-bit counts and is obsolete).
    #[error("unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion {
        /// The version found.
        version: u32,
    },
    /// The version reads as a byte-swapped 2 or 3: a big-endian file.
    #[error("big-endian GGUF (version {version} byte-swapped) is not supported")]
    BigEndian {
        /// The version as read little-endian.
        version: u32,
    },
    /// The file ends inside a field.
    #[error(
        "truncated file: {what} at offset {offset} needs {needed} bytes, the file has {file_size}"
    )]
    Truncated {
        /// The field being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Size of the file.
        file_size: u64,
    },
    /// A string length or element count that cannot fit in the rest of the file.
    #[error(
        "{what} at offset {offset}: length {len} is beyond the end of the file ({remaining} bytes remain)"
    )]
    LengthBeyondFile {
        /// The string or array.
        what: String,
        /// Where its length field starts.
        offset: u64,
        /// The length read (elements for an array, bytes for a string).
        len: u64,
        /// Bytes left after the length field.
        remaining: u64,
    },

    // === Metadata ===
    /// A value type id outside 0..=12.
    #[error("key {key}: unknown value type id {type_id}")]
    UnknownValueType {
        /// The key whose value (or array element) has it.
        key: String,
        /// The id found.
        type_id: u32,
    },
    /// Arrays nested deeper than the reader accepts.
    #[error("key {key}: arrays nested deeper than {max_depth} levels")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The accepted depth.
        max_depth: usize,
    },
    /// The same key twice.
    #[error("duplicate key {key}")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A key holds a value that is not valid for it (`general.alignment` not a power of two).
    #[error("key {key}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A key that was asked for is absent.
    #[error("missing key {key}")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A key that was asked for holds another type.
    #[error("key {key} has type {actual}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The type asked for.
        expected: String,
        /// The type found (`array of string` for arrays).
        actual: String,
    },

    // === Tensors ===
    /// More than four dimensions.
    #[error("tensor {tensor}: {n_dims} dimensions (at most 4)")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Dimensions found.
        n_dims: u32,
    },
    /// A shape whose sizes overflow, or whose rows are not whole blocks of its type.
    #[error("tensor {tensor}: bad shape {ne:?}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// Its sizes.
        ne: Vec<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A ggml type id that ggml does not define (or has removed).
    #[error("tensor {tensor}: unknown tensor type id {type_id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The id found.
        type_id: u32,
    },
    /// A ggml type Tessera has no dtype for (yet).
    #[error("tensor {tensor}: unsupported tensor type {type_name} (id {type_id})")]
    UnsupportedTensorType {
        /// The tensor.
        tensor: String,
        /// ggml's name of the type (`Q4_K`).
        type_name: String,
        /// ggml's id.
        type_id: u32,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {tensor}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset within the data section.
        offset: u64,
        /// `general.alignment`.
        alignment: u64,
    },
    /// A tensor whose data runs past the end of the file.
    #[error(
        "tensor {tensor}: data {start}..{end} is beyond the end of the file ({file_size} bytes)"
    )]
    TensorBeyondEnd {
        /// The tensor.
        tensor: String,
        /// First byte (from the start of the file).
        start: u64,
        /// One past the last byte.
        end: u64,
        /// Size of the file.
        file_size: u64,
    },
    /// The same tensor name twice.
    #[error("duplicate tensor name {tensor}")]
    DuplicateTensor {
        /// The name.
        tensor: String,
    },
    /// A tensor that was asked for is absent.
    #[error("no tensor named {tensor}")]
    NoSuchTensor {
        /// The name.
        tensor: String,
    },

    // === Writing ===
    /// A writer call with arguments that cannot make a valid file.
    #[error("cannot write: {0}")]
    InvalidWrite(String),
}

/// Lets model code mix GGUF reads with device calls under one `?`: the GGUF error becomes
/// [`tessera_core::Error::File`], from which [`tessera_core::Error::file_error`] gives the
/// [`GgufError`] back (`e.file_error::<GgufError>()`).
impl From<GgufError> for tessera_core::Error {
    fn from(e: GgufError) -> Self {
        tessera_core::Error::File(Box::new(e))
    }
}
