//! [`CpuBackend`]: a stream on a CPU device. `compute` validates and resolves the graph on the
//! caller's thread, then queues it for the stream's own thread, which runs it on the device's
//! pool as thread 0. `synchronize` waits for the queue to drain.

use crate::buffer::CpuBuffer;
use crate::ops::{self, Exec, SharedScratch};
use crate::pool::Pool;
use crate::tview::TView;
use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{Condvar, Mutex, RawRwLock};
use std::any::Any;
use std::sync::Arc;
use std::sync::mpsc;
use tessera_core::backend::HostEvent;
use tessera_core::{Backend, Bindings, Buffer, Error, Event, Graph, Result};

pub(crate) enum Job {
    /// Ends the stream loop (sent on drop: comm contexts may still hold senders).
    Shutdown,
    /// Work for the stream's thread pool in queue order that is not a graph: a device's part of
    /// the shared-memory all-reduce (`comm`), which thereby waits for the graphs queued before
    /// it and holds back those queued after.
    Pooled(Box<dyn FnOnce(&Pool) + Send>),
    Compute(Box<Prepared>),
    Copy {
        src: Arc<dyn Buffer>,
        src_offset: usize,
        dst: Arc<dyn Buffer>,
        dst_offset: usize,
        len: usize,
        /// Packed tensors of `dst` this copy overwrites, taken out of its table when the copy
        /// was queued: unpacked in place before copying.
        unpack: Vec<(usize, crate::repack::Packed)>,
        /// Host access to CPU buffers waits until the copy has run.
        _guards: Vec<ArcRwLockReadGuard<RawRwLock, ()>>,
    },
    Signal(Arc<HostEvent>),
    Wait(Event),
}

/// A graph with every tensor resolved to host memory, plus what keeps that memory valid.
pub(crate) struct Prepared {
    graph: Graph,
    views: Vec<Option<TView>>,
    steps: Vec<ops::Step>,
    scratch_bytes: usize,
    _buffers: Vec<Arc<dyn Buffer>>,
    _guards: Vec<ArcRwLockReadGuard<RawRwLock, ()>>,
}

struct Status {
    pending: Mutex<usize>,
    idle: Condvar,
    error: Mutex<Option<Error>>,
}

