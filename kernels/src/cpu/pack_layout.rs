//! The repacked weight layouts: how many rows a group interleaves, how many bytes of each row sit
//! side by side, and where the parts of a group block go. Apart from [`super::repack`] (which
//! writes them) and the packed kernels (which read them), so that neither reaches into the
//! other.

use super::features::Isa;
use super::tile::WeightType;

/// A repacked weight layout: groups of [`rows`](Self::rows) rows whose blocks are interleaved in
/// chunks of [`chunk`](Self::chunk) bytes per row, so that one vector instruction multiplies
/// every row of the group (see [`super::repack`] for the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PackLayout {
    /// x86-64 AVX-512 VNNI: 16 rows, 4 bytes each side by side (one `vpdpbusd` makes sixteen
    /// rows' partial dots); Q8_0 stored as `q + 128`, Q5_0/Q5_1's fifth bits reordered.
    Rows16x4,
    /// aarch64 dotprod: 4 rows, 4 bytes each side by side (one `sdot` against four broadcast
    /// activation bytes makes four rows' partial dots, as ggml's `block_q4_0x4` with
    /// `blck_size_interleave` 4); Q4_0's nibbles stored as two's complement (`^ 0x88`).
    Rows4x4,
    /// aarch64 i8mm: 4 rows, 8 bytes each side by side (one `smmla` multiplies two rows' eight
    /// bytes with two columns', as ggml's `block_q4_0x4` with `blck_size_interleave` 8); Q4_0's
    /// nibbles stored as two's complement (`^ 0x88`).
    Rows4x8,
}

impl PackLayout {
    /// Every layout.
    pub const ALL: [PackLayout; 3] = [
        PackLayout::Rows16x4,
        PackLayout::Rows4x4,
        PackLayout::Rows4x8,
    ];

    /// Rows per interleaved group.
    pub const fn rows(self) -> usize {
        match self {
            PackLayout::Rows16x4 => 16,
            PackLayout::Rows4x4 | PackLayout::Rows4x8 => 4,
        }
    }

    /// Bytes of each row side by side in a chunk.
    pub const fn chunk(self) -> usize {
        match self {
            PackLayout::Rows16x4 | PackLayout::Rows4x4 => 4,
            PackLayout::Rows4x8 => 8,
        }
    }

    /// Whether weights of type `wt` have this layout.
    pub const fn packs(self, wt: WeightType) -> bool {
        match self {
            PackLayout::Rows16x4 => matches!(
                wt,
                WeightType::Q8_0
                    | WeightType::Q4_0
                    | WeightType::Q5_0
                    | WeightType::Q4_1
                    | WeightType::Q5_1
                    | WeightType::Q4_K
                    | WeightType::Q5_K
                    | WeightType::Q6_K
            ),
            PackLayout::Rows4x4 => matches!(
                wt,
                WeightType::Q8_0 | WeightType::Q4_0 | WeightType::IQ4_NL | WeightType::Q4_K
            ),
            PackLayout::Rows4x8 => {
                matches!(wt, WeightType::Q8_0 | WeightType::Q4_0 | WeightType::IQ4_NL)
            }
        }
    }

    /// The layout weight buffers store `wt` in when the kernels run at level `isa`, or `None`
    /// where the row kernels are as fast: AVX-512 VNNI packs into [`Rows16x4`](Self::Rows16x4);
    /// dotprod into [`Rows4x4`](Self::Rows4x4); i8mm into [`Rows4x8`](Self::Rows4x8), whose
    /// `smmla` GEMM has no Q4_K kernel, so Q4_K stays [`Rows4x4`](Self::Rows4x4) there. AVX2 and
    /// plain NEON keep ggml's layout (the docs' CPU chapter says why).
    pub fn for_isa(isa: Isa, wt: WeightType) -> Option<PackLayout> {
        let candidates: &[PackLayout] = match isa {
            Isa::Avx512 if cfg!(target_arch = "x86_64") => &[PackLayout::Rows16x4],
            Isa::Dotprod if cfg!(target_arch = "aarch64") => &[PackLayout::Rows4x4],
            Isa::I8mm if cfg!(target_arch = "aarch64") => {
                &[PackLayout::Rows4x8, PackLayout::Rows4x4]
            }
            _ => &[],
        };
        candidates.iter().copied().find(|l| l.packs(wt))
    }

    /// XOR applied to every quant byte: x86 stores Q8_0 as `q + 128` (`vpdpbusd`'s unsigned
    /// operand); aarch64 stores Q4_0's nibbles as two's complement, so that a shift or a mask
    /// yields `16 · level` as a signed byte (no subtraction), as ggml's aarch64 repack does.
    pub(crate) const fn quant_xor(self, wt: WeightType) -> u8 {
        match (self, wt) {
            (PackLayout::Rows16x4, WeightType::Q8_0) => 0x80,
            (PackLayout::Rows4x4 | PackLayout::Rows4x8, WeightType::Q4_0) => 0x88,
            _ => 0,
        }
    }

    /// Whether Q5_0/Q5_1's fifth bits are reordered (see [`super::repack`]).
    pub(crate) const fn reorders_qh(self) -> bool {
        matches!(self, PackLayout::Rows16x4)
    }

    /// Byte offsets of the parts of a packed K-quant group super-block:
    /// (dmin, scales, high bits, quants).
    pub(crate) const fn kquant_parts(self, wt: WeightType) -> (usize, usize, usize, usize) {
        let r = self.rows();
        match wt {
            // d, dmin, 12 scale bytes, 128 quant bytes per row.
            WeightType::Q4_K => (2 * r, 4 * r, 0, 16 * r),
            // d, dmin, 12 scale bytes, 32 high-bit bytes, 128 quant bytes per row.
            WeightType::Q5_K => (2 * r, 4 * r, 16 * r, 48 * r),
            // d, 16 scales, 128 low-bit bytes then 64 high-bit bytes per row.
            _ => (0, 2 * r, 18 * r + 128 * r, 18 * r),
        }
    }

    /// Byte offsets inside a packed group block of a 32-element type: (minimums, fifth bits,
    /// quants).
    pub(crate) const fn packed_offsets(self, wt: WeightType) -> (usize, usize, usize) {
        let r = self.rows();
        let d = 2 * r;
        match wt {
            WeightType::Q4_1 => (d, 0, 2 * d),
            WeightType::Q5_0 => (0, d, d + 4 * r),
            WeightType::Q5_1 => (d, 2 * d, 2 * d + 4 * r),
            _ => (0, 0, d),
        }
    }
}

impl std::fmt::Display for PackLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (r, c) = (self.rows(), self.chunk());
        write!(f, "{r} rows × {c} bytes")
    }
}
