//! The aarch64 kernel bodies: NEON intrinsics, with `sdot` (dotprod) and `smmla` (i8mm) through
//! inline assembly (their intrinsics are not stable Rust yet).
//!
//! Every weight format is brought to signed 8-bit levels in registers (nibble masks and shifts,
//! the fifth and sixth bits spread with `cmtst`, the non-linear formats through a `tbl` lookup),
//! then multiplied with the 8-bit activations exactly in 32-bit lanes: `sdot` where the CPU has
//! it, else `smull` and pairwise widening adds (`sadalp`) as ggml does on plain NEON. Scales are
//! applied per block (f32 lanes) or per group of 16 (32-bit lanes) as in ggml's kernels.
//!
//! The functions are `#[inline(always)]` bodies with a `DOT` switch: the callers in `super`
//! instantiate them once per level, so the level without dotprod never contains `sdot`.
//! Callers guarantee the pointer preconditions each function states.

use std::arch::aarch64::*;
use std::arch::asm;

use super::super::iquant::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_to_f32_half, iq4xs_scale};
use super::super::kquant::kq_scales_mins;
use super::super::lowbit::q3k_scale;

/// 32-element formats: Q8_0 weights.
pub(crate) const B_Q8_0: u8 = 0;
/// 32-element formats: Q4_0 weights.
pub(crate) const B_Q4_0: u8 = 1;
/// 32-element formats: Q5_0 weights.
pub(crate) const B_Q5_0: u8 = 2;
/// 32-element formats: Q4_1 weights (Q8_1 activations).
pub(crate) const B_Q4_1: u8 = 3;
/// 32-element formats: Q5_1 weights (Q8_1 activations).
pub(crate) const B_Q5_1: u8 = 4;
/// 32-element formats: IQ4_NL weights.
pub(crate) const B_IQ4_NL: u8 = 5;
/// 32-element formats: MXFP4 weights.
pub(crate) const B_MXFP4: u8 = 6;

/// Bytes per weight block of a 32-element format.
pub(crate) const fn block_bytes(kind: u8) -> usize {
    match kind {
        B_Q8_0 => 34,
        B_Q4_0 | B_IQ4_NL => 18,
        B_Q5_0 => 22,
        B_Q4_1 => 20,
        B_Q5_1 => 24,
        _ => 17,
    }
}

/// Whether a 32-element format is affine (a minimum `m` at bytes 2..4, Q8_1 activations).
pub(crate) const fn affine(kind: u8) -> bool {
    matches!(kind, B_Q4_1 | B_Q5_1)
}

/// Bytes per activation block of a 32-element format (Q8_1 or Q8_0).
pub(crate) const fn act_bytes(kind: u8) -> usize {
    if affine(kind) { 36 } else { 34 }
}

/// Byte offset of the quants in an activation block.
const fn act_qs(kind: u8) -> usize {
    if affine(kind) { 4 } else { 2 }
}

