//! [`GpuStream`]: a GPU stream as a `Backend`. `compute` validates and resolves a graph
//! (`tessera_kernels::gpu::plan`), then queues one or a few kernels per node and returns;
//! `synchronize` waits and reports run-time errors (kernels write index errors into a per-stream
//! status word). Buffers a queued graph or copy uses are kept alive until an event recorded
//! after it completes ([`InFlight`]).
#![allow(unsafe_code)]

use crate::buffer::{GpuBuffer, HostBuffer};
use crate::driver::Driver;
use crate::inflight::InFlight;
use crate::profile::{Phase, Profile, timed};
use crate::program::{ProgramStats, Programs};
use crate::runtime::{GpuContext, Kernels};
use std::any::Any;
use std::sync::Arc;
use tessera_core::backend::{EventImpl, copy_between};
use tessera_core::{Backend, Bindings, Buffer, Error, Event, Graph, Result};
use tessera_kernels::gpu::host::status_error;
use tessera_kernels::gpu::plan;

/// Whether `gpu` runs node `node`: the plan supports it and the driver has the kernel it plans
/// ([`Driver::has_kernel`]).
pub(crate) fn supports<D: Driver>(
    gpu: &D::Gpu,
    tensors: &[tessera_core::TensorDesc],
    node: tessera_core::TensorId,
) -> tessera_core::Support {
    let s = plan::supports(tensors, node);
    if D::ALL_KERNELS || !matches!(s, tessera_core::Support::Yes) {
        return s;
    }
    // Addresses choose only among kernels the device has (the fast GEMV needs aligned rows, and
    // a device without it gets the general one), so zeros tell whether the node can run.
    let zeros = vec![0u64; tensors.len()];
    match plan::plan_with(tensors, &zeros, 0, node, &|k| D::has_kernel(gpu, k)) {
        Some(l) if !D::has_kernel(gpu, l.kernel) => tessera_core::Support::No(format!(
            "kernel {} is not yet ported to {}",
            l.kernel,
            D::NAME
        )),
        _ => s,
    }
}

/// A GPU event: completes when the stream work before it has.
#[derive(Debug)]
pub struct GpuEvent<D: Driver>(pub(crate) D::Event);

impl<D: Driver> EventImpl for GpuEvent<D> {
    fn synchronize(&self) -> Result<()> {
        D::event_sync(&self.0)
    }
    fn is_complete(&self) -> bool {
        D::event_query(&self.0)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A stream of work on a GPU device.
#[derive(Debug)]
pub struct GpuStream<D: Driver> {
    name: String,
    pub(crate) ctx: Arc<GpuContext<D>>,
    pub(crate) stream: Arc<D::Stream>,
    kernels: Arc<Kernels<D>>,
    status: D::Mem,
    inflight: InFlight<D::Event>,
    /// `TESSERA_GPU_PROFILE`'s counters ([`crate::profile`]), when asked for.
    profile: Option<Profile<D>>,
    /// Graphs planned on this stream, kept for reuse ([`crate::program`]).
    programs: Programs<D>,
}

impl<D: Driver> GpuStream<D> {
    pub(crate) fn new(name: &str, ctx: Arc<GpuContext<D>>) -> Result<GpuStream<D>> {
        let kernels = ctx.kernels().clone();
        let stream = Arc::new(D::stream_create(ctx.gpu())?);
        let status = D::alloc(ctx.gpu(), 8)?;
        D::memset(&status, 0, 8, 0)?;
        Ok(GpuStream {
            name: name.to_string(),
            ctx,
            stream,
            kernels,
            status,
            inflight: InFlight::new(),
            profile: Profile::from_env(),
            programs: Programs::new(),
        })
    }

    /// The driver ordinal of the stream's GPU.
    pub fn gpu_ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The GPU context (for a vendor's own comm).
    pub fn context(&self) -> &Arc<GpuContext<D>> {
        &self.ctx
    }

    /// Turns the profile ([`crate::profile`]) on (fresh counters) or off; it starts on when
    /// `TESSERA_GPU_PROFILE` is set.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = if on { Some(Profile::new()) } else { None };
    }

    /// The profile's report so far, when profiling.
    pub fn profile_report(&self) -> Option<String> {
        self.profile.as_ref().map(|p| p.report(&self.name))
    }

    /// The driver stream (for a vendor's own comm).
    pub fn driver_stream(&self) -> &Arc<D::Stream> {
        &self.stream
    }

    /// Keeps `buffers` alive until the work queued so far completes; drops finished entries.
    fn hold(&mut self, buffers: Vec<Arc<dyn Buffer>>) -> Result<()> {
        let stream = &self.stream;
        self.inflight
            .hold(buffers, D::event_query, || D::event_record(stream))
    }

    fn device_buffer<'a>(
        &self,
        b: &'a dyn Buffer,
        what: &dyn Fn() -> String,
    ) -> Result<&'a GpuBuffer<D>> {
        b.as_any()
            .downcast_ref::<GpuBuffer<D>>()
            .filter(|c| c.gpu_ordinal() == self.gpu_ordinal())
            .ok_or_else(|| Error::Foreign {
                backend: D::NAME.into(),
                what: format!("{} {} is not memory of {}", what(), b.name(), self.name),
            })
    }

