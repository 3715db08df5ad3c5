//! Per-device CPU fallback inside a meta device: where one device's backend cannot run an op of
//! its slice of a split graph, that device's slice of the op runs on the host CPU instead of the
//! whole split being refused. The device's sub-graph is cut into runs of nodes it supports and
//! runs of nodes it does not; before a host run, the device's stream is drained and every
//! tensor the run touches (followed to the tensor owning the memory) is copied to host memory;
//! after it, what the run wrote is copied back. Correct for any op the CPU supports, at the
//! price of two copies per run: meant for the odd missing kernel, not for a whole model.
//! (llama.cpp tried this inside its meta backend and reverted it; here it is per device and
//! planned once, with the fallen-back ops reported by `describe()`.)

use crate::backend::{Backend, Bindings, Buffer, Device};
use crate::error::Result;
use crate::graph::Graph;
use crate::tensor::{TensorDesc, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A tensor copied to the host for a run: (host buffer, device buffer, offset there).
type Copied = (Arc<dyn Buffer>, Arc<dyn Buffer>, usize);

/// The host CPU side of a device's fallback: a CPU device and its stream.
pub(crate) struct HostFallback {
    cpu: Arc<dyn Device>,
    stream: Box<dyn Backend>,
}

impl std::fmt::Debug for HostFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostFallback")
            .field("cpu", &self.cpu.name())
            .finish()
    }
}

/// The tensor owning `id`'s memory (views followed to their base).
fn root(tensors: &[TensorDesc], mut id: TensorId) -> TensorId {
    while let Some(v) = tensors[id.index()].view_of() {
        id = v.src;
    }
    id
}

impl HostFallback {
    pub(crate) fn new(cpu: Arc<dyn Device>, opts: &crate::BackendOptions) -> Result<HostFallback> {
        let stream = cpu.init_backend(opts)?;
        Ok(HostFallback { cpu, stream })
    }

    /// Runs `sub` with device stream `dev`, except the nodes in `on_host`, which run here.
    pub(crate) fn run(
        &mut self,
        dev: &mut dyn Backend,
        sub: &Graph,
        bindings: &Bindings,
        on_host: &HashSet<TensorId>,
    ) -> Result<()> {
        let nodes = sub.nodes();
        let tensors = sub.tensors_arc();
        let mut i = 0;
        while i < nodes.len() {
            let host = on_host.contains(&nodes[i]);
            let mut j = i;
            while j < nodes.len() && on_host.contains(&nodes[j]) == host {
                j += 1;
            }
            let run = &nodes[i..j];
            if host {
                dev.synchronize()?;
                self.run_on_host(tensors, run, bindings)?;
            } else {
                let g = Graph::from_parts(
                    tensors.clone(),
                    run.to_vec(),
                    crate::graph::referenced(tensors, run),
                    Vec::new(),
                );
                dev.compute(&g, bindings)?;
            }
            i = j;
        }
        Ok(())
    }

    fn run_on_host(
        &mut self,
        tensors: &Arc<[TensorDesc]>,
        run: &[TensorId],
        bindings: &Bindings,
    ) -> Result<()> {
        // Every tensor the run reads or writes, by the tensor owning the memory.
        let mut roots: Vec<TensorId> = Vec::new();
        let mut seen = HashSet::new();
        for &n in run {
            let t = &tensors[n.index()];
            for r in t
                .srcs()
                .chain(t.view_of().map(|v| v.src))
                .chain(std::iter::once(n))
            {
                let r = root(tensors, r);
                if seen.insert(r) {
                    roots.push(r);
                }
            }
        }
        let buft = self.cpu.buffer_type();
        let mut host = Bindings::new();
        let mut placed: HashMap<TensorId, Copied> = HashMap::new();
        for &r in &roots {
            let len = tensors[r.index()].nbytes();
            let (dbuf, doff) = bindings.resolve(tensors, r)?;
            let hbuf = buft.alloc(len.max(1))?;
            if len > 0 {
                let mut bytes = vec![0u8; len];
                dbuf.read(doff, &mut bytes)?;
                hbuf.write(0, &bytes)?;
            }
            host.bind(r, hbuf.clone(), 0);
            placed.insert(r, (hbuf, dbuf, doff));
        }
        let g = Graph::from_parts(
            tensors.clone(),
            run.to_vec(),
            crate::graph::referenced(tensors, run),
            Vec::new(),
        );
        self.stream.compute(&g, &host)?;
        self.stream.synchronize()?;
        // What the run wrote goes back to the device: each node's memory (a node writing into a
        // view, e.g. a cache row, wrote its base).
        let mut back = HashSet::new();
        for &n in run {
            let r = root(tensors, n);
            if !back.insert(r) {
                continue;
            }
            let len = tensors[r.index()].nbytes();
            if len == 0 {
                continue;
            }
            let (hbuf, dbuf, doff) = &placed[&r];
            let mut bytes = vec![0u8; len];
            hbuf.read(0, &mut bytes)?;
            dbuf.write(*doff, &bytes)?;
        }
        Ok(())
    }
}
