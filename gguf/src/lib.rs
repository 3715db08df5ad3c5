//! GGUF files for Tessera: read (v2 and v3, little-endian, memory-mapped) and write (v3).
//!
//! A GGUF file is a header (`GGUF`, version, tensor and key counts), typed metadata (thirteen
//! value types, arrays nested to any depth), tensor infos (name, up to four sizes, ggml type id,
//! offset within the data section) and the data section, which starts at the first multiple of
//! `general.alignment` (default 32) after the infos; every tensor offset is a multiple of it.
//!
//! [`GgufFile::open`] validates all of it before handing anything out: every length and count is
//! capped by the bytes left in the file before anything is allocated (a hostile file cannot make
//! the reader allocate more than a small multiple of its own size, nor recurse more than
//! [`MAX_ARRAY_NESTING`] deep), and each problem is a typed [`GgufError`] naming the file and the
//! key or tensor: bad magic, unsupported version, truncation, lengths beyond the file, unknown
//! value types, unknown or unsupported tensor types (`unsupported tensor type IQ2_XXS (id 16)`),
//! misaligned offsets, tensor data beyond the end, duplicate keys and tensor names. No input
//! makes the reader panic.
//!
//! ```no_run
//! use tessera_gguf::GgufFile;
//! # fn main() -> Result<(), tessera_gguf::GgufError> {
//! let file = GgufFile::open("model.gguf")?;
//! let n_layer = file.metadata().get_u32("llama.block_count")?;
//! for t in file.tensors() {
//!     println!("{} {} {:?} at {:?}", t.name(), t.ggml_type(), t.shape(), t.file_range());
//! }
//! let q = file.tensor_bytes("blk.0.attn_q.weight")?; // borrowed from the map, no copy
//! // Or give devices the whole map: Device::buffer_from_host(file.host_memory()).
//! # let _ = (n_layer, q); Ok(()) }
//! ```
//!
//! # Memory mapping and `unsafe`
//!
//! The crate denies `unsafe_code`; the one exception is creating the read-only map in
//! [`GgufBytes`] (`memmap2::Mmap::map` is `unsafe`). Mapping is what lets a multi-gigabyte model
//! open instantly and be shared with devices without a copy. The contract it relies on, which
//! callers must keep: **a GGUF file must not be truncated or rewritten while it is open** (while
//! any [`GgufFile`], or clone of its [`GgufFile::host_memory`], is alive). Truncating a mapped
//! file makes later reads of the lost pages fault (SIGBUS) and rewriting it changes bytes that
//! were already validated, as with every mmap-based loader, llama.cpp included. Write new files
//! to a temporary path and rename them over the old one instead.
//!
//! Tensor types map to Tessera's dtypes through [`DType::from_ggml_id`](tessera_core::DType), so a dtype
//! added to `tessera_core::dtype` with its ggml id is readable here with no change; the other ggml types
//! are known by name and geometry ([`GgmlType`]) and can be listed with
//! [`ReadOptions::allow_unsupported_types`].

#![deny(unsafe_code)]

mod error;
mod map;
mod reader;
#[cfg(test)]
mod tests;
mod types;
mod value;
mod writer;

pub use error::{GgufError, GgufErrorKind};
pub use map::GgufBytes;
pub use reader::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufFile, MAX_ARRAY_NESTING, MAX_DIMS,
    ReadOptions, TensorInfo,
};
pub use types::{GgmlType, ggml_type_name};
pub use value::{Array, Metadata, Value, ValueType};
pub use writer::{GgufWriter, WRITE_VERSION};
