//! Host memory buffers: owned, 64-byte aligned, zero-initialised allocations, and read-only
//! wrappers of caller memory.
#![allow(unsafe_code)]

use crate::repack::{self, Regions};
use parking_lot::{Mutex, RwLock};
use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tessera_core::backend::HostMemory;
use tessera_core::error::check_range;
use tessera_core::{Buffer, BufferType, DType, Error, Result, TensorDesc};
use tessera_kernels::cpu::{Isa, PackLayout};

/// Alignment of CPU allocations and tensor offsets (one cache line, AVX-512 width).
pub const CPU_ALIGNMENT: usize = 64;

/// Buffers from this size on are anonymous memory maps rather than C heap blocks.
const MAP_FROM: usize = 1 << 20;

/// The CPU buffer type.
#[derive(Debug)]
pub struct CpuBufferType {
    name: String,
    /// Buffers keep whole quantized tensors written with `set_tensor` in the packed layout
    /// their type has at this kernel level.
    packs: Option<Isa>,
}

impl CpuBufferType {
    pub(crate) fn new(name: &str) -> CpuBufferType {
        CpuBufferType {
            name: name.to_string(),
            packs: None,
        }
    }

    /// The weight buffer type of device `name`: packs where the packed kernels pay.
    pub(crate) fn weights(name: &str) -> CpuBufferType {
        CpuBufferType {
            name: name.to_string(),
            packs: repack::enabled(),
        }
    }

    /// Whether buffers of this type store weights in a packed layout.
    pub fn packs(&self) -> bool {
        self.packs.is_some()
    }

    /// The packed layout buffers of this type store weights of `dtype` in (whole tensors of
    /// whole row groups written with `set_tensor`), or `None` if they keep ggml's layout.
    pub fn pack_layout(&self, dtype: DType) -> Option<PackLayout> {
        let isa = self.packs?;
        PackLayout::for_isa(isa, tessera_kernels::cpu::WeightType::of_dtype(dtype)?)
    }
}

impl BufferType for CpuBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        CPU_ALIGNMENT
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let mut b = CpuBuffer::alloc(&self.name, size)?;
        b.packs = self.packs;
        Ok(Arc::new(b))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

enum Memory {
    /// `ptr` is `base` rounded up to [`CPU_ALIGNMENT`]; `base` and `layout` are what was
    /// allocated.
    Owned {
        ptr: NonNull<u8>,
        base: NonNull<u8>,
        layout: Layout,
    },
    /// Large buffers: anonymous pages straight from the kernel (zero until written, resident
    /// only once touched, and given back whole on drop, where the C heap may keep freed blocks
    /// that a later model load then cannot use).
    Mapped {
        _map: memmap2::MmapMut,
        ptr: NonNull<u8>,
    },
    /// The owner plus the address and length read once at wrap time: an `AsRef` impl may return
    /// different slices on later calls, so the buffer never asks it again.
    Host { _owner: HostMemory, ptr: *const u8 },
}

/// Host memory a CPU stream computes on.
///
/// Host-side reads and writes take `access` exclusively; a queued graph holds it shared until it
/// has run, so a `write` after `compute` waits for the graph, as a stream would order it.
pub struct CpuBuffer {
    name: String,
    device: String,
    mem: Memory,
    size: usize,
    pub(crate) access: Arc<RwLock<()>>,
    packs: Option<Isa>,
    /// Set once a tensor has been packed: every access path checks `regions` only then.
    has_packed: AtomicBool,
    regions: Mutex<Regions>,
}

// SAFETY: the memory is owned (or kept alive by `HostMemory`, which is Send + Sync) and every
// access goes through `access` or through graph runs that hold it shared.
unsafe impl Send for CpuBuffer {}
// SAFETY: as for Send.
unsafe impl Sync for CpuBuffer {}

impl std::fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("name", &self.name)
            .field("size", &self.size)
            .finish()
    }
}

