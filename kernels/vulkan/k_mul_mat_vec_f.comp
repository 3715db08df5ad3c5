// MUL_MAT GEMV for float weights (port of k_mul_mat_vec_f, kernels/gpu/matmul.cu):
// dst[m, n, b2, b3] (f32) = w[k, m, w2, w3]^T · x[k, n, b2, b3], plane (i2, i3) of dst using weight
// plane (i2 / r2, i3 / r3). One 32-invocation "warp" per (weight row, activation column, plane);
// block 128. Blocks are numbered row-block fastest, then column, then plane.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define MM_WARP_SUM 1024
#include "matmul_common.glsl"

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor w; Tensor x; int64_t r2; int64_t r3; };

#define GEMV_WARPS 4

void main() {
    Args a = Args(pc.args);
    Tensor dst = a.dst, w = a.w, x = a.x;
    int64_t r2 = a.r2, r3 = a.r3;
    int warp = int(gl_LocalInvocationID.x) / 32, lane = int(gl_LocalInvocationID.x) % 32;
    int64_t m = w.ne[1], n = x.ne[1], kdim = w.ne[0];
    int64_t rblocks = (m + GEMV_WARPS - 1) / GEMV_WARPS;
    int64_t bid = int64_t(gl_WorkGroupID.x);
    int64_t row = (bid % rblocks) * GEMV_WARPS + warp;
    int64_t rest = bid / rblocks;
    int64_t col = rest % n;
    int64_t plane = rest / n;
    int64_t i2 = plane % dst.ne[2], i3 = plane / dst.ne[2];
    int64_t w2 = i2 / r2, w3 = i3 / r3;
    float s = 0.0;
    // No early return: the warp sum below holds barriers (uniform control flow).
    if (row < m) {
        uint64_t wr = row_ptr(w, row, w2, w3);
        for (int64_t k = lane; k < kdim; k += 32) {
            s += ld_scalar(wr + uint64_t(k * w.nb[0]), w.type) * ld(x, k, col, i2, i3);
        }
    }
    s = mm_warp_sum(s);
    if (row < m && lane == 0) {
        st(dst, row, col, i2, i3, s);
    }
}
