//! The stages of the chain over a reusable candidate list: penalties, top-k, top-p, min-p,
//! temperature and the draw.

use super::{SamplerConfig, SamplerError};
use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};

/// One entry of the candidate list (llama.cpp's `llama_token_data`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Candidate {
    pub(super) id: u32,
    pub(super) logit: f32,
    pub(super) p: f32,
}

/// Best first: higher logit first, lower token id first on ties.
///
/// Logits are never NaN (inputs are validated, penalized values clamped).
/// `+ 0.0` maps `-0.0` to `+0.0` so the two tie, which makes `total_cmp`
/// agree with `>`; it sorts several times faster than a `partial_cmp`
/// comparator.
pub(super) fn best_first(a: &Candidate, b: &Candidate) -> Ordering {
    (b.logit + 0.0)
        .total_cmp(&(a.logit + 0.0))
        .then_with(|| a.id.cmp(&b.id))
}

/// Checks one row of logits: non-empty, addressable by (`i32`) token ids and
/// free of NaN or infinite values.
pub(super) fn check_logits(logits: &[f32]) -> Result<(), SamplerError> {
    if logits.is_empty() {
        return Err(SamplerError::EmptyLogits);
    }
    if i32::try_from(logits.len() - 1).is_err() {
        return Err(SamplerError::VocabTooLarge { len: logits.len() });
    }
    match logits.iter().position(|l| !l.is_finite()) {
        Some(index) => Err(SamplerError::NonFiniteLogit {
            index,
            value: logits[index],
        }),
        None => Ok(()),
    }
}

/// Index of the first highest logit (llama.cpp's greedy sampler).
pub(super) fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

/// The working candidate list (llama.cpp's `llama_token_data_array`).
#[derive(Clone, Debug, Default)]
pub(super) struct Candidates {
    pub(super) data: Vec<Candidate>,
    /// Whether `data` is in [`best_first`] order.
    pub(super) sorted: bool,
}

/// Number of candidates top-p sorts first on a large unsorted list, before
/// falling back to sorting the rest (llama.cpp's adaptive top-p heuristic).
pub(super) const TOP_P_PARTIAL: usize = 256;
/// Lists at most this long are sorted outright by top-p.
pub(super) const TOP_P_FULL_SORT_MAX: usize = 1024;
/// Minimum extra room [`Candidates::fill_top_k`] buffers beyond `k` before
/// cutting back to `k`.
pub(super) const TOP_K_SLACK: usize = 256;

