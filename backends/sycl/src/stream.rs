//! [`SyclBackend`]: an in-order SYCL queue. `compute` validates and resolves a graph, then queues
//! one kernel per node and returns; `synchronize` waits and reports run-time errors (kernels
//! write index errors into a per-stream status word). Buffers a queued graph uses are kept alive
//! until an event recorded after it completes.
#![allow(unsafe_code)]

use crate::buffer::SyclBuffer;
use crate::device::DevState;
use crate::sys::{DeviceMem, LaunchArg, Queue, RawEvent};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use tessera_core::backend::{EventImpl, copy_between};
use tessera_core::{Backend, Bindings, Buffer, Error, Event, Graph, Result};
use tessera_kernels::cuda::host::status_error;
use tessera_kernels::cuda::plan::{self, Arg, Launch};

/// A SYCL event: completes when the queue's work before it has.
#[derive(Debug)]
pub struct SyclEvent(pub(crate) RawEvent);

impl EventImpl for SyclEvent {
    fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
    fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A stream of work on a SYCL device.
#[derive(Debug)]
pub struct SyclBackend {
    pub(crate) state: Arc<DevState>,
    pub(crate) queue: Arc<Queue>,
    status: DeviceMem,
    inflight: VecDeque<(RawEvent, Vec<Arc<dyn Buffer>>)>,
}

impl SyclBackend {
    pub(crate) fn new(state: Arc<DevState>) -> Result<SyclBackend> {
        let queue = state.new_queue()?;
        let status = DeviceMem::alloc(&state.platform, state.index, 8)?;
        // SAFETY: the status words are 8 bytes of live device memory; the fill is blocking.
        unsafe { queue.memset(status.at(0, 8)?, 0, 8, true)? };
        Ok(SyclBackend {
            state,
            queue,
            status,
            inflight: VecDeque::new(),
        })
    }

    /// Keeps `buffers` alive until the work queued so far completes; drops finished entries.
    pub(crate) fn hold(&mut self, buffers: Vec<Arc<dyn Buffer>>) -> Result<()> {
        while self.inflight.front().is_some_and(|(e, _)| e.is_complete()) {
            self.inflight.pop_front();
        }
        if !buffers.is_empty() {
            self.inflight.push_back((self.queue.record()?, buffers));
        }
        Ok(())
    }

    fn device_buffer<'a>(&self, b: &'a dyn Buffer, what: &str) -> Result<&'a SyclBuffer> {
        b.as_any()
            .downcast_ref::<SyclBuffer>()
            .filter(|s| s.state.index == self.state.index && s.state.same_context(&self.state))
            .ok_or_else(|| Error::Foreign {
                backend: "sycl".into(),
                what: format!("{what} {} is not memory of {}", b.name(), self.state.name),
            })
    }

    /// Queues one planned launch.
    pub(crate) fn launch(&self, l: &Launch) -> Result<()> {
        let kernel = self.state.kernels.get(l.kernel)?;
        let args: Vec<LaunchArg> = l
            .args
            .iter()
            .map(|a| LaunchArg {
                is_ptr: matches!(a, Arg::Ptr(_)),
                bytes: a.bytes(),
            })
            .collect();
        // SAFETY: plans build argument lists in the exact order, kinds and sizes of the kernels'
        // C parameters; tensor addresses come from bindings checked to fit their buffers (or the
        // comm's validated slices), which stay alive until the queue passes this point (the
        // in-flight lists).
        unsafe { self.queue.launch(&kernel, l.grid, l.block, &args) }
    }
}

