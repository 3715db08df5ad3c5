// k_mul_mat_vec_q: see mul_mat_vec_q.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "mul_mat_vec_q.glsl"
