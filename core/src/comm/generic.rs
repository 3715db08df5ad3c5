use crate::backend::{Backend, Bindings, Buffer, Device, Event};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Context;
use std::sync::Arc;

/// One device's part of an all-reduce: `len` f32 values at byte `offset` of `buffer`.
#[derive(Clone, Debug)]
pub struct CommSlice {
    /// The device's buffer holding its addend (and, afterwards, the sum).
    pub buffer: Arc<dyn Buffer>,
    /// Byte offset of the first value.
    pub offset: usize,
    /// Number of f32 values (the same on every device).
    pub len: usize,
    /// Whether the slice holds an addend; a non-contributing slice counts as zeros whatever its
    /// memory holds.
    pub contributes: bool,
}

/// How values travel between devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Exact f32 exchanges.
    F32,
    /// Values rounded to bf16 (round to nearest even) before each exchange, halving the bytes;
    /// sums stay f32 on every device.
    Bf16,
}

/// Which exchange pattern to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// Recursive doubling for latency-bound sizes, the ring from `threshold_bytes · (N − 1)` bytes
    /// on (each extra device adds two ring steps, so the crossover grows with N).
    Auto {
        /// Slice bytes per peer device from which the ring is used.
        threshold_bytes: usize,
    },
    /// Recursive doubling (with fold and copy-back for non-power-of-two N).
    RecursiveDoubling,
    /// Ring reduce-scatter then all-gather.
    Ring,
}

/// The path a call took, for logs and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReducePath {
    /// One device: nothing to exchange.
    Single,
    /// Recursive doubling.
    RecursiveDoubling,
    /// Ring reduce-scatter + all-gather.
    Ring,
}

impl std::fmt::Display for ReducePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReducePath::Single => "single device",
            ReducePath::RecursiveDoubling => "generic recursive doubling",
            ReducePath::Ring => "generic ring",
        })
    }
}

/// The generic all-reduce over a fixed set of devices, with its scratch memory.
pub struct AllReduce {
    devices: Vec<Arc<dyn Device>>,
    wire: Wire,
    algorithm: Algorithm,
    /// Per device: scratch for incoming data (one region per step), a zero buffer, and a wire
    /// staging buffer for bf16.
    scratch: Vec<Option<Arc<dyn Buffer>>>,
    zeros: Vec<Option<Arc<dyn Buffer>>>,
    staging: Vec<Option<Arc<dyn Buffer>>>,
    /// Per device: completes when the device has finished reading its scratch in the last call.
    last_use: Vec<Option<Event>>,
}

impl std::fmt::Debug for AllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllReduce")
            .field("devices", &self.devices.len())
            .field("wire", &self.wire)
            .finish()
    }
}

/// Default ring threshold per peer device. Measured with `tessera bench-allreduce --algo
/// doubling|ring` on CPU devices: the ring wins from between 256 KiB and 1 MiB at N = 2, and from
/// between 1 and 4 MiB at N = 4.
pub const DEFAULT_RING_THRESHOLD: usize = 512 * 1024;

