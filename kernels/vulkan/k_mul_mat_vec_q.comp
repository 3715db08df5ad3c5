// Dequantising MUL_MAT GEMV for quantized weights (port of k_mul_mat_vec_q, kernels/cuda/matmul.cu):
// one 32-invocation "warp" per (row, column, plane), block 128; each lane takes whole 32-element
// groups (blocks, or eighths of a 256-element super-block), so a warp reads 32 consecutive groups
// per step.
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
    int64_t m = w.ne[1], n = x.ne[1], nblk = w.ne[0] / QK;
    int64_t rblocks = (m + GEMV_WARPS - 1) / GEMV_WARPS;
    int64_t bid = int64_t(gl_WorkGroupID.x);
    int64_t row = (bid % rblocks) * GEMV_WARPS + warp;
    int64_t rest = bid / rblocks;
    int64_t col = rest % n;
    int64_t plane = rest / n;
    int64_t i2 = plane % dst.ne[2], i3 = plane / dst.ne[2];
    int64_t w2 = i2 / r2, w3 = i3 / r3;
    float s = 0.0;
    if (row < m) {
        uint64_t wr = row_ptr(w, row, w2, w3);
        int wt = w.type;
        for (int64_t b = lane; b < nblk; b += 32) {
            int64_t k0 = b * QK;
            float part = 0.0;
            if (wt == T_Q8_0) {
                uint64_t blk = wr + uint64_t(b * Q8_0_BYTES);
                for (int j = 0; j < QK; j++) {
                    part += float(mm_i8(blk + uint64_t(2 + j))) * ld(x, k0 + j, col, i2, i3);
                }
                s += part * block_scale(blk);
            } else if (wt == T_Q4_0) {
                uint64_t blk = wr + uint64_t(b * Q4_0_BYTES);
                for (int j = 0; j < QK / 2; j++) {
                    uint q = mm_u8(blk + uint64_t(2 + j));
                    part += float(int(q & 15u) - 8) * ld(x, k0 + j, col, i2, i3);
                    part += float(int(q >> 4) - 8) * ld(x, k0 + j + QK / 2, col, i2, i3);
                }
                s += part * block_scale(blk);
            } else if (is_lowbit(wt)) {
                int per = quant_block_elems(wt) / QK;
                uint64_t blk = wr + uint64_t((b / per) * quant_block_bytes(wt));
                int j0 = int(b % per) * QK;
                for (int j = 0; j < QK; j++) {
                    part += lowbit_elem(blk, wt, j0 + j) * ld(x, k0 + j, col, i2, i3);
                }
                s += part;
            } else {
                // Affine blocks: d * sum(level * x) + m * sum(x).
                uint64_t blk = wr + uint64_t(b * quant_block_bytes(wt));
                float xsum = 0.0;
                for (int j = 0; j < QK; j++) {
                    float xv = ld(x, k0 + j, col, i2, i3);
                    part += float(affine_level(blk, wt, j)) * xv;
                    xsum += xv;
                }
                s += part * block_scale(blk) + xsum * block_scale(blk + 2);
            }
        }
    }
    s = mm_warp_sum(s);
    if (row < m && lane == 0) {
        st(dst, row, col, i2, i3, s);
    }
}
