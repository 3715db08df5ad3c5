//! Which sequence owns each row of the KV caches: the bookkeeping that lets many sequences share
//! one cache (a unified cache, as llama.cpp's `llama_kv_cache`).
//!
//! Every cache row ("cell") is free or holds one position of one or more sequences (a forked
//! prefix is shared, not copied). A batch takes the lowest free cells; attention reads cells
//! `0..span` and the mask hides every cell whose sequences or position a query may not see, so
//! sequences never see each other's keys and a cell freed by one sequence serves the next.

use crate::{Batch, SeqId};
use tessera::{Error, Result};

/// Sequence ids a session accepts: `0..MAX_SEQUENCES` (llama.cpp's `LLAMA_MAX_SEQ`).
pub const MAX_SEQUENCES: usize = 256;

/// A set of sequence ids below [`MAX_SEQUENCES`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SeqSet([u64; MAX_SEQUENCES / 64]);

impl SeqSet {
    fn contains(&self, s: SeqId) -> bool {
        let s = s as usize;
        self.0[s / 64] & (1 << (s % 64)) != 0
    }
    fn insert(&mut self, s: SeqId) {
        let s = s as usize;
        self.0[s / 64] |= 1 << (s % 64);
    }
    fn remove(&mut self, s: SeqId) {
        let s = s as usize;
        self.0[s / 64] &= !(1 << (s % 64));
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    fn only(s: SeqId) -> SeqSet {
        let mut set = SeqSet::default();
        set.insert(s);
        set
    }
}

/// The owners and positions of the cache rows.
#[derive(Clone, Debug)]
pub(crate) struct KvCells {
    /// Each cell's position, meaningful where `seqs` is not empty.
    pos: Vec<usize>,
    seqs: Vec<SeqSet>,
    /// Cells holding at least one sequence.
    used: usize,
    /// Sequence ids accepted: `0..max_seq`.
    max_seq: usize,
}

/// Where a validated batch goes: one cell per token.
#[derive(Debug)]
pub(crate) struct Placement {
    pub(crate) cells: Vec<usize>,
}

impl KvCells {
    pub(crate) fn new(n_ctx: usize, max_seq: usize) -> KvCells {
        KvCells {
            pos: vec![0; n_ctx],
            seqs: vec![SeqSet::default(); n_ctx],
            used: 0,
            max_seq,
        }
    }

    pub(crate) fn max_sequences(&self) -> usize {
        self.max_seq
    }

    /// Cells holding at least one position.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// One past the highest cell in use (attention reads cells below it).
    pub(crate) fn extent(&self) -> usize {
        self.seqs
            .iter()
            .rposition(|s| !s.is_empty())
            .map_or(0, |i| i + 1)
    }

    /// The position after the last one `seq` holds (0 for an empty sequence).
    pub(crate) fn next_pos(&self, seq: SeqId) -> usize {
        self.cells_of(seq)
            .map(|i| self.pos[i] + 1)
            .max()
            .unwrap_or(0)
    }

    /// The positions `seq` holds, lowest first.
    pub(crate) fn positions(&self, seq: SeqId) -> Vec<usize> {
        let mut p: Vec<usize> = self.cells_of(seq).map(|i| self.pos[i]).collect();
        p.sort_unstable();
        p
    }

