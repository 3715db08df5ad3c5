//! Programs: what a GPU stream planned for a graph (each node's kernel, grid, block and
//! arguments), kept and reused while the same graph runs on the same memory, so a decode step
//! whose graph and buffers did not change costs no support check, planning or kernel lookup.
//! Where the driver can record launches ([`Driver::record_begin`]: CUDA graphs, Vulkan command
//! buffers, hipGraph), a program that runs a second time is recorded and from then on replayed
//! as one submission.
//!
//! A program is valid for a graph while it is the very same graph ([`Graph::is_same`]:
//! descriptors never change once built) and every tensor has the same device address in the
//! same live buffers; kernel arguments are only those descriptors and addresses, and the
//! per-step values (positions, masks, token ids) are tensor contents, read when the kernels run.
// Recording queues the planned launches (`Driver::launch` is an `unsafe fn`).
#![allow(unsafe_code)]

use crate::driver::Driver;
use crate::plan::StreamMem;
use std::any::Any;
use std::sync::{Arc, Weak};
use tessera_core::{Buffer, Graph, TensorId};
use tessera_kernels::gpu::launch::Launch;

/// The environment variable that turns recording and replay off (`0`), for comparisons.
pub const REPLAY_ENV: &str = "TESSERA_GPU_REPLAY";

/// Programs a stream keeps; the least recently used goes first. A tensor-parallel step runs a
/// few sub-graphs per layer on each stream, so this covers a 32-layer model's step twice over.
const MAX_PROGRAMS: usize = 128;

/// Runs of a program before it is recorded: a graph that runs once (most prompts) is not worth
/// the recording, which costs about as much as launching it.
const RECORD_AFTER: u32 = 1;

/// One planned graph.
pub(crate) struct Program<D: Driver> {
    graph: Graph,
    ptrs: Vec<u64>,
    mem: StreamMem,
    /// The buffers the addresses point into, not kept alive: a freed buffer ends the program.
    buffers: Vec<Weak<dyn Buffer>>,
    /// Node, kernel and launch, in graph order.
    pub(crate) launches: Vec<(TensorId, D::Function, Launch)>,
    replay: Option<Box<dyn Any + Send + Sync>>,
    runs: u32,
    /// Recording failed or is not worth it: launch each node.
    no_replay: bool,
    last_used: u64,
}

impl<D: Driver> std::fmt::Debug for Program<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("launches", &self.launches.len())
            .field("runs", &self.runs)
            .field("recorded", &self.replay.is_some())
            .finish()
    }
}

/// What a stream's programs did, for tests and the profile.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProgramStats {
    /// Programs planned (each a graph's support check and planning).
    pub planned: u64,
    /// Runs that reused a planned program.
    pub reused: u64,
    /// Programs recorded for replay.
    pub recorded: u64,
    /// Runs that replayed a recording (one launch each).
    pub replayed: u64,
}

/// A stream's programs.
pub(crate) struct Programs<D: Driver> {
    list: Vec<Program<D>>,
    clock: u64,
    replay_on: bool,
    pub(crate) stats: ProgramStats,
}

