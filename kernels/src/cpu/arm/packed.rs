//! dotprod and i8mm kernels over the aarch64 packed layouts of [`crate::cpu::repack`]: four rows
//! per group, whose block scales convert in one `fcvtl` and whose dots land in the four lanes of
//! one vector, so no row needs a horizontal sum or a scalar scale conversion.
//!
//! * [`PackLayout::Rows4x4`]: `sdot` by element, each vector (four bytes of four rows) against
//!   one four-byte lane of an activation vector, so one activation load serves four `sdot`s;
//! * [`PackLayout::Rows4x8`]: with i8mm, `smmla` for two rows × two columns of eight bytes per
//!   instruction, the activation columns interleaved in pairs once per tile (as ggml's
//!   `block_q8_0x4`) so the block loop only loads them; one column at a time, `sdot` against
//!   eight activation bytes in both halves, each row's two partial lanes added pairwise once per
//!   block.
//!
//! Q4_0's nibbles are stored in two's complement ([`PackLayout::quant_xor`]): `shl #4` and a
//! `0xF0` mask give `16 · level`, and the conversion to f32 divides by 16 for free (`scvtf` with
//! four fraction bits), as ggml's aarch64 repack kernels do.
// Column and pair loops index several fixed-size arrays in step; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::neon::{
    B_IQ4_NL, B_Q4_0, B_Q8_0, block_bytes, f16_at, f16x4_at, sdot, sdot_lane, smmla,
};
use crate::cpu::features::Isa;
use crate::cpu::generic::f16_bits_to_f32;
use crate::cpu::iquant::KVALUES_IQ4NL;
use crate::cpu::pack_layout::PackLayout;
use crate::cpu::tile::WeightType;

/// Rows per group in both aarch64 layouts.
const ROWS: usize = 4;
/// Bytes per Q8_0 activation block.
const ACT: usize = 34;
/// Bytes per Q8_K activation super-block: `d` (f32), 256 quants, 16 group sums (i16).
const ACT_K: usize = 292;
/// Bytes per Q4_K group super-block (four rows of 144).
const Q4K_GROUP: usize = ROWS * 144;
/// Columns one `sdot` kernel call handles: the block's levels are decoded once for all of them
/// (more would spill the 32 vector registers).
const MAX_COLS: usize = 4;
/// Column pairs one `smmla` kernel call handles.
const MAX_PAIRS: usize = 2;
/// Bytes per block of an interleaved column pair: the two columns' quants in eight-byte pieces
/// (`a[0..8]`, `b[0..8]`, `a[8..16]`, …, the order `smmla` multiplies them in), then the scales
/// `[da, db, da, db]` as f32.
const PAIR_BLOCK: usize = 80;

/// How a 32-element kernel pairs the levels with the activations.
const PATH_LANE: u8 = 0;
/// [`PackLayout::Rows4x8`] one column at a time: `sdot` against duplicated eight-byte halves.
const PATH_HALVES: u8 = 1;

/// Expands `$call!(k)` for the column count `$n` among the listed literals, the last one also
/// taking anything larger (the kernels take the column count as a const parameter).
macro_rules! with_cols {
    ($n:expr; $($k:literal),*; $last:literal; $call:ident) => {
        match $n {
            $($k => $call!($k),)*
            _ => $call!($last),
        }
    };
}

/// Runs the packed kernel of `layout` for `wt` and returns true, or returns false where there
/// is none (the caller then unpacks). `isa` is the supported level (dotprod or i8mm); the
/// arguments were checked by [`crate::cpu::repack::mul_mat_tile_packed`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_mat_tile_packed(
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
) -> bool {
    if !matches!(isa, Isa::Dotprod | Isa::I8mm) || !layout.packs(wt) {
        return false;
    }
    let t = Tile {
        w,
        rows,
        x,
        x_stride,
        cols,
        k,
    };
    let mm = layout == PackLayout::Rows4x8 && isa == Isa::I8mm;
    match wt {
        WeightType::Q4_K if layout == PackLayout::Rows4x4 => tile_q4k(&t, out, ldo),
        WeightType::Q8_0 => tile32_in::<B_Q8_0>(layout, &t, mm, out, ldo, scratch),
        WeightType::Q4_0 => tile32_in::<B_Q4_0>(layout, &t, mm, out, ldo, scratch),
        WeightType::IQ4_NL => tile32_in::<B_IQ4_NL>(layout, &t, mm, out, ldo, scratch),
        _ => return false,
    }
    true
}

