// Element-wise ops: broadcast binaries, unary maps, gated linear units.
// One thread per destination element (grid-stride); any float type and any strides. Each thread
// reads its inputs before writing its own element, so in-place use (dst aliasing a) is safe.
#include "common.cuh"

// dst = a (op) b, b broadcast to a's shape (each of b's lengths divides a's).
extern "C" __global__ void k_binary(Tensor dst, Tensor a, Tensor b, int op, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
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

__device__ __forceinline__ float silu(float x) {
    return x / (1.0f + expf(-x));
}

__device__ __forceinline__ float gelu(float x) {
    const float sqrt_2_over_pi = 0.7978845608f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float map_one(int op, float x, float p0, float p1) {
    switch (op) {
    case MAP_SCALE: return x * p0 + p1;
    case MAP_SQR: return x * x;
    case MAP_SQRT: return sqrtf(x);
    case MAP_CLAMP: return fminf(fmaxf(x, p0), p1);
    case MAP_SILU: return silu(x);
    case MAP_GELU: return gelu(x);
    case MAP_GELU_QUICK: return x / (1.0f + expf(-1.702f * x));
    case MAP_RELU: return fmaxf(x, 0.0f);
    case MAP_TANH: return tanhf(x);
    case MAP_NEG: return -x;
    case MAP_SIGMOID: return 1.0f / (1.0f + expf(-x));
    default: return expf(x);
    }
}

// dst = f(a) for SCALE (p0 · x + p1), SQR, SQRT, CLAMP (p0..p1) and the unary functions.
extern "C" __global__ void k_map(Tensor dst, Tensor a, int op, float p0, float p1, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
        unravel(e, dst.ne, i);
        st(dst, i[0], i[1], i[2], i[3], map_one(op, ld(a, i[0], i[1], i[2], i[3]), p0, p1));
    }
}

// dst = act(gate) · up. With has_b, gate is a and up is b (same shape as dst); otherwise gate and
// up are the two halves of a's rows (swapped: the up half comes first).
extern "C" __global__ void k_glu(Tensor dst, Tensor a, Tensor b, int has_b, int act, int swapped, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
        unravel(e, dst.ne, i);
        float g, u;
        if (has_b) {
            g = ld(a, i[0], i[1], i[2], i[3]);
            u = ld(b, i[0], i[1], i[2], i[3]);
        } else {
            i64 nc = dst.ne[0];
            float lo = ld(a, i[0], i[1], i[2], i[3]);
            float hi = ld(a, i[0] + nc, i[1], i[2], i[3]);
            g = swapped ? hi : lo;
            u = swapped ? lo : hi;
        }
        float r = (act == GLU_SWIGLU ? silu(g) : gelu(g)) * u;
        st(dst, i[0], i[1], i[2], i[3], r);
    }
}

// SWIGLU_OAI (gpt-oss): dst = g·σ(alpha·g)·(u + 1), g = min(gate a, limit), u = up b clamped to
// ±limit; a, b and dst of one shape.
extern "C" __global__ void k_swiglu_oai(Tensor dst, Tensor a, Tensor b, float alpha, float limit, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
        unravel(e, dst.ne, i);
        float g = fminf(ld(a, i[0], i[1], i[2], i[3]), limit);
        float u = fminf(fmaxf(ld(b, i[0], i[1], i[2], i[3]), -limit), limit);
        st(dst, i[0], i[1], i[2], i[3], g / (1.0f + expf(-alpha * g)) * (u + 1.0f));
    }
}
