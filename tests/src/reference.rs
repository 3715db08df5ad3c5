//! A straightforward scalar reference interpreter, computing in `f64`, over byte-faithful storage.
//!
//! Every non-view tensor owns a `Vec<u8>` laid out exactly as a device lays it out (same dtype,
//! same block format, same strides); a view reads and writes through its base at
//! `view_of().offset` with its own `nb` strides. Element reads decode f32 / f16 / bf16 / i32 and
//! Q8_0 / Q4_0 blocks; writes encode to the destination dtype, quantized destinations row by row
//! with ggml's reference quantizers. Nodes are evaluated in [`Graph::nodes`] order, so CPY and
//! SET_ROWS (views of their destination) write into the destination's storage as on a device.
//!
//! The Q8_0 / Q4_0 quantizers and every dequantizer here are independent of the kernels under
//! test on purpose. Q5_0, Q4_1, Q5_1 and the K-quants encode through `tessera-kernels`' quantizers instead:
//! those are checked bit for bit against ggml's own output (the golden test in
//! `kernels/src/cpu/kquant_golden.rs`), and a second copy of ggml's iterative scale search here
//! would test nothing more; decoding, which is what MUL_MAT / GET_ROWS results depend on, stays
//! independent.

// The reference is index arithmetic on purpose: explicit loops mirror the formulas they check.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};
use tessera_core::{DType, GluOp, Graph, Op, RopeMode, TensorDesc, TensorId, UnaryOp};
use tessera_kernels::cpu::{ActType, WeightType, act_type};

/// Elements per Q8_0 / Q4_0 block.
pub const QK: usize = 32;

/// Errors of the reference: a message naming what went wrong.
pub type RefResult<T> = Result<T, String>;

// ===== Quantizers (ggml's scalar reference versions) =====

/// Quantizes one block of 32 values to Q8_0 (34 bytes: f16 scale, 32 × i8), exactly as ggml's
/// `quantize_row_q8_0_ref`: `d = max|x| / 127`, `q = round(x / d)`.
///
/// # Panics
/// If `x` is not 32 values or `out` not 34 bytes.
pub fn quantize_q8_0_block(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len() == QK && out.len() == DType::Q8_0.type_size(),
        "a Q8_0 block is 32 values / 34 bytes"
    );
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &v) in out[2..].iter_mut().zip(x) {
        // `f32::round` rounds half away from zero, as C's roundf.
        *q = ((v * id).round() as i8) as u8;
    }
}

/// Decodes one Q8_0 block (34 bytes) into 32 values.
///
/// # Panics
/// If `block` is not 34 bytes or `out` not 32 values.
pub fn dequantize_q8_0_block(block: &[u8], out: &mut [f32]) {
    assert!(
        block.len() == DType::Q8_0.type_size() && out.len() == QK,
        "a Q8_0 block is 34 bytes / 32 values"
    );
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    for (o, &q) in out.iter_mut().zip(&block[2..]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Quantizes one block of 32 values to Q4_0 (18 bytes: f16 scale, 16 bytes of nibbles offset by
/// 8), exactly as ggml's `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the value of
/// largest magnitude, element `j` in the low nibble of byte `j`, element `j + 16` in the high one.
///
/// # Panics
/// If `x` is not 32 values or `out` not 18 bytes.
pub fn quantize_q4_0_block(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len() == QK && out.len() == DType::Q4_0.type_size(),
        "a Q4_0 block is 32 values / 18 bytes"
    );
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for j in 0..QK / 2 {
        // C's (int8_t) conversion truncates toward zero, as Rust's `as i8`.
        let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let hi = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
        out[2 + j] = lo | (hi << 4);
    }
}

/// Decodes one Q4_0 block (18 bytes) into 32 values.
///
/// # Panics
/// If `block` is not 18 bytes or `out` not 32 values.
pub fn dequantize_q4_0_block(block: &[u8], out: &mut [f32]) {
    assert!(
        block.len() == DType::Q4_0.type_size() && out.len() == QK,
        "a Q4_0 block is 18 bytes / 32 values"
    );
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    for j in 0..QK / 2 {
        let b = block[2 + j];
        out[j] = (f32::from(b & 0x0f) - 8.0) * d;
        out[j + QK / 2] = (f32::from(b >> 4) - 8.0) * d;
    }
}

// ===== Element encoding =====

/// Appends `vals` encoded as `dtype` to `out`. Floats round to nearest (even); i32 rounds to the
/// nearest integer; quantized types take whole blocks through the reference quantizers.
///
/// # Errors
/// When a quantized row is not a whole number of blocks.
pub fn encode_into(dtype: DType, vals: &[f64], out: &mut Vec<u8>) -> RefResult<()> {
    match dtype {
        DType::F32 => out.extend(vals.iter().flat_map(|&v| (v as f32).to_le_bytes())),
        DType::F16 => out.extend(vals.iter().flat_map(|&v| f16::from_f64(v).to_le_bytes())),
        DType::BF16 => out.extend(vals.iter().flat_map(|&v| bf16::from_f64(v).to_le_bytes())),
        DType::I32 => out.extend(vals.iter().flat_map(|&v| (v.round() as i32).to_le_bytes())),
        DType::Q8_0 | DType::Q4_0 => {
            if !vals.len().is_multiple_of(QK) {
                return Err(format!(
                    "{} values do not fill whole {dtype} blocks",
                    vals.len()
                ));
            }
            let ts = dtype.type_size();
            let mut block = vec![0u8; ts];
            for chunk in vals.chunks_exact(QK) {
                let x: Vec<f32> = chunk.iter().map(|&v| v as f32).collect();
                if dtype == DType::Q8_0 {
                    quantize_q8_0_block(&x, &mut block);
                } else {
                    quantize_q4_0_block(&x, &mut block);
                }
                out.extend_from_slice(&block);
            }
        }
        DType::Q5_0
        | DType::Q4_1
        | DType::Q5_1
        | DType::Q4_K
        | DType::Q5_K
        | DType::Q6_K
        | DType::Q8_K
        | DType::Q2_K
        | DType::Q3_K
        | DType::IQ4_NL
        | DType::IQ4_XS
        | DType::MXFP4 => {
            use tessera_kernels::cpu as k;
            let row = dtype
                .row_size(vals.len())
                .ok_or_else(|| format!("{} values do not fill whole {dtype} blocks", vals.len()))?;
            let x: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
            let mut bytes = vec![0u8; row];
            match dtype {
                DType::Q5_0 => k::quantize_row_q5_0(&x, &mut bytes),
                DType::Q4_1 => k::quantize_row_q4_1(&x, &mut bytes),
                DType::Q5_1 => k::quantize_row_q5_1(&x, &mut bytes),
                DType::Q4_K => k::quantize_row_q4_k(&x, &mut bytes),
                DType::Q5_K => k::quantize_row_q5_k(&x, &mut bytes),
                DType::Q6_K => k::quantize_row_q6_k(&x, &mut bytes),
                DType::Q2_K => k::quantize_row_q2_k(&x, &mut bytes),
                DType::Q3_K => k::quantize_row_q3_k(&x, &mut bytes),
                DType::IQ4_NL => k::quantize_row_iq4_nl(&x, &mut bytes),
                DType::IQ4_XS => k::quantize_row_iq4_xs(&x, &mut bytes),
                DType::MXFP4 => k::quantize_row_mxfp4(&x, &mut bytes),
                _ => k::quantize_row_q8_k(&x, &mut bytes),
            }
            out.extend_from_slice(&bytes);
        }
        other => return Err(format!("the reference cannot encode {other}")),
    }
    Ok(())
}

/// `vals` encoded as a contiguous `dtype` array.
///
/// # Errors
/// As [`encode_into`].
pub fn encode(dtype: DType, vals: &[f64]) -> RefResult<Vec<u8>> {
    let mut out = Vec::with_capacity(vals.len() * dtype.type_size());
    encode_into(dtype, vals, &mut out)?;
    Ok(out)
}

/// Decodes `n` contiguous elements of `dtype` from the start of `bytes`.
///
/// # Errors
/// When `bytes` is too short or a quantized count is not a whole number of blocks.
pub fn decode(dtype: DType, bytes: &[u8], n: usize) -> RefResult<Vec<f64>> {
    let row = dtype
        .row_size(n)
        .ok_or_else(|| format!("{n} elements do not fill whole {dtype} blocks"))?;
    let bytes = bytes.get(..row).ok_or_else(|| {
        format!(
            "{n} {dtype} elements need {row} bytes, have {}",
            bytes.len()
        )
    })?;
    let out = match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        DType::Q8_0 | DType::Q4_0 => {
            let mut out = Vec::with_capacity(n);
            let mut x = [0.0f32; QK];
            for block in bytes.chunks_exact(dtype.type_size()) {
                if dtype == DType::Q8_0 {
                    dequantize_q8_0_block(block, &mut x);
                } else {
                    dequantize_q4_0_block(block, &mut x);
                }
                out.extend(x.iter().map(|&v| f64::from(v)));
            }
            out
        }
        DType::Q5_0 => bytes
            .chunks_exact(22)
            .flat_map(dequantize_q5_0_block)
            .collect(),
        DType::Q4_1 | DType::Q5_1 => bytes
            .chunks_exact(dtype.type_size())
            .flat_map(|b| dequantize_q_1_block(b, dtype == DType::Q5_1))
            .collect(),
        DType::Q4_K | DType::Q5_K => bytes
            .chunks_exact(dtype.type_size())
            .flat_map(|b| dequantize_qk_affine_block(b, dtype == DType::Q5_K))
            .collect(),
        DType::Q6_K => bytes
            .chunks_exact(210)
            .flat_map(dequantize_q6_k_block)
            .collect(),
        DType::Q8_K => bytes
            .chunks_exact(292)
            .flat_map(|b| {
                let d = f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                b[4..260].iter().map(move |&q| d * f64::from(q as i8))
            })
            .collect(),
        DType::Q2_K => bytes
            .chunks_exact(84)
            .flat_map(dequantize_q2_k_block)
            .collect(),
        DType::Q3_K => bytes
            .chunks_exact(110)
            .flat_map(dequantize_q3_k_block)
            .collect(),
        DType::IQ4_NL => bytes
            .chunks_exact(18)
            .flat_map(|b| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
                (0..32).map(move |j| d * f64::from(IQ4NL_LEVELS[nibble_32(&b[2..18], j)]))
            })
            .collect(),
        DType::IQ4_XS => bytes
            .chunks_exact(136)
            .flat_map(dequantize_iq4_xs_block)
            .collect(),
        DType::MXFP4 => bytes
            .chunks_exact(17)
            .flat_map(|b| {
                // E8M0: 2^(e − 127); the E2M1 value table below is not doubled.
                let scale = 2f64.powi(i32::from(b[0]) - 127);
                (0..32).map(move |j| scale * E2M1_LEVELS[nibble_32(&b[1..17], j)])
            })
            .collect(),
        other => return Err(format!("the reference cannot decode {other}")),
    };
    Ok(out)
}

