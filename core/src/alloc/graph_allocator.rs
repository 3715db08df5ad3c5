//! [`GraphAllocator`]: one compute buffer, re-planned for every graph and grown only when a plan
//! does not fit.

use super::planner::{Plan, PlanStats, plan};
use crate::backend::{Bindings, Buffer, BufferType};
use crate::error::{Error, Result};
use crate::graph::Graph;
use std::sync::Arc;

/// Plans and owns the compute buffer of graphs: offsets for every intermediate tensor, memory of
/// tensors whose last use has passed reused, in-place ops where legal.
///
/// The buffer only grows: a graph whose plan fits the current buffer reuses it, so running graphs
/// of the same shape again allocates nothing. Bindings handed out keep their buffer alive, so
/// growing never invalidates them; but the bindings of two graphs share memory, so a graph's
/// results must be read before the next graph planned here runs.
#[derive(Debug)]
pub struct GraphAllocator {
    buft: Arc<dyn BufferType>,
    buffer: Option<Arc<dyn Buffer>>,
    allocations: usize,
    last: Option<PlanStats>,
}

impl GraphAllocator {
    /// An allocator of compute buffers of `buft`; allocates nothing yet.
    pub fn new(buft: Arc<dyn BufferType>) -> GraphAllocator {
        GraphAllocator {
            buft,
            buffer: None,
            allocations: 0,
            last: None,
        }
    }

    /// The buffer type compute buffers come from.
    pub fn buffer_type(&self) -> &Arc<dyn BufferType> {
        &self.buft
    }

    /// Plans `graph` (tensors already placed in `pre` are left alone) and makes sure the compute
    /// buffer is at least the plan's peak; returns that peak in bytes. Does not bind anything.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the peak exceeds the buffer type's maximum size, allocation
    /// errors, and the errors of [`plan`].
    pub fn reserve(&mut self, graph: &Graph, pre: &Bindings) -> Result<usize> {
        let p = self.plan(graph, pre)?;
        self.ensure(p.stats.peak, !p.offsets.is_empty())?;
        Ok(p.stats.peak)
    }

    /// Plans `graph` and returns bindings for every tensor the graph touches that is neither a
    /// view nor placed in `pre` (merged with `pre`'s entries, so the result can be passed straight
    /// to [`crate::Backend::compute`]). Reuses the current buffer when the plan fits; otherwise
    /// allocates a bigger one.
    ///
    /// # Errors
    /// As [`GraphAllocator::reserve`].
    pub fn alloc_graph(&mut self, graph: &Graph, pre: &Bindings) -> Result<Bindings> {
        let p = self.plan(graph, pre)?;
        self.ensure(p.stats.peak, !p.offsets.is_empty())?;
        let mut bindings = pre.clone();
        if let Some(buffer) = &self.buffer {
            for &(id, offset) in &p.offsets {
                bindings.bind(id, buffer.clone(), offset);
            }
        }
        Ok(bindings)
    }

    /// Buffers allocated so far.
    pub fn allocation_count(&self) -> usize {
        self.allocations
    }

