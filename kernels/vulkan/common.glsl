// Tessera Vulkan kernels: shared definitions (GLSL port of kernels/gpu/common.cuh).
//
// Contract: kernels/vulkan/ABI.md. Memory is reached only through GL_EXT_buffer_reference
// pointers (uint64_t device addresses); f16/bf16/quantized data are read and written as bytes and
// converted on bits, exactly as common.cuh does. Every shader:
//   #version 460
//   #extension GL_GOOGLE_include_directive : require
//   #include "common.glsl"
//   layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; ...; };   // parameter list
//   ... Args a = Args(pc.args);
// `layout(local_size_x_id = 0) in;` is declared here (a shader may repeat it).
//
// Reductions: CUDA warp shuffles become shared-memory exchanges over each group of 32
// consecutive invocations (`warp_sum`, `warp_max`, `block_sum`, `block_max`). They contain
// barrier(): EVERY invocation of the workgroup must call them, in uniform control flow (guard
// the work, not the call). The workgroup size must be a multiple of 32 and at most TS_RED_SIZE
// (1024 unless a shader #defines it smaller before the include). They use the shared arrays
// `ts_red` (TS_RED_SIZE floats) and `ts_scratch` (32 floats); glslc -O drops them from shaders
// that never call a reduction.
//
// API (kept stable; add, don't rename):
//   types / consts: Tensor, T_*, QK, QK_K, *_BYTES, ERR_INDEX, NEG_INF, POS_INF
//   raw memory:     ld_u8 st_u8 ld_u16 st_u16 ld_u32 ld_f32 st_f32 ld_i32_at st_i32_at
//   conversions:    h2f f2h bf2f f2bf, roundf_c (C roundf), rintf_c (C rintf),
//                   fmaxf_c fminf_c (C fmaxf / fminf NaN rules)
//   scalar access:  ld_scalar st_scalar
//   quantized:      block_scale is_lowbit is_quant quant_block_bytes quant_block_elems
//                   iq4nl_level mxfp4_level e8m0_half nibble32 lowbit_elem affine_level ld_quant
//   activations:    act_q8 q8_round_of q8_rounded (rounded as llama.cpp rounds them)
//   tensors:        row_ptr ld st ld_i32 st_i32 unravel unravel_row
//   errors:         raise_error(uint64_t status, int code, int value)
//   reductions:     warp_sum warp_max block_sum block_max (see above)
//   grid stride:    GRID_STRIDE(e, n) { ... }   (e is an int64_t; use `continue` freely, no barrier;
//                   the launch must be grid_1d-planned: clamp(ceil(n / block), 1, 2^20) blocks)
//                   ts_num_groups(planned), ts_grid_threads(n): CUDA's gridDim.x under split dispatches
#ifndef TESSERA_COMMON_GLSL
#define TESSERA_COMMON_GLSL

#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_scalar_block_layout : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_8bit_storage : require

layout(local_size_x_id = 0) in;

// The argument block's device address (the only push constant).
layout(push_constant) uniform PC { uint64_t args; } pc;

// Element type codes, block sizes, op and error codes: generated from the Rust table.
#include "codes.glsl"

#define NEG_INF uintBitsToFloat(0xff800000u)
#define POS_INF uintBitsToFloat(0x7f800000u)
#define FLT_MAX_C 3.402823466e+38

// A tensor as kernels see it: base address, ggml shape and byte strides, element type.
// Layout mirrors the Rust `KTensor` (#[repr(C)], 80 bytes) under scalar layout.
struct Tensor {
    uint64_t data;
    int64_t ne[4];
    int64_t nb[4];
    int type;
    int pad;
};

// ----- raw memory through device addresses -----

