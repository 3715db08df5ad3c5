//! The CPU's repacked weight layouts ([`PackLayout`]): groups of rows whose blocks are
//! interleaved so that one vector instruction multiplies every row of the group.
//!
//! A weight's bytes in ggml's layout are row after row, block after block. Multiplying one row at
//! a time needs a horizontal sum per row and per-block scalar scale conversions, and at n = 1 that
//! made the Q8_0 output projection of Gemma 3 (262144 × 640) run at 17 GB/s on a core that streams
//! 37 GB/s. In a packed layout of `R` rows and `C`-byte chunks ([`PackLayout::rows`],
//! [`PackLayout::chunk`]), for each group of `R` rows and each 32-element block `b`:
//!
//! | bytes | holds |
//! |---|---|
//! | R × f16 | the rows' scales `d` |
//! | R × f16 | the rows' minimums `m` (Q4_1, Q5_1 only) |
//! | R × u32 | the rows' fifth bits, reordered on x86 (Q5_0, Q5_1 only): byte `j` holds bits `4j..4j+4` in its low nibble and bits `16+4j..16+4j+4` in its high nibble |
//! | the quants | chunk `j` holds bytes `Cj..Cj+C` of every row, row `r` at `Cr`, each byte XORed with `PackLayout::quant_xor` (x86 Q8_0: `q + 128`; aarch64 Q4_0: nibbles in two's complement) |
//!
//! so on x86 (16 rows × 4 bytes) a vector `vpdpbusd` against four broadcast activation bytes
//! gives sixteen rows' partial dots in sixteen lanes, on aarch64 dotprod (4 × 4) an `sdot` by
//! element gives four rows' in four lanes, and on aarch64 i8mm (4 × 8) an `smmla` multiplies two
//! rows' eight bytes with two columns'; a block's scales convert in one instruction.
//!
//! The K-quants (256-element super-blocks) are permuted byte for byte the same way: per group
//! super-block, the `R` `d` (f16), then the `R` `dmin` (Q4_K, Q5_K), then each byte of the scales
//! for all rows in turn (byte `t` of row `r` at `Rt + r`), then the fifth or high bits and the
//! quants in chunks of `C` bytes per row (see `kquant_offset`).
//!
//! Every group block has exactly the bytes of its `R` ggml blocks, so a packed tensor keeps its
//! size and each group its place; packing only moves bytes within a group (and XORs quant
//! bytes, and reorders Q5_0/Q5_1's fifth bits within each row's word).

use super::features::Isa;
pub use super::pack_layout::PackLayout;
use super::tile::{WeightType, act_row_bytes, act_type};

/// Elements per block of the 32-element packable types.
const QK: usize = 32;

fn is_kquant(wt: WeightType) -> bool {
    matches!(wt, WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K)
}