impl<D: Driver> std::fmt::Debug for Programs<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Programs")
            .field("programs", &self.list.len())
            .field("replay", &self.replay_on)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<D: Driver> Programs<D> {
    /// No programs; replay unless [`REPLAY_ENV`] is `0`.
    pub(crate) fn new() -> Programs<D> {
        let replay_on = tessera_core::settings::var(REPLAY_ENV).is_none_or(|v| v.trim() != "0");
        Programs {
            list: Vec::new(),
            clock: 0,
            replay_on,
            stats: ProgramStats::default(),
        }
    }

    /// Drops every program (and its recording).
    pub(crate) fn clear(&mut self) {
        self.list.clear();
    }

    /// Turns recording and replay on or off (recordings already made are dropped when off).
    pub(crate) fn set_replay(&mut self, on: bool) {
        self.replay_on = on;
        if !on {
            for p in &mut self.list {
                p.replay = None;
            }
        }
    }

    /// The program planned for `graph` with these addresses and buffers, if one is kept.
    pub(crate) fn find(
        &mut self,
        graph: &Graph,
        ptrs: &[u64],
        mem: StreamMem,
        held: &[Arc<dyn Buffer>],
    ) -> Option<usize> {
        let i = self.list.iter().position(|p| {
            p.mem == mem
                && p.ptrs == ptrs
                && p.buffers.len() == held.len()
                && p.buffers
                    .iter()
                    .zip(held)
                    .all(|(w, h)| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(h)))
                && p.graph.is_same(graph)
        })?;
        self.clock += 1;
        self.list[i].last_used = self.clock;
        self.stats.reused += 1;
        Some(i)
    }

    /// Keeps a newly planned program (dropping the least recently used, and programs whose
    /// buffers are gone, when full) and returns its index.
    pub(crate) fn insert(
        &mut self,
        graph: &Graph,
        ptrs: Vec<u64>,
        mem: StreamMem,
        held: &[Arc<dyn Buffer>],
        launches: Vec<(TensorId, D::Function, Launch)>,
    ) -> usize {
        if self.list.len() >= MAX_PROGRAMS {
            self.list
                .retain(|p| p.buffers.iter().all(|w| w.strong_count() > 0));
        }
        if self.list.len() >= MAX_PROGRAMS
            && let Some(oldest) = (0..self.list.len()).min_by_key(|&i| self.list[i].last_used)
        {
            self.list.swap_remove(oldest);
        }
        self.clock += 1;
        self.stats.planned += 1;
        self.list.push(Program {
            graph: graph.clone(),
            ptrs,
            mem,
            buffers: held.iter().map(Arc::downgrade).collect(),
            launches,
            replay: None,
            runs: 0,
            no_replay: false,
            last_used: self.clock,
        });
        self.list.len() - 1
    }

    /// Program `i`.
    pub(crate) fn get(&self, i: usize) -> &Program<D> {
        &self.list[i]
    }

    /// Counts a run of program `i` and, when replay is on and the program has run before,
    /// records it on `stream` (once). Returns whether the run should replay the recording.
    pub(crate) fn prepare_run(&mut self, i: usize, stream: &D::Stream) -> bool {
        let replay_on = self.replay_on;
        let p = &mut self.list[i];
        p.runs = p.runs.saturating_add(1);
        if !replay_on || p.no_replay {
            return false;
        }
        if p.replay.is_none() && p.runs > RECORD_AFTER {
            match record::<D>(stream, &p.launches) {
                Ok(Some(r)) => {
                    p.replay = Some(r);
                    self.stats.recorded += 1;
                    tracing::debug!(
                        backend = D::NAME,
                        launches = p.launches.len(),
                        "GPU program recorded for replay"
                    );
                }
                Ok(None) => p.no_replay = true,
                Err(e) => {
                    // The program still runs, launch by launch.
                    tracing::warn!(backend = D::NAME, error = %e, "recording a GPU program failed; launching its nodes one by one");
                    p.no_replay = true;
                }
            }
        }
        p.replay.is_some()
    }

    /// Queues program `i`'s recording on `stream`.
    pub(crate) fn replay(&mut self, i: usize, stream: &D::Stream) -> tessera_core::Result<()> {
        let Some(r) = self.list[i].replay.as_deref() else {
            return Err(tessera_core::Error::InvalidArgument(
                "replay of a program that was not recorded".into(),
            ));
        };
        D::replay(stream, r)?;
        self.stats.replayed += 1;
        Ok(())
    }
}

/// Records `launches` on `stream`: `Ok(None)` when the driver cannot record.
fn record<D: Driver>(
    stream: &D::Stream,
    launches: &[(TensorId, D::Function, Launch)],
) -> tessera_core::Result<Option<Box<dyn Any + Send + Sync>>> {
    if !D::record_begin(stream)? {
        return Ok(None);
    }
    for (_, f, l) in launches {
        // SAFETY: the launches were planned for this stream's graph and bindings, whose buffers
        // the caller holds (see `GpuStream::compute`); recording queues nothing.
        if let Err(e) = unsafe { D::launch(stream, f, l) } {
            // End the recording so the stream works again; what it recorded is dropped.
            let _ = D::record_end(stream);
            return Err(e);
        }
    }
    D::record_end(stream).map(Some)
}
