//! Planning (splits, copies, memory) and running of a scheduled graph.

use super::assign::{Assignment, assign, owner, pure_view, root};
use super::{Scheduler, Stream};
use crate::alloc::plan as plan_memory;
use crate::backend::{Bindings, Buffer, BufferType, Event};
use crate::error::{Error, Result};
use crate::graph::{Graph, label_of};
use crate::ops::{Op, OpKind};
use crate::tensor::{TensorDesc, TensorFlags, TensorId};
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A split input copied into the split's device before it runs.
pub(crate) struct CopyIn {
    /// The tensor as the graph names it.
    pub src: TensorId,
    /// Its copy in the split device's slot buffer.
    pub dst: TensorId,
    /// The device whose stream performs the copy (where `src` lives).
    pub from: usize,
    pub bytes: usize,
    /// The split that last wrote `src`, if a split did.
    pub writer: Option<usize>,
}

pub(crate) struct Split {
    pub device: usize,
    pub nodes: usize,
    pub graph: Graph,
    pub copies: Vec<CopyIn>,
    /// Earlier splits on other devices whose outputs this one reads in place.
    pub waits: Vec<usize>,
}

pub(crate) struct Planned {
    pub tensors: Arc<[TensorDesc]>,
    pub graph_len: usize,
    pub assignments: Vec<Assignment>,
    pub splits: Vec<Split>,
    /// Complete storage of every tensor, one per copy index.
    pub bindings: Vec<Bindings>,
    /// Tensors living in slot buffers (unbound inputs, copies) and their device.
    pub slot_home: HashMap<TensorId, usize>,
    pub peaks: Vec<usize>,
}

/// Marks tensors as placed elsewhere for a device's memory plan; never read or written.
#[derive(Debug)]
struct Elsewhere;

