//! Element types with GGUF-compatible block layouts.
//!
//! A dtype stores elements in blocks of `block_size()` elements occupying `type_size()` bytes;
//! plain types have blocks of one element. Type ids are ggml's, so GGUF files map directly.

use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
// ggml's spelling (`Q4_K`), so names match GGUF and test-backend-ops.
#[allow(non_camel_case_types)]
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
    /// Blocks of 32: f16 scale + 4 bytes of fifth bits + 16 bytes of nibbles, values offset by 16.
    Q5_0,
    /// Blocks of 32: f16 scale `d`, f16 min `m`, 16 bytes of 4-bit values; `x = d·q + m`.
    Q4_1,
    /// Blocks of 32: f16 `d`, f16 `m`, 4 bytes of fifth bits, 16 bytes of nibbles; `x = d·q + m`.
    Q5_1,
    /// Super-blocks of 256: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins for eight
    /// sub-blocks of 32, 128 bytes of 4-bit values; `x = d·sc·q − dmin·m`.
    Q4_K,
    /// Super-blocks of 256: as [`DType::Q4_K`] plus 32 bytes of fifth bits (5-bit values).
    Q5_K,
    /// Super-blocks of 256: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 i8 scales
    /// (one per 16 values), f16 `d`; `x = d·sc·(q − 32)`.
    Q6_K,
    /// Super-blocks of 256: f32 `d`, 256 × i8, 16 × i16 sums of each 16 quants. The activation
    /// form of the K-quant dot products (as in ggml), not a storage type for weights.
    Q8_K,
    /// Super-blocks of 256: 16 bytes of 4-bit scale / 4-bit min pairs (one per 16 values), 64 bytes
    /// of 2-bit values, f16 `d`, f16 `dmin`; `x = d·sc·q − dmin·m`.
    Q2_K,
    /// Super-blocks of 256: 32 bytes of high bits, 64 bytes of low 2-bit pairs, 12 bytes of 6-bit
    /// scales (one per 16 values), f16 `d`; `x = d·(sc − 32)·(q − 4)` with `q` in `0..8`.
    Q3_K,
    /// Blocks of 32: f16 scale + 16 bytes of 4-bit indices into ggml's non-linear `kvalues_iq4nl`.
    IQ4_NL,
    /// Super-blocks of 256: f16 `d`, 6-bit scales (one per 32 values, split over a u16 of high
    /// bits and 4 bytes of low nibbles), 128 bytes of `kvalues_iq4nl` indices.
    IQ4_XS,
    /// Blocks of 32 (OCP microscaling FP4): one E8M0 exponent byte + 16 bytes of E2M1 codes.
    MXFP4,
}

impl DType {
    /// Every dtype, in ggml id order.
    pub const ALL: [DType; 18] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::I32,
        DType::BF16,
        DType::MXFP4,
    ];

    /// Elements per K-quant super-block (ggml's `QK_K`).
    pub const QK_K: usize = 256;

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1,
            DType::Q8_0
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::IQ4_NL
            | DType::MXFP4 => 32,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ4_XS => DType::QK_K,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::IQ4_NL => 18,
            DType::IQ4_XS => 136,
            DType::MXFP4 => 17,
        }
    }

    /// Whether the type is block-quantized.
    pub const fn is_quantized(self) -> bool {
        matches!(
            self,
            DType::Q8_0
                | DType::Q4_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::Q4_K
                | DType::Q5_K
                | DType::Q6_K
                | DType::Q8_K
                | DType::Q2_K
                | DType::Q3_K
                | DType::IQ4_NL
                | DType::IQ4_XS
                | DType::MXFP4
        )
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
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::IQ4_NL => 20,
            DType::IQ4_XS => 23,
            DType::I32 => 26,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
        }
    }

    /// The dtype of a ggml / GGUF type id, if Tessera knows it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_id() == id)
    }

    /// ggml / GGUF type id (the same as [`DType::ggml_id`], under ggml's own name).
    pub const fn ggml_type_id(self) -> u32 {
        self.ggml_id()
    }

    /// The dtype of a ggml / GGUF type id (the same as [`DType::from_ggml_id`]).
    pub fn from_ggml_type_id(id: u32) -> Option<DType> {
        DType::from_ggml_id(id)
    }

    /// Name as ggml prints it (`f32`, `q8_0`, `q4_K`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::Q8_K => "q8_K",
            DType::Q2_K => "q2_K",
            DType::Q3_K => "q3_K",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ4_XS => "iq4_xs",
            DType::MXFP4 => "mxfp4",
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
        // K-quants: super-blocks of 256 (ggml-common.h static_asserts).
        assert_eq!(DType::Q5_0.row_size(64), Some(44));
        assert_eq!(DType::Q4_1.row_size(64), Some(40));
        assert_eq!(DType::Q5_1.row_size(64), Some(48));
        assert_eq!(DType::Q4_K.row_size(4096), Some(16 * 144));
        assert_eq!(DType::Q5_K.row_size(512), Some(2 * 176));
        assert_eq!(DType::Q6_K.row_size(256), Some(210));
        assert_eq!(DType::Q8_K.row_size(256), Some(4 + 256 + 32));
        assert_eq!(DType::Q4_K.row_size(128), None);
        assert!(DType::Q6_K.is_quantized() && !DType::Q6_K.is_float());
        // ggml-common.h: block_q2_K, block_q3_K, block_iq4_nl, block_iq4_xs, block_mxfp4.
        assert_eq!(DType::Q2_K.row_size(256), Some(2 * 2 + 16 + 64));
        assert_eq!(DType::Q3_K.row_size(512), Some(2 * (2 + 64 + 32 + 12)));
        assert_eq!(DType::IQ4_NL.row_size(64), Some(2 * (2 + 16)));
        assert_eq!(DType::IQ4_XS.row_size(256), Some(2 + 2 + 4 + 128));
        assert_eq!(DType::MXFP4.row_size(96), Some(3 * 17));
        assert_eq!(DType::IQ4_XS.row_size(32), None);
        assert_eq!(DType::MXFP4.row_size(16), None);
        for d in [
            DType::Q2_K,
            DType::Q3_K,
            DType::IQ4_NL,
            DType::IQ4_XS,
            DType::MXFP4,
        ] {
            assert!(d.is_quantized() && !d.is_float(), "{d}");
        }
    }

    #[test]
    fn ggml_ids_and_names() {
        for (d, id, name) in [
            (DType::Q4_1, 3, "q4_1"),
            (DType::Q5_0, 6, "q5_0"),
            (DType::Q5_1, 7, "q5_1"),
            (DType::Q4_K, 12, "q4_K"),
            (DType::Q5_K, 13, "q5_K"),
            (DType::Q6_K, 14, "q6_K"),
            (DType::Q8_K, 15, "q8_K"),
            (DType::Q2_K, 10, "q2_K"),
            (DType::Q3_K, 11, "q3_K"),
            (DType::IQ4_NL, 20, "iq4_nl"),
            (DType::IQ4_XS, 23, "iq4_xs"),
            (DType::MXFP4, 39, "mxfp4"),
        ] {
            assert_eq!(d.ggml_type_id(), id);
            assert_eq!(DType::from_ggml_type_id(id), Some(d));
            assert_eq!(d.to_string(), name);
            assert_eq!(DType::parse("Q4_k"), Some(DType::Q4_K));
        }
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
