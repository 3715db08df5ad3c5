// Body of k_mul_mat_vec_q (dequantising GEMV for quantized weights, port of k_mul_mat_vec_q in
// kernels/gpu/matmul.cu), k_mul_mat_vec_q_int8 (GEMV_INT8: Q8_0 / Q4_0 / Q5_0 / IQ4_NL weights
// against activations rounded to Q8_0, integer dot products) and their _nosg variants
// (TS_NO_SUBGROUPS). The including .comp declares #version and GL_GOOGLE_include_directive.
//
// Geometry and sums: gemv.glsl. Each invocation takes whole 32-element groups (blocks, or eighths
// of a 256-element super-block) of k; the activations of a group are read (and, for the int8
// variant, rounded) once for all the workgroup's rows. Specialized on the weight type, so one decoder is compiled.
// The 32-element block formats (Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1) are decoded from 8-byte
// words: where the weight rows are 16-byte aligned an invocation takes a quad of four blocks
// (4 * block bytes is a whole number of words) and reads each block's words, else it reads the
// block's bytes into the same window.
#ifndef TS_NO_SUBGROUPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#extension GL_EXT_control_flow_attributes : require
#ifdef GEMV_INT8
#extension GL_EXT_spirv_intrinsics : require
#endif
#include "common.glsl"
#include "specialize.glsl"
#define TS_BLOCK_SUM4 1
#include "reduce.glsl"
#include "gemv.glsl"

#ifdef GEMV_INT8
// OpSDotKHR on two int32s each holding 4 packed int8 (PackedVectorFormat4x8Bit = 0): what
// GL_EXT_integer_dot_product's dotPacked4x8EXT emits, spelled out because the glslc in use
// (shaderc 2023.2) predates that extension. Capabilities DotProductKHR (6019) and
// DotProductInput4x8BitPackedKHR (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dotPacked4x8EXT(int a, int b, spirv_literal int packed_format);
#endif

// The formats read through a word window.
bool gemv_win_type(int wt) {
    return wt == T_Q8_0 || wt == T_Q4_0 || wt == T_Q5_0 || wt == T_IQ4_NL || wt == T_Q4_1 ||
           wt == T_Q5_1;
}

// A block's bytes in up to five little-endian 8-byte words (at most 34 bytes at offset < 8).
uint win_u8(uint64_t win[5], int i) {
    return uint(win[i >> 3] >> uint(8 * (i & 7))) & 0xffu;
}
// Bytes i .. i + 3 (i constant where unrolled: a shift, or two across a word boundary).
uint win_u32(uint64_t win[5], int i) {
    int w = i >> 3, sh = 8 * (i & 7);
    uint64_t v = win[w] >> uint(sh);
    if (sh > 32) {
        v |= win[w + 1] << uint(64 - sh);
    }
    return uint(v);
}
uint win_u16(uint64_t win[5], int i) {
    return win_u32(win, i) & 0xffffu;
}

// A quad of four nb-byte blocks (4 * nb <= 136 bytes: whole 8-byte words) at `quad` (8-byte
// aligned), each word read once.
#define GEMV_QUAD_WORDS 17
void gemv_quad(uint64_t quad, int nb, out uint64_t words[GEMV_QUAD_WORDS]) {
    [[unroll]] for (int i = 0; i < GEMV_QUAD_WORDS; i++) {
        words[i] = i < nb / 2 ? TsU64(quad + uint64_t(8 * i)).v : 0ul;
    }
}

// The window of block j (0..3) of a quad; returns the offset of the block's first byte in it.
int gemv_win_quad(uint64_t words[GEMV_QUAD_WORDS], int nb, int j, out uint64_t win[5]) {
    int first = (nb * j) / 8, last = (nb * j + nb - 1) / 8;
    [[unroll]] for (int i = 0; i < 5; i++) {
        win[i] = first + i <= last ? words[min(first + i, GEMV_QUAD_WORDS - 1)] : 0ul;
    }
    return (nb * j) % 8;
}

// The nb bytes of the block at blk (any alignment) as a window at offset 0.
void gemv_win_bytes(uint64_t blk, int nb, out uint64_t win[5]) {
    [[unroll]] for (int i = 0; i < 5; i++) {
        win[i] = 0ul;
    }
    [[unroll]] for (int i = 0; i < 40; i++) {
        if (i < nb) {
            win[i >> 3] |= uint64_t(ld_u8(blk + uint64_t(i))) << uint(8 * (i & 7));
        }
    }
}