/// IQ4_NL / IQ4_XS levels (ggml's `kvalues_iq4nl`).
const IQ4NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The OCP E2M1 values of codes 0..16 (sign bit 3, then 2 exponent bits, 1 mantissa bit).
const E2M1_LEVELS: [f64; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Index `j` of a 32-element group from its 16 bytes (low nibbles first, then high nibbles).
fn nibble_32(qs: &[u8], j: usize) -> usize {
    usize::from(if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 })
}

/// The 2-bit field of element `e = 128h + 32t + l` of a Q2_K / Q3_K super-block's 64 quant
/// bytes: bits `2t..2t + 2` of byte `32h + l`.
fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
    (qs[32 * h + l] >> (2 * t)) & 3
}

/// Decodes one Q2_K super-block (84 bytes: 16 scale bytes — low nibble scale, high nibble min of
/// group `e / 16` — 64 quant bytes, f16 `d`, f16 `dmin`): `d·sc·q − dmin·m`.
fn dequantize_q2_k_block(b: &[u8]) -> Vec<f64> {
    let d = f16::from_le_bytes([b[80], b[81]]).to_f64();
    let dmin = f16::from_le_bytes([b[82], b[83]]).to_f64();
    (0..256)
        .map(|e| {
            let (sc, m) = (b[e / 16] & 0xF, b[e / 16] >> 4);
            d * f64::from(sc) * f64::from(two_bits(&b[16..80], e)) - dmin * f64::from(m)
        })
        .collect()
}

