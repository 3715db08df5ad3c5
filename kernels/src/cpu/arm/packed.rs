//! dotprod and i8mm kernels over the aarch64 packed layouts of [`crate::cpu::repack`]: four rows
//! per group, whose block scales convert in one `fcvtl` and whose dots land in the four lanes of
//! one vector, so no row needs a horizontal sum or a scalar scale conversion.
//!
//! * [`PackLayout::Rows4x4`]: `sdot` by element, each vector (four bytes of four rows) against
//!   one four-byte lane of an activation vector, so one activation load serves four `sdot`s;
//! * [`PackLayout::Rows4x8`]: with i8mm, `smmla` for two rows × two columns of eight bytes per
//!   instruction; one column at a time, `sdot` against eight activation bytes in both halves,
//!   each row's two partial lanes added pairwise once per block.
//!
//! Q4_0's nibbles are stored in two's complement ([`PackLayout::quant_xor`]): `shl #4` and a
//! `0xF0` mask give `16 · level`, and the conversion to f32 divides by 16 for free (`scvtf` with
//! four fraction bits), as ggml's aarch64 repack kernels do.
// Column and pair loops index several fixed-size arrays in step; iterators would obscure that.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::neon::{
    B_IQ4_NL, B_Q4_0, B_Q8_0, block_bytes, f16_at, f16x4_at, pair_f32, sdot, sdot_lane, smmla,
};
use crate::cpu::features::Isa;
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
    match (layout, wt) {
        (PackLayout::Rows4x4, WeightType::Q4_K) => tile_q4k(&t, out, ldo),
        (PackLayout::Rows4x4, WeightType::Q8_0) => tile32::<B_Q8_0, PATH_LANE>(&t, false, out, ldo),
        (PackLayout::Rows4x4, WeightType::Q4_0) => tile32::<B_Q4_0, PATH_LANE>(&t, false, out, ldo),
        (PackLayout::Rows4x4, WeightType::IQ4_NL) => {
            tile32::<B_IQ4_NL, PATH_LANE>(&t, false, out, ldo)
        }
        (PackLayout::Rows4x8, WeightType::Q8_0) => tile32::<B_Q8_0, PATH_HALVES>(&t, mm, out, ldo),
        (PackLayout::Rows4x8, WeightType::Q4_0) => tile32::<B_Q4_0, PATH_HALVES>(&t, mm, out, ldo),
        (PackLayout::Rows4x8, WeightType::IQ4_NL) => {
            tile32::<B_IQ4_NL, PATH_HALVES>(&t, mm, out, ldo)
        }
        _ => return false,
    }
    true
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

/// A 32-element type over groups of four rows: column pairs through `smmla` when `mm`, the rest
/// (all columns without it) through `sdot`, up to [`MAX_COLS`] per pass.
fn tile32<const KIND: u8, const PATH: u8>(t: &Tile, mm: bool, out: &mut [f32], ldo: usize) {
    let nb = t.k / 32;
    let gbytes = nb * ROWS * block_bytes(KIND);
    for g in 0..t.rows / ROWS {
        let wg = t.w[g * gbytes..(g + 1) * gbytes].as_ptr();
        let mut c0 = 0;
        while mm && t.cols - c0 >= 2 {
            let n = if t.cols - c0 >= 4 { 4 } else { 2 };
            macro_rules! pairs {
                ($c:literal) => {{
                    let xp: [*const u8; $c] = std::array::from_fn(|j| t.col(c0 + j, nb * ACT));
                    let op = out_ptrs::<$c>(out, ldo, g, c0);
                    // SAFETY: the CPU has i8mm (the caller's `mm`); the group holds `nb` packed
                    // blocks, each column `nb` activation blocks, each output four floats (the
                    // slices above are bounds-checked).
                    unsafe { group_mm::<KIND, $c>(wg, nb, &xp, &op) }
                }};
            }
            if n == 4 {
                pairs!(4)
            } else {
                pairs!(2)
            }
            c0 += n;
        }
        while c0 < t.cols {
            let n = (t.cols - c0).min(MAX_COLS);
            macro_rules! call {
                ($c:literal) => {{
                    let xp: [*const u8; $c] = std::array::from_fn(|j| t.col(c0 + j, nb * ACT));
                    let op = out_ptrs::<$c>(out, ldo, g, c0);
                    // SAFETY: the CPU has dotprod (checked by the dispatcher); pointers as above.
                    unsafe { group_sdot::<KIND, PATH, $c>(wg, nb, &xp, &op) }
                }};
            }
            with_cols!(n; 1, 2, 3; 4; call);
            c0 += n;
        }
    }
}

/// One packed block's levels for four rows: `lo[i]` multiplies activation bytes 0..16, `hi[i]`
/// bytes 16..32 (vector `i` of each half in the layout's order).
struct Levels {
    lo: [int8x16_t; 4],
    hi: [int8x16_t; 4],
}

/// The levels of the quants at `q` of a group block: Q8_0 as stored, Q4_0 as `16 · level`,
/// IQ4_NL through the 16-entry `tbl` (`table`).
///
/// # Safety
/// `q` must point at a group block's quants (128 bytes for Q8_0, 64 for the nibble kinds).
#[inline(always)]
unsafe fn levels<const KIND: u8>(q: *const u8, table: int8x16_t) -> Levels {
    // SAFETY: the loads stay inside the quants the caller guarantees.
    unsafe {
        if KIND == B_Q8_0 {
            return Levels {
                lo: std::array::from_fn(|i| vld1q_s8(q.add(16 * i).cast())),
                hi: std::array::from_fn(|i| vld1q_s8(q.add(64 + 16 * i).cast())),
            };
        }
        let v: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(q.add(16 * i)));
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
                let (a0, a1) = (vld1q_s8(y.add(2).cast()), vld1q_s8(y.add(18).cast()));
                let s = block_dot::<PATH>(&l, a0, a1);
                acc[c] = vfmaq_f32(acc[c], to_f32::<KIND>(s), vmulq_n_f32(dw, f16_at(y)));
            }
        }
        for c in 0..C {
            vst1q_f32(out[c], acc[c]);
        }
    }
}

