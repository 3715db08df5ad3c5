// All-reduce helpers: f32 <-> bf16 wire conversion (round to nearest even), adds and rounding.
#include "common.cuh"

extern "C" __global__ void k_f32_to_bf16(u16* dst, const float* src, i64 n) {
    GRID_STRIDE(e, n) {
        dst[e] = f2bf(src[e]);
    }
}

extern "C" __global__ void k_bf16_to_f32(float* dst, const u16* src, i64 n) {
    GRID_STRIDE(e, n) {
        dst[e] = bf2f(src[e]);
    }
}

// dst += src (f32), for reductions that add a peer's copy.
extern "C" __global__ void k_add_f32(float* dst, const float* src, i64 n) {
    GRID_STRIDE(e, n) {
        dst[e] += src[e];
    }
}

// dst += src (bf16 wire values).
extern "C" __global__ void k_add_bf16(float* dst, const u16* src, i64 n) {
    GRID_STRIDE(e, n) {
        dst[e] += bf2f(src[e]);
    }
}

// wire = bf16(x) and x = f32(wire): the sender keeps exactly what the receivers get.
extern "C" __global__ void k_round_to_bf16(u16* wire, float* x, i64 n) {
    GRID_STRIDE(e, n) {
        u16 b = f2bf(x[e]);
        wire[e] = b;
        x[e] = bf2f(b);
    }
}