    fn cells_of(&self, seq: SeqId) -> impl Iterator<Item = usize> + '_ {
        self.seqs
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.contains(seq))
            .map(|(i, _)| i)
    }

    /// `Ok` for a sequence id this cache accepts.
    pub(crate) fn check_seq(&self, seq: SeqId) -> Result<()> {
        if (seq as usize) < self.max_seq {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "unknown sequence id {seq}: this session holds sequences 0..{} (raise \
                 SessionBuilder::max_sequences, at most {MAX_SEQUENCES})",
                self.max_seq
            )))
        }
    }

    /// Checks `batch` against the cache without changing it: known sequence ids, positions that
    /// continue each sequence without a gap (in batch order), and enough free cells.
    pub(crate) fn check(&self, batch: &Batch) -> Result<()> {
        if batch.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let n_ctx = self.pos.len();
        if batch.len() > n_ctx - self.used {
            return Err(Error::InvalidArgument(format!(
                "a batch of {} tokens needs as many free cache cells: {} of n_ctx {n_ctx} are \
                 free (remove finished sequences first)",
                batch.len(),
                n_ctx - self.used
            )));
        }
        let mut next: Vec<(SeqId, usize)> = Vec::new();
        for (i, t) in batch.tokens().iter().enumerate() {
            self.check_seq(t.seq)?;
            let expect = match next.iter_mut().find(|(s, _)| *s == t.seq) {
                Some((_, p)) => p,
                None => {
                    next.push((t.seq, self.next_pos(t.seq)));
                    &mut next.last_mut().expect("just pushed").1
                }
            };
            if t.pos != *expect {
                return Err(Error::InvalidArgument(format!(
                    "batch token {i}: sequence {} continues at position {}, not {} (positions \
                     of a sequence follow each other without gaps)",
                    t.seq, *expect, t.pos
                )));
            }
            *expect += 1;
        }
        Ok(())
    }

    /// Takes the lowest free cells for a batch [`KvCells::check`] accepted.
    pub(crate) fn place(&mut self, batch: &Batch) -> Placement {
        let mut cells = Vec::with_capacity(batch.len());
        let mut free = self.seqs.iter().enumerate().filter(|(_, s)| s.is_empty());
        for _ in 0..batch.len() {
            if let Some((i, _)) = free.next() {
                cells.push(i);
            }
        }
        for (t, &c) in batch.tokens().iter().zip(&cells) {
            self.pos[c] = t.pos;
            self.seqs[c] = SeqSet::only(t.seq);
        }
        self.used += cells.len();
        Placement { cells }
    }

    /// Frees the cells of a placement whose step failed.
    pub(crate) fn undo(&mut self, placed: &Placement) {
        for &c in &placed.cells {
            if !self.seqs[c].is_empty() {
                self.seqs[c] = SeqSet::default();
                self.used -= 1;
            }
        }
    }

    /// Whether a query of `seq` at `pos` sees cell `j` (within `window` positions back).
    pub(crate) fn visible(&self, j: usize, seq: SeqId, pos: usize, window: usize) -> bool {
        let s = &self.seqs[j];
        let pj = self.pos[j];
        s.contains(seq) && pj <= pos && pos - pj < window
    }

    /// Removes positions `p0..p1` of `seq` (every sequence for `None`).
    pub(crate) fn remove(&mut self, seq: Option<SeqId>, p0: usize, p1: usize) {
        for (j, s) in self.seqs.iter_mut().enumerate() {
            if s.is_empty() || !(p0..p1).contains(&self.pos[j]) {
                continue;
            }
            match seq {
                Some(q) => s.remove(q),
                None => *s = SeqSet::default(),
            }
            if s.is_empty() {
                self.used -= 1;
            }
        }
    }

    /// Makes `dst` share `src`'s positions `p0..p1` (no row is copied).
    pub(crate) fn copy(&mut self, src: SeqId, dst: SeqId, p0: usize, p1: usize) {
        for (j, s) in self.seqs.iter_mut().enumerate() {
            if s.contains(src) && (p0..p1).contains(&self.pos[j]) {
                s.insert(dst);
            }
        }
    }

    /// Removes every sequence but `seq`.
    pub(crate) fn keep(&mut self, seq: SeqId) {
        for s in &mut self.seqs {
            if s.is_empty() {
                continue;
            }
            let kept = s.contains(seq);
            *s = if kept {
                SeqSet::only(seq)
            } else {
                SeqSet::default()
            };
            if !kept {
                self.used -= 1;
            }
        }
    }

    /// Frees every cell.
    pub(crate) fn clear(&mut self) {
        self.seqs.fill(SeqSet::default());
        self.used = 0;
    }

    /// Sequences holding at least one position, lowest first.
    pub(crate) fn sequences(&self) -> Vec<SeqId> {
        (0..self.max_seq as SeqId)
            .filter(|&q| self.seqs.iter().any(|s| s.contains(q)))
            .collect()
    }
}
