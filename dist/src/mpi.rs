//! [`Mpi`]: the [`DistComm`] engine over MPI (rsmpi), with a timeout on every collective.

use super::Fault;
use ::mpi::collective::SystemOperation;
use ::mpi::datatype::PartitionMut;
use ::mpi::environment::Universe;
use ::mpi::request::{Request, Scope};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator, CommunicatorCollectives, Root};
use ::mpi::{Count, Threading};
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tessera_core::comm::DistComm;
use tessera_core::{Error, Result};

/// The MPI engine: this process's place in `MPI_COMM_WORLD`, and collectives over it that give
/// up after a timeout.
///
/// Every collective starts MPI's non-blocking form and polls it until it completes or the
/// timeout passes; the error then names this rank and the ranks that have not answered. A
/// collective that timed out is still in flight inside MPI and cannot be cancelled: its buffers
/// (internal ones, never the caller's) are leaked, every later collective fails, and the caller
/// must end the job with [`Mpi::abort`] (the other ranks may be blocked in the same collective,
/// and only `MPI_Abort` frees them).
///
/// MPI is finalized when the last `Arc<Mpi>` drops (unless a collective timed out).
pub struct Mpi {
    rank: usize,
    size: usize,
    timeout: Duration,
    fault: Option<Fault>,
    /// `allreduce_f32` calls so far (for fault injection).
    reduces: AtomicU64,
    processor: String,
    threading: Threading,
    inner: Mutex<Inner>,
}

// SAFETY: rsmpi's handles (`Universe`, `SimpleCommunicator`) are `!Send`/`!Sync` because MPI
// may be initialized for one thread only. Here MPI is initialized with at least
// `Threading::Serialized` (checked in `Mpi::init`), which allows calls from any thread as long as
// no two run at once; every MPI call goes through `inner`'s mutex (or, for `abort`, ends the
// process), so they never do. The other fields are plain data.
unsafe impl Send for Mpi {}
// SAFETY: as for `Send`: shared access reaches MPI only through the mutex.
unsafe impl Sync for Mpi {}

struct Inner {
    world: SimpleCommunicator,
    /// Staging buffers for the non-blocking collectives, reused between calls (and leaked after a
    /// timeout, while MPI may still write them).
    scratch: Scratch,
    /// Set by a timeout: the reason every later collective fails.
    broken: Option<String>,
    /// Finalizes MPI on drop (skipped after a timeout: a request is still in flight).
    universe: ManuallyDrop<Universe>,
}

#[derive(Default)]
struct Scratch {
    send_f32: Vec<f32>,
    recv_f32: Vec<f32>,
    send_u8: Vec<u8>,
    recv_u8: Vec<u8>,
    counts: Vec<Count>,
    displs: Vec<Count>,
}

impl Scratch {
    /// Forgets every buffer: after a timeout MPI may still read or write them.
    fn leak(&mut self) {
        std::mem::forget(std::mem::take(self));
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if inner.broken.is_none() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut inner.universe) };
        }
    }
}

impl fmt::Debug for Mpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .field("processor", &self.processor)
            .field("threading", &self.threading)
            .field("fault", &self.fault)
            .finish()
    }
}

/// Polling spins (testing continuously) this long before yielding the core between tests.
const SPIN: Duration = Duration::from_micros(100);
/// Polling yields between tests this long before it starts to sleep.
const YIELD: Duration = Duration::from_millis(5);

/// How a polled request ended.
enum Polled {
    Done,
    TimedOut,
}