/// Where byte `i` of row `r`'s ggml super-block goes in the packed group super-block.
fn kquant_offset(layout: PackLayout, wt: WeightType, r: usize, i: usize) -> usize {
    let (rows, c) = (layout.rows(), layout.chunk());
    let (pm, psc, pqh, pqs) = layout.kquant_parts(wt);
    // `c` bytes of each row side by side: chunk `n` holds row bytes cn..cn+c.
    let chunked = |base: usize, j: usize| base + (j / c) * rows * c + c * r + j % c;
    match wt {
        WeightType::Q4_K | WeightType::Q5_K => match i {
            0..2 => 2 * r + i,
            2..4 => pm + 2 * r + i - 2,
            4..16 => psc + rows * (i - 4) + r,
            _ if wt == WeightType::Q5_K && i < 48 => chunked(pqh, i - 16),
            _ => chunked(pqs, i - if wt == WeightType::Q5_K { 48 } else { 16 }),
        },
        // Q6_K: only the 16 × 4 layout has it (`PackLayout::packs`).
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

fn check_group(layout: PackLayout, wt: WeightType, k: usize, a: usize, b: usize) {
    assert!(
        layout.packs(wt),
        "repack: {wt:?} has no {layout} packed layout"
    );
    assert!(
        k.is_multiple_of(block_elems(wt)),
        "repack: k = {k} is not a multiple of the {wt:?} block"
    );
    let n = layout.rows() * wt.row_bytes(k);
    assert!(
        a >= n && b >= n,
        "repack: a group of {wt:?} rows needs {n} bytes"
    );
}

/// One piece of the map between a row's ggml block and its place in the packed group block.
enum Piece {
    /// `n` bytes at `raw` in the row's block are at `grp` in the group block, XORed with `xor`.
    Bytes {
        raw: usize,
        grp: usize,
        n: usize,
        xor: u8,
    },
    /// Q5_0/Q5_1's fifth-bit word, reordered where the layout does ([`PackLayout::reorders_qh`]).
    FifthBits { raw: usize, grp: usize },
}

/// Calls `f` with every piece of row `r`'s block: packing and unpacking walk the one map, so
/// unpacking inverts packing by construction.
fn for_each_piece(layout: PackLayout, wt: WeightType, r: usize, mut f: impl FnMut(Piece)) {
    let byte = |raw, grp| Piece::Bytes {
        raw,
        grp,
        n: 1,
        xor: 0,
    };
    if is_kquant(wt) {
        for i in 0..block_bytes(wt) {
            f(byte(i, kquant_offset(layout, wt, r, i)));
        }
        return;
    }
    let (m_at, qh_at, qs_at) = block_offsets(wt);
    let (pm, pqh, pqs) = layout.packed_offsets(wt);
    let f16 = |raw, grp| Piece::Bytes {
        raw,
        grp,
        n: 2,
        xor: 0,
    };
    f(f16(0, 2 * r));
    if is_affine(wt) {
        f(f16(m_at, pm + 2 * r));
    }
    if has_qh(wt) {
        f(Piece::FifthBits {
            raw: qh_at,
            grp: pqh + 4 * r,
        });
    }
    let (rows, c, xor) = (layout.rows(), layout.chunk(), layout.quant_xor(wt));
    for j in 0..quant_bytes(wt) / c {
        f(Piece::Bytes {
            raw: qs_at + c * j,
            grp: pqs + rows * c * j + c * r,
            n: c,
            xor,
        });
    }
}

fn word(s: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]])
}

/// Copies piece `p` from `src` to `dst`: from the row's block into the group block when
/// `pack`, back otherwise.
fn move_piece(p: Piece, pack: bool, layout: PackLayout, src: &[u8], dst: &mut [u8]) {
    let ends = |raw: usize, grp: usize| if pack { (raw, grp) } else { (grp, raw) };
    match p {
        Piece::Bytes { raw, grp, n, xor } => {
            let (from, to) = ends(raw, grp);
            for i in 0..n {
                dst[to + i] = src[from + i] ^ xor;
            }
        }
        Piece::FifthBits { raw, grp } => {
            let (from, to) = ends(raw, grp);
            let q = word(src, from);
            let q = match (layout.reorders_qh(), pack) {
                (false, _) => q,
                (true, true) => reorder_qh(q),
                (true, false) => restore_qh(q),
            };
            dst[to..to + 4].copy_from_slice(&q.to_le_bytes());
        }
    }
}

/// Packs [`PackLayout::rows`] consecutive rows of `k` elements (`src`, ggml layout) into `dst`.
///
/// # Panics
/// If `layout` has no `wt` ([`PackLayout::packs`]), `k` is not a multiple of the block, or a
/// slice is shorter than a group.
pub fn pack_group(layout: PackLayout, wt: WeightType, k: usize, src: &[u8], dst: &mut [u8]) {
    check_group(layout, wt, k, src.len(), dst.len());
    let (bb, rb) = (block_bytes(wt), wt.row_bytes(k));
    let gb = layout.rows() * bb;
    for b in 0..k / block_elems(wt) {
        let grp = &mut dst[b * gb..(b + 1) * gb];
        for r in 0..layout.rows() {
            let raw = &src[r * rb + b * bb..r * rb + (b + 1) * bb];
            for_each_piece(layout, wt, r, |p| move_piece(p, true, layout, raw, grp));
        }
    }
}