// Nibble j (0..31) of the 16 bytes at window offset o: low nibbles first, then high nibbles.
int win_nibble(uint64_t win[5], int o, int j) {
    uint b = win_u8(win, o + (j & 15));
    return int(j < 16 ? (b & 15u) : (b >> 4));
}

// The block's share of the row sum against activations xv (xsum: their sum), in the order of
// operations of kernels/gpu/matmul.cu.
float gemv_block(int wt, uint64_t win[5], int s, float xv[QK], float xsum) {
    float d = h2f(win_u16(win, s));
    float part = 0.0;
    if (wt == T_Q8_0) {
        [[unroll]] for (int j = 0; j < QK; j += 4) {
            int q4 = int(win_u32(win, s + 2 + j));
            [[unroll]] for (int t = 0; t < 4; t++) {
                part += float(bitfieldExtract(q4, 8 * t, 8)) * xv[j + t];
            }
        }
        return part * d;
    }
    if (wt == T_Q4_0) {
        [[unroll]] for (int j = 0; j < QK / 2; j++) {
            uint q = win_u8(win, s + 2 + j);
            part += float(int(q & 15u) - 8) * xv[j];
            part += float(int(q >> 4) - 8) * xv[j + QK / 2];
        }
        return part * d;
    }
    if (wt == T_Q5_0 || wt == T_IQ4_NL) {
        // As lowbit_elem: the scaled level of each element.
        uint qh = wt == T_Q5_0 ? win_u32(win, s + 2) : 0u;
        [[unroll]] for (int j = 0; j < QK; j++) {
            float level;
            if (wt == T_Q5_0) {
                level = float((win_nibble(win, s + 6, j) | int(((qh >> j) & 1u) << 4)) - 16);
            } else {
                level = iq4nl_level(win_nibble(win, s + 2, j));
            }
            part += level * d * xv[j];
        }
        return part;
    }
    // Q4_1 / Q5_1: d * sum(level * x) + m * sum(x).
    int o = wt == T_Q5_1 ? 8 : 4;
    uint qh = wt == T_Q5_1 ? win_u32(win, s + 4) : 0u;
    [[unroll]] for (int j = 0; j < QK; j++) {
        int level = win_nibble(win, s + o, j) | int(((qh >> j) & 1u) << 4);
        part += float(level) * xv[j];
    }
    return part * d + xsum * h2f(win_u16(win, s + 2));
}

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

// quantize_row_q8_0 of one block of activations whose largest magnitude is amax (amax / 127, the
// reciprocal, C roundf, an fp16 scale): the levels packed four to an int, and the scale.
float gemv_q8(float xv[QK], float amax, out int qx[QK / 4]) {
    vec2 q = q8_round_of(amax);
    [[unroll]] for (int j = 0; j < QK; j += 4) {
        qx[j / 4] = gemv_pack4(int(roundf_c(xv[j] * q.x)), int(roundf_c(xv[j + 1] * q.x)),
                               int(roundf_c(xv[j + 2] * q.x)), int(roundf_c(xv[j + 3] * q.x)));
    }
    return q.y;
}

// Weight level j (0..31) of a block, as the integer ggml's dot product uses.
int gemv_int8_level(int wt, uint64_t win[5], int s, int j) {
    if (wt == T_Q4_0) {
        return win_nibble(win, s + 2, j) - 8;
    }
    if (wt == T_Q5_0) {
        uint qh = win_u32(win, s + 2);
        return (win_nibble(win, s + 6, j) | int(((qh >> j) & 1u) << 4)) - 16;
    }
    return int(iq4nl_level(win_nibble(win, s + 2, j)));
}

// sum(qw * qx) in int32 times d_w * d_x.
float gemv_block_int8(int wt, uint64_t win[5], int s, int qx[QK / 4], float dx) {
    int sumi = 0;
    [[unroll]] for (int j = 0; j < QK; j += 4) {
        // Q8_0's levels are its bytes, already packed.
        int qw = wt == T_Q8_0 ? int(win_u32(win, s + 2 + j))
                              : gemv_pack4(gemv_int8_level(wt, win, s, j),
                                           gemv_int8_level(wt, win, s, j + 1),
                                           gemv_int8_level(wt, win, s, j + 2),
                                           gemv_int8_level(wt, win, s, j + 3));
        sumi += dotPacked4x8EXT(qw, qx[j / 4], 0);
    }
    return float(sumi) * (h2f(win_u16(win, s)) * dx);
}
#endif

// Activations of one 32-element group: the values (for the act_q8 types of the float path,
// rounded as llama.cpp rounds them) and their sum, and (int8 types of the int8 variant) the
// values rounded to Q8_0.
struct GemvX {
    float v[QK];
    float sum;
#ifdef GEMV_INT8
    int q[QK / 4];
    float d;
#endif
};

