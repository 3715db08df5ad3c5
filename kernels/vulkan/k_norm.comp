// RMS_NORM / NORM (port of k_norm, kernels/gpu/norm.cu): see norm.glsl.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "norm.glsl"