/// Bit `i % 8` of each byte lane `i`: with `cmtst` it spreads a byte's bits over eight lanes.
const BIT_LANES: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// The f16 at `p` (unaligned, little-endian), converted by the FPU: `ldr h` and `fcvt` are
/// Armv8.0 (no FEAT_FP16 needed), two instructions where the integer conversion takes a dozen
/// (each block has two such scales, so it showed in the instruction counts).
///
/// # Safety
/// `p` must point at two readable bytes.
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let out: f32;
    // SAFETY: the caller guarantees two readable bytes; unaligned SIMD loads are allowed on
    // normal memory.
    unsafe {
        asm!(
            "ldr {h:h}, [{p}]",
            "fcvt {o:s}, {h:h}",
            p = in(reg) p,
            h = out(vreg) _,
            o = lateout(vreg) out,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    out
}

/// The four f16 at `p` (unaligned, little-endian) as f32 lanes: `ldr d` and `fcvtl` (Armv8.0),
/// the scales of a packed group block converted at once.
///
/// # Safety
/// `p` must point at eight readable bytes.
#[inline(always)]
pub(crate) unsafe fn f16x4_at(p: *const u8) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: the caller guarantees eight readable bytes; unaligned SIMD loads are allowed on
    // normal memory.
    unsafe {
        asm!(
            "ldr {h:d}, [{p}]",
            "fcvtl {o:v}.4s, {h:v}.4h",
            p = in(reg) p,
            h = out(vreg) _,
            o = lateout(vreg) out,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    out
}

/// `acc + a·b` per group of four bytes of `a` against the four bytes of lane `L` of `b`
/// (`sdot` by element: one activation load serves four instructions).
///
/// # Safety
/// The CPU must have the dot-product extension.
#[inline(always)]
pub(crate) unsafe fn sdot_lane<const L: i32>(
    acc: int32x4_t,
    a: int8x16_t,
    b: int8x16_t,
) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the caller guarantees the CPU has.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.4b[{l}]",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            l = const L,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `acc + a·b` per group of four bytes (`sdot`).
///
/// # Safety
/// The CPU must have the dot-product extension.
#[inline(always)]
pub(crate) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the caller guarantees the CPU has.
    unsafe {
        asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `acc + A·Bᵀ` for the 2×8 matrices `a` and `b` (rows of eight bytes), as a row-major 2×2
/// (`smmla`).
///
/// # Safety
/// The CPU must have the int8 matrix-multiply extension.
#[inline(always)]
pub(crate) unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction the caller guarantees the CPU has.
    unsafe {
        asm!(
            ".arch_extension i8mm",
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `acc + a·b` in four 32-bit lanes (each the sum of four byte products, in some order).
///
/// # Safety
/// With `DOT`, the CPU must have the dot-product extension.
#[inline(always)]
unsafe fn dot16<const DOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` only with DOT (the caller's guarantee); the rest is baseline NEON.
    unsafe {
        if DOT {
            sdot(acc, a, b)
        } else {
            // Each 16-bit product fits (|−128·−128| < 2¹⁵); pairs are added in 32 bits.
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// The 32 levels of a block of a 32-element format, as two vectors of 16 (elements 0..16 and
/// 16..32).
///
/// # Safety
/// `b` must point at a whole block of the format.
#[inline(always)]
unsafe fn decode32<const KIND: u8>(b: *const u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: every load stays inside the block the caller guarantees.
    unsafe {
        match KIND {
            B_Q8_0 => (vld1q_s8(b.add(2).cast()), vld1q_s8(b.add(18).cast())),
            B_Q5_0 | B_Q5_1 => {
                let (qh_at, qs_at) = if KIND == B_Q5_0 { (2, 6) } else { (4, 8) };
                let qh = b.add(qh_at).cast::<[u8; 4]>().read_unaligned();
                let q = vld1q_u8(b.add(qs_at));
                let bits = vld1q_u8(BIT_LANES.as_ptr());
                let five = vdupq_n_u8(0x10);
                let h0 = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
                let h1 = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
                let lo = vorrq_u8(
                    vandq_u8(q, vdupq_n_u8(0x0F)),
                    vandq_u8(vtstq_u8(h0, bits), five),
                );
                let hi = vorrq_u8(vshrq_n_u8::<4>(q), vandq_u8(vtstq_u8(h1, bits), five));
                let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
                if KIND == B_Q5_0 {
                    (vsubq_s8(lo, vdupq_n_s8(16)), vsubq_s8(hi, vdupq_n_s8(16)))
                } else {
                    (lo, hi)
                }
            }
            _ => {
                let qs_at = match KIND {
                    B_Q4_1 => 4,
                    B_MXFP4 => 1,
                    _ => 2,
                };
                let q = vld1q_u8(b.add(qs_at));
                let lo = vandq_u8(q, vdupq_n_u8(0x0F));
                let hi = vshrq_n_u8::<4>(q);
                match KIND {
                    B_Q4_0 => (
                        vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8)),
                        vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8)),
                    ),
                    B_Q4_1 => (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)),
                    _ => {
                        let table = if KIND == B_IQ4_NL {
                            &KVALUES_IQ4NL
                        } else {
                            &KVALUES_MXFP4
                        };
                        let t = vld1q_s8(table.as_ptr());
                        (vqtbl1q_s8(t, lo), vqtbl1q_s8(t, hi))
                    }
                }
            }
        }
    }
}

/// The scale of a weight block of a 32-element format.
///
/// # Safety
/// `b` must point at a whole block of the format.
#[inline(always)]
unsafe fn block_scale<const KIND: u8>(b: *const u8) -> f32 {
    // SAFETY: the scale lies inside the block.
    unsafe {
        if KIND == B_MXFP4 {
            e8m0_to_f32_half(*b)
        } else {
            f16_at(b)
        }
    }
}

/// `R` weight rows times `C` activation columns of a 32-element format over `nb` blocks: the
/// integer block sums in 32-bit lanes, scaled per block into f32 lanes (ggml's NEON kernels).
///
/// # Safety
/// Every `w[r]` must point at `nb` weight blocks and every `x[c]` at `nb` activation blocks of
/// the format; with `DOT` the CPU must have the dot-product extension.
#[inline(always)]
pub(crate) unsafe fn q_tile<const KIND: u8, const DOT: bool, const R: usize, const C: usize>(
    w: &[*const u8; R],
    x: &[*const u8; C],
    nb: usize,
) -> [[f32; C]; R] {
    let (wb, ab, aq) = (block_bytes(KIND), act_bytes(KIND), act_qs(KIND));
    // SAFETY: the loads stay inside the blocks the caller guarantees; `sdot` only with DOT.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); C]; R];
        let mut mins = [[0f32; C]; R];
        for b in 0..nb {
            let wv: [(int8x16_t, int8x16_t); R] =
                std::array::from_fn(|r| decode32::<KIND>(w[r].add(b * wb)));
            let dw: [f32; R] = std::array::from_fn(|r| block_scale::<KIND>(w[r].add(b * wb)));
            for c in 0..C {
                let y = x[c].add(b * ab);
                let (y0, y1) = (vld1q_s8(y.add(aq).cast()), vld1q_s8(y.add(aq + 16).cast()));
                let dy = f16_at(y);
                for r in 0..R {
                    let s = dot16::<DOT>(dot16::<DOT>(vdupq_n_s32(0), wv[r].0, y0), wv[r].1, y1);
                    acc[r][c] = vfmaq_n_f32(acc[r][c], vcvtq_f32_s32(s), dw[r] * dy);
                    if affine(KIND) {
                        mins[r][c] += f16_at(w[r].add(b * wb + 2)) * f16_at(y.add(2));
                    }
                }
            }
        }
        std::array::from_fn(|r| std::array::from_fn(|c| vaddvq_f32(acc[r][c]) + mins[r][c]))
    }
}

/// Two weight rows times two activation columns of a 32-element format with `smmla`: each
/// instruction multiplies eight bytes of both rows with eight bytes of both columns.
///
/// # Safety
/// As [`q_tile`], with two rows and columns; the CPU must have i8mm.
#[inline(always)]
pub(crate) unsafe fn mm_tile<const KIND: u8>(
    w: &[*const u8; 2],
    x: &[*const u8; 2],
    nb: usize,
) -> [[f32; 2]; 2] {
    let (wb, ab, aq) = (block_bytes(KIND), act_bytes(KIND), act_qs(KIND));
    // Interleaves the 8-byte halves of two vectors: ([a.lo, b.lo], [a.hi, b.hi]).
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
    // SAFETY: the loads stay inside the blocks the caller guarantees; i8mm is present.
    unsafe {
        // Lanes: (row 0, col 0), (row 0, col 1), (row 1, col 0), (row 1, col 1).
        let mut acc = vdupq_n_f32(0.0);
        let mut mins = vdupq_n_f32(0.0);
        for b in 0..nb {
            let (p, q) = (w[0].add(b * wb), w[1].add(b * wb));
            let (y, z) = (x[0].add(b * ab), x[1].add(b * ab));
            let (p0, p1) = decode32::<KIND>(p);
            let (q0, q1) = decode32::<KIND>(q);
            let (w0, w1) = pairs(p0, q0);
            let (w2, w3) = pairs(p1, q1);
            let (a0, a1) = pairs(vld1q_s8(y.add(aq).cast()), vld1q_s8(z.add(aq).cast()));
            let (a2, a3) = pairs(
                vld1q_s8(y.add(aq + 16).cast()),
                vld1q_s8(z.add(aq + 16).cast()),
            );
            let mut s = smmla(vdupq_n_s32(0), w0, a0);
            s = smmla(s, w1, a1);
            s = smmla(s, w2, a2);
            s = smmla(s, w3, a3);
            let (dp, dq) = (block_scale::<KIND>(p), block_scale::<KIND>(q));
            let (dy, dz) = (f16_at(y), f16_at(z));
            let dw = vcombine_f32(vdup_n_f32(dp), vdup_n_f32(dq));
            let da = vcombine_f32(pair_f32(dy, dz), pair_f32(dy, dz));
            acc = vfmaq_f32(acc, vcvtq_f32_s32(s), vmulq_f32(dw, da));
            if affine(KIND) {
                let m = vcombine_f32(vdup_n_f32(f16_at(p.add(2))), vdup_n_f32(f16_at(q.add(2))));
                let sy = pair_f32(f16_at(y.add(2)), f16_at(z.add(2)));
                mins = vfmaq_f32(mins, m, vcombine_f32(sy, sy));
            }
        }
        let r = vaddq_f32(acc, mins);
        [
            [vgetq_lane_f32::<0>(r), vgetq_lane_f32::<1>(r)],
            [vgetq_lane_f32::<2>(r), vgetq_lane_f32::<3>(r)],
        ]
    }
}

/// The two-lane vector `[a, b]`.
#[inline(always)]
fn pair_f32(a: f32, b: f32) -> float32x2_t {
    // SAFETY: register-only baseline NEON.
    unsafe { vset_lane_f32::<1>(b, vdup_n_f32(a)) }
}

// ===== Super-block formats (Q8_K activations) =====

/// Super-block formats: Q4_K.
pub(crate) const K_Q4_K: u8 = 0;
/// Super-block formats: Q5_K.
pub(crate) const K_Q5_K: u8 = 1;
/// Super-block formats: Q6_K.
pub(crate) const K_Q6_K: u8 = 2;
/// Super-block formats: Q2_K.
pub(crate) const K_Q2_K: u8 = 3;
/// Super-block formats: Q3_K.
pub(crate) const K_Q3_K: u8 = 4;
/// Super-block formats: IQ4_XS.
pub(crate) const K_IQ4_XS: u8 = 5;

/// Bytes per super-block of a format.
pub(crate) const fn k_block_bytes(kind: u8) -> usize {
    match kind {
        K_Q4_K => 144,
        K_Q5_K => 176,
        K_Q6_K => 210,
        K_Q2_K => 84,
        K_Q3_K => 110,
        _ => 136,
    }
}

/// Bytes per Q8_K activation super-block: `d` (f32), 256 quants, 16 group sums (i16).
pub(crate) const Q8K_BYTES: usize = 292;

/// One super-block brought to 8-bit levels: `levels[e]` for its 256 elements, `scales[g]` and
/// `mins[g]` per group of 16, `d` and `dmin` its f32 factors. Its dot with a Q8_K block of scale
/// `dy`, quants `q` and group sums `s` is `dy·(d·Σ_g scales[g]·(levels·q)_g − dmin·Σ_g
/// mins[g]·s_g)` (ggml's formula for every K-quant).
#[repr(C, align(16))]
pub(crate) struct Decoded {
    levels: [i8; 256],
    scales: [i32; 16],
    mins: [i32; 16],
    d: f32,
    dmin: f32,
}

impl Decoded {
    /// An empty super-block (zero levels and scales).
    pub(crate) fn new() -> Decoded {
        Decoded {
            levels: [0; 256],
            scales: [0; 16],
            mins: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// Fills `out`'s scales, minimums and factors from the super-block at `b` (not its levels).
///
/// # Safety
/// `b` must point at a whole super-block of the format.
#[inline(always)]
pub(crate) unsafe fn header_k<const KIND: u8>(b: *const u8, out: &mut Decoded) {
    // SAFETY: every read stays inside the super-block the caller guarantees.
    unsafe {
        let bytes = std::slice::from_raw_parts(b, k_block_bytes(KIND));
        out.mins = [0; 16];
        out.dmin = 0.0;
        match KIND {
            K_Q4_K | K_Q5_K => {
                let (sc, mn) = kq_scales_mins(b.add(4).cast::<[u8; 12]>().read_unaligned());
                let (sc, mn) = (sc.to_le_bytes(), mn.to_le_bytes());
                for j in 0..8 {
                    out.scales[2 * j] = i32::from(sc[j]);
                    out.scales[2 * j + 1] = i32::from(sc[j]);
                    out.mins[2 * j] = i32::from(mn[j]);
                    out.mins[2 * j + 1] = i32::from(mn[j]);
                }
                out.d = f16_at(b);
                out.dmin = f16_at(b.add(2));
            }
            K_Q6_K => {
                for (g, &sc) in bytes[192..208].iter().enumerate() {
                    out.scales[g] = i32::from(sc as i8);
                }
                out.d = f16_at(b.add(208));
            }
            K_Q2_K => {
                for (g, &sc) in bytes[..16].iter().enumerate() {
                    out.scales[g] = i32::from(sc & 0xF);
                    out.mins[g] = i32::from(sc >> 4);
                }
                out.d = f16_at(b.add(80));
                out.dmin = f16_at(b.add(82));
            }
            K_Q3_K => {
                for g in 0..16 {
                    out.scales[g] = i32::from(q3k_scale(&bytes[96..108], g)) - 32;
                }
                out.d = f16_at(b.add(108));
            }
            _ => {
                for g in 0..8 {
                    let s = iq4xs_scale(bytes, g) - 32;
                    out.scales[2 * g] = s;
                    out.scales[2 * g + 1] = s;
                }
                out.d = f16_at(b);
            }
        }
    }
}

/// The levels of elements `32j..32j + 32` of the super-block at `b`, as two vectors of 16,
/// decoded in registers.
///
/// # Safety
/// `b` must point at a whole super-block of the format; `j < 8`.
#[inline(always)]
unsafe fn chunk_k<const KIND: u8>(b: *const u8, j: usize) -> (int8x16_t, int8x16_t) {
    // SAFETY: every load stays inside the super-block the caller guarantees.
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        // Elements 128h + 32t + l of the 2-bit and 6-bit formats.
        let (h, t) = (j / 4, j % 4);
        let shift = vdupq_n_s8(-2 * t as i8);
        let pair =
            |q0: uint8x16_t, q1: uint8x16_t| (vreinterpretq_s8_u8(q0), vreinterpretq_s8_u8(q1));
        match KIND {
            K_Q4_K | K_Q5_K => {
                let (qh, qs) = if KIND == K_Q5_K {
                    (b.add(16), b.add(48))
                } else {
                    (b, b.add(16))
                };
                let (c, high) = (j / 2, j % 2 == 1);
                let (q0, q1) = (vld1q_u8(qs.add(32 * c)), vld1q_u8(qs.add(32 * c + 16)));
                let (mut l0, mut l1) = if high {
                    (vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1))
                } else {
                    (vandq_u8(q0, m4), vandq_u8(q1, m4))
                };
                if KIND == K_Q5_K {
                    let bit = vdupq_n_u8(1 << j);
                    let five = vdupq_n_u8(0x10);
                    l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(vld1q_u8(qh), bit), five));
                    l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(vld1q_u8(qh.add(16)), bit), five));
                }
                pair(l0, l1)
            }
            K_Q6_K => {
                let (ql, qh) = (b.add(64 * h + 32 * (t & 1)), b.add(128 + 32 * h));
                let (a0, a1) = (vld1q_u8(ql), vld1q_u8(ql.add(16)));
                let (low0, low1) = if t < 2 {
                    (vandq_u8(a0, m4), vandq_u8(a1, m4))
                } else {
                    (vshrq_n_u8::<4>(a0), vshrq_n_u8::<4>(a1))
                };
                let three = vdupq_n_u8(3);
                let h0 = vandq_u8(vshlq_u8(vld1q_u8(qh), shift), three);
                let h1 = vandq_u8(vshlq_u8(vld1q_u8(qh.add(16)), shift), three);
                let q0 = vreinterpretq_s8_u8(vorrq_u8(low0, vshlq_n_u8::<4>(h0)));
                let q1 = vreinterpretq_s8_u8(vorrq_u8(low1, vshlq_n_u8::<4>(h1)));
                (vsubq_s8(q0, vdupq_n_s8(32)), vsubq_s8(q1, vdupq_n_s8(32)))
            }
            K_Q2_K | K_Q3_K => {
                let qs = b.add(if KIND == K_Q2_K { 16 } else { 32 } + 32 * h);
                let three = vdupq_n_u8(3);
                let q0 = vandq_u8(vshlq_u8(vld1q_u8(qs), shift), three);
                let q1 = vandq_u8(vshlq_u8(vld1q_u8(qs.add(16)), shift), three);
                if KIND == K_Q2_K {
                    pair(q0, q1)
                } else {
                    // Minus 4 where the element's bit in the high mask is clear.
                    let bit = vdupq_n_u8(1 << j);
                    let four = vdupq_n_u8(4);
                    let minus = |q: uint8x16_t, hm: uint8x16_t| {
                        let q = vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(4));
                        vaddq_s8(q, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(hm, bit), four)))
                    };
                    (minus(q0, vld1q_u8(b)), minus(q1, vld1q_u8(b.add(16))))
                }
            }
            _ => {
                let t = vld1q_s8(KVALUES_IQ4NL.as_ptr());
                let q = vld1q_u8(b.add(8 + 16 * j));
                (
                    vqtbl1q_s8(t, vandq_u8(q, m4)),
                    vqtbl1q_s8(t, vshrq_n_u8::<4>(q)),
                )
            }
        }
    }
}

