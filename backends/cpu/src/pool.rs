//! A per-device pool of worker threads that run one parallel region at a time.
//!
//! The caller of [`Pool::run`] is thread 0; workers `1..n` park on a condition variable between
//! regions, so an idle device costs nothing and an oversubscribed machine (more threads than
//! cores) stays correct. Inside a region, [`Barrier::wait`] spins, then yields, then parks.
//!
//! Spinning is right while every thread of the process has a core of its own: the awaited
//! thread is running and arrives within microseconds. With more pool threads than cores (`-t 4`
//! on two cores, two devices of two threads each, another process on the same cores) a spinning
//! thread may hold the very core the awaited one needs, and a fixed spin of tens of
//! microseconds per barrier, hundreds of barriers per token, turned a 67 t/s decode into 3 t/s.
//! So the spin is bounded in time, shortened to a moment when the process's pool threads
//! outnumber its cores, and followed by yields that hand the core to a runnable peer.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Spin budget of a barrier while the process's pool threads have a core each: covers a peer
/// finishing an uneven share of a node, bounded so a preempted peer costs little.
const SPIN: Duration = Duration::from_micros(50);
/// Spin budget when the pool threads outnumber the cores: about a cache-line round trip, in
/// case the peer runs on another core, before giving this core away.
const SPIN_OVERSUBSCRIBED: Duration = Duration::from_micros(1);
/// Yields before parking. A yield lets a runnable peer on this core run and returns at once
/// when there is none, so it is bounded to stop a waiter from burning the core meanwhile.
const YIELDS: u32 = 64;

/// Threads of every live pool of the process (callers included): more than the cores the
/// process may run on means some pool threads share a core.
static LIVE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Whether the process's pool threads outnumber the cores it may run on.
fn oversubscribed() -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| crate::sys::process_cores().len().max(1));
    LIVE_THREADS.load(Ordering::Relaxed) > cores
}

type Region = Arc<dyn Fn(usize, usize) + Send + Sync>;

struct State {
    region: Option<Region>,
    generation: u64,
    running: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    done: Condvar,
}

/// A thread barrier for the `n` threads of a region.
pub(crate) struct Barrier {
    n: usize,
    /// How long a waiter spins before yielding.
    spin: Duration,
    /// Set when a thread of the region panicked: waits return at once so the others finish.
    poisoned: AtomicBool,
    arrived: AtomicUsize,
    phase: AtomicUsize,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Barrier {
    /// A barrier for `n` threads whose waiters spin for `spin` before yielding and parking.
    pub(crate) fn new(n: usize, spin: Duration) -> Barrier {
        Barrier {
            n,
            spin,
            poisoned: AtomicBool::new(false),
            arrived: AtomicUsize::new(0),
            phase: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Releases every waiter now and later: a thread of the region died.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        let _g = self.lock.lock();
        self.cv.notify_all();
    }

    /// Blocks until all `n` threads have called `wait` for this phase (or the barrier is poisoned).
    pub(crate) fn wait(&self) {
        if self.n <= 1 || self.poisoned.load(Ordering::Acquire) {
            return;
        }
        let phase = self.phase.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            // SeqCst here and in the parking waiter: either this thread sees the sleeper or the
            // sleeper sees the new phase, so no wake-up is lost (and no lock is taken when
            // nobody sleeps, the common case).
            self.phase.fetch_add(1, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) > 0 {
                let _g = self.lock.lock();
                self.cv.notify_all();
            }
            return;
        }
        let done =
            || self.phase.load(Ordering::Acquire) != phase || self.poisoned.load(Ordering::Acquire);
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if done() {
                return;
            }
            std::hint::spin_loop();
            spins += 1;
            // Reading the clock costs tens of nanoseconds: only every 64 spins.
            if spins.is_multiple_of(64) && start.elapsed() >= self.spin {
                break;
            }
        }
        for _ in 0..YIELDS {
            std::thread::yield_now();
            if done() {
                return;
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock();
        while self.phase.load(Ordering::SeqCst) == phase && !self.poisoned.load(Ordering::SeqCst) {
            self.cv.wait(&mut g);
        }
        drop(g);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Worker threads of one device.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

impl Pool {
    /// `n_threads` threads in all (the caller plus `n_threads - 1` workers), but no more than the
    /// distinct `cores` they are pinned to; worker `i` is pinned to `cores[i]`.
    ///
    /// Threads pinned to one core only take turns on it: each barrier then costs two context
    /// switches, hundreds of times per token (`-t 4` on two cores decoded at 0.74 of `-t 2`).
    /// The same work in fewer, longer shares is never slower, so the extra threads are not
    /// started.
    pub(crate) fn new(name: &str, n_threads: usize, cores: Vec<usize>) -> std::io::Result<Pool> {
        let asked = n_threads.max(1);
        let cores = distinct(cores);
        let n_threads = match cores.len() {
            0 => asked,
            c => asked.min(c),
        };
        if n_threads < asked {
            tracing::info!(
                device = name,
                asked,
                cores = n_threads,
                "more threads than the device's cores: running one per core"
            );
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                region: None,
                generation: 0,
                running: 0,
                shutdown: false,
            }),
            start: Condvar::new(),
            done: Condvar::new(),
        });
        LIVE_THREADS.fetch_add(n_threads, Ordering::Relaxed);
        // Built before the workers so that a failed spawn drops it: the workers started so far
        // are told to stop and joined, and the count comes back down.
        let mut pool = Pool {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
            n_threads,
        };
        for ith in 1..n_threads {
            let shared = pool.shared.clone();
            let pin = cores.get(ith).map(|&c| vec![c]).unwrap_or_default();
            let handle = std::thread::Builder::new()
                .name(format!("{name}-w{ith}"))
                .spawn(move || worker(shared, ith, n_threads, pin))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    pub(crate) fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// A barrier for one region of this pool, spinning as long as its threads, with every other
    /// pool of the process (counted now, idle ones included), do not outnumber the process's
    /// cores.
    pub(crate) fn barrier(&self) -> Barrier {
        let spin = if oversubscribed() {
            SPIN_OVERSUBSCRIBED
        } else {
            SPIN
        };
        Barrier::new(self.n_threads, spin)
    }

    /// Runs `f(ith, n_threads)` on every thread, the caller as thread 0, and returns when all are done.
    pub(crate) fn run(&self, f: Region) {
        if self.n_threads > 1 {
            let mut st = self.shared.state.lock();
            st.region = Some(f.clone());
            st.generation += 1;
            st.running = self.n_threads - 1;
            self.shared.start.notify_all();
        }
        // A panic on the caller's share must not skip waiting for the workers, which still use
        // data borrowed from the caller's stack.
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0, self.n_threads)));
        if caught.is_err() {
            tracing::error!("CPU thread 0 panicked in a parallel region");
        }
        if self.n_threads > 1 {
            let mut st = self.shared.state.lock();
            while st.running > 0 {
                self.shared.done.wait(&mut st);
            }
            st.region = None;
        }
    }
}

