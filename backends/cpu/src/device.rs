//! [`CpuDevice`]: a set of cores with its own buffer type; each stream gets a pool pinned to them.

use crate::buffer::{CpuBuffer, CpuBufferType};
use crate::stream::CpuBackend;
use std::sync::Arc;
use tessera_core::backend::HostMemory;
use tessera_core::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, Error, MemoryInfo,
    OpKind, Result, Support, TensorDesc, TensorId,
};

/// A CPU device: a name, the cores its threads are pinned to, and ops it is configured to refuse.
#[derive(Debug, Clone)]
pub struct CpuDevice {
    name: String,
    cores: Vec<usize>,
    refused: Vec<OpKind>,
    isolated: bool,
    buft: Arc<CpuBufferType>,
    weight_buft: Arc<CpuBufferType>,
}

impl CpuDevice {
    /// A device named `name` whose threads run on `cores` (empty: unpinned, one thread per core).
    pub fn new(name: &str, cores: Vec<usize>) -> CpuDevice {
        CpuDevice {
            name: name.to_string(),
            cores,
            refused: Vec::new(),
            isolated: false,
            buft: Arc::new(CpuBufferType::new(name)),
            weight_buft: Arc::new(CpuBufferType::weights(name)),
        }
    }

    /// The same device, but answering "not supported" for `ops` (to test schedulers' fallbacks).
    pub fn refusing(mut self, ops: &[OpKind]) -> CpuDevice {
        self.refused.extend_from_slice(ops);
        self
    }

    /// The same device, but treating other CPU devices' memory as foreign, as a discrete GPU
    /// would: schedulers then copy tensors between devices (to test those paths on a CPU).
    pub fn isolated(mut self) -> CpuDevice {
        self.isolated = true;
        self
    }

    /// The cores this device's threads are pinned to.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }

    /// Default thread count: one per core of the device.
    pub fn default_threads(&self) -> usize {
        if self.cores.is_empty() {
            crate::sys::core_count()
        } else {
            self.cores.len()
        }
    }
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        let cores = if self.cores.is_empty() {
            "all cores".to_string()
        } else {
            format!("cores {:?}", self.cores)
        };
        format!(
            "{} ({cores}, ISA {:?})",
            crate::sys::cpu_model(),
            tessera_kernels::cpu::active_isa()
        )
    }
    fn backend_name(&self) -> &str {
        "cpu"
    }
    fn kind(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn memory(&self) -> MemoryInfo {
        let (free, total) = crate::sys::memory();
        MemoryInfo { free, total }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            is_async: true,
            host_buffer: false,
            buffer_from_host: true,
            events: true,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn weight_buffer_type(&self) -> Arc<dyn BufferType> {
        self.weight_buft.clone()
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        if let Some(t) = tensors.get(node.index())
            && self.refused.contains(&t.op().kind())
        {
            return Support::No(format!(
                "{} is configured to refuse {}",
                self.name,
                t.op().kind()
            ));
        }
        crate::ops::supports(tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any()
            .downcast_ref::<CpuBufferType>()
            .is_some_and(|b| !self.isolated || b.name() == self.name)
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<CpuBuffer>()
            .is_some_and(|b| b.device_name() == self.name)
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<CpuBuffer>()
            .is_some_and(|b| !self.isolated || b.device_name() == self.name)
    }
    fn buffer_from_host(&self, mem: HostMemory) -> Result<Option<Arc<dyn Buffer>>> {
        Ok(Some(Arc::new(CpuBuffer::from_host(&self.name, mem))))
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        let n = opts.n_threads.unwrap_or_else(|| self.default_threads());
        if n == 0 || n > 1024 {
            return Err(Error::InvalidArgument(format!(
                "{}: thread count {n} must be in 1..=1024",
                self.name
            )));
        }
        Ok(Box::new(CpuBackend::new(
            &self.name,
            n,
            self.cores.clone(),
        )?))
    }
}
