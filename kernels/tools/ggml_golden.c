// Prints the golden values of kernels/src/cpu/kquant_golden.rs from ggml itself: FNV-1a 64 hashes
// of ggml's reference quantizers' output (and of ggml's dequantizers applied to it) for
// deterministic inputs, plus ggml's CPU vec_dot results on those bytes. Q8_1 (the activation form
// of the Q4_1 / Q5_1 dots) has no ggml dequantizer: only its quantized bytes are hashed. The rows
// for Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 are checked by kernels/src/cpu/lowbit_golden.rs.
//
// The input generator is mirrored exactly in the Rust test (xorshift32; every float operation is
// exact or done in the same order). Build against a ggml build (ggml-base is compiled without
// -march, so its reference quantizers use plain SSE2 f32 arithmetic, as Rust does):
//
//   G=/path/to/llama.cpp
//   cc -O2 -ffp-contract=off -I$G/ggml/include -o /tmp/ggml_golden kernels/tools/ggml_golden.c \
//      -L$G/build/bin -lggml-base -lggml-cpu -lggml -Wl,-rpath,$G/build/bin && /tmp/ggml_golden
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

void quantize_row_q5_0_ref(const float * x, void * y, int64_t k);
void quantize_row_q4_1_ref(const float * x, void * y, int64_t k);
void quantize_row_q5_1_ref(const float * x, void * y, int64_t k);
void quantize_row_q8_1_ref(const float * x, void * y, int64_t k);
void quantize_row_q8_0_ref(const float * x, void * y, int64_t k);
void quantize_row_q4_K_ref(const float * x, void * y, int64_t k);
void quantize_row_q5_K_ref(const float * x, void * y, int64_t k);
void quantize_row_q6_K_ref(const float * x, void * y, int64_t k);
void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);
void dequantize_row_q5_0(const void * x, float * y, int64_t k);
void dequantize_row_q4_1(const void * x, float * y, int64_t k);
void dequantize_row_q5_1(const void * x, float * y, int64_t k);
void dequantize_row_q4_K(const void * x, float * y, int64_t k);
void dequantize_row_q5_K(const void * x, float * y, int64_t k);
void dequantize_row_q6_K(const void * x, float * y, int64_t k);
void dequantize_row_q8_K(const void * x, float * y, int64_t k);
void quantize_row_q2_K_ref(const float * x, void * y, int64_t k);
void quantize_row_q3_K_ref(const float * x, void * y, int64_t k);
void quantize_row_iq4_nl_ref(const float * x, void * y, int64_t k);
void quantize_row_iq4_xs_ref(const float * x, void * y, int64_t k);
void quantize_row_mxfp4_ref(const float * x, void * y, int64_t k);
void dequantize_row_q2_K(const void * x, float * y, int64_t k);
void dequantize_row_q3_K(const void * x, float * y, int64_t k);
void dequantize_row_iq4_nl(const void * x, float * y, int64_t k);
void dequantize_row_iq4_xs(const void * x, float * y, int64_t k);
void dequantize_row_mxfp4(const void * x, float * y, int64_t k);

#define N 1024  // four super-blocks per distribution
#define NDIST 8

static uint32_t s;
static uint32_t next(void) { s ^= s << 13; s ^= s >> 17; s ^= s << 5; return s; }
static float unif(void) { return (float)(next() >> 8) * (1.0f / 8388608.0f) - 1.0f; }

// Mirrors `golden_input` in kquant_golden.rs.
static void gen(int dist, float * x) {
    s = 0x9E3779B9u ^ (uint32_t)(dist * 7919 + 1);
    for (int i = 0; i < N; i++) {
        float v = unif();
        switch (dist) {
            case 0: x[i] = v; break;
            case 1: x[i] = v * 3.0f + (i % 37 == 0 ? unif() * 40.0f : 0.0f); break;
            case 2: x[i] = v + 1.5f; break;
            case 3: x[i] = i < 256 ? v * 1e-3f : i < 512 ? 0.0f : i < 768 ? v * 1e-20f : v * 1e-7f; break;
            case 4: x[i] = (next() % 8 == 0) ? v * 2.0f : 0.0f; break;
            case 5: x[i] = (float)((i / 32) % 3 - 1) * 0.5f + (i % 64 == 5 ? v : 0.0f); break;
            case 6: x[i] = -(v + 1.5f); break;
            default: x[i] = v * 1e4f; break;
        }
    }
}

static uint64_t fnv(const void * p, size_t n) {
    const uint8_t * b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*deq_fn)(const void *, float *, int64_t);