impl CpuBuffer {
    fn alloc(device: &str, size: usize) -> Result<CpuBuffer> {
        let oom = || Error::OutOfMemory {
            device: device.to_string(),
            requested: size,
        };
        if size >= MAP_FROM {
            // Page-aligned, so CPU_ALIGNMENT-aligned.
            let mut map = memmap2::MmapMut::map_anon(size).map_err(|_| oom())?;
            let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(oom)?;
            return Ok(CpuBuffer::owned(
                device,
                Memory::Mapped { _map: map, ptr },
                size,
            ));
        }
        // Zeroed memory keeps unwritten tensors defined. Asked with the allocator's own
        // alignment, a zeroed allocation is `calloc`, whose large blocks are fresh pages the
        // kernel zeroes on first touch: memory never written (the tail of a KV cache) is then
        // never resident, where an over-aligned request would be cleared byte by byte up front.
        // The extra bytes let the start be rounded up to CPU_ALIGNMENT.
        let padded = size.max(1).checked_add(CPU_ALIGNMENT).ok_or_else(oom)?;
        let layout = Layout::from_size_align(padded, 16).map_err(|_| oom())?;
        // SAFETY: the layout has non-zero size.
        let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(oom)?;
        let skip = (CPU_ALIGNMENT - base.as_ptr() as usize % CPU_ALIGNMENT) % CPU_ALIGNMENT;
        // SAFETY: skip < CPU_ALIGNMENT, so `base + skip .. + size` lies inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(skip)) };
        Ok(CpuBuffer::owned(
            device,
            Memory::Owned { ptr, base, layout },
            size,
        ))
    }

    fn owned(device: &str, mem: Memory, size: usize) -> CpuBuffer {
        CpuBuffer {
            name: format!("{device} buffer"),
            device: device.to_string(),
            mem,
            size,
            access: Arc::default(),
            packs: None,
            has_packed: AtomicBool::new(false),
            regions: Mutex::default(),
        }
    }

    pub(crate) fn from_host(device: &str, mem: HostMemory) -> CpuBuffer {
        let bytes: &[u8] = (*mem).as_ref();
        let (ptr, size) = (bytes.as_ptr(), bytes.len());
        CpuBuffer {
            name: format!("{device} host buffer"),
            device: device.to_string(),
            mem: Memory::Host { _owner: mem, ptr },
            size,
            access: Arc::default(),
            packs: None,
            has_packed: AtomicBool::new(false),
            regions: Mutex::default(),
        }
    }

    /// Name of the device that allocated the buffer.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// How many tensors the buffer holds in the packed weight layout.
    pub fn packed_tensors(&self) -> usize {
        self.regions.lock().len()
    }

    fn may_hold_packed(&self) -> bool {
        self.has_packed.load(Ordering::Acquire)
    }

    /// The packed layout of tensor `t` at `offset`, if it is stored packed (see
    /// [`Regions::holds`]).
    pub(crate) fn packed_at(&self, offset: usize, t: &TensorDesc) -> Option<repack::Packed> {
        if !self.may_hold_packed() {
            return None;
        }
        self.regions.lock().holds(offset, t)
    }

    /// Whether a packed tensor overlaps `offset..offset + len`.
    pub(crate) fn packed_within(&self, offset: usize, len: usize) -> bool {
        self.may_hold_packed()
            && !self
                .regions
                .lock()
                .overlapping(offset..offset + len)
                .is_empty()
    }

    /// Unpacks for good, in place, every packed tensor overlapping `offset..offset + len`:
    /// before a write there, or before a graph reads one of them with a kernel that expects
    /// ggml's layout. The caller has exclusive access to those bytes (the host lock, or stream
    /// order for stream jobs).
    fn unpack_for_write(&self, offset: usize, len: usize) {
        if !self.may_hold_packed() {
            return;
        }
        let mut regions = self.regions.lock();
        for (at, p) in regions.overlapping(offset..offset + len) {
            // SAFETY: a packed tensor lies inside the buffer (checked when it was packed), and
            // the caller has exclusive access.
            let mem = unsafe { std::slice::from_raw_parts_mut(self.base_ptr().add(at), p.len) };
            repack::unpack_in_place(&p, mem);
            regions.remove(at);
            tracing::debug!(buffer = %self.name, offset = at, "unpacked a repacked weight");
        }
    }

