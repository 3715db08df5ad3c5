//! Golden values from ggml itself (`kernels/tools/ggml_golden.c` run against llama.cpp's ggml
//! 0.25.3 build): the quantizers and dequantizers here (Q5_0, the K-quants, Q4_1, Q5_1, Q8_1) must
//! reproduce ggml's reference output bit for bit, and the vec_dot kernels must agree with ggml's
//! CPU `vec_dot` on the same bytes up to f32 summation order.

use super::affine::*;
use super::dot::{
    vec_dot_q4_1_q8_1_with_isa, vec_dot_q4_k_q8_k_with_isa, vec_dot_q5_0_q8_0_with_isa,
    vec_dot_q5_1_q8_1_with_isa, vec_dot_q5_k_q8_k_with_isa, vec_dot_q6_k_q8_k_with_isa,
};
use super::features::Isa;
use super::kquant::*;
use super::quant::quantize_row_q8_0;

pub(super) const N: usize = 1024;

/// Mirrors `gen` in ggml_golden.c (xorshift32; every float operation exact or in the same order).
pub(super) fn golden_input(dist: u32) -> Vec<f32> {
    let mut s: u32 = 0x9E37_79B9 ^ (dist * 7919 + 1);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    let mut out = Vec::with_capacity(N);
    for i in 0..N {
        let mut unif = || (next() >> 8) as f32 * (1.0f32 / 8_388_608.0) - 1.0;
        let v = unif();
        out.push(match dist {
            0 => v,
            1 => v * 3.0 + if i % 37 == 0 { unif() * 40.0 } else { 0.0 },
            2 => v + 1.5,
            3 => match i {
                0..256 => v * 1e-3,
                256..512 => 0.0,
                512..768 => v * 1e-20,
                _ => v * 1e-7,
            },
            4 => {
                if next() % 8 == 0 {
                    v * 2.0
                } else {
                    0.0
                }
            }
            5 => (((i / 32) % 3) as i32 - 1) as f32 * 0.5 + if i % 64 == 5 { v } else { 0.0 },
            6 => -(v + 1.5),
            _ => v * 1e4,
        });
    }
    out
}