impl Buffer for Elsewhere {
    fn size(&self) -> usize {
        0
    }
    fn name(&self) -> String {
        "placeholder".into()
    }
    fn is_host(&self) -> bool {
        false
    }
    fn write(&self, _: usize, _: &[u8]) -> Result<()> {
        Err(Error::InvalidArgument("placeholder buffer written".into()))
    }
    fn read(&self, _: usize, _: &mut [u8]) -> Result<()> {
        Err(Error::InvalidArgument("placeholder buffer read".into()))
    }
    fn memset(&self, _: usize, _: usize, _: u8) -> Result<()> {
        Err(Error::InvalidArgument("placeholder buffer written".into()))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn computes(t: &TensorDesc) -> bool {
    !t.op.kind().is_view()
}

/// `nodes` (one split's computing nodes) with the pure views they read, directly or through
/// other views, in graph order. A device that plans its own memory gets these as nodes: a view
/// left as a leaf would have to be bound, and its storage belongs to the tensor it views.
fn with_views(tensors: &[TensorDesc], order: &[TensorId], nodes: &[TensorId]) -> Vec<TensorId> {
    let mut keep: HashSet<TensorId> = nodes.iter().copied().collect();
    let mut todo: Vec<TensorId> = nodes.to_vec();
    while let Some(n) = todo.pop() {
        let t = &tensors[n.index()];
        for r in t.srcs().chain(t.view.map(|v| v.src)) {
            if pure_view(&tensors[r.index()]) && keep.insert(r) {
                todo.push(r);
            }
        }
    }
    order.iter().copied().filter(|n| keep.contains(n)).collect()
}

fn aligned(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

pub(crate) fn plan(sched: &mut Scheduler, graph: &Graph, weights: &Bindings) -> Result<Planned> {
    let devices: Vec<_> = sched.streams.iter().map(|s| s.device.clone()).collect();
    let n_dev = devices.len();
    // Devices planning their own compute memory (meta devices): only what crosses their
    // splits' borders is bound here, in their plain io memory.
    let io: Vec<Option<Arc<dyn BufferType>>> = devices.iter().map(|d| d.io_buffer_type()).collect();
    let memory_type = |d: usize| io[d].clone().unwrap_or_else(|| devices[d].buffer_type());
    let assigned = assign(graph, weights, &devices, &sched.user)?;
    let orig = graph.tensors();
    let compute: Vec<TensorId> = graph
        .nodes()
        .iter()
        .copied()
        .filter(|&n| computes(&orig[n.index()]))
        .collect();

    // Where each unbound leaf lives: with its first consumer.
    let mut input_home: HashMap<TensorId, usize> = HashMap::new();
    for &n in &compute {
        let d = assigned[&n].device;
        for s in orig[n.index()].srcs() {
            let r = root(orig, s);
            if orig[r.index()].op.kind() == OpKind::None && weights.resolve(orig, r).is_err() {
                input_home.entry(r).or_insert(d);
            }
        }
    }
    let home = |t: TensorId| -> Result<usize> {
        let r = root(orig, t);
        if let Ok((buf, _)) = weights.resolve(orig, r) {
            return owner(&devices, buf.as_ref());
        }
        Ok(match assigned.get(&r) {
            Some(a) => a.device,
            None => input_home.get(&r).copied().unwrap_or(n_dev - 1),
        })
    };

    // Splits: runs of consecutive computing nodes on one device.
    let mut split_nodes: Vec<(usize, Vec<TensorId>)> = Vec::new();
    let mut split_of: HashMap<TensorId, usize> = HashMap::new();
    for &n in &compute {
        let d = assigned[&n].device;
        if split_nodes.last().is_none_or(|(sd, _)| *sd != d) {
            split_nodes.push((d, Vec::new()));
        }
        split_of.insert(n, split_nodes.len() - 1);
        if let Some(last) = split_nodes.last_mut() {
            last.1.push(n);
        }
    }
    // The splits writing each storage root, in split order: a node writes its own root, which
    // for CPY and SET_ROWS results is the root of their destination.
    let mut writers: HashMap<TensorId, Vec<usize>> = HashMap::new();
    for &n in &compute {
        let w = writers.entry(root(orig, n)).or_default();
        if w.last() != Some(&split_of[&n]) {
            w.push(split_of[&n]);
        }
    }
    // The latest split before `si` writing the storage of `t`.
    let writer = |t: TensorId, si: usize| -> Option<usize> {
        let ws = writers.get(&root(orig, t))?;
        ws[..ws.partition_point(|&w| w < si)].last().copied()
    };

    // Copies and in-place reads.
    let mut tensors: Vec<TensorDesc> = orig.to_vec();
    let mut slot_home: HashMap<TensorId, usize> = input_home.clone();
    let mut keep_alive: HashSet<TensorId> = HashSet::new();
    let mut copies_of: Vec<Vec<CopyIn>> = Vec::new();
    let mut waits_of: Vec<Vec<usize>> = Vec::new();
    // The splits that read each storage root in place from another device, in split order.
    let mut read_in_place: HashMap<TensorId, Vec<usize>> = HashMap::new();
    for (si, (d, nodes)) in split_nodes.iter().enumerate() {
        let d = *d;
        let mut copies: Vec<CopyIn> = Vec::new();
        let mut waits: Vec<usize> = Vec::new();
        // Write after read: wait for earlier in-place readers of what this split writes.
        for &n in nodes {
            for &s in read_in_place.get(&root(orig, n)).into_iter().flatten() {
                if split_nodes[s].0 != d && !waits.contains(&s) {
                    waits.push(s);
                }
            }
        }
        for &n in nodes {
            if let Some(v) = orig[n.index()].view {
                let h = home(v.src)?;
                if h != d {
                    return Err(Error::InvalidArgument(format!(
                        "{} on {} writes into {}'s memory",
                        label_of(orig, n),
                        devices[d].name(),
                        devices[h].name()
                    )));
                }
            }
            for i in 0..crate::tensor::MAX_SRC {
                let Some(t) = orig[n.index()].src[i] else {
                    continue;
                };
                let h = home(t)?;
                if h == d {
                    continue;
                }
                keep_alive.insert(root(orig, t));
                let reachable = match weights.resolve(orig, root(orig, t)) {
                    Ok((buf, _)) => devices[d].can_access(buf.as_ref()),
                    Err(_) => devices[d].supports_buffer_type(devices[h].buffer_type().as_ref()),
                };
                let w = writer(t, si);
                if sched.n_copies == 1 && reachable {
                    let readers = read_in_place.entry(root(orig, t)).or_default();
                    if readers.last() != Some(&si) {
                        readers.push(si);
                    }
                    if let Some(w) = w
                        && split_nodes[w].0 != d
                        && !waits.contains(&w)
                    {
                        waits.push(w);
                    }
                    continue;
                }
                let dst = match copies.iter().find(|c| c.src == t) {
                    Some(c) => c.dst,
                    None => {
                        let mut c = orig[t.index()].clone();
                        c.op = Op::None;
                        c.src = [None; crate::tensor::MAX_SRC];
                        c.view = None;
                        c.flags = TensorFlags::default();
                        c.name = format!("{}@{}", label_of(orig, t), devices[d].name());
                        let id = TensorId::from_index(tensors.len());
                        let bytes = c.nbytes();
                        tensors.push(c);
                        slot_home.insert(id, d);
                        copies.push(CopyIn {
                            src: t,
                            dst: id,
                            from: h,
                            bytes,
                            writer: w,
                        });
                        id
                    }
                };
                tensors[n.index()].src[i] = Some(dst);
            }
        }
        copies_of.push(copies);
        waits_of.push(waits);
    }
    let tensors: Arc<[TensorDesc]> = tensors.into();

    let referenced = |nodes: &[TensorId]| -> Vec<TensorId> {
        let set: HashSet<TensorId> = nodes.iter().copied().collect();
        let mut out = Vec::new();
        for &n in nodes {
            let t = &tensors[n.index()];
            for r in t.srcs().chain(t.view.map(|v| v.src)) {
                if !set.contains(&r) && !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        out
    };
    // What a self-planning device's splits must deliver into bound memory: nodes another split
    // reads (in place or through a copy) and the graph's outputs. Everything else stays the
    // device's own business.
    let mut exported: HashSet<TensorId> = HashSet::new();
    for (si, (_, nodes)) in split_nodes.iter().enumerate() {
        for &n in nodes {
            let t = &orig[n.index()];
            for s in t.srcs().chain(t.view.map(|v| v.src)) {
                let r = root(orig, s);
                if split_of.get(&r).is_some_and(|&w| w != si) {
                    exported.insert(r);
                }
            }
        }
    }
    // Outputs are read back through their storage: a view's root, or the destination a
    // CPY/SET_ROWS wrote (a weight or cache, bound already and so never exported here).
    for o in graph.outputs().iter().copied().chain(
        graph
            .nodes()
            .iter()
            .copied()
            .filter(|n| orig[n.index()].flags.output),
    ) {
        exported.insert(root(orig, o));
    }
    exported.retain(|n| assigned.get(n).is_some_and(|a| io[a.device].is_some()));
    let splits: Vec<Split> = split_nodes
        .iter()
        .zip(copies_of)
        .zip(waits_of)
        .map(|(((d, nodes), copies), waits)| {
            let (graph_nodes, outputs) = if io[*d].is_some() {
                let outputs = nodes
                    .iter()
                    .copied()
                    .filter(|n| exported.contains(n))
                    .collect();
                (with_views(&tensors, graph.nodes(), nodes), outputs)
            } else {
                (nodes.clone(), Vec::new())
            };
            Split {
                device: *d,
                nodes: nodes.len(),
                graph: Graph::from_parts(
                    tensors.clone(),
                    graph_nodes.clone(),
                    referenced(&graph_nodes),
                    outputs,
                ),
                copies,
                waits,
            }
        })
        .collect();

    // Memory: each device plans the nodes it computes; everything else is placed elsewhere.
    let elsewhere: Arc<dyn Buffer> = Arc::new(Elsewhere);
    let mut compute_offsets: Vec<Vec<(TensorId, usize)>> = Vec::new();
    let mut peaks = Vec::new();
    for (d, dev) in devices.iter().enumerate() {
        if let Some(io) = &io[d] {
            // The device's streams plan their splits' memory; bind only what they deliver.
            let (mut offsets, mut size) = (Vec::new(), 0usize);
            for &n in compute.iter().filter(|n| exported.contains(n)) {
                if assigned[&n].device == d {
                    let off = aligned(size, io.alignment());
                    size = off + io.alloc_size(&tensors[n.index()]);
                    offsets.push((n, off));
                }
            }
            peaks.push(size);
            compute_offsets.push(offsets);
            continue;
        }
        // View nodes compute nothing, but the planner must see them as nodes: a read through a
        // view is a read of its base at that point. Left out, they become leaves, and every
        // base a view reads would live to the end of the graph (ten times the memory on a
        // prompt graph).
        let nodes: Vec<TensorId> = graph
            .nodes()
            .iter()
            .copied()
            .filter(|n| match assigned.get(n) {
                Some(a) => a.device == d,
                None => {
                    let base = root(orig, *n);
                    !computes(&orig[n.index()]) && assigned.get(&base).is_none_or(|a| a.device == d)
                }
            })
            .collect();
        let mut pre = weights.clone();
        for (i, t) in tensors.iter().enumerate() {
            let id = TensorId::from_index(i);
            let mine = i < orig.len()
                && t.view.is_none()
                && assigned.get(&id).is_some_and(|a| a.device == d)
                && computes(t);
            if !mine && t.view.is_none() && weights.slot(id).is_none() {
                pre.bind(id, elsewhere.clone(), 0);
            }
        }
        let mut outputs: Vec<TensorId> = graph.outputs().to_vec();
        outputs.extend(keep_alive.iter().copied());
        let sub = Graph::from_parts(tensors.clone(), nodes.clone(), referenced(&nodes), outputs);
        let buft = dev.buffer_type();
        let p = plan_memory(&sub, &pre, buft.alignment(), &|t| buft.alloc_size(t))?;
        peaks.push(p.stats.peak);
        compute_offsets.push(p.offsets);
    }

    // Slot layouts: copies and unbound inputs, per device.
    let mut slot_offsets: Vec<Vec<(TensorId, usize)>> = vec![Vec::new(); n_dev];
    let mut slot_sizes = vec![0usize; n_dev];
    let mut slot_ids: Vec<(&TensorId, &usize)> = slot_home.iter().collect();
    slot_ids.sort();
    for (&id, &d) in slot_ids {
        let buft = memory_type(d);
        let off = aligned(slot_sizes[d], buft.alignment());
        slot_sizes[d] = off + buft.alloc_size(&tensors[id.index()]);
        slot_offsets[d].push((id, off));
    }

    // Buffers, reused when large enough.
    for d in 0..n_dev {
        let buft = memory_type(d);
        let s: &mut Stream = &mut sched.streams[d];
        if peaks[d] > 0 && s.compute_buf.as_ref().is_none_or(|b| b.size() < peaks[d]) {
            tracing::debug!(
                device = s.device.name(),
                bytes = peaks[d],
                "scheduler compute buffer"
            );
            s.compute_buf = Some(buft.alloc(peaks[d])?);
            sched.allocations += 1;
        }
        for slot in s.slot_bufs.iter_mut() {
            if slot_sizes[d] > 0 && slot.as_ref().is_none_or(|b| b.size() < slot_sizes[d]) {
                *slot = Some(buft.alloc(slot_sizes[d])?);
                sched.allocations += 1;
            }
        }
    }
    let mut bindings = Vec::with_capacity(sched.n_copies);
    for c in 0..sched.n_copies {
        let mut b = weights.clone();
        for d in 0..n_dev {
            if let Some(buf) = &sched.streams[d].compute_buf {
                for &(id, off) in &compute_offsets[d] {
                    b.bind(id, buf.clone(), off);
                }
            }
            if let Some(buf) = &sched.streams[d].slot_bufs[c] {
                for &(id, off) in &slot_offsets[d] {
                    b.bind(id, buf.clone(), off);
                }
            }
        }
        bindings.push(b);
    }
    let assignments = graph
        .nodes()
        .iter()
        .filter_map(|n| assigned.get(n).cloned())
        .collect();
    Ok(Planned {
        tensors,
        graph_len: orig.len(),
        assignments,
        splits,
        bindings,
        slot_home,
        peaks,
    })
}

/// Records an event on `s`, or synchronizes it where events are not supported.
fn mark(s: &mut Stream) -> Result<Option<Event>> {
    match s.backend.record_event()? {
        Some(e) => Ok(Some(e)),
        None => {
            s.backend.synchronize()?;
            Ok(None)
        }
    }
}

pub(crate) fn run(sched: &mut Scheduler, c: usize) -> Result<()> {
    let p = sched.planned.take().ok_or_else(|| {
        Error::InvalidArgument("no graph allocated: call alloc_graph first".into())
    })?;
    let result = run_planned(sched, &p, c);
    sched.planned = Some(p);
    result
}

fn run_planned(sched: &mut Scheduler, p: &Planned, c: usize) -> Result<()> {
    let n_dev = sched.streams.len();
    let used: Vec<bool> = (0..n_dev)
        .map(|d| p.splits.iter().any(|s| s.device == d))
        .collect();
    if sched.n_copies == 1 {
        // One set of buffers: a round may start only when every device finished the previous one.
        for d in (0..n_dev).filter(|&d| used[d]) {
            for o in (0..n_dev).filter(|&o| o != d) {
                if let Some(ev) = sched.round_events[o].clone() {
                    sched.streams[d].backend.wait_event(&ev)?;
                }
            }
        }
    }
    let mut done: Vec<Option<Event>> = vec![None; p.splits.len()];
    let mut slot_free = vec![vec![false; n_dev]; n_dev];
    for (si, s) in p.splits.iter().enumerate() {
        let d = s.device;
        for cp in &s.copies {
            let a = cp.from;
            if !slot_free[a][d] {
                if let Some(ev) = sched.streams[d].slot_events[c].clone() {
                    sched.streams[a].backend.wait_event(&ev)?;
                }
                slot_free[a][d] = true;
            }
            if let Some(w) = cp.writer
                && p.splits[w].device != a
                && let Some(ev) = done[w].clone()
            {
                sched.streams[a].backend.wait_event(&ev)?;
            }
            let (sb, so) = p.bindings[c].resolve(&p.tensors, cp.src)?;
            let (db, doff) = p.bindings[c].resolve(&p.tensors, cp.dst)?;
            sched.streams[a]
                .backend
                .copy_async(&sb, so, &db, doff, cp.bytes)?;
            if let Some(ev) = mark(&mut sched.streams[a])? {
                sched.streams[d].backend.wait_event(&ev)?;
            }
        }
        for &w in &s.waits {
            if let Some(ev) = done[w].clone() {
                sched.streams[d].backend.wait_event(&ev)?;
            }
        }
        sched.streams[d].backend.compute(&s.graph, &p.bindings[c])?;
        done[si] = mark(&mut sched.streams[d])?;
    }
    for d in (0..n_dev).filter(|&d| used[d]) {
        let ev = mark(&mut sched.streams[d])?;
        sched.streams[d].slot_events[c] = ev.clone();
        sched.round_events[d] = ev;
    }
    Ok(())
}

impl Planned {
    pub(crate) fn describe(&self, streams: &[Stream]) -> String {
        let mut s = String::new();
        for a in &self.assignments {
            let t = &self.tensors[a.node.index()];
            s += &format!(
                "{:<48} {:<15} -> {:<6} ({})\n",
                label_of(&self.tensors, a.node),
                t.op.name(),
                streams[a.device].device.name(),
                a.cause
            );
        }
        for (i, sp) in self.splits.iter().enumerate() {
            let copied: Vec<String> = sp
                .copies
                .iter()
                .map(|c| label_of(&self.tensors, c.src))
                .collect();
            s += &format!(
                "split {i}: {} ({} nodes); copied inputs: [{}]; waits on splits {:?}\n",
                streams[sp.device].device.name(),
                sp.nodes,
                copied.join(", "),
                sp.waits
            );
        }
        s
    }
}
