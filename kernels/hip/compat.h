// Tessera kernels on HIP: the CUDA C sources of kernels/gpu compiled by hipRTC (or hipcc --genco)
// for AMD GPUs. HIP already provides the CUDA built-ins the kernels use (threadIdx, __syncthreads,
// atomicCAS, __int_as_float, expf, ...); this header only defines the few macros common.cuh leaves
// to a compat header.
//
// Warps: the kernels are written for 32-lane warps (warp = threadIdx.x / 32, shuffles over 32
// lanes). On wave64 GPUs (gfx9: gfx90a, gfx942) a hardware wavefront holds two such logical warps,
// and a width-32 shuffle stays inside its own 32-lane half, so the same code is correct on wave32
// (gfx10/gfx11) and wave64. TESSERA_HW_WAVE is the hardware width, for code that wants it.
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

#define TESSERA_COMPAT 1
#define TESSERA_WARP 32
#if defined(__GFX9__)
#define TESSERA_HW_WAVE 64
#else
#define TESSERA_HW_WAVE 32
#endif
#define TSHFL_XOR(v, m) __shfl_xor((v), (m), 32)
#define TSHFL(v, src) __shfl((v), (src), 32)
// Lanes of a wavefront run in lock step; the fence orders their shared-memory accesses and the
// wave barrier keeps the compiler from moving them across this point.
#define TSYNCWARP()                                                                                \
    do {                                                                                           \
        __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "wavefront");                                     \
        __builtin_amdgcn_wave_barrier();                                                           \
    } while (0)
#define TSHARED(type, name, dims) __shared__ type name dims