/// Expands `$body` eight times with `$j` bound to the constants 0..8, so that the shifts and
/// offsets of each 32-element chunk of a super-block become immediates (LLVM leaves some of
/// these loops rolled, at about twice the instructions).
macro_rules! for_each_chunk {
    ($j:ident => $body:block) => {{
        {
            const $j: usize = 0;
            $body
        }
        {
            const $j: usize = 1;
            $body
        }
        {
            const $j: usize = 2;
            $body
        }
        {
            const $j: usize = 3;
            $body
        }
        {
            const $j: usize = 4;
            $body
        }
        {
            const $j: usize = 5;
            $body
        }
        {
            const $j: usize = 6;
            $body
        }
        {
            const $j: usize = 7;
            $body
        }
    }};
}

/// Decodes the super-block at `b` into `out`: header and levels.
///
/// # Safety
/// `b` must point at a whole super-block of the format.
#[inline(always)]
pub(crate) unsafe fn decode_k<const KIND: u8>(b: *const u8, out: &mut Decoded) {
    // SAFETY: `chunk_k` reads inside the super-block; the stores stay inside the 256 levels.
    unsafe {
        header_k::<KIND>(b, out);
        let lv = out.levels.as_mut_ptr();
        for_each_chunk!(J => {
            let (l0, l1) = chunk_k::<KIND>(b, J);
            vst1q_s8(lv.add(32 * J), l0);
            vst1q_s8(lv.add(32 * J + 16), l1);
        });
    }
}

