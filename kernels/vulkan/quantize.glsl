// Block quantizers shared by k_quantize and k_set_rows_q (copy.cu), bit-exact with ggml's
// quantize_row_*_ref: `precise` keeps every product and sum unfused, as the C reference.
#ifndef TESSERA_QUANTIZE_GLSL
#define TESSERA_QUANTIZE_GLSL

// Stores f32 v as the f16 at y (little-endian).
void put_h(uint64_t y, float v) { st_u16(y, f2h(v)); }

// Quantizes 32 values into one Q4_1 / Q5_1 block as ggml's quantize_row_q4_1_ref /
// quantize_row_q5_1_ref: levels above the block minimum, d = (max - min) / (2^bits - 1).
void quantize_affine_block(float x[QK], uint64_t y, int type) {
    float lo = FLT_MAX_C, hi = -FLT_MAX_C;
    for (int j = 0; j < QK; j++) {
        if (x[j] < lo) {
            lo = x[j];
        }
        if (x[j] > hi) {
            hi = x[j];
        }
    }
    bool q5 = type == T_Q5_1;
    precise float d = (hi - lo) / (q5 ? 31.0 : 15.0);
    precise float id = d != 0.0 ? 1.0 / d : 0.0;
    put_h(y, d);
    put_h(y + 2ul, lo);
    uint64_t qs = y + uint64_t(q5 ? 8 : 4);
    uint qh = 0u;
    for (int j = 0; j < QK / 2; j++) {
        // Clamped only so the float-to-int conversion is defined; in-range values are as in C.
        precise float v0 = (x[j] - lo) * id + 0.5;
        precise float v1 = (x[j + QK / 2] - lo) * id + 0.5;
        int q0 = int(fminf_c(fmaxf_c(v0, 0.0), 255.0));
        int q1 = int(fminf_c(fmaxf_c(v1, 0.0), 255.0));
        if (!q5) {
            q0 = min(q0, 15);
            q1 = min(q1, 15);
        }
        st_u8(qs + uint64_t(j), uint((q0 & 15) | ((q1 & 15) << 4)));
        qh |= uint((q0 & 0x10) >> 4) << j;
        qh |= uint((q1 & 0x10) >> 4) << (j + QK / 2);
    }
    if (q5) {
        st_u8(y + 4ul, qh & 0xffu);
        st_u8(y + 5ul, (qh >> 8) & 0xffu);
        st_u8(y + 6ul, (qh >> 16) & 0xffu);
        st_u8(y + 7ul, qh >> 24);
    }
}

// ggml's best_index_int8 over the IQ4_NL levels: the nearest level (ties to the upper one).
int iq4nl_best_index(float x) {
    if (x <= iq4nl_level(0)) {
        return 0;
    }
    if (x >= iq4nl_level(15)) {
        return 15;
    }
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < iq4nl_level(mav)) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    precise float below = x - iq4nl_level(mu - 1);
    precise float above = iq4nl_level(mu) - x;
    return below < above ? mu - 1 : mu;
}

// One IQ4_NL block as ggml's quantize_row_iq4_nl_ref: a scale from the extreme value, indices of
// the nearest levels, then the least-squares scale for those indices (weights x²). An all-zero
// block gets scale 0 and indices 0 (ggml keeps the previous block's: either decodes to zeros).
void quantize_iq4_nl_block(float x[QK], uint64_t y) {
    float amax = 0.0, mx = 0.0;
    for (int j = 0; j < QK; j++) {
        float ax = abs(x[j]);
        if (ax > amax) {
            amax = ax;
            mx = x[j];
        }
    }
    int l[QK];
    precise float d = 0.0;
    if (amax >= 1e-15) {
        precise float d0 = mx / iq4nl_level(0);
        precise float id = 1.0 / d0;
        precise float sumqx = 0.0, sumq2 = 0.0;
        for (int j = 0; j < QK; j++) {
            precise float al = id * x[j];
            int li = iq4nl_best_index(al);
            l[j] = li;
            float q = iq4nl_level(li);
            precise float w = x[j] * x[j];
            precise float wq = w * q;
            precise float tx = wq * x[j];
            precise float tq = wq * q;
            sumqx = sumqx + tx;
            sumq2 = sumq2 + tq;
        }
        d = sumq2 > 0.0 ? sumqx / sumq2 : 0.0;
    } else {
        for (int j = 0; j < QK; j++) {
            l[j] = 0;
        }
    }
    put_h(y, d);
    for (int j = 0; j < QK / 2; j++) {
        st_u8(y + uint64_t(2 + j), uint(l[j] | (l[j + QK / 2] << 4)));
    }
}

