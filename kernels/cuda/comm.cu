// All-reduce helpers: f32 <-> bf16 wire conversion (round to nearest even) and zero fill.
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