GemvX gemv_prep(Gemv g, int wt, int64_t b) {
    GemvX x;
    float amax = 0.0;
    [[unroll]] for (int j = 0; j < QK; j += 2) {
        vec2 v = gemv_x2(g, b * QK + j);
        x.v[j] = v.x;
        x.v[j + 1] = v.y;
        amax = max(amax, max(abs(v.x), abs(v.y)));
    }
    bool round = act_q8(wt);
#ifdef GEMV_INT8
    if (gemv_int8_type(wt)) {
        x.d = gemv_q8(x.v, amax, x.q);
        round = false;
    }
#endif
    // The float path of the act_q8 types multiplies the values rounded as llama.cpp rounds them.
    if (round) {
        vec2 q = q8_round_of(amax);
        [[unroll]] for (int j = 0; j < QK; j++) {
            x.v[j] = q8_rounded(q, x.v[j]);
        }
    }
    x.sum = 0.0;
    [[unroll]] for (int j = 0; j < QK; j++) {
        x.sum += x.v[j];
    }
    return x;
}

// A block's share of its row's sum, from its window at offset s.
float gemv_block_win(int wt, uint64_t win[5], int s, GemvX x) {
#ifdef GEMV_INT8
    if (gemv_int8_type(wt)) {
        return gemv_block_int8(wt, win, s, x.q, x.d);
    }
#endif
    return gemv_block(wt, win, s, x.v, x.sum);
}

// Group b's share of the sum of the row at `wrow`, reading the weights byte by byte.
float gemv_group(int wt, int nb, uint64_t wrow, int64_t b, GemvX x) {
    if (gemv_win_type(wt)) {
        uint64_t win[5];
        gemv_win_bytes(wrow + uint64_t(b * nb), nb, win);
        return gemv_block_win(wt, win, 0, x);
    }
    // Super-block formats and MXFP4: element by element (common.glsl's decoders).
    int per = quant_block_elems(wt) / QK;
    uint64_t blk = wrow + uint64_t((b / per) * nb);
    int j0 = int(b % per) * QK;
    float part = 0.0;
    for (int j = 0; j < QK; j++) {
        part += lowbit_elem(blk, wt, j0 + j) * x.v[j];
    }
    return part;
}

void main() {
    Gemv g = gemv_setup();
    int wt = g.w.type;
    int nb = quant_block_bytes(wt);
    int64_t nblk = g.w.ne[0] / QK;
    int64_t tid = int64_t(gl_LocalInvocationID.x), bs = int64_t(gl_WorkGroupSize.x);
    GEMV_ACC_ZERO(acc)
    uint64_t stride = uint64_t(g.w.nb[1]);
    // Quads of blocks read as words: aligned rows, and (with the plan's 4 rows) at least a block
    // per invocation.
    bool words = gemv_win_type(wt) && ts_layout(1, TS_ALIGN16) &&
                 nblk >= (TS_ROWS == GEMV_ROWS ? bs : 4);
    int64_t nq = words ? nblk / 4 : 0;
    for (int64_t q = tid; q < nq; q += bs) {
        GemvX x[4];
        [[unroll]] for (int j = 0; j < 4; j++) {
            x[j] = gemv_prep(g, wt, 4 * q + j);
        }
        // Each row's words are read a row ahead, so that their cache misses overlap the previous
        // row's arithmetic (rows are far apart: no prefetcher follows them).
        uint64_t quad = g.wr0 + uint64_t(q * 4 * nb);
        uint64_t next[GEMV_QUAD_WORDS];
        gemv_quad(quad, nb, next);
        for (int r = 0; r < g.nrows; r++) {
            uint64_t words[GEMV_QUAD_WORDS] = next;
            if (r + 1 < g.nrows) {
                gemv_quad(quad + stride, nb, next);
            }
            float part = 0.0;
            [[unroll]] for (int j = 0; j < 4; j++) {
                uint64_t win[5];
                int s = gemv_win_quad(words, nb, j, win);
                part += gemv_block_win(wt, win, s, x[j]);
            }
            acc[r] += part;
            quad += stride;
        }
    }
    for (int64_t b = 4 * nq + tid; b < nblk; b += bs) {
        GemvX x = gemv_prep(g, wt, b);
        uint64_t wrow = g.wr0;
        for (int r = 0; r < g.nrows; r++) {
            acc[r] += gemv_group(wt, nb, wrow, b, x);
            wrow += stride;
        }
    }
    GEMV_STORE_ROWS(g, acc)
}