// Q4_0 (4 bits, levels -8..7) and Q5_0 (5 bits, -16..15) as ggml's quantize_row_q4_0_ref /
// quantize_row_q5_0_ref: d from the signed extreme value, (int8_t)(x/d + half + 0.5).
void quantize_symmetric_block(float x[QK], uint64_t y, bool q5) {
    float amax = 0.0, mx = 0.0;
    for (int j = 0; j < QK; j++) {
        if (amax < abs(x[j])) {
            amax = abs(x[j]);
            mx = x[j];
        }
    }
    float half_ = q5 ? 16.0 : 8.0;
    precise float d = mx / -half_;
    precise float id = d != 0.0 ? 1.0 / d : 0.0;
    put_h(y, d);
    uint64_t qs = y + uint64_t(q5 ? 6 : 2);
    uint qh = 0u;
    int top = q5 ? 31 : 15;
    for (int j = 0; j < QK / 2; j++) {
        precise float w0 = x[j] * id + (half_ + 0.5);
        precise float w1 = x[j + QK / 2] * id + (half_ + 0.5);
        float v0 = fminf_c(fmaxf_c(w0, -128.0), 127.0);
        float v1 = fminf_c(fmaxf_c(w1, -128.0), 127.0);
        int q0 = min(int(v0), top);
        int q1 = min(int(v1), top);
        st_u8(qs + uint64_t(j), uint((q0 & 15) | ((q1 & 15) << 4)));
        qh |= uint((q0 & 0x10) >> 4) << j;
        qh |= uint((q1 & 0x10) >> 4) << (j + QK / 2);
    }
    if (q5) {
        st_u8(y + 2ul, qh & 0xffu);
        st_u8(y + 3ul, (qh >> 8) & 0xffu);
        st_u8(y + 4ul, (qh >> 16) & 0xffu);
        st_u8(y + 5ul, qh >> 24);
    }
}

// Quantizes 32 values into one block at y as ggml's quantize_row_*_ref (Q4_1 / Q5_1:
// quantize_affine_block; Q4_0 / Q5_0: quantize_symmetric_block; IQ4_NL: quantize_iq4_nl_block).
void quantize_block(float x[QK], uint64_t y, int type) {
    if (type == T_Q4_1 || type == T_Q5_1) {
        quantize_affine_block(x, y, type);
    } else if (type == T_Q4_0 || type == T_Q5_0) {
        quantize_symmetric_block(x, y, type == T_Q5_0);
    } else if (type == T_IQ4_NL) {
        quantize_iq4_nl_block(x, y);
    } else if (type == T_Q8_0) {
        float amax = 0.0;
        for (int j = 0; j < QK; j++) {
            float a = abs(x[j]);
            amax = amax > a ? amax : a;
        }
        precise float d = amax / 127.0;
        precise float id = d != 0.0 ? 1.0 / d : 0.0;
        put_h(y, d);
        for (int j = 0; j < QK; j++) {
            precise float p = x[j] * id;
            float q = roundf_c(p);
            q = fminf_c(fmaxf_c(q, -128.0), 127.0);
            st_u8(y + uint64_t(2 + j), uint(int(q)) & 0xffu);
        }
    }
}

#endif
