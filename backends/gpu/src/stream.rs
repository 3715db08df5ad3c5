//! [`GpuStream`]: a GPU stream as a `Backend`. `compute` validates and resolves a graph
//! (`crate::plan`), then queues one or a few kernels per node and returns;
//! `synchronize` waits and reports run-time errors (kernels write index errors into a per-stream
//! status word). Buffers a queued graph or copy uses are kept alive until an event recorded
//! after it completes ([`InFlight`]).
#![allow(unsafe_code)]

use crate::buffer::{GpuBuffer, HostBuffer};
use crate::driver::Driver;
use crate::inflight::InFlight;
use crate::plan::{self, StreamMem};
use crate::profile::{Phase, Profile, timed};
use crate::program::{ProgramStats, Programs};
use crate::runtime::{GpuContext, Kernels};
use std::any::Any;
use std::sync::Arc;
use tessera_core::TensorId;
use tessera_core::backend::{EventImpl, copy_between};
use tessera_core::{Backend, Bindings, Buffer, Error, Event, Graph, Result};
use tessera_kernels::gpu::host::status_error;

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
    let planned = plan::plan_with(tensors, &zeros, StreamMem::default(), node, &|k| {
        D::has_kernel(gpu, k)
    });
    match planned
        .launches
        .iter()
        .find(|l| !D::has_kernel(gpu, l.kernel))
    {
        Some(l) => tessera_core::Support::No(format!(
            "kernel {} is not yet ported to {}",
            l.kernel,
            D::NAME
        )),
        None => s,
    }
}

/// The environment variable that turns fused launches (a norm and its scaling) off (`0`), for
/// comparisons.
pub const FUSE_ENV: &str = "TESSERA_GPU_FUSE";

fn fuse_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| tessera_core::settings::var_once(FUSE_ENV).is_none_or(|v| v.trim() != "0"))
}

/// A program's launches: node, kernel and launch, in order.
type Launches<D> = Vec<(
    TensorId,
    <D as Driver>::Function,
    tessera_kernels::gpu::launch::Launch,
)>;

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
    /// Memory the planned launches use between kernels of one node (activations rounded to 8
    /// bits, partial results); grown to what the largest node asks for.
    scratch: Option<D::Mem>,
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
            scratch: None,
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

    /// The status words' and scratch's addresses, as plans take them.
    fn stream_mem(&self) -> StreamMem {
        StreamMem {
            status: D::mem_ptr(&self.status),
            scratch: self.scratch.as_ref().map_or(0, |m| D::mem_ptr(m)),
            scratch_len: self.scratch.as_ref().map_or(0, |m| D::mem_size(m)),
        }
    }

    /// Makes the scratch at least `bytes` long. A new scratch moves: the work queued so far
    /// (which may use the old one) is waited for, and every program (whose launches and
    /// recordings point into the old one) is dropped.
    fn grow_scratch(&mut self, bytes: usize) -> Result<()> {
        let old = self.scratch.as_ref().map_or(0, |m| D::mem_size(m));
        let size = bytes.max(2 * old).next_multiple_of(1 << 16);
        D::stream_sync(&self.stream)?;
        self.programs.clear();
        self.scratch = None;
        self.scratch = Some(D::alloc(self.ctx.gpu(), size)?);
        tracing::debug!(device = %self.name, bytes = size, "GPU stream scratch grown");
        Ok(())
    }

    /// Plans every node of `graph` with the stream's memory `mem`: the launches in order, and
    /// the scratch bytes the largest node needs.
    fn plan_nodes(
        &self,
        graph: &Graph,
        ptrs: &[u64],
        mem: StreamMem,
        profile: &mut Option<Profile<D>>,
    ) -> Result<(Launches<D>, usize)> {
        let gpu = self.ctx.gpu();
        let tiles = plan::mma_tiles(D::has_mma_tiles(gpu));
        let has = |k: &str| {
            (D::ALL_KERNELS || D::has_kernel(gpu, k)) && (tiles || !plan::is_tile_kernel(k))
        };
        let tensors = graph.tensors();
        let mut launches: Launches<D> = Vec::with_capacity(graph.nodes().len());
        let mut scratch = 0;
        // The last activation rounding (its launch's index, the bytes of the tensor it rounded)
        // while its scratch and that tensor are unchanged: products of one input (q, k and v;
        // gate and up) share it, even with other nodes (rope, a cache write) between them.
        let mut rounded: Option<(usize, std::ops::Range<u64>)> = None;
        let nodes = graph.nodes();
        let mut fused_into: Option<TensorId> = None;
        for (i, &n) in nodes.iter().enumerate() {
            if fused_into == Some(n) {
                continue;
            }
            // A norm scaled by the next node runs fused with it (still writing the norm).
            let fused = nodes.get(i + 1).filter(|_| fuse_on()).and_then(|&next| {
                plan::plan_norm_mul(tensors, ptrs, n, next, &has).map(|p| (next, p))
            });
            let (n, planned) = match fused {
                Some((next, p)) => {
                    fused_into = Some(next);
                    (next, p)
                }
                None => {
                    let p = timed(profile, Phase::Plan, || {
                        Ok(plan::plan_with(tensors, ptrs, mem, n, &has))
                    })?;
                    (n, p)
                }
            };
            scratch = scratch.max(planned.scratch);
            let t = &tensors[n.index()];
            let computes = !planned.launches.is_empty();
            for l in planned.launches {
                if plan::rounds_activations(&l) {
                    if rounded.as_ref().is_some_and(|(i, _)| launches[*i].2 == l) {
                        continue;
                    }
                    let x = t
                        .src(1)
                        .map_or(0..0, |x| plan::extent(&tensors[x.index()], ptrs[x.index()]));
                    rounded = Some((launches.len(), x));
                } else if planned.scratch > 0 && !plan::reads_rounded_activations(&l) {
                    // Another user of the scratch overwrites the rounding.
                    rounded = None;
                }
                let f = timed(profile, Phase::Lookup, || self.kernels.for_launch(&l))?;
                launches.push((n, f, l));
            }
            let writes = plan::extent(t, ptrs[n.index()]);
            if computes
                && rounded
                    .as_ref()
                    .is_some_and(|(_, x)| x.start < writes.end && writes.start < x.end)
            {
                rounded = None;
            }
        }
        Ok((launches, scratch))
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
        let mem = self.stream_mem();
        let index = match self.programs.find(graph, &ptrs, mem, &held) {
            Some(i) => i,
            None => {
                timed(profile, Phase::Check, || check(graph))?;
                let (mut launches, need) = self.plan_nodes(graph, &ptrs, mem, profile)?;
                let mut mem = mem;
                if need > mem.scratch_len {
                    self.grow_scratch(need)?;
                    mem = self.stream_mem();
                    launches = self.plan_nodes(graph, &ptrs, mem, profile)?.0;
                }
                self.programs.insert(graph, ptrs, mem, &held, launches)
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

    /// Bytes of scratch memory the stream holds (for the largest node planned so far).
    pub fn scratch_bytes(&self) -> usize {
        self.stream_mem().scratch_len
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
