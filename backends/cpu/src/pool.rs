//! A per-device pool of worker threads that run one parallel region at a time.
//!
//! The caller of [`Pool::run`] is thread 0; workers `1..n` park on a condition variable between
//! regions, so an idle device costs nothing and an oversubscribed machine (more devices than cores)
//! stays correct. Inside a region, [`Barrier::wait`] spins briefly then parks.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// How long a barrier spins before parking: long enough to cover a small op on an idle core,
/// short enough not to starve another device's threads on a shared core.
const SPIN_ITERS: u32 = 20_000;

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
    /// Set when a thread of the region panicked: waits return at once so the others finish.
    poisoned: std::sync::atomic::AtomicBool,
    arrived: AtomicUsize,
    phase: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Barrier {
    pub(crate) fn new(n: usize) -> Barrier {
        Barrier {
            n,
            poisoned: std::sync::atomic::AtomicBool::new(false),
            arrived: AtomicUsize::new(0),
            phase: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Releases every waiter now and later: a thread of the region died.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
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
            let _g = self.lock.lock();
            self.phase.fetch_add(1, Ordering::Release);
            self.cv.notify_all();
            return;
        }
        for _ in 0..SPIN_ITERS {
            if self.phase.load(Ordering::Acquire) != phase || self.poisoned.load(Ordering::Acquire)
            {
                return;
            }
            std::hint::spin_loop();
        }
        let mut g = self.lock.lock();
        while self.phase.load(Ordering::Acquire) == phase && !self.poisoned.load(Ordering::Acquire)
        {
            self.cv.wait(&mut g);
        }
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
    /// `n_threads` threads in all (the caller plus `n_threads - 1` workers); worker `i` is pinned to
    /// `cores[i % cores.len()]`.
    pub(crate) fn new(name: &str, n_threads: usize, cores: Vec<usize>) -> std::io::Result<Pool> {
        let n_threads = n_threads.max(1);
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
        let mut workers = Vec::with_capacity(n_threads - 1);
        for ith in 1..n_threads {
            let shared = shared.clone();
            let pin = if cores.is_empty() {
                vec![]
            } else {
                vec![cores[ith % cores.len()]]
            };
            let handle = std::thread::Builder::new()
                .name(format!("{name}-w{ith}"))
                .spawn(move || worker(shared, ith, n_threads, pin))?;
            workers.push(handle);
        }
        Ok(Pool {
            shared,
            workers,
            n_threads,
        })
    }

    pub(crate) fn n_threads(&self) -> usize {
        self.n_threads
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
        let pool = Pool::new("t", 4, vec![]).unwrap();
        for _ in 0..50 {
            let hits = Arc::new(AtomicUsize::new(0));
            let barrier = Arc::new(Barrier::new(4));
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
