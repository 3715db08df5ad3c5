// Workgroup sums for kernels that include it after common.glsl: subgroup arithmetic and one
// shared partial per subgroup (two barriers), or, where the including .comp defines
// TS_NO_SUBGROUPS (its `_nosg` variant, loaded on devices without subgroup arithmetic or with
// TESSERA_VULKAN_SUBGROUPS=0), common.glsl's shared-memory block_sum (workgroup a multiple of
// 32). ts_block_sum4 sums four values at
// once where the includer defines TS_BLOCK_SUM4. The including file enables GL_KHR_shader_subgroup_arithmetic (before any code) unless
// TS_NO_SUBGROUPS is defined. Every invocation must call ts_block_sum, in uniform control flow;
// each gets the workgroup's sum. Workgroups of at most 256 subgroups.
#ifndef TESSERA_REDUCE_GLSL
#define TESSERA_REDUCE_GLSL

#ifdef TS_NO_SUBGROUPS
float ts_block_sum(float v) {
    return block_sum(v);
}

#ifdef TS_BLOCK_SUM4
vec4 ts_block_sum4(vec4 v) {
    return vec4(block_sum(v.x), block_sum(v.y), block_sum(v.z), block_sum(v.w));
}
#endif
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

#ifdef TS_BLOCK_SUM4
// Four sums at once (same barriers).
shared vec4 ts_sg_part4[256];

vec4 ts_block_sum4(vec4 v) {
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect()) {
        ts_sg_part4[gl_SubgroupID] = v;
    }
    barrier();
    vec4 s = vec4(0.0);
    for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) {
        s += ts_sg_part4[i];
    }
    return subgroupAdd(s);
}
#endif // TS_BLOCK_SUM4
#endif

#endif // TESSERA_REDUCE_GLSL
