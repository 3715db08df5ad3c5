//! Golden values from ggml itself for Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 (the rows
//! `kernels/tools/ggml_golden.c` prints for them, run against llama.cpp's ggml 0.25.3 build): the
//! quantizers and dequantizers must reproduce ggml's reference output bit for bit, and every
//! instruction-set path of the vec_dot kernels must agree with ggml's CPU `vec_dot` on the same
//! bytes up to f32 summation order.

use super::dot::{
    vec_dot_iq4_nl_q8_0_with_isa, vec_dot_iq4_xs_q8_k_with_isa, vec_dot_mxfp4_q8_0_with_isa,
    vec_dot_q2_k_q8_k_with_isa, vec_dot_q3_k_q8_k_with_isa,
};
use super::features::Isa;
use super::iquant::*;
use super::kquant::{BLOCK_Q8_K_BYTES, QK_K, dequantize_row_q8_k, quantize_row_q8_k};
use super::kquant_golden::{N, fnv, golden_input};
use super::lowbit::*;
use super::quant::{BLOCK_Q8_0_BYTES, QK8_0, dequantize_row_q8_0, quantize_row_q8_0};

type QuantFn = fn(&[f32], &mut [u8]);
type DequantFn = fn(&[u8], &mut [f32]);
type DotFn = fn(Isa, &[u8], &[u8]) -> f32;

/// Quantizer, dequantizer, block bytes, block elements, dot product, and whether the
/// activations are Q8_K (else Q8_0).
fn codec(name: &str) -> (QuantFn, DequantFn, usize, usize, DotFn, bool) {
    match name {
        "q2_K" => (
            quantize_row_q2_k,
            dequantize_row_q2_k,
            BLOCK_Q2_K_BYTES,
            QK_K,
            vec_dot_q2_k_q8_k_with_isa,
            true,
        ),
        "q3_K" => (
            quantize_row_q3_k,
            dequantize_row_q3_k,
            BLOCK_Q3_K_BYTES,
            QK_K,
            vec_dot_q3_k_q8_k_with_isa,
            true,
        ),
        "iq4_xs" => (
            quantize_row_iq4_xs,
            dequantize_row_iq4_xs,
            BLOCK_IQ4_XS_BYTES,
            QK_K,
            vec_dot_iq4_xs_q8_k_with_isa,
            true,
        ),
        "iq4_nl" => (
            quantize_row_iq4_nl,
            dequantize_row_iq4_nl,
            BLOCK_IQ4_NL_BYTES,
            QK4_NL,
            vec_dot_iq4_nl_q8_0_with_isa,
            false,
        ),
        _ => (
            quantize_row_mxfp4,
            dequantize_row_mxfp4,
            BLOCK_MXFP4_BYTES,
            QK_MXFP4,
            vec_dot_mxfp4_q8_0_with_isa,
            false,
        ),
    }
}

