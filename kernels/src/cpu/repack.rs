//! The CPU's repacked weight layout: groups of [`PACK_ROWS`] rows whose blocks are interleaved so
//! that one 512-bit load holds four quants of every row of the group.
//!
//! A weight's bytes in ggml's layout are row after row, block after block. Multiplying one row at
//! a time needs a horizontal sum per row and per-block scalar scale conversions, and at n = 1 that
//! made the Q8_0 output projection of Gemma 3 (262144 × 640) run at 17 GB/s on a core that streams
//! 37 GB/s. In the packed layout, for each group of 16 rows and each 32-element block `b`:
//!
//! | bytes | holds |
//! |---|---|
//! | 16 × f16 | the rows' scales `d` |
//! | 16 × f16 | the rows' minimums `m` (Q4_1, Q5_1 only) |
//! | 16 × u32 | the rows' fifth bits, reordered (Q5_0, Q5_1 only): byte `j` holds bits `4j..4j+4` in its low nibble and bits `16+4j..16+4j+4` in its high nibble |
//! | 8 × 64 or 4 × 64 | the quants: chunk `j` holds bytes `4j..4j+4` of every row, row `r` at `4r` (Q8_0: element `4j+e` as `q + 128`; the nibble kinds: the block's nibble bytes `4j..4j+4` as stored) |
//!
//! so a vector `vpdpbusd` against four broadcast activation bytes gives sixteen rows' partial dots
//! in sixteen lanes, and a block's sixteen scales convert in one instruction.
//!
//! The K-quants (256-element super-blocks) are permuted byte for byte the same way: per group
//! super-block, the sixteen `d` (f16), then the sixteen `dmin` (Q4_K, Q5_K), then each byte of
//! the scales for all sixteen rows in turn (byte `t` of row `r` at `16t + r`), then the fifth or
//! high bits and the quants in 64-byte chunks of four bytes per row (see `kquant_offset`).
//!
//! Every group block has exactly the bytes of its sixteen ggml blocks, so a packed tensor keeps
//! its size and each group its place; packing only moves bytes within a group (and flips Q8_0's
//! sign bits, and reorders Q5_0/Q5_1's fifth bits within each row's word).

use super::features::Isa;
pub use super::pack_layout::PACK_ROWS;
use super::pack_layout::{kquant_parts, packed_offsets};
use super::tile::{WeightType, act_row_bytes, act_type};

/// Elements per block of the 32-element packable types.
const QK: usize = 32;

/// Whether `wt` has a packed layout.
pub fn can_pack(wt: WeightType) -> bool {
    matches!(
        wt,
        WeightType::Q8_0
            | WeightType::Q4_0
            | WeightType::Q5_0
            | WeightType::Q4_1
            | WeightType::Q5_1
            | WeightType::Q4_K
            | WeightType::Q5_K
            | WeightType::Q6_K
    )
}

fn is_kquant(wt: WeightType) -> bool {
    matches!(wt, WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K)
}

/// Where byte `i` of row `r`'s ggml super-block goes in the packed group super-block.
fn kquant_offset(wt: WeightType, r: usize, i: usize) -> usize {
    let (pm, psc, pqh, pqs) = kquant_parts(wt);
    // Four bytes of each row side by side: chunk `c` of 64 bytes holds row bytes 4c..4c+4.
    let chunked = |base: usize, j: usize| base + (j / 4) * 64 + 4 * r + j % 4;
    match wt {
        WeightType::Q4_K | WeightType::Q5_K => match i {
            0..2 => 2 * r + i,
            2..4 => pm + 2 * r + i - 2,
            4..16 => psc + 16 * (i - 4) + r,
            _ if wt == WeightType::Q5_K && i < 48 => chunked(pqh, i - 16),
            _ => chunked(pqs, i - if wt == WeightType::Q5_K { 48 } else { 16 }),
        },
        _ => match i {
            // ql: half n, part p (bytes 4p..4p+4), first or second 32 bytes: chunk (n·8+p)·2+ab.
            0..128 => {
                let (n, ab, j) = (i / 64, (i % 64) / 32, i % 32);
                pqs + ((n * 8 + j / 4) * 2 + ab) * 64 + 4 * r + j % 4
            }
            128..192 => chunked(pqh, i - 128),
            192..208 => psc + 16 * (i - 192) + r,
            _ => 2 * r + i - 208,
        },
    }
}

/// Elements per block of a packable type.
fn block_elems(wt: WeightType) -> usize {
    if is_kquant(wt) { 256 } else { QK }
}

/// Whether the packed kernels are faster than the row kernels with `isa`: they need AVX-512 VNNI.
pub fn packing_pays(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa == Isa::Avx512
}