impl Candidates {
    /// Refills the buffer with one unsorted candidate per logit.
    pub(super) fn fill_all(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &logit)| Candidate {
                id: i as u32,
                logit,
                p: 0.0,
            }));
        self.sorted = false;
    }

    /// Refills the buffer with the `k` best logits (`0 < k < len`), sorted
    /// best first: the same result as [`fill_all`](Self::fill_all) followed
    /// by [`top_k`](Self::top_k), in one pass over the vocabulary.
    ///
    /// Candidates are buffered until the buffer holds `k + TOP_K_SLACK`,
    /// then cut back to the best `k` with `select_nth_unstable_by`; the
    /// `k`-th best logit so far becomes a threshold that later logits must
    /// beat to be buffered at all, so most of the vocabulary costs a single
    /// comparison.
    pub(super) fn fill_top_k(&mut self, logits: &[f32], k: usize) {
        debug_assert!(k > 0 && k < logits.len());
        let cap = k + k.max(TOP_K_SLACK);
        self.data.clear();
        self.data.reserve(cap);
        let mut threshold = None;
        for (i, &logit) in logits.iter().enumerate() {
            // The threshold candidate has a lower id, so an equal logit
            // ranks below it too.
            if threshold.is_some_and(|t| logit <= t) {
                continue;
            }
            self.data.push(Candidate {
                id: i as u32,
                logit,
                p: 0.0,
            });
            if self.data.len() == cap {
                self.data.select_nth_unstable_by(k - 1, best_first);
                self.data.truncate(k);
                threshold = Some(self.data[k - 1].logit);
            }
        }
        if self.data.len() > k {
            self.data.select_nth_unstable_by(k - 1, best_first);
            self.data.truncate(k);
        }
        self.data.sort_unstable_by(best_first);
        self.sorted = true;
    }

    /// Index of the first candidate with the highest logit.
    pub(super) fn argmax(&self) -> usize {
        let mut best = 0;
        for (i, c) in self.data.iter().enumerate().skip(1) {
            if c.logit > self.data[best].logit {
                best = i;
            }
        }
        best
    }

    /// Keeps the `k` best candidates, sorted best first; `k == 0` is a no-op.
    pub(super) fn top_k(&mut self, k: usize) {
        if k == 0 || self.data.is_empty() {
            return;
        }
        let k = k.min(self.data.len());
        if !self.sorted {
            if k < self.data.len() {
                self.data.select_nth_unstable_by(k - 1, best_first);
                self.data.truncate(k);
            }
            self.data.sort_unstable_by(best_first);
            self.sorted = true;
        }
        self.data.truncate(k);
    }

    /// Keeps the smallest best-first prefix whose probability mass reaches
    /// `p` (at least one candidate); `p >= 1` is a no-op.
    pub(super) fn top_p(&mut self, p: f32) {
        if p >= 1.0 || self.data.is_empty() {
            return;
        }
        // Softmax of the current logits (temperature is applied later).
        let max = self.max_logit();
        let mut sum = 0.0f64;
        for c in &mut self.data {
            let w = (f64::from(c.logit) - f64::from(max)).exp();
            c.p = w as f32;
            sum += w;
        }
        for c in &mut self.data {
            c.p = (f64::from(c.p) / sum) as f32;
        }

        let n = self.data.len();
        // Length of the prefix that is known to be in best-first order.
        let mut sorted_len = n;
        if !self.sorted {
            if n > TOP_P_FULL_SORT_MAX {
                let k = TOP_P_PARTIAL.min(n);
                self.data.select_nth_unstable_by(k - 1, best_first);
                self.data[..k].sort_unstable_by(best_first);
                sorted_len = k;
            } else {
                self.data.sort_unstable_by(best_first);
            }
        }

        let target = f64::from(p);
        let mut cum = 0.0f64;
        let mut last = n;
        for i in 0..n {
            if i == sorted_len {
                // Everything past the sorted prefix ranks below it. Extend
                // the prefix by the next best `grow` candidates (select,
                // then sort only those), growing geometrically, rather than
                // sorting the whole tail at once.
                let grow = (sorted_len * 4).min(n - sorted_len);
                let tail = &mut self.data[sorted_len..];
                if grow < tail.len() {
                    tail.select_nth_unstable_by(grow - 1, best_first);
                }
                tail[..grow].sort_unstable_by(best_first);
                sorted_len += grow;
            }
            cum += f64::from(self.data[i].p);
            if cum >= target {
                last = i + 1;
                break;
            }
        }
        // If the loop stopped inside the sorted prefix, the unsorted tail is
        // dropped here, so the list is fully sorted either way.
        self.data.truncate(last);
        self.sorted = true;
    }

    /// Keeps candidates with `p >= p_min * p_max`, i.e. logit at least
    /// `max_logit + ln(p_min)`, preserving order; `p_min <= 0` is a no-op.
    /// When nothing qualifies (only possible for `p_min > 1`) the best
    /// candidate alone is kept, as llama.cpp's sorted fallback does.
    pub(super) fn min_p(&mut self, p_min: f32) {
        if p_min <= 0.0 || self.data.is_empty() {
            return;
        }
        let max = self.max_logit();
        let min_logit = max + p_min.ln();
        if max < min_logit {
            let best = self.best_index();
            let keep = self.data[best];
            self.data.clear();
            self.data.push(keep);
            self.sorted = true;
            return;
        }
        self.data.retain(|c| c.logit >= min_logit);
    }

    /// Temperature and distribution draw. Turns the logits into normalized
    /// probabilities (stored in `p`) and returns the index selected by the
    /// uniform variate `u` in `[0, 1)` through the inverse CDF.
    ///
    /// With `temperature <= 0` the first highest-logit candidate gets
    /// probability 1 and every other 0 (llama.cpp's greedy temperature).
    pub(super) fn dist(&mut self, temperature: f32, u: f64) -> usize {
        debug_assert!(!self.data.is_empty());
        if temperature <= 0.0 {
            let best = self.argmax();
            for c in &mut self.data {
                c.p = 0.0;
            }
            self.data[best].p = 1.0;
            return best;
        }
        if self.data.len() == 1 {
            self.data[0].p = 1.0;
            return 0;
        }
        let max = f64::from(self.max_logit());
        let t = f64::from(temperature);
        // Unnormalized weights; the accumulation runs in f64 over exactly
        // the stored values so that the running sum ends at `sum`.
        let mut sum = 0.0f64;
        for c in &mut self.data {
            let w = ((f64::from(c.logit) - max) / t).exp() as f32;
            c.p = w;
            sum += f64::from(w);
        }
        let target = u * sum;
        let mut run = 0.0f64;
        let mut selected = None;
        for (i, c) in self.data.iter_mut().enumerate() {
            if selected.is_none() {
                run += f64::from(c.p);
                // Strict `>` never selects a zero-probability candidate.
                if run > target {
                    selected = Some(i);
                }
            }
            c.p = (f64::from(c.p) / sum) as f32;
        }
        // Only reachable when `u * sum` rounds up to `sum`: take the last
        // candidate with non-zero probability.
        selected.unwrap_or_else(|| {
            self.data
                .iter()
                .rposition(|c| c.p > 0.0)
                .unwrap_or(self.data.len() - 1)
        })
    }

    pub(super) fn max_logit(&self) -> f32 {
        if self.sorted {
            self.data[0].logit
        } else {
            self.data
                .iter()
                .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
        }
    }

    /// Index of the best candidate in [`best_first`] order.
    pub(super) fn best_index(&self) -> usize {
        if self.sorted {
            return 0;
        }
        let mut best = 0;
        for i in 1..self.data.len() {
            if best_first(&self.data[i], &self.data[best]) == Ordering::Less {
                best = i;
            }
        }
        best
    }
}

