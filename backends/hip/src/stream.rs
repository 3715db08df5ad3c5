//! [`HipBackend`]: a HIP stream. `compute` validates and resolves a graph (shared with the CUDA
//! backend: `tessera_kernels::cuda::plan`), then queues one or a few kernels per node and returns;
//! `synchronize` waits and reports run-time errors (kernels write index errors into a per-stream
//! status word). Buffers a queued graph uses are kept alive until an event recorded after it
//! completes.

#![allow(unsafe_code)]

use crate::compile::Kernels;
use crate::device::{GpuShared, HipBuffer};
use crate::sys::{DeviceMem, RawEvent, Stream, launch};
use std::any::Any;
use std::sync::Arc;
use tessera_core::backend::{EventImpl, copy_between};
use tessera_core::{Backend, Bindings, Buffer, Error, Event, Graph, Result};
use tessera_kernels::cuda::host::{InFlight, status_error};
use tessera_kernels::cuda::plan::{self, ArgSlots};

/// A HIP event: completes when the stream work before it has.
#[derive(Debug)]
pub struct HipEvent(pub(crate) RawEvent);

impl EventImpl for HipEvent {
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

/// A stream of work on a HIP device.
#[derive(Debug)]
pub struct HipBackend {
    name: String,
    pub(crate) shared: Arc<GpuShared>,
    pub(crate) stream: Arc<Stream>,
    kernels: Arc<Kernels>,
    status: DeviceMem,
    inflight: InFlight<RawEvent>,
}

impl HipBackend {
    pub(crate) fn new(name: &str, shared: Arc<GpuShared>) -> Result<HipBackend> {
        let kernels = shared.kernels()?;
        let stream = Arc::new(Stream::new(&shared.gpu)?);
        let status = DeviceMem::alloc(&shared.gpu, 8)?;
        Ok(HipBackend {
            name: name.to_string(),
            shared,
            stream,
            kernels,
            status,
            inflight: InFlight::new(),
        })
    }

    /// The HIP ordinal of the stream's GPU.
    pub fn gpu_ordinal(&self) -> usize {
        self.shared.gpu.ordinal()
    }

    /// Keeps `buffers` alive until the work queued so far completes; drops finished entries.
    pub(crate) fn hold(&mut self, buffers: Vec<Arc<dyn Buffer>>) -> Result<()> {
        let stream = &self.stream;
        self.inflight
            .hold(buffers, RawEvent::is_complete, || RawEvent::record(stream))
    }

    fn device_buffer<'a>(&self, b: &'a dyn Buffer, what: &str) -> Result<&'a HipBuffer> {
        b.as_any()
            .downcast_ref::<HipBuffer>()
            .filter(|c| c.gpu_ordinal() == self.gpu_ordinal())
            .ok_or_else(|| Error::Foreign {
                backend: "hip".into(),
                what: format!(
                    "{what} {} is not memory of HIP GPU {}",
                    b.name(),
                    self.gpu_ordinal()
                ),
            })
    }
}

impl Backend for HipBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        bindings.check_graph(graph)?;
        let tensors = graph.tensors();
        tessera_core::backend::check_supported(graph, &self.name, plan::supports)?;
        let (ptrs, held) = plan::resolve(graph, bindings, &self.name, |b, what| {
            Ok(self.device_buffer(b, what)?.mem.ptr())
        })?;
        for &n in graph.nodes() {
            let Some(l) = plan::plan(tensors, &ptrs, self.status.ptr(), n) else {
                continue;
            };
            let f = self.kernels.get(l.kernel)?;
            let mut args = ArgSlots::from_launch(&l);
            // SAFETY: the plan builds `args` in the exact order and sizes of the kernel's C
            // parameter list; tensor addresses come from bindings checked to fit their buffers,
            // and `hold` below keeps those buffers alive until the work completes.
            unsafe { launch(&self.stream, f, l.grid, l.block, &mut args)? };
        }
        self.hold(held)
    }

    fn synchronize(&mut self) -> Result<()> {
        self.stream.synchronize()?;
        self.inflight.clear();
        let mut words = [0u8; 8];
        self.stream.read(&self.status, 0, &mut words)?;
        if let Some(e) = status_error(&self.name, words) {
            self.stream.memset(&self.status, 0, 8, 0)?;
            self.stream.synchronize()?;
            return Err(e);
        }
        Ok(())
    }

    fn write_async(&mut self, dst: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        match dst.as_any().downcast_ref::<HipBuffer>() {
            Some(d) if d.gpu_ordinal() == self.gpu_ordinal() => {
                self.stream.write(&d.mem, offset, data)
            }
            _ => {
                self.synchronize()?;
                dst.write(offset, data)
            }
        }
    }

    fn read_async(&mut self, src: &dyn Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        match src.as_any().downcast_ref::<HipBuffer>() {
            Some(s) if s.gpu_ordinal() == self.gpu_ordinal() => {
                self.stream.read(&s.mem, offset, dst)
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
        match (
            src.as_any().downcast_ref::<HipBuffer>(),
            dst.as_any().downcast_ref::<HipBuffer>(),
        ) {
            (Some(s), Some(d)) => {
                self.stream
                    .copy_dtod(&d.mem, dst_offset, &s.mem, src_offset, len)?;
                self.hold(vec![src.clone(), dst.clone()])
            }
            _ => {
                self.synchronize()?;
                copy_between(src.as_ref(), src_offset, dst.as_ref(), dst_offset, len)
            }
        }
    }

    fn record_event(&mut self) -> Result<Option<Event>> {
        Ok(Some(Event(Arc::new(HipEvent(RawEvent::record(
            &self.stream,
        )?)))))
    }

    fn wait_event(&mut self, event: &Event) -> Result<()> {
        match event.0.as_any().downcast_ref::<HipEvent>() {
            Some(e) => self.stream.wait(&e.0),
            None => event.synchronize(),
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Drop for HipBackend {
    fn drop(&mut self) {
        // Queued work may still read held buffers and the status word: let it finish.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!(device = %self.name, error = %e, "HIP stream failed while dropping");
        }
    }
}
