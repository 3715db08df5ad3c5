// MUL_MAT: dst[m, n, b2, b3] (f32) = w[k, m, w2, w3]^T · x[k, n, b2, b3], weights broadcast over
// the batch axes (plane (i2, i3) of dst uses weight plane (i2 / r2, i3 / r3)).
// Weights: F32, F16, BF16 (any row stride), Q8_0, Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4,
// Q5_0, Q4_K, Q5_K, Q6_K;
// activations: any float type and strides.
#include "common.cuh"
#include "mma.cuh"

// Plane bookkeeping shared by the kernels.
__device__ __forceinline__ void plane_of(i64 plane, const Tensor& dst, i64 r2, i64 r3, i64* i2, i64* i3,
                                         i64* w2, i64* w3) {
    *i2 = plane % dst.ne[2];
    *i3 = plane / dst.ne[2];
    *w2 = *i2 / r2;
    *w3 = *i3 / r3;
}

#define GEMV_WARPS 4

// GEMV for float weights: one warp per (weight row, activation column, plane); blockDim 128.
// Blocks are numbered row-block fastest, then column, then plane.
extern "C" __global__ void k_mul_mat_vec_f(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 m = w.ne[1], n = x.ne[1], kdim = w.ne[0];
    i64 rblocks = (m + GEMV_WARPS - 1) / GEMV_WARPS;
    i64 row = (blockIdx.x % rblocks) * GEMV_WARPS + warp;
    i64 rest = blockIdx.x / rblocks;
    i64 col = rest % n;
    i64 i2, i3, w2, w3;
    plane_of(rest / n, dst, r2, r3, &i2, &i3, &w2, &w3);
    if (row >= m) {
        return;
    }
    const char* wr = row_ptr(w, row, w2, w3);
    float s = 0.0f;
    for (i64 k = lane; k < kdim; k += 32) {
        s += ld_scalar(wr + k * w.nb[0], w.type) * ld(x, k, col, i2, i3);
    }
    s = warp_sum(s);
    if (lane == 0) {
        st(dst, row, col, i2, i3, s);
    }
}

// Dequantising GEMV for quantized weights: one warp per (row, column, plane); each lane takes whole
// 32-element groups (blocks, or eighths of a 256-element super-block), so a warp reads 32 consecutive
// groups per step.
extern "C" __global__ void k_mul_mat_vec_q(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 m = w.ne[1], n = x.ne[1], nblk = w.ne[0] / QK;
    i64 rblocks = (m + GEMV_WARPS - 1) / GEMV_WARPS;
    i64 row = (blockIdx.x % rblocks) * GEMV_WARPS + warp;
    i64 rest = blockIdx.x / rblocks;
    i64 col = rest % n;
    i64 i2, i3, w2, w3;
    plane_of(rest / n, dst, r2, r3, &i2, &i3, &w2, &w3);
    if (row >= m) {
        return;
    }
    const char* wr = row_ptr(w, row, w2, w3);
    float s = 0.0f;
    for (i64 b = lane; b < nblk; b += 32) {
        i64 k0 = b * QK;
        // The group's activations, rounded as llama.cpp rounds them for this weight type (act_q8).
        float xb[QK];
        float amax = 0.0f;
        TLOOP_ROLLED
        for (int j = 0; j < QK; j++) {
            xb[j] = ld(x, k0 + j, col, i2, i3);
            amax = fmaxf(amax, fabsf(xb[j]));
        }
        if (act_q8(w.type)) {
            Q8Round q = q8_round_of(amax);
            for (int j = 0; j < QK; j++) {
                xb[j] = q8_rounded(q, xb[j]);
            }
        }
        float part = 0.0f;
        if (IS_T(w.type, T_Q8_0)) {
            const char* blk = wr + b * Q8_0_BYTES;
            for (int j = 0; j < QK; j++) {
                part += (float)((signed char)blk[2 + j]) * xb[j];
            }
            s += part * block_scale(blk);
        } else if (IS_T(w.type, T_Q4_0)) {
            const char* blk = wr + b * Q4_0_BYTES;
            for (int j = 0; j < QK / 2; j++) {
                u8 q = (u8)blk[2 + j];
                part += (float)((int)(q & 15) - 8) * xb[j];
                part += (float)((int)(q >> 4) - 8) * xb[j + QK / 2];
            }
            s += part * block_scale(blk);
        } else if (is_lowbit(w.type)) {
            int per = quant_block_elems(w.type) / QK;
            const char* blk = wr + (b / per) * quant_block_bytes(w.type);
            int j0 = (int)(b % per) * QK;
            TLOOP_ROLLED
            for (int j = 0; j < QK; j++) {
                part += lowbit_elem(blk, w.type, j0 + j) * xb[j];
            }
            s += part;
        } else if (IS_T(w.type, T_Q4_1) || IS_T(w.type, T_Q5_1)) {
            // Affine blocks: d * sum(level * x) + m * sum(x).
            const char* blk = wr + b * quant_block_bytes(w.type);
            float xsum = 0.0f;
            for (int j = 0; j < QK; j++) {
                part += (float)affine_level(blk, w.type, j) * xb[j];
                xsum += xb[j];
            }
            s += part * block_scale(blk) + xsum * block_scale(blk + 2);
        }
    }
    s = warp_sum(s);
    if (lane == 0) {
        st(dst, row, col, i2, i3, s);
    }
}

#define TM 64
#define TN 64
#define TK 32