pub(super) fn fnv(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

type QuantFn = fn(&[f32], &mut [u8]);
type DequantFn = fn(&[u8], &mut [f32]);

fn codec(name: &str) -> (QuantFn, DequantFn, usize, usize) {
    match name {
        "q5_0" => (
            quantize_row_q5_0,
            dequantize_row_q5_0,
            BLOCK_Q5_0_BYTES,
            QK5_0,
        ),
        "q4_1" => (
            quantize_row_q4_1,
            dequantize_row_q4_1,
            BLOCK_Q4_1_BYTES,
            QK4_1,
        ),
        "q5_1" => (
            quantize_row_q5_1,
            dequantize_row_q5_1,
            BLOCK_Q5_1_BYTES,
            QK5_1,
        ),
        "q4_K" => (
            quantize_row_q4_k,
            dequantize_row_q4_k,
            BLOCK_Q4_K_BYTES,
            QK_K,
        ),
        "q5_K" => (
            quantize_row_q5_k,
            dequantize_row_q5_k,
            BLOCK_Q5_K_BYTES,
            QK_K,
        ),
        "q6_K" => (
            quantize_row_q6_k,
            dequantize_row_q6_k,
            BLOCK_Q6_K_BYTES,
            QK_K,
        ),
        _ => (
            quantize_row_q8_k,
            dequantize_row_q8_k,
            BLOCK_Q8_K_BYTES,
            QK_K,
        ),
    }
}

/// (dtype, distribution, FNV-1a of ggml's quantized bytes, FNV-1a of their dequantized f32).
const GOLDEN_QUANT: &[(&str, u32, u64, u64)] = &[
    ("q5_0", 0, 0x33b2679b0eab1164, 0xb7d47de645d80f07),
    ("q4_K", 0, 0x71622fe60731216b, 0xb2b0ba03742dcc34),
    ("q5_K", 0, 0xe09a9039b014cf14, 0xbce2a69ae6ef6179),
    ("q6_K", 0, 0x37a03a136311790d, 0xdbb06befd9c15dde),
    ("q8_K", 0, 0xd7fca71b3486cc07, 0xbdcfb55c0f5637c2),
    ("q5_0", 1, 0x8df234217ae31c09, 0x78e03247d99de67e),
    ("q4_K", 1, 0x75471811179462bf, 0xd01912fdb4c68f1e),
    ("q5_K", 1, 0x837a887076c49ff0, 0xbf7777097cc3be76),
    ("q6_K", 1, 0xaa7a59c148d842f5, 0x47d1292964c4a0a2),
    ("q8_K", 1, 0xc4e6ac0b0e14dfcb, 0x309837b32a462ea4),
    ("q5_0", 2, 0x39d56905bae8613f, 0xcfae9639da229189),
    ("q4_K", 2, 0xf09548afa34ac683, 0xee92df83dbac05dc),
    ("q5_K", 2, 0x4015b29b915edc24, 0x1b4d9eb98de45876),
    ("q6_K", 2, 0x344bd25b113e0199, 0x629cc50c44063dd0),
    ("q8_K", 2, 0x18f9b05aca3c9130, 0x52bb4415ef11c0f4),
    ("q5_0", 3, 0xe117164769991d5f, 0x5ec930836c78271f),
    ("q4_K", 3, 0xdc6e6b21389db3c4, 0x8c2607d384187bcd),
    ("q5_K", 3, 0xa4909d311d0e4f3c, 0xd8d842d8d1386e54),
    ("q6_K", 3, 0x738ea4890d2d9121, 0x6961cc520ecad2eb),
    ("q8_K", 3, 0xad735a54a4514ac3, 0xdb27c64fe5ba3198),
    ("q5_0", 4, 0xb4280d2c53d08223, 0x778b30e4461e3299),
    ("q4_K", 4, 0x6cfa9a8b165cf683, 0x81bc367b7b541e86),
    ("q5_K", 4, 0xe2973cbc5927a089, 0xf9be1312b197d724),
    ("q6_K", 4, 0xd125efc1e04a37b4, 0x31b9b90fc5930dfc),
    ("q8_K", 4, 0xac09b30d2a01526b, 0x953473640592fb90),
    ("q5_0", 5, 0x63d34743e1fbf66a, 0x58724879015c5ea6),
    ("q4_K", 5, 0xdf01e0d13319f679, 0x410c7b0d08903559),
    ("q5_K", 5, 0x3d36fb0bd4c637f5, 0xd4389274fa21ade9),
    ("q6_K", 5, 0xdb8328b30fc49036, 0x21feb4a01072ff18),
    ("q8_K", 5, 0xfaaee78db86a863c, 0x43721b22d0dbe774),
    ("q5_0", 6, 0xec16ecf1708a8543, 0xfd9a5b1eed27fa87),
    ("q4_K", 6, 0xdba4bf24d72b0999, 0xd47e1ca6d69892f7),
    ("q5_K", 6, 0x8dc2a4733fde6136, 0xd5c4d4130ec9550b),
    ("q6_K", 6, 0xd63c743e9c5a1421, 0x741f32a42ec59cb6),
    ("q8_K", 6, 0x4034c5161fb2748e, 0x0a787bb464bbb6b6),
    ("q5_0", 7, 0x7a217b6b3dbf6420, 0x8c9fdfc4d4af2cf9),
    ("q4_K", 7, 0x7f483dfb084b2d11, 0x9aa71c67f9186a40),
    ("q5_K", 7, 0x95ef3e250232d858, 0x6f32b41c5dd25427),
    ("q6_K", 7, 0x9712bdd124d835b3, 0x074a384c8f73b9ee),
    ("q8_K", 7, 0x758dc103db4f28ba, 0xeb39eb61556c1c59),
    ("q4_1", 0, 0x9febb4e7a8ed544f, 0x38c1407fb7a0d4fd),
    ("q5_1", 0, 0xb3a4a44d8ccbc0d4, 0x80027033ca0dd3f5),
    ("q4_1", 1, 0x7bdfa505b33e4eda, 0xb6c1631a8be9f48e),
    ("q5_1", 1, 0xb7eda825baab72cf, 0x2036fc4d7dce232c),
    ("q4_1", 2, 0x342a13bfb0e58401, 0xcebbbe02480aae3f),
    ("q5_1", 2, 0xa1335826b22dcf8b, 0x62861cece957faa3),
    ("q4_1", 3, 0x7771ab4c68046b36, 0xbd67c4cd02270afd),
    ("q5_1", 3, 0xefd62c72f60b209b, 0x2e12546dbef2e4c4),
    ("q4_1", 4, 0xe1848fb8fa874c90, 0x9348e1ff911cf99b),
    ("q5_1", 4, 0x7b6e392510cfe2e3, 0x26bfbbef47219838),
    ("q4_1", 5, 0x40b73213fbd867e0, 0x703cd2f306439103),
    ("q5_1", 5, 0x4768fdf5d3d02b63, 0x6a3c17af164b068a),
    ("q4_1", 6, 0xabd44ecd161fc4a1, 0xdd47eb4f67757867),
    ("q5_1", 6, 0xaa31f1c5c9610d9c, 0x68d3a492133f8442),
    ("q4_1", 7, 0xd2b629cb653dc945, 0xddac9a4474f2dd6b),
    ("q5_1", 7, 0xf99eba960db13ca0, 0x88d4cd809fa7c183),
];

/// (distribution, FNV-1a of ggml's Q8_1 bytes).
const GOLDEN_Q8_1: &[(u32, u64)] = &[
    (0, 0x2d50f8abd3bdf1df),
    (1, 0x5a5e00889a9276c6),
    (2, 0x37e096d09411cb8f),
    (3, 0x39036ebf8d9f428c),
    (4, 0xd9aa96901adb0248),
    (5, 0x2ac2febd9ed1b44a),
    (6, 0x9817ac755e782ec9),
    (7, 0x8729bf7d596c34c2),
];

/// (weight dtype, weight distribution, activation distribution, bits of ggml's vec_dot result).
pub(super) const GOLDEN_DOT: &[(&str, u32, u32, u32)] = &[
    ("q5_0", 0, 1, 0x40c12b16),
    ("q5_0", 0, 2, 0xc188f786),
    ("q5_0", 0, 3, 0x3b6e1df4),
    ("q5_0", 1, 1, 0x46a1420c),
    ("q5_0", 1, 2, 0x42f8682e),
    ("q5_0", 1, 3, 0xbda7b83c),
    ("q4_K", 0, 1, 0x401eb380),
    ("q4_K", 0, 2, 0xc1a19040),
    ("q4_K", 0, 3, 0x3b5dee76),
    ("q4_K", 1, 1, 0x46a13a46),
    ("q4_K", 1, 2, 0x431b8880),
    ("q4_K", 1, 3, 0xbda929e4),
    ("q5_K", 0, 1, 0x40b554e0),
    ("q5_K", 0, 2, 0xc193b3c0),
    ("q5_K", 0, 3, 0x3b67205a),
    ("q5_K", 1, 1, 0x46a12b8c),
    ("q5_K", 1, 2, 0x43048400),
    ("q5_K", 1, 3, 0xbdb545c4),
    ("q6_K", 0, 1, 0x3fb13a60),
    ("q6_K", 0, 2, 0xc190b620),
    ("q6_K", 0, 3, 0x3b5cc00a),
    ("q6_K", 1, 1, 0x46a1675e),
    ("q6_K", 1, 2, 0x43209e68),
    ("q6_K", 1, 3, 0xbdb42b26),
    ("q4_1", 0, 1, 0x40b64200),
    ("q4_1", 0, 2, 0xc19a6500),
    ("q4_1", 0, 3, 0x3b43a69c),
    ("q4_1", 1, 1, 0x46a21f62),
    ("q4_1", 1, 2, 0x431ba780),
    ("q4_1", 1, 3, 0xbdbe4eb8),
    ("q5_1", 0, 1, 0x40a3e520),
    ("q5_1", 0, 2, 0xc183b280),
    ("q5_1", 0, 3, 0x3b632fdc),
    ("q5_1", 1, 1, 0x46a189b0),
    ("q5_1", 1, 2, 0x4313f680),
    ("q5_1", 1, 3, 0xbdb4d2d0),
];

#[test]
fn quantizers_and_dequantizers_are_bit_exact_with_ggml() {
    let mut failures = Vec::new();
    for &(name, dist, want_q, want_dq) in GOLDEN_QUANT {
        let x = golden_input(dist);
        let (q, dq, bs, qk) = codec(name);
        let mut bytes = vec![0u8; N / qk * bs];
        q(&x, &mut bytes);
        let mut y = vec![0.0f32; N];
        dq(&bytes, &mut y);
        let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (got_q, got_dq) = (fnv(&bytes), fnv(&yb));
        if got_q != want_q || got_dq != want_dq {
            failures.push(format!(
                "{name} dist {dist}: quant {got_q:#018x} (ggml {want_q:#018x}), dequant {got_dq:#018x} (ggml {want_dq:#018x})"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn q8_1_is_bit_exact_with_ggml() {
    for &(dist, want) in GOLDEN_Q8_1 {
        let mut bytes = vec![0u8; N / QK8_1 * BLOCK_Q8_1_BYTES];
        quantize_row_q8_1(&golden_input(dist), &mut bytes);
        assert_eq!(fnv(&bytes), want, "q8_1 dist {dist}");
    }
}

#[test]
fn vec_dots_agree_with_ggml() {
    for &(name, dw, da, bits) in GOLDEN_DOT {
        let want = f32::from_bits(bits);
        let (x, a) = (golden_input(dw), golden_input(da));
        let (q, dq, bs, qk) = codec(name);
        let mut wb = vec![0u8; N / qk * bs];
        q(&x, &mut wb);
        let mut wf = vec![0.0f32; N];
        dq(&wb, &mut wf);
        let (ab, af) = if name == "q5_0" {
            let mut ab = vec![0u8; N / 32 * 34];
            quantize_row_q8_0(&a, &mut ab);
            let mut af = vec![0.0f32; N];
            super::quant::dequantize_row_q8_0(&ab, &mut af);
            (ab, af)
        } else if name.ends_with("_1") {
            let mut ab = vec![0u8; N / QK8_1 * BLOCK_Q8_1_BYTES];
            quantize_row_q8_1(&a, &mut ab);
            let mut af = vec![0.0f32; N];
            dequantize_row_q8_1(&ab, &mut af);
            (ab, af)
        } else {
            let mut ab = vec![0u8; N / QK_K * BLOCK_Q8_K_BYTES];
            quantize_row_q8_k(&a, &mut ab);
            let mut af = vec![0.0f32; N];
            dequantize_row_q8_k(&ab, &mut af);
            (ab, af)
        };
        // Scale of the f32 rounding: the sum of |w_i a_i| over the decoded operands.
        let mag: f64 = wf
            .iter()
            .zip(&af)
            .map(|(w, v)| (*w as f64 * *v as f64).abs())
            .sum();
        for isa in Isa::ALL.iter().copied().filter(|i| i.is_supported()) {
            let got = match name {
                "q5_0" => vec_dot_q5_0_q8_0_with_isa(isa, &wb, &ab),
                "q4_K" => vec_dot_q4_k_q8_k_with_isa(isa, &wb, &ab),
                "q5_K" => vec_dot_q5_k_q8_k_with_isa(isa, &wb, &ab),
                "q4_1" => vec_dot_q4_1_q8_1_with_isa(isa, &wb, &ab),
                "q5_1" => vec_dot_q5_1_q8_1_with_isa(isa, &wb, &ab),
                _ => vec_dot_q6_k_q8_k_with_isa(isa, &wb, &ab),
            };
            assert!(
                ((got - want) as f64).abs() <= 1e-5 * mag,
                "{isa} {name} w{dw} a{da}: {got} vs ggml {want} (magnitude {mag})"
            );
        }
    }
}
