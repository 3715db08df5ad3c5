//! ggml tensor types as GGUF stores them: every id ggml defines, with its name and block geometry,
//! and the mapping to Tessera's [`DType`].
//!
//! The geometry lets the reader size and bounds-check every tensor of a file, including types
//! Tessera cannot compute with yet. The id → [`DType`] mapping is [`DType::from_ggml_id`]: a dtype
//! added to `core::dtype` with its ggml id is readable from GGUF with no change here (the test
//! below checks its geometry against this table).

use std::fmt;
use tessera_core::DType;

/// A ggml tensor type: id, name and block geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    id: u32,
    name: &'static str,
    block_size: usize,
    type_size: usize,
}

const fn t(id: u32, name: &'static str, block_size: usize, type_size: usize) -> GgmlType {
    GgmlType {
        id,
        name,
        block_size,
        type_size,
    }
}

/// Every type ggml defines, by id. Ids 4, 5 (Q4_2, Q4_3), 31–33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) and
/// 36–38 (IQ4_NL_4_4, …) were removed from ggml and are unknown here too.
const GGML_TYPES: [GgmlType; 32] = [
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 18),
    t(3, "Q4_1", 32, 20),
    t(6, "Q5_0", 32, 22),
    t(7, "Q5_1", 32, 24),
    t(8, "Q8_0", 32, 34),
    t(9, "Q8_1", 32, 36),
    t(10, "Q2_K", 256, 84),
    t(11, "Q3_K", 256, 110),
    t(12, "Q4_K", 256, 144),
    t(13, "Q5_K", 256, 176),
    t(14, "Q6_K", 256, 210),
    t(15, "Q8_K", 256, 292),
    t(16, "IQ2_XXS", 256, 66),
    t(17, "IQ2_XS", 256, 74),
    t(18, "IQ3_XXS", 256, 98),
    t(19, "IQ1_S", 256, 50),
    t(20, "IQ4_NL", 32, 18),
    t(21, "IQ3_S", 256, 110),
    t(22, "IQ2_S", 256, 82),
    t(23, "IQ4_XS", 256, 136),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", 256, 56),
    t(30, "BF16", 1, 2),
    t(34, "TQ1_0", 256, 54),
    t(35, "TQ2_0", 256, 66),
    t(39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// The type of ggml id `id`, if ggml defines one.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES.iter().find(|g| g.id == id).copied()
    }

    /// The ggml type of a Tessera dtype.
    pub fn of(dtype: DType) -> Option<GgmlType> {
        GgmlType::from_id(dtype.ggml_id())
    }

    /// ggml's id.
    pub const fn id(self) -> u32 {
        self.id
    }

    /// ggml's upper-case name (`Q4_K`).
    pub const fn name(self) -> &'static str {
        self.name
    }

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        self.block_size
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        self.type_size
    }

    /// Tessera's dtype for this type, if Tessera has one.
    pub fn dtype(self) -> Option<DType> {
        DType::from_ggml_id(self.id)
    }

    /// Bytes of a tensor of `ne` elements per dimension, or `None` if `ne[0]` is not whole blocks
    /// or the size overflows.
    pub fn nbytes(self, ne: &[u64]) -> Option<u64> {
        let bs = self.block_size as u64;
        let ne0 = ne.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(bs) {
            return None;
        }
        let row = (ne0 / bs).checked_mul(self.type_size as u64)?;
        ne.iter()
            .skip(1)
            .try_fold(row, |acc, &n| acc.checked_mul(n))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// A display name for any ggml type id: the name, or `id N` when ggml has none.
pub fn ggml_type_name(id: u32) -> String {
    GgmlType::from_id(id).map_or_else(|| format!("id {id}"), |g| g.name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_has_matching_ggml_geometry() {
        for d in DType::ALL {
            let g = GgmlType::of(d).unwrap_or_else(|| panic!("{d} has no ggml type"));
            assert_eq!(g.name().to_lowercase(), d.name().to_lowercase(), "{d}");
            assert_eq!(g.block_size(), d.block_size(), "{d}");
            assert_eq!(g.type_size(), d.type_size(), "{d}");
            assert_eq!(g.dtype(), Some(d));
        }
    }

    #[test]
    fn names_sizes_and_unknown_ids() {
        assert_eq!(GgmlType::from_id(12).map(GgmlType::name), Some("Q4_K"));
        assert_eq!(
            GgmlType::from_id(12).and_then(GgmlType::dtype),
            Some(DType::Q4_K)
        );
        assert_eq!(
            GgmlType::from_id(10).and_then(GgmlType::dtype),
            Some(DType::Q2_K)
        );
        assert_eq!(
            GgmlType::from_id(39).and_then(GgmlType::dtype),
            Some(DType::MXFP4)
        );
        assert_eq!(GgmlType::from_id(16).and_then(GgmlType::dtype), None);
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
        assert_eq!(ggml_type_name(99), "id 99");
        let q8 = GgmlType::of(DType::Q8_0).unwrap();
        assert_eq!(q8.nbytes(&[64, 3]), Some(2 * 34 * 3));
        assert_eq!(q8.nbytes(&[33]), None);
        assert_eq!(q8.nbytes(&[32, u64::MAX]), None);
        assert_eq!(q8.nbytes(&[]), None);
    }
}