/// Decodes one Q3_K super-block (110 bytes: 32 bytes of high bits — element `e`'s is bit `e / 32`
/// of byte `e % 32` — 64 quant bytes, 12 scale bytes, f16 `d`). Group `g`'s 6-bit scale has its
/// low nibble in byte `g` (`g < 8`, low half) or `g − 8` (high half) and its top two bits at
/// bit `2(g / 4)` of byte `8 + g % 4`; value `d·(sc − 32)·(q − 4·(1 − high))`.
fn dequantize_q3_k_block(b: &[u8]) -> Vec<f64> {
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16::from_le_bytes([b[108], b[109]]).to_f64();
    (0..256)
        .map(|e| {
            let g = e / 16;
            let low = if g < 8 { sc[g] & 0xF } else { sc[g - 8] >> 4 };
            let scale = i32::from(low | (((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
            let high = (hmask[e % 32] >> (e / 32)) & 1;
            let q = i32::from(two_bits(qs, e)) - if high == 1 { 0 } else { 4 };
            d * f64::from(scale) * f64::from(q)
        })
        .collect()
}

/// Decodes one IQ4_XS super-block (136 bytes: f16 `d`, u16 high scale bits, 4 bytes of low scale
/// nibbles, 8 groups of 16 index bytes). Group `g`'s 6-bit scale is nibble `g % 2` of byte
/// `4 + g / 2` plus bits `2g..2g + 2` of the u16 as its top bits; value `d·(ls − 32)·level`.
fn dequantize_iq4_xs_block(b: &[u8]) -> Vec<f64> {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
    let high = u16::from_le_bytes([b[2], b[3]]);
    (0..256)
        .map(|e| {
            let g = e / 32;
            let low = (b[4 + g / 2] >> (4 * (g % 2))) & 0xF;
            let ls = i32::from(low) | (i32::from((high >> (2 * g)) & 3) << 4);
            let level = IQ4NL_LEVELS[nibble_32(&b[8 + 16 * g..8 + 16 * g + 16], e % 32)];
            d * f64::from(ls - 32) * f64::from(level)
        })
        .collect()
}

/// Decodes one Q5_0 block (22 bytes: f16 `d`, u32 fifth bits, 16 bytes of nibbles; element `j`
/// is the low nibble of byte `j` or, for `j >= 16`, the high nibble of byte `j − 16`, plus 16 ×
/// bit `j`, minus 16, times `d`).
fn dequantize_q5_0_block(b: &[u8]) -> Vec<f64> {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    (0..32)
        .map(|j| f64::from(level_32(&b[6..22], qh, j) - 16) * d)
        .collect()
}

/// Level `j` of a 32-element block from its 16 nibble bytes `qs` (element `j` is the low nibble
/// of byte `j` or, for `j >= 16`, the high nibble of byte `j − 16`) plus 16 × bit `j` of `qh`.
fn level_32(qs: &[u8], qh: u32, j: usize) -> i32 {
    let nib = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
    i32::from(nib) + 16 * ((qh >> j) & 1) as i32
}

/// Decodes one Q4_1 (20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles) or Q5_1 block (24 bytes:
/// `d`, `m`, u32 fifth bits, nibbles): element = level × `d` + `m`.
fn dequantize_q_1_block(b: &[u8], q5: bool) -> Vec<f64> {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
    let m = f16::from_le_bytes([b[2], b[3]]).to_f64();
    let (qh, qs) = if q5 {
        (u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24])
    } else {
        (0, &b[4..20])
    };
    (0..32)
        .map(|j| f64::from(level_32(qs, qh, j)) * d + m)
        .collect()
}

/// Decodes one Q4_K (144 bytes) or, with `q5`, Q5_K (176 bytes) super-block: sub-block `s` of 32
/// has 6-bit scale and min (bytes 4..16: for `s < 4` the low 6 bits of bytes `s` and `s + 4`; for
/// `s >= 4` a nibble of byte `s + 4` plus the top 2 bits of bytes `s − 4` and `s`), element `l`
/// its nibble in byte `32·(s / 2) + l` of the quants (low for even `s`), plus 16 × bit `s` of
/// `qh[l]` for Q5_K; value `d·sc·q − dmin·m`.
fn dequantize_qk_affine_block(b: &[u8], q5: bool) -> Vec<f64> {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f64();
    let dmin = f16::from_le_bytes([b[2], b[3]]).to_f64();
    let sc = &b[4..16];
    let (qh, qs) = if q5 {
        (&b[16..48], &b[48..176])
    } else {
        (&b[..0], &b[16..144])
    };
    let mut out = Vec::with_capacity(256);
    for s in 0..8 {
        let (scale, min) = if s < 4 {
            (sc[s] & 63, sc[s + 4] & 63)
        } else {
            (
                (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4),
                (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4),
            )
        };
        for l in 0..32 {
            let byte = qs[32 * (s / 2) + l];
            let mut q = if s % 2 == 0 { byte & 0xF } else { byte >> 4 };
            if q5 && (qh[l] >> s) & 1 == 1 {
                q += 16;
            }
            out.push(d * f64::from(scale) * f64::from(q) - dmin * f64::from(min));
        }
    }
    out
}

/// Decodes one Q6_K super-block (210 bytes: `ql` 128, `qh` 64, 16 i8 scales, f16 `d`). Element
/// `e = 128h + 32t + l` takes its low nibble from `ql[64h + 32(t % 2) + l]` (low half for `t <
/// 2`), bits 4–5 from `qh[32h + l] >> 2t`, and scale `e / 16`; value `d·sc·(q − 32)`.
fn dequantize_q6_k_block(b: &[u8]) -> Vec<f64> {
    let d = f16::from_le_bytes([b[208], b[209]]).to_f64();
    (0..256)
        .map(|e| {
            let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
            let byte = b[64 * h + 32 * (t % 2) + l];
            let low = if t < 2 { byte & 0xF } else { byte >> 4 };
            let high = (b[128 + 32 * h + l] >> (2 * t)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let scale = b[192 + e / 16] as i8;
            d * f64::from(scale) * f64::from(q)
        })
        .collect()
}

// ===== Strided tensor access =====

/// Byte offset of row `(i1, i2, i3)` relative to the tensor's first element.
fn row_offset(t: &TensorDesc, i1: usize, i2: usize, i3: usize) -> usize {
    let nb = t.nb();
    i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
}

/// Decodes row `(i1, i2, i3)` of `t`, whose first element is at `start` in `bytes`.
fn decode_row_at(t: &TensorDesc, bytes: &[u8], start: usize, i: [usize; 3]) -> RefResult<Vec<f64>> {
    let (dtype, ne0) = (t.dtype(), t.ne()[0]);
    let off = start + row_offset(t, i[0], i[1], i[2]);
    if t.is_row_contiguous() || dtype.is_quantized() {
        // Quantized rows are always contiguous blocks (the builders never move the block axis).
        let tail = bytes
            .get(off..)
            .ok_or_else(|| format!("row at byte {off} is outside {} bytes", bytes.len()))?;
        return decode(dtype, tail, ne0);
    }
    let (ts, nb0) = (dtype.type_size(), t.nb()[0]);
    let mut row = Vec::with_capacity(ne0);
    for i0 in 0..ne0 {
        let at = off + i0 * nb0;
        let b = bytes
            .get(at..at + ts)
            .ok_or_else(|| format!("element at byte {at} is outside {} bytes", bytes.len()))?;
        row.extend(decode(dtype, b, 1)?);
    }
    Ok(row)
}

/// Encodes `vals` (one row) into row `(i1, i2, i3)` of `t`, whose first element is at `start`.
fn encode_row_at(
    t: &TensorDesc,
    bytes: &mut [u8],
    start: usize,
    i: [usize; 3],
    vals: &[f64],
) -> RefResult<()> {
    let (dtype, ne0) = (t.dtype(), t.ne()[0]);
    if vals.len() != ne0 {
        return Err(format!(
            "row of {} values written to a tensor with ne0 = {ne0}",
            vals.len()
        ));
    }
    let off = start + row_offset(t, i[0], i[1], i[2]);
    let len = bytes.len();
    if t.is_row_contiguous() || dtype.is_quantized() {
        let enc = encode(dtype, vals)?;
        let dst = bytes
            .get_mut(off..off + enc.len())
            .ok_or_else(|| format!("row write at byte {off} is outside {len} bytes"))?;
        dst.copy_from_slice(&enc);
        return Ok(());
    }
    let nb0 = t.nb()[0];
    for (i0, &v) in vals.iter().enumerate() {
        let enc = encode(dtype, &[v])?;
        let at = off + i0 * nb0;
        let dst = bytes
            .get_mut(at..at + enc.len())
            .ok_or_else(|| format!("element write at byte {at} is outside {len} bytes"))?;
        dst.copy_from_slice(&enc);
    }
    Ok(())
}

/// Decodes every element of `t` (in logical order, `i0` fastest) from `bytes`, where the tensor's
/// first element is at byte 0 and elements are placed by `t`'s strides. Device read-backs of
/// whole tensors decode through this.
///
/// # Errors
/// When the strides reach outside `bytes`.
pub fn decode_tensor(t: &TensorDesc, bytes: &[u8]) -> RefResult<Vec<f64>> {
    decode_strided(t, bytes, 0)
}

fn decode_strided(t: &TensorDesc, bytes: &[u8], start: usize) -> RefResult<Vec<f64>> {
    let ne = t.ne();
    let mut out = Vec::with_capacity(t.nelements());
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                out.extend(decode_row_at(t, bytes, start, [i1, i2, i3])?);
            }
        }
    }
    Ok(out)
}

/// Flat logical index of `i` in a tensor of shape `ne`.
fn flat(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

/// Every index of shape `ne` in logical order (`i0` fastest).
fn indices(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2]).flat_map(move |i2| {
            (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
        })
    })
}

// ===== Scalar functions =====

/// `x · σ(x)`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (ggml's): `0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
pub fn gelu(x: f64) -> f64 {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// `x · σ(1.702x)`.
pub fn gelu_quick(x: f64) -> f64 {
    x / (1.0 + (-1.702 * x).exp())
}

/// The value of a unary op at `x`.
pub fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Silu => silu(x),
        UnaryOp::Gelu => gelu(x),
        UnaryOp::GeluQuick => gelu_quick(x),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// ggml's ALiBi slope of head `h` of `n_head` (1 when `max_bias <= 0`): with `n = 2^⌊log2 n_head⌋`,
/// `m0 = 2^(−max_bias/n)`, `m1 = 2^(−max_bias/2/n)`, slope = `m0^(h+1)` for `h < n`, else
/// `m1^(2(h−n)+1)`.
pub fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f64 {
    if max_bias <= 0.0 || n_head == 0 {
        return 1.0;
    }
    let n_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let mb = f64::from(max_bias);
    let m0 = 2f64.powf(-mb / n_log2 as f64);
    let m1 = 2f64.powf(-mb / 2.0 / n_log2 as f64);
    if h < n_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_log2) as i32 + 1)
    }
}

/// In-place numerically stable softmax (entries of `-inf` become 0).
fn softmax_in_place(w: &mut [f64]) {
    let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in w.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in w.iter_mut() {
        *v /= sum;
    }
}

// ===== The interpreter =====

/// Byte-faithful storage for a context's tensors plus the evaluator.
#[derive(Clone, Debug)]
pub struct RefMemory {
    tensors: Vec<TensorDesc>,
    data: Vec<Vec<u8>>,
    llama_rounding: bool,
}

/// Whether llama.cpp's CPU backend multiplies weights of type `w` by activations rounded to
/// 8-bit blocks of 32 (ggml's `vec_dot_type` Q8_0, or Q8_1 for Q4_1 / Q5_1, whose levels round
/// the same way): Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4, Q4_1 and Q5_1. The CPU kernels' table of
/// ggml's `vec_dot_type` ([`act_type`]) says which.
pub fn rounds_activations_to_q8(w: DType) -> bool {
    WeightType::of_dtype(w).is_some_and(|wt| matches!(act_type(wt), ActType::Q8_0 | ActType::Q8_1))
}

