#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// ROPE, normal (adjacent pairs) and NeoX (halves) modes, with ggml's theta schedule and optional
// per-pair frequency factors (has_freqs: pair i turns by theta_i / freqs[i]).
// One invocation per slot of a row: slots below n_dims/2 rotate one pair (read both, then write
// both, so in-place rows are safe); the remaining slots copy two elements of the unrotated tail.
//
// The CUDA kernel computes theta, cos and sin in double. Shaders here do not require
// shaderFloat64 (and GLSL has no double pow/sin/cos), so theta is carried as an unevaluated sum
// of two floats (~48 significant bits: exact Dekker products, all arithmetic `precise`),
// reduced modulo pi/2 in that precision, and cos/sin are evaluated on the reduced float argument
// with Cephes' single-precision polynomials: results within about 1 ulp of (float)cos(theta).
layout(buffer_reference, scalar) readonly buffer Args {
    Tensor dst; Tensor a; Tensor pos; Tensor freqs; int has_freqs; int n_dims; int neox;
    uint64_t theta_scale; uint64_t freq_scale; // f64 bits
    int64_t slots_per_row; int64_t n;
};

// ----- float-float arithmetic (value = x + y, |y| <= ulp(x)/2) -----

vec2 two_sum(float a, float b) {
    precise float s = a + b;
    precise float bb = s - a;
    precise float e = (a - (s - bb)) + (b - bb);
    return vec2(s, e);
}

vec2 quick_two_sum(float a, float b) {
    precise float s = a + b;
    precise float e = b - (s - a);
    return vec2(s, e);
}

vec2 split(float a) {
    precise float c = 4097.0 * a;
    precise float hi = c - (c - a);
    precise float lo = a - hi;
    return vec2(hi, lo);
}

// a * b exactly, as a float-float (Dekker).
vec2 two_prod(float a, float b) {
    precise float p = a * b;
    vec2 as = split(a), bs = split(b);
    precise float e = ((as.x * bs.x - p) + as.x * bs.y + as.y * bs.x) + as.y * bs.y;
    return vec2(p, e);
}

vec2 ff_mul(vec2 a, vec2 b) {
    vec2 p = two_prod(a.x, b.x);
    precise float e = p.y + (a.x * b.y + a.y * b.x);
    return quick_two_sum(p.x, e);
}

vec2 ff_div_f(vec2 a, float b) {
    precise float q1 = a.x / b;
    vec2 p = two_prod(q1, b);
    precise float r = ((a.x - p.x) - p.y) + a.y;
    precise float q2 = r / b;
    return quick_two_sum(q1, q2);
}

// A double, given by its bits, as a float-float (normal doubles in float range; else 0).
vec2 ff_from_f64_bits(uint64_t bits) {
    uint hi32 = uint(bits >> 32), lo32 = uint(bits & 0xffffffffUL);
    int e = int((hi32 >> 20) & 0x7ffu);
    if (e == 0 || e == 0x7ff) {
        return vec2(0.0);
    }
    uint64_t m = (uint64_t(hi32 & 0xfffffu) << 32) | uint64_t(lo32) | (1UL << 52);
    uint top = uint(m >> 29);                 // 24 bits
    uint rest = uint(m & ((1UL << 29) - 1UL)); // 29 bits
    float h = ldexp(float(top), e - 1075 + 29);
    float l = ldexp(float(rest), e - 1075);
    vec2 r = quick_two_sum(h, l);
    return (hi32 >> 31) != 0u ? -r : r;
}

vec2 ff_from_i64(int64_t v) {
    float h = float(v);
    float l = float(v - int64_t(h));
    return vec2(h, l);
}

// Cephes sinf / cosf polynomials on |x| <= pi/4.
float sin_poly(float x) {
    float z = x * x;
    return ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * x + x;
}

float cos_poly(float x) {
    float z = x * x;
    return ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
}

// cos and sin of a float-float angle.
void ff_cos_sin(vec2 t, out float c, out float s) {
    const float PIO2_HI = 1.57079637050628662109375;  // float(pi / 2)
    const float PIO2_LO = -4.371139000186241e-08;     // pi / 2 - PIO2_HI
    float j = roundEven(t.x * 0.636619772367581343);
    vec2 p = two_prod(j, PIO2_HI);
    precise float t2 = j * PIO2_LO;
    precise float y = (((t.x - p.x) - p.y) + t.y) - t2;
    float sy = sin_poly(y), cy = cos_poly(y);
    int q = int(j) & 3;
    if (q == 0) {
        s = sy; c = cy;
    } else if (q == 1) {
        s = cy; c = -sy;
    } else if (q == 2) {
        s = -sy; c = -cy;
    } else {
        s = -cy; c = sy;
    }
}

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    Tensor pos = args.pos;
    Tensor freqs = args.freqs;
    int has_freqs = args.has_freqs;
    int n_dims = args.n_dims;
    int neox = args.neox;
    vec2 theta_scale = ff_from_f64_bits(args.theta_scale);
    vec2 freq_scale = ff_from_f64_bits(args.freq_scale);
    int64_t slots_per_row = args.slots_per_row;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t slot = e % slots_per_row;
        int64_t r[4];
        unravel_row(e / slots_per_row, a.ne, r);
        int64_t half_dims = int64_t(n_dims / 2);
        if (slot < half_dims) {
            int p = ld_i32(pos, r[2], 0, 0, 0);
            // theta = p * freq_scale * theta_scale^slot
            vec2 pw = vec2(1.0, 0.0);
            vec2 base = theta_scale;
            for (int64_t k = slot; k > 0; k >>= 1) {
                if ((k & 1) != 0) {
                    pw = ff_mul(pw, base);
                }
                base = ff_mul(base, base);
            }
            vec2 theta = ff_mul(ff_mul(ff_from_i64(int64_t(p)), freq_scale), pw);
            if (has_freqs != 0) {
                theta = ff_div_f(theta, ld(freqs, slot, 0, 0, 0));
            }
            float c, s;
            ff_cos_sin(theta, c, s);
            int64_t j0 = neox != 0 ? slot : 2 * slot;
            int64_t j1 = neox != 0 ? slot + half_dims : 2 * slot + 1;
            float x0 = ld(a, j0, r[1], r[2], r[3]);
            float x1 = ld(a, j1, r[1], r[2], r[3]);
            st(dst, j0, r[1], r[2], r[3], x0 * c - x1 * s);
            st(dst, j1, r[1], r[2], r[3], x0 * s + x1 * c);
        } else {
            int64_t j = int64_t(n_dims) + 2 * (slot - half_dims);
            for (int64_t t = j; t < j + 2 && t < a.ne[0]; t++) {
                st(dst, t, r[1], r[2], r[3], ld(a, t, r[1], r[2], r[3]));
            }
        }
    }
}
