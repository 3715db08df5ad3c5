// Dequantising MUL_MAT GEMV for quantized weights (port of k_mul_mat_vec_q, kernels/gpu/matmul.cu):
// one 32-invocation "warp" per (row, column, plane), block 128; each lane takes whole 32-element
// groups (blocks, or eighths of a 256-element super-block), so a warp reads 32 consecutive groups
// per step.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define MM_WARP_SUM 1024
#include "matmul_common.glsl"

#include "mul_mat_vec_q.glsl"
