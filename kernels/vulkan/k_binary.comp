#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dst = a (op) b, b broadcast to a's shape (each of b's lengths divides a's). One invocation per
// destination element (grid-stride); inputs are read before the element is written (in-place safe).
#define BIN_ADD 0
#define BIN_SUB 1
#define BIN_MUL 2
#define BIN_DIV 3

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; Tensor b; int op; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    Tensor b = args.b;
    int op = args.op;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, dst.ne, i);
        float x = ld(a, i[0], i[1], i[2], i[3]);
        float y = ld(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]);
        float r;
        switch (op) {
        case BIN_ADD: r = x + y; break;
        case BIN_SUB: r = x - y; break;
        case BIN_MUL: r = x * y; break;
        default: r = x / y; break;
        }
        st(dst, i[0], i[1], i[2], i[3], r);
    }
}