layout(buffer_reference, scalar, buffer_reference_align = 1) buffer TsU8 { uint8_t v; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer TsF32 { float v; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer TsI32 { int v; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer TsU32 { uint v; };

uint ld_u8(uint64_t p) { return uint(TsU8(p).v); }
void st_u8(uint64_t p, uint v) { TsU8(p).v = uint8_t(v & 0xffu); }
// Little-endian 16 / 32-bit values at any byte address.
uint ld_u16(uint64_t p) { return ld_u8(p) | (ld_u8(p + 1ul) << 8); }
void st_u16(uint64_t p, uint v) { st_u8(p, v); st_u8(p + 1ul, v >> 8); }
uint ld_u32(uint64_t p) { return ld_u16(p) | (ld_u16(p + 2ul) << 16); }
// 4-byte aligned f32 / i32.
float ld_f32(uint64_t p) { return TsF32(p).v; }
void st_f32(uint64_t p, float v) { TsF32(p).v = v; }
int ld_i32_at(uint64_t p) { return TsI32(p).v; }
void st_i32_at(uint64_t p, int v) { TsI32(p).v = v; }

// Sets the status word (int[2] at `status`) to (code, value) unless an error is already there.
void raise_error(uint64_t status, int code, int value) {
    if (atomicCompSwap(TsI32(status).v, 0, code) == 0) {
        TsI32(status + 4ul).v = value;
    }
}

// ----- C rounding functions (GLSL round() leaves halves to the implementation) -----

// roundf: halves away from zero.
float roundf_c(float x) {
    float t = trunc(x);
    precise float d = x - t; // exact
    if (abs(d) >= 0.5) {
        t += sign(x);
    }
    return t;
}

// rintf: halves to even (default rounding mode).
float rintf_c(float x) { return roundEven(x); }

// C fmaxf / fminf: a NaN operand loses to a number (GLSL max/min leave NaN undefined).
float fmaxf_c(float a, float b) { return isnan(a) ? b : (isnan(b) ? a : max(a, b)); }
float fminf_c(float a, float b) { return isnan(a) ? b : (isnan(b) ? a : min(a, b)); }

// ----- f16 / bf16 on bits (round to nearest even, as the `half` crate) -----

float h2f(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint ex = (h >> 10) & 0x1fu;
    uint mant = h & 0x3ffu;
    if (ex == 0u) {
        float v = float(mant) * 5.9604644775390625e-8; // mant * 2^-24, exact
        return sign != 0u ? -v : v;
    }
    if (ex == 31u) {
        return uintBitsToFloat(sign | 0x7f800000u | (mant << 13));
    }
    return uintBitsToFloat(sign | ((ex + 112u) << 23) | (mant << 13));
}

uint f2h(float x) {
    uint f = floatBitsToUint(x);
    uint sign = (f >> 16) & 0x8000u;
    uint ax = f & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
    }
    if (ax >= 0x477ff000u) {
        return sign | 0x7c00u; // >= 65520 rounds to infinity
    }
    if (ax < 0x38800000u) {
        // Subnormal (or zero): the mantissa is |x| / 2^-24, rounded to nearest even.
        precise float s = uintBitsToFloat(ax) * 16777216.0; // exact (power of two)
        uint m = uint(roundEven(s));
        return sign | m;
    }
    uint h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
    uint rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) {
        h += 1u;
    }
    return sign | h;
}

float bf2f(uint b) { return uintBitsToFloat((b & 0xffffu) << 16); }

// ----- activations rounded as llama.cpp's CPU rounds them (act_q8 in kernels/gpu/common.cuh) -----

// Weight types whose dot products llama.cpp takes against activations rounded to 8-bit blocks
// of 32 (vec_dot_type Q8_0, or Q8_1 for Q4_1 / Q5_1, whose levels round the same way).
bool act_q8(int type) {
    return type == T_Q8_0 || type == T_Q4_0 || type == T_Q5_0 || type == T_IQ4_NL ||
           type == T_MXFP4 || type == T_Q4_1 || type == T_Q5_1;
}
// quantize_row_q8_0 of a block whose largest magnitude is amax: (1 / d, d as its f16 holds it)
// with d = amax / 127.
vec2 q8_round_of(float amax) {
    precise float d = amax / 127.0;
    precise float inv = d != 0.0 ? 1.0 / d : 0.0;
    return vec2(inv, h2f(f2h(d)));
}
// x as the rounded block holds it: its level roundf(x / d) times the scale.
float q8_rounded(vec2 q, float x) {
    precise float v = roundf_c(x * q.x) * q.y;
    return v;
}

uint f2bf(float x) {
    uint f = floatBitsToUint(x);
    if ((f & 0x7fffffffu) > 0x7f800000u) {
        return ((f >> 16) | 0x40u) & 0xffffu; // quiet NaN
    }
    f += 0x7fffu + ((f >> 16) & 1u);
    return f >> 16;
}

// ----- element access -----

float ld_scalar(uint64_t p, int type) {
    switch (type) {
    case T_F32: return ld_f32(p);
    case T_F16: return h2f(ld_u16(p));
    case T_BF16: return bf2f(ld_u16(p));
    case T_I32: return float(ld_i32_at(p));
    default: return 0.0;
    }
}

void st_scalar(uint64_t p, int type, float v) {
    switch (type) {
    case T_F32: st_f32(p, v); break;
    case T_F16: st_u16(p, f2h(v)); break;
    case T_BF16: st_u16(p, f2bf(v)); break;
    case T_I32: st_i32_at(p, int(v)); break;
    default: break;
    }
}

// The f16 at the start of a block.
float block_scale(uint64_t blk) { return h2f(ld_u16(blk)); }

// Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4: read (dequantized) by the kernels, never written.
// (and Q5_0, Q4_K, Q5_K, Q6_K, codes 13..16)
bool is_lowbit(int type) { return type >= T_Q2_K && type <= T_Q6_K; }

bool is_quant(int type) {
    return type == T_Q8_0 || type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_1 || is_lowbit(type);
}

int quant_block_bytes(int type) {
    switch (type) {
    case T_Q8_0: return Q8_0_BYTES;
    case T_Q4_1: return Q4_1_BYTES;
    case T_Q5_1: return Q5_1_BYTES;
    case T_Q2_K: return Q2_K_BYTES;
    case T_Q3_K: return Q3_K_BYTES;
    case T_IQ4_NL: return IQ4_NL_BYTES;
    case T_IQ4_XS: return IQ4_XS_BYTES;
    case T_MXFP4: return MXFP4_BYTES;
    case T_Q5_0: return Q5_0_BYTES;
    case T_Q4_K: return Q4_K_BYTES;
    case T_Q5_K: return Q5_K_BYTES;
    case T_Q6_K: return Q6_K_BYTES;
    default: return Q4_0_BYTES;
    }
}

// Elements per block: 256 for the super-block formats, else 32.
int quant_block_elems(int type) {
    return (type == T_Q2_K || type == T_Q3_K || type == T_IQ4_XS || type == T_Q4_K || type == T_Q5_K ||
            type == T_Q6_K) ? QK_K : QK;
}

// ggml's kvalues_iq4nl (IQ4_NL / IQ4_XS levels) and kvalues_mxfp4 (E2M1 values doubled).
float iq4nl_level(int i) {
    const int k[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return float(k[i & 15]);
}

float mxfp4_level(int i) {
    const int k[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return float(k[i & 15]);
}

// Half an E8M0 scale, 2^(e - 128), as ggml_e8m0_to_fp32_half.
float e8m0_half(uint e) {
    uint bits = e < 2u ? (0x00200000u << e) : ((e - 1u) << 23);
    return uintBitsToFloat(bits);
}

// Nibble j (0..31) of a 32-element group's 16 bytes at q: low nibbles first, then high nibbles.
int nibble32(uint64_t q, int j) {
    uint b = ld_u8(q + uint64_t(j & 15));
    return int(j < 16 ? (b & 15u) : (b >> 4));
}

// Scale (x) and min (y) of sub-block j (0..7) of a Q4_K / Q5_K super-block from its 12 packed
// bytes at q (ggml's get_scale_min_k4).
ivec2 scale_min_k4(int j, uint64_t q) {
    if (j < 4) {
        return ivec2(int(ld_u8(q + uint64_t(j)) & 63u), int(ld_u8(q + uint64_t(j + 4)) & 63u));
    }
    uint a = ld_u8(q + uint64_t(j + 4)), lo = ld_u8(q + uint64_t(j - 4)), hi = ld_u8(q + uint64_t(j));
    return ivec2(int((a & 15u) | ((lo >> 6) << 4)), int((a >> 4) | ((hi >> 6) << 4)));
}

// Element j of a Q5_0 / Q4_K / Q5_K / Q6_K block (ggml's dequantize_row_* in the same order of
// operations as the CPU backend's dequantizers, kernels/src/cpu/kquant.rs; as kquant_elem in
// common.cuh).
float kquant_elem(uint64_t blk, int type, int j) {
    if (type == T_Q5_0) {
        // f16 d, u32 qh (bit j: fifth bit of element j), 16 nibble bytes; (q - 16) * d.
        uint qh = ld_u32(blk + 2ul);
        uint q = ld_u8(blk + uint64_t(6 + (j & 15)));
        int level = int(j < 16 ? (q & 15u) : (q >> 4)) | int(((qh >> j) & 1u) << 4);
        return float(level - 16) * block_scale(blk);
    }
    if (type == T_Q6_K) {
        // ql[128], qh[64], i8 scales[16], f16 d; element 128h + 32t + l.
        int h = j / 128, t = (j % 128) / 32, l = j % 32;
        uint lo = ld_u8(blk + uint64_t(64 * h + 32 * (t & 1) + l));
        int q = int(t < 2 ? (lo & 15u) : (lo >> 4)) | int(((ld_u8(blk + uint64_t(128 + 32 * h + l)) >> (2 * t)) & 3u) << 4);
        int sc = int(ld_u8(blk + uint64_t(192 + 8 * h + l / 16 + 2 * t)));
        sc = sc >= 128 ? sc - 256 : sc;
        return block_scale(blk + 208ul) * float(sc) * float(q - 32);
    }
    // Q4_K / Q5_K: f16 d, f16 dmin, 12 scale bytes, [Q5_K: qh[32]], qs[128]; sub-block s = j / 32
    // takes the low (s even) or high nibbles of qs[32 (s / 2) + j % 32].
    int s = j / 32, l = j % 32;
    ivec2 sm = scale_min_k4(s, blk + 4ul);
    uint byte = ld_u8(blk + uint64_t((type == T_Q5_K ? 48 : 16) + 32 * (s / 2) + l));
    int q = int((s & 1) != 0 ? (byte >> 4) : (byte & 15u));
    if (type == T_Q5_K) {
        q += ((ld_u8(blk + uint64_t(16 + l)) >> s) & 1u) != 0u ? 16 : 0;
    }
    float d1 = block_scale(blk) * float(sm.x);
    float m1 = block_scale(blk + 2ul) * float(sm.y);
    return d1 * float(q) - m1;
}

// Element j of a Q2_K / Q3_K / IQ4_NL / IQ4_XS / MXFP4 (or Q5_0 / Q4_K / Q5_K / Q6_K) block at blk (ggml's dequantize_row_*
// layouts; the K formats keep element j = 128h + 32t + l as the 2-bit field t of quant byte 32h + l).
float lowbit_elem(uint64_t blk, int type, int j) {
    if (type >= T_Q5_0) {
        return kquant_elem(blk, type, j);
    }
    if (type == T_IQ4_NL) {
        return block_scale(blk) * iq4nl_level(nibble32(blk + 2ul, j));
    }
    if (type == T_MXFP4) {
        return mxfp4_level(nibble32(blk + 1ul, j)) * e8m0_half(ld_u8(blk));
    }
    if (type == T_IQ4_XS) {
        int g = j / 32;
        uint h = ld_u16(blk + 2ul);
        int ls = int((ld_u8(blk + uint64_t(4 + g / 2)) >> (4 * (g % 2))) & 15u) | int(((h >> (2 * g)) & 3u) << 4);
        float dl = block_scale(blk) * float(ls - 32);
        return dl * iq4nl_level(nibble32(blk + uint64_t(8 + 16 * g), j % 32));
    }
    int q = int((ld_u8(blk + uint64_t((type == T_Q2_K ? 16 : 32) + 32 * (j / 128) + j % 32)) >> (2 * ((j % 128) / 32))) & 3u);
    if (type == T_Q2_K) {
        uint sc = ld_u8(blk + uint64_t(j / 16));
        float dl = block_scale(blk + 80ul) * float(sc & 15u);
        float ml = block_scale(blk + 82ul) * float(sc >> 4);
        return dl * float(q) - ml;
    }
    // Q3_K: 6-bit scale of group g (low nibble in byte g or g - 8, top bits in byte 8 + g % 4),
    // high bit j / 32 of hmask byte j % 32.
    int g = j / 16;
    uint64_t sc = blk + 96ul;
    int low = int(g < 8 ? (ld_u8(sc + uint64_t(g)) & 15u) : (ld_u8(sc + uint64_t(g - 8)) >> 4));
    int scale = (low | int(((ld_u8(sc + uint64_t(8 + g % 4)) >> (2 * (g / 4))) & 3u) << 4)) - 32;
    int high = int((ld_u8(blk + uint64_t(j % 32)) >> (j / 32)) & 1u);
    float dl = block_scale(blk + 108ul) * float(scale);
    return dl * float(q - (high != 0 ? 0 : 4));
}

// Level j (0..31, unsigned) of a Q4_1 / Q5_1 block: f16 d, f16 m, [Q5_1: u32 fifth bits], 16
// nibble bytes (element j: low nibble of byte j, or high nibble of byte j - 16). x = level*d + m.
int affine_level(uint64_t blk, int type, int j) {
    uint q = ld_u8(blk + uint64_t((type == T_Q5_1 ? 8 : 4) + (j & 15)));
    int level = int(j < 16 ? (q & 15u) : (q >> 4));
    if (type == T_Q5_1) {
        uint qh = ld_u32(blk + 4ul);
        level |= int((qh >> j) & 1u) << 4;
    }
    return level;
}

// Element i0 of a quantized row starting at `row`.
float ld_quant(uint64_t row, int type, int64_t i0) {
    if (is_lowbit(type)) {
        int qk = quant_block_elems(type);
        return lowbit_elem(row + uint64_t((i0 / qk) * quant_block_bytes(type)), type, int(i0 % qk));
    }
    int64_t blk = i0 / QK;
    int j = int(i0 % QK);
    uint64_t b = row + uint64_t(blk * quant_block_bytes(type));
    if (type == T_Q8_0) {
        int q = int(ld_u8(b + uint64_t(2 + j)));
        q = q >= 128 ? q - 256 : q;
        return float(q) * block_scale(b);
    }
    if (type == T_Q4_1 || type == T_Q5_1) {
        return float(affine_level(b, type, j)) * block_scale(b) + block_scale(b + 2ul);
    }
    uint q = ld_u8(b + uint64_t(2 + (j & 15)));
    int nib = int(j < 16 ? (q & 15u) : (q >> 4));
    return float(nib - 8) * block_scale(b);
}

uint64_t row_ptr(Tensor t, int64_t i1, int64_t i2, int64_t i3) {
    return t.data + uint64_t(i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]);
}

float ld(Tensor t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    uint64_t row = row_ptr(t, i1, i2, i3);
    if (is_quant(t.type)) {
        return ld_quant(row, t.type, i0);
    }
    return ld_scalar(row + uint64_t(i0 * t.nb[0]), t.type);
}

void st(Tensor t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v) {
    st_scalar(row_ptr(t, i1, i2, i3) + uint64_t(i0 * t.nb[0]), t.type, v);
}

int ld_i32(Tensor t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return ld_i32_at(row_ptr(t, i1, i2, i3) + uint64_t(i0 * t.nb[0]));
}

void st_i32(Tensor t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int v) {
    st_i32_at(row_ptr(t, i1, i2, i3) + uint64_t(i0 * t.nb[0]), v);
}

// Coordinates of flat element e (natural order) of shape ne.
void unravel(int64_t e, int64_t ne[4], out int64_t i[4]) {
    i[0] = e % ne[0];
    e /= ne[0];
    i[1] = e % ne[1];
    e /= ne[1];
    i[2] = e % ne[2];
    i[3] = e / ne[2];
}

// Row r (flat over axes 1..3) of shape ne as (i1, i2, i3); i[0] is set to 0.
void unravel_row(int64_t r, int64_t ne[4], out int64_t i[4]) {
    i[0] = 0;
    i[1] = r % ne[1];
    r /= ne[1];
    i[2] = r % ne[2];
    i[3] = r / ne[2];
}

// Total workgroups of a launch whose CUDA grid was `planned` blocks. The runtime splits grids
// above maxComputeWorkGroupCount (>= 65535) into several vkCmdDispatchBase calls: gl_WorkGroupID
// stays global but gl_NumWorkGroups is then one chunk's count. A dispatch with fewer than 65535
// groups whose ids are all below that count cannot be such a chunk, so gl_NumWorkGroups is exact
// there; otherwise (maybe split) the caller's planned grid is used.
uint64_t ts_num_groups(uint64_t planned) {
    if (gl_NumWorkGroups.x < 65535u && gl_WorkGroupID.x < gl_NumWorkGroups.x) {
        return uint64_t(gl_NumWorkGroups.x);
    }
    return planned;
}

// Threads of a grid-stride launch over n items planned as plan.rs's grid_1d (and gpu comm.rs):
// grid = clamp(ceil(n / block), 1, 2^20) blocks of gl_WorkGroupSize.x.
int64_t ts_grid_threads(int64_t n) {
    int64_t bs = int64_t(gl_WorkGroupSize.x);
    int64_t planned = clamp((n + bs - 1) / bs, int64_t(1), int64_t(1) << 20);
    return int64_t(ts_num_groups(uint64_t(planned))) * bs;
}

// for (e = global thread index; e < n; e += total threads of the grid_1d launch). gl_WorkGroupID
// is the global block index (the runtime splits large grids with vkCmdDispatchBase).
#define GRID_STRIDE(e, n)                                                                          \
    for (int64_t e = int64_t(gl_WorkGroupID.x) * int64_t(gl_WorkGroupSize.x) + int64_t(gl_LocalInvocationID.x), \
                 e##_stride = ts_grid_threads(n);                                                  \
         e < (n); e += e##_stride)

// ----- reductions (workgroup size a multiple of 32, at most TS_RED_SIZE; uniform calls) -----

#ifndef TS_RED_SIZE
#define TS_RED_SIZE 1024
#endif
shared float ts_red[TS_RED_SIZE];
shared float ts_scratch[32];

// Xor butterfly over each 32 consecutive invocations, as CUDA's __shfl_xor_sync reduction (the
// same additions in the same order, so the same bits). Every invocation must call it.
float warp_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    barrier();
    ts_red[t] = v;
    barrier();
    for (uint m = 16u; m > 0u; m >>= 1) {
        float o = ts_red[t ^ m];
        barrier();
        v += o;
        ts_red[t] = v;
        barrier();
    }
    return v;
}

float warp_max(float v) {
    uint t = gl_LocalInvocationID.x;
    barrier();
    ts_red[t] = v;
    barrier();
    for (uint m = 16u; m > 0u; m >>= 1) {
        float o = ts_red[t ^ m];
        barrier();
        v = fmaxf_c(v, o);
        ts_red[t] = v;
        barrier();
    }
    return v;
}

// Sum over the workgroup; every invocation gets the result.
float block_sum(float v) {
    uint lane = gl_LocalInvocationID.x % 32u;
    uint warp = gl_LocalInvocationID.x / 32u;
    uint nwarps = (gl_WorkGroupSize.x + 31u) / 32u;
    v = warp_sum(v);
    barrier();
    if (lane == 0u) {
        ts_scratch[warp] = v;
    }
    barrier();
    v = lane < nwarps ? ts_scratch[lane] : 0.0;
    return warp_sum(v);
}

float block_max(float v) {
    uint lane = gl_LocalInvocationID.x % 32u;
    uint warp = gl_LocalInvocationID.x / 32u;
    uint nwarps = (gl_WorkGroupSize.x + 31u) / 32u;
    v = warp_max(v);
    barrier();
    if (lane == 0u) {
        ts_scratch[warp] = v;
    }
    barrier();
    v = lane < nwarps ? ts_scratch[lane] : NEG_INF;
    return warp_max(v);
}

#endif // TESSERA_COMMON_GLSL