impl Mpi {
    /// Initializes MPI (`MPI_Init_thread`, serialized threading) and joins `MPI_COMM_WORLD`;
    /// every collective then waits at most `timeout` for the other ranks. Reads
    /// [`super::FAULT_ENV`] once.
    ///
    /// # Errors
    /// [`Error::Dist`] when MPI was already initialized in this process (one `Mpi` per process)
    /// or gives too little thread support; [`Error::InvalidArgument`] for a malformed
    /// [`super::FAULT_ENV`]. (An MPI library that cannot start at all usually aborts the
    /// process itself, with its own message.)
    pub fn init(timeout: Duration) -> Result<Arc<Mpi>> {
        let fault = Fault::from_env()?;
        let err = |reason: String| Error::Dist {
            engine: "mpi".into(),
            rank: 0,
            reason,
        };
        let (universe, threading) = ::mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| {
                err("MPI is already initialized in this process (only one Mpi per process)".into())
            })?;
        if !matches!(threading, Threading::Serialized | Threading::Multiple) {
            // Finalizes: nothing was started.
            drop(universe);
            return Err(err(format!(
                "the MPI library offers only {threading:?} threading; serialized is needed"
            )));
        }
        let world = universe.world();
        let rank = usize::try_from(world.rank()).unwrap_or(0);
        let size = usize::try_from(world.size()).unwrap_or(1);
        let processor = ::mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        if let Some(f) = &fault {
            tracing::warn!(
                "rank {rank}: fault injection armed: rank {} will {:?} in all-reduce #{}",
                f.rank,
                f.mode,
                f.after + 1
            );
        }
        Ok(Arc::new(Mpi {
            rank,
            size,
            timeout,
            fault,
            reduces: AtomicU64::new(0),
            processor,
            threading,
            inner: Mutex::new(Inner {
                world,
                scratch: Scratch::default(),
                broken: None,
                universe: ManuallyDrop::new(universe),
            }),
        }))
    }

    /// Ends every rank of the job (`MPI_Abort` on the world) with `code`: what a rank must do
    /// after a collective failed.
    pub fn abort(&self, code: i32) -> ! {
        // Not through the mutex: a collective that hangs in another thread may hold it. Abort
        // ends the process either way.
        SimpleCommunicator::world().abort(code)
    }

    /// The processor (host) name MPI reports for this rank, for logs.
    pub fn processor_name(&self) -> &str {
        &self.processor
    }

    /// The timeout of every collective.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Plain blocking `MPI_Allreduce` (sum) of `data` in place, without timeout or fault
    /// injection: the baseline for benchmarks. `data` is copied to a staging buffer first (rsmpi
    /// has no `MPI_IN_PLACE`); [`Mpi::raw_allreduce_into`] avoids the copy.
    ///
    /// # Errors
    /// As [`Mpi::raw_allreduce_into`].
    pub fn raw_allreduce_f32(&self, data: &mut [f32]) -> Result<()> {
        let mut g = self.lock("raw all-reduce")?;
        let Inner { world, scratch, .. } = &mut *g;
        self.count(data.len(), "raw all-reduce")?;
        scratch.send_f32.clear();
        scratch.send_f32.extend_from_slice(data);
        world.all_reduce_into(&scratch.send_f32[..], data, SystemOperation::sum());
        Ok(())
    }

    /// Plain blocking `MPI_Allreduce` (sum) of `send` into `recv` (same length).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for different lengths or more than `i32::MAX` values;
    /// [`Error::Dist`] after an earlier timeout.
    pub fn raw_allreduce_into(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument(format!(
                "raw all-reduce of {} values into {}",
                send.len(),
                recv.len()
            )));
        }
        self.count(send.len(), "raw all-reduce")?;
        let g = self.lock("raw all-reduce")?;
        g.world.all_reduce_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    fn err(&self, reason: String) -> Error {
        Error::Dist {
            engine: "mpi".into(),
            rank: self.rank,
            reason,
        }
    }

    /// The mutex, unless a timeout broke the engine.
    fn lock(&self, what: &str) -> Result<MutexGuard<'_, Inner>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match &g.broken {
            Some(b) => Err(self.err(format!(
                "{what}: the engine is unusable after an earlier failure ({b}); end the job \
                 with abort"
            ))),
            None => Ok(g),
        }
    }

    fn count(&self, n: usize, what: &str) -> Result<Count> {
        Count::try_from(n).map_err(|_| {
            Error::InvalidArgument(format!(
                "{what}: {n} elements exceed MPI's count limit ({})",
                Count::MAX
            ))
        })
    }

    /// Polls `req` until it completes or the timeout (from `start`) passes: spins for the
    /// first [`SPIN`], yields the core between tests until [`YIELD`], then sleeps 50 µs
    /// doubling up to 1 ms between tests.
    ///
    /// Open MPI advances a non-blocking collective only inside MPI calls (no progress thread),
    /// so every sleep also delays the peers waiting on this rank's next step: the sleeps start
    /// only once the collective is clearly waiting for a slow or absent rank.
    fn poll<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        mut req: Request<'a, D, S>,
        start: Instant,
    ) -> Polled {
        let mut nap = Duration::from_micros(50);
        loop {
            req = match req.test() {
                Ok(_) => return Polled::Done,
                Err(r) => r,
            };
            let waited = start.elapsed();
            if waited >= self.timeout {
                // SAFETY: the raw request is dropped without being completed, so MPI may still
                // read and write its buffers. They are the staging buffers in `Scratch`, which
                // the caller leaks (`Scratch::leak`) before anything else can touch them, and
                // the engine refuses every later collective; the request is never used again.
                let _ = unsafe { req.into_raw() };
                return Polled::TimedOut;
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
    }

    /// Marks the engine broken after a timeout in `what` and returns its error.
    fn timed_out(&self, inner: &mut Inner, what: &str) -> Error {
        inner.scratch.leak();
        let others: Vec<usize> = (0..self.size).filter(|&r| r != self.rank).collect();
        let reason = format!(
            "{what}: timed out after {:?} on rank {}: ranks {others:?} have not answered (one \
             of them died or hangs); the collective is still in flight, so end the job with \
             abort",
            self.timeout, self.rank
        );
        inner.broken = Some(format!("rank {} timed out in {what}", self.rank));
        self.err(reason)
    }
}

impl DistComm for Mpi {
    fn engine(&self) -> &str {
        "mpi"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn allreduce_f32(&self, data: &mut [f32], what: &str) -> Result<()> {
        let call = self.reduces.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &self.fault {
            f.fire(self.rank, call);
        }
        self.count(data.len(), what)?;
        let start = Instant::now();
        let mut g = self.lock(what)?;
        let inner = &mut *g;
        let polled = {
            let Inner { world, scratch, .. } = &mut *inner;
            scratch.send_f32.clear();
            scratch.send_f32.extend_from_slice(data);
            scratch.recv_f32.clear();
            scratch.recv_f32.resize(data.len(), 0.0);
            let (send, recv) = (&scratch.send_f32[..], &mut scratch.recv_f32[..]);
            ::mpi::request::scope(|scope| {
                let req =
                    world.immediate_all_reduce_into(scope, send, recv, SystemOperation::sum());
                self.poll(req, start)
            })
        };
        match polled {
            Polled::Done => {
                data.copy_from_slice(&inner.scratch.recv_f32);
                Ok(())
            }
            Polled::TimedOut => Err(self.timed_out(inner, what)),
        }
    }

    fn allgather(&self, mine: &[u8], counts: &[usize], what: &str) -> Result<Vec<u8>> {
        if counts.len() != self.size || counts[self.rank] != mine.len() {
            return Err(Error::InvalidArgument(format!(
                "{what}: allgather counts {counts:?} do not fit rank {} of {} with {} bytes",
                self.rank,
                self.size,
                mine.len()
            )));
        }
        let total: usize = counts.iter().sum();
        self.count(total, what)?;
        let start = Instant::now();
        let mut g = self.lock(what)?;
        let inner = &mut *g;
        let polled = {
            let Inner { world, scratch, .. } = &mut *inner;
            let Scratch {
                send_u8,
                recv_u8,
                counts: c,
                displs,
                ..
            } = scratch;
            send_u8.clear();
            send_u8.extend_from_slice(mine);
            recv_u8.clear();
            recv_u8.resize(total, 0);
            c.clear();
            displs.clear();
            let mut at = 0;
            for &n in counts {
                // In range: the total fits a Count.
                c.push(n as Count);
                displs.push(at as Count);
                at += n;
            }
            let send = &send_u8[..];
            let mut part = PartitionMut::new(&mut recv_u8[..], &c[..], &displs[..]);
            ::mpi::request::scope(|scope| {
                let req = world.immediate_all_gather_varcount_into(scope, send, &mut part);
                self.poll(req, start)
            })
        };
        match polled {
            Polled::Done => Ok(inner.scratch.recv_u8.clone()),
            Polled::TimedOut => Err(self.timed_out(inner, what)),
        }
    }

    fn broadcast(&self, root: usize, data: &mut [u8], what: &str) -> Result<()> {
        if root >= self.size {
            return Err(Error::InvalidArgument(format!(
                "{what}: broadcast from rank {root} in a job of {} ranks",
                self.size
            )));
        }
        self.count(data.len(), what)?;
        let start = Instant::now();
        let mut g = self.lock(what)?;
        let inner = &mut *g;
        let polled = {
            let Inner { world, scratch, .. } = &mut *inner;
            scratch.send_u8.clear();
            scratch.send_u8.extend_from_slice(data);
            let buf = &mut scratch.send_u8[..];
            let root = world.process_at_rank(root as Count);
            ::mpi::request::scope(|scope| {
                let req = root.immediate_broadcast_into(scope, buf);
                self.poll(req, start)
            })
        };
        match polled {
            Polled::Done => {
                data.copy_from_slice(&inner.scratch.send_u8);
                Ok(())
            }
            Polled::TimedOut => Err(self.timed_out(inner, what)),
        }
    }
}
