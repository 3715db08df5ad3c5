//! [`InFlight`]: the buffers queued work uses, kept alive until the event recorded after that
//! work completes (a stream's graphs and copies, a comm's reductions).

use std::collections::VecDeque;
use std::sync::Arc;
use tessera_core::{Buffer, Result};

/// Batches of buffers (`T`) that queued work uses, each with the event(s) `E` recorded after the
/// work; a batch is dropped once its event has completed.
#[derive(Debug)]
pub struct InFlight<E, T = Arc<dyn Buffer>> {
    queue: VecDeque<(E, Vec<T>)>,
}

impl<E, T> Default for InFlight<E, T> {
    fn default() -> Self {
        InFlight {
            queue: VecDeque::new(),
        }
    }
}

impl<E, T> InFlight<E, T> {
    /// Empty.
    pub fn new() -> InFlight<E, T> {
        InFlight::default()
    }

    /// Drops the batches whose event `done` says has completed, then keeps `buffers` (if any)
    /// until the event `record` makes now completes.
    ///
    /// # Errors
    /// `record`'s error.
    pub fn hold(
        &mut self,
        buffers: Vec<T>,
        done: impl Fn(&E) -> bool,
        record: impl FnOnce() -> Result<E>,
    ) -> Result<()> {
        while self.queue.front().is_some_and(|(e, _)| done(e)) {
            self.queue.pop_front();
        }
        if !buffers.is_empty() {
            self.queue.push_back((record()?, buffers));
        }
        Ok(())
    }

    /// Drops every batch (after the stream has been synchronized).
    pub fn clear(&mut self) {
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_drop_when_done() {
        let mut f: InFlight<bool, Arc<u8>> = InFlight::new();
        let buf = Arc::new(7u8);
        f.hold(vec![buf.clone()], |d| *d, || Ok(false)).unwrap();
        f.hold(vec![], |d| *d, || Ok(true)).unwrap();
        assert_eq!(Arc::strong_count(&buf), 2);
        f.clear();
        assert_eq!(Arc::strong_count(&buf), 1);
    }
}
