// Tiled MUL_MAT for any weight type (port of k_mul_mat_tiled, kernels/gpu/matmul.cu): a 64 x 64
// output tile per workgroup of 256 invocations, 4 x 4 outputs per invocation, k in steps of 32 (one
// quant block) staged through shared memory as f32. grid = (ceil(m / 64), ceil(n / 64), planes).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "matmul_common.glsl"

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor w; Tensor x; int64_t r2; int64_t r3; };

#define TM 64
#define TN 64
#define TK 32

shared float ws[TK][TM + 1];
shared float xs[TK][TN + 1];

void main() {
    Args a = Args(pc.args);
    Tensor dst = a.dst, w = a.w, x = a.x;
    int64_t r2 = a.r2, r3 = a.r3;
    int64_t m = w.ne[1], n = x.ne[1], kdim = w.ne[0];
    int64_t m0 = int64_t(gl_WorkGroupID.x) * TM, n0 = int64_t(gl_WorkGroupID.y) * TN;
    int64_t plane = int64_t(gl_WorkGroupID.z);
    int64_t i2 = plane % dst.ne[2], i3 = plane / dst.ne[2];
    int64_t w2 = i2 / r2, w3 = i3 / r3;
    int tid = int(gl_LocalInvocationID.x);
    int tr = tid % 16, tc = tid / 16;
    float acc[4][4];
    for (int p = 0; p < 4; p++) {
        for (int q = 0; q < 4; q++) {
            acc[p][q] = 0.0;
        }
    }
    for (int64_t k0 = 0; k0 < kdim; k0 += TK) {
        for (int t = 0; t < (TM * TK) / 256; t++) {
            int l = tid + 256 * t;
            int kk = l % TK, rr = l / TK;
            int64_t row = m0 + rr, k = k0 + kk;
            ws[kk][rr] = (row < m && k < kdim) ? ld(w, k, row, w2, w3) : 0.0;
        }
        for (int t = 0; t < (TN * TK) / 256; t++) {
            int l = tid + 256 * t;
            int kk = l % TK, cc = l / TK;
            int64_t col = n0 + cc, k = k0 + kk;
            xs[kk][cc] = (col < n && k < kdim) ? ld(x, k, col, i2, i3) : 0.0;
        }
        barrier();
        for (int kk = 0; kk < TK; kk++) {
            float av[4], bv[4];
            for (int p = 0; p < 4; p++) {
                av[p] = ws[kk][tr + 16 * p];
                bv[p] = xs[kk][tc + 16 * p];
            }
            for (int p = 0; p < 4; p++) {
                for (int q = 0; q < 4; q++) {
                    acc[p][q] += av[p] * bv[q];
                }
            }
        }
        barrier();
    }
    for (int p = 0; p < 4; p++) {
        for (int q = 0; q < 4; q++) {
            int64_t row = m0 + tr + 16 * p, col = n0 + tc + 16 * q;
            if (row < m && col < n) {
                st(dst, row, col, i2, i3, acc[p][q]);
            }
        }
    }
}
