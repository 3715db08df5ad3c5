// MUL_MAT: dst[m, n, b2, b3] (f32) = w[k, m, w2, w3]^T · x[k, n, b2, b3], weights broadcast over
// the batch axes (plane (i2, i3) of dst uses weight plane (i2 / r2, i3 / r3)).
// Weights: F32, F16, BF16 (any row stride), Q8_0, Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4,
// Q5_0, Q4_K, Q5_K, Q6_K;
// activations: any float type and strides.
#include "common.cuh"

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
        float part = 0.0f;
        if (IS_T(w.type, T_Q8_0)) {
            const char* blk = wr + b * Q8_0_BYTES;
            for (int j = 0; j < QK; j++) {
                part += (float)((signed char)blk[2 + j]) * ld(x, k0 + j, col, i2, i3);
            }
            s += part * block_scale(blk);
        } else if (IS_T(w.type, T_Q4_0)) {
            const char* blk = wr + b * Q4_0_BYTES;
            for (int j = 0; j < QK / 2; j++) {
                u8 q = (u8)blk[2 + j];
                part += (float)((int)(q & 15) - 8) * ld(x, k0 + j, col, i2, i3);
                part += (float)((int)(q >> 4) - 8) * ld(x, k0 + j + QK / 2, col, i2, i3);
            }
            s += part * block_scale(blk);
        } else if (is_lowbit(w.type)) {
            int per = quant_block_elems(w.type) / QK;
            const char* blk = wr + (b / per) * quant_block_bytes(w.type);
            int j0 = (int)(b % per) * QK;
            for (int j = 0; j < QK; j++) {
                part += lowbit_elem(blk, w.type, j0 + j) * ld(x, k0 + j, col, i2, i3);
            }
            s += part;
        } else if (IS_T(w.type, T_Q4_1) || IS_T(w.type, T_Q5_1)) {
            // Affine blocks: d * sum(level * x) + m * sum(x).
            const char* blk = wr + b * quant_block_bytes(w.type);
            float xsum = 0.0f;
            for (int j = 0; j < QK; j++) {
                float xv = ld(x, k0 + j, col, i2, i3);
                part += (float)affine_level(blk, w.type, j) * xv;
                xsum += xv;
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
// per thread, k in steps of 32 (one quant block) staged through shared memory as f32.
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
        for (int t = 0; t < (TM * TK) / 256; t++) {
            int l = tid + 256 * t;
            int kk = l % TK, rr = l / TK;
            i64 row = m0 + rr, k = k0 + kk;
            ws[kk][rr] = (row < m && k < kdim) ? ld(w, k, row, w2, w3) : 0.0f;
        }
        for (int t = 0; t < (TN * TK) / 256; t++) {
            int l = tid + 256 * t;
            int kk = l % TK, cc = l / TK;
            i64 col = n0 + cc, k = k0 + kk;
            xs[kk][cc] = (col < n && k < kdim) ? ld(x, k, col, i2, i3) : 0.0f;
        }
        __syncthreads();
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