/// `dy·(d·isum − dmin·Σ_g mins[g]·s_g)` for the Q8_K block at `y` (its group sums `s_g`).
///
/// # Safety
/// `y` must point at a whole Q8_K super-block.
#[inline(always)]
unsafe fn finish_k(blk: &Decoded, y: *const u8, isum: i32) -> f32 {
    // SAFETY: the reads stay inside the Q8_K block.
    unsafe {
        let dy = f32::from_le_bytes(y.cast::<[u8; 4]>().read_unaligned());
        let mut imin = 0i32;
        if blk.dmin != 0.0 {
            let sums = y.add(260).cast::<[u8; 32]>().read_unaligned();
            for g in 0..16 {
                imin += blk.mins[g] * i32::from(i16::from_le_bytes([sums[2 * g], sums[2 * g + 1]]));
            }
        }
        blk.d * dy * isum as f32 - blk.dmin * dy * imin as f32
    }
}

/// The dot of a decoded super-block (levels and header) with the Q8_K super-block at `y`.
///
/// # Safety
/// `y` must point at a whole Q8_K super-block; with `DOT` the CPU must have the dot-product
/// extension.
#[inline(always)]
pub(crate) unsafe fn dot_k<const DOT: bool>(blk: &Decoded, y: *const u8) -> f32 {
    // SAFETY: the loads stay inside the decoded block and the Q8_K block.
    unsafe {
        let q = y.add(4).cast::<i8>();
        let mut acc = vdupq_n_s32(0);
        for g in 0..16 {
            let p = dot16::<DOT>(
                vdupq_n_s32(0),
                vld1q_s8(blk.levels.as_ptr().add(16 * g)),
                vld1q_s8(q.add(16 * g)),
            );
            acc = vmlaq_n_s32(acc, p, blk.scales[g]);
        }
        finish_k(blk, y, vaddvq_s32(acc))
    }
}

