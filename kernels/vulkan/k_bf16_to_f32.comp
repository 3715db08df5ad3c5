#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// All-reduce helper: bf16 wire values -> f32.
layout(buffer_reference, scalar) readonly buffer Args { uint64_t dst; uint64_t src; int64_t n; };

void main() {
    Args a = Args(pc.args);
    uint64_t dst = a.dst, src = a.src;
    int64_t n = a.n;
    GRID_STRIDE(e, n) {
        st_f32(dst + uint64_t(e) * 4ul, bf2f(ld_u16(src + uint64_t(e) * 2ul)));
    }
}