    /// A buffer of this stream's GPU, if `b` is one.
    fn local<'a>(&self, b: &'a dyn Buffer) -> Option<&'a GpuBuffer<D>> {
        b.as_any()
            .downcast_ref::<GpuBuffer<D>>()
            .filter(|d| d.gpu_ordinal() == self.gpu_ordinal())
    }
}

impl<D: Driver> GpuStream<D> {
    /// Runs `graph`: reuses the program planned for it when the graph and its addresses are
    /// unchanged (replaying its recording where the driver records), else checks, plans and
    /// keeps a new one. With a profile, times each phase and each launch (and never replays).
    fn run_graph(
        &mut self,
        graph: &Graph,
        bindings: &Bindings,
        profile: &mut Option<Profile<D>>,
    ) -> Result<()> {
        let gpu = self.ctx.gpu().clone();
        let tensors = graph.tensors();
        let check = |graph: &Graph| -> Result<()> {
            bindings.check_graph(graph)?;
            tessera_core::backend::check_supported(graph, &self.name, |t, n| {
                supports::<D>(&gpu, t, n)
            })
        };
        let resolved = timed(profile, Phase::Resolve, || {
            plan::resolve(graph, bindings, &self.name, |b, what| {
                Ok(self.device_buffer(b, what)?.ptr())
            })
        });
        let (ptrs, held) = match resolved {
            Ok(r) => r,
            Err(e) => {
                // Report what the checks find first, as for a graph that resolves.
                timed(profile, Phase::Check, || check(graph))?;
                return Err(e);
            }
        };
        let status = D::mem_ptr(&self.status);
        let index = match self.programs.find(graph, &ptrs, status, &held) {
            Some(i) => i,
            None => {
                timed(profile, Phase::Check, || check(graph))?;
                let has = |k: &str| D::ALL_KERNELS || D::has_kernel(&gpu, k);
                let mut launches = Vec::with_capacity(graph.nodes().len());
                for &n in graph.nodes() {
                    let planned = timed(profile, Phase::Plan, || {
                        Ok(plan::plan_with(tensors, &ptrs, status, n, &has))
                    })?;
                    let Some(l) = planned else {
                        continue;
                    };
                    let f = timed(profile, Phase::Lookup, || self.kernels.for_launch(&l))?;
                    launches.push((n, f, l));
                }
                self.programs.insert(graph, ptrs, status, &held, launches)
            }
        };
        // A profile times every launch, which a replay would hide.
        if profile.is_none() && self.programs.prepare_run(index, &self.stream) {
            self.programs.replay(index, &self.stream)?;
            return self.hold(held);
        }
        let first = profile.as_mut().and_then(|p| p.mark(&self.stream));
        for (n, f, l) in &self.programs.get(index).launches {
            let start = profile.as_mut().and_then(|p| p.mark(&self.stream));
            // SAFETY: the plan builds `args` in the exact order and sizes of the kernel's C
            // parameter list (see the kernel sources); tensor addresses come from bindings checked
            // to fit their buffers (`Bindings::check_graph`) when the program was planned, the
            // program is reused only with the same live buffers at the same addresses, and
            // `hold` below keeps those buffers alive until the work completes.
            timed(profile, Phase::Launch, || unsafe {
                D::launch(&self.stream, f, l)
            })?;
            if let Some(p) = profile.as_mut() {
                let end = p.mark(&self.stream);
                let t = &tensors[n.index()];
                let dtype = t.src(0).map_or(t.dtype(), |s| tensors[s.index()].dtype());
                p.launch(
                    format!("{} {dtype} · {}", t.op().name(), l.kernel),
                    start,
                    end,
                );
            }
        }
        if let Some(p) = profile.as_mut() {
            let last = p.mark(&self.stream);
            p.span(first, last);
        }
        self.hold(held)
    }

    /// What this stream's programs did so far ([`crate::program`]).
    pub fn program_stats(&self) -> ProgramStats {
        self.programs.stats
    }

