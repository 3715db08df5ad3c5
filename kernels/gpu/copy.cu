// Data movement: CONT/CPY (dtype conversion, quantization), GET_ROWS, SET_ROWS, CONCAT.
#include "common.cuh"

// Element-wise copy of src into dst (equal element counts). Same shapes map coordinates
// directly; different shapes map element by element in flat order. i32 never passes through f32.
// Quantized sources are dequantized here; quantized destinations use k_quantize.
extern "C" __global__ void k_cpy(Tensor dst, Tensor src, int same_shape, i64 n) {
    GRID_STRIDE(e, n) {
        i64 d[4];
        unravel(e, dst.ne, d);
        i64 s[4] = {d[0], d[1], d[2], d[3]};
        if (!same_shape) {
            unravel(e, src.ne, s);
        }
        if (IS_T(dst.type, T_I32)) {
            st_i32(dst, d[0], d[1], d[2], d[3], ld_i32(src, s[0], s[1], s[2], s[3]));
        } else {
            st(dst, d[0], d[1], d[2], d[3], ld(src, s[0], s[1], s[2], s[3]));
        }
    }
}

// Raw copy of `row_bytes` bytes for each row of dst from the same row of src (same dtype, same
// shape, rows contiguous): quantized blocks are copied unchanged.
extern "C" __global__ void k_copy_rows(Tensor dst, Tensor src, i64 row_bytes, i64 n) {
    GRID_STRIDE(e, n) {
        i64 r = e / row_bytes;
        i64 o = e % row_bytes;
        i64 i[4];
        unravel_row(r, dst.ne, i);
        ((char*)row_ptr(dst, i[1], i[2], i[3]))[o] = row_ptr(src, i[1], i[2], i[3])[o];
    }
}

// Stores f32 `v` as the f16 at `y` (little-endian).
__device__ __forceinline__ void put_h(u8* y, float v) {
    u16 h = f2h(v);
    y[0] = (u8)(h & 0xff);
    y[1] = (u8)(h >> 8);
}

// Quantizes 32 values into one Q4_1 / Q5_1 block as ggml's quantize_row_q4_1_ref /
// quantize_row_q5_1_ref: levels above the block minimum, d = (max - min) / (2^bits - 1).
__device__ __forceinline__ void quantize_affine_block(const float* x, u8* y, int type) {
    float lo = 3.402823466e+38f, hi = -3.402823466e+38f;
    for (int j = 0; j < QK; j++) {
        if (x[j] < lo) {
            lo = x[j];
        }
        if (x[j] > hi) {
            hi = x[j];
        }
    }
    bool q5 = IS_T(type, T_Q5_1);
    float d = (hi - lo) / (q5 ? 31.0f : 15.0f);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_h(y, d);
    put_h(y + 2, lo);
    u8* qs = y + (q5 ? 8 : 4);
    u32 qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        // Clamped only so the float-to-int conversion is defined; in-range values are as in C.
        int q0 = (int)fminf(fmaxf((x[j] - lo) * id + 0.5f, 0.0f), 255.0f);
        int q1 = (int)fminf(fmaxf((x[j + QK / 2] - lo) * id + 0.5f, 0.0f), 255.0f);
        if (!q5) {
            q0 = min(q0, 15);
            q1 = min(q1, 15);
        }
        qs[j] = (u8)((q0 & 15) | ((q1 & 15) << 4));
        qh |= (u32)((q0 & 0x10) >> 4) << j;
        qh |= (u32)((q1 & 0x10) >> 4) << (j + QK / 2);
    }
    if (q5) {
        y[4] = (u8)(qh & 0xff);
        y[5] = (u8)((qh >> 8) & 0xff);
        y[6] = (u8)((qh >> 16) & 0xff);
        y[7] = (u8)(qh >> 24);
    }
}

// ggml's best_index_int8 over the IQ4_NL levels: the nearest level (ties to the upper one).
__device__ __forceinline__ int iq4nl_best_index(float x) {
    if (x <= iq4nl_level(0)) return 0;
    if (x >= iq4nl_level(15)) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < iq4nl_level(mav)) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    return x - iq4nl_level(mu - 1) < iq4nl_level(mu) - x ? mu - 1 : mu;
}

