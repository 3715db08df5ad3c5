// Activation functions shared by k_map, k_glu (as elementwise.cu).
#ifndef TESSERA_ELEMENTWISE_GLSL
#define TESSERA_ELEMENTWISE_GLSL

float silu(float x) {
    return x / (1.0 + exp(-x));
}

// tanhf that stays finite for large |x| (GLSL tanh may overflow through exp).
float tanhf_c(float x) {
    if (abs(x) > 10.0) {
        return sign(x);
    }
    return tanh(x);
}

float gelu(float x) {
    const float sqrt_2_over_pi = 0.7978845608;
    return 0.5 * x * (1.0 + tanhf_c(sqrt_2_over_pi * x * (1.0 + 0.044715 * x * x)));
}

#endif
