//! Runs the shared launch plans (`tessera_kernels::cuda::plan`) on a CUDA stream: [`Launcher`]
//! queues one node's kernel. The plans' argument lists mirror the kernels' C signatures one for
//! one (the `# Safety` contract of the launches).
#![allow(unsafe_code)]

use crate::compile::Kernels;
use crate::sys::driver::{Args, Stream, launch};
use tessera_core::{Result, TensorDesc, TensorId};
use tessera_kernels::cuda::plan;

pub(crate) use plan::supports;

/// Queues nodes of one graph on one stream.
pub(crate) struct Launcher<'a> {
    pub stream: &'a Stream,
    pub kernels: &'a Kernels,
    /// Device address of the stream's status words (`int[2]`): kernels report index errors there.
    pub status: u64,
    pub tensors: &'a [TensorDesc],
    /// Device address of every tensor of the graph (0 for tensors the graph does not touch).
    pub ptrs: &'a [u64],
}

impl Launcher<'_> {
    /// Queues node `node`.
    pub(crate) fn node(&self, node: TensorId) -> Result<()> {
        let Some(l) = plan::plan(self.tensors, self.ptrs, self.status, node) else {
            return Ok(());
        };
        let f = self.kernels.get(l.kernel)?;
        let mut args = Args::from_launch(&l);
        // SAFETY: the plan builds `args` in the exact order and sizes of the kernel's C parameter
        // list (see the kernel sources); tensor addresses come from bindings checked to fit their
        // buffers (`Bindings::check_graph`), and the stream keeps those buffers alive until the
        // work completes (the backend's in-flight list).
        unsafe { launch(self.stream, f, l.grid, l.block, &mut args) }
    }
}
