//! A kernel launch as the CUDA C kernels' signatures take it — the ABI between a launch planner
//! and the kernels: [`Launch`] (kernel name, grid, block, arguments), [`Arg`] (one argument of
//! the C signature), [`tensor_arg`] (`struct Tensor`) and [`ArgSlots`] (a driver's
//! `kernelParams`). The planner that makes launches from graph nodes is the GPU runtime's
//! (`tessera_gpu::plan`).

use super::codes::type_code;
use tessera_core::TensorDesc;

/// One kernel argument, as the C signature takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A `struct Tensor` by value (80 bytes, see `common.cuh`).
    Tensor([u8; 80]),
    /// An `int`.
    I32(i32),
    /// A `long long`.
    I64(i64),
    /// A `float`.
    F32(f32),
    /// A `double`.
    F64(f64),
    /// A device pointer.
    Ptr(u64),
}

impl Arg {
    /// The argument's bytes in host order, as a driver copies them.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Arg::Tensor(b) => b.to_vec(),
            Arg::I32(v) => v.to_ne_bytes().to_vec(),
            Arg::I64(v) => v.to_ne_bytes().to_vec(),
            Arg::F32(v) => v.to_ne_bytes().to_vec(),
            Arg::F64(v) => v.to_ne_bytes().to_vec(),
            Arg::Ptr(v) => v.to_ne_bytes().to_vec(),
        }
    }
}

/// Kernel arguments as a driver's `kernelParams` takes them (`cuLaunchKernel`,
/// `hipModuleLaunchKernel`): each argument in its own 8-byte aligned slot.
#[derive(Debug, Default)]
pub struct ArgSlots {
    slots: Vec<Box<[u64]>>,
}

impl ArgSlots {
    /// An empty list.
    pub fn new() -> ArgSlots {
        ArgSlots::default()
    }
    /// The arguments of a planned launch, in order.
    pub fn from_launch(l: &Launch) -> ArgSlots {
        let mut out = ArgSlots::new();
        for a in &l.args {
            match a {
                Arg::Tensor(b) => out.push_bytes(b),
                other => out.push_bytes(&other.bytes()),
            };
        }
        out
    }
    /// Appends the bytes of one argument (a `#[repr(C)]` value or a scalar's `to_ne_bytes`).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> &mut ArgSlots {
        let mut slot = vec![0u64; bytes.len().div_ceil(8).max(1)].into_boxed_slice();
        for (i, b) in bytes.iter().enumerate() {
            slot[i / 8] |= (*b as u64) << (8 * (i % 8));
        }
        // The shifts above build little-endian words; on a big-endian host re-order them.
        if cfg!(target_endian = "big") {
            for w in slot.iter_mut() {
                *w = w.swap_bytes();
            }
        }
        self.slots.push(slot);
        self
    }
    /// Appends an `i64`.
    pub fn i64(&mut self, v: i64) -> &mut ArgSlots {
        self.push_bytes(&v.to_ne_bytes())
    }
    /// Appends a device pointer.
    pub fn ptr(&mut self, v: u64) -> &mut ArgSlots {
        self.push_bytes(&v.to_ne_bytes())
    }
    /// One pointer per argument slot, as `kernelParams`; valid while `self` is neither moved
    /// nor changed.
    pub fn pointers(&mut self) -> Vec<*mut std::ffi::c_void> {
        self.slots
            .iter_mut()
            .map(|s| s.as_mut_ptr() as *mut std::ffi::c_void)
            .collect()
    }
}

/// One kernel launch: `grid` blocks of `block` threads (1-D blocks; the x axis is the fastest).
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Kernel name (an entry of [`super::KERNELS`]).
    pub kernel: &'static str,
    /// Blocks along x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block (along x).
    pub block: u32,
    /// Arguments in the order of the kernel's parameters.
    pub args: Vec<Arg>,
}

/// A tensor as the kernels take it (`struct Tensor` in common.cuh, 80 bytes): the argument
/// [`Arg::Tensor`] carries.
pub fn tensor_arg(t: &TensorDesc, ptr: u64) -> [u8; 80] {
    let mut out = [0u8; 80];
    out[..8].copy_from_slice(&ptr.to_ne_bytes());
    for d in 0..4 {
        out[8 + 8 * d..16 + 8 * d].copy_from_slice(&(t.ne()[d] as i64).to_ne_bytes());
        out[40 + 8 * d..48 + 8 * d].copy_from_slice(&(t.nb()[d] as i64).to_ne_bytes());
    }
    out[72..76].copy_from_slice(&type_code(t.dtype()).to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::DType;

    #[test]
    fn tensor_arg_layout_matches_common_cuh() {
        let mut ctx = tessera_core::Context::new();
        let a = ctx.new_tensor(DType::F16, [3, 5]).unwrap();
        let b = tensor_arg(ctx.tensor(a).unwrap(), 0x1000);
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 0x1000);
        assert_eq!(i64::from_ne_bytes(b[8..16].try_into().unwrap()), 3);
        assert_eq!(i64::from_ne_bytes(b[48..56].try_into().unwrap()), 6);
        assert_eq!(i32::from_ne_bytes(b[72..76].try_into().unwrap()), 1);
    }
}