// Tiled GEMM for any weight type: a 64 x 64 output tile per block of 256 threads, 4 x 4 outputs
// per thread, k in steps of 32 (one quant block) staged through shared memory as f32 (the
// activations rounded to 8-bit blocks for the weight types of act_q8).
// grid = (ceil(m / 64), ceil(n / 64), planes).
extern "C" __global__ void k_mul_mat_tiled(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    TSHARED(float, ws, [TK][TM + 1]);
    TSHARED(float, xs, [TK][TN + 1]);
    i64 m = w.ne[1], n = x.ne[1], kdim = w.ne[0];
    i64 m0 = (i64)blockIdx.x * TM, n0 = (i64)blockIdx.y * TN;
    i64 i2, i3, w2, w3;
    plane_of(blockIdx.z, dst, r2, r3, &i2, &i3, &w2, &w3);
    int tid = threadIdx.x;
    int tr = tid % 16, tc = tid / 16;
    float acc[4][4];
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            acc[a][b] = 0.0f;
        }
    }
    for (i64 k0 = 0; k0 < kdim; k0 += TK) {
        TLOOP_ROLLED
        for (int t = 0; t < (TM * TK) / 256; t++) {
            int l = tid + 256 * t;
            int kk = l % TK, rr = l / TK;
            i64 row = m0 + rr, k = k0 + kk;
            ws[kk][rr] = (row < m && k < kdim) ? ld(w, k, row, w2, w3) : 0.0f;
        }
        TLOOP_ROLLED
        for (int t = 0; t < (TN * TK) / 256; t++) {
            int l = tid + 256 * t;
            int kk = l % TK, cc = l / TK;
            i64 col = n0 + cc, k = k0 + kk;
            xs[kk][cc] = (col < n && k < kdim) ? ld(x, k, col, i2, i3) : 0.0f;
        }
        __syncthreads();
        if (act_q8(w.type)) {
            // A column's 32 staged activations are one block (k0 is a multiple of 32), rounded as
            // llama.cpp rounds them for this weight type: four threads per column (neighbouring
            // lanes of a warp), eight values each.
            int cc = tid / 4, part = tid % 4;
            float amax = 0.0f;
            for (int j = 0; j < 8; j++) {
                amax = fmaxf(amax, fabsf(xs[8 * part + j][cc]));
            }
            amax = fmaxf(amax, TSHFL_XOR(amax, 1));
            amax = fmaxf(amax, TSHFL_XOR(amax, 2));
            Q8Round q = q8_round_of(amax);
            for (int j = 0; j < 8; j++) {
                xs[8 * part + j][cc] = q8_rounded(q, xs[8 * part + j][cc]);
            }
            __syncthreads();
        }
        for (int kk = 0; kk < TK; kk++) {
            float av[4], bv[4];
            for (int a = 0; a < 4; a++) {
                av[a] = ws[kk][tr + 16 * a];
                bv[a] = xs[kk][tc + 16 * a];
            }
            for (int a = 0; a < 4; a++) {
                for (int b = 0; b < 4; b++) {
                    acc[a][b] += av[a] * bv[b];
                }
            }
        }
        __syncthreads();
    }
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            i64 row = m0 + tr + 16 * a, col = n0 + tc + 16 * b;
            if (row < m && col < n) {
                st(dst, row, col, i2, i3, acc[a][b]);
            }
        }
    }
}

// ----- GEMV at memory bandwidth (one activation column, f32 contiguous along k) -----
//
// Every weight type is read in steps of 256 elements per warp, 8 elements per lane, with the
// widest loads its block layout allows (16 bytes for float rows, 4 or 2 for block formats); a
// lane's 8 activations are loaded once per step and reused for GV_ROWS rows (for Q8_0 and Q4_0
// rounded to 8 bits and multiplied with dp4a: GV_INT8). The weight type is a compile-time
// constant in each entry point (k_gemv_f16, k_gemv_q4_0, ...). Taken by the planner for F32, F16,
// BF16, Q8_0, Q4_0, Q4_K and Q6_K weights with suitably aligned rows; the other types and layouts
// use k_mul_mat_vec_q / k_mul_mat_vec_f.

// Weight rows per warp (swept on an H200 by scripts/gpu-perf.sh: 2 was best or near it for
// every type) and unrolling of the step loop.
#ifndef GV_ROWS
#define GV_ROWS 2
#endif
#ifndef GV_UNROLL
#define GV_UNROLL 2
#endif
// How the step loop is unrolled: NVRTC unrolls a loop of unknown trip count GV_UNROLL times;
// hipRTC's clang warns that it cannot (and warnings fail the toolchain test), and the SYCL
// compiler is left to its own choice.
#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT)
#define GV_UNROLL_STEPS _Pragma("unroll GV_UNROLL")
#else
#define GV_UNROLL_STEPS
#endif
#define GV_STEP 256

struct alignas(16) gv_u4 {
    u32 x, y, z, w;
};
struct alignas(16) gv_f4 {
    float x, y, z, w;
};
struct alignas(8) gv_f2 {
    float x, y;
};

__device__ __forceinline__ void gv_ld4(const float* p, float* o) {
    gv_f4 v = *(const gv_f4*)p;
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
}

