// Workgroup sums for kernels that include it after common.glsl: subgroup arithmetic and one
// shared partial per subgroup (two barriers), or, where the including .comp defines
// TS_NO_SUBGROUPS (its `_nosg` variant, loaded on devices without subgroup arithmetic or with
// TESSERA_VULKAN_SUBGROUPS=0), common.glsl's shared-memory block_sum (workgroup a multiple of
// 32). The including file enables GL_KHR_shader_subgroup_arithmetic (before any code) unless
// TS_NO_SUBGROUPS is defined. Every invocation must call ts_block_sum, in uniform control flow;
// each gets the workgroup's sum. Workgroups of at most 256 subgroups.
#ifndef TESSERA_REDUCE_GLSL
#define TESSERA_REDUCE_GLSL

#ifdef TS_NO_SUBGROUPS
float ts_block_sum(float v) {
    return block_sum(v);
}
#else
shared float ts_sg_part[256];

float ts_block_sum(float v) {
    v = subgroupAdd(v);
    barrier(); // readers of the previous call's partials are done
    if (subgroupElect()) {
        ts_sg_part[gl_SubgroupID] = v;
    }
    barrier();
    float s = 0.0;
    for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) {
        s += ts_sg_part[i];
    }
    return subgroupAdd(s);
}
#endif

#endif // TESSERA_REDUCE_GLSL
