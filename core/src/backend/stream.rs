use super::{Bindings, Buffer, copy_between};
use crate::error::Result;
use crate::graph::Graph;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A stream of work on one device. `Send`, not `Sync`: one thread drives it.
///
/// Work is ordered: a later call observes the effects of earlier ones. Errors in planning are
/// returned by the call that enqueues; errors while running surface at the next
/// [`Backend::synchronize`].
pub trait Backend: Send + fmt::Debug {
    /// The device's name.
    fn name(&self) -> &str;
    /// Enqueues `graph` with storage from `bindings`; asynchronous where the device is.
    ///
    /// # Errors
    /// [`crate::Error::NotAllocated`], [`crate::Error::OutOfBounds`], [`crate::Error::Unsupported`]
    /// before anything runs; a previous run's [`crate::Error::Compute`].
    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()>;
    /// Waits until all enqueued work is done.
    ///
    /// # Errors
    /// The first run-time error since the last synchronize.
    fn synchronize(&mut self) -> Result<()>;
    /// Optional. Ordered write into `dst`; `data` is consumed before return. Default: synchronize,
    /// then a blocking write.
    ///
    /// # Errors
    /// As [`Buffer::write`] and [`Backend::synchronize`].
    fn write_async(&mut self, dst: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        self.synchronize()?;
        dst.write(offset, data)
    }
    /// Optional. Ordered read from `src` into `dst`. Default: synchronize, then a blocking read.
    ///
    /// # Errors
    /// As [`Buffer::read`] and [`Backend::synchronize`].
    fn read_async(&mut self, src: &dyn Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.synchronize()?;
        src.read(offset, dst)
    }
    /// Optional. Copy between buffers (possibly of different devices), ordered after the work
    /// already queued on this stream: the source is read once that work is done. Ordering against
    /// other streams is the caller's, through events. Default: synchronize, then [`copy_between`].
    ///
    /// # Errors
    /// As [`copy_between`] and [`Backend::synchronize`].
    fn copy_async(
        &mut self,
        src: &Arc<dyn Buffer>,
        src_offset: usize,
        dst: &Arc<dyn Buffer>,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.synchronize()?;
        copy_between(src.as_ref(), src_offset, dst.as_ref(), dst_offset, len)
    }
    /// Optional. An event that completes when all work enqueued so far has. Default `Ok(None)`:
    /// no events, callers synchronize instead.
    ///
    /// # Errors
    /// Vendor errors.
    fn record_event(&mut self) -> Result<Option<Event>> {
        Ok(None)
    }
    /// Optional. Makes later work on this stream wait for `event`. Default: block the caller until
    /// the event completes.
    ///
    /// # Errors
    /// Vendor errors.
    fn wait_event(&mut self, event: &Event) -> Result<()> {
        event.synchronize()
    }
    /// Downcast support.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Optional. Shared downcast support, for reading a concrete stream's reports while it sits
    /// behind `dyn Backend` (a scheduler's streams). Default `None`.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
    /// Optional. For a stream that splits each op over several devices (a meta device's): its
    /// all-reduce path, counters and last graph's all-reduces. Default `None`.
    fn split_report(&self) -> Option<super::SplitReport> {
        None
    }
}

/// A vendor's event object.
pub trait EventImpl: Send + Sync + fmt::Debug {
    /// Blocks until the event completes.
    ///
    /// # Errors
    /// Vendor errors.
    fn synchronize(&self) -> Result<()>;
    /// Whether the event has completed.
    fn is_complete(&self) -> bool;
    /// Downcast support: a backend waits natively on its own events.
    fn as_any(&self) -> &dyn Any;
}

/// A point in a stream that other streams or the host can wait for.
#[derive(Clone, Debug)]
pub struct Event(pub Arc<dyn EventImpl>);

impl Event {
    /// Blocks until the event completes.
    ///
    /// # Errors
    /// Vendor errors.
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
    /// Whether it has completed.
    pub fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
}

/// An event signalled by a host thread (CPU streams, staging copies).
#[derive(Debug, Default)]
pub struct HostEvent {
    done: Mutex<bool>,
    cv: Condvar,
}

impl HostEvent {
    /// A new, not yet completed event.
    pub fn new() -> Arc<HostEvent> {
        Arc::new(HostEvent::default())
    }
    /// Completes the event and wakes waiters.
    pub fn signal(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }
}

impl EventImpl for HostEvent {
    fn synchronize(&self) -> Result<()> {
        let mut done = self.done.lock();
        while !*done {
            self.cv.wait(&mut done);
        }
        Ok(())
    }
    fn is_complete(&self) -> bool {
        *self.done.lock()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Checks that `supports` accepts every node of `graph`, before a backend queues anything.
///
/// # Errors
/// [`crate::Error::Unsupported`] for the first node it refuses, naming the op, its first
/// source's dtype and `device`.
pub fn check_supported(
    graph: &Graph,
    device: &str,
    supports: impl Fn(&[crate::TensorDesc], crate::TensorId) -> super::Support,
) -> Result<()> {
    let tensors = graph.tensors();
    for &n in graph.nodes() {
        if let super::Support::No(reason) = supports(tensors, n) {
            let t = &tensors[n.index()];
            return Err(crate::Error::Unsupported {
                op: t.op().name().to_string(),
                dtype: t
                    .src(0)
                    .map(|s| tensors[s.index()].dtype())
                    .unwrap_or(t.dtype()),
                device: device.to_string(),
                reason,
            });
        }
    }
    Ok(())
}
