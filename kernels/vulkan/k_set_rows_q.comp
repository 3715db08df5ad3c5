#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "specialize.glsl"
#include "quantize.glsl"

// SET_ROWS into a quantized dst: one invocation per (block of a row, plane), rows in order.
// Specialized on the types, as k_quantize (its block loop is the same).
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor src; Tensor ids; uint64_t status; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = ts_spec(args.dst, 0);
    Tensor src = ts_spec(args.src, 1);
    Tensor ids = ts_spec(args.ids, 2);
    uint64_t status = args.status;
    int64_t n = args.n;
    int64_t per_row = src.ne[0] / QK;
    GRID_STRIDE(e, n) {
        int64_t blk = e % per_row;
        int64_t plane = e / per_row;
        int64_t i2 = plane % src.ne[2];
        int64_t i3 = plane / src.ne[2];
        for (int64_t i1 = 0; i1 < src.ne[1]; i1++) {
            int idx = ld_i32(ids, i1, i2 % ids.ne[1], i3 % ids.ne[2], 0);
            if (idx < 0 || int64_t(idx) >= dst.ne[1]) {
                raise_error(status, ERR_INDEX, idx);
                continue;
            }
            float x[QK];
            for (int j = 0; j < QK; j++) {
                x[j] = ld(src, blk * QK + j, i1, i2, i3);
            }
            quantize_block(x, row_ptr(dst, int64_t(idx), i2, i3) + uint64_t(blk * quant_block_bytes(dst.type)), dst.type);
        }
    }
}
