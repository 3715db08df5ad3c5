// Activation functions shared by k_map, k_glu (as elementwise.cu).
#ifndef TESSERA_ELEMENTWISE_GLSL
#define TESSERA_ELEMENTWISE_GLSL

float silu(float x) {
    return x / (1.0 + exp(-x));
}

// tanhf as Cephes' single-precision tanhf: a polynomial below 0.625 (GLSL tanh may lose all
// relative accuracy near 0), 1 - 2 / (exp(2|x|) + 1) above (finite for any |x|).
float tanhf_c(float x) {
    float ax = abs(x);
    if (ax >= 0.625) {
        float z = 1.0 - 2.0 / (exp(2.0 * ax) + 1.0);
        return x < 0.0 ? -z : z;
    }
    if (ax < 1e-10) {
        return x; // keeps -0
    }
    float z = x * x;
    return ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
            - 3.33332819422e-1) * z * x + x;
}

float gelu(float x) {
    const float sqrt_2_over_pi = 0.7978845608;
    return 0.5 * x * (1.0 + tanhf_c(sqrt_2_over_pi * x * (1.0 + 0.044715 * x * x)));
}

#endif