/// Byte offsets inside a ggml block: (minimum, fifth bits, quants).
fn block_offsets(wt: WeightType) -> (usize, usize, usize) {
    match wt {
        WeightType::Q4_1 => (2, 0, 4),
        WeightType::Q5_0 => (0, 2, 6),
        WeightType::Q5_1 => (2, 4, 8),
        _ => (0, 0, 2),
    }
}

fn block_bytes(wt: WeightType) -> usize {
    wt.row_bytes(block_elems(wt))
}

fn is_affine(wt: WeightType) -> bool {
    matches!(wt, WeightType::Q4_1 | WeightType::Q5_1)
}

fn has_qh(wt: WeightType) -> bool {
    matches!(wt, WeightType::Q5_0 | WeightType::Q5_1)
}

/// Quant bytes per block (Q8_0: 32, the nibble kinds: 16).
fn quant_bytes(wt: WeightType) -> usize {
    if wt == WeightType::Q8_0 { 32 } else { 16 }
}

/// ggml's fifth bits `qh` → the packed order (byte `j`: bits `4j..4j+4`, then `16+4j..16+4j+4`).
fn reorder_qh(qh: u32) -> u32 {
    (0..4).fold(0, |acc, j| {
        let lo = (qh >> (4 * j)) & 0xF;
        let hi = (qh >> (16 + 4 * j)) & 0xF;
        acc | ((lo | hi << 4) << (8 * j))
    })
}

fn restore_qh(p: u32) -> u32 {
    (0..4).fold(0, |acc, j| {
        let byte = (p >> (8 * j)) & 0xFF;
        acc | (byte & 0xF) << (4 * j) | (byte >> 4) << (16 + 4 * j)
    })
}

fn check_group(wt: WeightType, k: usize, a: usize, b: usize) {
    assert!(can_pack(wt), "repack: {wt:?} has no packed layout");
    assert!(
        k.is_multiple_of(block_elems(wt)),
        "repack: k = {k} is not a multiple of the {wt:?} block"
    );
    let n = PACK_ROWS * wt.row_bytes(k);
    assert!(
        a >= n && b >= n,
        "repack: a group of {wt:?} rows needs {n} bytes"
    );
}

/// Packs [`PACK_ROWS`] consecutive rows of `k` elements (`src`, ggml layout) into `dst`.
///
/// # Panics
/// If `wt` cannot be packed, `k` is not a multiple of 32, or a slice is shorter than a group.
pub fn pack_group(wt: WeightType, k: usize, src: &[u8], dst: &mut [u8]) {
    check_group(wt, k, src.len(), dst.len());
    let (bb, rb, gb) = (
        block_bytes(wt),
        wt.row_bytes(k),
        PACK_ROWS * block_bytes(wt),
    );
    if is_kquant(wt) {
        for b in 0..k / 256 {
            for r in 0..PACK_ROWS {
                for i in 0..bb {
                    dst[b * gb + kquant_offset(wt, r, i)] = src[r * rb + b * bb + i];
                }
            }
        }
        return;
    }
    let (m_at, qh_at, qs_at) = block_offsets(wt);
    let (pm, pqh, pqs) = packed_offsets(wt);
    let flip = if wt == WeightType::Q8_0 { 0x80 } else { 0 };
    for b in 0..k / QK {
        let out = &mut dst[b * gb..(b + 1) * gb];
        for r in 0..PACK_ROWS {
            let s = &src[r * rb + b * bb..r * rb + (b + 1) * bb];
            out[2 * r..2 * r + 2].copy_from_slice(&s[..2]);
            if is_affine(wt) {
                out[pm + 2 * r..pm + 2 * r + 2].copy_from_slice(&s[m_at..m_at + 2]);
            }
            if has_qh(wt) {
                let qh = u32::from_le_bytes([s[qh_at], s[qh_at + 1], s[qh_at + 2], s[qh_at + 3]]);
                out[pqh + 4 * r..pqh + 4 * r + 4].copy_from_slice(&reorder_qh(qh).to_le_bytes());
            }
            for j in 0..quant_bytes(wt) / 4 {
                for e in 0..4 {
                    out[pqs + 64 * j + 4 * r + e] = s[qs_at + 4 * j + e] ^ flip;
                }
            }
        }
    }
}

