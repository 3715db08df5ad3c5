// Tessera CUDA kernels: shared definitions.
//
// Plain CUDA C (C++ subset) compiled at run time by NVRTC. No CUDA headers are included (not even
// cuda_fp16.h): f16/bf16 conversions are done on bits here, so a HIP build can compile the same
// files through a small compat header that defines TESSERA_COMPAT and the few macros below; so
// does SYCL (kernels/sycl/compat.hpp), which also maps the CUDA built-ins and math functions.
#pragma once

#ifndef TESSERA_COMPAT
// Warp size the kernels are written for, and a full-warp xor shuffle (width 32 on every target).
#define TESSERA_WARP 32
#define TSHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
// Lane `src`'s v (0..31), every lane of the warp taking part.
#define TSHFL(v, src) __shfl_sync(0xffffffffu, (v), (src), 32)
#define TSYNCWARP() __syncwarp()
// A block-shared array: TSHARED(float, buf, [4][64]) declares `buf` shared by the block.
#define TSHARED(type, name, dims) __shared__ type name dims
#endif

// Put before a loop whose every iteration decodes weights element by element, so that a JIT
// that unrolls it (SYCL's OpenCL CPU compiler: a tiled GEMM unit took 15 s instead of 3) keeps
// it rolled. Empty where unrolling pays (NVRTC, hipRTC); the SYCL compat header sets it.
#ifndef TLOOP_ROLLED
#define TLOOP_ROLLED
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// Element type codes, block sizes, op and error codes: generated from the Rust table.
#include "codes.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))

#ifndef TESSERA_TENSOR_DATA
// The type of a tensor's base address and how to get a pointer from it (SYCL holds it as an
// integer: DPC++ splits kernel arguments that are structs holding pointers into their fields,
// which a launch passing the struct's bytes cannot match).
typedef char* tensor_data_t;
#define TENSOR_BASE(t) ((t).data)
#endif

// A tensor as kernels see it: base address, ggml shape and byte strides, element type.
// Layout mirrors the Rust `KTensor` (#[repr(C)], 80 bytes).
struct Tensor {
    tensor_data_t data;
    i64 ne[4];
    i64 nb[4];
    int type;
    int pad;
};

__device__ __forceinline__ void raise_error(int* status, int code, int value) {
    if (atomicCAS(status, 0, code) == 0) {
        status[1] = value;
    }
}

// ----- f16 / bf16 on bits (round to nearest even, as the `half` crate) -----

__device__ __forceinline__ float h2f_bits(u16 h) {
    u32 sign = ((u32)(h & 0x8000u)) << 16;
    u32 ex = (h >> 10) & 0x1fu;
    u32 mant = h & 0x3ffu;
    if (ex == 0) {
        float v = (float)mant * 5.9604644775390625e-8f; // mant * 2^-24
        return sign ? -v : v;
    }
    if (ex == 31) {
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    }
    return __uint_as_float(sign | ((ex + 112u) << 23) | (mant << 13));
}

__device__ __forceinline__ float h2f(u16 h) {
#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT)
    // The hardware conversion (exact, as the bit version): a GEMV over f16 weights ran at a
    // third of its bf16 twin's speed with the bit version (H200).
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return h2f_bits(h);
#endif
}

__device__ __forceinline__ u16 f2h(float x) {
    u32 f = __float_as_uint(x);
    u32 sign = (f >> 16) & 0x8000u;
    u32 ax = f & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        return (u16)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    }
    if (ax >= 0x477ff000u) {
        return (u16)(sign | 0x7c00u); // >= 65520 rounds to infinity
    }
    if (ax < 0x38800000u) {
        // Subnormal (or zero): the mantissa is |x| / 2^-24, rounded to nearest even.
        u32 m = (u32)rintf(__uint_as_float(ax) * 16777216.0f);
        return (u16)(sign | m);
    }
    u32 h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
    u32 rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h += 1u;
    }
    return (u16)(sign | h);
}

