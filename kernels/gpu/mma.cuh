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
#endif

// c += a · b over one warp. Every lane of the warp must call it.
__device__ __forceinline__ void mma_i8(mma_c32& c, const mma_a8& a, const mma_b8& b) {
#ifdef TESSERA_MMA_I8
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c.x[0]), "+r"(c.x[1]), "+r"(c.x[2]), "+r"(c.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
    // Row g's k are spread over lanes 4 g .. 4 g + 3, column n's over lanes 4 n .. 4 n + 3: step
    // s gathers k 4s .. 4s+3 and 16+4s .. 16+4s+3 of this lane's rows and columns.
    int lane = threadIdx.x % 32;
    int g = lane / 4, t = lane % 4;
    for (int s = 0; s < 4; s++) {
        int ra = 4 * g + s, rb0 = 8 * t + s, rb1 = 8 * t + 4 + s;
        int a0 = TSHFL(a.x[0], ra), a1 = TSHFL(a.x[1], ra), a2 = TSHFL(a.x[2], ra), a3 = TSHFL(a.x[3], ra);
        int b00 = TSHFL(b.x[0], rb0), b01 = TSHFL(b.x[1], rb0);
        int b10 = TSHFL(b.x[0], rb1), b11 = TSHFL(b.x[1], rb1);
        c.x[0] = dot4_s8(a0, b00, dot4_s8(a2, b01, c.x[0]));
        c.x[1] = dot4_s8(a0, b10, dot4_s8(a2, b11, c.x[1]));
        c.x[2] = dot4_s8(a1, b00, dot4_s8(a3, b01, c.x[2]));
        c.x[3] = dot4_s8(a1, b10, dot4_s8(a3, b11, c.x[3]));
    }
#endif
}