/// Row `lane` of a packed group (`src`) in ggml layout, into `dst` (one row's bytes).
///
/// # Panics
/// As [`pack_group`], or if `lane ≥ layout.rows()` or `dst` is shorter than a row.
pub fn unpack_row(
    layout: PackLayout,
    wt: WeightType,
    k: usize,
    src: &[u8],
    lane: usize,
    dst: &mut [u8],
) {
    check_group(layout, wt, k, src.len(), layout.rows() * wt.row_bytes(k));
    assert!(lane < layout.rows() && dst.len() >= wt.row_bytes(k));
    let bb = block_bytes(wt);
    let gb = layout.rows() * bb;
    for b in 0..k / block_elems(wt) {
        let grp = &src[b * gb..(b + 1) * gb];
        let raw = &mut dst[b * bb..(b + 1) * bb];
        for_each_piece(layout, wt, lane, |p| move_piece(p, false, layout, grp, raw));
    }
}

/// Unpacks a group (`src`) back into [`PackLayout::rows`] rows of ggml layout (`dst`).
///
/// # Panics
/// As [`pack_group`].
pub fn unpack_group(layout: PackLayout, wt: WeightType, k: usize, src: &[u8], dst: &mut [u8]) {
    check_group(layout, wt, k, src.len(), dst.len());
    let rb = wt.row_bytes(k);
    for r in 0..layout.rows() {
        unpack_row(layout, wt, k, src, r, &mut dst[r * rb..(r + 1) * rb]);
    }
}

/// Whether `isa` runs `layout`'s own kernels (else [`mul_mat_tile_packed`] unpacks).
fn kernels_run(isa: Isa, layout: PackLayout) -> bool {
    match layout {
        PackLayout::Rows16x4 => cfg!(target_arch = "x86_64") && isa == Isa::Avx512,
        PackLayout::Rows4x4 | PackLayout::Rows4x8 => {
            cfg!(target_arch = "aarch64") && matches!(isa, Isa::Dotprod | Isa::I8mm)
        }
    }
}