impl Backend for SyclBackend {
    fn name(&self) -> &str {
        &self.state.name
    }

    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        bindings.check_graph(graph)?;
        let tensors = graph.tensors();
        tessera_core::backend::check_supported(graph, &self.state.name, plan::supports)?;
        let mut ptrs = vec![0u64; tensors.len()];
        let mut held: Vec<Arc<dyn Buffer>> = Vec::new();
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            let (buf, off) = bindings.resolve(tensors, id)?;
            let t = &tensors[id.index()];
            let sb = self.device_buffer(buf.as_ref(), &format!("tensor {} in", graph.label(id)))?;
            let addr = sb.mem.ptr() + off as u64;
            let align = plan::alignment_of(t.dtype()) as u64;
            if !addr.is_multiple_of(align)
                || t.nb().iter().any(|&s| !(s as u64).is_multiple_of(align))
            {
                return Err(Error::Unsupported {
                    op: t.op().name().to_string(),
                    dtype: t.dtype(),
                    device: self.state.name.clone(),
                    reason: format!("tensor {} is not {align}-byte aligned", graph.label(id)),
                });
            }
            ptrs[id.index()] = addr;
            if !held.iter().any(|h| Arc::ptr_eq(h, &buf)) {
                held.push(buf);
            }
        }
        for &n in graph.nodes() {
            if let Some(l) = plan::plan(tensors, &ptrs, self.status.ptr(), n) {
                self.launch(&l)?;
            }
        }
        self.hold(held)
    }

    fn synchronize(&mut self) -> Result<()> {
        self.queue.wait()?;
        self.inflight.clear();
        let mut words = [0u8; 8];
        // SAFETY: the status words are 8 live bytes; the copy is blocking.
        unsafe {
            self.queue
                .memcpy(words.as_mut_ptr(), self.status.at(0, 8)?, 8, true)?
        };
        if let Some(e) = status_error(&self.state.name, words) {
            // SAFETY: as above.
            unsafe { self.queue.memset(self.status.at(0, 8)?, 0, 8, true)? };
            return Err(e);
        }
        Ok(())
    }

    fn write_async(&mut self, dst: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        match dst.as_any().downcast_ref::<SyclBuffer>() {
            Some(d) if d.state.index == self.state.index => {
                let p = d.mem.at(offset, data.len())?;
                // SAFETY: `p` spans `data.len()` live bytes; the copy is blocking (in queue
                // order), so `data` outlives it.
                unsafe { self.queue.memcpy(p, data.as_ptr(), data.len(), true) }
            }
            _ => {
                self.synchronize()?;
                dst.write(offset, data)
            }
        }
    }

    fn read_async(&mut self, src: &dyn Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        match src.as_any().downcast_ref::<SyclBuffer>() {
            Some(s) if s.state.index == self.state.index => {
                let p = s.mem.at(offset, dst.len())?;
                // SAFETY: as in write_async.
                unsafe { self.queue.memcpy(dst.as_mut_ptr(), p, dst.len(), true) }
            }
            _ => {
                self.synchronize()?;
                src.read(offset, dst)
            }
        }
    }

    fn copy_async(
        &mut self,
        src: &Arc<dyn Buffer>,
        src_offset: usize,
        dst: &Arc<dyn Buffer>,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (s, d) = (
            src.as_any().downcast_ref::<SyclBuffer>(),
            dst.as_any().downcast_ref::<SyclBuffer>(),
        );
        match (s, d) {
            (Some(s), Some(d)) if s.state.same_context(&d.state) => {
                let (sp, dp) = (s.mem.at(src_offset, len)?, d.mem.at(dst_offset, len)?);
                // SAFETY: both ranges lie in live allocations of one context; the buffers are
                // held until the queue passes the copy.
                unsafe { self.queue.memcpy(dp, sp, len, false)? };
                self.hold(vec![src.clone(), dst.clone()])
            }
            _ => {
                self.synchronize()?;
                copy_between(src.as_ref(), src_offset, dst.as_ref(), dst_offset, len)
            }
        }
    }

    fn record_event(&mut self) -> Result<Option<Event>> {
        Ok(Some(Event(Arc::new(SyclEvent(self.queue.record()?)))))
    }

    fn wait_event(&mut self, event: &Event) -> Result<()> {
        match event.0.as_any().downcast_ref::<SyclEvent>() {
            Some(e) => self.queue.wait_event(&e.0),
            None => event.synchronize(),
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Drop for SyclBackend {
    fn drop(&mut self) {
        // Queued work may still read held buffers and the status word: let it finish.
        if let Err(e) = self.queue.wait() {
            tracing::warn!(device = %self.state.name, error = %e, "SYCL queue failed while dropping");
        }
    }
}