    /// Turns recording and replay of programs on or off (on by default where the driver
    /// records, unless `TESSERA_GPU_REPLAY=0`).
    pub fn set_replay(&mut self, on: bool) {
        self.programs.set_replay(on);
    }
}

impl<D: Driver> Backend for GpuStream<D> {
    fn name(&self) -> &str {
        &self.name
    }

    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        let mut profile = self.profile.take();
        let t0 = profile.is_some().then(std::time::Instant::now);
        let r = self.run_graph(graph, bindings, &mut profile);
        if let (Some(p), Some(t0)) = (profile.as_mut(), t0) {
            p.graph(graph.nodes().len(), t0.elapsed());
        }
        self.profile = profile;
        r
    }

    fn synchronize(&mut self) -> Result<()> {
        let t0 = std::time::Instant::now();
        D::stream_sync(&self.stream)?;
        if let Some(p) = self.profile.as_mut() {
            p.synchronized(t0.elapsed());
        }
        self.inflight.clear();
        let mut words = [0u8; 8];
        D::read_staged(&self.stream, &self.status, 0, &mut words)?;
        if let Some(e) = status_error(&self.name, words) {
            D::memset_async(&self.stream, &self.status, 0, 8, 0)?;
            D::stream_sync(&self.stream)?;
            return Err(e);
        }
        Ok(())
    }

    fn write_async(&mut self, dst: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        match self.local(dst) {
            Some(d) => D::write_staged(&self.stream, &d.mem, offset, data),
            None => {
                self.synchronize()?;
                dst.write(offset, data)
            }
        }
    }

    fn read_async(&mut self, src: &dyn Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        match self.local(src) {
            Some(s) => D::read_staged(&self.stream, &s.mem, offset, dst),
            None => {
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
        let (sd, dd) = (
            src.as_any().downcast_ref::<GpuBuffer<D>>(),
            dst.as_any().downcast_ref::<GpuBuffer<D>>(),
        );
        let (sh, dh) = (
            src.as_any().downcast_ref::<HostBuffer<D>>(),
            dst.as_any().downcast_ref::<HostBuffer<D>>(),
        );
        let s = &self.stream;
        match (sd, dd, sh, dh) {
            (Some(a), Some(b), _, _) if a.gpu_ordinal() == b.gpu_ordinal() => {
                D::copy_async(s, &b.mem, dst_offset, &a.mem, src_offset, len)?;
            }
            (Some(a), Some(b), _, _) if D::can_copy(D::mem_gpu(&b.mem), D::mem_gpu(&a.mem)) => {
                let (sg, dg) = (D::mem_gpu(&a.mem), D::mem_gpu(&b.mem));
                if D::can_access_peer(dg, sg) {
                    D::enable_peer_access(dg, sg)?;
                }
                D::copy_peer_async(s, &b.mem, dst_offset, &a.mem, src_offset, len)?;
            }
            (None, Some(b), Some(a), _) => {
                D::copy_to_device_async(s, &b.mem, dst_offset, &a.mem, src_offset, len)?;
            }
            (Some(a), None, _, Some(b)) => {
                D::copy_to_host_async(s, &b.mem, dst_offset, &a.mem, src_offset, len)?;
            }
            _ => {
                self.synchronize()?;
                return copy_between(src.as_ref(), src_offset, dst.as_ref(), dst_offset, len);
            }
        }
        self.hold(vec![src.clone(), dst.clone()])
    }

    fn record_event(&mut self) -> Result<Option<Event>> {
        let ev = D::event_record(&self.stream)?;
        Ok(Some(Event(Arc::new(GpuEvent::<D>(ev)))))
    }

    fn wait_event(&mut self, event: &Event) -> Result<()> {
        match event.0.as_any().downcast_ref::<GpuEvent<D>>() {
            Some(e) => D::stream_wait(&self.stream, &e.0),
            None => event.synchronize(),
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl<D: Driver> Drop for GpuStream<D> {
    fn drop(&mut self) {
        // Queued work may still read held buffers and the status word: let it finish.
        let t0 = std::time::Instant::now();
        if let Err(e) = D::stream_sync(&self.stream) {
            tracing::warn!(device = %self.name, error = %e, backend = D::NAME, "stream failed while dropping");
        }
        if let Some(p) = self.profile.as_mut().filter(|p| p.graphs() > 0) {
            p.synchronized(t0.elapsed());
            // Asked for by TESSERA_GPU_PROFILE: a report for the person who set it.
            eprint!("{}", p.report(&self.name));
        }
        // Recordings use the kernels' modules: drop them while `kernels` still holds those.
        self.programs.clear();
    }
}
