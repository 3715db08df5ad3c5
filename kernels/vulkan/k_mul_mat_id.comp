// MUL_MAT_ID (port of k_mul_mat_id, kernels/gpu/moe.cu): dst[m, n_used, T] (f32); column (i, t) =
// w[:, :, ids[i, t]]^T · x[:, i % n_b, t] with w [k, m, n_expert] (any type `ld` reads; the
// activations rounded to 8-bit blocks for the types of act_q8), x [k, n_b, T] float, ids i32
// [n_used, T]. One 32-invocation "warp" per (weight row, slot, token), block 128.
// Work blocks are numbered row-block fastest, then slot, then token; the grid strides over them.
// With `local` set (expert parallelism), w holds experts first..first + ne2 only: a pair routed
// elsewhere gets a zero column and only a negative id is an error. Ids outside the experts raise
// ERR_EXPERT with the id.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#define MM_WARP_SUM 1024
#include "matmul_common.glsl"

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args {
    Tensor dst; Tensor w; Tensor x; Tensor ids; uint64_t status; int local; int64_t first;
};

#define MMID_WARPS 4

void main() {
    Args a = Args(pc.args);
    Tensor dst = a.dst, w = a.w, x = a.x, ids = a.ids;
    uint64_t status = a.status;
    bool local = a.local != 0;
    int64_t first = a.first;
    int warp = int(gl_LocalInvocationID.x) / 32, lane = int(gl_LocalInvocationID.x) % 32;
    int64_t m = w.ne[1], kdim = w.ne[0], n_expert = w.ne[2], n_used = dst.ne[1];
    int64_t rblocks = (m + MMID_WARPS - 1) / MMID_WARPS;
    int64_t total = rblocks * n_used * dst.ne[2];
    // CUDA's gridDim.x (the plan's clamp(total, 1, 2^20)), also under a split dispatch.
    int64_t grid = int64_t(ts_num_groups(uint64_t(mm_grid_blocks(total))));
    // The block loop is uniform over the workgroup, so the warp sum's barriers are too.
    for (int64_t blk = int64_t(gl_WorkGroupID.x); blk < total; blk += grid) {
        int64_t row = (blk % rblocks) * MMID_WARPS + warp;
        int64_t rest = blk / rblocks;
        int64_t slot = rest % n_used;
        int64_t tok = rest / n_used;
        // 0: nothing (row past m), 1: a product, 2: a zero column (foreign expert), 3: bad id.
        int what = 0;
        int id = 0;
        float s = 0.0;
        if (row < m) {
            id = ld_i32(ids, slot, tok, 0, 0);
            int64_t e = local ? int64_t(id) - first : int64_t(id);
            if (id < 0 || (!local && e >= n_expert)) {
                what = 3;
            } else if (e < 0 || e >= n_expert) {
                what = 2;
            } else {
                what = 1;
                int64_t col = slot % x.ne[1];
                if (act_q8(w.type)) {
                    // Activations rounded as llama.cpp rounds them for this weight type, so each
                    // lane takes whole 32-element blocks (k is a multiple of 32 for these types).
                    // Rolled: unrolled, every iteration inlines ld's decoders (lavapipe's compiler
                    // then takes minutes).
                    for (int64_t b = lane; b < kdim / 32; b += 32) {
                        float xb[32];
                        float amax = 0.0;
                        [[dont_unroll]] for (int j = 0; j < 32; j++) {
                            xb[j] = ld(x, 32 * b + j, col, tok, 0);
                            amax = max(amax, abs(xb[j]));
                        }
                        vec2 q = q8_round_of(amax);
                        [[dont_unroll]] for (int j = 0; j < 32; j++) {
                            s += ld(w, 32 * b + j, row, e, 0) * q8_rounded(q, xb[j]);
                        }
                    }
                } else {
                    for (int64_t k = lane; k < kdim; k += 32) {
                        s += ld(w, k, row, e, 0) * ld(x, k, col, tok, 0);
                    }
                }
            }
        }
        s = mm_warp_sum(s);
        if (lane == 0) {
            if (what == 3) {
                raise_error(status, ERR_EXPERT, id);
            } else if (what == 2) {
                st(dst, row, slot, tok, 0, 0.0);
            } else if (what == 1) {
                st(dst, row, slot, tok, 0, s);
            }
        }
    }
}
