// k_mul_mat_vec_f: see mul_mat_vec_f.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "mul_mat_vec_f.glsl"