__device__ __forceinline__ u32 gv_u32_from_u16(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// The lane's 8 activations of step `s`, in the order gv_dot multiplies them.
__device__ __forceinline__ void gv_x(int T, const float* x, i64 s, int lane, float* xv) {
    i64 k0 = s * GV_STEP;
    if (T == T_Q4_0) {
        // Block lane / 4 of the step, part q = lane % 4: elements 4q..4q+3 and 16+4q..16+4q+3.
        i64 b = k0 + 32 * (lane / 4) + 4 * (lane % 4);
        gv_ld4(x + b, xv);
        gv_ld4(x + b + 16, xv + 4);
    } else if (T == T_Q4_K) {
        // Sub-block pair i = lane / 8, part p = lane % 8: elements 64i+4p.. (low nibbles) and
        // 64i+32+4p.. (high nibbles).
        i64 b = k0 + 64 * (lane / 8) + 4 * (lane % 8);
        gv_ld4(x + b, xv);
        gv_ld4(x + b + 32, xv + 4);
    } else if (T == T_Q6_K) {
        // Half h = lane / 16, pair l = 2 (lane % 16): elements 128h + 32t + l, l + 1 for t = 0..3.
        i64 b = k0 + 128 * (lane / 16) + 2 * (lane % 16);
        for (int t = 0; t < 4; t++) {
            gv_f2 v = *(const gv_f2*)(x + b + 32 * t);
            xv[2 * t] = v.x;
            xv[2 * t + 1] = v.y;
        }
    } else {
        // Floats and Q8_0: elements 8 lane .. 8 lane + 7.
        gv_ld4(x + k0 + 8 * lane, xv);
        gv_ld4(x + k0 + 8 * lane + 4, xv + 4);
    }
}

// The lane's share of step `s` of one weight row: the dot product of its 8 weights with xv.
__device__ __forceinline__ float gv_dot(int T, const char* row, i64 s, int lane, const float* xv) {
    float acc = 0.0f;
    if (T == T_F32) {
        const float* w = (const float*)row + s * GV_STEP + 8 * lane;
        float a[8];
        gv_ld4(w, a);
        gv_ld4(w + 4, a + 4);
        for (int j = 0; j < 8; j++) {
            acc += a[j] * xv[j];
        }
    } else if (T == T_F16 || T == T_BF16) {
        gv_u4 v = *(const gv_u4*)(row + 2 * (s * GV_STEP + 8 * lane));
        u32 h[4] = {v.x, v.y, v.z, v.w};
        for (int j = 0; j < 4; j++) {
            float lo = T == T_F16 ? h2f((u16)(h[j] & 0xffffu)) : bf2f((u16)(h[j] & 0xffffu));
            float hi = T == T_F16 ? h2f((u16)(h[j] >> 16)) : bf2f((u16)(h[j] >> 16));
            acc += lo * xv[2 * j] + hi * xv[2 * j + 1];
        }
    } else if (T == T_Q8_0) {
        const u8* blk = (const u8*)row + (s * 8 + lane / 4) * Q8_0_BYTES;
        const u8* q = blk + 2 + 8 * (lane % 4);
        u32 a = gv_u32_from_u16(q), b = gv_u32_from_u16(q + 4);
        for (int j = 0; j < 4; j++) {
            acc += (float)(signed char)(a >> (8 * j)) * xv[j] + (float)(signed char)(b >> (8 * j)) * xv[4 + j];
        }
        acc *= block_scale((const char*)blk);
    } else if (T == T_Q4_0) {
        const u8* blk = (const u8*)row + (s * 8 + lane / 4) * Q4_0_BYTES;
        u32 q = gv_u32_from_u16(blk + 2 + 4 * (lane % 4));
        for (int j = 0; j < 4; j++) {
            u32 byte = (q >> (8 * j)) & 0xffu;
            acc += (float)((int)(byte & 15u) - 8) * xv[j] + (float)((int)(byte >> 4) - 8) * xv[4 + j];
        }
        acc *= block_scale((const char*)blk);
    } else if (T == T_Q4_K) {
        const u8* b = (const u8*)row + s * Q4_K_BYTES;
        int i = lane / 8, p = lane % 8;
        u32 q = *(const u32*)(b + 16 + 32 * i + 4 * p);
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * i, b + 4, &sc0, &m0);
        scale_min_k4(2 * i + 1, b + 4, &sc1, &m1);
        float d = block_scale((const char*)b), dmin = block_scale((const char*)b + 2);
        float dot0 = 0.0f, dot1 = 0.0f, xs0 = 0.0f, xs1 = 0.0f;
        for (int j = 0; j < 4; j++) {
            u32 byte = (q >> (8 * j)) & 0xffu;
            dot0 += (float)(byte & 15u) * xv[j];
            dot1 += (float)(byte >> 4) * xv[4 + j];
            xs0 += xv[j];
            xs1 += xv[4 + j];
        }
        acc = d * ((float)sc0 * dot0 + (float)sc1 * dot1) - dmin * ((float)m0 * xs0 + (float)m1 * xs1);
    } else if (T == T_Q6_K) {
        const u8* b = (const u8*)row + s * Q6_K_BYTES;
        int h = lane / 16, l = 2 * (lane % 16);
        u32 lo0 = *(const u16*)(b + 64 * h + l);      // t = 0 (low nibbles), t = 2 (high)
        u32 lo1 = *(const u16*)(b + 64 * h + 32 + l); // t = 1 (low nibbles), t = 3 (high)
        u32 hb = *(const u16*)(b + 128 + 32 * h + l);
        const signed char* sc = (const signed char*)(b + 192 + 8 * h + l / 16);
        for (int t = 0; t < 4; t++) {
            u32 lo = (t & 1) ? lo1 : lo0;
            int sh = t < 2 ? 0 : 4;
            float part = 0.0f;
            for (int e = 0; e < 2; e++) {
                int ql = (int)((lo >> (8 * e + sh)) & 15u);
                int qh = (int)((hb >> (8 * e + 2 * t)) & 3u);
                part += (float)((ql | (qh << 4)) - 32) * xv[2 * t + e];
            }
            acc += (float)sc[2 * t] * part;
        }
        acc *= block_scale((const char*)b + 208);
    }
    return acc;
}

// Integer dot products for Q8_0 and Q4_0 weights (GV_INT8, default on): each lane's activations
// are rounded to 8 bits per 32-element block, as ggml rounds them for these weights
// (quantize_row_q8_0: d = amax / 127 kept as f16, q = round(x / d), halves away from zero), and
// multiplied with dp4a, so the products are llama.cpp's and a weight byte costs a quarter of
// the float path's multiplies. GV_INT8=0 keeps f32 activations (a speed comparison only: every
// other kernel rounds them as llama.cpp does, act_q8).
#ifndef GV_INT8
#define GV_INT8 1
#endif

// The lane's 8 activations rounded to 8 bits (packed four per int in xq) with the scale of their
// 32-element block, whose four lanes (4 (lane / 4) .. + 3, in the Q8_0 and Q4_0 orders of gv_x)
// share the maximum through two shuffles; returns the scale as f16 would hold it. Every lane of
// the warp must call it.
__device__ __forceinline__ float gv_quantize_x(const float* xv, int* xq) {
    float amax = 0.0f;
    for (int j = 0; j < 8; j++) {
        amax = fmaxf(amax, fabsf(xv[j]));
    }
    amax = fmaxf(amax, TSHFL_XOR(amax, 1));
    amax = fmaxf(amax, TSHFL_XOR(amax, 2));
    // q8_round_of's arithmetic, spelled out: computing the f16 scale after the loop keeps it out
    // of the registers live across it (q8_round_of here: k_gemv_q8_0 56 -> 61 registers on sm_90).
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int h = 0; h < 2; h++) {
        u32 packed = 0;
        for (int j = 0; j < 4; j++) {
            int q = (int)roundf(xv[4 * h + j] * id);
            packed |= ((u32)q & 0xffu) << (8 * j);
        }
        xq[h] = (int)packed;
    }
    return h2f(f2h(d));
}

