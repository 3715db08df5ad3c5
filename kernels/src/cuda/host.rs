//! Stream-side host logic shared by the GPU backends that run the CUDA C kernels (CUDA, HIP):
//! keeping the buffers of queued work alive ([`InFlight`]) and reading the stream status words
//! kernels report errors in ([`status_error`]).

use std::collections::VecDeque;
use std::sync::Arc;
use tessera_core::{Buffer, Error, Result};

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

/// The error in a stream's status words (`int[2]`: error code, value; see `raise_error` in
/// `common.cuh`), if a kernel raised one on `device`.
pub fn status_error(device: &str, words: [u8; 8]) -> Option<Error> {
    let code = i32::from_ne_bytes([words[0], words[1], words[2], words[3]]);
    let value = i32::from_ne_bytes([words[4], words[5], words[6], words[7]]);
    // Codes as `ERR_*` in the kernels: 1 in common.cuh, 2 in moe.cu.
    (code != 0).then(|| Error::Compute {
        device: device.to_string(),
        reason: match code {
            2 => format!("MUL_MAT_ID/ADD_ID: expert id {value} is out of range"),
            _ => format!("GET_ROWS/SET_ROWS: row index {value} is out of range"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words_decode() {
        assert!(status_error("GPU0", [0; 8]).is_none());
        let mut w = [0u8; 8];
        w[..4].copy_from_slice(&1i32.to_ne_bytes());
        w[4..].copy_from_slice(&(-3i32).to_ne_bytes());
        let e = status_error("GPU0", w).unwrap().to_string();
        assert!(
            e.contains("GPU0") && e.contains("-3") && e.contains("row"),
            "{e}"
        );
        w[..4].copy_from_slice(&2i32.to_ne_bytes());
        let e = status_error("GPU0", w).unwrap().to_string();
        assert!(e.contains("expert id -3"), "{e}");
    }

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