/// [`tile32`] with the path `layout`'s chunks take.
fn tile32_in<const KIND: u8>(
    layout: PackLayout,
    t: &Tile,
    mm: bool,
    out: &mut [f32],
    ldo: usize,
    scratch: &mut Vec<u8>,
) {
    if layout == PackLayout::Rows4x4 {
        tile32::<KIND, PATH_LANE>(t, false, out, ldo, scratch)
    } else {
        tile32::<KIND, PATH_HALVES>(t, mm, out, ldo, scratch)
    }
}

/// The operands of one tile (checked by the caller; `rows` a multiple of [`ROWS`]).
struct Tile<'a> {
    w: &'a [u8],
    rows: usize,
    x: &'a [u8],
    x_stride: usize,
    cols: usize,
    k: usize,
}

impl Tile<'_> {
    /// Column `c`'s activation bytes (`n` of them).
    fn col(&self, c: usize, n: usize) -> *const u8 {
        self.x[c * self.x_stride..][..n].as_ptr()
    }
}

/// Output pointers of group `g` for columns `c0..c0 + C` (four floats each, bounds-checked).
fn out_ptrs<const C: usize>(out: &mut [f32], ldo: usize, g: usize, c0: usize) -> [*mut f32; C] {
    std::array::from_fn(|j| out[(c0 + j) * ldo + ROWS * g..][..ROWS].as_mut_ptr())
}

/// The activation columns `0..2 · pairs` interleaved in pairs (see [`PAIR_BLOCK`]), pair after
/// pair, `nb` blocks each, into `dst`.
fn interleave_pairs(t: &Tile, pairs: usize, nb: usize, dst: &mut [u8]) {
    let col = |c: usize| &t.x[c * t.x_stride..][..nb * ACT];
    for p in 0..pairs {
        let (a, b) = (col(2 * p), col(2 * p + 1));
        for blk in 0..nb {
            let (ya, yb) = (&a[blk * ACT..][..ACT], &b[blk * ACT..][..ACT]);
            let o = &mut dst[(p * nb + blk) * PAIR_BLOCK..][..PAIR_BLOCK];
            for j in 0..4 {
                o[16 * j..16 * j + 8].copy_from_slice(&ya[2 + 8 * j..10 + 8 * j]);
                o[16 * j + 8..16 * j + 16].copy_from_slice(&yb[2 + 8 * j..10 + 8 * j]);
            }
            let scale = |y: &[u8]| f16_bits_to_f32(u16::from_le_bytes([y[0], y[1]])).to_le_bytes();
            let (da, db) = (scale(ya), scale(yb));
            for (i, d) in [da, db, da, db].iter().enumerate() {
                o[64 + 4 * i..68 + 4 * i].copy_from_slice(d);
            }
        }
    }
}

/// A 32-element type over groups of four rows: column pairs through `smmla` when `mm` (their
/// activations interleaved once for all groups), the rest (all columns without it) through
/// `sdot`, up to [`MAX_COLS`] per pass.
fn tile32<const KIND: u8, const PATH: u8>(
    t: &Tile,
    mm: bool,
    out: &mut [f32],
    ldo: usize,
    scratch: &mut Vec<u8>,
) {
    let nb = t.k / 32;
    let gbytes = nb * ROWS * block_bytes(KIND);
    let pairs = if mm { t.cols / 2 } else { 0 };
    if pairs > 0 {
        let need = pairs * nb * PAIR_BLOCK;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        interleave_pairs(t, pairs, nb, scratch);
    }
    for g in 0..t.rows / ROWS {
        let group = &t.w[g * gbytes..(g + 1) * gbytes];
        let wg = group.as_ptr();
        let mut p0 = 0;
        while p0 < pairs {
            let n = (pairs - p0).min(MAX_PAIRS);
            macro_rules! call_mm {
                ($p:literal) => {{
                    let xp: [*const u8; $p] = std::array::from_fn(|j| {
                        scratch[(p0 + j) * nb * PAIR_BLOCK..][..nb * PAIR_BLOCK].as_ptr()
                    });
                    let op: [[*mut f32; 2]; $p] = std::array::from_fn(|j| {
                        let c = 2 * (p0 + j);
                        [
                            out[c * ldo + ROWS * g..][..ROWS].as_mut_ptr(),
                            out[(c + 1) * ldo + ROWS * g..][..ROWS].as_mut_ptr(),
                        ]
                    });
                    // SAFETY: the CPU has i8mm (the caller's `mm`); the group holds `nb` packed
                    // blocks, each pair `nb` interleaved blocks, each output four floats (the
                    // slices above are bounds-checked).
                    unsafe { group_mm::<KIND, $p>(wg, nb, &xp, &op) }
                }};
            }
            with_cols!(n; 1; 2; call_mm);
            p0 += n;
        }
        sdot_columns::<KIND, PATH>(t, group, g, 2 * pairs, out, ldo);
    }
}