/// (dtype, distribution, hash of ggml's quantized bytes, hash of its dequantized f32).
const GOLDEN_QUANT: &[(&str, u32, u64, u64)] = &[
    ("q2_K", 0, 0xaa11dbdea3aee551, 0xfbe29558353c9d6e),
    ("q3_K", 0, 0x7f3fbd2803d40e6c, 0xaaabb388aa4617bf),
    ("iq4_nl", 0, 0x32b0af78b8d82361, 0xafc7ed6a9cd5622f),
    ("iq4_xs", 0, 0x8fa673e9d79f8071, 0xe9efd596f7116f88),
    ("mxfp4", 0, 0xa6d02f03152c0954, 0xadab3bced8d32c41),
    ("q2_K", 1, 0x02d7f9d32b4fdbad, 0xbc7692d3e54440f2),
    ("q3_K", 1, 0x8f2cfddd8e9636f8, 0x8d90d6d0953c9af0),
    ("iq4_nl", 1, 0xfcb530e7eafddfd7, 0x4b4b8639bcabdfa3),
    ("iq4_xs", 1, 0x5d7f3cf913326045, 0xdaac286637657371),
    ("mxfp4", 1, 0x6255195fd878813d, 0xac9cbf17ae0d9b68),
    ("q2_K", 2, 0x0d680b37d3012402, 0xf357449c01c48bf0),
    ("q3_K", 2, 0xe3425ef0e89db82c, 0x2d86222c3f8cbd3c),
    ("iq4_nl", 2, 0xeb43889330d48ef7, 0xb1e7b69beaf3d2ae),
    ("iq4_xs", 2, 0x4de1a8f7fbfb26be, 0x53038ba41c5883fe),
    ("mxfp4", 2, 0x13757ad50d307471, 0xdefb47f223130fc8),
    ("q2_K", 3, 0x4802774e4594b0fe, 0x697540ac9d660de9),
    ("q3_K", 3, 0x8a8a32e580a184a6, 0xbe00310d01c89424),
    ("iq4_nl", 3, 0xc158ea408648ef41, 0xa5710f5a8394b02c),
    ("iq4_xs", 3, 0xd90dcb040010658b, 0x05706ef09f2709c5),
    ("mxfp4", 3, 0xe7acd115215db607, 0x6678f37f5f8d3831),
    ("q2_K", 4, 0x42316b84ed631da1, 0x8a3d5a32b3d52015),
    ("q3_K", 4, 0xe00c36c1296d06f2, 0x999b2cfe0503bcca),
    ("iq4_nl", 4, 0x6f5e1cb6ec2124fc, 0xa4ee931789676f7d),
    ("iq4_xs", 4, 0x31655275c729015f, 0x0396cd4ca4d8a9f6),
    ("mxfp4", 4, 0xf115c7acd8effc1f, 0xf8054394e9d4104e),
    ("q2_K", 5, 0x71d857216cf17035, 0x657f714fc3651f70),
    ("q3_K", 5, 0xa8aaa87955f0b747, 0x9208f4d6658d7918),
    ("iq4_nl", 5, 0xc88d5d122cae40e4, 0x2e76722405737bc3),
    ("iq4_xs", 5, 0x0a7a5e87294c5eed, 0xcace37d87dc3c9e7),
    ("mxfp4", 5, 0xfa8c559b2774d5c2, 0xd6332e516f5e760c),
    ("q2_K", 6, 0x2b0c246941abdffa, 0xce18ef58cb6b0949),
    ("q3_K", 6, 0xa0dd7615edf9a813, 0xc960e994b8b8ba77),
    ("iq4_nl", 6, 0x9c18f2e55fc1be0e, 0xd5176499029dbdc6),
    ("iq4_xs", 6, 0xff249a9951580a47, 0x74030e05be48faa2),
    ("mxfp4", 6, 0x5808d6e362904a88, 0xa2ced31554967b15),
    ("q2_K", 7, 0x971a8a46ddd56131, 0x5d76451c9e4b9205),
    ("q3_K", 7, 0xfccbd1720c5631a4, 0xb6e1fe22636f3afa),
    ("iq4_nl", 7, 0xbdbef256ba8d85fa, 0x35f03a138704129d),
    ("iq4_xs", 7, 0xf2185ba55f1f4fd7, 0xc69d32f708d677dc),
    ("mxfp4", 7, 0xbe1bb79c40370812, 0x5c24a9961b795f15),
];

