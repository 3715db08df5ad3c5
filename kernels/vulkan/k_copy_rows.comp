#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Raw copy of row_bytes bytes for each row of dst from the same row of src (same dtype, same
// shape, rows contiguous): quantized blocks are copied unchanged. One invocation per byte.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor src; int64_t row_bytes; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor src = args.src;
    int64_t row_bytes = args.row_bytes;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t r = e / row_bytes;
        int64_t o = e % row_bytes;
        int64_t i[4];
        unravel_row(r, dst.ne, i);
        st_u8(row_ptr(dst, i[1], i[2], i[3]) + uint64_t(o), ld_u8(row_ptr(src, i[1], i[2], i[3]) + uint64_t(o)));
    }
}
