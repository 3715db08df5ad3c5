//! [`GgufBytes`]: the bytes of a GGUF file, memory-mapped or owned. The one place in `gguf` with
//! `unsafe` (creating the map and releasing its pages; see the module doc of [the crate] for
//! the contract).

use std::fs::File;
use std::io;

/// The bytes of a GGUF file: a read-only memory map of the file, or an owned buffer (files read
/// from memory, and empty files, which cannot be mapped).
///
/// Shared as `Arc<GgufBytes>`; it implements `AsRef<[u8]>`, so an `Arc` of it is a
/// [`tessera_core::backend::HostMemory`] that devices can wrap without copying.
#[derive(Debug)]
pub struct GgufBytes(Storage);

#[derive(Debug)]
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl GgufBytes {
    /// Maps `file` read-only.
    ///
    /// # Errors
    /// The operating system refuses the map.
    #[allow(unsafe_code)] // The only unsafe of `gguf`: see the module doc of the crate.
    pub(crate) fn map(file: &File) -> io::Result<GgufBytes> {
        if file.metadata()?.len() == 0 {
            return Ok(GgufBytes(Storage::Owned(Vec::new())));
        }
        // SAFETY: the map is read-only and private to this value, and is only exposed as `&[u8]`
        // borrowed from it. `Mmap::map` is unsafe because another process may truncate or rewrite
        // the file while it is mapped; the module doc of the crate makes "do not modify a GGUF
        // file while it is open" the caller's contract, as every mmap-based model loader does.
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(GgufBytes(Storage::Mapped(map)))
    }

    /// Owned bytes.
    pub fn from_vec(bytes: Vec<u8>) -> GgufBytes {
        GgufBytes(Storage::Owned(bytes))
    }

    /// Whether the bytes are a memory map (rather than an owned buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Storage::Mapped(_))
    }

    /// Tells the kernel that the mapped bytes `offset..offset + len` are not needed for now, so
    /// pages a loader has copied from stop counting towards the process's resident memory (they
    /// are read from the file again if touched). Pages only partly inside the range are kept.
    /// No-op for owned bytes; failures are ignored (this only affects memory use).
    pub fn release(&self, offset: usize, len: usize) {
        let Storage::Mapped(m) = &self.0 else {
            return;
        };
        // Apple Silicon's pages are 16 KiB; elsewhere 4 KiB (a kernel with larger pages refuses
        // a range that does not start on one, which only means nothing is released).
        const PAGE: usize = if cfg!(all(target_vendor = "apple", target_arch = "aarch64")) {
            16384
        } else {
            4096
        };
        let start = offset.div_ceil(PAGE) * PAGE;
        let end = (offset.saturating_add(len)).min(m.len()) / PAGE * PAGE;
        #[cfg(unix)]
        if start < end {
            #[allow(unsafe_code)]
            // SAFETY: the map is private and read-only and never written, so dropping its pages
            // loses nothing: the next access reads the same bytes from the file (the file must
            // not change while open, the contract of `map`). Borrowed slices stay valid
            // addresses.
            unsafe {
                let _ = m.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                );
            }
        }
        #[cfg(not(unix))]
        let _ = (m, start, end);
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

impl AsRef<[u8]> for GgufBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}
