#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "specialize.glsl"

// dst = a (op) b, b broadcast to a's shape (each of b's lengths divides a's). One invocation per
// destination element (grid-stride); inputs are read before the element is written (in-place safe).
// Specialized on the op and the argument types; where all three are dense and of one shape, the
// flat index addresses them directly (no 64-bit division per element), two f32 per access where
// aligned.

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; Tensor b; int op; int64_t n; };

float binary_op(int op, float x, float y) {
    switch (op) {
    case BIN_ADD: return x + y;
    case BIN_SUB: return x - y;
    case BIN_MUL: return x * y;
    default: return x / y;
    }
}

void main() {
    Args args = Args(pc.args);
    Tensor dst = ts_spec(args.dst, 0);
    Tensor a = ts_spec(args.a, 1);
    Tensor b = ts_spec(args.b, 2);
    int op = ts_int0(args.op);
    int64_t n = args.n;
    if (ts_f32_pairs(2)) {
        // The launch's threads (planned for n) stride over n / 2 pairs; the odd last one alone.
        int64_t stride = ts_grid_threads(n);
        for (int64_t p = ts_thread(); p < n / 2; p += stride) {
            vec2 x = ld_f32x2(a.data + uint64_t(p * 8)), y = ld_f32x2(b.data + uint64_t(p * 8));
            st_f32x2(dst.data + uint64_t(p * 8), vec2(binary_op(op, x.x, y.x), binary_op(op, x.y, y.y)));
        }
        if ((n & 1) != 0 && ts_thread() == 0) {
            st_flat(dst, n - 1, binary_op(op, ld_flat(a, n - 1), ld_flat(b, n - 1)));
        }
    } else if (ts_layout(0, TS_DENSE) && ts_layout(1, TS_DENSE | TS_SAME) && ts_layout(2, TS_DENSE | TS_SAME)) {
        GRID_STRIDE(e, n) {
            st_flat(dst, e, binary_op(op, ld_flat(a, e), ld_flat(b, e)));
        }
    } else {
        GRID_STRIDE(e, n) {
            int64_t i[4];
            unravel(e, dst.ne, i);
            float x = ld(a, i[0], i[1], i[2], i[3]);
            float y = ld(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]);
            st(dst, i[0], i[1], i[2], i[3], binary_op(op, x, y));
        }
    }
}
