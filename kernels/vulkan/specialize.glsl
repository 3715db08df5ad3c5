// Specialization constants 1..6 (kernels/vulkan/ABI.md, "Specialization"), for shaders that
// include this after common.glsl: the Vulkan driver sets them from the launch's first four
// `Tensor` arguments and its first `int`, so a pipeline is compiled per argument type, layout and
// op code and the run-time type switches of ld / st, the op switches and the general index paths
// fold away. Unset (a pipeline made without them) they keep every path: -1 types, no layout
// bits, TS_INT_UNSET.
#ifndef TESSERA_SPECIALIZE_GLSL
#define TESSERA_SPECIALIZE_GLSL

layout(constant_id = 1) const int TS_TYPE_0 = -1;
layout(constant_id = 2) const int TS_TYPE_1 = -1;
layout(constant_id = 3) const int TS_TYPE_2 = -1;
layout(constant_id = 4) const int TS_TYPE_3 = -1;
// 4 bits per tensor argument (argument i at bit 4i): TS_ROW, TS_DENSE, TS_SAME, TS_ALIGN16.
layout(constant_id = 5) const int TS_LAYOUT = 0;
// The first `int` argument, or TS_INT_UNSET.
#define TS_INT_UNSET 2147483647
layout(constant_id = 6) const int TS_INT_0 = TS_INT_UNSET;

// The first `int` argument: the specialized value, else `runtime` (the argument as read; equal
// when the launch's value happens to be TS_INT_UNSET).
int ts_int0(int runtime) {
    return TS_INT_0 != TS_INT_UNSET ? TS_INT_0 : runtime;
}

// Rows contiguous (nb[0] is the element size; quantized types always).
#define TS_ROW 1
// The whole tensor packed: element e of the flat index at data + e * element size.
#define TS_DENSE 2
// The same shape as argument 0.
#define TS_SAME 4
// Address and the strides of axes 1..3 multiples of 16 bytes.
#define TS_ALIGN16 8

// Type code of tensor argument `arg`: the specialized one, else `runtime` (the argument's field).
int ts_type(int arg, int runtime) {
    int s = arg == 0 ? TS_TYPE_0 : (arg == 1 ? TS_TYPE_1 : (arg == 2 ? TS_TYPE_2 : TS_TYPE_3));
    return s >= 0 ? s : runtime;
}

// Tensor argument `arg` with its type replaced by the specialized one.
Tensor ts_spec(Tensor t, int arg) {
    t.type = ts_type(arg, t.type);
    return t;
}

// Whether tensor argument `arg` has every layout bit of `bits` (false where unspecialized).
bool ts_layout(int arg, int bits) {
    return ((TS_LAYOUT >> (4 * arg)) & bits) == bits;
}

// Bytes of one element of a plain (not quantized) type.
int ts_elem_bytes(int type) {
    return (type == T_F16 || type == T_BF16) ? 2 : 4;
}

// Element e of a plain dense tensor (flat index), as ld / st.
float ld_flat(Tensor t, int64_t e) {
    return ld_scalar(t.data + uint64_t(e * ts_elem_bytes(t.type)), t.type);
}

void st_flat(Tensor t, int64_t e, float v) {
    st_scalar(t.data + uint64_t(e * ts_elem_bytes(t.type)), t.type, v);
}

// Pairs of f32 through one 8-byte access (8-byte aligned address): half the memory operations
// of two scalar ones, which matters where each lane's access is a separate load (lavapipe).
layout(buffer_reference, scalar, buffer_reference_align = 8) buffer TsU64 { uint64_t v; };

vec2 ld_f32x2(uint64_t p) { return uintBitsToFloat(unpack32(TsU64(p).v)); }
void st_f32x2(uint64_t p, vec2 v) { TsU64(p).v = pack64(floatBitsToUint(v)); }

// Whether dst (argument 0) and the `count` arguments after it are f32, dense, of dst's shape and
// 16-byte aligned (specialized: a constant), so the flat index can take pairs.
bool ts_f32_pairs(int count) {
    bool ok = TS_TYPE_0 == T_F32 && ts_layout(0, TS_DENSE | TS_ALIGN16);
    for (int i = 1; i <= count; i++) {
        ok = ok && ts_type(i, -1) == T_F32 && ts_layout(i, TS_DENSE | TS_SAME | TS_ALIGN16);
    }
    return ok;
}

// b as a 32-bit divisor for a dividend below 2^32 - 1 (a workgroup id or a quotient of one):
// divisors of 2^32 - 1 and above leave such a dividend whole, as b itself would. 64-bit division
// is a library call per lane on CPU devices.
uint ts_u32_divisor(int64_t b) {
    // 0xffffffffu: an unsuffixed 0xffffffff is the int -1 in GLSL, which made the upper bound
    // below the lower one (and every divisor 0xffffffff: plane and column indices all 0).
    return uint(clamp(b, int64_t(1), int64_t(0xffffffffu)));
}

// This invocation's index in the grid (the first element of a grid-stride loop).
int64_t ts_thread() {
    return int64_t(gl_WorkGroupID.x) * int64_t(gl_WorkGroupSize.x) + int64_t(gl_LocalInvocationID.x);
}

#endif // TESSERA_SPECIALIZE_GLSL