/// A stream of work on a CPU device.
pub struct CpuBackend {
    device: String,
    n_threads: usize,
    /// Threads the pool runs: `n_threads`, or fewer when the device has fewer cores.
    running: usize,
    tx: Option<mpsc::Sender<Job>>,
    status: Arc<Status>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("device", &self.device)
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

impl CpuBackend {
    pub(crate) fn new(device: &str, n_threads: usize, cores: Vec<usize>) -> Result<CpuBackend> {
        let status = Arc::new(Status {
            pending: Mutex::new(0),
            idle: Condvar::new(),
            error: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let st = status.clone();
        let name = device.to_string();
        let io = |e: std::io::Error| Error::Unavailable {
            backend: "cpu".into(),
            reason: format!("cannot start threads for {device}: {e}"),
        };
        let pool = Pool::new(device, n_threads, cores.clone()).map_err(io)?;
        let running = pool.n_threads();
        let worker = std::thread::Builder::new()
            .name(format!("{device}-stream"))
            .spawn(move || {
                crate::sys::pin_current_thread(
                    cores.first().map(std::slice::from_ref).unwrap_or(&[]),
                );
                stream_loop(&name, pool, rx, st)
            })
            .map_err(io)?;
        tracing::debug!(device, n_threads, running, "CPU stream started");
        Ok(CpuBackend {
            device: device.to_string(),
            n_threads,
            running,
            tx: Some(tx),
            status,
            worker: Some(worker),
        })
    }

    /// Threads asked for this stream (the stream thread included).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Threads the stream runs: those asked, but at most one per core of the device (threads
    /// pinned to one core would only take turns on it).
    pub fn running_threads(&self) -> usize {
        self.running
    }

    fn enqueue(&mut self, job: Job) -> Result<()> {
        match &self.tx {
            Some(tx) => enqueue_on(&self.device, tx, &self.status, job),
            None => Err(Error::Compute {
                device: self.device.clone(),
                reason: "stream thread has stopped".into(),
            }),
        }
    }

    /// A handle other code (the comm) can queue jobs through, ordered with this stream's work.
    pub(crate) fn handle(&self) -> Option<StreamHandle> {
        Some(StreamHandle {
            device: self.device.clone(),
            n_threads: self.running,
            tx: self.tx.clone()?,
            status: self.status.clone(),
        })
    }

    fn prepare(&self, graph: &Graph, bindings: &Bindings) -> Result<Prepared> {
        bindings.check_graph(graph)?;
        let tensors = graph.tensors();
        tessera_core::backend::check_supported(graph, &self.device, ops::supports)?;
        let mut views = vec![None; tensors.len()];
        let mut buffers: Vec<Arc<dyn Buffer>> = Vec::new();
        let mut resolved = Vec::new();
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            let (buf, off) = bindings.resolve(tensors, id)?;
            let cpu = buf
                .as_any()
                .downcast_ref::<CpuBuffer>()
                .ok_or_else(|| Error::Foreign {
                    backend: format!("cpu ({})", self.device),
                    what: format!(
                        "tensor {} lives in {}, not CPU memory",
                        graph.label(id),
                        buf.name()
                    ),
                })?;
            let t = &tensors[id.index()];
            if !t.op().kind().is_view() && !cpu.writable() {
                return Err(Error::ReadOnly(format!(
                    "{} (written by {} of {})",
                    buf.name(),
                    t.op().name(),
                    graph.label(id)
                )));
            }
            // SAFETY: `check_graph` verified `off + nbytes <= buf.size()`, and the Arc kept in
            // `buffers` plus the read guard keep the memory alive and host access out until the run ends.
            views[id.index()] = Some(unsafe_view(cpu, off, t));
            let bi = match buffers.iter().position(|b| Arc::ptr_eq(b, &buf)) {
                Some(i) => i,
                None => {
                    buffers.push(buf);
                    buffers.len() - 1
                }
            };
            resolved.push((id, bi, off));
        }
        // Every source of every node must be part of the graph (a node list cut by hand could
        // leave a producer out); kernels index these views.
        for &n in graph.nodes() {
            let t = &tensors[n.index()];
            for s in t.srcs().chain(t.view_of().map(|v| v.src)) {
                if views.get(s.index()).is_none_or(|v| v.is_none()) {
                    return Err(Error::InvalidArgument(format!(
                        "node {} reads {}, which is neither a node nor a leaf of the graph",
                        graph.label(n),
                        graph.label(s)
                    )));
                }
            }
        }
        // The read guards come first: host writes (which may pack or unpack) wait for them, so
        // the layouts seen below are the ones the run will find.
        let guards = buffers
            .iter()
            .filter_map(|b| b.as_any().downcast_ref::<CpuBuffer>())
            .map(|b| b.access.read_arc())
            .collect();
        let mut packed = Vec::new();
        for (id, bi, off) in resolved {
            let Some(cpu) = buffers[bi].as_any().downcast_ref::<CpuBuffer>() else {
                continue;
            };
            let t = &tensors[id.index()];
            if !cpu.packed_within(off, t.nbytes()) {
                continue;
            }
            let layout = cpu.packed_at(off, t);
            packed.push((id, layout.is_some()));
            if let (Some(v), Some(p)) = (views[id.index()].as_mut(), layout) {
                v.packed = Some((p.wt, p.layout));
            }
        }
        check_packed_reads(graph, &packed)?;
        let steps = ops::schedule(graph, &views);
        Ok(Prepared {
            graph: graph.clone(),
            views,
            steps,
            scratch_bytes: ops::shared_scratch_bytes(graph),
            _buffers: buffers,
            _guards: guards,
        })
    }
}

/// A weight stored packed may be read only by kernels that know the layout: MUL_MAT, MUL_MAT_ID
/// and GET_ROWS as their first operand. Anything else (a view, a copy, another op, a write) would
/// misread it, so the graph is refused with the tensor and op named. `packed` lists the graph's
/// tensors held packed, each with whether it is a whole packed tensor; one pass over the nodes
/// checks them all (a model step reads hundreds of packed weights).
fn check_packed_reads(graph: &Graph, packed: &[(tessera_core::TensorId, bool)]) -> Result<()> {
    if packed.is_empty() {
        return Ok(());
    }
    let tensors = graph.tensors();
    let refuse = |id: tessera_core::TensorId, why: String| {
        Err(Error::InvalidArgument(format!(
            "tensor {} is stored in the CPU's packed weight layout, {why}; allocate it with \
             buffer_type() rather than weight_buffer_type(), or set TESSERA_CPU_REPACK=0",
            graph.label(id)
        )))
    };
    for &(id, whole) in packed {
        let t = &tensors[id.index()];
        if !whole || t.view_of().is_some() || t.op().kind() != tessera_core::OpKind::None {
            return refuse(id, "and this graph accesses part of it or writes it".into());
        }
    }
    let ids: std::collections::HashSet<tessera_core::TensorId> =
        packed.iter().map(|&(id, _)| id).collect();
    for &n in graph.nodes() {
        let node = &tensors[n.index()];
        let kind = node.op().kind();
        for (i, s) in node.srcs().enumerate() {
            let ok = i == 0
                && matches!(
                    kind,
                    tessera_core::OpKind::MulMat
                        | tessera_core::OpKind::MulMatId
                        | tessera_core::OpKind::GetRows
                );
            if !ok && ids.contains(&s) {
                return refuse(s, format!("which {} {} cannot read", kind, graph.label(n)));
            }
        }
        if let Some(v) = node.view_of()
            && ids.contains(&v.src)
        {
            return refuse(v.src, format!("which view {} cannot read", graph.label(n)));
        }
    }
    Ok(())
}

#[allow(unsafe_code)]
fn unsafe_view(buf: &CpuBuffer, offset: usize, t: &tessera_core::TensorDesc) -> TView {
    // SAFETY: the caller checked that `offset + t.nbytes()` lies inside `buf`.
    unsafe { TView::new(buf.base_ptr().wrapping_add(offset), t) }
}

/// Queues `job` on a stream, counting it as pending until the stream thread has run it.
fn enqueue_on(device: &str, tx: &mpsc::Sender<Job>, status: &Status, job: Job) -> Result<()> {
    *status.pending.lock() += 1;
    if tx.send(job).is_err() {
        *status.pending.lock() -= 1;
        return Err(Error::Compute {
            device: device.to_string(),
            reason: "stream thread has stopped".into(),
        });
    }
    Ok(())
}

/// A cloneable way to queue jobs on a CPU stream.
#[derive(Clone)]
pub(crate) struct StreamHandle {
    device: String,
    n_threads: usize,
    tx: mpsc::Sender<Job>,
    status: Arc<Status>,
}

impl StreamHandle {
    pub(crate) fn enqueue(&self, job: Job) -> Result<()> {
        enqueue_on(&self.device, &self.tx, &self.status, job)
    }

