#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// All-reduce helper: f32 -> bf16 wire values (round to nearest even).
layout(buffer_reference, scalar) readonly buffer Args { uint64_t dst; uint64_t src; int64_t n; };

void main() {
    Args a = Args(pc.args);
    uint64_t dst = a.dst, src = a.src;
    int64_t n = a.n;
    GRID_STRIDE(e, n) {
        st_u16(dst + uint64_t(e) * 2ul, f2bf(ld_f32(src + uint64_t(e) * 4ul)));
    }
}
