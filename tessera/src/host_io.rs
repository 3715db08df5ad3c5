//! [`HostIo`]: a tensor's values to and from host memory in its own element type, or as f32
//! converted to and from any type.

use crate::{DType, Error, Result, TensorBuffer, TensorId};

/// Element types a tensor holds one per value, with their [`DType`].
pub trait HostElement: Copy + bytemuck::Pod {
    /// The tensor dtype this type reads and writes.
    const DTYPE: DType;
}

impl HostElement for f32 {
    const DTYPE: DType = DType::F32;
}
impl HostElement for i32 {
    const DTYPE: DType = DType::I32;
}
impl HostElement for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl HostElement for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

/// Typed reads and writes of the tensors of a [`TensorBuffer`].
///
/// ```
/// use tessera::{Context, DType, HostIo};
/// # fn main() -> tessera::Result<()> {
/// let dev = tessera::registry().device("CPU")?;
/// let mut ctx = Context::new();
/// let q = ctx.new_tensor(DType::Q8_0, [64, 2])?;
/// let h = ctx.new_tensor(DType::F16, [4])?;
/// let buf = dev.buffer_type().alloc_tensors(&ctx)?;
/// buf.write_f32(q, &vec![0.25; 128])?; // quantized on the way in
/// assert!(buf.read_f32(q)?.iter().all(|v| (v - 0.25).abs() < 1e-3));
/// buf.write(h, &[tessera::half::f16::ONE; 4])?; // in its own type
/// assert_eq!(buf.read::<tessera::half::f16>(h)?, vec![tessera::half::f16::ONE; 4]);
/// assert!(buf.write(h, &[1.0f32; 4]).is_err()); // f32 values for an F16 tensor: a typed error
/// # Ok(()) }
/// ```
pub trait HostIo {
    /// Writes a whole tensor from values of its own element type.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the tensor when its dtype is not `T`'s; a size
    /// mismatch; buffer errors.
    fn write<T: HostElement>(&self, id: TensorId, values: &[T]) -> Result<()>;
    /// Reads a whole tensor as values of its own element type.
    ///
    /// # Errors
    /// As [`HostIo::write`].
    fn read<T: HostElement>(&self, id: TensorId) -> Result<Vec<T>>;
    /// Writes a whole tensor of any dtype from f32 values, converting (and quantizing) them as
    /// [`crate::encode_f32`] does.
    ///
    /// # Errors
    /// A value count that is not the tensor's; buffer errors.
    fn write_f32(&self, id: TensorId, values: &[f32]) -> Result<()>;
    /// Reads a whole tensor of any dtype as f32 values ([`crate::decode_to_f32`]).
    ///
    /// # Errors
    /// Buffer errors.
    fn read_f32(&self, id: TensorId) -> Result<Vec<f32>>;
}

fn check(buf: &TensorBuffer, id: TensorId, want: DType) -> Result<usize> {
    let t = buf.desc(id)?;
    if t.dtype() != want {
        return Err(Error::InvalidArgument(format!(
            "tensor '{}' is {}, not {want}",
            t.name(),
            t.dtype()
        )));
    }
    Ok(t.nbytes())
}

impl HostIo for TensorBuffer {
    fn write<T: HostElement>(&self, id: TensorId, values: &[T]) -> Result<()> {
        check(self, id, T::DTYPE)?;
        self.set(id, bytemuck::cast_slice(values))
    }

    fn read<T: HostElement>(&self, id: TensorId) -> Result<Vec<T>> {
        let n = check(self, id, T::DTYPE)?;
        let mut out = vec![T::zeroed(); n / std::mem::size_of::<T>()];
        self.get(id, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    fn write_f32(&self, id: TensorId, values: &[f32]) -> Result<()> {
        let t = self.desc(id)?;
        if values.len() != t.nelements() {
            return Err(Error::InvalidArgument(format!(
                "{} values for tensor '{}' of {} elements",
                values.len(),
                t.name(),
                t.nelements()
            )));
        }
        self.set(id, &crate::encode_f32(t.dtype(), values)?)
    }

    fn read_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        let t = self.desc(id)?;
        let mut bytes = vec![0u8; t.nbytes()];
        self.get(id, &mut bytes)?;
        crate::decode_to_f32(t.dtype(), &bytes)
    }
}