int main(void) {
    ggml_cpu_init();
    struct { const char * name; quant_fn q; deq_fn dq; size_t bs; int qk; } t[] = {
        {"q5_0", quantize_row_q5_0_ref, dequantize_row_q5_0, 22, 32},
        {"q4_K", quantize_row_q4_K_ref, dequantize_row_q4_K, 144, 256},
        {"q5_K", quantize_row_q5_K_ref, dequantize_row_q5_K, 176, 256},
        {"q6_K", quantize_row_q6_K_ref, dequantize_row_q6_K, 210, 256},
        {"q8_K", quantize_row_q8_K_ref, dequantize_row_q8_K, 292, 256},
        {"q4_1", quantize_row_q4_1_ref, dequantize_row_q4_1, 20, 32},
        {"q5_1", quantize_row_q5_1_ref, dequantize_row_q5_1, 24, 32},
        // Checked by lowbit_golden.rs.
        {"q2_K", quantize_row_q2_K_ref, dequantize_row_q2_K, 84, 256},
        {"q3_K", quantize_row_q3_K_ref, dequantize_row_q3_K, 110, 256},
        {"iq4_nl", quantize_row_iq4_nl_ref, dequantize_row_iq4_nl, 18, 32},
        {"iq4_xs", quantize_row_iq4_xs_ref, dequantize_row_iq4_xs, 136, 256},
        {"mxfp4", quantize_row_mxfp4_ref, dequantize_row_mxfp4, 17, 32},
    };
    const int ncodec = sizeof t / sizeof t[0];
    static float x[N], y[N];
    static uint8_t q[N / 32 * 36 + N / 256 * 300];
    printf("// (dtype, distribution, hash of the quantized bytes, hash of their dequantized f32)\n");
    for (int d = 0; d < NDIST; d++) {
        gen(d, x);
        for (int k = 0; k < ncodec; k++) {
            size_t nbytes = N / t[k].qk * t[k].bs;
            memset(q, 0, sizeof q);
            t[k].q(x, q, N);
            t[k].dq(q, y, N);
            printf("(\"%s\", %d, 0x%016llx, 0x%016llx),\n", t[k].name, d,
                   (unsigned long long) fnv(q, nbytes), (unsigned long long) fnv(y, sizeof y));
        }
    }
    printf("// (distribution, hash of ggml's Q8_1 bytes)\n");
    for (int d = 0; d < NDIST; d++) {
        gen(d, x);
        memset(q, 0, sizeof q);
        quantize_row_q8_1_ref(x, q, N);
        printf("(%d, 0x%016llx),\n", d, (unsigned long long) fnv(q, N / 32 * 36));
    }
    // vec_dot through ggml's CPU backend: weights from distribution dw, activations from da.
    printf("// (weight dtype, weight distribution, activation distribution, ggml's vec_dot bits)\n");
    enum ggml_type wt[] = {GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                           GGML_TYPE_Q4_1, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                           GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4};
    quant_fn wq[] = {quantize_row_q5_0_ref, quantize_row_q4_K_ref, quantize_row_q5_K_ref, quantize_row_q6_K_ref,
                     quantize_row_q4_1_ref, quantize_row_q5_1_ref, quantize_row_q2_K_ref, quantize_row_q3_K_ref,
                     quantize_row_iq4_xs_ref, quantize_row_iq4_nl_ref, quantize_row_mxfp4_ref};
    const char * wn[] = {"q5_0", "q4_K", "q5_K", "q6_K", "q4_1", "q5_1", "q2_K", "q3_K", "iq4_xs", "iq4_nl",
                         "mxfp4"};
    static uint8_t qa[N / 256 * 292 + N / 32 * 36];
    static float xa[N];
    for (int k = 0; k < (int)(sizeof wt / sizeof wt[0]); k++) {
        for (int dw = 0; dw < 2; dw++) {
            for (int da = 0; da < 3; da++) {
                gen(dw, x);
                gen(da + 1, xa);
                memset(q, 0, sizeof q);
                memset(qa, 0, sizeof qa);
                wq[k](x, q, N);
                if (k == 0 || k >= 9) quantize_row_q8_0_ref(xa, qa, N);
                else if (k == 4 || k == 5) quantize_row_q8_1_ref(xa, qa, N);
                else quantize_row_q8_K_ref(xa, qa, N);
                float r = 0;
                ggml_get_type_traits_cpu(wt[k])->vec_dot(N, &r, 0, q, 0, qa, 0, 1);
                uint32_t bits; memcpy(&bits, &r, 4);
                printf("(\"%s\", %d, %d, 0x%08x), // %g\n", wn[k], dw, da + 1, bits, r);
            }
        }
    }
    return 0;
}