    /// Current compute buffer size (0 before the first plan that needed memory).
    pub fn buffer_size(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.size())
    }

    /// The current compute buffer, if one was allocated.
    pub fn buffer(&self) -> Option<&Arc<dyn Buffer>> {
        self.buffer.as_ref()
    }

    /// Statistics of the last plan (also set when that plan did not fit the buffer type).
    pub fn last_plan(&self) -> Option<&PlanStats> {
        self.last.as_ref()
    }

    fn plan(&mut self, graph: &Graph, pre: &Bindings) -> Result<Plan> {
        let buft = self.buft.clone();
        let p = plan(graph, pre, buft.alignment(), &|t| buft.alloc_size(t))?;
        self.last = Some(p.stats.clone());
        if p.stats.peak > buft.max_size() {
            return Err(Error::OutOfMemory {
                device: buft.name().to_string(),
                requested: p.stats.peak,
            });
        }
        Ok(p)
    }

    /// Makes the buffer at least `size` bytes; with `needed` (the plan binds something, maybe only
    /// zero-byte tensors) a buffer exists afterwards even when `size` is 0.
    fn ensure(&mut self, size: usize, needed: bool) -> Result<()> {
        let have = self.buffer.as_ref().map(|b| b.size());
        if have.is_some_and(|h| h >= size) || (have.is_none() && !needed) {
            return Ok(());
        }
        let size = size.max(self.buft.alignment()).max(1);
        tracing::debug!(
            buffer_type = self.buft.name(),
            old_bytes = have.unwrap_or(0),
            new_bytes = size,
            "graph allocator: allocating a compute buffer"
        );
        let buffer = self.buft.alloc(size)?;
        if buffer.size() < size {
            return Err(Error::InvalidArgument(format!(
                "{} returned a buffer of {} bytes for {size} requested",
                self.buft.name(),
                buffer.size()
            )));
        }
        self.buffer = Some(buffer);
        self.allocations += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::test_support::{VecBufferType, llama, params_in_pre};
    use crate::dtype::DType;
    use crate::graph::Context;
    use std::sync::atomic::Ordering;

    fn allocator(max: usize) -> (GraphAllocator, Arc<VecBufferType>) {
        let buft = Arc::new(VecBufferType::with_max(64, max));
        (GraphAllocator::new(buft.clone()), buft)
    }

    #[test]
    fn same_shape_reuses_the_buffer_and_bigger_grows_it() {
        let (mut ga, buft) = allocator(usize::MAX);
        assert_eq!((ga.allocation_count(), ga.buffer_size()), (0, 0));
        assert!(ga.last_plan().is_none());
        let (ctx, g) = llama(2, 128, 4, 8);
        let pre = params_in_pre(&ctx);
        let b1 = ga.alloc_graph(&g, &pre).unwrap();
        b1.check_graph(&g).unwrap();
        let size = ga.buffer_size();
        assert_eq!(
            (ga.allocation_count(), size),
            (1, ga.last_plan().unwrap().peak)
        );
        // The same graph again, and one of the same shape from a fresh context.
        let b2 = ga.alloc_graph(&g, &pre).unwrap();
        let (ctx2, g2) = llama(2, 128, 4, 8);
        let pre2 = params_in_pre(&ctx2);
        ga.alloc_graph(&g2, &pre2)
            .unwrap()
            .check_graph(&g2)
            .unwrap();
        assert_eq!((ga.allocation_count(), ga.buffer_size()), (1, size));
        assert_eq!(buft.allocs.load(Ordering::Relaxed), 1);
        for &id in g.nodes().iter().chain(g.leafs()) {
            let (r1, r2) = (b1.resolve(g.tensors(), id), b2.resolve(g.tensors(), id));
            assert_eq!(r1.unwrap().1, r2.unwrap().1, "same placement of {id}");
        }
        // Weights keep their pre placement.
        let w = g
            .leafs()
            .iter()
            .find(|&&l| g.tensors()[l.index()].flags().param)
            .unwrap();
        assert!(Arc::ptr_eq(
            &b1.slot(*w).unwrap().buffer,
            &pre.slot(*w).unwrap().buffer
        ));
        // More tokens: a bigger plan, a new buffer; then the small graph fits again.
        let (ctx3, g3) = llama(2, 128, 4, 32);
        let pre3 = params_in_pre(&ctx3);
        ga.alloc_graph(&g3, &pre3)
            .unwrap()
            .check_graph(&g3)
            .unwrap();
        assert_eq!(ga.allocation_count(), 2);
        assert!(ga.buffer_size() > size);
        ga.alloc_graph(&g, &pre).unwrap().check_graph(&g).unwrap();
        assert_eq!(ga.allocation_count(), 2);
        assert_eq!(ga.last_plan().unwrap().peak, size);
    }

    #[test]
    fn reserve_sizes_the_buffer_without_binding() {
        let (mut ga, _) = allocator(usize::MAX);
        let (ctx, big) = llama(1, 128, 4, 64);
        let pre = params_in_pre(&ctx);
        let peak = ga.reserve(&big, &pre).unwrap();
        assert_eq!((ga.buffer_size(), ga.allocation_count()), (peak, 1));
        let (ctx, small) = llama(3, 128, 4, 16);
        let pre = params_in_pre(&ctx);
        assert!(ga.reserve(&small, &pre).unwrap() < peak);
        ga.alloc_graph(&small, &pre)
            .unwrap()
            .check_graph(&small)
            .unwrap();
        assert_eq!(ga.allocation_count(), 1);
    }

    #[test]
    fn too_big_for_the_buffer_type_is_out_of_memory() {
        let (mut ga, buft) = allocator(4096);
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [1024, 2]).unwrap();
        let y = ctx.sqr(x).unwrap();
        let g = ctx.build_forward(y).unwrap();
        match ga.alloc_graph(&g, &Bindings::new()) {
            Err(Error::OutOfMemory { device, requested }) => {
                assert_eq!((device.as_str(), requested), ("VEC", 8192));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(ga.last_plan().unwrap().peak, 8192);
        assert_eq!(
            (ga.allocation_count(), buft.allocs.load(Ordering::Relaxed)),
            (0, 0)
        );
    }

    #[test]
    fn graphs_needing_no_memory_allocate_nothing() {
        let (mut ga, _) = allocator(usize::MAX);
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [16]).unwrap();
        ctx.set_input(x).unwrap();
        let y = ctx.sqr(x).unwrap();
        let g = ctx.build_forward(y).unwrap();
        let buft: Arc<dyn BufferType> = Arc::new(VecBufferType::new(16));
        let all = buft.alloc_tensors(&ctx).unwrap();
        let b = ga.alloc_graph(&g, all.bindings()).unwrap();
        b.check_graph(&g).unwrap();
        assert_eq!((ga.allocation_count(), ga.buffer_size()), (0, 0));
        assert!(ga.buffer().is_none());
    }
}
