//! Where the bytes of a packed row group go (the layout [`super::repack`] writes and the
//! packed x86 kernels read), apart from both so that neither reaches into the other.

use super::tile::WeightType;

/// Rows per interleaved group.
pub const PACK_ROWS: usize = 16;

/// Byte offsets of the parts of a packed K-quant group super-block:
/// (dmin, scales, high bits, quants).
pub(crate) const fn kquant_parts(wt: WeightType) -> (usize, usize, usize, usize) {
    let r = PACK_ROWS;
    match wt {
        // d, dmin, 12 scale bytes, 128 quant bytes per row.
        WeightType::Q4_K => (2 * r, 4 * r, 0, 16 * r),
        // d, dmin, 12 scale bytes, 32 high-bit bytes, 128 quant bytes per row.
        WeightType::Q5_K => (2 * r, 4 * r, 16 * r, 48 * r),
        // d, 16 scales, 128 low-bit bytes then 64 high-bit bytes per row.
        _ => (0, 2 * r, 18 * r + 128 * r, 18 * r),
    }
}

/// Byte offsets inside a packed group block: (minimums, fifth bits, quants).
pub(crate) const fn packed_offsets(wt: WeightType) -> (usize, usize, usize) {
    let d = 2 * PACK_ROWS;
    match wt {
        WeightType::Q4_1 => (d, 0, 2 * d),
        WeightType::Q5_0 => (0, d, d + 4 * PACK_ROWS),
        WeightType::Q5_1 => (d, 2 * d, 2 * d + 4 * PACK_ROWS),
        _ => (0, 0, d),
    }
}
