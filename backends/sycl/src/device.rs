//! [`SyclDevice`]: a SYCL device (a root device, a sub-device, or a logical device sharing a root
//! where the runtime cannot partition). Devices of one root share a context, so their memory
//! copies directly and their kernels are built once.

use crate::buffer::{SyclBuffer, SyclBufferType};
use crate::compile::Kernels;
use crate::stream::SyclBackend;
use crate::sys::{DeviceInfo, Platform, Queue};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use tessera_core::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, Error, MemoryInfo,
    Result, Support, TensorDesc, TensorId,
};

/// What a device's buffers and streams share.
#[derive(Debug)]
pub(crate) struct DevState {
    pub(crate) name: String,
    pub(crate) platform: Arc<Platform>,
    /// Index of the runtime device.
    pub(crate) index: usize,
    /// Index of the root device whose context this device uses.
    pub(crate) root: usize,
    pub(crate) kernels: Arc<Kernels>,
    io: Queue,
    queues: Mutex<Vec<Weak<Queue>>>,
}

impl DevState {
    pub(crate) fn new(
        name: String,
        platform: &Arc<Platform>,
        index: usize,
        kernels: Arc<Kernels>,
    ) -> Result<DevState> {
        let root = platform.devices[index].root.unwrap_or(index);
        Ok(DevState {
            name,
            io: Queue::new(platform, index)?,
            platform: platform.clone(),
            index,
            root,
            kernels,
            queues: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn info(&self) -> &DeviceInfo {
        &self.platform.devices[self.index]
    }

    /// Whether `other` shares this device's context.
    pub(crate) fn same_context(&self, other: &DevState) -> bool {
        Arc::ptr_eq(&self.platform, &other.platform) && self.root == other.root
    }

    /// A new stream queue, registered so blocking host access waits for it.
    pub(crate) fn new_queue(&self) -> Result<Arc<Queue>> {
        let q = Arc::new(Queue::new(&self.platform, self.index)?);
        let mut queues = self.queues.lock();
        queues.retain(|w| w.strong_count() > 0);
        queues.push(Arc::downgrade(&q));
        Ok(q)
    }

    /// The queue for blocking host access, after every stream of the device has finished.
    pub(crate) fn io_queue(&self) -> Result<&Queue> {
        let live: Vec<Arc<Queue>> = self
            .queues
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for q in live {
            q.wait()?;
        }
        Ok(&self.io)
    }
}

/// A SYCL device.
#[derive(Debug, Clone)]
pub struct SyclDevice {
    pub(crate) state: Arc<DevState>,
    buft: Arc<SyclBufferType>,
}

impl SyclDevice {
    pub(crate) fn new(state: Arc<DevState>) -> SyclDevice {
        SyclDevice {
            buft: Arc::new(SyclBufferType {
                state: state.clone(),
            }),
            state,
        }
    }

    /// The runtime's name of the device.
    pub fn runtime_name(&self) -> &str {
        &self.state.info().name
    }

    /// Compute units (cores of a CPU device).
    pub fn compute_units(&self) -> u32 {
        self.state.info().compute_units
    }

    /// Whether this is a sub-device of a partitioned root.
    pub fn is_sub_device(&self) -> bool {
        self.state.info().root.is_some()
    }
}

impl Device for SyclDevice {
    fn name(&self) -> &str {
        &self.state.name
    }
    fn description(&self) -> String {
        let info = self.state.info();
        let what = match info.root {
            Some(r) => format!("sub-device of {}", self.state.platform.devices[r].name),
            None if self.state.index != self.state.root => "logical device".into(),
            None => "device".into(),
        };
        format!(
            "{} ({what}, {} compute units; {})",
            info.name, info.compute_units, self.state.platform.version
        )
    }
    fn backend_name(&self) -> &str {
        "sycl"
    }
    fn kind(&self) -> DeviceType {
        match self.state.info().kind {
            0 => DeviceType::Cpu,
            1 => DeviceType::Gpu,
            _ => DeviceType::Accel,
        }
    }
    fn memory(&self) -> MemoryInfo {
        let total = self.state.info().global_mem as usize;
        MemoryInfo { free: total, total }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            is_async: true,
            host_buffer: false,
            buffer_from_host: false,
            events: true,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        tessera_kernels::cuda::plan::supports(tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any()
            .downcast_ref::<SyclBufferType>()
            .is_some_and(|b| b.state.index == self.state.index)
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<SyclBuffer>()
            .is_some_and(|b| Arc::ptr_eq(&b.state, &self.state))
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<SyclBuffer>()
            .is_some_and(|b| b.state.index == self.state.index && self.state.same_context(&b.state))
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        if opts.n_threads.is_some_and(|n| n == 0) {
            return Err(Error::InvalidArgument(format!(
                "{}: thread count 0",
                self.state.name
            )));
        }
        Ok(Box::new(SyclBackend::new(self.state.clone())?))
    }
}
