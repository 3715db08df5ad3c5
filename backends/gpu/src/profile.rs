//! `TESSERA_GPU_PROFILE=1`: where a GPU stream's time goes. The stream times the host's work per
//! graph in phases (support check, address resolution, planning, kernel lookup, launch calls),
//! the time `synchronize` waits, and, where the driver has timed events
//! ([`Driver::event_record_timed`]), each launch's device time and each graph's device span
//! (first kernel's start to last kernel's end, so span minus kernel time is the device waiting
//! for the host). It prints one table per stream to stderr when the stream is dropped.
//!
//! Timing every launch costs two event records, so a profiled run is slower than a plain one:
//! compare its shares, not its total, with an unprofiled run.

use crate::driver::Driver;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tessera_core::Result;

/// The environment variable that turns the profile on (any value but `0` or empty).
pub const PROFILE_ENV: &str = "TESSERA_GPU_PROFILE";

/// Whether [`PROFILE_ENV`] asks for a profile.
pub(crate) fn requested() -> bool {
    std::env::var_os(PROFILE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The host phases of one `compute`, in order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// `check_supported` over every node.
    Check,
    /// Device addresses of every tensor (`plan::resolve`).
    Resolve,
    /// Kernel, grid and arguments of each node (`plan::plan_with`).
    Plan,
    /// The kernel cache lookup (`Kernels::for_launch`).
    Lookup,
    /// The driver's launch calls.
    Launch,
}

const PHASES: [&str; 5] = ["check", "resolve", "plan", "kernel lookup", "launch"];

#[derive(Debug, Default, Clone, Copy)]
struct KeyStats {
    launches: u64,
    device_ms: f64,
}

/// One stream's profile.
#[derive(Debug)]
pub(crate) struct Profile<D: Driver> {
    computes: u64,
    nodes: u64,
    host: [Duration; 5],
    host_total: Duration,
    syncs: u64,
    sync_wait: Duration,
    /// Launches whose events have not been read yet: the key's index, start and end.
    pending: Vec<(usize, D::Event, D::Event)>,
    /// Graphs whose span events have not been read yet.
    pending_spans: Vec<(D::Event, D::Event)>,
    keys: Vec<String>,
    index: HashMap<String, usize>,
    stats: Vec<KeyStats>,
    span_ms: f64,
    spans: u64,
    timed: bool,
    errors: u64,
}

impl<D: Driver> Profile<D> {
    /// A profile when [`PROFILE_ENV`] asks for one.
    pub(crate) fn from_env() -> Option<Profile<D>> {
        requested().then(Profile::new)
    }

    /// Empty counters.
    pub(crate) fn new() -> Profile<D> {
        Profile {
            computes: 0,
            nodes: 0,
            host: [Duration::ZERO; 5],
            host_total: Duration::ZERO,
            syncs: 0,
            sync_wait: Duration::ZERO,
            pending: Vec::new(),
            pending_spans: Vec::new(),
            keys: Vec::new(),
            index: HashMap::new(),
            stats: Vec::new(),
            span_ms: 0.0,
            spans: 0,
            timed: true,
            errors: 0,
        }
    }

    /// Counts one `compute` of `nodes` nodes that took `total` on the host.
    pub(crate) fn graph(&mut self, nodes: usize, total: Duration) {
        self.computes += 1;
        self.nodes += nodes as u64;
        self.host_total += total;
    }

    /// Graphs computed so far.
    pub(crate) fn graphs(&self) -> u64 {
        self.computes
    }

    /// Adds `d` to a host phase.
    pub(crate) fn phase(&mut self, p: Phase, d: Duration) {
        self.host[p as usize] += d;
    }

    /// A timed event on `stream` now, or `None` when the driver has none (then the profile
    /// stops asking).
    pub(crate) fn mark(&mut self, stream: &D::Stream) -> Option<D::Event> {
        if !self.timed {
            return None;
        }
        match D::event_record_timed(stream) {
            Ok(Some(e)) => Some(e),
            Ok(None) => {
                self.timed = false;
                None
            }
            Err(e) => {
                self.errors += 1;
                tracing::debug!(error = %e, "GPU profile: timed event failed");
                None
            }
        }
    }

    /// Records a launch of `key` between events `start` and `end`.
    pub(crate) fn launch(&mut self, key: String, start: Option<D::Event>, end: Option<D::Event>) {
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                self.keys.push(key.clone());
                self.stats.push(KeyStats::default());
                self.index.insert(key, self.keys.len() - 1);
                self.keys.len() - 1
            }
        };
        self.stats[i].launches += 1;
        if let (Some(s), Some(e)) = (start, end) {
            self.pending.push((i, s, e));
        }
    }

    /// Records a graph's device span.
    pub(crate) fn span(&mut self, start: Option<D::Event>, end: Option<D::Event>) {
        if let (Some(s), Some(e)) = (start, end) {
            self.pending_spans.push((s, e));
        }
    }

    /// Counts a `synchronize` that waited `wait`, and reads the events of the work it waited
    /// for (all complete now).
    pub(crate) fn synchronized(&mut self, wait: Duration) {
        self.syncs += 1;
        self.sync_wait += wait;
        for (i, s, e) in std::mem::take(&mut self.pending) {
            match D::event_elapsed_ms(&s, &e) {
                Ok(ms) => self.stats[i].device_ms += f64::from(ms),
                Err(_) => self.errors += 1,
            }
        }
        for (s, e) in std::mem::take(&mut self.pending_spans) {
            match D::event_elapsed_ms(&s, &e) {
                Ok(ms) => {
                    self.span_ms += f64::from(ms);
                    self.spans += 1;
                }
                Err(_) => self.errors += 1,
            }
        }
    }

    /// The report: totals per graph, then one row per op and kernel, largest device time first.
    pub(crate) fn report(&self, device: &str) -> String {
        let mut out = String::new();
        let g = self.computes.max(1) as f64;
        let launches: u64 = self.stats.iter().map(|s| s.launches).sum();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let _ = writeln!(
            out,
            "GPU profile of {device} ({PROFILE_ENV}): {} graphs, {:.1} nodes and {:.1} launches \
             per graph",
            self.computes,
            self.nodes as f64 / g,
            launches as f64 / g
        );
        let phases: Vec<String> = PHASES
            .iter()
            .zip(self.host)
            .map(|(n, d)| format!("{n} {:.3}", ms(d) / g))
            .collect();
        let _ = writeln!(
            out,
            "host per graph: {:.3} ms ({}; ms), {:.2} µs per launch; synchronize waited {:.3} ms \
             per call ({} calls)",
            ms(self.host_total) / g,
            phases.join(", "),
            ms(self.host_total) * 1e3 / launches.max(1) as f64,
            ms(self.sync_wait) / self.syncs.max(1) as f64,
            self.syncs
        );
        let device_ms: f64 = self.stats.iter().map(|s| s.device_ms).sum();
        if !self.timed && device_ms == 0.0 {
            let _ = writeln!(out, "device times: the driver has no timed events");
        } else {
            let span = self.span_ms / self.spans.max(1) as f64;
            let _ = writeln!(
                out,
                "device per graph: span {span:.3} ms, kernels {:.3} ms ({:.0}% of the span busy)",
                device_ms / g,
                100.0 * (device_ms / g) / span.max(1e-9)
            );
        }
        if self.errors > 0 {
            let _ = writeln!(out, "({} timings could not be read)", self.errors);
        }
        let mut rows: Vec<usize> = (0..self.keys.len()).collect();
        rows.sort_by(|&a, &b| {
            let (x, y) = (&self.stats[a], &self.stats[b]);
            y.device_ms
                .total_cmp(&x.device_ms)
                .then(y.launches.cmp(&x.launches))
        });
        let _ = writeln!(
            out,
            "| op · kernel | launches per graph | µs each | ms per graph | share |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for i in rows {
            let s = self.stats[i];
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.2} | {:.3} | {:.1}% |",
                self.keys[i],
                s.launches as f64 / g,
                1e3 * s.device_ms / s.launches.max(1) as f64,
                s.device_ms / g,
                100.0 * s.device_ms / device_ms.max(1e-12)
            );
        }
        out
    }
}

/// Times `f` into `phase` when profiling.
pub(crate) fn timed<D: Driver, T>(
    profile: &mut Option<Profile<D>>,
    phase: Phase,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    match profile {
        None => f(),
        Some(p) => {
            let t0 = Instant::now();
            let r = f();
            p.phase(phase, t0.elapsed());
            r
        }
    }
}