/// Selects [`group_q4k`] in [`sdot_columns`] (the 32-element kinds select [`group_sdot`]).
const KIND_Q4_K: u8 = u8::MAX;

/// Columns `c0..` of group `g` (its packed bytes `group`) through the `sdot` kernels, up to
/// [`MAX_COLS`] per call.
fn sdot_columns<const KIND: u8, const PATH: u8>(
    t: &Tile,
    group: &[u8],
    g: usize,
    c0: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let (nb, act) = if KIND == KIND_Q4_K {
        (t.k / 256, ACT_K)
    } else {
        (t.k / 32, ACT)
    };
    let wg = group.as_ptr();
    let mut c0 = c0;
    while c0 < t.cols {
        let n = (t.cols - c0).min(MAX_COLS);
        macro_rules! call {
            ($c:literal) => {{
                let xp: [*const u8; $c] = std::array::from_fn(|j| t.col(c0 + j, nb * act));
                let op = out_ptrs::<$c>(out, ldo, g, c0);
                // SAFETY: the CPU has dotprod (checked by the dispatcher); `group` is one whole
                // packed group of `nb` blocks (the callers slice it so), each column holds `nb`
                // activation blocks and each output four floats (bounds-checked slices above).
                unsafe {
                    if KIND == KIND_Q4_K {
                        group_q4k::<$c>(wg, nb, &xp, &op)
                    } else {
                        group_sdot::<KIND, PATH, $c>(wg, nb, &xp, &op)
                    }
                }
            }};
        }
        with_cols!(n; 1, 2, 3; 4; call);
        c0 += n;
    }
}

/// One packed block's levels for four rows: `lo[i]` multiplies activation bytes 0..16, `hi[i]`
/// bytes 16..32 (vector `i` of each half in the layout's order).
struct Levels {
    lo: [int8x16_t; 4],
    hi: [int8x16_t; 4],
}

/// The levels of the quants at `q` of a group block: Q8_0 as stored, Q4_0 as `16 · level`,
/// IQ4_NL through the 16-entry `tbl` (`table`). Loaded 64 bytes per `ld1` (four registers), as
/// the group block keeps them contiguous.
///
/// # Safety
/// `q` must point at a group block's quants (128 bytes for Q8_0, 64 for the nibble kinds).
#[inline(always)]
unsafe fn levels<const KIND: u8>(q: *const u8, table: int8x16_t) -> Levels {
    // SAFETY: the loads stay inside the quants the caller guarantees.
    unsafe {
        if KIND == B_Q8_0 {
            let (lo, hi) = (vld1q_s8_x4(q.cast()), vld1q_s8_x4(q.add(64).cast()));
            return Levels {
                lo: [lo.0, lo.1, lo.2, lo.3],
                hi: [hi.0, hi.1, hi.2, hi.3],
            };
        }
        let v = vld1q_u8_x4(q);
        let v = [v.0, v.1, v.2, v.3];
        if KIND == B_Q4_0 {
            let high = vdupq_n_u8(0xF0);
            Levels {
                lo: v.map(|v| vshlq_n_s8::<4>(vreinterpretq_s8_u8(v))),
                hi: v.map(|v| vreinterpretq_s8_u8(vandq_u8(v, high))),
            }
        } else {
            let low = vdupq_n_u8(0x0F);
            Levels {
                lo: v.map(|v| vqtbl1q_s8(table, vandq_u8(v, low))),
                hi: v.map(|v| vqtbl1q_s8(table, vshrq_n_u8::<4>(v))),
            }
        }
    }
}

