// k_mul_mat_vec_q_int8_nosg: see mul_mat_vec_q.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#define GEMV_INT8 1
#define TS_NO_SUBGROUPS 1
#include "mul_mat_vec_q.glsl"