__device__ __forceinline__ float bf2f(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

__device__ __forceinline__ u16 f2bf(float x) {
    u32 f = __float_as_uint(x);
    if ((f & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((f >> 16) | 0x40u); // quiet NaN
    }
    f += 0x7fffu + ((f >> 16) & 1u);
    return (u16)(f >> 16);
}

// ----- element access -----

// The element types this translation unit decodes, one bit per T_* code. Undefined, every type
// is compiled in (one module serves every launch: CUDA, HIP). A backend that builds a program per
// launch's set of tensor types (SYCL: `TypeSet` in tessera-kernels) defines it, so each load
// inlines only the decoders its tensors can hold: with every decoder inlined into each load of an
// unrolled loop, the OpenCL CPU compiler took tens of minutes for one program.
#ifndef TESSERA_TYPES
#define TESSERA_TYPES ((1u << T_COUNT) - 1u)
#endif
// Whether type code `code` is compiled in, and whether `type` is it (false at compile time when
// it is not compiled in, so the branch it guards is dropped).
#define HAS_T(code) (((TESSERA_TYPES) >> (code)) & 1u)
#define IS_T(type, code) (HAS_T(code) && (type) == (code))

__device__ __forceinline__ float ld_scalar(const char* p, int type) {
    if (IS_T(type, T_F32)) {
        return *(const float*)p;
    }
    if (IS_T(type, T_F16)) {
        return h2f(*(const u16*)p);
    }
    if (IS_T(type, T_BF16)) {
        return bf2f(*(const u16*)p);
    }
    if (IS_T(type, T_I32)) {
        return (float)*(const int*)p;
    }
    return 0.0f;
}

__device__ __forceinline__ void st_scalar(char* p, int type, float v) {
    if (IS_T(type, T_F32)) {
        *(float*)p = v;
    } else if (IS_T(type, T_F16)) {
        *(u16*)p = f2h(v);
    } else if (IS_T(type, T_BF16)) {
        *(u16*)p = f2bf(v);
    } else if (IS_T(type, T_I32)) {
        *(int*)p = (int)v;
    }
}

__device__ __forceinline__ float block_scale(const char* blk) {
    const u8* b = (const u8*)blk;
    return h2f((u16)(b[0] | (b[1] << 8)));
}

// Q5_0, Q4_K, Q5_K and Q6_K (decoded by kquant_elem).
__device__ __forceinline__ bool is_kquant(int type) {
    return IS_T(type, T_Q5_0) || IS_T(type, T_Q4_K) || IS_T(type, T_Q5_K) || IS_T(type, T_Q6_K);
}

// Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, Q5_0, Q4_K, Q5_K and Q6_K: read (dequantized) by the
// kernels, never written.
__device__ __forceinline__ bool is_lowbit(int type) {
    return IS_T(type, T_Q2_K) || IS_T(type, T_Q3_K) || IS_T(type, T_IQ4_NL) || IS_T(type, T_IQ4_XS) ||
           IS_T(type, T_MXFP4) || is_kquant(type);
}

// Weight types whose dot products llama.cpp's CPU backend takes against activations rounded to
// 8-bit blocks of 32 (ggml's vec_dot_type: Q8_0, or Q8_1 for the affine Q4_1 / Q5_1, whose levels
// round the same way). The GPU kernels multiply such weights by activations rounded likewise, so
// that their results round as the reference's do (exact f32 activations are closer to the true
// product than llama.cpp is, and drift from its logits on long chains of layers).
__device__ __forceinline__ bool act_q8(int type) {
    return IS_T(type, T_Q8_0) || IS_T(type, T_Q4_0) || IS_T(type, T_Q5_0) || IS_T(type, T_IQ4_NL) ||
           IS_T(type, T_MXFP4) || IS_T(type, T_Q4_1) || IS_T(type, T_Q5_1);
}

// quantize_row_q8_0 of a block whose largest magnitude is amax: levels roundf(x * inv) with
// inv = 1 / d, d = amax / 127, each worth `scale` (d as its f16 holds it).
struct Q8Round {
    float inv, scale;
};
__device__ __forceinline__ Q8Round q8_round_of(float amax) {
    Q8Round q;
    float d = amax / 127.0f;
    q.inv = d != 0.0f ? 1.0f / d : 0.0f;
    q.scale = h2f(f2h(d));
    return q;
}
// x as the rounded block holds it (its level times the scale).
__device__ __forceinline__ float q8_rounded(Q8Round q, float x) {
    return roundf(x * q.inv) * q.scale;
}

__device__ __forceinline__ bool is_quant(int type) {
    return IS_T(type, T_Q8_0) || IS_T(type, T_Q4_0) || IS_T(type, T_Q4_1) || IS_T(type, T_Q5_1) ||
           is_lowbit(type);
}

__device__ __forceinline__ int quant_block_bytes(int type) {
    if (IS_T(type, T_Q8_0)) return Q8_0_BYTES;
    if (IS_T(type, T_Q4_1)) return Q4_1_BYTES;
    if (IS_T(type, T_Q5_1)) return Q5_1_BYTES;
    if (IS_T(type, T_Q2_K)) return Q2_K_BYTES;
    if (IS_T(type, T_Q3_K)) return Q3_K_BYTES;
    if (IS_T(type, T_IQ4_NL)) return IQ4_NL_BYTES;
    if (IS_T(type, T_IQ4_XS)) return IQ4_XS_BYTES;
    if (IS_T(type, T_MXFP4)) return MXFP4_BYTES;
    if (IS_T(type, T_Q5_0)) return Q5_0_BYTES;
    if (IS_T(type, T_Q4_K)) return Q4_K_BYTES;
    if (IS_T(type, T_Q5_K)) return Q5_K_BYTES;
    if (IS_T(type, T_Q6_K)) return Q6_K_BYTES;
    return Q4_0_BYTES;
}

// Elements per block: 256 for the super-block formats, else 32.
__device__ __forceinline__ int quant_block_elems(int type) {
    return (IS_T(type, T_Q2_K) || IS_T(type, T_Q3_K) || IS_T(type, T_IQ4_XS) || IS_T(type, T_Q4_K) ||
            IS_T(type, T_Q5_K) || IS_T(type, T_Q6_K))
               ? QK_K
               : QK;
}

// ggml's kvalues_iq4nl (IQ4_NL / IQ4_XS levels) and kvalues_mxfp4 (E2M1 values doubled).
__device__ __forceinline__ float iq4nl_level(int i) {
    const signed char k[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return (float)k[i];
}

__device__ __forceinline__ float mxfp4_level(int i) {
    const signed char k[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    return (float)k[i];
}

// Half an E8M0 scale, 2^(e - 128), as ggml_e8m0_to_fp32_half.
__device__ __forceinline__ float e8m0_half(u8 e) {
    u32 bits = e < 2 ? (0x00200000u << e) : ((u32)(e - 1) << 23);
    return __int_as_float((int)bits);
}

// Nibble j (0..31) of a 32-element group's 16 bytes: low nibbles first, then high nibbles.
__device__ __forceinline__ int nibble32(const u8* q, int j) {
    u8 b = q[j & 15];
    return j < 16 ? (b & 15) : (b >> 4);
}

// Scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block from its 12 packed bytes q
// (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Element j of a Q5_0 / Q4_K / Q5_K / Q6_K block (ggml's dequantize_row_* in the same order of
// operations as the CPU backend's dequantizers, kernels/src/cpu/kquant.rs).
__device__ __forceinline__ float kquant_elem(const u8* b, int type, int j) {
    if (IS_T(type, T_Q5_0)) {
        // f16 d, u32 qh (bit j: fifth bit of element j), 16 nibble bytes; (q - 16) * d.
        u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
        u8 q = b[6 + (j & 15)];
        int level = (j < 16 ? (q & 15) : (q >> 4)) | (int)(((qh >> j) & 1u) << 4);
        return (float)(level - 16) * block_scale((const char*)b);
    }
    if (IS_T(type, T_Q6_K)) {
        // ql[128], qh[64], i8 scales[16], f16 d; element 128h + 32t + l.
        int h = j / 128, t = (j % 128) / 32, l = j % 32;
        u8 lo = b[64 * h + 32 * (t & 1) + l];
        int q = (t < 2 ? (lo & 15) : (lo >> 4)) | (((b[128 + 32 * h + l] >> (2 * t)) & 3) << 4);
        float s = (float)(signed char)b[192 + 8 * h + l / 16 + 2 * t];
        return block_scale((const char*)b + 208) * s * (float)(q - 32);
    }
    if (!HAS_T(T_Q4_K) && !HAS_T(T_Q5_K)) {
        return 0.0f; // unreachable: only Q4_K and Q5_K are left
    }
    // Q4_K / Q5_K: f16 d, f16 dmin, 12 scale bytes, [Q5_K: qh[32]], qs[128]; sub-block s = j / 32
    // takes the low (s even) or high nibbles of qs[32 (s / 2) + j % 32].
    int s = j / 32, l = j % 32;
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    const u8* qs = b + (IS_T(type, T_Q5_K) ? 48 : 16);
    u8 byte = qs[32 * (s / 2) + l];
    int q = (s & 1) ? (byte >> 4) : (byte & 15);
    if (IS_T(type, T_Q5_K)) {
        q += ((b[16 + l] >> s) & 1) ? 16 : 0;
    }
    float d1 = block_scale((const char*)b) * (float)sc;
    float m1 = block_scale((const char*)b + 2) * (float)m;
    return d1 * (float)q - m1;
}

// Element j of a Q2_K / Q3_K / IQ4_NL / IQ4_XS / MXFP4 / Q5_0 / Q4_K / Q5_K / Q6_K block (ggml's
// dequantize_row_* layouts; Q2_K / Q3_K keep element j = 128h + 32t + l as the 2-bit field t of
// quant byte 32h + l).
__device__ __forceinline__ float lowbit_elem(const char* blk, int type, int j) {
    const u8* b = (const u8*)blk;
    if (is_kquant(type)) {
        return kquant_elem(b, type, j);
    }
    if (IS_T(type, T_IQ4_NL)) {
        return block_scale(blk) * iq4nl_level(nibble32(b + 2, j));
    }
    if (IS_T(type, T_MXFP4)) {
        return mxfp4_level(nibble32(b + 1, j)) * e8m0_half(b[0]);
    }
    if (IS_T(type, T_IQ4_XS)) {
        int g = j / 32;
        u32 h = (u32)b[2] | ((u32)b[3] << 8);
        int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 15) | (int)(((h >> (2 * g)) & 3u) << 4);
        float dl = block_scale(blk) * (float)(ls - 32);
        return dl * iq4nl_level(nibble32(b + 8 + 16 * g, j % 32));
    }
    if (!HAS_T(T_Q2_K) && !HAS_T(T_Q3_K)) {
        return 0.0f; // unreachable: only Q2_K and Q3_K are left
    }
    int q = (b[(IS_T(type, T_Q2_K) ? 16 : 32) + 32 * (j / 128) + j % 32] >> (2 * ((j % 128) / 32))) & 3;
    if (IS_T(type, T_Q2_K)) {
        u8 sc = b[j / 16];
        float dl = block_scale(blk + 80) * (float)(sc & 15);
        float ml = block_scale(blk + 82) * (float)(sc >> 4);
        return dl * (float)q - ml;
    }
    // Q3_K: 6-bit scale of group g (low nibble in byte g or g - 8, top bits in byte 8 + g % 4),
    // high bit j / 32 of hmask byte j % 32.
    int g = j / 16;
    const u8* sc = b + 96;
    int low = g < 8 ? (sc[g] & 15) : (sc[g - 8] >> 4);
    int scale = (low | (((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
    int high = (b[j % 32] >> (j / 32)) & 1;
    float dl = block_scale(blk + 108) * (float)scale;
    return dl * (float)(q - (high ? 0 : 4));
}

// Level j (0..31, unsigned) of a Q4_1 / Q5_1 block: f16 d, f16 m, [Q5_1: u32 fifth bits], 16
// nibble bytes (element j: low nibble of byte j, or high nibble of byte j - 16). x = level*d + m.
__device__ __forceinline__ int affine_level(const char* blk, int type, int j) {
    const u8* b = (const u8*)blk;
    u8 q = b[(IS_T(type, T_Q5_1) ? 8 : 4) + (j & 15)];
    int level = j < 16 ? (q & 15) : (q >> 4);
    if (IS_T(type, T_Q5_1)) {
        u32 qh = (u32)b[4] | ((u32)b[5] << 8) | ((u32)b[6] << 16) | ((u32)b[7] << 24);
        level |= (int)((qh >> j) & 1u) << 4;
    }
    return level;
}

// Element i0 of a quantized row.
__device__ __forceinline__ float ld_quant(const char* row, int type, i64 i0) {
    if (is_lowbit(type)) {
        int qk = quant_block_elems(type);
        return lowbit_elem(row + (i0 / qk) * quant_block_bytes(type), type, (int)(i0 % qk));
    }
    i64 blk = i0 / QK;
    int j = (int)(i0 % QK);
    const char* b = row + blk * quant_block_bytes(type);
    if (IS_T(type, T_Q8_0)) {
        return (float)((signed char)b[2 + j]) * block_scale(b);
    }
    if (IS_T(type, T_Q4_1) || IS_T(type, T_Q5_1)) {
        return (float)affine_level(b, type, j) * block_scale(b) + block_scale(b + 2);
    }
    if (!HAS_T(T_Q4_0)) {
        return 0.0f; // unreachable: only Q4_0 is left
    }
    u8 q = (u8)b[2 + (j & 15)];
    int nib = j < 16 ? (q & 15) : (q >> 4);
    return (float)(nib - 8) * block_scale(b);
}

__device__ __forceinline__ const char* row_ptr(const Tensor& t, i64 i1, i64 i2, i64 i3) {
    return TENSOR_BASE(t) + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

__device__ __forceinline__ float ld(const Tensor& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    const char* row = row_ptr(t, i1, i2, i3);
    if (is_quant(t.type)) {
        return ld_quant(row, t.type, i0);
    }
    return ld_scalar(row + i0 * t.nb[0], t.type);
}

__device__ __forceinline__ void st(const Tensor& t, i64 i0, i64 i1, i64 i2, i64 i3, float v) {
    st_scalar((char*)row_ptr(t, i1, i2, i3) + i0 * t.nb[0], t.type, v);
}

__device__ __forceinline__ int ld_i32(const Tensor& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    return *(const int*)(row_ptr(t, i1, i2, i3) + i0 * t.nb[0]);
}

__device__ __forceinline__ void st_i32(const Tensor& t, i64 i0, i64 i1, i64 i2, i64 i3, int v) {
    *(int*)((char*)row_ptr(t, i1, i2, i3) + i0 * t.nb[0]) = v;
}

// Coordinates of flat element e (natural order) of shape ne.
__device__ __forceinline__ void unravel(i64 e, const i64* ne, i64* i) {
    i[0] = e % ne[0];
    e /= ne[0];
    i[1] = e % ne[1];
    e /= ne[1];
    i[2] = e % ne[2];
    i[3] = e / ne[2];
}

// Row r (flat over axes 1..3) of shape ne as (i1, i2, i3).
__device__ __forceinline__ void unravel_row(i64 r, const i64* ne, i64* i) {
    i[1] = r % ne[1];
    r /= ne[1];
    i[2] = r % ne[2];
    i[3] = r / ne[2];
}

#define GRID_STRIDE(e, n) \
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += (i64)gridDim.x * blockDim.x)

// ----- reductions (blockDim.x a multiple of 32, at most 1024) -----

__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) {
        v += TSHFL_XOR(v, m);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) {
        v = fmaxf(v, TSHFL_XOR(v, m));
    }
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int nwarps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int nwarps = (blockDim.x + 31) / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}