/// The dot of the super-block at `b` (its header already in `hdr`) with the Q8_K super-block at
/// `y`, the levels decoded in registers on the way (one column: nothing to reuse them for).
///
/// # Safety
/// `b` must point at a whole super-block of the format and `y` at a whole Q8_K super-block; with
/// `DOT` the CPU must have the dot-product extension.
#[inline(always)]
pub(crate) unsafe fn dot_k_fused<const KIND: u8, const DOT: bool>(
    b: *const u8,
    hdr: &Decoded,
    y: *const u8,
) -> f32 {
    // SAFETY: the loads stay inside both super-blocks.
    unsafe {
        let q = y.add(4).cast::<i8>();
        let mut acc = vdupq_n_s32(0);
        for_each_chunk!(J => {
            let (l0, l1) = chunk_k::<KIND>(b, J);
            let p0 = dot16::<DOT>(vdupq_n_s32(0), l0, vld1q_s8(q.add(32 * J)));
            let p1 = dot16::<DOT>(vdupq_n_s32(0), l1, vld1q_s8(q.add(32 * J + 16)));
            acc = vmlaq_n_s32(acc, p0, hdr.scales[2 * J]);
            acc = vmlaq_n_s32(acc, p1, hdr.scales[2 * J + 1]);
        });
        finish_k(hdr, y, vaddvq_s32(acc))
    }
}

// ===== Floats =====

/// Dot product of `n` f32 at `a` and `b`.
///
/// # Safety
/// Both pointers must point at `n` readable f32.
#[inline(always)]
pub(crate) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    // SAFETY: loads of `n` elements from each pointer, as the caller guarantees.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (l, a4) in acc.iter_mut().enumerate() {
                *a4 = vfmaq_f32(
                    *a4,
                    vld1q_f32(a.add(i + 4 * l)),
                    vld1q_f32(b.add(i + 4 * l)),
                );
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], vld1q_f32(a.add(i)), vld1q_f32(b.add(i)));
            i += 4;
        }
        let mut sum = vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ));
        while i < n {
            sum += *a.add(i) * *b.add(i);
            i += 1;
        }
        sum
    }
}