    /// Takes the packed tensors overlapping `offset..offset + len` out of the table and returns
    /// them, for a stream job queued now that writes there: it unpacks them in place first
    /// ([`CpuBuffer::unpack_taken`]), and every graph prepared from now on (which runs after the
    /// job) treats the bytes as ggml's, as they will be by then.
    pub(crate) fn take_packed(&self, offset: usize, len: usize) -> Vec<(usize, repack::Packed)> {
        if !self.may_hold_packed() {
            return Vec::new();
        }
        let mut regions = self.regions.lock();
        let taken = regions.overlapping(offset..offset + len);
        for (at, _) in &taken {
            regions.remove(*at);
        }
        taken
    }

    /// Puts back tensors [`CpuBuffer::take_packed`] took for a job that was never queued.
    pub(crate) fn restore_packed(&self, taken: &[(usize, repack::Packed)]) {
        let mut regions = self.regions.lock();
        for &(at, p) in taken {
            regions.insert(at, p);
        }
    }

    /// Unpacks tensors [`CpuBuffer::take_packed`] took, in place; called by the stream job that
    /// took them, ordered after every graph that read them packed.
    pub(crate) fn unpack_taken(&self, taken: &[(usize, repack::Packed)]) {
        for (at, p) in taken {
            // SAFETY: the range was a packed tensor inside the buffer; the stream orders this
            // job after the graphs reading it and before the host (which waits for the job's
            // read guard) or later graphs touch it.
            let mem = unsafe { std::slice::from_raw_parts_mut(self.base_ptr().add(*at), p.len) };
            repack::unpack_in_place(p, mem);
        }
    }

    /// Rewrites `dst`, just copied from `offset`, so that packed parts read as ggml's layout.
    fn unpack_for_read(&self, offset: usize, dst: &mut [u8]) {
        if !self.may_hold_packed() {
            return;
        }
        let regions = self.regions.lock();
        for (at, p) in regions.overlapping(offset..offset + dst.len()) {
            // SAFETY: as in `unpack_for_write`; read-only, with the caller's read access.
            let mem = unsafe { std::slice::from_raw_parts(self.base_ptr().add(at), p.len) };
            repack::unpack_into(at, &p, mem, offset, dst);
        }
    }

    /// Copies `len` bytes from `src` without taking either buffer's host lock: for stream jobs,
    /// which streams and events already order against the graphs using these bytes.
    pub(crate) fn stream_copy(
        src: &CpuBuffer,
        src_offset: usize,
        dst: &CpuBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_range(&src.name, src_offset, len, src.size)?;
        check_range(&dst.name, dst_offset, len, dst.size)?;
        if !dst.writable() {
            return Err(Error::ReadOnly(dst.name.clone()));
        }
        if src.packed_within(src_offset, len) {
            let mut staging = vec![0u8; len];
            src.stream_read(src_offset, &mut staging)?;
            return dst.stream_write(dst_offset, &staging);
        }
        dst.unpack_for_write(dst_offset, len);
        // SAFETY: both ranges are checked; `copy` tolerates overlap; the caller (a stream job) is
        // ordered after every graph that writes the source and before every graph that reads the
        // destination.
        unsafe {
            std::ptr::copy(
                src.base_ptr().add(src_offset),
                dst.base_ptr().add(dst_offset),
                len,
            )
        };
        Ok(())
    }

    /// Copies out of the buffer without the host lock (stream jobs, ordered by streams and events).
    pub(crate) fn stream_read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(&self.name, offset, dst.len(), self.size)?;
        // SAFETY: range checked; the caller is a stream job ordered after the writers of these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        self.unpack_for_read(offset, dst);
        Ok(())
    }

    /// Copies into the buffer without the host lock (stream jobs, ordered by streams and events).
    pub(crate) fn stream_write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(&self.name, offset, src.len(), self.size)?;
        if !self.writable() {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        self.unpack_for_write(offset, src.len());
        // SAFETY: range checked, memory writable; the caller is a stream job ordered before the
        // readers of these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Whether graphs may write into this buffer.
    pub(crate) fn writable(&self) -> bool {
        matches!(self.mem, Memory::Owned { .. } | Memory::Mapped { .. })
    }

    /// Base address for graph runs. Writing through it is allowed only for writable buffers.
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        match &self.mem {
            Memory::Owned { ptr, .. } | Memory::Mapped { ptr, .. } => ptr.as_ptr(),
            Memory::Host { ptr, .. } => *ptr as *mut u8,
        }
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        if let Memory::Owned { base, layout, .. } = self.mem {
            // SAFETY: allocated in `alloc` with this layout; graphs hold an Arc to the buffer while
            // they run, so no one uses the memory any more.
            unsafe { std::alloc::dealloc(base.as_ptr(), layout) }
        }
    }
}

