// k_mul_mat_vec_f_nosg: see mul_mat_vec_f.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#define TS_NO_SUBGROUPS 1
#include "mul_mat_vec_f.glsl"
