//! [`DevState`]: one SYCL device (a root device, a sub-device, or a logical device sharing a root
//! where the runtime cannot partition) as the shared runtime's `Driver::Gpu`. Devices of one root
//! share a context, so their memory copies directly and their programs are built once.

use crate::compile::Programs;
use crate::sys::{DeviceInfo, Platform, Queue};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use tessera_core::Result;

/// What a device's buffers and streams share.
#[derive(Debug)]
pub struct DevState {
    pub(crate) name: String,
    pub(crate) platform: Arc<Platform>,
    /// Index of the runtime device.
    pub(crate) index: usize,
    /// Index of the root device whose context this device uses.
    pub(crate) root: usize,
    pub(crate) programs: Arc<Programs>,
    io: Queue,
    queues: Mutex<Vec<Weak<Queue>>>,
}

impl DevState {
    pub(crate) fn new(
        name: String,
        platform: &Arc<Platform>,
        index: usize,
        programs: Arc<Programs>,
    ) -> Result<DevState> {
        let root = platform.devices[index].root.unwrap_or(index);
        Ok(DevState {
            name,
            io: Queue::new(platform, index)?,
            platform: platform.clone(),
            index,
            root,
            programs,
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