/// `x` (an activation row, a multiple of 32 long) as ggml's `quantize_row_q8_0_ref` leaves it:
/// each block's levels times its f16 scale (what weights of the types of
/// [`rounds_activations_to_q8`] are multiplied by in llama.cpp).
pub fn round_to_q8_0(x: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    let mut block = [0u8; 34];
    let mut vals = [0f32; QK];
    for chunk in x.chunks(QK) {
        let xs: Vec<f32> = chunk.iter().map(|&v| v as f32).collect();
        quantize_q8_0_block(&xs, &mut block);
        dequantize_q8_0_block(&block, &mut vals);
        out.extend(vals.iter().map(|&v| f64::from(v)));
    }
    out
}

impl RefMemory {
    /// Zeroed storage for every non-view tensor of `tensors` (a context's or graph's descriptors).
    pub fn new(tensors: &[TensorDesc]) -> RefMemory {
        let data = tensors
            .iter()
            .map(|t| {
                if t.is_view() {
                    Vec::new()
                } else {
                    vec![0u8; t.nbytes()]
                }
            })
            .collect();
        RefMemory {
            tensors: tensors.to_vec(),
            data,
            llama_rounding: false,
        }
    }

    /// With `on`, MUL_MAT and MUL_MAT_ID multiply weights of the types of
    /// [`rounds_activations_to_q8`] by activations rounded as llama.cpp's CPU backend rounds
    /// them (Q8_0 blocks), and FLASH_ATTN_EXT rounds its queries for the keys' type
    /// (`query_for`), instead of the exact values: the reference of the conformance cases
    /// that check a backend rounds as llama.cpp does ([`crate::Case::llama_rounding`]).
    pub fn set_llama_rounding(&mut self, on: bool) {
        self.llama_rounding = on;
    }

    /// Query row `q` as its dot products with keys of type `kt` see it: with llama rounding, as
    /// llama.cpp's CPU flash attention converts it to the keys' `vec_dot_type` (Q8_0 blocks for
    /// block types, bf16 for BF16 keys; F16 keys keep it exact, as the backends do: rounding it
    /// to f16 as ggml does moved the CPU backend's logits further from llama.cpp's); else exact.
    fn query_for(&self, kt: DType, q: &[f64]) -> Vec<f64> {
        if !self.llama_rounding {
            return q.to_vec();
        }
        match kt {
            DType::BF16 => q.iter().map(|&x| bf16::from_f64(x).to_f64()).collect(),
            _ => self.activations_for(kt, q.to_vec()),
        }
    }

    /// Activation row `x` as the product with weights of type `w` sees it.
    fn activations_for(&self, w: DType, x: Vec<f64>) -> Vec<f64> {
        if self.llama_rounding && rounds_activations_to_q8(w) && x.len().is_multiple_of(QK) {
            round_to_q8_0(&x)
        } else {
            x
        }
    }

    fn desc(&self, id: TensorId) -> RefResult<&TensorDesc> {
        self.tensors
            .get(id.index())
            .ok_or_else(|| format!("unknown tensor {id}"))
    }

    /// The base tensor index holding `id`'s bytes and the byte offset of `id`'s first element.
    fn base(&self, id: TensorId) -> RefResult<(usize, usize)> {
        let (mut cur, mut off) = (id, 0usize);
        loop {
            let t = self.desc(cur)?;
            match t.view_of() {
                Some(v) => {
                    off += v.offset;
                    cur = v.src;
                }
                None => return Ok((cur.index(), off)),
            }
        }
    }

    /// Writes `bytes` at `id`'s first element (a leaf's full contents, or a contiguous view's).
    ///
    /// # Errors
    /// When the bytes do not fit the base tensor.
    pub fn set_bytes(&mut self, id: TensorId, bytes: &[u8]) -> RefResult<()> {
        let (b, off) = self.base(id)?;
        let buf = &mut self.data[b];
        let len = buf.len();
        buf.get_mut(off..off + bytes.len())
            .ok_or_else(|| {
                format!(
                    "{} bytes at {off} do not fit tensor {id}'s {len} bytes",
                    bytes.len()
                )
            })?
            .copy_from_slice(bytes);
        Ok(())
    }