// gv_dot with the activations as gv_quantize_x left them (Q8_0 and Q4_0 weights).
__device__ __forceinline__ float gv_dot_int(int T, const char* row, i64 s, int lane, const int* xq, float dx) {
    int isum = 0;
    const u8* blk;
    if (T == T_Q8_0) {
        blk = (const u8*)row + (s * 8 + lane / 4) * Q8_0_BYTES;
        const u8* q = blk + 2 + 8 * (lane % 4);
        isum = dot4_s8((int)gv_u32_from_u16(q), xq[0], dot4_s8((int)gv_u32_from_u16(q + 4), xq[1], 0));
    } else {
        blk = (const u8*)row + (s * 8 + lane / 4) * Q4_0_BYTES;
        u32 q = gv_u32_from_u16(blk + 2 + 4 * (lane % 4));
        int lo = (int)(q & 0x0f0f0f0fu), hi = (int)((q >> 4) & 0x0f0f0f0fu);
        // Levels are nibble - 8: subtract 8 times the activations' sum.
        int xsum = dot4_s8(0x01010101, xq[0], dot4_s8(0x01010101, xq[1], 0));
        isum = dot4_s8(lo, xq[0], dot4_s8(hi, xq[1], 0)) - 8 * xsum;
    }
    return (float)isum * block_scale((const char*)blk) * dx;
}

// GV_ROWS rows of one column from row0 (those below m): lanes split each step's 256 elements, then a warp sum per row.
__device__ __forceinline__ void gv_rows(int T, const Tensor& dst, const Tensor& w, const Tensor& x, i64 row0,
                                        i64 m, i64 col, i64 i2, i64 i3, i64 w2, i64 w3, int lane) {
    i64 kdim = w.ne[0];
    const float* xr = (const float*)row_ptr(x, col, i2, i3);
    const char* rows[GV_ROWS];
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) {
        // Rows past the end read the last row and store nothing.
        rows[r] = row_ptr(w, row0 + r < m ? row0 + r : m - 1, w2, w3);
    }
    float acc[GV_ROWS];
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) {
        acc[r] = 0.0f;
    }
    // Whole steps unrolled GV_UNROLL times (more loads in flight per lane); then a partial last
    // step (k not a multiple of 256), where lanes whose 8 elements start past k add nothing (k
    // is a multiple of 8, and of 32 for block formats, so none straddles it).
    i64 whole = kdim / GV_STEP;
    bool partial = whole * GV_STEP < kdim;
    bool in_last = whole * GV_STEP + (T == T_Q4_0 ? 32 * (lane / 4) : 8 * lane) < kdim;
    if (GV_INT8 && (T == T_Q8_0 || T == T_Q4_0)) {
        GV_UNROLL_STEPS
        for (i64 s = 0; s < whole; s++) {
            float xv[8];
            int xq[2];
            gv_x(T, xr, s, lane, xv);
            float dx = gv_quantize_x(xv, xq);
#pragma unroll
            for (int r = 0; r < GV_ROWS; r++) {
                acc[r] += gv_dot_int(T, rows[r], s, lane, xq, dx);
            }
        }
        if (partial) {
            // Every lane quantizes (the shuffles need the whole warp).
            float xv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            int xq[2];
            if (in_last) {
                gv_x(T, xr, whole, lane, xv);
            }
            float dx = gv_quantize_x(xv, xq);
            if (in_last) {
#pragma unroll
                for (int r = 0; r < GV_ROWS; r++) {
                    acc[r] += gv_dot_int(T, rows[r], whole, lane, xq, dx);
                }
            }
        }
    } else {
        GV_UNROLL_STEPS
        for (i64 s = 0; s < whole; s++) {
            float xv[8];
            gv_x(T, xr, s, lane, xv);
#pragma unroll
            for (int r = 0; r < GV_ROWS; r++) {
                acc[r] += gv_dot(T, rows[r], s, lane, xv);
            }
        }
        if (partial && in_last) {
            float xv[8];
            gv_x(T, xr, whole, lane, xv);
#pragma unroll
            for (int r = 0; r < GV_ROWS; r++) {
                acc[r] += gv_dot(T, rows[r], whole, lane, xv);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < m) {
            st(dst, row0 + r, col, i2, i3, v);
        }
    }
}

// blockDim 128 (4 warps); a block takes GV_BLOCK_ROWS (8) rows of one column and plane, its
// warps GV_ROWS rows at a time; blocks numbered row-block fastest, then column, then plane, as
// k_mul_mat_vec_q. The plan's grid depends on GV_BLOCK_ROWS alone, so GV_ROWS can be swept with
// a define (TESSERA_CUDA_DEFINES=GV_ROWS=1) without a new plan. (16 rows per block left an H200
// with 27 resident warps per SM for a 14336-row GEMV, a third of what its registers allow.) One entry point per weight type
// (k_gemv_*), so that each gets the registers its own decoding needs: one kernel switching over
// all seven took the most any of them needs (96 to 140 on sm_90) and ran fewer warps.
#define GV_BLOCK_ROWS 8
__device__ __forceinline__ void gv_kernel(int T, const Tensor& dst, const Tensor& w, const Tensor& x, i64 r2,
                                          i64 r3) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 m = w.ne[1], n = x.ne[1];
    i64 rblocks = (m + GV_BLOCK_ROWS - 1) / GV_BLOCK_ROWS;
    i64 first = (blockIdx.x % rblocks) * GV_BLOCK_ROWS;
    i64 end = first + GV_BLOCK_ROWS < m ? first + GV_BLOCK_ROWS : m;
    i64 rest = blockIdx.x / rblocks;
    i64 col = rest % n;
    i64 i2, i3, w2, w3;
    plane_of(rest / n, dst, r2, r3, &i2, &i3, &w2, &w3);
    for (i64 row0 = first + warp * GV_ROWS; row0 < end; row0 += GEMV_WARPS * GV_ROWS) {
        gv_rows(T, dst, w, x, row0, end, col, i2, i3, w2, w3, lane);
    }
}

extern "C" __global__ void k_gemv_f32(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_F32, dst, w, x, r2, r3);
}
extern "C" __global__ void k_gemv_f16(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_F16, dst, w, x, r2, r3);
}
extern "C" __global__ void k_gemv_bf16(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_BF16, dst, w, x, r2, r3);
}
extern "C" __global__ void k_gemv_q8_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_Q8_0, dst, w, x, r2, r3);
}
extern "C" __global__ void k_gemv_q4_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_Q4_0, dst, w, x, r2, r3);
}
extern "C" __global__ void k_gemv_q4_k(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_Q4_K, dst, w, x, r2, r3);
}
extern "C" __global__ void k_gemv_q6_k(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3) {
    gv_kernel(T_Q6_K, dst, w, x, r2, r3);
}