/// Σ over four vectors of `sdot` by element: vector `i` against lane `i` of `a`.
///
/// # Safety
/// The CPU must have the dot-product extension.
#[inline(always)]
unsafe fn sdot_lanes(acc: int32x4_t, v: &[int8x16_t; 4], a: int8x16_t) -> int32x4_t {
    // SAFETY: the caller's guarantee.
    unsafe {
        let acc = sdot_lane::<0>(acc, v[0], a);
        let acc = sdot_lane::<1>(acc, v[1], a);
        let acc = sdot_lane::<2>(acc, v[2], a);
        sdot_lane::<3>(acc, v[3], a)
    }
}

/// `[a.lo, a.lo]` or `[a.hi, a.hi]` (`H`) as bytes.
#[inline(always)]
fn dup_half<const H: i32>(a: int8x16_t) -> int8x16_t {
    // SAFETY: register-only baseline NEON.
    unsafe { vreinterpretq_s8_s64(vdupq_laneq_s64::<H>(vreinterpretq_s64_s8(a))) }
}

/// The four rows' integer dots of one block with the activation quants `a0` (bytes 0..16) and
/// `a1` (16..32), one row per lane.
///
/// # Safety
/// The CPU must have the dot-product extension.
#[inline(always)]
unsafe fn block_dot<const PATH: u8>(l: &Levels, a0: int8x16_t, a1: int8x16_t) -> int32x4_t {
    // SAFETY: the caller's guarantee.
    unsafe {
        if PATH == PATH_LANE {
            return sdot_lanes(sdot_lanes(vdupq_n_s32(0), &l.lo, a0), &l.hi, a1);
        }
        // Vector 2j + h holds bytes 8j..8j+8 of rows 2h and 2h + 1: lanes (row 2h, first four),
        // (row 2h, last four), (row 2h + 1, first four), (row 2h + 1, last four).
        let (a00, a01, a10, a11) = (
            dup_half::<0>(a0),
            dup_half::<1>(a0),
            dup_half::<0>(a1),
            dup_half::<1>(a1),
        );
        let zero = vdupq_n_s32(0);
        let h0 = sdot(sdot(zero, l.lo[0], a00), l.lo[2], a01);
        let h0 = sdot(sdot(h0, l.hi[0], a10), l.hi[2], a11);
        let h1 = sdot(sdot(zero, l.lo[1], a00), l.lo[3], a01);
        let h1 = sdot(sdot(h1, l.hi[1], a10), l.hi[3], a11);
        vpaddq_s32(h0, h1)
    }
}

/// A block's integer sums as f32: Q4_0's levels are 16 times their value, removed by the
/// conversion's four fraction bits.
#[inline(always)]
fn to_f32<const KIND: u8>(s: int32x4_t) -> float32x4_t {
    // SAFETY: register-only baseline NEON.
    unsafe {
        if KIND == B_Q4_0 {
            vcvtq_n_f32_s32::<4>(s)
        } else {
            vcvtq_f32_s32(s)
        }
    }
}

/// Four packed rows times `C` columns over `nb` blocks with `sdot`; `out[c]` gets the four rows'
/// results for column `c`. Out of line: one symbol per type, path and column count.
///
/// # Safety
/// The CPU must have the dot-product extension; `w` must hold `nb` packed group blocks of `KIND`,
/// every `x[c]` `nb` Q8_0 blocks and every `out[c]` four writable floats.
#[inline(never)]
unsafe fn group_sdot<const KIND: u8, const PATH: u8, const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    let gb = ROWS * block_bytes(KIND);
    // SAFETY: every read stays inside the blocks the caller guarantees; `sdot` as guaranteed.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); C];
        for b in 0..nb {
            let blk = w.add(b * gb);
            let dw = f16x4_at(blk);
            let l = levels::<KIND>(blk.add(2 * ROWS), table);
            for c in 0..C {
                let y = x[c].add(b * ACT);
                let a = vld1q_s8_x2(y.add(2).cast());
                let s = block_dot::<PATH>(&l, a.0, a.1);
                acc[c] = vfmaq_f32(acc[c], to_f32::<KIND>(s), vmulq_n_f32(dw, f16_at(y)));
            }
        }
        for c in 0..C {
            vst1q_f32(out[c], acc[c]);
        }
    }
}