impl Buffer for CpuBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn is_host(&self) -> bool {
        true
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(&self.name, offset, src.len(), self.size)?;
        if !self.writable() {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        let _g = self.access.write();
        self.unpack_for_write(offset, src.len());
        // SAFETY: range checked above; exclusive access held; `src` cannot alias owned memory
        // mutably borrowed elsewhere because all other access also takes `access`.
        unsafe { std::ptr::copy(src.as_ptr(), self.base_ptr().add(offset), src.len()) };
        Ok(())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(&self.name, offset, dst.len(), self.size)?;
        let _g = self.access.write();
        // SAFETY: range checked; exclusive access held while copying out.
        unsafe { std::ptr::copy(self.base_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        self.unpack_for_read(offset, dst);
        Ok(())
    }
    fn set_tensor(&self, t: &TensorDesc, offset: usize, src: &[u8]) -> Result<()> {
        let layout = self
            .packs
            .and_then(|isa| repack::layout_for(isa, t))
            .filter(|p| p.len == src.len());
        let Some(p) = layout else {
            return self.write(offset, src);
        };
        check_range(&self.name, offset, src.len(), self.size)?;
        if !self.writable() {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        let _g = self.access.write();
        self.unpack_for_write(offset, src.len());
        // SAFETY: range checked above; exclusive access held, so this is the only reference.
        let mem = unsafe { std::slice::from_raw_parts_mut(self.base_ptr().add(offset), src.len()) };
        // Group by group into place: no second copy of a large weight.
        repack::pack_into(&p, src, mem);
        self.regions.lock().insert(offset, p);
        self.has_packed.store(true, Ordering::Release);
        Ok(())
    }
    fn holds_device_layout(&self, offset: usize, len: usize) -> bool {
        self.packed_within(offset, len)
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(&self.name, offset, len, self.size)?;
        if !self.writable() {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        let _g = self.access.write();
        self.unpack_for_write(offset, len);
        // SAFETY: range checked; exclusive access held.
        unsafe { std::ptr::write_bytes(self.base_ptr().add(offset), value, len) };
        Ok(())
    }
    fn copy_from(
        &self,
        src: &dyn Buffer,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let Some(src) = src.as_any().downcast_ref::<CpuBuffer>() else {
            return Ok(false);
        };
        check_range(&src.name, src_offset, len, src.size)?;
        check_range(&self.name, dst_offset, len, self.size)?;
        if !self.writable() {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        if src.packed_within(src_offset, len) {
            let mut staging = vec![0u8; len];
            src.read(src_offset, &mut staging)?;
            self.write(dst_offset, &staging)?;
            return Ok(true);
        }
        if std::ptr::eq(src, self) {
            let _g = self.access.write();
            self.unpack_for_write(dst_offset, len);
            // SAFETY: both ranges checked inside this buffer; `copy` handles overlap.
            unsafe {
                std::ptr::copy(
                    self.base_ptr().add(src_offset),
                    self.base_ptr().add(dst_offset),
                    len,
                )
            };
        } else {
            // Lock in address order so two opposite copies cannot deadlock.
            let (first, second) = if (self as *const CpuBuffer) < (src as *const CpuBuffer) {
                (self, src)
            } else {
                (src, self)
            };
            let _a = first.access.write();
            let _b = second.access.write();
            self.unpack_for_write(dst_offset, len);
            // SAFETY: ranges checked; distinct allocations, both locked exclusively.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.base_ptr().add(src_offset),
                    self.base_ptr().add(dst_offset),
                    len,
                )
            };
        }
        Ok(true)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
