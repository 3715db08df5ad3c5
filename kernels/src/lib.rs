//! Tessera kernels: compute functions on plain slices.
//!
//! The [`cpu`] module holds the CPU kernels: GGUF/ggml-compatible block
//! quantization formats, f16/bf16 conversions, dot products and the tile-level
//! matrix multiplication used by the CPU backend. Every kernel has a portable
//! scalar implementation plus AVX2 and AVX-512 implementations selected at
//! runtime.
//!
//! The [`cuda`] module embeds the CUDA C sources of the GPU backends (compiled at run time) and
//! the launch plans shared by the backends that run them; [`sycl`] turns the same sources into
//! SYCL kernels and [`hip`] compiles them for AMD GPUs.

#![deny(unsafe_code)]

pub mod cpu;
pub mod cuda;
pub mod hip;
pub mod sycl;