/// Four packed rows ([`PackLayout::Rows4x8`]) times `C` columns (an even count, taken in
/// pairs) with `smmla`: each instruction multiplies eight bytes of two rows with eight bytes of
/// two columns.
///
/// # Safety
/// The CPU must have i8mm; `w`, `x` and `out` as for [`group_sdot`]; `C` must be even.
#[inline(never)]
unsafe fn group_mm<const KIND: u8, const C: usize>(
    w: *const u8,
    nb: usize,
    x: &[*const u8; C],
    out: &[*mut f32; C],
) {
    let gb = ROWS * block_bytes(KIND);
    // The eight-byte halves of two columns side by side: ([a.lo, b.lo], [a.hi, b.hi]).
    #[inline(always)]
    fn pairs(a: int8x16_t, b: int8x16_t) -> (int8x16_t, int8x16_t) {
        // SAFETY: register-only baseline NEON.
        unsafe {
            let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
            (
                vreinterpretq_s8_s64(vzip1q_s64(a, b)),
                vreinterpretq_s8_s64(vzip2q_s64(a, b)),
            )
        }
    }
    // SAFETY: every read stays inside the blocks the caller guarantees; i8mm as guaranteed.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        // Pair p: `acc[2p]` has lanes (row 0, column 2p), (row 0, 2p + 1), (row 1, 2p),
        // (row 1, 2p + 1); `acc[2p + 1]` the same for rows 2 and 3.
        let mut acc = [vdupq_n_f32(0.0); C];
        for b in 0..nb {
            let blk = w.add(b * gb);
            let dw = f16x4_at(blk);
            let (d01, d23) = (vzip1q_f32(dw, dw), vzip2q_f32(dw, dw));
            let l = levels::<KIND>(blk.add(2 * ROWS), table);
            for p in 0..C / 2 {
                let (y, z) = (x[2 * p].add(b * ACT), x[2 * p + 1].add(b * ACT));
                let (p0, p1) = pairs(vld1q_s8(y.add(2).cast()), vld1q_s8(z.add(2).cast()));
                let (p2, p3) = pairs(vld1q_s8(y.add(18).cast()), vld1q_s8(z.add(18).cast()));
                let zero = vdupq_n_s32(0);
                let h0 = smmla(smmla(zero, l.lo[0], p0), l.lo[2], p1);
                let h0 = smmla(smmla(h0, l.hi[0], p2), l.hi[2], p3);
                let h1 = smmla(smmla(zero, l.lo[1], p0), l.lo[3], p1);
                let h1 = smmla(smmla(h1, l.hi[1], p2), l.hi[3], p3);
                let dyz = pair_f32(f16_at(y), f16_at(z));
                let da = vcombine_f32(dyz, dyz);
                acc[2 * p] = vfmaq_f32(acc[2 * p], to_f32::<KIND>(h0), vmulq_f32(d01, da));
                acc[2 * p + 1] = vfmaq_f32(acc[2 * p + 1], to_f32::<KIND>(h1), vmulq_f32(d23, da));
            }
        }
        for p in 0..C / 2 {
            let (a, b) = (acc[2 * p], acc[2 * p + 1]);
            vst1q_f32(out[2 * p], vuzp1q_f32(a, b));
            vst1q_f32(out[2 * p + 1], vuzp2q_f32(a, b));
        }
    }
}

/// Q4_K over groups of four rows ([`PackLayout::Rows4x4`]), up to [`MAX_COLS`] columns per pass.
fn tile_q4k(t: &Tile, out: &mut [f32], ldo: usize) {
    let nb = t.k / 256;
    let gbytes = nb * Q4K_GROUP;
    for g in 0..t.rows / ROWS {
        let wg = t.w[g * gbytes..(g + 1) * gbytes].as_ptr();
        let mut c0 = 0;
        while c0 < t.cols {
            let n = (t.cols - c0).min(MAX_COLS);
            macro_rules! call {
                ($c:literal) => {{
                    let xp: [*const u8; $c] = std::array::from_fn(|j| t.col(c0 + j, nb * ACT_K));
                    let op = out_ptrs::<$c>(out, ldo, g, c0);
                    // SAFETY: the CPU has dotprod (checked by the dispatcher); the group holds
                    // `nb` packed super-blocks, each column `nb` Q8_K blocks, each output four
                    // floats (bounds-checked slices above).
                    unsafe { group_q4k::<$c>(wg, nb, &xp, &op) }
                }};
            }
            with_cols!(n; 1, 2, 3; 4; call);
            c0 += n;
        }
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
        let v: [uint8x16_t; 8] = std::array::from_fn(|m| vld1q_u8(q.add(128 * p + 16 * m)));
        let lv = if H {
            v.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)))
        } else {
            let low = vdupq_n_u8(0x0F);
            v.map(|v| vreinterpretq_s8_u8(vandq_u8(v, low)))
        };
        let (first, second) = ([lv[0], lv[1], lv[2], lv[3]], [lv[4], lv[5], lv[6], lv[7]]);
        let at = 64 * p + if H { 32 } else { 0 };
        for c in 0..C {
            let a = y[c].add(at);
            let (a0, a1) = (vld1q_s8(a.cast()), vld1q_s8(a.add(16).cast()));
            let s = sdot_lanes(sdot_lanes(vdupq_n_s32(0), &first, a0), &second, a1);
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