    /// The [`TensorDesc::nbytes`] bytes starting at `id`'s first element.
    ///
    /// # Errors
    /// When they reach past the base tensor.
    pub fn bytes(&self, id: TensorId) -> RefResult<Vec<u8>> {
        let n = self.desc(id)?.nbytes();
        let (b, off) = self.base(id)?;
        self.data[b]
            .get(off..off + n)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("tensor {id} reaches past its base"))
    }

    /// Row `(i1, i2, i3)` of `id`, decoded.
    ///
    /// # Errors
    /// On out-of-range rows.
    pub fn read_row(&self, id: TensorId, i1: usize, i2: usize, i3: usize) -> RefResult<Vec<f64>> {
        let t = self.desc(id)?;
        let ne = t.ne();
        if i1 >= ne[1] || i2 >= ne[2] || i3 >= ne[3] {
            return Err(format!(
                "row ({i1}, {i2}, {i3}) is outside tensor {id} of shape {ne:?}"
            ));
        }
        let (b, off) = self.base(id)?;
        decode_row_at(t, &self.data[b], off, [i1, i2, i3])
    }

    /// Every element of `id` in logical order, decoded.
    ///
    /// # Errors
    /// On broken views.
    pub fn read(&self, id: TensorId) -> RefResult<Vec<f64>> {
        let t = self.desc(id)?;
        let (b, off) = self.base(id)?;
        decode_strided(t, &self.data[b], off)
    }

    fn write_row(&mut self, id: TensorId, i: [usize; 3], vals: &[f64]) -> RefResult<()> {
        let t = self.desc(id)?.clone();
        let ne = t.ne();
        if i[0] >= ne[1] || i[1] >= ne[2] || i[2] >= ne[3] {
            return Err(format!("row {i:?} is outside tensor {id} of shape {ne:?}"));
        }
        let (b, off) = self.base(id)?;
        encode_row_at(&t, &mut self.data[b], off, i, vals)
    }

    /// Writes all elements of `id` (logical order), row by row.
    fn write(&mut self, id: TensorId, vals: &[f64]) -> RefResult<()> {
        let ne = self.desc(id)?.ne();
        if vals.len() != ne.iter().product::<usize>() {
            return Err(format!(
                "{} values for tensor {id} of shape {ne:?}",
                vals.len()
            ));
        }
        let mut rows = vals.chunks(ne[0].max(1));
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let row = rows.next().unwrap_or(&[]);
                    self.write_row(id, [i1, i2, i3], row)?;
                }
            }
        }
        Ok(())
    }

    /// Evaluates every node of `graph` in order. Leaves must have been set with
    /// [`RefMemory::set_bytes`]; `graph` must come from the same descriptors as this memory.
    ///
    /// # Errors
    /// A message naming the node when an op is malformed or unknown to the reference.
    pub fn eval(&mut self, graph: &Graph) -> RefResult<()> {
        for &id in graph.nodes() {
            self.eval_node(id).map_err(|e| {
                format!(
                    "reference {} {id}: {e}",
                    self.desc(id).map_or("?", |t| t.op().name())
                )
            })?;
        }
        Ok(())
    }

    /// Evaluates one node, reading its sources from storage and writing its result.
    ///
    /// # Errors
    /// As [`RefMemory::eval`].
    pub fn eval_node(&mut self, id: TensorId) -> RefResult<()> {
        let t = self.desc(id)?.clone();
        let src = |i: usize| t.src(i).ok_or_else(|| format!("missing source {i}"));
        let ne = t.ne();
        match *t.op() {
            Op::None | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose => Ok(()),
            Op::Cont | Op::Cpy => {
                // Flat element order: shapes may differ when element counts agree.
                let v = self.read(src(0)?)?;
                self.write(id, &v)
            }
            Op::GetRows => self.get_rows(id, src(0)?, src(1)?),
            Op::SetRows => self.set_rows(id, src(0)?, src(1)?),
            Op::Concat { dim } => self.concat(id, src(0)?, src(1)?, dim),
            Op::Add => self.binary(id, src(0)?, src(1)?, |a, b| a + b),
            Op::Sub => self.binary(id, src(0)?, src(1)?, |a, b| a - b),
            Op::Mul => self.binary(id, src(0)?, src(1)?, |a, b| a * b),
            Op::Div => self.binary(id, src(0)?, src(1)?, |a, b| a / b),
            Op::Scale { scale, bias } => {
                self.map(id, src(0)?, |x| x * f64::from(scale) + f64::from(bias))
            }
            Op::Sqr => self.map(id, src(0)?, |x| x * x),
            Op::Sqrt => self.map(id, src(0)?, f64::sqrt),
            Op::Clamp { min, max } => {
                self.map(id, src(0)?, |x| x.clamp(f64::from(min), f64::from(max)))
            }
            Op::Unary(u) => self.map(id, src(0)?, |x| unary(u, x)),
            Op::Glu { op, swapped } => {
                let act = match op {
                    GluOp::Swiglu => silu,
                    GluOp::Geglu => gelu,
                };
                if let Some(up) = t.src(1) {
                    let (g, u) = (self.read(src(0)?)?, self.read(up)?);
                    let out: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| act(g) * u).collect();
                    self.write(id, &out)
                } else {
                    let a = self.read(src(0)?)?;
                    let nc = ne[0];
                    let mut out = Vec::with_capacity(t.nelements());
                    for row in a.chunks_exact(2 * nc) {
                        let (first, second) = row.split_at(nc);
                        let (g, u) = if swapped {
                            (second, first)
                        } else {
                            (first, second)
                        };
                        out.extend(g.iter().zip(u).map(|(&g, &u)| act(g) * u));
                    }
                    self.write(id, &out)
                }
            }
            Op::RmsNorm { eps } => self.rows(id, src(0)?, |row| {
                let ms = row.iter().map(|x| x * x).sum::<f64>() / row.len() as f64;
                let s = 1.0 / (ms + f64::from(eps)).sqrt();
                row.iter().map(|x| x * s).collect()
            }),
            Op::Norm { eps } => self.rows(id, src(0)?, |row| {
                let n = row.len() as f64;
                let mean = row.iter().sum::<f64>() / n;
                let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
                let s = 1.0 / (var + f64::from(eps)).sqrt();
                row.iter().map(|x| (x - mean) * s).collect()
            }),
            Op::SumRows => self.rows(id, src(0)?, |row| vec![row.iter().sum()]),
            Op::Argmax => self.rows(id, src(0)?, |row| {
                let mut best = 0;
                for (i, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = i;
                    }
                }
                vec![best as f64]
            }),
            Op::SoftMax { scale, max_bias } => {
                self.soft_max(id, src(0)?, t.src(1), scale, max_bias)
            }
            Op::Rope(p) => {
                let a = self.read(src(0)?)?;
                let pos = self.read(src(1)?)?;
                let half = p.n_dims / 2;
                let factors = match t.src(2) {
                    Some(f) => self.read(f)?,
                    None => vec![1.0; half],
                };
                let mut out = a.clone();
                for (r, row) in out.chunks_exact_mut(ne[0]).enumerate() {
                    let i2 = (r / ne[1]) % ne[2];
                    let pos = pos.get(i2).copied().ok_or("too few positions")?;
                    for i in 0..half {
                        let theta = pos
                            * f64::from(p.freq_scale)
                            * f64::from(p.freq_base).powf(-2.0 * i as f64 / p.n_dims as f64)
                            / factors.get(i).copied().ok_or("too few frequency factors")?;
                        let (sin, cos) = theta.sin_cos();
                        let (j0, j1) = match p.mode {
                            RopeMode::Normal => (2 * i, 2 * i + 1),
                            RopeMode::Neox => (i, i + half),
                        };
                        let (x0, x1) = (row[j0], row[j1]);
                        row[j0] = x0 * cos - x1 * sin;
                        row[j1] = x0 * sin + x1 * cos;
                    }
                }
                self.write(id, &out)
            }
            Op::MulMat => self.mul_mat(id, src(0)?, src(1)?),
            Op::MulMatId { first_expert } => {
                self.mul_mat_id(id, src(0)?, src(1)?, src(2)?, first_expert)
            }
            Op::AddId => {
                let n_expert = self.desc(src(1)?)?.ne()[1];
                for i2 in 0..ne[2] {
                    for i1 in 0..ne[1] {
                        let e = self.index(src(2)?, [i1, i2, 0], n_expert)?;
                        let a = self.read_row(src(0)?, i1, i2, 0)?;
                        let b = self.read_row(src(1)?, e, 0, 0)?;
                        let out: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
                        self.write_row(id, [i1, i2, 0], &out)?;
                    }
                }
                Ok(())
            }
            Op::Argsort { descending } => self.rows(id, src(0)?, |row| {
                let mut order: Vec<usize> = (0..row.len()).collect();
                // Stable: ties keep index order.
                order.sort_by(|&p, &q| {
                    let o = row[p].total_cmp(&row[q]);
                    if descending { o.reverse() } else { o }
                });
                order.into_iter().map(|i| i as f64).collect()
            }),
            Op::SwigluOai { alpha, limit } => {
                let (g, u) = (self.read(src(0)?)?, self.read(src(1)?)?);
                let (alpha, limit) = (f64::from(alpha), f64::from(limit));
                let out: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| {
                        let g = g.min(limit);
                        let u = u.clamp(-limit, limit);
                        g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
                    })
                    .collect();
                self.write(id, &out)
            }
            Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
            } => self.flash_attn(
                id,
                [src(0)?, src(1)?, src(2)?],
                [t.src(3), t.src(4)],
                scale,
                max_bias,
                softcap,
            ),
            other => Err(format!("the reference does not implement {}", other.name())),
        }
    }

    fn map(&mut self, id: TensorId, a: TensorId, f: impl Fn(f64) -> f64) -> RefResult<()> {
        let out: Vec<f64> = self.read(a)?.into_iter().map(f).collect();
        self.write(id, &out)
    }

    /// Row-wise ops: `f` maps each source row to the output row (the output's rows are in the
    /// same order as the source's).
    fn rows(&mut self, id: TensorId, a: TensorId, f: impl Fn(&[f64]) -> Vec<f64>) -> RefResult<()> {
        let ne0 = self.desc(a)?.ne()[0];
        let v = self.read(a)?;
        let out: Vec<f64> = v.chunks_exact(ne0.max(1)).flat_map(f).collect();
        self.write(id, &out)
    }

    fn binary(
        &mut self,
        id: TensorId,
        a: TensorId,
        b: TensorId,
        f: impl Fn(f64, f64) -> f64,
    ) -> RefResult<()> {
        let ne = self.desc(id)?.ne();
        let nb = self.desc(b)?.ne();
        let (va, vb) = (self.read(a)?, self.read(b)?);
        let out: Vec<f64> = indices(ne)
            .map(|i| {
                let ib = [i[0] % nb[0], i[1] % nb[1], i[2] % nb[2], i[3] % nb[3]];
                f(va[flat(ne, i)], vb[flat(nb, ib)])
            })
            .collect();
        self.write(id, &out)
    }

    fn concat(&mut self, id: TensorId, a: TensorId, b: TensorId, dim: usize) -> RefResult<()> {
        let ne = self.desc(id)?.ne();
        let (na, nb) = (self.desc(a)?.ne(), self.desc(b)?.ne());
        let (va, vb) = (self.read(a)?, self.read(b)?);
        let out: Vec<f64> = indices(ne)
            .map(|mut i| {
                if i[dim] < na[dim] {
                    va[flat(na, i)]
                } else {
                    i[dim] -= na[dim];
                    vb[flat(nb, i)]
                }
            })
            .collect();
        self.write(id, &out)
    }

    fn index(&self, ids: TensorId, i: [usize; 3], limit: usize) -> RefResult<usize> {
        let row = self.read_row(ids, i[1], i[2], 0)?;
        let v = row
            .get(i[0])
            .copied()
            .ok_or("index outside the id tensor")?;
        if v < 0.0 || v as usize >= limit {
            return Err(format!("row index {v} at {i:?} is outside 0..{limit}"));
        }
        Ok(v as usize)
    }

    fn get_rows(&mut self, id: TensorId, a: TensorId, ids: TensorId) -> RefResult<()> {
        let ne = self.desc(id)?.ne();
        let nrows = self.desc(a)?.ne()[1];
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let r = self.index(ids, [i1, i2, i3], nrows)?;
                    let row = self.read_row(a, r, i2, i3)?;
                    self.write_row(id, [i1, i2, i3], &row)?;
                }
            }
        }
        Ok(())
    }

    fn set_rows(&mut self, id: TensorId, src: TensorId, ids: TensorId) -> RefResult<()> {
        let ns = self.desc(src)?.ne();
        let ni = self.desc(ids)?.ne();
        let nrows = self.desc(id)?.ne()[1];
        for i3 in 0..ns[3] {
            for i2 in 0..ns[2] {
                for i1 in 0..ns[1] {
                    let r = self.index(ids, [i1, i2 % ni[1], i3 % ni[2]], nrows)?;
                    let row = self.read_row(src, i1, i2, i3)?;
                    self.write_row(id, [r, i2, i3], &row)?;
                }
            }
        }
        Ok(())
    }

    fn soft_max(
        &mut self,
        id: TensorId,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> RefResult<()> {
        let ne = self.desc(a)?.ne();
        let v = self.read(a)?;
        let nm = match mask {
            Some(m) => self.desc(m)?.ne(),
            None => [1; 4],
        };
        let mut out = Vec::with_capacity(v.len());
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                let slope = alibi_slope(max_bias, ne[2], i2);
                for i1 in 0..ne[1] {
                    let start = flat(ne, [0, i1, i2, i3]);
                    let mut w: Vec<f64> = v[start..start + ne[0]]
                        .iter()
                        .map(|x| x * f64::from(scale))
                        .collect();
                    if let Some(m) = mask {
                        let mrow = self.read_row(m, i1, i2 % nm[2], i3 % nm[3])?;
                        for (w, m) in w.iter_mut().zip(mrow) {
                            *w += slope * m;
                        }
                    }
                    softmax_in_place(&mut w);
                    out.extend(w);
                }
            }
        }
        self.write(id, &out)
    }

    fn mul_mat(&mut self, id: TensorId, a: TensorId, b: TensorId) -> RefResult<()> {
        let [k, m, a2, a3] = self.desc(a)?.ne();
        let [_, n, b2, b3] = self.desc(b)?.ne();
        let wtype = self.desc(a)?.dtype();
        let (va, vb) = (self.read(a)?, self.read(b)?);
        let (r2, r3) = (b2 / a2, b3 / a3);
        let mut out = Vec::with_capacity(m * n * b2 * b3);
        for i3 in 0..b3 {
            for i2 in 0..b2 {
                for i1 in 0..n {
                    let brow = self.activations_for(
                        wtype,
                        vb[flat([k, n, b2, b3], [0, i1, i2, i3])..][..k].to_vec(),
                    );
                    for i0 in 0..m {
                        let arow = &va[flat([k, m, a2, a3], [0, i0, i2 / r2, i3 / r3])..][..k];
                        out.push(arow.iter().zip(&brow).map(|(x, y)| x * y).sum());
                    }
                }
            }
        }
        self.write(id, &out)
    }

    fn mul_mat_id(
        &mut self,
        id: TensorId,
        a: TensorId,
        b: TensorId,
        ids: TensorId,
        first_expert: Option<usize>,
    ) -> RefResult<()> {
        let [_, m, n_expert, _] = self.desc(a)?.ne();
        let n_b = self.desc(b)?.ne()[1];
        let [_, n_used, n_tok, _] = self.desc(id)?.ne();
        for t in 0..n_tok {
            for i in 0..n_used {
                let e = match first_expert {
                    None => self.index(ids, [i, t, 0], n_expert)?,
                    // Local-range form: an expert outside first..first + n_expert gives zeros.
                    Some(first) => {
                        let e = self.index(ids, [i, t, 0], usize::MAX)?;
                        match e.checked_sub(first).filter(|&l| l < n_expert) {
                            Some(l) => l,
                            None => {
                                self.write_row(id, [i, t, 0], &vec![0.0; m])?;
                                continue;
                            }
                        }
                    }
                };
                let x =
                    self.activations_for(self.desc(a)?.dtype(), self.read_row(b, i % n_b, t, 0)?);
                let out = (0..m)
                    .map(|r| {
                        let w = self.read_row(a, r, e, 0)?;
                        Ok(w.iter().zip(&x).map(|(p, q)| p * q).sum())
                    })
                    .collect::<RefResult<Vec<f64>>>()?;
                self.write_row(id, [i, t, 0], &out)?;
            }
        }
        Ok(())
    }

    fn flash_attn(
        &mut self,
        id: TensorId,
        [q, k, v]: [TensorId; 3],
        [mask, sinks]: [Option<TensorId>; 2],
        scale: f32,
        max_bias: f32,
        softcap: f32,
    ) -> RefResult<()> {
        let sinks = match sinks {
            Some(s) => Some(self.read(s)?),
            None => None,
        };
        let nq = self.desc(q)?.ne();
        let nk = self.desc(k)?.ne();
        let nv = self.desc(v)?.ne();
        let (vq, vk, vv) = (self.read(q)?, self.read(k)?, self.read(v)?);
        let [d, n_q, h, batch] = nq;
        let (n_kv, h_kv, dv) = (nk[1], nk[2], nv[0]);
        let kt = self.desc(k)?.dtype();
        let ratio = h / h_kv;
        let out_ne = [dv, h, n_q, batch];
        let mut out = vec![0.0; dv * h * n_q * batch];
        let (scale, softcap) = (f64::from(scale), f64::from(softcap));
        for ib in 0..batch {
            for iq in 0..n_q {
                let mrow = match mask {
                    // One mask plane for all batches, or one per batch.
                    Some(m) => {
                        let mb = if self.desc(m)?.ne()[3] == 1 { 0 } else { ib };
                        Some(self.read_row(m, iq, 0, mb)?)
                    }
                    None => None,
                };
                for ih in 0..h {
                    let ikv = ih / ratio;
                    let slope = alibi_slope(max_bias, h, ih);
                    let qrow = self.query_for(kt, &vq[flat(nq, [0, iq, ih, ib])..][..d]);
                    let mut s: Vec<f64> = (0..n_kv)
                        .map(|j| {
                            let krow = &vk[flat(nk, [0, j, ikv, ib])..][..d];
                            let mut x =
                                scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>();
                            if softcap != 0.0 {
                                x = softcap * (x / softcap).tanh();
                            }
                            if let Some(m) = &mrow {
                                x += slope * m[j];
                            }
                            x
                        })
                        .collect();
                    // A sink is one more logit with no value: softmax over it, then drop it.
                    let sink = sinks.as_ref().and_then(|v| v.get(ih).copied());
                    if let Some(x) = sink {
                        s.push(x);
                    }
                    softmax_in_place(&mut s);
                    if sink.is_some() {
                        s.pop();
                    }
                    let o = flat(out_ne, [0, ih, iq, ib]);
                    for (j, p) in s.iter().enumerate() {
                        let vrow = &vv[flat(nv, [0, j, ikv, ib])..][..dv];
                        for (acc, x) in out[o..o + dv].iter_mut().zip(vrow) {
                            *acc += p * x;
                        }
                    }
                }
            }
        }
        self.write(id, &out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::{Context, RopeParams};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Evaluates `out` with the given leaf values (encoded to each leaf's dtype).
    fn run(
        ctx: &Context,
        leaves: &[(TensorId, &[f64])],
        out: TensorId,
    ) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
        let graph = ctx.build_forward(out)?;
        let mut mem = RefMemory::new(ctx.tensors());
        for (id, vals) in leaves {
            mem.set_bytes(*id, &encode(ctx.tensor(*id)?.dtype(), vals)?)?;
        }
        mem.eval(&graph)?;
        Ok(mem.read(out)?)
    }

    fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    #[test]
    fn q8_0_block_matches_ggml_reference() {
        let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
        let mut b = [0u8; 34];
        quantize_q8_0_block(&x, &mut b);
        assert_eq!(
            f16::from_le_bytes([b[0], b[1]]),
            f16::from_f32(16.0 / 127.0)
        );
        assert_eq!(b[2] as i8, -127);
        assert_eq!(b[2 + 16] as i8, 0);
        // 15 · 127/16 = 119.06 → 119.
        assert_eq!(b[2 + 31] as i8, 119);
        let mut y = [0.0f32; 32];
        dequantize_q8_0_block(&b, &mut y);
        let d = f16::from_f32(16.0 / 127.0).to_f32();
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= d * 0.5 + 1e-2, "{a} vs {b}");
        }
    }

    #[test]
    fn q4_0_block_matches_ggml_reference() {
        let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
        let mut b = [0u8; 18];
        quantize_q4_0_block(&x, &mut b);
        // max = −16 (the first value of largest magnitude), d = −16 / −8 = 2.
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 2.0);
        let mut y = [0.0f32; 32];
        dequantize_q4_0_block(&b, &mut y);
        assert_eq!(y[0], -16.0);
        assert_eq!(y[1], -14.0); // −7.5 + 8.5 = 1 → (1 − 8)·2
        assert_eq!(y[16], 0.0);
        assert_eq!(y[31], 14.0); // clamped to nibble 15
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 2.0, "{a} vs {b}");
        }
        // All-zero blocks stay zero.
        quantize_q4_0_block(&[0.0; 32], &mut b);
        dequantize_q4_0_block(&b, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn encode_decode_round_trips() -> TestResult {
        let vals: Vec<f64> = (0..64).map(|i| (i as f64 - 30.0) / 16.0).collect();
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0] {
            let back = decode(dtype, &encode(dtype, &vals)?, vals.len())?;
            // Multiples of 1/16 in [-2, 2] are exact in every float type and on the Q8_0 grid.
            let tol = if dtype == DType::Q8_0 {
                2.0 / 127.0
            } else {
                0.0
            };
            assert!(close(&back, &vals, tol), "{dtype}: {back:?}");
        }
        let q4 = decode(DType::Q4_0, &encode(DType::Q4_0, &vals)?, 64)?;
        assert!(close(&q4, &vals, 2.0 / 8.0 + 1e-3), "{q4:?}");
        assert!(encode(DType::Q8_0, &vals[..31]).is_err());
        Ok(())
    }

    #[test]
    fn mul_mat_by_hand() -> TestResult {
        let mut ctx = Context::new();
        // a: k = 2, m = 3 rows [1 2], [3 4], [5 6]; b: n = 2 columns [1 1], [0 −1].
        let a = ctx.new_tensor(DType::F32, [2, 3])?;
        let b = ctx.new_tensor(DType::F32, [2, 2])?;
        let y = ctx.mul_mat(a, b)?;
        let out = run(
            &ctx,
            &[(a, &[1., 2., 3., 4., 5., 6.]), (b, &[1., 1., 0., -1.])],
            y,
        )?;
        assert_eq!(out, vec![3., 7., 11., -2., -4., -6.]);
        Ok(())
    }

    #[test]
    fn mul_mat_broadcasts_weights_over_batches() -> TestResult {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, [1, 1, 2, 1])?; // two 1×1 matrices: 10, 20
        let b = ctx.new_tensor(DType::F32, [1, 1, 4, 1])?; // four batches: 1, 2, 3, 4
        let y = ctx.mul_mat(a, b)?;
        let out = run(&ctx, &[(a, &[10., 20.]), (b, &[1., 2., 3., 4.])], y)?;
        // Batches 0, 1 use matrix 0; 2, 3 use matrix 1 (i2 / (b2 / a2)).
        assert_eq!(out, vec![10., 20., 60., 80.]);
        Ok(())
    }

    #[test]
    fn rope_by_hand() -> TestResult {
        for (mode, expect) in [
            // θ0 = 1 rotates (x0, x1); θ1 = 10000^(−1/2) = 0.01 rotates (x2, x3).
            (
                RopeMode::Normal,
                [1f64.cos(), 1f64.sin(), 0.01f64.cos(), 0.01f64.sin()],
            ),
            // NeoX pairs (x0, x2) with θ0 and (x1, x3) with θ1.
            (
                RopeMode::Neox,
                [
                    1f64.cos() - 1f64.sin(),
                    0.01f64.cos(),
                    1f64.sin() + 1f64.cos(),
                    0.01f64.sin(),
                ],
            ),
        ] {
            let mut ctx = Context::new();
            let x = ctx.new_tensor(DType::F32, [4, 1, 1])?;
            let pos = ctx.new_tensor(DType::I32, [1])?;
            let p = RopeParams {
                n_dims: 4,
                mode,
                freq_base: 10000.0,
                freq_scale: 1.0,
            };
            let y = ctx.rope(x, pos, p)?;
            let input: &[f64] = match mode {
                RopeMode::Normal => &[1., 0., 1., 0.],
                RopeMode::Neox => &[1., 1., 1., 0.],
            };
            let out = run(&ctx, &[(x, input), (pos, &[1.])], y)?;
            assert!(
                close(&out, &expect, 1e-6),
                "{mode:?}: {out:?} vs {expect:?}"
            );
        }
        // Dimensions past n_dims are copied; freq_scale scales positions.
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [4, 1, 1])?;
        let pos = ctx.new_tensor(DType::I32, [1])?;
        let p = RopeParams {
            n_dims: 2,
            mode: RopeMode::Normal,
            freq_base: 10000.0,
            freq_scale: 0.5,
        };
        let y = ctx.rope(x, pos, p)?;
        let out = run(&ctx, &[(x, &[1., 0., 7., 9.]), (pos, &[2.])], y)?;
        assert!(
            close(&out, &[1f64.cos(), 1f64.sin(), 7., 9.], 1e-6),
            "{out:?}"
        );
        Ok(())
    }

    #[test]
    fn soft_max_by_hand() -> TestResult {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [3, 1])?;
        let y = ctx.soft_max(x)?;
        let out = run(&ctx, &[(x, &[1., 2., 3.])], y)?;
        let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
        assert!(
            close(
                &out,
                &[1f64.exp() / z, 2f64.exp() / z, 3f64.exp() / z],
                1e-7
            ),
            "{out:?}"
        );

        // scale 2 and a mask with −inf: softmax([2 + 0, −inf, 6 − 1]).
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [3, 1])?;
        let m = ctx.new_tensor(DType::F16, [3, 1])?;
        let y = ctx.soft_max_ext(x, Some(m), 2.0, 0.0)?;
        let out = run(
            &ctx,
            &[(x, &[1., 2., 3.]), (m, &[0., f64::NEG_INFINITY, -1.])],
            y,
        )?;
        let z = 2f64.exp() + 5f64.exp();
        assert!(
            close(&out, &[2f64.exp() / z, 0.0, 5f64.exp() / z], 1e-7),
            "{out:?}"
        );
        Ok(())
    }

    #[test]
    fn alibi_slopes_follow_ggml() {
        // 8 heads, max_bias 8: m0 = 2^-1, slopes 1/2, 1/4, ..., 1/256.
        for h in 0..8 {
            assert!((alibi_slope(8.0, 8, h) - 0.5f64.powi(h as i32 + 1)).abs() < 1e-12);
        }
        // 6 heads: n_head_log2 = 4, m0 = 2^-2, m1 = 2^-1; heads 4, 5 → m1^1, m1^3.
        assert!((alibi_slope(8.0, 6, 3) - 0.25f64.powi(4)).abs() < 1e-12);
        assert!((alibi_slope(8.0, 6, 4) - 0.5).abs() < 1e-12);
        assert!((alibi_slope(8.0, 6, 5) - 0.125).abs() < 1e-12);
        assert_eq!(alibi_slope(0.0, 6, 5), 1.0);
    }

    #[test]
    fn get_rows_and_set_rows_by_hand() -> TestResult {
        let mut ctx = Context::new();
        let table = ctx.new_tensor(DType::F16, [2, 3])?;
        let ids = ctx.new_tensor(DType::I32, [3])?;
        let y = ctx.get_rows(table, ids)?;
        assert_eq!(ctx.tensor(y)?.dtype(), DType::F32);
        let out = run(
            &ctx,
            &[(table, &[1., 2., 3., 4., 5., 6.]), (ids, &[2., 0., 2.])],
            y,
        )?;
        assert_eq!(out, vec![5., 6., 1., 2., 5., 6.]);

        let mut ctx = Context::new();
        let dst = ctx.new_tensor(DType::F16, [2, 4])?;
        let src = ctx.new_tensor(DType::F32, [2, 2])?;
        let ids = ctx.new_tensor(DType::I32, [2])?;
        let y = ctx.set_rows(dst, src, ids)?;
        let out = run(
            &ctx,
            &[
                (dst, &[0., 0., 1., 1., 2., 2., 3., 3.]),
                (src, &[7., 8., 9., 10.]),
                (ids, &[3., 1.]),
            ],
            y,
        )?;
        assert_eq!(out, vec![0., 0., 9., 10., 2., 2., 7., 8.]);
        // Out-of-range indices are errors, not panics.
        let graph = ctx.build_forward(y)?;
        let mut mem = RefMemory::new(ctx.tensors());
        mem.set_bytes(ids, &encode(DType::I32, &[4., 0.])?)?;
        assert!(mem.eval(&graph).is_err());
        Ok(())
    }

    #[test]
    fn views_read_and_write_through_their_base() -> TestResult {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, [3, 2])?; // rows [0 1 2], [3 4 5]
        let t = ctx.transpose(a)?; // [2, 3]: rows [0 3], [1 4], [2 5]
        let c = ctx.cont(t)?;
        let out = run(&ctx, &[(a, &[0., 1., 2., 3., 4., 5.])], c)?;
        assert_eq!(out, vec![0., 3., 1., 4., 2., 5.]);
        // cpy into a strided view of a bigger tensor writes only the window.
        let big = ctx.new_tensor(DType::F32, [4, 2])?;
        let win = ctx.view(big, [2, 2], [16, 32, 32], 4)?;
        let src = ctx.new_tensor(DType::F32, [2, 2])?;
        let cp = ctx.cpy(src, win)?;
        let graph = ctx.build_forward(cp)?;
        let mut mem = RefMemory::new(ctx.tensors());
        mem.set_bytes(src, &encode(DType::F32, &[1., 2., 3., 4.])?)?;
        mem.eval(&graph)?;
        assert_eq!(mem.read(big)?, vec![0., 1., 2., 0., 0., 3., 4., 0.]);
        Ok(())
    }

    #[test]
    fn unary_and_glu_values() -> TestResult {
        assert!((gelu(1.0) - 0.841_191_990).abs() < 1e-6);
        assert!((silu(1.0) - 0.731_058_579).abs() < 1e-9);
        assert!((gelu_quick(1.0) - 0.845_795_1).abs() < 1e-6);
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [4, 1])?;
        let y = ctx.glu(x, GluOp::Swiglu, false)?;
        let z = ctx.glu(x, GluOp::Swiglu, true)?;
        let out = run(&ctx, &[(x, &[1., 2., 3., 4.])], y)?;
        assert!(
            close(&out, &[silu(1.) * 3., silu(2.) * 4.], 1e-6),
            "{out:?}"
        );
        let out = run(&ctx, &[(x, &[1., 2., 3., 4.])], z)?;
        assert!(
            close(&out, &[silu(3.) * 1., silu(4.) * 2.], 1e-6),
            "{out:?}"
        );
        Ok(())
    }

    /// Flash attention equals the composed graph softmax(scale·KᵀQ + slope·mask)·V, with GQA,
    /// ALiBi and softcap (composed as scale → tanh → scale).
    #[test]
    fn flash_attn_matches_composed_attention() -> TestResult {
        let (d, dv, n_q, n_kv, h, h_kv) = (8, 4, 3, 5, 4, 2);
        for (softcap, max_bias) in [(0.0f32, 0.0f32), (0.0, 4.0), (2.0, 0.0)] {
            let scale = 0.7f32;
            let mut ctx = Context::new();
            let q = ctx.new_tensor(DType::F32, [d, n_q, h, 1])?;
            let k = ctx.new_tensor(DType::F32, [d, n_kv, h_kv, 1])?;
            let v = ctx.new_tensor(DType::F32, [dv, n_kv, h_kv, 1])?;
            let m = ctx.new_tensor(DType::F32, [n_kv, n_q + 1])?;
            let fa = ctx.flash_attn_ext(q, k, v, Some(m), scale, max_bias, softcap)?;
            // Composed: kq [n_kv, n_q, h] (k broadcast over q heads), softmax, then vᵀ·kq.
            let kq = ctx.mul_mat(k, q)?;
            let kq = if softcap != 0.0 {
                let s = ctx.scale(kq, scale / softcap)?;
                let s = ctx.unary(s, UnaryOp::Tanh)?;
                let s = ctx.scale(s, softcap)?;
                ctx.soft_max_ext(s, Some(m), 1.0, max_bias)?
            } else {
                ctx.soft_max_ext(kq, Some(m), scale, max_bias)?
            };
            let vt = ctx.transpose(v)?;
            let vt = ctx.cont(vt)?; // [n_kv, dv, h_kv]
            let kqv = ctx.mul_mat(vt, kq)?; // [dv, n_q, h]
            let kqv = ctx.permute(kqv, [0, 2, 1, 3])?; // [dv, h, n_q]
            let composed = ctx.cont(kqv)?;
            assert_eq!(ctx.tensor(composed)?.ne(), ctx.tensor(fa)?.ne());

            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            let mut rand = |n: usize| -> Vec<f64> {
                (0..n)
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        (rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                    })
                    .collect()
            };
            let (vq, vk, vv) = (
                rand(d * n_q * h),
                rand(d * n_kv * h_kv),
                rand(dv * n_kv * h_kv),
            );
            let mut vm = rand(n_kv * (n_q + 1));
            vm[3] = f64::NEG_INFINITY;
            vm[n_kv + 1] = f64::NEG_INFINITY;
            let graph = ctx.build_forward_multi(&[fa, composed])?;
            let mut mem = RefMemory::new(ctx.tensors());
            for (id, vals) in [(q, &vq), (k, &vk), (v, &vv), (m, &vm)] {
                mem.set_bytes(id, &encode(DType::F32, vals)?)?;
            }
            mem.eval(&graph)?;
            let (a, b) = (mem.read(fa)?, mem.read(composed)?);
            assert!(
                close(&a, &b, 1e-5),
                "softcap {softcap} max_bias {max_bias}:\n{a:?}\n{b:?}"
            );
            assert!(a.iter().any(|x| x.abs() > 1e-3));
        }
        Ok(())
    }

    #[test]
    fn concat_and_broadcast_binary() -> TestResult {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, [2, 2])?;
        let b = ctx.new_tensor(DType::F32, [1, 2])?;
        let c = ctx.concat(a, b, 0)?;
        let out = run(&ctx, &[(a, &[1., 2., 3., 4.]), (b, &[5., 6.])], c)?;
        assert_eq!(out, vec![1., 2., 5., 3., 4., 6.]);
        let r = ctx.new_tensor(DType::F32, [2, 1])?;
        let s = ctx.sub(a, r)?;
        let out = run(&ctx, &[(a, &[1., 2., 3., 4.]), (r, &[1., 10.])], s)?;
        assert_eq!(out, vec![0., -8., 2., -6.]);
        Ok(())
    }

    #[test]
    fn norms_and_reductions() -> TestResult {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [4, 1])?;
        let rms = ctx.rms_norm(x, 0.0)?;
        let norm = ctx.norm(x, 0.0)?;
        let sum = ctx.sum_rows(x)?;
        let arg = ctx.argmax(x)?;
        let input: &[f64] = &[1., 3., 3., -1.];
        let out = run(&ctx, &[(x, input)], rms)?;
        let r = (20f64 / 4.0).sqrt();
        assert!(
            close(&out, &[1. / r, 3. / r, 3. / r, -1. / r], 1e-6),
            "{out:?}"
        );
        let out = run(&ctx, &[(x, input)], norm)?;
        let sd = 2.75f64.sqrt(); // mean 1.5, variance (0.25 + 2.25 + 2.25 + 6.25) / 4
        assert!(
            close(&out, &[-0.5 / sd, 1.5 / sd, 1.5 / sd, -2.5 / sd], 1e-6),
            "{out:?}"
        );
        assert_eq!(run(&ctx, &[(x, input)], sum)?, vec![6.]);
        // The first of equal maxima.
        assert_eq!(run(&ctx, &[(x, input)], arg)?, vec![1.]);
        Ok(())
    }
}