/// `cores` with each core once, in first-seen order (thread 0 keeps the first).
fn distinct(mut cores: Vec<usize>) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    cores.retain(|c| seen.insert(*c));
    cores
}

fn worker(shared: Arc<Shared>, ith: usize, n: usize, pin: Vec<usize>) {
    crate::sys::pin_current_thread(&pin);
    let mut seen = 0u64;
    loop {
        let region = {
            let mut st = shared.state.lock();
            while !st.shutdown && st.generation == seen {
                shared.start.wait(&mut st);
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.region.clone()
        };
        if let Some(f) = region {
            // A panicking kernel must not leave the caller waiting for this worker forever.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(ith, n))).is_err() {
                tracing::error!(worker = ith, "CPU worker panicked in a graph run");
            }
        }
        let mut st = shared.state.lock();
        st.running -= 1;
        if st.running == 0 {
            shared.done.notify_all();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        LIVE_THREADS.fetch_sub(self.n_threads, Ordering::Relaxed);
        self.shared.state.lock().shutdown = true;
        self.shared.start.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_region_and_barriers_hold() {
        // With no spin at all every wait yields or parks: the path of an oversubscribed machine.
        for spin in [SPIN, Duration::ZERO] {
            regions_and_barriers_hold(spin);
        }
    }

    #[test]
    fn waiters_parked_behind_a_late_thread_wake_up() {
        // One thread arrives 2 ms late, far past the spin and the yields: the others park and
        // must be woken by its arrival, phase after phase.
        let pool = Pool::new("t", 3, vec![]).unwrap();
        let barrier = Arc::new(Barrier::new(3, Duration::ZERO));
        let passed = Arc::new(AtomicUsize::new(0));
        let (b, p) = (barrier.clone(), passed.clone());
        pool.run(Arc::new(move |ith, _n| {
            for phase in 0..3 {
                if ith == phase {
                    std::thread::sleep(Duration::from_millis(2));
                }
                b.wait();
                p.fetch_add(1, Ordering::SeqCst);
                b.wait();
                assert_eq!(p.load(Ordering::SeqCst), 3 * (phase + 1));
            }
        }));
        assert_eq!(passed.load(Ordering::SeqCst), 9);
        assert_eq!(barrier.sleepers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn threads_beyond_the_pinned_cores_are_not_started() {
        let ran = |pool: &Pool| {
            let hits = Arc::new(AtomicUsize::new(0));
            let h = hits.clone();
            pool.run(Arc::new(move |ith, n| {
                assert!(ith < n);
                h.fetch_add(1, Ordering::SeqCst);
            }));
            hits.load(Ordering::SeqCst)
        };
        // Core 0 listed twice is one core: one thread runs every share.
        let pinned = Pool::new("t", 4, vec![0, 0]).unwrap();
        assert_eq!((pinned.n_threads(), ran(&pinned)), (1, 1));
        // Unpinned threads are all started.
        let free = Pool::new("t", 3, vec![]).unwrap();
        assert_eq!((free.n_threads(), ran(&free)), (3, 3));
    }

    fn regions_and_barriers_hold(spin: Duration) {
        let pool = Pool::new("t", 4, vec![]).unwrap();
        for _ in 0..50 {
            let hits = Arc::new(AtomicUsize::new(0));
            let barrier = Arc::new(Barrier::new(4, spin));
            let (h, b) = (hits.clone(), barrier.clone());
            pool.run(Arc::new(move |_ith, _n| {
                h.fetch_add(1, Ordering::SeqCst);
                b.wait();
                assert_eq!(h.load(Ordering::SeqCst), 4);
                b.wait();
                h.fetch_add(1, Ordering::SeqCst);
            }));
            assert_eq!(hits.load(Ordering::SeqCst), 8);
        }
    }
}