/// (weight dtype, weight distribution, activation distribution, bits of ggml's CPU vec_dot).
pub(super) const GOLDEN_DOT: &[(&str, u32, u32, u32)] = &[
    ("q2_K", 0, 1, 0x40989cb0),   // 4.76913
    ("q2_K", 0, 2, 0xc1702cc8),   // -15.0109
    ("q2_K", 0, 3, 0x3acf7ff0),   // 0.0015831
    ("q2_K", 1, 1, 0x469cc961),   // 20068.7
    ("q2_K", 1, 2, 0xc2a77620),   // -83.7307
    ("q2_K", 1, 3, 0xbdb6dedc),   // -0.0892923
    ("q3_K", 0, 1, 0x418d5b96),   // 17.6697
    ("q3_K", 0, 2, 0xc19072d6),   // -18.0561
    ("q3_K", 0, 3, 0x3b876081),   // 0.00413138
    ("q3_K", 1, 1, 0x469bb19a),   // 19928.8
    ("q3_K", 1, 2, 0x41bed250),   // 23.8527
    ("q3_K", 1, 3, 0xbdbb56fd),   // -0.0914745
    ("iq4_xs", 0, 1, 0x408dea8c), // 4.43488
    ("iq4_xs", 0, 2, 0xc1908b44), // -18.068
    ("iq4_xs", 0, 3, 0x3b78e091), // 0.00379756
    ("iq4_xs", 1, 1, 0x46a1b303), // 20697.5
    ("iq4_xs", 1, 2, 0x4306f92f), // 134.973
    ("iq4_xs", 1, 3, 0xbdc10b4c), // -0.0942598
    ("iq4_nl", 0, 1, 0x4136a39e), // 11.4149
    ("iq4_nl", 0, 2, 0xc1842bc2), // -16.5214
    ("iq4_nl", 0, 3, 0x3b62b98f), // 0.00345955
    ("iq4_nl", 1, 1, 0x46a1809c), // 20672.3
    ("iq4_nl", 1, 2, 0x42cc1c50), // 102.055
    ("iq4_nl", 1, 3, 0xbdc37406), // -0.0954361
    ("mxfp4", 0, 1, 0x401b30dc),  // 2.42486
    ("mxfp4", 0, 2, 0xc198cbd9),  // -19.0995
    ("mxfp4", 0, 3, 0x3b4a6a30),  // 0.0030886
    ("mxfp4", 1, 1, 0x46972d7c),  // 19350.7
    ("mxfp4", 1, 2, 0x433e271b),  // 190.153
    ("mxfp4", 1, 3, 0xbda244c2),  // -0.0792327
];

#[test]
fn quantizers_and_dequantizers_are_bit_exact_with_ggml() {
    let mut failures = Vec::new();
    for &(name, dist, want_q, want_dq) in GOLDEN_QUANT {
        let x = golden_input(dist);
        let (q, dq, bs, qk, _, _) = codec(name);
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
fn vec_dots_agree_with_ggml() {
    for &(name, dw, da, bits) in GOLDEN_DOT {
        let want = f32::from_bits(bits);
        let (x, a) = (golden_input(dw), golden_input(da));
        let (q, dq, bs, qk, dot, q8k) = codec(name);
        let mut wb = vec![0u8; N / qk * bs];
        q(&x, &mut wb);
        let mut wf = vec![0.0f32; N];
        dq(&wb, &mut wf);
        let mut af = vec![0.0f32; N];
        let ab = if q8k {
            let mut ab = vec![0u8; N / QK_K * BLOCK_Q8_K_BYTES];
            quantize_row_q8_k(&a, &mut ab);
            dequantize_row_q8_k(&ab, &mut af);
            ab
        } else {
            let mut ab = vec![0u8; N / QK8_0 * BLOCK_Q8_0_BYTES];
            quantize_row_q8_0(&a, &mut ab);
            dequantize_row_q8_0(&ab, &mut af);
            ab
        };
        // Scale of the f32 rounding: the sum of |w_i a_i| over the decoded operands.
        let mag: f64 = wf
            .iter()
            .zip(&af)
            .map(|(w, v)| (*w as f64 * *v as f64).abs())
            .sum();
        assert!(mag > 0.0, "{name} w{dw} a{da}: degenerate case");
        for isa in Isa::ALL.iter().copied().filter(|i| i.is_supported()) {
            let got = dot(isa, &wb, &ab);
            assert!(
                ((got - want) as f64).abs() <= 1e-5 * mag,
                "{isa} {name} w{dw} a{da}: {got} vs ggml {want} (magnitude {mag})"
            );
        }
    }
}
