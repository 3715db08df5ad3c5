// Tessera SYCL compat header: turns the CUDA C kernels of kernels/gpu into SYCL free-function
// kernels (sycl_ext_oneapi_free_function_kernels), compiled at run time by the runtime's kernel
// compiler (sycl_ext_oneapi_kernel_compiler, source language SYCL).
//
// A CUDA launch of `grid` blocks of `block` threads becomes an nd_range<3> with the CUDA x axis
// as SYCL dimension 2 (the fastest-varying one, so sub-groups are formed along x as warps are),
// y as dimension 1 and z as dimension 0. Kernels run with sub-groups of 32 work-items, so the
// warp-level code (xor shuffles, warp sums) keeps its meaning.
#pragma once
// The headers of what the kernels use, not <sycl/sycl.hpp>: the kernel compiler parses them for
// every unit, and the whole SYCL header was half of a unit's JIT time (1.9 s against 0.9 s for an
// element-wise unit on the OpenCL CPU device).
#include <sycl/atomic_ref.hpp>
#include <sycl/bit_cast.hpp>
#include <sycl/builtins.hpp>
#include <sycl/ext/oneapi/free_function_kernel_properties.hpp>
#include <sycl/ext/oneapi/free_function_queries.hpp>
#include <sycl/ext/oneapi/work_group_static.hpp>
#include <sycl/group_algorithm.hpp>
#include <sycl/group_barrier.hpp>
#include <sycl/nd_item.hpp>

namespace syclexp = sycl::ext::oneapi::experimental;

#define TESSERA_COMPAT 1
#define TESSERA_WARP 32
// common.cuh: weight-decoding loops the OpenCL CPU compiler would unroll (several seconds of JIT
// per kernel unit).
#define TLOOP_ROLLED _Pragma("nounroll")
// struct Tensor holds its address as an integer (see common.cuh).
#define TESSERA_TENSOR_DATA 1
typedef unsigned long long tensor_data_t;
#define TENSOR_BASE(t) ((char*)(t).data)

namespace tessera_sycl {
struct Dim3 {
    unsigned x, y, z;
};
inline sycl::nd_item<3> item() {
    return sycl::ext::oneapi::this_work_item::get_nd_item<3>();
}
inline Dim3 dims(sycl::range<3> r) {
    return Dim3{(unsigned)r[2], (unsigned)r[1], (unsigned)r[0]};
}
inline Dim3 ids(sycl::id<3> i) {
    return Dim3{(unsigned)i[2], (unsigned)i[1], (unsigned)i[0]};
}
inline int atomic_cas(int* p, int expected, int desired) {
    sycl::atomic_ref<int, sycl::memory_order::relaxed, sycl::memory_scope::device,
                     sycl::access::address_space::global_space>
        a(*p);
    a.compare_exchange_strong(expected, desired);
    return expected;
}
} // namespace tessera_sycl

// Kernels: free functions over a 3-D nd_range with 32-wide sub-groups.
#define __global__                                                                           \
    SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<3>))                         \
    SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::sub_group_size<32>))
#define __device__
#define __forceinline__ inline

// Built-in indices.
#define threadIdx (tessera_sycl::ids(tessera_sycl::item().get_local_id()))
#define blockIdx (tessera_sycl::ids(tessera_sycl::item().get_group().get_group_id()))
#define blockDim (tessera_sycl::dims(tessera_sycl::item().get_local_range()))
#define gridDim (tessera_sycl::dims(tessera_sycl::item().get_group_range()))

// Synchronisation, shuffles and block-shared memory.
#define __syncthreads() sycl::group_barrier(tessera_sycl::item().get_group())
#define TSYNCWARP() sycl::group_barrier(tessera_sycl::item().get_sub_group())
#define TSHFL_XOR(v, m) sycl::permute_group_by_xor(tessera_sycl::item().get_sub_group(), (v), (m))
#define TSHFL(v, src) sycl::select_from_group(tessera_sycl::item().get_sub_group(), (v), (src))
#define TSHARED(type, name, dims)                                                           \
    static syclexp::work_group_static<type dims> name##_wgs;                                 \
    type(&name) dims = name##_wgs
#define atomicCAS(p, c, v) tessera_sycl::atomic_cas((p), (c), (v))

// Bit casts and math, through functions so that no macro expands into another's name.
namespace tessera_sycl {
inline float f_exp(float x) { return sycl::exp(x); }
inline float f_fabs(float x) { return sycl::fabs(x); }
inline float f_fmax(float a, float b) { return sycl::fmax(a, b); }
inline float f_fmin(float a, float b) { return sycl::fmin(a, b); }
inline float f_pow(float a, float b) { return sycl::pow(a, b); }
inline float f_rint(float x) { return sycl::rint(x); }
inline float f_round(float x) { return sycl::round(x); }
inline float f_rsqrt(float x) { return sycl::rsqrt(x); }
inline float f_sqrt(float x) { return sycl::sqrt(x); }
inline float f_tanh(float x) { return sycl::tanh(x); }
inline double d_pow(double a, double b) { return sycl::pow(a, b); }
inline double d_cos(double x) { return sycl::cos(x); }
inline double d_sin(double x) { return sycl::sin(x); }
template <typename T> inline T t_min(T a, T b) { return b < a ? b : a; }
} // namespace tessera_sycl
#define __uint_as_float(x) sycl::bit_cast<float>((unsigned)(x))
#define __int_as_float(x) sycl::bit_cast<float>((int)(x))
#define __float_as_uint(x) sycl::bit_cast<unsigned>((float)(x))
#define __float_as_int(x) sycl::bit_cast<int>((float)(x))
#define expf(x) tessera_sycl::f_exp(x)
#define fabsf(x) tessera_sycl::f_fabs(x)
#define fmaxf(a, b) tessera_sycl::f_fmax((a), (b))
#define fminf(a, b) tessera_sycl::f_fmin((a), (b))
#define powf(a, b) tessera_sycl::f_pow((a), (b))
#define rintf(x) tessera_sycl::f_rint(x)
#define roundf(x) tessera_sycl::f_round(x)
#define rsqrtf(x) tessera_sycl::f_rsqrt(x)
#define sqrtf(x) tessera_sycl::f_sqrt(x)
#define tanhf(x) tessera_sycl::f_tanh(x)
#define pow(a, b) tessera_sycl::d_pow((a), (b))
#define cos(x) tessera_sycl::d_cos(x)
#define sin(x) tessera_sycl::d_sin(x)
#define min(a, b) tessera_sycl::t_min((a), (b))