/// Row `lane` of a packed group (`src`) in ggml layout, into `dst` (one row's bytes).
///
/// # Panics
/// As [`pack_group`], or if `lane ≥ PACK_ROWS` or `dst` is shorter than a row.
pub fn unpack_row(wt: WeightType, k: usize, src: &[u8], lane: usize, dst: &mut [u8]) {
    check_group(wt, k, src.len(), PACK_ROWS * wt.row_bytes(k));
    assert!(lane < PACK_ROWS && dst.len() >= wt.row_bytes(k));
    let (bb, gb) = (block_bytes(wt), PACK_ROWS * block_bytes(wt));
    if is_kquant(wt) {
        for b in 0..k / 256 {
            for i in 0..bb {
                dst[b * bb + i] = src[b * gb + kquant_offset(wt, lane, i)];
            }
        }
        return;
    }
    let (m_at, qh_at, qs_at) = block_offsets(wt);
    let (pm, pqh, pqs) = packed_offsets(wt);
    let flip = if wt == WeightType::Q8_0 { 0x80 } else { 0 };
    let r = lane;
    for b in 0..k / QK {
        let g = &src[b * gb..(b + 1) * gb];
        let d = &mut dst[b * bb..(b + 1) * bb];
        d[..2].copy_from_slice(&g[2 * r..2 * r + 2]);
        if is_affine(wt) {
            d[m_at..m_at + 2].copy_from_slice(&g[pm + 2 * r..pm + 2 * r + 2]);
        }
        if has_qh(wt) {
            let p = u32::from_le_bytes([
                g[pqh + 4 * r],
                g[pqh + 4 * r + 1],
                g[pqh + 4 * r + 2],
                g[pqh + 4 * r + 3],
            ]);
            d[qh_at..qh_at + 4].copy_from_slice(&restore_qh(p).to_le_bytes());
        }
        for j in 0..quant_bytes(wt) / 4 {
            for e in 0..4 {
                d[qs_at + 4 * j + e] = g[pqs + 64 * j + 4 * r + e] ^ flip;
            }
        }
    }
}

/// Unpacks a group (`src`) back into [`PACK_ROWS`] rows of ggml layout (`dst`).
///
/// # Panics
/// As [`pack_group`].
pub fn unpack_group(wt: WeightType, k: usize, src: &[u8], dst: &mut [u8]) {
    check_group(wt, k, src.len(), dst.len());
    let rb = wt.row_bytes(k);
    for r in 0..PACK_ROWS {
        unpack_row(wt, k, src, r, &mut dst[r * rb..(r + 1) * rb]);
    }
}

