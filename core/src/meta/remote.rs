//! Devices of other ranks in a distributed meta device: they take part in planning (split
//! states, slice shapes, compute memory sizes are global), but this process holds none of their
//! memory and runs none of their work. Writing into their slices is a no-op (every rank writes
//! whole tensors; each keeps its own slices); reading them is an error naming the rank, so a
//! value that needs a peer's data can never be read silently wrong (the meta stream gathers
//! such values through the rank collectives instead).

use crate::Bindings;
use crate::backend::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, MemoryInfo,
    Support,
};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{TensorDesc, TensorId};
use std::any::Any;
use std::sync::Arc;

/// A device of rank `rank`, as this rank sees it.
#[derive(Debug)]
pub(crate) struct RemoteDevice {
    name: String,
    backend: String,
    kind: DeviceType,
    rank: usize,
    buft: Arc<RemoteBufferType>,
}

impl RemoteDevice {
    pub(crate) fn new(
        name: String,
        backend: String,
        kind: DeviceType,
        rank: usize,
    ) -> RemoteDevice {
        RemoteDevice {
            buft: Arc::new(RemoteBufferType {
                name: format!("{name} (rank {rank})"),
                rank,
            }),
            name,
            backend,
            kind,
            rank,
        }
    }
}

impl Device for RemoteDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        format!("device of rank {}", self.rank)
    }
    fn backend_name(&self) -> &str {
        &self.backend
    }
    fn kind(&self) -> DeviceType {
        self.kind
    }
    fn memory(&self) -> MemoryInfo {
        MemoryInfo::default()
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            is_async: true,
            ..DeviceCaps::default()
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn supports_op(&self, _tensors: &[TensorDesc], _node: TensorId) -> Support {
        // Its own rank checks its slices when it plans the same graph.
        Support::Yes
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any().downcast_ref::<RemoteBufferType>().is_some()
    }
    fn can_access(&self, _buf: &dyn Buffer) -> bool {
        // Inputs are never staged for it: it reads nothing here.
        true
    }
    fn init_backend(&self, _opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        Ok(Box::new(RemoteStream {
            name: self.name.clone(),
        }))
    }
    fn thread_pools(&self) -> usize {
        // Its threads are its own rank's: `-t` counts the threads of each process.
        0
    }
}

#[derive(Debug)]
struct RemoteBufferType {
    name: String,
    rank: usize,
}

impl BufferType for RemoteBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        64
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(RemoteBuffer {
            name: self.name.clone(),
            rank: self.rank,
            size,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The size of a peer's buffer, with no memory behind it.
#[derive(Debug)]
struct RemoteBuffer {
    name: String,
    rank: usize,
    size: usize,
}

impl RemoteBuffer {
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        crate::error::check_range(&self.name, offset, len, self.size)
    }
}

impl Buffer for RemoteBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn is_host(&self) -> bool {
        false
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        Err(Error::InvalidArgument(format!(
            "{}: bytes {offset}..{} live in rank {}'s memory, not this process's",
            self.name,
            offset + dst.len(),
            self.rank
        )))
    }
    fn memset(&self, offset: usize, len: usize, _value: u8) -> Result<()> {
        self.check(offset, len)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The stream of a peer's device: its rank runs the work.
#[derive(Debug)]
struct RemoteStream {
    name: String,
}

impl Backend for RemoteStream {
    fn name(&self) -> &str {
        &self.name
    }
    fn compute(&mut self, _graph: &Graph, _bindings: &Bindings) -> Result<()> {
        Ok(())
    }
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