impl AllReduce {
    /// An all-reduce over `devices` (one slice per device in every call).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty device list.
    pub fn new(devices: &[Arc<dyn Device>], wire: Wire, algorithm: Algorithm) -> Result<AllReduce> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "an all-reduce needs at least one device".into(),
            ));
        }
        let n = devices.len();
        Ok(AllReduce {
            devices: devices.to_vec(),
            wire,
            algorithm,
            scratch: vec![None; n],
            zeros: vec![None; n],
            staging: vec![None; n],
            last_use: vec![None; n],
        })
    }

    /// Sums the slices in place; `streams[j]` is a stream of device `j`. Returns before the work
    /// has run (it is queued on the streams).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count mismatch, unequal lengths or a slice outside its
    /// buffer; stream and allocation errors.
    pub fn run(
        &mut self,
        streams: &mut [Box<dyn Backend>],
        slices: &[CommSlice],
    ) -> Result<ReducePath> {
        let n = self.devices.len();
        if streams.len() != n || slices.len() != n {
            return Err(Error::InvalidArgument(format!(
                "all-reduce over {n} devices got {} streams and {} slices",
                streams.len(),
                slices.len()
            )));
        }
        let len = slices[0].len;
        for (j, s) in slices.iter().enumerate() {
            if s.len != len {
                return Err(Error::InvalidArgument(format!(
                    "slice {j} has {} values, slice 0 has {len}",
                    s.len
                )));
            }
            crate::error::check_range(
                &format!("all-reduce slice {j} in {}", s.buffer.name()),
                s.offset,
                len * 4,
                s.buffer.size(),
            )?;
        }
        if len == 0 {
            return Ok(ReducePath::Single);
        }
        for (j, s) in slices.iter().enumerate() {
            if !s.contributes {
                let fresh = self.zeros[j].as_ref().is_none_or(|b| b.size() < len * 4);
                let z = ensure(&mut self.zeros[j], &self.devices[j], len * 4)?;
                if fresh {
                    // `alloc` zeroes only where cheap; this buffer must hold zeros everywhere.
                    z.memset(0, z.size(), 0)?;
                }
                streams[j].copy_async(&z, 0, &s.buffer, s.offset, len * 4)?;
            }
        }
        if n == 1 {
            return Ok(ReducePath::Single);
        }
        let path = match self.algorithm {
            Algorithm::RecursiveDoubling => ReducePath::RecursiveDoubling,
            Algorithm::Ring => ReducePath::Ring,
            Algorithm::Auto { threshold_bytes } => {
                if len * 4 >= threshold_bytes.saturating_mul(n - 1) && len >= n {
                    ReducePath::Ring
                } else {
                    ReducePath::RecursiveDoubling
                }
            }
        };
        match path {
            ReducePath::Ring => self.ring(streams, slices)?,
            _ => self.doubling(streams, slices)?,
        }
        Ok(path)
    }

    fn wire_bytes(&self, values: usize) -> usize {
        values * if self.wire == Wire::Bf16 { 2 } else { 4 }
    }

    /// Sends `count` values starting at value `first` of `from`'s slice into `to`'s scratch at
    /// byte `dst_off`: on `from`'s stream, after `to` has finished with its scratch; `to` waits
    /// for the copy.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        streams: &mut [Box<dyn Backend>],
        slices: &[CommSlice],
        from: usize,
        to: usize,
        first: usize,
        count: usize,
        dst_off: usize,
    ) -> Result<()> {
        if let Some(ev) = self.last_use[to].clone() {
            streams[from].wait_event(&ev)?;
        }
        let scratch = self.scratch[to]
            .clone()
            .ok_or_else(|| Error::InvalidArgument("all-reduce scratch missing".into()))?;
        let src = &slices[from];
        if self.wire == Wire::Bf16 {
            let staging = ensure(&mut self.staging[from], &self.devices[from], src.len * 2)?;
            convert(
                &mut *streams[from],
                &src.buffer,
                src.offset + first * 4,
                DType::F32,
                &staging,
                first * 2,
                DType::BF16,
                count,
            )?;
            streams[from].copy_async(&staging, first * 2, &scratch, dst_off, count * 2)?;
        } else {
            streams[from].copy_async(
                &src.buffer,
                src.offset + first * 4,
                &scratch,
                dst_off,
                count * 4,
            )?;
        }
        if let Some(ev) = streams[from].record_event()? {
            streams[to].wait_event(&ev)?;
        } else {
            streams[from].synchronize()?;
        }
        Ok(())
    }

    /// Queues `slice[first..first+count] += scratch[off..]` on device `j`.
    fn add(
        &mut self,
        streams: &mut [Box<dyn Backend>],
        slices: &[CommSlice],
        j: usize,
        first: usize,
        count: usize,
        off: usize,
    ) -> Result<()> {
        let scratch = self.scratch[j]
            .clone()
            .ok_or_else(|| Error::InvalidArgument("all-reduce scratch missing".into()))?;
        let wire = if self.wire == Wire::Bf16 {
            DType::BF16
        } else {
            DType::F32
        };
        queue_add(
            &mut *streams[j],
            (&slices[j].buffer, slices[j].offset + first * 4),
            (&scratch, off),
            wire,
            count,
        )
    }

    /// Marks the end of device `j`'s reads of its scratch in this call.
    fn mark_used(&mut self, streams: &mut [Box<dyn Backend>], j: usize) -> Result<()> {
        self.last_use[j] = streams[j].record_event()?;
        if self.last_use[j].is_none() {
            streams[j].synchronize()?;
        }
        Ok(())
    }

    fn doubling(&mut self, streams: &mut [Box<dyn Backend>], slices: &[CommSlice]) -> Result<()> {
        let n = self.devices.len();
        let len = slices[0].len;
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros()); // largest power of two ≤ n
        let steps = p2.trailing_zeros() as usize + 1; // butterfly steps + the fold
        let region = self.wire_bytes(len);
        for j in 0..n {
            ensure(&mut self.scratch[j], &self.devices[j], region * steps)?;
        }
        // Fold: devices ≥ p2 add into j − p2 (scratch region 0).
        for j in p2..n {
            self.push(streams, slices, j, j - p2, 0, len, 0)?;
        }
        for j in p2..n {
            self.add(streams, slices, j - p2, 0, len, 0)?;
        }
        // Butterfly among the first p2 devices, one scratch region per step. All pushes of a step
        // are queued before its adds, so each pair adds the same two operands.
        let mut off = p2 / 2;
        let mut step = 1;
        while off >= 1 {
            for j in 0..p2 {
                self.push(streams, slices, j, j ^ off, 0, len, step * region)?;
            }
            for j in 0..p2 {
                if self.wire == Wire::Bf16 {
                    // The partner adds our bf16-rounded value; round our own operand the same way
                    // so both sides add identical operands and end bit-identical.
                    let staging = self.staging[j].clone().ok_or_else(|| {
                        Error::InvalidArgument("all-reduce staging missing".into())
                    })?;
                    convert(
                        &mut *streams[j],
                        &staging,
                        0,
                        DType::BF16,
                        &slices[j].buffer,
                        slices[j].offset,
                        DType::F32,
                        len,
                    )?;
                }
                self.add(streams, slices, j, 0, len, step * region)?;
            }
            off /= 2;
            step += 1;
        }
        // Copy back to the folded devices (straight into their slices, in f32: exact).
        for j in p2..n {
            let src = &slices[j - p2];
            let dst = &slices[j];
            // The destination's own fold push read its slice earlier on its own stream; make the
            // writer wait for that before overwriting.
            if let Some(ev) = streams[j].record_event()? {
                streams[j - p2].wait_event(&ev)?;
            }
            streams[j - p2].copy_async(
                &src.buffer,
                src.offset,
                &dst.buffer,
                dst.offset,
                len * 4,
            )?;
            if let Some(ev) = streams[j - p2].record_event()? {
                streams[j].wait_event(&ev)?;
            }
        }
        for j in 0..n {
            self.mark_used(streams, j)?;
        }
        Ok(())
    }

    fn ring(&mut self, streams: &mut [Box<dyn Backend>], slices: &[CommSlice]) -> Result<()> {
        let n = self.devices.len();
        let len = slices[0].len;
        let chunk = len.div_ceil(n);
        let range = |c: usize| -> (usize, usize) {
            let first = (c * chunk).min(len);
            (first, (first + chunk).min(len) - first)
        };
        let region = self.wire_bytes(chunk);
        for j in 0..n {
            ensure(&mut self.scratch[j], &self.devices[j], region * (n - 1))?;
        }
        // Reduce-scatter: at step s device j sends chunk (j − s) mod n to j + 1, which adds it.
        for s in 0..n - 1 {
            for j in 0..n {
                let (first, count) = range((j + n - s) % n);
                if count > 0 {
                    self.push(streams, slices, j, (j + 1) % n, first, count, s * region)?;
                }
            }
            for j in 0..n {
                let (first, count) = range((j + n - 1 - s) % n);
                if count > 0 {
                    self.add(streams, slices, j, first, count, s * region)?;
                }
            }
        }
        // Device j now holds the full sum of chunk (j + 1) mod n. Before anyone overwrites a
        // peer's chunk, every device must be done with the reduce-scatter.
        let mut done = Vec::with_capacity(n);
        for j in 0..n {
            done.push(streams[j].record_event()?);
            if done[j].is_none() {
                streams[j].synchronize()?;
            }
        }
        for (j, stream) in streams.iter_mut().enumerate() {
            for (o, ev) in done.iter().enumerate() {
                if o != j
                    && let Some(ev) = ev
                {
                    stream.wait_event(ev)?;
                }
            }
        }
        // All-gather: at step s device j forwards chunk (j + 1 − s) mod n to j + 1, exactly.
        for s in 0..n - 1 {
            for j in 0..n {
                let (first, count) = range((j + 1 + n - s) % n);
                if count == 0 {
                    continue;
                }
                let (src, dst) = (&slices[j], &slices[(j + 1) % n]);
                streams[j].copy_async(
                    &src.buffer,
                    src.offset + first * 4,
                    &dst.buffer,
                    dst.offset + first * 4,
                    count * 4,
                )?;
            }
            // Step s + 1 forwards what step s delivered: the receiver's stream must see it.
            for j in 0..n {
                if let Some(ev) = streams[j].record_event()? {
                    streams[(j + 1) % n].wait_event(&ev)?;
                } else {
                    streams[j].synchronize()?;
                }
            }
        }
        for j in 0..n {
            self.mark_used(streams, j)?;
        }
        Ok(())
    }
}

