// k_norm with shared-memory reductions, for devices without subgroup arithmetic: see norm.glsl.
#version 460
#extension GL_GOOGLE_include_directive : require
#define TS_NO_SUBGROUPS 1
#include "norm.glsl"