    /// Threads the stream's pool runs (the stream thread included).
    pub(crate) fn n_threads(&self) -> usize {
        self.n_threads
    }
}

/// How long an idle stream polls its queue before sleeping on it.
const IDLE_POLL: std::time::Duration = std::time::Duration::from_micros(20);

/// The next job, or `None` once every sender is gone.
///
/// Work often comes back to back (a host queueing a graph, an all-reduce, the next graph), and
/// a stream asleep on its queue costs the sender a wake-up system call and itself a reschedule,
/// several microseconds on a virtual machine: more than a small all-reduce. So an empty queue
/// is polled for [`IDLE_POLL`] first, yielding between polls so that a thread sharing this core
/// (often the host thread that is about to queue the work) runs meanwhile.
fn next_job(rx: &mpsc::Receiver<Job>) -> Option<Job> {
    let start = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if start.elapsed() < IDLE_POLL => {
                std::thread::yield_now()
            }
            Err(mpsc::TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

fn stream_loop(device: &str, pool: Pool, rx: mpsc::Receiver<Job>, status: Arc<Status>) {
    let mut scratch = SharedScratch::default();
    while let Some(job) = next_job(&rx) {
        if matches!(job, Job::Shutdown) {
            break;
        }
        // Every job is caught, so `pending` always comes down and `synchronize` never hangs.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
            Job::Shutdown => Ok(()),
            Job::Compute(p) => run_graph(device, &pool, &p, &mut scratch),
            Job::Signal(e) => {
                e.signal();
                Ok(())
            }
            Job::Wait(e) => e.synchronize(),
            Job::Pooled(work) => {
                work(&pool);
                Ok(())
            }
            Job::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
                unpack,
                _guards,
            } => {
                if let Some(d) = dst.as_any().downcast_ref::<CpuBuffer>() {
                    d.unpack_taken(&unpack);
                }
                stream_copy(&src, src_offset, &dst, dst_offset, len)
            }
        }))
        .unwrap_or_else(|_| {
            Err(Error::Compute {
                device: device.to_string(),
                reason: "a stream job panicked".into(),
            })
        });
        if let Err(e) = outcome {
            tracing::error!(device, error = %e, "CPU stream job failed");
            status.error.lock().get_or_insert(e);
        }
        let mut pending = status.pending.lock();
        *pending -= 1;
        if *pending == 0 {
            status.idle.notify_all();
        }
    }
}