// One IQ4_NL block as ggml's quantize_row_iq4_nl_ref: a scale from the extreme value, indices
// of the nearest levels, then the least-squares scale for those indices (weights x²). An
// all-zero block gets scale 0 and indices 0 (ggml keeps the previous block's: either decodes
// to zeros).
__device__ __forceinline__ void quantize_iq4_nl_block(const float* x, u8* y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    u8 l[QK];
    float d = 0.0f;
    if (amax >= 1e-15f) {
        float id = 1.0f / (max / iq4nl_level(0));
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < QK; j++) {
            int li = iq4nl_best_index(id * x[j]);
            l[j] = (u8)li;
            float q = iq4nl_level(li);
            float w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    } else {
        for (int j = 0; j < QK; j++) l[j] = 0;
    }
    u16 dh = f2h(d);
    y[0] = (u8)(dh & 0xff);
    y[1] = (u8)(dh >> 8);
    for (int j = 0; j < QK / 2; j++) {
        y[2 + j] = (u8)(l[j] | (l[j + QK / 2] << 4));
    }
}

// Q4_0 (bits 4, levels -8..7) and Q5_0 (bits 5, -16..15) as ggml's quantize_row_q4_0_ref /
// quantize_row_q5_0_ref: d from the signed extreme value, (int8_t)(x/d + half + 0.5).
__device__ __forceinline__ void quantize_symmetric_block(const float* x, u8* y, bool q5) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float half = q5 ? 16.0f : 8.0f;
    float d = max / -half;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    u16 dh = f2h(d);
    y[0] = (u8)(dh & 0xff);
    y[1] = (u8)(dh >> 8);
    u8* qs = y + (q5 ? 6 : 2);
    u32 qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        float v0 = fminf(fmaxf(x[j] * id + (half + 0.5f), -128.0f), 127.0f);
        float v1 = fminf(fmaxf(x[j + QK / 2] * id + (half + 0.5f), -128.0f), 127.0f);
        int top = q5 ? 31 : 15;
        int q0 = min((int)v0, top);
        int q1 = min((int)v1, top);
        qs[j] = (u8)((q0 & 15) | ((q1 & 15) << 4));
        qh |= (u32)((q0 & 0x10) >> 4) << j;
        qh |= (u32)((q1 & 0x10) >> 4) << (j + QK / 2);
    }
    if (q5) {
        y[2] = (u8)(qh & 0xff);
        y[3] = (u8)((qh >> 8) & 0xff);
        y[4] = (u8)((qh >> 16) & 0xff);
        y[5] = (u8)(qh >> 24);
    }
}

// Quantizes the 32 values read by `get` into one block at `out`, as ggml's quantize_row_*_ref
// (Q4_1 / Q5_1: quantize_affine_block; Q4_0 / Q5_0: quantize_symmetric_block; IQ4_NL:
// quantize_iq4_nl_block).
__device__ __forceinline__ void quantize_block(const float* x, char* out, int type) {
    u8* y = (u8*)out;
    if (IS_T(type, T_Q4_1) || IS_T(type, T_Q5_1)) {
        quantize_affine_block(x, y, type);
    } else if (IS_T(type, T_Q4_0) || IS_T(type, T_Q5_0)) {
        quantize_symmetric_block(x, y, IS_T(type, T_Q5_0));
    } else if (IS_T(type, T_IQ4_NL)) {
        quantize_iq4_nl_block(x, y);
    } else if (IS_T(type, T_Q8_0)) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        u16 dh = f2h(d);
        y[0] = (u8)(dh & 0xff);
        y[1] = (u8)(dh >> 8);
        for (int j = 0; j < QK; j++) {
            float q = roundf(x[j] * id);
            q = fminf(fmaxf(q, -128.0f), 127.0f);
            y[2 + j] = (u8)(signed char)(int)q;
        }
    }
}

