//! The objects every vendor implements, after ggml-backend: [`BufferType`] → [`Buffer`] for memory,
//! [`Device`] for a piece of hardware, [`Backend`] for a stream of work on one device, [`Event`]
//! for ordering between streams. All traits are object-safe so vendors, plugins and the meta device
//! mix in one process.
//!
//! Storage is attached to tensors through [`Bindings`] (tensor id → buffer + offset), never through
//! raw pointers; [`TensorBuffer`] is the common case of one buffer holding a context's tensors.

mod bindings;
mod buffer;
mod device;
mod spread;
mod stream;

pub use bindings::{Bindings, Slot, TensorBuffer};
pub use buffer::{Buffer, BufferType, HostMemory, copy_between};
pub use device::{
    BackendOptions, Device, DeviceCaps, DeviceType, MemoryInfo, Support, divide_threads,
    per_device_options,
};
pub use spread::{CommPath, MetaStats, SplitReport, Spread};
pub use stream::{Backend, Event, EventImpl, HostEvent, check_supported};