// ----- GEMV on 8-bit activations, rounded once per product -----
//
// k_quantize_x8 rounds every activation row (f32, contiguous along k, k a multiple of 32) into
// scratch, each 32-element block as ggml's quantize_row_q8_0 rounds it (gv_quantize_x): the
// levels at xq + row * k, the block's scale (its f16 value, as f32) at xd[row * k / 32 + block].
// Rows are x's rows in order (column fastest, then the planes). Thread e takes elements
// 8 e .. 8 e + 7 of the flattened rows; `groups` = rows * k / 8.
extern "C" __global__ void k_quantize_x8(Tensor x, char* xq, float* xd, i64 groups) {
    i64 per_row = x.ne[0] / 8;
    // The bound is uniform over the warp: gv_quantize_x's shuffles need every lane.
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < groups; base += (i64)gridDim.x * blockDim.x) {
        i64 e = base + threadIdx.x;
        bool live = e < groups;
        float xv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        i64 r = live ? e / per_row : 0, p = live ? e % per_row : 0;
        if (live) {
            i64 i[4];
            unravel_row(r, x.ne, i);
            const float* src = (const float*)row_ptr(x, i[1], i[2], i[3]) + 8 * p;
            gv_ld4(src, xv);
            gv_ld4(src + 4, xv + 4);
        }
        int q[2];
        float d = gv_quantize_x(xv, q);
        if (live) {
            int* out = (int*)(xq + 8 * e);
            out[0] = q[0];
            out[1] = q[1];
            if (p % 4 == 0) {
                xd[e / 4] = d;
            }
        }
    }
}

// k_gemv8_*: a block of G8_THREADS threads per `rows` weight rows of one plane, its threads
// taking the rows' chunks in turn (a chunk: 8 Q8_0 weights, 16 of the other types, with the rounded
// activations they multiply), dp4a on the integer levels, scales applied per chunk, then a block
// sum. Every thread of the chip works on the product from its start (llama.cpp's mmvq layout):
// where k_gemv_* gives a row's whole k to one warp, a 2048-row product is 2048 blocks here.
#define G8_THREADS 128
#ifndef G8_UNROLL
#define G8_UNROLL 2
#endif
#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT)
#define G8_UNROLL_CHUNKS _Pragma("unroll G8_UNROLL")
#else
#define G8_UNROLL_CHUNKS
#endif

struct alignas(8) g8_i2 {
    int x, y;
};

// Weights per chunk of type T.
__device__ __forceinline__ int g8_chunk_elems(int T) {
    return T == T_Q8_0 ? 8 : 16;
}

// Chunk c of weight row `row` dotted with the row's rounded activations (levels xq, scales xd),
// in 32-bit offsets within the row (under 2 GiB): k_gemv8_q4_0 is 1048 instructions on sm_90
// with them, 1112 with 64-bit ones.
__device__ __forceinline__ float g8_chunk(int T, const char* row, int c, const char* xq, const float* xd) {
    const int ones = 0x01010101;
    if (T == T_Q8_0) {
        int b = c / 4, p = c % 4;
        const u8* blk = (const u8*)row + b * Q8_0_BYTES;
        const u8* q = blk + 2 + 8 * p;
        g8_i2 xv = *(const g8_i2*)(xq + 32 * b + 8 * p);
        int isum = dot4_s8((int)gv_u32_from_u16(q), xv.x, dot4_s8((int)gv_u32_from_u16(q + 4), xv.y, 0));
        return (float)isum * block_scale((const char*)blk) * xd[b];
    } else if (T == T_Q4_0) {
        int b = c / 2, h = c % 2;
        const u8* blk = (const u8*)row + b * Q4_0_BYTES;
        u32 q0 = gv_u32_from_u16(blk + 2 + 8 * h), q1 = gv_u32_from_u16(blk + 6 + 8 * h);
        g8_i2 lo = *(const g8_i2*)(xq + 32 * b + 8 * h);
        g8_i2 hi = *(const g8_i2*)(xq + 32 * b + 16 + 8 * h);
        int isum = dot4_s8((int)(q0 & 0x0f0f0f0fu), lo.x, dot4_s8((int)(q1 & 0x0f0f0f0fu), lo.y, 0));
        isum = dot4_s8((int)((q0 >> 4) & 0x0f0f0f0fu), hi.x, dot4_s8((int)((q1 >> 4) & 0x0f0f0f0fu), hi.y, isum));
        // Levels are nibble - 8: subtract 8 times the activations' sum.
        int xsum = dot4_s8(ones, lo.x, dot4_s8(ones, lo.y, dot4_s8(ones, hi.x, dot4_s8(ones, hi.y, 0))));
        return (float)(isum - 8 * xsum) * block_scale((const char*)blk) * xd[b];
    } else if (T == T_Q4_K) {
        // Sub-block pair i, part p: qs bytes 32 i + 8 p .. + 7, whose low nibbles are elements
        // 64 i + 8 p .. (sub-block 2 i) and high nibbles 64 i + 32 + 8 p .. (sub-block 2 i + 1).
        int sb = c / 16, i = (c % 16) / 4, p = c % 4;
        const u8* blk = (const u8*)row + sb * Q4_K_BYTES;
        const u32* qp = (const u32*)(blk + 16 + 32 * i + 8 * p);
        u32 q0 = qp[0], q1 = qp[1];
        const char* xb = xq + 256 * sb + 64 * i + 8 * p;
        g8_i2 lo = *(const g8_i2*)xb;
        g8_i2 hi = *(const g8_i2*)(xb + 32);
        int dot0 = dot4_s8((int)(q0 & 0x0f0f0f0fu), lo.x, dot4_s8((int)(q1 & 0x0f0f0f0fu), lo.y, 0));
        int dot1 = dot4_s8((int)((q0 >> 4) & 0x0f0f0f0fu), hi.x, dot4_s8((int)((q1 >> 4) & 0x0f0f0f0fu), hi.y, 0));
        int s0 = dot4_s8(ones, lo.x, dot4_s8(ones, lo.y, 0));
        int s1 = dot4_s8(ones, hi.x, dot4_s8(ones, hi.y, 0));
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * i, blk + 4, &sc0, &m0);
        scale_min_k4(2 * i + 1, blk + 4, &sc1, &m1);
        float dx0 = xd[8 * sb + 2 * i], dx1 = xd[8 * sb + 2 * i + 1];
        float d = block_scale((const char*)blk), dmin = block_scale((const char*)blk + 2);
        return d * (dx0 * (float)(sc0 * dot0) + dx1 * (float)(sc1 * dot1)) -
               dmin * (dx0 * (float)(m0 * s0) + dx1 * (float)(m1 * s1));
    } else {
        // Q6_K: half n, l = 4 p .. 4 p + 3: ql bytes l (t = 0 low nibbles, t = 2 high) and
        // 32 + l (t = 1, 3), qh byte l's bit pairs; element 128 n + 32 t + l, scale 16ths
        // l / 16 + 2 t of the half.
        int sb = c / 16, n = (c % 16) / 8, p = c % 8;
        const u8* blk = (const u8*)row + sb * Q6_K_BYTES;
        u32 a = gv_u32_from_u16(blk + 64 * n + 4 * p);
        u32 b = gv_u32_from_u16(blk + 64 * n + 32 + 4 * p);
        u32 hb = gv_u32_from_u16(blk + 128 + 32 * n + 4 * p);
        const signed char* sc = (const signed char*)(blk + 192 + 8 * n + p / 4);
        u32 q[4] = {(a & 0x0f0f0f0fu) | ((hb << 4) & 0x30303030u), (b & 0x0f0f0f0fu) | ((hb << 2) & 0x30303030u),
                    ((a >> 4) & 0x0f0f0f0fu) | (hb & 0x30303030u),
                    ((b >> 4) & 0x0f0f0f0fu) | ((hb >> 2) & 0x30303030u)};
        const char* xb = xq + 256 * sb + 128 * n + 4 * p;
        const float* db = xd + 8 * sb + 4 * n;
        float acc = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            int xv = *(const int*)(xb + 32 * t);
            // Levels are q - 32.
            int dot = dot4_s8((int)q[t], xv, 0) - 32 * dot4_s8(ones, xv, 0);
            acc += db[t] * (float)((int)sc[2 * t] * dot);
        }
        return acc * block_scale((const char*)blk + 208);
    }
}