fn stream_copy(
    src: &Arc<dyn Buffer>,
    src_offset: usize,
    dst: &Arc<dyn Buffer>,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    // Stream jobs never take the host lock: a graph queued after this copy already holds a read
    // guard, so waiting for the write lock here would deadlock. Ordering comes from the stream.
    match (
        src.as_any().downcast_ref::<CpuBuffer>(),
        dst.as_any().downcast_ref::<CpuBuffer>(),
    ) {
        (Some(s), Some(d)) => CpuBuffer::stream_copy(s, src_offset, d, dst_offset, len),
        (Some(s), None) => {
            let mut staging = vec![0u8; len];
            s.stream_read(src_offset, &mut staging)?;
            dst.write(dst_offset, &staging)
        }
        (None, Some(d)) => {
            let mut staging = vec![0u8; len];
            src.read(src_offset, &mut staging)?;
            d.stream_write(dst_offset, &staging)
        }
        (None, None) => tessera_core::backend::copy_between(
            src.as_ref(),
            src_offset,
            dst.as_ref(),
            dst_offset,
            len,
        ),
    }
}

fn run_graph(device: &str, pool: &Pool, p: &Prepared, scratch: &mut SharedScratch) -> Result<()> {
    scratch.ensure(p.scratch_bytes);
    let barrier = pool.barrier();
    let counters: Vec<ops::Counter> = std::iter::repeat_with(Default::default)
        .take(p.steps.len())
        .collect();
    let errors = Mutex::new(None::<String>);
    let exec = Exec {
        graph: &p.graph,
        views: &p.views,
        barrier: &barrier,
        shared: scratch,
        steps: &p.steps,
        counters: &counters,
        error: &errors,
    };
    // The region borrows `exec` only for the duration of `pool.run`, which joins every thread
    // before returning; the 'static bound of the pool is met by smuggling the address.
    let addr = &exec as *const Exec<'_> as usize;
    pool.run(Arc::new(move |ith, nth| {
        #[allow(unsafe_code)]
        // SAFETY: `exec` outlives `pool.run`, which does not return until every thread is done.
        let exec = unsafe { &*(addr as *const Exec<'_>) };
        ops::run_nodes(exec, ith, nth);
    }));
    match errors.into_inner() {
        Some(reason) => Err(Error::Compute {
            device: device.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        &self.device
    }
    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        let prepared = self.prepare(graph, bindings)?;
        self.enqueue(Job::Compute(Box::new(prepared)))
    }
    fn synchronize(&mut self) -> Result<()> {
        let mut pending = self.status.pending.lock();
        while *pending > 0 {
            self.status.idle.wait(&mut pending);
        }
        drop(pending);
        match self.status.error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
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
        tessera_core::error::check_range(&src.name(), src_offset, len, src.size())?;
        tessera_core::error::check_range(&dst.name(), dst_offset, len, dst.size())?;
        let mut guards = Vec::new();
        for b in [src, dst] {
            if let Some(c) = b.as_any().downcast_ref::<CpuBuffer>()
                && (guards.is_empty() || !Arc::ptr_eq(src, dst))
            {
                guards.push(c.access.read_arc());
            }
        }
        let cpu_dst = dst.as_any().downcast_ref::<CpuBuffer>();
        let unpack = cpu_dst
            .map(|d| d.take_packed(dst_offset, len))
            .unwrap_or_default();
        let taken = unpack.clone();
        let queued = self.enqueue(Job::Copy {
            src: src.clone(),
            src_offset,
            dst: dst.clone(),
            dst_offset,
            len,
            unpack,
            _guards: guards,
        });
        if queued.is_err()
            && let Some(d) = cpu_dst
        {
            // Nothing will unpack them: they stay packed, and recorded as such.
            d.restore_packed(&taken);
        }
        queued
    }
    fn record_event(&mut self) -> Result<Option<Event>> {
        let ev = HostEvent::new();
        self.enqueue(Job::Signal(ev.clone()))?;
        Ok(Some(Event(ev)))
    }
    fn wait_event(&mut self, event: &Event) -> Result<()> {
        if event.is_complete() {
            return Ok(());
        }
        self.enqueue(Job::Wait(event.clone()))
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // Queued work runs first; an explicit shutdown ends the loop even while a comm context
        // still holds a sender to this stream.
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Job::Shutdown);
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
