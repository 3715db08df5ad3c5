//! Tessera core: dtypes, the tensor and graph IR, the device / buffer / backend / registry traits
//! every vendor crate implements, and the process-wide registry.
//!
//! Layers, lowest first: [`dtype`], [`tensor`], [`ops`] and [`graph`], [`backend`], [`registry`].
//! Lower layers never import higher ones.
//!
//! ```
//! use tessera_core::{Context, DType};
//! let mut ctx = Context::new();
//! let w = ctx.new_tensor(DType::Q8_0, [64, 16]).unwrap();
//! let x = ctx.new_tensor(DType::F32, [64, 1]).unwrap();
//! let y = ctx.mul_mat(w, x).unwrap();
//! let graph = ctx.build_forward(y).unwrap();
//! assert_eq!(graph.nodes(), &[y]);
//! assert_eq!(ctx.tensor(y).unwrap().ne(), [16, 1, 1, 1]);
//! ```
#![deny(unsafe_code)]

pub mod alloc;
pub mod backend;
pub mod comm;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod meta;
pub mod ops;
pub mod registry;
pub mod sched;
pub mod settings;
pub mod tensor;

pub use alloc::{GraphAllocator, Plan, PlanStats};
pub use backend::{
    Backend, BackendOptions, Bindings, Buffer, BufferType, Device, DeviceCaps, DeviceType, Event,
    MemoryInfo, SplitReport, Spread, Support, TensorBuffer,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::{Context, Graph};
pub use ops::{GluOp, Op, OpKind, RopeMode, RopeParams, UnaryOp};
pub use registry::{DeviceRegistry, ProcAddress, Registry};
pub use tensor::{TensorDesc, TensorFlags, TensorId};
