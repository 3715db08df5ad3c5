// Generated from kernels/src/gpu/codes.rs by
// `cargo run -p tessera-kernels --example gpu_codes`: edit the table there, not this file.
#ifndef TESSERA_CODES_GLSL
#define TESSERA_CODES_GLSL

// Element types (`TYPES` in codes.rs, `type_code`).
#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_I32 3
#define T_Q8_0 4
#define T_Q4_0 5
#define T_Q4_1 6
#define T_Q5_1 7
#define T_Q2_K 8
#define T_Q3_K 9
#define T_IQ4_NL 10
#define T_IQ4_XS 11
#define T_MXFP4 12
#define T_Q5_0 13
#define T_Q4_K 14
#define T_Q5_K 15
#define T_Q6_K 16
#define T_COUNT 17

// Elements per block: 32-element formats and K-quant super-blocks.
#define QK 32
#define QK_K 256

// Bytes per block of each quantized type.
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_1_BYTES 24
#define Q2_K_BYTES 84
#define Q3_K_BYTES 110
#define IQ4_NL_BYTES 18
#define IQ4_XS_BYTES 136
#define MXFP4_BYTES 17
#define Q5_0_BYTES 22
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

// k_binary's operations (`BinCode`).
#define BIN_ADD 0
#define BIN_SUB 1
#define BIN_MUL 2
#define BIN_DIV 3

// k_map's functions (`MapCode`).
#define MAP_SCALE 0
#define MAP_SQR 1
#define MAP_SQRT 2
#define MAP_CLAMP 3
#define MAP_SILU 4
#define MAP_GELU 5
#define MAP_GELU_QUICK 6
#define MAP_RELU 7
#define MAP_TANH 8
#define MAP_NEG 9
#define MAP_EXP 10
#define MAP_SIGMOID 11

// k_glu's activations (`GluCode`).
#define GLU_SWIGLU 0
#define GLU_GEGLU 1

// Errors a kernel raises in the stream's status word (`ErrCode`).
#define ERR_INDEX 1
#define ERR_EXPERT 2

#endif