/// Four packed rows ([`PackLayout::Rows4x8`]) times `P` interleaved column pairs with
/// `smmla`: each instruction multiplies eight bytes of two rows with eight bytes of two columns.
/// `out[p]` gets the pair's two columns.
///
/// # Safety
/// The CPU must have i8mm; `w` must hold `nb` packed group blocks of `KIND`, every `x[p]` `nb`
/// interleaved pair blocks ([`PAIR_BLOCK`]) and every `out[p][i]` four writable floats.
#[inline(never)]
unsafe fn group_mm<const KIND: u8, const P: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; P],
    out: &[[*mut f32; 2]; P],
) {
    let gb = ROWS * block_bytes(KIND);
    // SAFETY: every read stays inside the blocks the caller guarantees; i8mm as guaranteed.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        // Pair p: lanes (row 0, column a), (row 0, b), (row 1, a), (row 1, b) in `acc[p][0]`,
        // the same for rows 2 and 3 in `acc[p][1]`.
        let mut acc = [[vdupq_n_f32(0.0); 2]; P];
        for b in 0..nb {
            let blk = w.add(b * gb);
            let dw = f16x4_at(blk);
            let (d01, d23) = (vzip1q_f32(dw, dw), vzip2q_f32(dw, dw));
            let l = levels::<KIND>(blk.add(2 * ROWS), table);
            for p in 0..P {
                let y = x[p].add(b * PAIR_BLOCK);
                let q = vld1q_s8_x4(y.cast());
                let da = vld1q_f32(y.add(64).cast());
                let zero = vdupq_n_s32(0);
                let h0 = smmla(smmla(zero, l.lo[0], q.0), l.lo[2], q.1);
                let h0 = smmla(smmla(h0, l.hi[0], q.2), l.hi[2], q.3);
                let h1 = smmla(smmla(zero, l.lo[1], q.0), l.lo[3], q.1);
                let h1 = smmla(smmla(h1, l.hi[1], q.2), l.hi[3], q.3);
                acc[p][0] = vfmaq_f32(acc[p][0], to_f32::<KIND>(h0), vmulq_f32(d01, da));
                acc[p][1] = vfmaq_f32(acc[p][1], to_f32::<KIND>(h1), vmulq_f32(d23, da));
            }
        }
        for p in 0..P {
            let [a, b] = acc[p];
            vst1q_f32(out[p][0], vuzp1q_f32(a, b));
            vst1q_f32(out[p][1], vuzp2q_f32(a, b));
        }
    }
}

/// Q4_K over groups of four rows ([`PackLayout::Rows4x4`]), up to [`MAX_COLS`] columns per pass.
fn tile_q4k(t: &Tile, out: &mut [f32], ldo: usize) {
    let gbytes = t.k / 256 * Q4K_GROUP;
    for g in 0..t.rows / ROWS {
        let group = &t.w[g * gbytes..(g + 1) * gbytes];
        sdot_columns::<KIND_Q4_K, PATH_LANE>(t, group, g, 0, out, ldo);
    }
}

/// The integer dots of sub-block `2p + H` (low nibbles of the pair's bytes, or high with `H`)
/// of four rows with each column, times the sub-block's scale, added to `isum`.
///
/// # Safety
/// The CPU must have the dot-product extension; `q` must point at a Q4_K group super-block's
/// quants, every `y[c]` at a Q8_K super-block's quants; `p < 4`.
#[inline(always)]
unsafe fn q4k_subblock<const H: bool, const C: usize>(
    q: *const u8,
    p: usize,
    y: &[*const u8; C],
    scale: int32x4_t,
    isum: &mut [int32x4_t; C],
) {
    // SAFETY: the loads stay inside the super-blocks the caller guarantees.
    unsafe {
        // Chunk 8p + m of each row (bytes 32p + 4m..32p + 4m + 4): elements 4m..4m + 4 of the
        // sub-block.
        let (v0, v1) = (
            vld1q_u8_x4(q.add(128 * p)),
            vld1q_u8_x4(q.add(128 * p + 64)),
        );
        let v = [v0.0, v0.1, v0.2, v0.3, v1.0, v1.1, v1.2, v1.3];
        let lv = if H {
            v.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)))
        } else {
            let low = vdupq_n_u8(0x0F);
            v.map(|v| vreinterpretq_s8_u8(vandq_u8(v, low)))
        };
        let (first, second) = ([lv[0], lv[1], lv[2], lv[3]], [lv[4], lv[5], lv[6], lv[7]]);
        let at = 64 * p + if H { 32 } else { 0 };
        for c in 0..C {
            let a = vld1q_s8_x2(y[c].add(at).cast());
            let s = sdot_lanes(sdot_lanes(vdupq_n_s32(0), &first, a.0), &second, a.1);
            isum[c] = vmlaq_s32(isum[c], s, scale);
        }
    }
}

