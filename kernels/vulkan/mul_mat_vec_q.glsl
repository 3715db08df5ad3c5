// Body of k_mul_mat_vec_q and k_mul_mat_vec_q_int8 (GEMV_INT8: Q8_0 / Q4_0 / Q5_0 / IQ4_NL
// weights against activations rounded to Q8_0, GL_EXT_integer_dot_product). The including .comp
// declares #version, the extensions and includes common.glsl / matmul_common.glsl first.
layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor w; Tensor x; int64_t r2; int64_t r3; };

#define GEMV_WARPS 4

#ifdef GEMV_INT8
// llama.cpp's CPU rounds the activations of these weight types to Q8_0 blocks and takes integer
// dot products (ggml_vec_dot_*_q8_0); doing the same makes decode match its logits instead of
// being closer to exact than the reference is.
bool gemv_int8_type(int wt) {
    return wt == T_Q8_0 || wt == T_Q4_0 || wt == T_Q5_0 || wt == T_IQ4_NL;
}

int gemv_pack4(int a, int b, int c, int d) {
    return (a & 0xff) | ((b & 0xff) << 8) | ((c & 0xff) << 16) | (d << 24);
}

// Weight level j (0..31) of one 32-element block, as the integer ggml's dot product uses.
int gemv_int8_level(uint64_t blk, int wt, int j) {
    if (wt == T_Q8_0) {
        return mm_i8(blk + uint64_t(2 + j));
    }
    if (wt == T_Q4_0) {
        uint q = mm_u8(blk + uint64_t(2 + (j & 15)));
        return int(j < 16 ? (q & 15u) : (q >> 4)) - 8;
    }
    if (wt == T_Q5_0) {
        uint qh = ld_u32(blk + 2ul);
        uint q = mm_u8(blk + uint64_t(6 + (j & 15)));
        return (int(j < 16 ? (q & 15u) : (q >> 4)) | int(((qh >> j) & 1u) << 4)) - 16;
    }
    return int(iq4nl_level(nibble32(blk + 2ul, j)));
}

// One block's share of the row sum: quantize_row_q8_0 of the activations (amax / 127, the
// reciprocal, C roundf, an fp16 scale), then sum(qw * qx) in int32 times d_w * d_x.
float gemv_int8_block(uint64_t wr, int wt, int64_t b, Tensor x, int64_t k0, int64_t col,
                      int64_t i2, int64_t i3) {
    float xv[QK];
    float amax = 0.0;
    for (int j = 0; j < QK; j++) {
        xv[j] = ld(x, k0 + j, col, i2, i3);
        amax = max(amax, abs(xv[j]));
    }
    precise float d = amax / 127.0;
    precise float id = d != 0.0 ? 1.0 / d : 0.0;
    float dx = h2f(f2h(d));
    uint64_t blk = wr + uint64_t(b * quant_block_bytes(wt));
    int sumi = 0;
    for (int j = 0; j < QK; j += 4) {
        int qx = gemv_pack4(int(roundf_c(xv[j] * id)), int(roundf_c(xv[j + 1] * id)),
                            int(roundf_c(xv[j + 2] * id)), int(roundf_c(xv[j + 3] * id)));
        int qw = gemv_pack4(gemv_int8_level(blk, wt, j), gemv_int8_level(blk, wt, j + 1),
                            gemv_int8_level(blk, wt, j + 2), gemv_int8_level(blk, wt, j + 3));
        sumi += dotPacked4x8EXT(qw, qx, 0);
    }
    return float(sumi) * (block_scale(blk) * dx);
}
#endif

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
#ifdef GEMV_INT8
            if (gemv_int8_type(wt)) {
                s += gemv_int8_block(wr, wt, b, x, k0, col, i2, i3);
            } else
#endif
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
