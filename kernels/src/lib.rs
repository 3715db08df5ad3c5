//! Tessera kernels: compute functions on plain slices.
//!
//! The [`cpu`] module holds the CPU kernels: GGUF/ggml-compatible block
//! quantization formats, f16/bf16 conversions, dot products and the tile-level
//! matrix multiplication used by the CPU backend. Every kernel has a portable
//! scalar implementation plus AVX2 and AVX-512 implementations selected at
//! runtime.
//!
//! The [`gpu`] module embeds the GPU kernel sources every GPU backend shares (written once in
//! the CUDA C dialect, compiled at run time), their launch ABI and the codes host and kernels
//! share; the planner that turns graph nodes into launches is the GPU runtime's
//! (`tessera_gpu::plan`). CUDA compiles the sources with NVRTC, [`hip`] for AMD GPUs, and
//! [`sycl`] turns them into SYCL kernels. (Vulkan's GLSL ports live in `kernels/vulkan/` and take
//! the same launches.)

#![deny(unsafe_code)]

pub mod cpu;
pub mod gpu;
pub mod hip;
pub mod sycl;
