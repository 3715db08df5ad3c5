//! Element types with GGUF-compatible block layouts.
//!
//! A dtype stores elements in blocks of `block_size()` elements occupying `type_size()` bytes;
//! plain types have blocks of one element. Type ids are ggml's, so GGUF files map directly.

use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer (indices, positions, argmax results).
    I32,
    /// Blocks of 32: f16 scale + 32 × i8.
    Q8_0,
    /// Blocks of 32: f16 scale + 16 bytes of 4-bit values offset by 8.
    Q4_0,
}

impl DType {
    /// Every dtype, in ggml id order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::I32,
        DType::BF16,
    ];

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1,
            DType::Q8_0 | DType::Q4_0 => 32,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
        }
    }

    /// Whether the type is block-quantized.
    pub const fn is_quantized(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_0)
    }

    /// Whether the type holds floating-point values element by element (F32, F16, BF16).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Bytes of a row of `ne0` elements, or `None` if `ne0` is not a multiple of the block size.
    pub const fn row_size(self, ne0: usize) -> Option<usize> {
        if !ne0.is_multiple_of(self.block_size()) {
            return None;
        }
        Some(ne0 / self.block_size() * self.type_size())
    }

    /// ggml / GGUF type id.
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q8_0 => 8,
            DType::I32 => 26,
            DType::BF16 => 30,
        }
    }

    /// The dtype of a ggml / GGUF type id, if Tessera knows it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_id() == id)
    }

    /// Lower-case name as ggml prints it (`f32`, `q8_0`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
        }
    }

    /// Parses a name as [`DType::name`] prints it (case-insensitive).
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Little-endian f32 values of `bytes` (a trailing partial value is ignored).
pub fn f32_from_le_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian i32 values of `bytes` (a trailing partial value is ignored).
pub fn i32_from_le_bytes(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layouts_match_ggml() {
        assert_eq!(DType::Q8_0.row_size(64), Some(68));
        assert_eq!(DType::Q4_0.row_size(4096), Some(4096 / 32 * 18));
        assert_eq!(DType::Q4_0.row_size(33), None);
        assert_eq!(DType::F16.row_size(3), Some(6));
    }

    #[test]
    fn ids_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_ggml_id(d.ggml_id()), Some(d));
            assert_eq!(DType::parse(&d.name().to_uppercase()), Some(d));
        }
        assert_eq!(DType::from_ggml_id(12345), None);
    }
}