/// Tile matmul over packed weights: `out[c * ldo + r] = Σ_i W[r][i] · X[c][i]` for `r < rows`,
/// `c < cols`, where `w` holds `rows / layout.rows()` consecutive packed groups and `x` the
/// activation columns in [`act_type`]`(wt)` form, column `c` at byte `c * x_stride` (as
/// [`crate::cpu::mul_mat_tile`]).
///
/// Runs the layout's own kernel when `isa` has it (AVX-512 VNNI for
/// [`PackLayout::Rows16x4`], dotprod or i8mm for the aarch64 layouts); otherwise unpacks each
/// group and runs the row kernels, so a packed weight is correct with every `isa`.
///
/// # Panics
/// If `rows` is not a multiple of the layout's rows, `layout` has no `wt`, or a slice is too
/// short.
#[allow(clippy::too_many_arguments)]
pub fn mul_mat_tile_packed(
    isa: Isa,
    layout: PackLayout,
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
        layout.packs(wt),
        "mul_mat_tile_packed: {wt:?} has no {layout} packed layout"
    );
    // Never run instructions the CPU lacks, whatever the caller asked for.
    let isa = isa.clamp_to_supported();
    let pr = layout.rows();
    assert!(
        rows.is_multiple_of(pr) && k.is_multiple_of(block_elems(wt)),
        "mul_mat_tile_packed: rows = {rows} must be a multiple of {pr} and k = {k} of the \
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
    if kernels_run(isa, layout) {
        #[cfg(target_arch = "x86_64")]
        {
            super::x86::packed::mul_mat_tile_packed(
                wt, w, rows, x, x_stride, cols, k, out, ldo, scratch,
            );
            return;
        }
        #[cfg(target_arch = "aarch64")]
        if super::arm::packed::mul_mat_tile_packed(
            isa, layout, wt, w, rows, x, x_stride, cols, k, out, ldo, scratch,
        ) {
            return;
        }
    }
    let mut rows_buf = vec![0u8; pr * rb];
    for g in 0..rows / pr {
        unpack_group(layout, wt, k, &w[g * pr * rb..], &mut rows_buf);
        super::matmul::mul_mat_tile_with_isa(
            isa,
            wt,
            &rows_buf,
            rb,
            pr,
            x,
            x_stride,
            cols,
            k,
            &mut out[g * pr..],
            ldo,
            scratch,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::matmul::tests::{encode_row, rand_vec};
    use crate::cpu::{ActType, mul_mat_tile_with_isa, prepare_act};

    /// `vals` as rows of `k` elements of `wt`, back to back.
    fn quantize(wt: WeightType, vals: &[f32], k: usize) -> Vec<u8> {
        vals.chunks_exact(k)
            .flat_map(|r| encode_row(wt, r).0)
            .collect()
    }

    /// `raw` (whole groups of `layout`) packed group by group.
    fn pack_all(layout: PackLayout, wt: WeightType, k: usize, raw: &[u8]) -> Vec<u8> {
        let gb = layout.rows() * wt.row_bytes(k);
        let mut packed = vec![0u8; raw.len()];
        for (s, d) in raw.chunks_exact(gb).zip(packed.chunks_exact_mut(gb)) {
            pack_group(layout, wt, k, s, d);
        }
        packed
    }

    /// The types each layout packs.
    fn packable(layout: PackLayout) -> &'static [WeightType] {
        use WeightType::*;
        match layout {
            PackLayout::Rows16x4 => &[Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K],
            PackLayout::Rows4x4 => &[Q8_0, Q4_0, IQ4_NL, Q4_K],
            PackLayout::Rows4x8 => &[Q8_0, Q4_0, IQ4_NL],
        }
    }

    /// Every packed type with every layout that has it.
    fn cases() -> impl Iterator<Item = (PackLayout, WeightType)> {
        PackLayout::ALL
            .into_iter()
            .flat_map(|l| packable(l).iter().map(move |&wt| (l, wt)))
    }

    #[test]
    fn only_the_packable_types_pack() {
        // Other types have no packed layout: weight buffers keep them as ggml lays them out.
        for layout in PackLayout::ALL {
            for wt in WeightType::ALL {
                assert_eq!(
                    layout.packs(wt),
                    packable(layout).contains(&wt),
                    "{layout} {wt:?}"
                );
            }
        }
    }

    #[test]
    fn each_level_picks_its_layout() {
        use WeightType::*;
        let pick = PackLayout::for_isa;
        for wt in WeightType::ALL {
            assert_eq!(pick(Isa::Scalar, wt), None, "{wt:?}");
            assert_eq!(pick(Isa::Neon, wt), None, "{wt:?}");
            assert_eq!(pick(Isa::Avx2, wt), None, "{wt:?}");
        }
        let (x86, arm) = (cfg!(target_arch = "x86_64"), cfg!(target_arch = "aarch64"));
        let want = |on: bool, l: PackLayout| on.then_some(l);
        assert_eq!(pick(Isa::Avx512, Q6_K), want(x86, PackLayout::Rows16x4));
        assert_eq!(pick(Isa::Avx512, IQ4_NL), None);
        assert_eq!(pick(Isa::Dotprod, IQ4_NL), want(arm, PackLayout::Rows4x4));
        assert_eq!(pick(Isa::Dotprod, Q4_K), want(arm, PackLayout::Rows4x4));
        assert_eq!(pick(Isa::Dotprod, Q6_K), None);
        assert_eq!(pick(Isa::I8mm, Q4_0), want(arm, PackLayout::Rows4x8));
        assert_eq!(pick(Isa::I8mm, Q4_K), want(arm, PackLayout::Rows4x4));
    }

    #[test]
    fn the_kquant_byte_map_is_a_permutation() {
        for (layout, wt) in cases().filter(|(_, wt)| is_kquant(*wt)) {
            let bb = block_bytes(wt);
            let mut seen = vec![false; layout.rows() * bb];
            for r in 0..layout.rows() {
                for i in 0..bb {
                    let o = kquant_offset(layout, wt, r, i);
                    assert!(
                        !seen[o],
                        "{layout} {wt:?}: row {r} byte {i} lands on a taken byte {o}"
                    );
                    seen[o] = true;
                }
            }
        }
    }

    #[test]
    fn pack_then_unpack_restores_every_byte_and_each_row() {
        for (layout, wt) in cases() {
            let k = 3 * block_elems(wt);
            // Varied magnitudes make every fifth bit and sign pattern occur.
            let vals: Vec<f32> = rand_vec(2 * layout.rows() * k, 5 + wt as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1 + i % 7) as f32)
                .collect();
            let raw = quantize(wt, &vals, k);
            let packed = pack_all(layout, wt, k, &raw);
            assert_ne!(packed, raw, "{layout} {wt:?}: packing must move bytes");
            let gb = layout.rows() * wt.row_bytes(k);
            let mut back = vec![0u8; raw.len()];
            for (s, d) in packed.chunks_exact(gb).zip(back.chunks_exact_mut(gb)) {
                unpack_group(layout, wt, k, s, d);
            }
            assert_eq!(back, raw, "{layout} {wt:?}");
            let rb = wt.row_bytes(k);
            let mut row = vec![0u8; rb];
            let lane = layout.rows() - 1;
            unpack_row(layout, wt, k, &packed[gb..], lane, &mut row);
            let at = (layout.rows() + lane) * rb;
            assert_eq!(row, raw[at..at + rb], "{layout} {wt:?} lane {lane}");
        }
    }

    /// Max-abs difference between `want` and `got`, and the largest `|want|`.
    fn max_err(want: &[f32], got: &[f32]) -> (f32, f32) {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = want
            .iter()
            .zip(got)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        (err, scale)
    }

    #[test]
    fn packed_tiles_match_the_row_kernels() {
        // Max-abs difference relative to the largest output, over every column count the
        // kernels specialise (1..=8), pairs and an odd one left, plus remainders: only the f32
        // summation order differs. Every level this CPU has runs: those with the layout's own
        // kernels, the others through the unpacking fallback.
        let levels: Vec<Isa> = Isa::ALL
            .iter()
            .copied()
            .filter(|l| l.is_supported())
            .collect();
        for (layout, wt) in cases() {
            let rows = 3 * layout.rows();
            let k = 2 * block_elems(wt) + if is_kquant(wt) { 0 } else { 96 };
            let raw = quantize(wt, &rand_vec(rows * k, 9 + wt as u64), k);
            let rb = wt.row_bytes(k);
            let packed = pack_all(layout, wt, k, &raw);
            let xr = act_row_bytes(act_type(wt), k);
            for cols in [1usize, 2, 3, 4, 5, 6, 7, 8, 11] {
                let mut x = vec![0u8; cols * xr];
                for c in 0..cols {
                    let v = rand_vec(k, 100 + c as u64);
                    prepare_act(act_type(wt), &v, &mut x[c * xr..(c + 1) * xr]);
                }
                let mut want = vec![0f32; rows * cols];
                let mut s = Vec::new();
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
                for &isa in &levels {
                    let mut got = vec![f32::NAN; rows * cols];
                    mul_mat_tile_packed(
                        isa, layout, wt, &packed, rows, &x, xr, cols, k, &mut got, rows, &mut s,
                    );
                    let (err, scale) = max_err(&want, &got);
                    assert!(
                        err <= 1e-5 * scale,
                        "{layout} {wt:?} {isa} cols {cols}: max-abs {err} vs scale {scale}"
                    );
                }
            }
        }
    }

    #[test]
    fn packed_tiles_agree_with_ggml() {
        // ggml's recorded vec_dot results (kquant_golden, lowbit_golden): a group whose rows are
        // the golden weights of distributions 0, 1, 1, 0, … (so that row pairs differ), times the golden activations of
        // distributions 1..=3, on every level; within 1e-5 of the dot's magnitude (Σ|w·a|), as
        // the row kernels' golden tests.
        use crate::cpu::kquant_golden::{GOLDEN_DOT as K_DOTS, N, golden_input};
        use crate::cpu::lowbit_golden::GOLDEN_DOT as LOW_DOTS;
        let golden = |name: &str, dw: u32, da: u32| {
            K_DOTS
                .iter()
                .chain(LOW_DOTS)
                .find(|g| g.0 == name && g.1 == dw && g.2 == da)
                .map(|g| f32::from_bits(g.3))
        };
        let levels: Vec<Isa> = Isa::ALL
            .iter()
            .copied()
            .filter(|l| l.is_supported())
            .collect();
        let mut checked = 0;
        for (layout, wt) in cases() {
            let name = match wt {
                WeightType::IQ4_NL => "iq4_nl",
                WeightType::Q4_K => "q4_K",
                WeightType::Q5_K => "q5_K",
                WeightType::Q6_K => "q6_K",
                WeightType::Q5_0 => "q5_0",
                WeightType::Q4_1 => "q4_1",
                WeightType::Q5_1 => "q5_1",
                // No ggml dot recorded for Q8_0 and Q4_0: the row-kernel test covers them.
                _ => continue,
            };
            let rows = layout.rows();
            // Row r has distribution dist(r), with the values its bytes decode to.
            let dist = |r: usize| (r + r / 2) % 2;
            let enc: Vec<(Vec<u8>, Vec<f32>)> =
                (0..2).map(|d| encode_row(wt, &golden_input(d))).collect();
            let raw: Vec<u8> = (0..rows).flat_map(|r| enc[dist(r)].0.clone()).collect();
            let packed = pack_all(layout, wt, N, &raw);
            let (act, xr) = (act_type(wt), act_row_bytes(act_type(wt), N));
            let mut x = vec![0u8; 3 * xr];
            let mut af = vec![vec![0f32; N]; 3];
            for c in 0..3 {
                let col = &mut x[c * xr..(c + 1) * xr];
                prepare_act(act, &golden_input(c as u32 + 1), col);
                match act {
                    ActType::Q8_0 => crate::cpu::dequantize_row_q8_0(col, &mut af[c]),
                    ActType::Q8_1 => crate::cpu::dequantize_row_q8_1(col, &mut af[c]),
                    _ => crate::cpu::dequantize_row_q8_k(col, &mut af[c]),
                }
            }
            for &isa in &levels {
                let mut got = vec![f32::NAN; rows * 3];
                let mut s = Vec::new();
                mul_mat_tile_packed(
                    isa, layout, wt, &packed, rows, &x, xr, 3, N, &mut got, rows, &mut s,
                );
                for r in 0..rows {
                    for c in 0..3 {
                        let Some(want) = golden(name, dist(r) as u32, c as u32 + 1) else {
                            panic!("no golden dot for {name}");
                        };
                        // Scale of the f32 rounding: Σ|w_i a_i| over the decoded operands.
                        let mag: f64 = enc[dist(r)]
                            .1
                            .iter()
                            .zip(&af[c])
                            .map(|(w, a)| (f64::from(*w) * f64::from(*a)).abs())
                            .sum();
                        let v = got[c * rows + r];
                        assert!(
                            f64::from(v - want).abs() <= 1e-5 * mag,
                            "{layout} {wt:?} {isa} row {r} col {c}: {v} vs ggml {want} \
                             (magnitude {mag})"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 0);
    }
}
