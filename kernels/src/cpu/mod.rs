//! CPU kernels.
//!
//! * [`quant`]: Q8_0 / Q4_0 block formats with reference (ggml bit-exact)
//!   quantization and dequantization;
//! * [`affine`]: Q4_1 / Q5_1 and their activation form Q8_1, likewise
//!   bit-exact with ggml's reference quantizers;
//! * [`kquant`]: Q5_0 and the K-quants (Q4_K, Q5_K, Q6_K, and Q8_K for
//!   activations), likewise bit-exact with ggml's reference quantizers;
//! * [`lowbit`]: Q2_K and Q3_K, likewise bit-exact with ggml's reference quantizers;
//! * [`iquant`]: IQ4_NL, IQ4_XS and MXFP4, likewise bit-exact with ggml's reference quantizers;
//! * [`convert`]: f16 / bf16 <-> f32 row conversions;
//! * [`features`]: runtime instruction-set detection (`TESSERA_CPU_ISA`
//!   override);
//! * [`dot`]: dot products;
//! * [`matmul`]: the tile matmul the CPU backend runs on its threads;
//! * [`repack`]: the interleaved weight layouts (16 rows on x86, 4 on aarch64) and their
//!   kernels;
//! * [`vecmath`]: vectorised `exp`, SiLU and GELU rows.
//!
//! The main items are re-exported here.

pub mod affine;
pub mod convert;
pub mod dot;
pub mod features;
pub mod iquant;
pub mod kquant;
pub mod lowbit;
pub mod matmul;
pub mod quant;
pub mod repack;
pub mod vecmath;

#[cfg(target_arch = "aarch64")]
mod arm;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod float_gemm;
mod generic;
#[cfg(test)]
mod kquant_golden;
#[cfg(test)]
mod lowbit_golden;
mod pack_layout;
mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use affine::{
    BLOCK_Q4_1_BYTES, BLOCK_Q5_1_BYTES, BLOCK_Q8_1_BYTES, QK4_1, QK5_1, QK8_1, dequantize_row_q4_1,
    dequantize_row_q5_1, dequantize_row_q8_1, quantize_row_q4_1, quantize_row_q5_1,
    quantize_row_q8_1,
};
pub use convert::{bf16_to_f32_row, f16_to_f32_row, f32_to_bf16_row, f32_to_f16_row};
pub use dot::{
    dot_f32, dot_f32_with_isa, vec_dot_iq4_nl_q8_0, vec_dot_iq4_nl_q8_0_with_isa,
    vec_dot_iq4_xs_q8_k, vec_dot_iq4_xs_q8_k_with_isa, vec_dot_mxfp4_q8_0,
    vec_dot_mxfp4_q8_0_with_isa, vec_dot_q2_k_q8_k, vec_dot_q2_k_q8_k_with_isa, vec_dot_q3_k_q8_k,
    vec_dot_q3_k_q8_k_with_isa, vec_dot_q4_0_q8_0, vec_dot_q4_0_q8_0_with_isa, vec_dot_q4_1_q8_1,
    vec_dot_q4_1_q8_1_with_isa, vec_dot_q4_k_q8_k, vec_dot_q4_k_q8_k_with_isa, vec_dot_q5_0_q8_0,
    vec_dot_q5_0_q8_0_with_isa, vec_dot_q5_1_q8_1, vec_dot_q5_1_q8_1_with_isa, vec_dot_q5_k_q8_k,
    vec_dot_q5_k_q8_k_with_isa, vec_dot_q6_k_q8_k, vec_dot_q6_k_q8_k_with_isa, vec_dot_q8_0_q8_0,
    vec_dot_q8_0_q8_0_with_isa,
};
pub use features::{Isa, active_isa, detected_isa};
pub use iquant::{
    BLOCK_IQ4_NL_BYTES, BLOCK_IQ4_XS_BYTES, BLOCK_MXFP4_BYTES, KVALUES_IQ4NL, KVALUES_MXFP4,
    QK_MXFP4, QK4_NL, dequantize_row_iq4_nl, dequantize_row_iq4_xs, dequantize_row_mxfp4,
    e8m0_to_f32_half, quantize_row_iq4_nl, quantize_row_iq4_xs, quantize_row_mxfp4,
};
pub use kquant::{
    BLOCK_Q4_K_BYTES, BLOCK_Q5_0_BYTES, BLOCK_Q5_K_BYTES, BLOCK_Q6_K_BYTES, BLOCK_Q8_K_BYTES, QK_K,
    QK5_0, dequantize_row_q4_k, dequantize_row_q5_0, dequantize_row_q5_k, dequantize_row_q6_k,
    dequantize_row_q8_k, quantize_row_q4_k, quantize_row_q5_0, quantize_row_q5_k,
    quantize_row_q6_k, quantize_row_q8_k,
};
pub use lowbit::{
    BLOCK_Q2_K_BYTES, BLOCK_Q3_K_BYTES, dequantize_row_q2_k, dequantize_row_q3_k,
    quantize_row_q2_k, quantize_row_q3_k,
};
pub use matmul::{
    ActType, WeightType, act_row_bytes, act_type, mul_mat_tile, mul_mat_tile_with_isa, prepare_act,
};
pub use quant::{
    BLOCK_Q4_0_BYTES, BLOCK_Q8_0_BYTES, QK4_0, QK8_0, dequantize_row_q4_0, dequantize_row_q8_0,
    quantize_row_q4_0, quantize_row_q8_0,
};
pub use repack::{PackLayout, mul_mat_tile_packed, pack_group, unpack_group, unpack_row};
