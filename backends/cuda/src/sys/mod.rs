//! The FFI layer of the CUDA backend: the only place with `unsafe`.
//!
//! - [`driver`]: the CUDA driver API through cudarc's `result` layer (libcuda loaded at run time
//!   by cudarc; [`driver::probe`] checks it is present before any call, since cudarc panics on a
//!   missing library).
//! - [`nvrtc`]: a `libloading` table of NVRTC entry points, loaded from an explicit path.
//! - NCCL (`libnccl.so.2`) is the shared runtime's NCCL-API table, `tessera_gpu::nccl`.
//!
//! Every wrapper turns status codes into [`tessera_core::Error::Driver`]-style errors and never
//! panics on what a machine can cause.

#![allow(unsafe_code)]

pub(crate) mod driver;
pub mod nvrtc;
