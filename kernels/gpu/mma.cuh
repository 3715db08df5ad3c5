// Tessera CUDA kernels: warp-level integer matrix tiles.
//
// One warp multiplies a 16 x 32 tile of int8 by a 32 x 8 tile of int8 into a 16 x 8 tile of
// int32 (PTX's mma.sync m16n8k32, sm_80 and later), each lane holding the fragment elements
// the instruction assigns it. Everywhere else (SYCL, HIP, older CUDA targets) `mma_i8`
// computes the same product from the same fragments with shuffles and 4-byte dot products, so
// the kernels built on it (their tiling, staging and epilogues) execute unchanged on SYCL's CPU
// device in CI; only the instruction is new on a GPU.
#pragma once
#include "common.cuh"

// a · b over four signed bytes, plus c.
__device__ __forceinline__ int dot4_s8(int a, int b, int c) {
#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT)
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; i++) {
        c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    }
    return c;
#endif
}

// Fragments of D = A · B + C, four int8 per int (lowest k in the lowest byte). Lane l = 4 g + t
// (g = l / 4, t = l % 4) holds
//   A (16 x 32, row-major): x[0] row g, k 4t .. 4t+3; x[1] row g+8, the same k;
//                           x[2] row g, k 16+4t .. 16+4t+3; x[3] row g+8, those k;
//   B (32 x 8, by column):  x[0] column g, k 4t .. 4t+3; x[1] column g, k 16+4t .. 16+4t+3;
//   C, D (16 x 8, int32):   x[0] (g, 2t), x[1] (g, 2t+1), x[2] (g+8, 2t), x[3] (g+8, 2t+1).
struct mma_a8 {
    int x[4];
};
struct mma_b8 {
    int x[2];
};
struct mma_c32 {
    int x[4];
};

#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TESSERA_MMA_I8 1
#define TESSERA_MMA_F16 1
#else
// The tile products without the instruction, for both shapes (int8 m16n8k32 and f16 m16n8k16
// share their fragment layout in words: four A words, two B words, four C values per lane):
// row g's k are spread over the words of lanes 4 g .. 4 g + 3, column n's over those of lanes
// 4 n .. 4 n + 3, so step s gathers the s-th word of each row's two k halves from lane 4 g + s
// and of this lane's columns 2t and 2t+1 from lanes 8t + s and 8t + 4 + s. `dot(a, b, c)` is c
// plus the dot product of two words' elements.
template <typename W, typename C, typename Dot>
__device__ __forceinline__ void mma_emulated(C* c, const W* a, const W* b, Dot dot) {
    int lane = threadIdx.x % 32;
    int g = lane / 4, t = lane % 4;
    for (int s = 0; s < 4; s++) {
        int ra = 4 * g + s, rb0 = 8 * t + s, rb1 = 8 * t + 4 + s;
        W a0 = TSHFL(a[0], ra), a1 = TSHFL(a[1], ra), a2 = TSHFL(a[2], ra), a3 = TSHFL(a[3], ra);
        W b00 = TSHFL(b[0], rb0), b01 = TSHFL(b[1], rb0);
        W b10 = TSHFL(b[0], rb1), b11 = TSHFL(b[1], rb1);
        c[0] = dot(a0, b00, dot(a2, b01, c[0]));
        c[1] = dot(a0, b10, dot(a2, b11, c[1]));
        c[2] = dot(a1, b00, dot(a3, b01, c[2]));
        c[3] = dot(a1, b10, dot(a3, b11, c[3]));
    }
}

struct mma_dot_i8 {
    __device__ int operator()(int a, int b, int c) const {
        return dot4_s8(a, b, c);
    }
};
#endif

// c += a · b over one warp. Every lane of the warp must call it.
__device__ __forceinline__ void mma_i8(mma_c32& c, const mma_a8& a, const mma_b8& b) {
#ifdef TESSERA_MMA_I8
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c.x[0]), "+r"(c.x[1]), "+r"(c.x[2]), "+r"(c.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
    mma_emulated(c.x, a.x, b.x, mma_dot_i8());
#endif
}

// Half-precision tiles: D (f32) = A (f16) · B (f16) + C, m16n8k16 (PTX's mma.sync m16n8k16 with
// f32 accumulators, sm_80 and later). Two f16 per u32, the lower k in the low half. Lane
// l = 4 g + t holds
//   A (16 x 16, row-major): x[0] row g, k 2t, 2t+1; x[1] row g+8, the same k;
//                           x[2] row g, k 8+2t, 8+2t+1; x[3] row g+8, those k;
//   B (16 x 8, by column):  x[0] column g, k 2t, 2t+1; x[1] column g, k 8+2t, 8+2t+1;
//   C, D (16 x 8, f32):     x[0] (g, 2t), x[1] (g, 2t+1), x[2] (g+8, 2t), x[3] (g+8, 2t+1),
// so a C tile of columns 16 s .. 16 s + 7 and the next one are, packed to f16 pairs, the A
// fragment of k step s for a following product (attention's P · V).
struct mma_a16 {
    u32 x[4];
};
struct mma_b16 {
    u32 x[2];
};
struct mma_c32f {
    float x[4];
};

// Two f16 (bits) as one u32, a in the low half.
__device__ __forceinline__ u32 pack_h2(u16 a, u16 b) {
    return (u32)a | ((u32)b << 16);
}

// x and y rounded to f16 (to nearest even) and packed as pack_h2 does.
__device__ __forceinline__ u32 pack_f2h2(float x, float y) {
#ifdef TESSERA_MMA_F16
    u32 r;
    // The upper half from the first source.
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
    return r;
#else
    return pack_h2(f2h(x), f2h(y));
#endif
}

#ifndef TESSERA_MMA_F16
// c plus the products of two f16 pairs (each exact in f32, as the tensor core forms them).
struct mma_dot_h2 {
    __device__ float operator()(u32 a, u32 b, float c) const {
        c += h2f_bits((u16)(a & 0xffffu)) * h2f_bits((u16)(b & 0xffffu));
        return c + h2f_bits((u16)(a >> 16)) * h2f_bits((u16)(b >> 16));
    }
};
#endif

// c += a · b over one warp. Every lane of the warp must call it.
__device__ __forceinline__ void mma_f16(mma_c32f& c, const mma_a16& a, const mma_b16& b) {
#ifdef TESSERA_MMA_F16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
    mma_emulated(c.x, a.x, b.x, mma_dot_h2());
#endif
}
