#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "specialize.glsl"
#include "quantize.glsl"

// One invocation per block of a quantized dst (same shape as src, rows contiguous).
// Specialized on both types: with the run-time switches, the block loop (ld of every type,
// unrolled 32 times) made one pipeline that lavapipe took about two minutes to compile.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor src; int64_t n_blocks; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = ts_spec(args.dst, 0);
    Tensor src = ts_spec(args.src, 1);
    int64_t n_blocks = args.n_blocks;
    int64_t per_row = dst.ne[0] / QK;
    GRID_STRIDE(e, n_blocks) {
        int64_t r = e / per_row;
        int64_t blk = e % per_row;
        int64_t i[4];
        unravel_row(r, dst.ne, i);
        float x[QK];
        for (int j = 0; j < QK; j++) {
            x[j] = ld(src, blk * QK + j, i[1], i[2], i[3]);
        }
        quantize_block(x, row_ptr(dst, i[1], i[2], i[3]) + uint64_t(blk * quant_block_bytes(dst.type)), dst.type);
    }
}