/// Four packed Q4_K rows times `C` Q8_K columns over `nb` super-blocks (ggml's formula
/// `dy · (d · Σ_j scale_j · dot_j − dmin · Σ_j min_j · sum_j)`, four rows per lane).
///
/// # Safety
/// The CPU must have the dot-product extension; `w` must hold `nb` packed group super-blocks,
/// every `x[c]` `nb` Q8_K super-blocks and every `out[c]` four writable floats.
#[inline(never)]
unsafe fn group_q4k<const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    // SAFETY: every read stays inside the super-blocks the caller guarantees.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); C];
        let (m4, m6) = (vdupq_n_u8(0x0F), vdupq_n_u8(63));
        for b in 0..nb {
            let blk = w.add(b * Q4K_GROUP);
            let (d, dmin) = (f16x4_at(blk), f16x4_at(blk.add(8)));
            // Scale byte t of row r at 4t + r: ggml's 6-bit unpacking (`get_scale_min_k4`) on
            // four rows at once, sub-block j's value of row r in lane 4(j % 4) + r.
            let (s0, s1, s2) = (
                vld1q_u8(blk.add(16)),
                vld1q_u8(blk.add(32)),
                vld1q_u8(blk.add(48)),
            );
            let sc_lo = vandq_u8(s0, m6);
            let sc_hi = vorrq_u8(vandq_u8(s2, m4), vshlq_n_u8::<4>(vshrq_n_u8::<6>(s0)));
            let mn_lo = vandq_u8(s1, m6);
            let mn_hi = vorrq_u8(vshrq_n_u8::<4>(s2), vshlq_n_u8::<4>(vshrq_n_u8::<6>(s1)));
            // Sub-blocks 2i and 2i + 1 in the low and high halves of vector i.
            let widen = |v: uint8x16_t| {
                [
                    vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v))),
                    vreinterpretq_s16_u16(vmovl_high_u8(v)),
                ]
            };
            let ([sc0, sc1], [sc2, sc3]) = (widen(sc_lo), widen(sc_hi));
            let ([mn0, mn1], [mn2, mn3]) = (widen(mn_lo), widen(mn_hi));
            let q = blk.add(16 * ROWS);
            let y: [*const u8; C] = std::array::from_fn(|c| x[c].add(b * ACT_K + 4));
            let mut isum = [vdupq_n_s32(0); C];
            for (p, sc) in [sc0, sc1, sc2, sc3].into_iter().enumerate() {
                let (lo, hi) = (vmovl_s16(vget_low_s16(sc)), vmovl_high_s16(sc));
                q4k_subblock::<false, C>(q, p, &y, lo, &mut isum);
                q4k_subblock::<true, C>(q, p, &y, hi, &mut isum);
            }
            for c in 0..C {
                let yb = x[c].add(b * ACT_K);
                let dy = f32::from_le_bytes(yb.cast::<[u8; 4]>().read_unaligned());
                // Sums of the two groups of 16 in each sub-block of 32.
                let sums = vpaddq_s16(vld1q_s16(yb.add(260).cast()), vld1q_s16(yb.add(276).cast()));
                let mut imin = vmull_laneq_s16::<0>(vget_low_s16(mn0), sums);
                imin = vmlal_high_laneq_s16::<1>(imin, mn0, sums);
                imin = vmlal_laneq_s16::<2>(imin, vget_low_s16(mn1), sums);
                imin = vmlal_high_laneq_s16::<3>(imin, mn1, sums);
                imin = vmlal_laneq_s16::<4>(imin, vget_low_s16(mn2), sums);
                imin = vmlal_high_laneq_s16::<5>(imin, mn2, sums);
                imin = vmlal_laneq_s16::<6>(imin, vget_low_s16(mn3), sums);
                imin = vmlal_high_laneq_s16::<7>(imin, mn3, sums);
                acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(isum[c]), vmulq_n_f32(d, dy));
                acc[c] = vfmsq_f32(acc[c], vcvtq_f32_s32(imin), vmulq_n_f32(dmin, dy));
            }
        }
        for c in 0..C {
            vst1q_f32(out[c], acc[c]);
        }
    }
}