// `rows` (1 .. G8_MAX_ROWS) weight rows per block share each chunk's activations.
#define G8_MAX_ROWS 4
__device__ __forceinline__ void g8_kernel(int T, const Tensor& dst, const Tensor& w, const Tensor& x, const char* xq,
                                          const float* xd, i64 r2, i64 r3, int rows) {
    TSHARED(float, part, [G8_MAX_ROWS][G8_THREADS / 32]);
    int tid = threadIdx.x;
    i64 m = w.ne[1], kdim = w.ne[0];
    i64 rblocks = (m + rows - 1) / rows;
    i64 row0 = (blockIdx.x % rblocks) * rows;
    i64 i2, i3, w2, w3;
    plane_of(blockIdx.x / rblocks, dst, r2, r3, &i2, &i3, &w2, &w3);
    // x's row of this plane (one column): the order k_quantize_x8 wrote them in.
    i64 xr = i2 + x.ne[2] * i3;
    const char* xqr = xq + xr * kdim;
    const float* xdr = xd + xr * (kdim / 32);
    const char* wr[G8_MAX_ROWS];
    float acc[G8_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < G8_MAX_ROWS; r++) {
        // Rows past the end read the last row and store nothing.
        wr[r] = row_ptr(w, row0 + r < m ? row0 + r : m - 1, w2, w3);
        acc[r] = 0.0f;
    }
    int chunks = (int)(kdim / g8_chunk_elems(T));
    G8_UNROLL_CHUNKS
    for (int c = tid; c < chunks; c += G8_THREADS) {
#pragma unroll
        for (int r = 0; r < G8_MAX_ROWS; r++) {
            if (r < rows) {
                acc[r] += g8_chunk(T, wr[r], c, xqr, xdr);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < G8_MAX_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (tid % 32 == 0) {
            part[r][tid / 32] = v;
        }
    }
    __syncthreads();
    if (tid < rows && row0 + tid < m) {
        float s = 0.0f;
        for (int i = 0; i < G8_THREADS / 32; i++) {
            s += part[tid][i];
        }
        st(dst, row0 + tid, 0, i2, i3, s);
    }
}

extern "C" __global__ void k_gemv8_q8_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                        const float* xd, int rows) {
    g8_kernel(T_Q8_0, dst, w, x, xq, xd, r2, r3, rows);
}
extern "C" __global__ void k_gemv8_q4_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                        const float* xd, int rows) {
    g8_kernel(T_Q4_0, dst, w, x, xq, xd, r2, r3, rows);
}
extern "C" __global__ void k_gemv8_q4_k(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                        const float* xd, int rows) {
    g8_kernel(T_Q4_K, dst, w, x, xq, xd, r2, r3, rows);
}
extern "C" __global__ void k_gemv8_q6_k(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                        const float* xd, int rows) {
    g8_kernel(T_Q6_K, dst, w, x, xq, xd, r2, r3, rows);
}

// ----- GEMM on integer tensor-core tiles for quantized weights (more than 8 columns) -----
//
// k_mmq_* multiplies Q8_0, Q4_0, Q5_0, Q4_K and Q6_K weights with the activations k_quantize_x8
// rounded into scratch (as k_gemv8_* takes them: levels xq, one scale per 32 in xd), on mma_i8
// tiles (mma.cuh): a block of MQ_THREADS threads (4 warps) owns MQ_M weight rows by MQ_N columns
// of one plane. Per stage of MQ_K elements the block stages the weights' int8 levels (Q4_0 as
// nibble - 8, Q5_0 as its 5-bit level - 16, Q4_K's unsigned nibbles, Q6_K's 6-bit level - 32)
// with their scales (one per 32; Q4_K: d·scale and dmin·min of the sub-block; Q6_K: one per 16)
// and the columns' levels and scales in shared memory; warp w then multiplies rows 16 w ..
// 16 w + 15 by every 8-column tile, one mma_i8 per 32-element block (Q6_K: one per half), and
// applies the scales to the integer products in f32 (Q4_K also subtracts dmin·min times the
// block's activation sum). grid = (ceil(m / MQ_M), ceil(n / MQ_N), planes).
#define MQ_M 64
#define MQ_N 64
#define MQ_K 256
#define MQ_THREADS 128
// Staged rows are MQ_K + 16 bytes apart: the eight rows (g) and four k offsets (t) of one
// fragment load then fall in 32 different banks.
#define MQ_ROW_INTS ((MQ_K + 16) / 4)
#define MQ_BLOCKS (MQ_K / 32)

