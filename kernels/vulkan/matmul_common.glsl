// Helpers shared by the matmul / attention / MoE shaders (k_mul_mat_*, k_flash_attn_ext,
// k_mul_mat_id, k_add_id, k_argsort) on top of common.glsl. Names carry an `mm_` prefix so they
// never collide with common.glsl.
#ifndef MATMUL_COMMON_GLSL
#define MATMUL_COMMON_GLSL

// Raw byte access (storageBuffer8BitAccess; no 16-bit storage needed).
layout(buffer_reference, scalar, buffer_reference_align = 1) readonly buffer MmU8 { uint8_t v; };
layout(buffer_reference, scalar, buffer_reference_align = 1) readonly buffer MmI8 { int8_t v; };

uint mm_u8(uint64_t p) { return uint(MmU8(p).v); }
int mm_i8(uint64_t p) { return int(MmI8(p).v); }

// Blocks the plan gives a grid-stride launch over `work_blocks` blocks of work (clamped to
// [1, 2^20]); ts_num_groups() of it is CUDA's gridDim.x even when the runtime splits the
// dispatch (gl_NumWorkGroups then holds one chunk's count).
int64_t mm_grid_blocks(int64_t work_blocks) {
    return clamp(work_blocks, int64_t(1), int64_t(1) << 20);
}

#ifdef MM_WARP_SUM
// CUDA's warp_sum over each group of 32 consecutive invocations, through shared memory (no
// reliance on the subgroup size), with two barriers instead of common.glsl's ten: every lane sums
// the 32 values in lane 0's xor-butterfly order, which (float addition being commutative) is the
// value every lane of the CUDA butterfly ends with, bit for bit. Every invocation of the workgroup must call it (uniform control
// flow: it holds barriers); each gets the sum of its own 32-group. Workgroups up to MM_WARP_SUM
// invocations.
shared float mm_red[MM_WARP_SUM];

float mm_warp_sum(float v) {
    uint tid = gl_LocalInvocationID.x;
    barrier();
    mm_red[tid] = v;
    barrier();
    uint base = tid & ~31u;
    // The butterfly order of the CUDA shuffles: pairwise sums at distance 16, 8, 4, 2, 1.
    float s[16];
    for (uint i = 0u; i < 16u; i++) {
        s[i] = mm_red[base + i] + mm_red[base + i + 16u];
    }
    for (uint i = 0u; i < 8u; i++) {
        s[i] = s[i] + s[i + 8u];
    }
    for (uint i = 0u; i < 4u; i++) {
        s[i] = s[i] + s[i + 4u];
    }
    s[0] = s[0] + s[2];
    s[1] = s[1] + s[3];
    return s[0] + s[1];
}
#endif

#endif
