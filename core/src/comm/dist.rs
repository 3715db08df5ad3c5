//! Collectives between the processes (ranks) of one distributed tensor-parallel job.
//!
//! A [`DistComm`] connects R ranks; each runs the same program on its own local devices, and a
//! distributed [`crate::meta::MetaDevice`] splits a model over the concatenation of every
//! rank's devices. The engine (MPI in the `tessera` crate, [`ThreadGroup`] here for tests and
//! examples) only moves host bytes; the meta device decides what to exchange.
//!
//! Contract: every rank calls the same collectives in the same order with the same sizes (the
//! meta device's plan is the same on every rank, so its calls are). A collective that cannot
//! finish (a peer died, hangs, or called something else) returns [`Error::Dist`] naming this
//! rank and, where the engine knows, the peers it waited for; it never hangs forever when the
//! engine has a timeout.

use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Collectives over host memory between the ranks of a job.
pub trait DistComm: Send + Sync + fmt::Debug {
    /// The engine's name ("mpi", "threads").
    fn engine(&self) -> &str;
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Ranks in the job.
    fn size(&self) -> usize;
    /// Sums `data` element-wise over all ranks, in place; every rank ends with the same values.
    /// `what` names the collective in errors (e.g. the reduced node).
    ///
    /// # Errors
    /// [`Error::Dist`] when a peer fails or the engine's timeout passes.
    fn allreduce_f32(&self, data: &mut [f32], what: &str) -> Result<()>;
    /// Every rank's `mine` concatenated in rank order; `counts[r]` is rank r's byte count
    /// (known to every rank, `counts[rank()] == mine.len()`).
    ///
    /// # Errors
    /// As [`DistComm::allreduce_f32`]; [`Error::InvalidArgument`] for inconsistent counts.
    fn allgather(&self, mine: &[u8], counts: &[usize], what: &str) -> Result<Vec<u8>>;
    /// Rank `root`'s `data` into `data` on every rank (same length everywhere).
    ///
    /// # Errors
    /// As [`DistComm::allreduce_f32`].
    fn broadcast(&self, root: usize, data: &mut [u8], what: &str) -> Result<()>;
}

/// [`DistComm::allreduce_f32`] with bf16 on the wire: each rank's values are rounded to bf16
/// (round to nearest even, as the generic all-reduce's [`super::Wire::Bf16`]), gathered, and
/// summed in f32 in rank order, so every rank gets bit-identical results.
///
/// # Errors
/// As [`DistComm::allgather`].
pub fn allreduce_bf16(comm: &dyn DistComm, data: &mut [f32], what: &str) -> Result<()> {
    let n = comm.size();
    let mine: Vec<u8> = data
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let all = comm.allgather(&mine, &vec![mine.len(); n], what)?;
    let per = mine.len();
    for (i, d) in data.iter_mut().enumerate() {
        let mut acc = 0f32;
        for r in 0..n {
            let b = &all[r * per + 2 * i..r * per + 2 * i + 2];
            let v = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            acc = if r == 0 { v } else { acc + v };
        }
        *d = acc;
    }
    Ok(())
}

/// Checks that every rank holds the same `bytes` (arguments, model file fingerprint); the
/// error names the ranks that differ from rank 0 and `what` they disagree on.
///
/// # Errors
/// [`Error::Dist`] on a mismatch; the engine's errors.
pub fn check_same(comm: &dyn DistComm, bytes: &[u8], what: &str) -> Result<()> {
    let digest = fnv1a(bytes).to_le_bytes();
    let all = comm.allgather(&digest, &vec![8; comm.size()], what)?;
    let differ: Vec<usize> = (1..comm.size())
        .filter(|&r| all[r * 8..r * 8 + 8] != all[..8])
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(Error::Dist {
        engine: comm.engine().into(),
        rank: comm.rank(),
        reason: format!(
            "ranks {differ:?} were started with a different {what} than rank 0: every rank must \
             get the same arguments and the same model file"
        ),
    })
}

