//! Tessera's shared GPU runtime: everything the CUDA, HIP, SYCL and Vulkan backends have in common,
//! written once over the small [`Driver`] trait that each vendor crate implements
//! ([`RegistryDriver`] adds GPU enumeration and an NCCL-API library, for CUDA and HIP).
//!
//! - [`Runtime`] and [`GpuContext`]: the driver and its GPUs, opened once per process; each
//!   source of `tessera_kernels::gpu` is built by the driver's compile step when one of its
//!   kernels is first needed, and kept in the GPU's [`Kernels`] cache.
//! - [`GpuDevice`], [`GpuBufferType`] / [`GpuBuffer`] (device memory) and [`HostBufferType`] /
//!   [`HostBuffer`] (pinned host memory, where the driver has it): the core `Device`,
//!   `BufferType` and `Buffer` traits.
//! - [`GpuStream`] and [`GpuEvent`]: the core `Backend` (a driver stream: graphs launched from
//!   the plans of [`plan`], in-flight batches, status words, async, peer and
//!   staged copies) and events with cross-stream waits. A stream keeps what it planned for a
//!   graph as a [`program`] and reuses it (recorded and replayed where the driver records:
//!   CUDA graphs, Vulkan command buffers, hipGraph on request); [`profile`] times where its work goes (`TESSERA_GPU_PROFILE=1`).
//! - [`GpuRegistry`]: devices `PREFIX0..` or the reason there are none, and the comm trio
//!   ([`comm`]) over an NCCL-API library ([`nccl`]); [`comm_host`] is the host-staged trio for
//!   drivers with no collective library (Vulkan).
//!
//! Modules import downwards only: `driver` → `runtime` → `buffer` → `profile`, `program` →
//! `stream` → `device` → `registry`; `comm` sits beside the registry. `unsafe` is confined to
//! [`sys`] (library loading, the NCCL table), kernel launches in `stream`, `program` (recording)
//! and `comm`, and the comm trio's C entry points.
//!
//! A vendor crate provides `impl Driver for Vendor` over its FFI tables and compile step (CUDA
//! and HIP also `impl RegistryDriver`, with a `static` holding the [`Runtime`]) and type aliases
//! (`type CudaDevice = GpuDevice<Cuda>`).
#![deny(unsafe_code)]

mod buffer;
pub mod comm;
pub mod comm_host;
mod device;
mod driver;
mod inflight;
pub mod plan;
pub mod profile;
pub mod program;
mod registry;
mod runtime;
mod stream;
pub mod sys;

pub use buffer::{GPU_ALIGNMENT, GpuBuffer, GpuBufferType, HostBuffer, HostBufferType};
pub use comm::{Slot, f32_wire, validate_slices};
pub use device::GpuDevice;
pub use driver::{Driver, NoPinned, PinnedMem};
pub use inflight::InFlight;
pub use program::ProgramStats;
pub use registry::GpuRegistry;
pub use runtime::{GpuContext, Kernels, RegistryDriver, Runtime};
pub use stream::{GpuEvent, GpuStream};
pub use sys::{nccl, rtc};
pub use tessera_kernels::gpu::unit::{TypeSet, Unit};

#[doc(hidden)]
/// Paths for [`forward_driver_methods!`]; not part of the API.
pub mod __private {
    pub use std::sync::Arc;
    pub use tessera_core::Result;
    pub use tessera_kernels::gpu::launch::{ArgSlots, Launch};
}

/// Finding and opening vendor libraries at run time.
pub mod loader {
    pub use crate::sys::{library_candidates, open_first};
}
