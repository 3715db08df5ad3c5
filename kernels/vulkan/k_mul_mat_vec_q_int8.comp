// k_mul_mat_vec_q with llama.cpp's integer dot products (the Vulkan driver loads it under that
// name when the device has shaderIntegerDotProduct, unless TESSERA_VULKAN_INT8=0): for Q8_0,
// Q4_0, Q5_0 and IQ4_NL weights each lane rounds its 32 activations to a Q8_0 block as
// quantize_row_q8_0 does and multiplies packed int8 with dotPacked4x8EXT; other weight types take
// the float path of k_mul_mat_vec_q. Same arguments and launch.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#include "common.glsl"
#define MM_WARP_SUM 1024
#include "matmul_common.glsl"
#define GEMV_INT8 1
// OpSDotKHR on two int32s each holding 4 packed int8 (PackedVectorFormat4x8Bit = 0): what
// GL_EXT_integer_dot_product's dotPacked4x8EXT emits, spelled out because the glslc in use
// (shaderc 2023.2) predates that extension. Capabilities DotProductKHR (6019) and
// DotProductInput4x8BitPackedKHR (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dotPacked4x8EXT(int a, int b, spirv_literal int packed_format);
#include "mul_mat_vec_q.glsl"