/// Ring of the last `penalty_last_n` accepted tokens plus their counts.
#[derive(Clone, Debug, Default)]
pub(super) struct PenaltyWindow {
    pub(super) capacity: usize,
    pub(super) ring: VecDeque<u32>,
    pub(super) counts: HashMap<u32, u32>,
}

impl PenaltyWindow {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ring: VecDeque::with_capacity(capacity),
            counts: HashMap::with_capacity(capacity),
        }
    }

    pub(super) fn accept(&mut self, token: u32) {
        if self.capacity == 0 {
            return;
        }
        if self.ring.len() == self.capacity
            && let Some(old) = self.ring.pop_front()
            && let Some(count) = self.counts.get_mut(&old)
        {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&old);
            }
        }
        self.ring.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    pub(super) fn clear(&mut self) {
        self.ring.clear();
        self.counts.clear();
    }

    /// Applies the penalties in place to a row of logits indexed by token
    /// id. Tokens outside the vocabulary are ignored.
    pub(super) fn apply(&self, config: &SamplerConfig, logits: &mut [f32]) {
        let repeat = f64::from(config.repeat_penalty);
        let freq = f64::from(config.frequency_penalty);
        let presence = f64::from(config.presence_penalty);
        for (&token, &count) in &self.counts {
            let Some(l) = logits.get_mut(token as usize) else {
                continue;
            };
            let mut logit = f64::from(*l);
            if logit <= 0.0 {
                logit *= repeat;
            } else {
                logit /= repeat;
            }
            logit -= f64::from(count) * freq + presence;
            // Computed in f64 so nothing overflows; clamp back into the
            // finite f32 range.
            *l = logit.clamp(-f64::from(f32::MAX), f64::from(f32::MAX)) as f32;
        }
    }
}
