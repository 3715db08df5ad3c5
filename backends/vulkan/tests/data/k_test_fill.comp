// Test kernel of the Vulkan runtime (not a Tessera op), written to kernels/vulkan/ABI.md:
// k_test_fill(float* dst, long long n, float a, float b) sets dst[i] = a * i + b for the global
// thread index i = (blockIdx.y * 65536 + blockIdx.x) * blockDim.x + threadIdx.x, so a grid of
// (65536, y) blocks checks that dispatches split above maxComputeWorkGroupCount.
#version 460
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) buffer Floats { float v[]; };
layout(buffer_reference, scalar) readonly buffer Args { uint64_t dst; int64_t n; float a; float b; };
layout(push_constant) uniform PC { uint64_t args; } pc;

void main() {
    Args a = Args(pc.args);
    Floats dst = Floats(a.dst);
    uint64_t block = uint64_t(gl_WorkGroupID.x) + uint64_t(gl_WorkGroupID.y) * 65536ul;
    int64_t i = int64_t(block) * int64_t(gl_WorkGroupSize.x) + int64_t(gl_LocalInvocationID.x);
    if (i < a.n) {
        dst.v[uint(i)] = a.a * float(i) + a.b;
    }
}