/// 64-bit FNV-1a (stable across processes and builds, unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// R ranks as threads of one process, joined by a rendezvous per collective: what the tests
/// of distributed meta devices run on (no MPI needed), with the same contract as an engine
/// across processes, a timeout included (the error names the ranks that did not arrive).
#[derive(Debug)]
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Rendezvous>,
}

#[derive(Debug)]
struct Rendezvous {
    size: usize,
    timeout: Duration,
    state: Mutex<RoundState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct RoundState {
    /// Collectives completed.
    round: u64,
    /// This round's contributions, by rank.
    slots: Vec<Option<(String, Vec<u8>)>>,
    /// Ranks that have read this round's result.
    taken: usize,
    /// The result of the round, once every rank contributed.
    result: Option<Arc<Vec<Vec<u8>>>>,
    /// A rank gave up (timed out or left): every later collective fails.
    broken: Option<String>,
}

impl ThreadGroup {
    /// `size` ranks whose collectives wait at most `timeout` for the others.
    pub fn new(size: usize, timeout: Duration) -> Vec<ThreadGroup> {
        let shared = Arc::new(Rendezvous {
            size,
            timeout,
            state: Mutex::new(RoundState {
                slots: vec![None; size],
                ..RoundState::default()
            }),
            cv: Condvar::new(),
        });
        (0..size)
            .map(|rank| ThreadGroup {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    fn err(&self, reason: String) -> Error {
        Error::Dist {
            engine: "threads".into(),
            rank: self.rank,
            reason,
        }
    }

    /// Contributes `mine` and returns every rank's contribution, by rank.
    fn exchange(&self, mine: Vec<u8>, what: &str) -> Result<Arc<Vec<Vec<u8>>>> {
        let sh = &*self.shared;
        let deadline = Instant::now() + sh.timeout;
        let mut st = sh.state.lock();
        // The previous round's result must be taken by every rank before a new one starts.
        while st.result.is_some() && st.broken.is_none() {
            if sh.cv.wait_until(&mut st, deadline).timed_out() {
                return Err(self.give_up(&mut st, what, "the previous collective"));
            }
        }
        if let Some(b) = &st.broken {
            return Err(self.err(format!("{what}: the group is broken: {b}")));
        }
        let round = st.round;
        st.slots[self.rank] = Some((what.to_string(), mine));
        if st.slots.iter().all(Option::is_some) {
            let slots: Vec<(String, Vec<u8>)> =
                st.slots.iter_mut().filter_map(Option::take).collect();
            if let Some((other, _)) = slots.iter().find(|(w, _)| w != &slots[0].0) {
                let b = format!(
                    "ranks called different collectives ('{}' and '{other}')",
                    slots[0].0
                );
                st.broken = Some(b.clone());
                sh.cv.notify_all();
                return Err(self.err(b));
            }
            st.result = Some(Arc::new(slots.into_iter().map(|(_, b)| b).collect()));
            sh.cv.notify_all();
        }
        loop {
            if let Some(b) = &st.broken {
                return Err(self.err(format!("{what}: {b}")));
            }
            if st.round == round
                && let Some(r) = st.result.clone()
            {
                st.taken += 1;
                if st.taken == sh.size {
                    st.taken = 0;
                    st.result = None;
                    st.round += 1;
                    sh.cv.notify_all();
                }
                return Ok(r);
            }
            if sh.cv.wait_until(&mut st, deadline).timed_out() {
                return Err(self.give_up(&mut st, what, what));
            }
        }
    }

    fn give_up(&self, st: &mut RoundState, what: &str, waiting_for: &str) -> Error {
        let missing: Vec<usize> = (0..self.shared.size)
            .filter(|&r| r != self.rank && st.slots[r].is_none())
            .collect();
        let reason = format!(
            "{what}: no answer within {:?} from ranks {missing:?} (waiting for {waiting_for}): \
             a rank died or hangs",
            self.shared.timeout
        );
        st.broken = Some(format!(
            "rank {} timed out waiting for ranks {missing:?} in {what}",
            self.rank
        ));
        self.shared.cv.notify_all();
        self.err(reason)
    }
}

impl DistComm for ThreadGroup {
    fn engine(&self) -> &str {
        "threads"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn allreduce_f32(&self, data: &mut [f32], what: &str) -> Result<()> {
        let mine: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.exchange(mine, what)?;
        if all.iter().any(|b| b.len() != data.len() * 4) {
            return Err(self.err(format!("{what}: ranks reduce different lengths")));
        }
        for (i, d) in data.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (r, b) in all.iter().enumerate() {
                let v = f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                acc = if r == 0 { v } else { acc + v };
            }
            *d = acc;
        }
        Ok(())
    }
    fn allgather(&self, mine: &[u8], counts: &[usize], what: &str) -> Result<Vec<u8>> {
        if counts.len() != self.shared.size || counts[self.rank] != mine.len() {
            return Err(Error::InvalidArgument(format!(
                "{what}: allgather counts {counts:?} do not fit rank {} of {} with {} bytes",
                self.rank,
                self.shared.size,
                mine.len()
            )));
        }
        let all = self.exchange(mine.to_vec(), what)?;
        if all.iter().zip(counts).any(|(b, &c)| b.len() != c) {
            return Err(self.err(format!("{what}: ranks disagree on the gathered sizes")));
        }
        Ok(all.concat())
    }
    fn broadcast(&self, root: usize, data: &mut [u8], what: &str) -> Result<()> {
        let all = self.exchange(data.to_vec(), what)?;
        let src = all
            .get(root)
            .ok_or_else(|| self.err(format!("{what}: no rank {root}")))?;
        if src.len() != data.len() {
            return Err(self.err(format!("{what}: ranks broadcast different lengths")));
        }
        data.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send + 'static>(
        n: usize,
        timeout: Duration,
        f: impl Fn(ThreadGroup) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = ThreadGroup::new(n, timeout)
            .into_iter()
            .map(|g| {
                let f = f.clone();
                std::thread::spawn(move || f(g))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn collectives_agree_on_every_rank() {
        let out = run(3, Duration::from_secs(30), |g| {
            let r = g.rank() as f32;
            let mut v = vec![r, 1.0, r * 0.5];
            g.allreduce_f32(&mut v, "sum").unwrap();
            let mut b = vec![0.25f32 + r; 2];
            allreduce_bf16(&g, &mut b, "bf16").unwrap();
            let mine = vec![g.rank() as u8; g.rank() + 1];
            let all = g.allgather(&mine, &[1, 2, 3], "gather").unwrap();
            let mut tok = if g.rank() == 2 { [7u8, 9] } else { [0, 0] };
            g.broadcast(2, &mut tok, "token").unwrap();
            (v, b, all, tok)
        });
        for (v, b, all, tok) in out {
            assert_eq!(v, vec![3.0, 3.0, 1.5]);
            assert_eq!(b, vec![3.75, 3.75]);
            assert_eq!(all, vec![0, 1, 1, 2, 2, 2]);
            assert_eq!(tok, [7, 9]);
        }
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let out = run(3, Duration::from_millis(300), |g| {
            if g.rank() == 1 {
                return Ok(());
            }
            let mut v = [1f32];
            g.allreduce_f32(&mut v, "node ffn_out-0")
        });
        for (r, res) in out.iter().enumerate() {
            if r == 1 {
                continue;
            }
            let e = res.as_ref().unwrap_err().to_string();
            assert!(e.contains("ranks [1]") && e.contains("ffn_out-0"), "{e}");
        }
    }

    #[test]
    fn mismatched_arguments_are_named() {
        let out = run(3, Duration::from_secs(30), |g| {
            let args = if g.rank() == 2 { "-n 8" } else { "-n 16" };
            check_same(&g, args.as_bytes(), "arguments")
        });
        for res in out {
            let e = res.unwrap_err().to_string();
            assert!(e.contains("ranks [2]") && e.contains("arguments"), "{e}");
        }
    }
}
