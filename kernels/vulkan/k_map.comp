#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "specialize.glsl"
#include "elementwise_funcs.glsl"

// dst = f(a) for SCALE (p0 * x + p1), SQR, SQRT, CLAMP (p0..p1) and the unary functions.
// Specialized on the op and the argument types; dense tensors of one shape take the flat index
// (two f32 per access where aligned).

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; int op; float p0; float p1; int64_t n; };

float map_one(int op, float x, float p0, float p1) {
    switch (op) {
    case MAP_SCALE: return x * p0 + p1;
    case MAP_SQR: return x * x;
    case MAP_SQRT: return sqrt(x);
    case MAP_CLAMP: return fminf_c(fmaxf_c(x, p0), p1);
    case MAP_SILU: return silu(x);
    case MAP_GELU: return gelu(x);
    case MAP_GELU_QUICK: return x / (1.0 + exp(-1.702 * x));
    case MAP_RELU: return fmaxf_c(x, 0.0);
    case MAP_TANH: return tanhf_c(x);
    case MAP_NEG: return -x;
    case MAP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    default: return exp(x);
    }
}

void main() {
    Args args = Args(pc.args);
    Tensor dst = ts_spec(args.dst, 0);
    Tensor a = ts_spec(args.a, 1);
    int op = ts_int0(args.op);
    float p0 = args.p0, p1 = args.p1;
    int64_t n = args.n;
    if (ts_f32_pairs(1)) {
        int64_t stride = ts_grid_threads(n);
        for (int64_t p = ts_thread(); p < n / 2; p += stride) {
            vec2 x = ld_f32x2(a.data + uint64_t(p * 8));
            st_f32x2(dst.data + uint64_t(p * 8), vec2(map_one(op, x.x, p0, p1), map_one(op, x.y, p0, p1)));
        }
        if ((n & 1) != 0 && ts_thread() == 0) {
            st_flat(dst, n - 1, map_one(op, ld_flat(a, n - 1), p0, p1));
        }
    } else if (ts_layout(0, TS_DENSE) && ts_layout(1, TS_DENSE | TS_SAME)) {
        GRID_STRIDE(e, n) {
            st_flat(dst, e, map_one(op, ld_flat(a, e), p0, p1));
        }
    } else {
        GRID_STRIDE(e, n) {
            int64_t i[4];
            unravel(e, dst.ne, i);
            st(dst, i[0], i[1], i[2], i[3], map_one(op, ld(a, i[0], i[1], i[2], i[3]), p0, p1));
        }
    }
}