// Bits 0..3 of v as bit 4 of bytes 0..3.
__device__ __forceinline__ u32 mq_bits_to_bytes(u32 v) {
    return ((v & 1u) << 4) | ((v & 2u) << 11) | ((v & 4u) << 18) | ((v & 8u) << 25);
}

// Stage this block's weights for k0 .. k0 + MQ_K (nblk blocks of 32 in range, the rest zero):
// levels as int8 in wq, scales in wd, Q4_K's mins in wm.
__device__ __forceinline__ void mq_stage_w(int T, const Tensor& w, i64 m0, i64 w2, i64 w3, i64 k0, int nblk,
                                           int (*wq)[MQ_ROW_INTS], float (*wd)[MQ_BLOCKS],
                                           float (*wm)[MQ_BLOCKS]) {
    i64 m = w.ne[1];
    for (int i = threadIdx.x; i < MQ_M * MQ_BLOCKS; i += MQ_THREADS) {
        int r = i / MQ_BLOCKS, b = i % MQ_BLOCKS;
        int* q = wq[r] + 8 * b;
        // Rows past the end read the last row and are never stored.
        const u8* row = (const u8*)row_ptr(w, m0 + r < m ? m0 + r : m - 1, w2, w3);
        if (b >= nblk) {
            for (int j = 0; j < 8; j++) {
                q[j] = 0;
            }
            wd[r][b] = 0.0f;
            wm[r][b] = 0.0f;
        } else if (T == T_Q8_0) {
            const u8* blk = row + (k0 / 32 + b) * Q8_0_BYTES;
            for (int j = 0; j < 8; j++) {
                q[j] = (int)gv_u32_from_u16(blk + 2 + 4 * j);
            }
            wd[r][b] = block_scale((const char*)blk);
        } else if (T == T_Q4_0) {
            // Byte j's low nibble is element j, its high nibble element 16 + j; each becomes the
            // signed level nibble - 8 ((n + 0x78) ^ 0x80 per byte, which never carries).
            const u8* blk = row + (k0 / 32 + b) * Q4_0_BYTES;
            for (int j = 0; j < 4; j++) {
                u32 v = gv_u32_from_u16(blk + 2 + 4 * j);
                q[j] = (int)(((v & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u);
                q[4 + j] = (int)((((v >> 4) & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u);
            }
            wd[r][b] = block_scale((const char*)blk);
        } else if (T == T_Q5_0) {
            // As Q4_0 with a fifth bit per element from qh (bit j: element j): levels
            // (nibble | bit << 4) - 16, as (q + 0x70) ^ 0x80 per byte.
            const u8* blk = row + (k0 / 32 + b) * Q5_0_BYTES;
            u32 qh = gv_u32_from_u16(blk + 2);
            for (int j = 0; j < 4; j++) {
                u32 v = gv_u32_from_u16(blk + 6 + 4 * j);
                u32 lo = (v & 0x0f0f0f0fu) | mq_bits_to_bytes(qh >> (4 * j));
                u32 hi = ((v >> 4) & 0x0f0f0f0fu) | mq_bits_to_bytes(qh >> (16 + 4 * j));
                q[j] = (int)((lo + 0x70707070u) ^ 0x80808080u);
                q[4 + j] = (int)((hi + 0x70707070u) ^ 0x80808080u);
            }
            wd[r][b] = block_scale((const char*)blk);
        } else if (T == T_Q6_K) {
            // Sub-block b = 4 h + t of the super-block at k0: ql[64 h + 32 (t & 1) ..] (low
            // nibbles for t < 2, else high), two bits of qh[32 h ..] at 2 t; levels q - 32, as
            // (q + 0x60) ^ 0x80 per byte. Its two 16-element halves have their own scales: wd
            // holds the first's, wm the second's.
            const u8* blk = row + (k0 / QK_K) * Q6_K_BYTES;
            int h = b / 4, t = b % 4;
            const u8* ql = blk + 64 * h + 32 * (t & 1);
            const u8* qh = blk + 128 + 32 * h;
            for (int j = 0; j < 8; j++) {
                u32 lo = (gv_u32_from_u16(ql + 4 * j) >> (4 * (t >> 1))) & 0x0f0f0f0fu;
                u32 hi = ((gv_u32_from_u16(qh + 4 * j) >> (2 * t)) & 0x03030303u) << 4;
                q[j] = (int)(((lo | hi) + 0x60606060u) ^ 0x80808080u);
            }
            const signed char* sc = (const signed char*)(blk + 192 + 8 * h + 2 * t);
            float d = block_scale((const char*)blk + 208);
            wd[r][b] = d * (float)sc[0];
            wm[r][b] = d * (float)sc[1];
        } else {
            // Q4_K: sub-block b of the super-block at k0 takes the low (b even) or high nibbles of
            // qs[32 (b / 2) ..].
            const u8* blk = row + (k0 / QK_K) * Q4_K_BYTES;
            const u32* qs = (const u32*)(blk + 16 + 32 * (b / 2));
            int shift = 4 * (b & 1);
            for (int j = 0; j < 8; j++) {
                q[j] = (int)((qs[j] >> shift) & 0x0f0f0f0fu);
            }
            int sc, mn;
            scale_min_k4(b, blk + 4, &sc, &mn);
            wd[r][b] = block_scale((const char*)blk) * (float)sc;
            wm[r][b] = block_scale((const char*)blk + 2) * (float)mn;
        }
    }
}

__device__ __forceinline__ void mq_kernel(int T, const Tensor& dst, const Tensor& w, const Tensor& x, const char* xq,
                                          const float* xd, i64 r2, i64 r3) {
    TSHARED(int, wq, [MQ_M][MQ_ROW_INTS]);
    TSHARED(int, xs, [MQ_N][MQ_ROW_INTS]);
    TSHARED(float, wd, [MQ_M][MQ_BLOCKS]);
    TSHARED(float, wm, [MQ_M][MQ_BLOCKS]);
    TSHARED(float, xds, [MQ_N][MQ_BLOCKS]);
    TSHARED(float, xsum, [MQ_N][MQ_BLOCKS]);
    i64 m = w.ne[1], n = x.ne[1], kdim = w.ne[0];
    i64 m0 = (i64)blockIdx.x * MQ_M, n0 = (i64)blockIdx.y * MQ_N;
    i64 i2, i3, w2, w3;
    plane_of(blockIdx.z, dst, r2, r3, &i2, &i3, &w2, &w3);
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int g = lane / 4, t = lane % 4;
    // Column c's rounded row, in k_quantize_x8's order (column fastest, then the planes).
    i64 xrow0 = x.ne[1] * (i2 + x.ne[2] * i3);
    float acc[MQ_N / 8][4];
    for (int j = 0; j < MQ_N / 8; j++) {
        for (int e = 0; e < 4; e++) {
            acc[j][e] = 0.0f;
        }
    }
    for (i64 k0 = 0; k0 < kdim; k0 += MQ_K) {
        i64 left = (kdim - k0) / 32;
        int nblk = left < MQ_BLOCKS ? (int)left : MQ_BLOCKS;
        mq_stage_w(T, w, m0, w2, w3, k0, nblk, wq, wd, wm);
        // Columns: 16 bytes per thread and step; columns past the end read the last one.
        for (int i = tid; i < MQ_N * (MQ_K / 16); i += MQ_THREADS) {
            int c = i / (MQ_K / 16), p = i % (MQ_K / 16);
            i64 xr = xrow0 + (n0 + c < n ? n0 + c : n - 1);
            gv_u4 v = {0u, 0u, 0u, 0u};
            if (p < 2 * nblk) {
                v = *(const gv_u4*)(xq + xr * kdim + k0 + 16 * p);
            }
            int* o = xs[c] + 4 * p;
            o[0] = (int)v.x;
            o[1] = (int)v.y;
            o[2] = (int)v.z;
            o[3] = (int)v.w;
        }
        for (int i = tid; i < MQ_N * MQ_BLOCKS; i += MQ_THREADS) {
            int c = i / MQ_BLOCKS, b = i % MQ_BLOCKS;
            i64 xr = xrow0 + (n0 + c < n ? n0 + c : n - 1);
            xds[c][b] = b < nblk ? xd[xr * (kdim / 32) + k0 / 32 + b] : 0.0f;
        }
        __syncthreads();
        if (T == T_Q4_K) {
            // The activation sum of each block, for the weights' mins.
            for (int i = tid; i < MQ_N * MQ_BLOCKS; i += MQ_THREADS) {
                int c = i / MQ_BLOCKS, b = i % MQ_BLOCKS;
                int s = 0;
                for (int j = 0; j < 8; j++) {
                    s = dot4_s8(0x01010101, xs[c][8 * b + j], s);
                }
                xsum[c][b] = xds[c][b] * (float)s;
            }
            __syncthreads();
        }
        int r0 = 16 * warp + g;
        TLOOP_ROLLED
        for (int b = 0; b < nblk; b++) {
            mma_a8 a;
            a.x[0] = wq[r0][8 * b + t];
            a.x[1] = wq[r0 + 8][8 * b + t];
            a.x[2] = wq[r0][8 * b + 4 + t];
            a.x[3] = wq[r0 + 8][8 * b + 4 + t];
            float d0 = wd[r0][b], d1 = wd[r0 + 8][b];
            // Q6_K: the block's halves (k 0..15 in a.x[0], a.x[1]; 16..31 in a.x[2], a.x[3])
            // multiplied apart, each with its own scale.
            mma_a8 ah;
            float h0 = 0.0f, h1 = 0.0f;
            if (T == T_Q6_K) {
                ah.x[0] = 0;
                ah.x[1] = 0;
                ah.x[2] = a.x[2];
                ah.x[3] = a.x[3];
                a.x[2] = 0;
                a.x[3] = 0;
                h0 = wm[r0][b];
                h1 = wm[r0 + 8][b];
            }
            for (int j = 0; j < MQ_N / 8; j++) {
                mma_b8 bf;
                bf.x[0] = xs[8 * j + g][8 * b + t];
                bf.x[1] = xs[8 * j + g][8 * b + 4 + t];
                mma_c32 c = {{0, 0, 0, 0}};
                mma_i8(c, a, bf);
                int c0 = 8 * j + 2 * t;
                float e0 = xds[c0][b], e1 = xds[c0 + 1][b];
                float p[4] = {d0 * (float)c.x[0], d0 * (float)c.x[1], d1 * (float)c.x[2], d1 * (float)c.x[3]};
                if (T == T_Q6_K) {
                    mma_c32 ch = {{0, 0, 0, 0}};
                    mma_i8(ch, ah, bf);
                    p[0] += h0 * (float)ch.x[0];
                    p[1] += h0 * (float)ch.x[1];
                    p[2] += h1 * (float)ch.x[2];
                    p[3] += h1 * (float)ch.x[3];
                }
                acc[j][0] += e0 * p[0];
                acc[j][1] += e1 * p[1];
                acc[j][2] += e0 * p[2];
                acc[j][3] += e1 * p[3];
                if (T == T_Q4_K) {
                    float n0s = xsum[c0][b], n1s = xsum[c0 + 1][b];
                    float mn0 = wm[r0][b], mn1 = wm[r0 + 8][b];
                    acc[j][0] -= mn0 * n0s;
                    acc[j][1] -= mn0 * n1s;
                    acc[j][2] -= mn1 * n0s;
                    acc[j][3] -= mn1 * n1s;
                }
            }
        }
        __syncthreads();
    }
    for (int j = 0; j < MQ_N / 8; j++) {
        for (int e = 0; e < 4; e++) {
            i64 row = m0 + 16 * warp + g + 8 * (e / 2), col = n0 + 8 * j + 2 * t + (e % 2);
            if (row < m && col < n) {
                st(dst, row, col, i2, i3, acc[j][e]);
            }
        }
    }
}

extern "C" __global__ void k_mmq_q8_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                      const float* xd) {
    mq_kernel(T_Q8_0, dst, w, x, xq, xd, r2, r3);
}
extern "C" __global__ void k_mmq_q4_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                      const float* xd) {
    mq_kernel(T_Q4_0, dst, w, x, xq, xd, r2, r3);
}
extern "C" __global__ void k_mmq_q5_0(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                      const float* xd) {
    mq_kernel(T_Q5_0, dst, w, x, xq, xd, r2, r3);
}
extern "C" __global__ void k_mmq_q6_k(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                      const float* xd) {
    mq_kernel(T_Q6_K, dst, w, x, xq, xd, r2, r3);
}
extern "C" __global__ void k_mmq_q4_k(Tensor dst, Tensor w, Tensor x, i64 r2, i64 r3, const char* xq,
                                      const float* xd) {
    mq_kernel(T_Q4_K, dst, w, x, xq, xd, r2, r3);
}
