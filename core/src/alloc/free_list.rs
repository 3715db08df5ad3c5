//! A best-fit allocator of offsets in one address range that grows at its end (ggml's dynamic
//! tallocr).
//!
//! Invariants: free blocks are sorted by offset, never adjacent to each other (they are coalesced
//! on free) and never touch the top (a block reaching it is merged into the unbounded space above
//! it). Every size is rounded up to the alignment, so every offset handed out is aligned.

/// A free range `[offset, offset + size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) offset: usize,
    pub(crate) size: usize,
}

impl Block {
    fn end(self) -> usize {
        self.offset + self.size
    }
}

/// Free blocks below `top`; everything from `top` up is free too.
#[derive(Clone, Debug)]
pub(crate) struct FreeList {
    alignment: usize,
    free: Vec<Block>,
    top: usize,
    peak: usize,
}

impl FreeList {
    /// An empty range; `alignment` 0 counts as 1.
    pub(crate) fn new(alignment: usize) -> FreeList {
        FreeList {
            alignment: alignment.max(1),
            free: Vec::new(),
            top: 0,
            peak: 0,
        }
    }

    /// `size` rounded up to the alignment, `None` on overflow.
    pub(crate) fn aligned(&self, size: usize) -> Option<usize> {
        size.checked_next_multiple_of(self.alignment)
    }

    /// The highest end any allocation reached.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }

    /// The free blocks below the top, by offset (for tests and debugging).
    #[cfg(test)]
    pub(crate) fn blocks(&self) -> &[Block] {
        &self.free
    }

    /// Offset of `size` bytes (rounded up to the alignment): the smallest free block that fits
    /// (the lowest of equals), else the top. `None` if the range would overflow `usize`.
    pub(crate) fn alloc(&mut self, size: usize) -> Option<usize> {
        let size = self.aligned(size)?;
        let mut best: Option<usize> = None;
        for (i, b) in self.free.iter().enumerate() {
            if b.size >= size && best.is_none_or(|j| b.size < self.free[j].size) {
                best = Some(i);
            }
        }
        if let Some(i) = best {
            let b = &mut self.free[i];
            let offset = b.offset;
            if b.size == size {
                self.free.remove(i);
            } else {
                b.offset += size;
                b.size -= size;
            }
            return Some(offset);
        }
        let offset = self.top;
        self.top = offset.checked_add(size)?;
        self.peak = self.peak.max(self.top);
        Some(offset)
    }

    /// Returns `[offset, offset + size)` (size rounded as in [`FreeList::alloc`]), merging it with
    /// free neighbours and with the top.
    pub(crate) fn free(&mut self, offset: usize, size: usize) {
        let Some(size) = self.aligned(size) else {
            return;
        };
        if size == 0 {
            return;
        }
        let block = Block { offset, size };
        debug_assert!(
            block.end() <= self.top,
            "freeing {block:?} above top {}",
            self.top
        );
        if block.end() == self.top {
            self.top = offset;
            if let Some(last) = self.free.last().copied()
                && last.end() == self.top
            {
                self.top = last.offset;
                self.free.pop();
            }
            return;
        }
        let i = self.free.partition_point(|b| b.offset < offset);
        debug_assert!(i == 0 || self.free[i - 1].end() <= offset, "double free");
        debug_assert!(
            i == self.free.len() || block.end() <= self.free[i].offset,
            "double free"
        );
        let merge_prev = i > 0 && self.free[i - 1].end() == offset;
        let merge_next = i < self.free.len() && self.free[i].offset == block.end();
        match (merge_prev, merge_next) {
            (true, true) => {
                let next = self.free.remove(i);
                self.free[i - 1].size += size + next.size;
            }
            (true, false) => self.free[i - 1].size += size,
            (false, true) => {
                self.free[i].offset = offset;
                self.free[i].size += size;
            }
            (false, false) => self.free.insert(i, block),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_at_the_top_and_aligns() {
        let mut fl = FreeList::new(32);
        assert_eq!(fl.alloc(10), Some(0));
        assert_eq!(fl.alloc(40), Some(32));
        assert_eq!(fl.alloc(32), Some(96));
        assert_eq!(fl.peak(), 128);
        assert!(fl.blocks().is_empty());
    }

    #[test]
    fn best_fit_picks_the_smallest_block_that_fits() {
        let mut fl = FreeList::new(1);
        let offs: Vec<_> = [100, 10, 50, 10, 30, 10]
            .iter()
            .map(|&s| fl.alloc(s).unwrap())
            .collect();
        assert_eq!(offs, [0, 100, 110, 160, 170, 200]);
        fl.free(0, 100); // [0, 100)
        fl.free(110, 50); // [110, 160)
        fl.free(170, 30); // [170, 200)
        assert_eq!(
            fl.alloc(40),
            Some(110),
            "50 is the best fit for 40, not 100"
        );
        assert_eq!(fl.alloc(25), Some(170), "30 is the best fit for 25");
        assert_eq!(fl.alloc(60), Some(0));
        assert_eq!(fl.alloc(200), Some(210), "nothing fits: grow");
        assert_eq!(fl.peak(), 410);
        assert_eq!(
            fl.blocks(),
            &[
                Block {
                    offset: 60,
                    size: 40
                },
                Block {
                    offset: 150,
                    size: 10
                },
                Block {
                    offset: 195,
                    size: 5
                }
            ]
        );
    }

    #[test]
    fn free_coalesces_neighbours_and_the_top() {
        let mut fl = FreeList::new(1);
        for _ in 0..5 {
            fl.alloc(10).unwrap();
        }
        fl.free(10, 10);
        fl.free(30, 10);
        assert_eq!(fl.blocks().len(), 2);
        fl.free(20, 10); // joins both neighbours
        assert_eq!(
            fl.blocks(),
            &[Block {
                offset: 10,
                size: 30
            }]
        );
        fl.free(40, 10); // reaches the top: the top drops to 10
        assert!(fl.blocks().is_empty());
        assert_eq!(
            fl.alloc(35),
            Some(10),
            "the freed space is reused from the top"
        );
        assert_eq!(fl.peak(), 50, "peak never drops");
        fl.free(0, 10);
        assert_eq!(
            fl.blocks(),
            &[Block {
                offset: 0,
                size: 10
            }]
        );
        fl.free(10, 35);
        assert!(fl.blocks().is_empty());
        assert_eq!(fl.alloc(50), Some(0));
    }

    #[test]
    fn overflow_is_reported() {
        let mut fl = FreeList::new(16);
        assert_eq!(fl.alloc(usize::MAX), None);
        assert_eq!(fl.alloc(usize::MAX / 2 + 1), Some(0));
        assert_eq!(fl.alloc(usize::MAX / 2 + 1), None);
    }
}
