//! Phase flags: how the participants of a comm context meet without a shared barrier.
//!
//! Each device owns one counter on its own cache line: the last phase it has reached. The host
//! numbers the phases of every all-reduce when it queues it (a one-shot reduce takes one phase,
//! a fused one two), so "everyone has reached phase p" is "every counter ≥ p": one store of
//! our own line and one read of each peer's line, no read-modify-write on a shared word, and no
//! reset between reductions. Counters only grow, so a device that runs ahead never confuses a
//! slower one.
//!
//! Waiting spins while every participating thread has a core of its own (the peer is running and
//! will arrive within microseconds), then yields, then parks. When the participants outnumber the
//! cores, a spinning thread may hold the very core the awaited peer needs, so waits spin only a
//! moment before yielding it; both fall back to parking on a condition variable, so a peer that
//! is slow for any reason (another job first, a busy machine) costs no CPU.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Spin budget while the participants have a core each: covers a peer finishing a large chunk
/// on an idle core, bounded so a preempted peer costs little.
const SPIN: Duration = Duration::from_micros(50);
/// Spin budget when oversubscribed: about a cache-line round trip, in case the peer runs on
/// another core, before giving this core away.
const SPIN_OVERSUBSCRIBED: Duration = Duration::from_micros(1);
/// Yields before parking. A yield lets a runnable peer on this core run; if none is runnable it
/// returns at once, so this is bounded to stop a waiter from burning the core meanwhile.
const YIELDS: u32 = 64;

/// One device's counter, alone on its cache line so peers polling it do not disturb the others.
#[repr(align(64))]
struct Flag(AtomicU64);

/// The phase counters of one comm context.
pub(crate) struct PhaseFlags {
    flags: Box<[Flag]>,
    spin: Duration,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl PhaseFlags {
    /// Counters for `n` devices, all at phase 0. `oversubscribed`: the participating threads
    /// outnumber the cores.
    pub(crate) fn new(n: usize, oversubscribed: bool) -> PhaseFlags {
        PhaseFlags {
            flags: (0..n).map(|_| Flag(AtomicU64::new(0))).collect(),
            spin: if oversubscribed {
                SPIN_OVERSUBSCRIBED
            } else {
                SPIN
            },
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Device `j` (and only device `j` calls this for `j`) has reached `phase`: everything it wrote before is visible to a peer that sees
    /// the counter at `phase` or later.
    pub(crate) fn arrive(&self, j: usize, phase: u64) {
        // SeqCst on both sides (here and in the parking waiter) so that either this thread sees
        // the sleeper or the sleeper sees the new counter: no lost wake-up.
        self.flags[j].0.store(phase, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.wake.notify_all();
        }
    }

    /// Wakes every waiter so it can see `cancelled`.
    pub(crate) fn wake_all(&self) {
        let _g = self.lock.lock();
        self.wake.notify_all();
    }

    /// Waits until every device has reached `phase` (true) or `cancelled` is set (false).
    pub(crate) fn wait_all(&self, phase: u64, cancelled: &AtomicBool) -> bool {
        // Devices before `next` are known to have arrived; counters never go back.
        let mut next = 0;
        let mut ready = |order: Ordering| {
            while next < self.flags.len() && self.flags[next].0.load(order) >= phase {
                next += 1;
            }
            next == self.flags.len()
        };
        if ready(Ordering::Acquire) {
            return true;
        }
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if ready(Ordering::Acquire) {
                return true;
            }
            if cancelled.load(Ordering::Acquire) {
                return false;
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
            if ready(Ordering::Acquire) {
                return true;
            }
            if cancelled.load(Ordering::Acquire) {
                return false;
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock();
        let arrived = loop {
            if ready(Ordering::SeqCst) {
                break true;
            }
            if cancelled.load(Ordering::SeqCst) {
                break false;
            }
            self.wake.wait(&mut g);
        };
        drop(g);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        arrived
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_meet_at_every_phase_spinning_or_parked() {
        for (n, oversubscribed) in [(2usize, false), (5, true), (8, true)] {
            let flags = Arc::new(PhaseFlags::new(n, oversubscribed));
            let count = Arc::new(AtomicU64::new(0));
            let never = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..n)
                .map(|j| {
                    let (flags, count, never) = (flags.clone(), count.clone(), never.clone());
                    std::thread::spawn(move || {
                        for phase in 1..=200u64 {
                            count.fetch_add(1, Ordering::SeqCst);
                            flags.arrive(j, phase);
                            assert!(flags.wait_all(phase, &never));
                            // Everyone has counted this phase before anyone passes it.
                            assert!(count.load(Ordering::SeqCst) >= phase * n as u64);
                            if j == 0 && phase % 50 == 0 {
                                // A slow participant: the others park.
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
    }

    #[test]
    fn a_cancelled_wait_returns() {
        let flags = Arc::new(PhaseFlags::new(2, false));
        let cancelled = Arc::new(AtomicBool::new(false));
        let (f, c) = (flags.clone(), cancelled.clone());
        let waiter = std::thread::spawn(move || {
            f.arrive(0, 1);
            f.wait_all(1, &c)
        });
        std::thread::sleep(Duration::from_millis(20));
        cancelled.store(true, Ordering::SeqCst);
        flags.wake_all();
        assert!(!waiter.join().unwrap());
    }
}
