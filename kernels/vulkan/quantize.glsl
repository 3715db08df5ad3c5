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

// Quantizes 32 values into one block at y, bit-exactly as ggml's quantize_row_q8_0_ref /
// quantize_row_q4_0_ref (Q4_1 / Q5_1: quantize_affine_block).
void quantize_block(float x[QK], uint64_t y, int type) {
    if (type == T_Q4_1 || type == T_Q5_1) {
        quantize_affine_block(x, y, type);
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
    } else {
        float amax = 0.0, mx = 0.0;
        for (int j = 0; j < QK; j++) {
            if (amax < abs(x[j])) {
                amax = abs(x[j]);
                mx = x[j];
            }
        }
        precise float d = mx / -8.0;
        precise float id = d != 0.0 ? 1.0 / d : 0.0;
        put_h(y, d);
        for (int j = 0; j < QK / 2; j++) {
            precise float w0 = x[j] * id + 8.5;
            precise float w1 = x[j + QK / 2] * id + 8.5;
            float v0 = fminf_c(fmaxf_c(w0, -128.0), 127.0);
            float v1 = fminf_c(fmaxf_c(w1, -128.0), 127.0);
            int q0 = min(int(v0), 15);
            int q1 = min(int(v1), 15);
            st_u8(y + uint64_t(2 + j), uint((q0 & 15) | ((q1 & 15) << 4)));
        }
    }
}

#endif