// One thread per block of a quantized dst (same shape as src, rows contiguous).
extern "C" __global__ void k_quantize(Tensor dst, Tensor src, i64 n_blocks) {
    i64 per_row = dst.ne[0] / QK;
    GRID_STRIDE(e, n_blocks) {
        i64 r = e / per_row;
        i64 blk = e % per_row;
        i64 i[4];
        unravel_row(r, dst.ne, i);
        float x[QK];
        for (int j = 0; j < QK; j++) {
            x[j] = ld(src, blk * QK + j, i[1], i[2], i[3]);
        }
        quantize_block(x, (char*)row_ptr(dst, i[1], i[2], i[3]) + blk * quant_block_bytes(dst.type), dst.type);
    }
}

// dst[i0, i1, i2, i3] = table[i0, ids[i1, i2, i3], i2, i3]; indices out of range raise ERR_INDEX.
extern "C" __global__ void k_get_rows(Tensor dst, Tensor table, Tensor ids, int* status, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
        unravel(e, dst.ne, i);
        int idx = ld_i32(ids, i[1], i[2], i[3], 0);
        if (idx < 0 || (i64)idx >= table.ne[1]) {
            raise_error(status, ERR_INDEX, idx);
            continue;
        }
        if (IS_T(dst.type, T_I32)) {
            st_i32(dst, i[0], i[1], i[2], i[3], ld_i32(table, i[0], idx, i[2], i[3]));
        } else {
            st(dst, i[0], i[1], i[2], i[3], ld(table, i[0], idx, i[2], i[3]));
        }
    }
}

// src's rows written into dst at row ids[i1, i2 % ids.ne1, i3 % ids.ne2]. One thread per
// (element of a row, plane) walks the rows in order, so duplicate indices end with the last row
// (as on the CPU) without races.
extern "C" __global__ void k_set_rows(Tensor dst, Tensor src, Tensor ids, int* status, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i0 = e % src.ne[0];
        i64 plane = e / src.ne[0];
        i64 i2 = plane % src.ne[2];
        i64 i3 = plane / src.ne[2];
        for (i64 i1 = 0; i1 < src.ne[1]; i1++) {
            int idx = ld_i32(ids, i1, i2 % ids.ne[1], i3 % ids.ne[2], 0);
            if (idx < 0 || (i64)idx >= dst.ne[1]) {
                raise_error(status, ERR_INDEX, idx);
                continue;
            }
            st(dst, i0, idx, i2, i3, ld(src, i0, i1, i2, i3));
        }
    }
}

// SET_ROWS into a quantized dst: one thread per (block of a row, plane), rows in order.
extern "C" __global__ void k_set_rows_q(Tensor dst, Tensor src, Tensor ids, int* status, i64 n) {
    i64 per_row = src.ne[0] / QK;
    GRID_STRIDE(e, n) {
        i64 blk = e % per_row;
        i64 plane = e / per_row;
        i64 i2 = plane % src.ne[2];
        i64 i3 = plane / src.ne[2];
        for (i64 i1 = 0; i1 < src.ne[1]; i1++) {
            int idx = ld_i32(ids, i1, i2 % ids.ne[1], i3 % ids.ne[2], 0);
            if (idx < 0 || (i64)idx >= dst.ne[1]) {
                raise_error(status, ERR_INDEX, idx);
                continue;
            }
            float x[QK];
            for (int j = 0; j < QK; j++) {
                x[j] = ld(src, blk * QK + j, i1, i2, i3);
            }
            quantize_block(x, (char*)row_ptr(dst, idx, i2, i3) + blk * quant_block_bytes(dst.type), dst.type);
        }
    }
}

// dst = a and b joined along `dim`.
extern "C" __global__ void k_concat(Tensor dst, Tensor a, Tensor b, int dim, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
        unravel(e, dst.ne, i);
        i64 j[4] = {i[0], i[1], i[2], i[3]};
        const Tensor* s = &a;
        if (i[dim] >= a.ne[dim]) {
            j[dim] -= a.ne[dim];
            s = &b;
        }
        if (IS_T(dst.type, T_I32)) {
            st_i32(dst, i[0], i[1], i[2], i[3], ld_i32(*s, j[0], j[1], j[2], j[3]));
        } else {
            st(dst, i[0], i[1], i[2], i[3], ld(*s, j[0], j[1], j[2], j[3]));
        }
    }
}