fn ensure(
    slot: &mut Option<Arc<dyn Buffer>>,
    dev: &Arc<dyn Device>,
    bytes: usize,
) -> Result<Arc<dyn Buffer>> {
    match slot {
        Some(b) if b.size() >= bytes => Ok(b.clone()),
        _ => {
            let b = dev.buffer_type().alloc(bytes.max(1))?;
            *slot = Some(b.clone());
            Ok(b)
        }
    }
}

/// Values per row of the reduction graphs: rows keep per-thread scratch small and give every
/// thread of a device a share of the work.
const ROW: usize = 4096;

/// `[ROW, count / ROW]` and the `[count % ROW]` tail, as (shape, first value) pairs.
fn row_blocks(count: usize) -> Vec<([usize; 2], usize)> {
    let mut v = Vec::new();
    if count >= ROW {
        v.push(([ROW, count / ROW], 0));
    }
    if !count.is_multiple_of(ROW) {
        v.push(([count % ROW, 1], count / ROW * ROW));
    }
    v
}

/// Queues `x += s` over `count` values (`s` in the wire dtype) on `stream`.
fn queue_add(
    stream: &mut dyn Backend,
    x: (&Arc<dyn Buffer>, usize),
    s: (&Arc<dyn Buffer>, usize),
    wire: DType,
    count: usize,
) -> Result<()> {
    let mut ctx = Context::new();
    let mut bind = Bindings::new();
    let mut outs = Vec::new();
    for (shape, first) in row_blocks(count) {
        let xt = ctx.new_named("allreduce.x", DType::F32, shape)?;
        let st = ctx.new_named("allreduce.recv", wire, shape)?;
        let yt = ctx.add(xt, st)?;
        bind.bind(xt, x.0.clone(), x.1 + first * 4);
        bind.bind(yt, x.0.clone(), x.1 + first * 4);
        bind.bind(st, s.0.clone(), s.1 + first * wire.type_size());
        outs.push(yt);
    }
    stream.compute(&ctx.build_forward_multi(&outs)?, &bind)
}

/// Queues a dtype conversion of `count` values between two buffers on `stream`.
#[allow(clippy::too_many_arguments)]
fn convert(
    stream: &mut dyn Backend,
    src: &Arc<dyn Buffer>,
    src_off: usize,
    from: DType,
    dst: &Arc<dyn Buffer>,
    dst_off: usize,
    to: DType,
    count: usize,
) -> Result<()> {
    let mut ctx = Context::new();
    let mut bind = Bindings::new();
    let mut outs = Vec::new();
    for (shape, first) in row_blocks(count) {
        let a = ctx.new_tensor(from, shape)?;
        let b = ctx.new_tensor(to, shape)?;
        outs.push(ctx.cpy(a, b)?);
        bind.bind(a, src.clone(), src_off + first * from.type_size());
        bind.bind(b, dst.clone(), dst_off + first * to.type_size());
    }
    stream.compute(&ctx.build_forward_multi(&outs)?, &bind)
}