/// Tile matmul over packed weights: `out[c * ldo + r] = Σ_i W[r][i] · X[c][i]` for `r < rows`,
/// `c < cols`, where `w` holds `rows / PACK_ROWS` consecutive packed groups and `x` the activation
/// columns in [`act_type`]`(wt)` form, column `c` at byte `c * x_stride` (as
/// [`crate::cpu::mul_mat_tile`]).
///
/// Runs the AVX-512 VNNI kernel when `isa` allows it ([`packing_pays`]); otherwise unpacks each
/// group and runs the row kernels, so a packed weight is correct with every `isa`.
///
/// # Panics
/// If `rows` is not a multiple of [`PACK_ROWS`], `wt` cannot be packed, or a slice is too short.
#[allow(clippy::too_many_arguments)]
pub fn mul_mat_tile_packed(
    isa: Isa,
    wt: WeightType,
    w: &[u8],
    rows: usize,
    x: &[u8],
    x_stride: usize,
    cols: usize,
    k: usize,
    out: &mut [f32],
    ldo: usize,
    scratch: &mut Vec<u8>,
) {
    assert!(
        can_pack(wt),
        "mul_mat_tile_packed: {wt:?} has no packed layout"
    );
    // Never run instructions the CPU lacks, whatever the caller asked for.
    let isa = isa.clamp_to_supported();
    assert!(
        rows.is_multiple_of(PACK_ROWS) && k.is_multiple_of(block_elems(wt)),
        "mul_mat_tile_packed: rows = {rows} must be a multiple of {PACK_ROWS} and k = {k} of the \
         {wt:?} block"
    );
    if rows == 0 || cols == 0 {
        return;
    }
    let rb = wt.row_bytes(k);
    assert!(w.len() >= rows * rb, "mul_mat_tile_packed: w too short");
    let xrow = act_row_bytes(act_type(wt), k);
    assert!(
        cols == 1 || x_stride >= xrow,
        "mul_mat_tile_packed: x_stride too small"
    );
    assert!(
        (cols - 1) * x_stride + xrow <= x.len(),
        "mul_mat_tile_packed: x too short"
    );
    assert!(
        (cols == 1 || ldo >= rows) && (cols - 1) * ldo + rows <= out.len(),
        "mul_mat_tile_packed: out too short"
    );
    #[cfg(target_arch = "x86_64")]
    if packing_pays(isa) {
        super::x86::packed::mul_mat_tile_packed(
            wt, w, rows, x, x_stride, cols, k, out, ldo, scratch,
        );
        return;
    }
    let mut rows_buf = vec![0u8; PACK_ROWS * rb];
    for g in 0..rows / PACK_ROWS {
        unpack_group(wt, k, &w[g * PACK_ROWS * rb..], &mut rows_buf);
        super::matmul::mul_mat_tile_with_isa(
            isa,
            wt,
            &rows_buf,
            rb,
            PACK_ROWS,
            x,
            x_stride,
            cols,
            k,
            &mut out[g * PACK_ROWS..],
            ldo,
            scratch,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::matmul::tests::{encode_row, rand_vec};
    use crate::cpu::{active_isa, mul_mat_tile_with_isa, prepare_act};

    /// `vals` as rows of `k` elements of `wt`, back to back.
    fn quantize(wt: WeightType, vals: &[f32], k: usize) -> Vec<u8> {
        vals.chunks_exact(k)
            .flat_map(|r| encode_row(wt, r).0)
            .collect()
    }

    const PACKABLE: [WeightType; 8] = [
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q5_0,
        WeightType::Q4_1,
        WeightType::Q5_1,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ];

    #[test]
    fn only_the_packable_types_pack() {
        // Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 have no packed layout: weight buffers keep them
        // as ggml lays them out.
        for wt in WeightType::ALL {
            assert_eq!(can_pack(wt), PACKABLE.contains(&wt), "{wt:?}");
        }
    }

    #[test]
    fn the_kquant_byte_map_is_a_permutation() {
        for wt in [WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K] {
            let bb = block_bytes(wt);
            let mut seen = vec![false; PACK_ROWS * bb];
            for r in 0..PACK_ROWS {
                for i in 0..bb {
                    let o = kquant_offset(wt, r, i);
                    assert!(
                        !seen[o],
                        "{wt:?}: row {r} byte {i} lands on a taken byte {o}"
                    );
                    seen[o] = true;
                }
            }
        }
    }

    #[test]
    fn pack_then_unpack_restores_every_byte_and_each_row() {
        for wt in PACKABLE {
            let k = 3 * block_elems(wt);
            // Varied magnitudes make every fifth bit and sign pattern occur.
            let vals: Vec<f32> = rand_vec(PACK_ROWS * k, 5 + wt as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1 + i % 7) as f32)
                .collect();
            let raw = quantize(wt, &vals, k);
            let mut packed = vec![0u8; raw.len()];
            pack_group(wt, k, &raw, &mut packed);
            assert_ne!(packed, raw, "{wt:?}: packing must move bytes");
            let mut back = vec![0u8; raw.len()];
            unpack_group(wt, k, &packed, &mut back);
            assert_eq!(back, raw, "{wt:?}");
            let rb = wt.row_bytes(k);
            let mut row = vec![0u8; rb];
            unpack_row(wt, k, &packed, 11, &mut row);
            assert_eq!(row, raw[11 * rb..12 * rb], "{wt:?}");
        }
    }

    #[test]
    fn packed_tiles_match_the_row_kernels() {
        // Max-abs difference relative to the largest output, over every column count the kernel
        // specialises (1..=8) plus a remainder: only the f32 summation order differs.
        let rows = 48;
        for wt in PACKABLE {
            let k = 2 * block_elems(wt) + if is_kquant(wt) { 0 } else { 96 };
            let raw = quantize(wt, &rand_vec(rows * k, 9 + wt as u64), k);
            let rb = wt.row_bytes(k);
            let mut packed = vec![0u8; raw.len()];
            for g in 0..rows / PACK_ROWS {
                let r = g * PACK_ROWS * rb..(g + 1) * PACK_ROWS * rb;
                pack_group(wt, k, &raw[r.clone()], &mut packed[r]);
            }
            let xr = act_row_bytes(act_type(wt), k);
            for cols in [1usize, 2, 3, 5, 8, 11] {
                let mut x = vec![0u8; cols * xr];
                for c in 0..cols {
                    let v = rand_vec(k, 100 + c as u64);
                    prepare_act(act_type(wt), &v, &mut x[c * xr..(c + 1) * xr]);
                }
                let mut want = vec![0f32; rows * cols];
                let mut got = vec![0f32; rows * cols];
                let mut s = Vec::new();
                let isa = active_isa();
                mul_mat_tile_with_isa(
                    Isa::Scalar,
                    wt,
                    &raw,
                    rb,
                    rows,
                    &x,
                    xr,
                    cols,
                    k,
                    &mut want,
                    rows,
                    &mut s,
                );
                for test_isa in [isa, Isa::Scalar] {
                    mul_mat_tile_packed(
                        test_isa, wt, &packed, rows, &x, xr, cols, k, &mut got, rows, &mut s,
                    );
                    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let err = want
                        .iter()
                        .zip(&got)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        err <= 1e-5 * scale,
                        "{wt:?} {test_isa} cols {cols}: max-abs {err} vs scale {scale}"
                    );
                }
            }
        }
    }
}
