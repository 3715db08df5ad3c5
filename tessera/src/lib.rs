//! Tessera: run tensor compute graphs on CPUs and GPUs of every vendor, and split one model
//! across several devices.
//!
//! This facade is what an application depends on to run graphs: it names what an application
//! uses of `tessera-core` (graphs, dtypes, devices and buffers, errors; the scheduler [`sched`],
//! the meta device [`meta`], compute-memory planning [`alloc`], collectives [`comm`]), [`gguf`],
//! [`plugin`] and [`dist`], typed host I/O ([`HostIo`]), and registers the backends compiled in
//! through cargo features (`cpu` by default) in one process-wide [`registry()`]. Backend and
//! plugin authors implement the traits of `tessera-core` itself. Language models live one layer
//! up, in `tessera-model`, which depends on this crate.
//!
//! ```
//! use tessera::{BackendOptions, Context, DType};
//! let reg = tessera::registry();
//! let dev = reg.device("CPU").unwrap();
//! let backend_opts = BackendOptions::with_threads(1);
//! let mut backend = dev.init_backend(&backend_opts).unwrap();
//! let mut ctx = Context::new();
//! let w = ctx.new_tensor(DType::Q8_0, [64, 8]).unwrap();
//! let x = ctx.new_tensor(DType::F32, [64, 1]).unwrap();
//! let y = ctx.mul_mat(w, x).unwrap();
//! let graph = ctx.build_forward(y).unwrap();
//! let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
//! buf.set(w, &tessera::encode_f32(DType::Q8_0, &vec![0.5; 64 * 8]).unwrap()).unwrap();
//! buf.set_f32(x, &vec![1.0; 64]).unwrap();
//! backend.compute(&graph, buf.bindings()).unwrap();
//! backend.synchronize().unwrap();
//! // Q8_0 stores a per-block f16 scale, so 0.5 · 64 comes back within 0.01 of 32.
//! assert!(buf.get_f32(y).unwrap().iter().all(|v| (v - 32.0).abs() < 0.01));
//! ```
#![deny(unsafe_code)]

// Graphs: tensors described in a context, their ops and element types.
pub use tessera_core::{
    Context, DType, GluOp, Graph, Op, OpKind, RopeMode, RopeParams, TensorDesc, TensorFlags,
    TensorId, UnaryOp,
};
// Devices, their buffers and streams, and the registry listing them.
/// Compute-memory planning of a graph (what a buffer of one device type must hold).
pub use tessera_core::alloc;
pub use tessera_core::backend::HostMemory;
/// The meta device: one device made of several, splitting every op it receives.
pub use tessera_core::meta;
/// The op enums and their parameters.
pub use tessera_core::ops;
pub use tessera_core::registry::BackendInfo;
/// The scheduler: a graph over several devices, with the copies between them.
pub use tessera_core::sched;
/// Settings that change how backends run, from code as well as from the `TESSERA_*` variables.
pub use tessera_core::settings;
pub use tessera_core::{
    Backend, BackendOptions, Bindings, Buffer, BufferType, Device, DeviceCaps, DeviceRegistry,
    DeviceType, Event, MemoryInfo, ProcAddress, Registry, SplitReport, Spread, Support,
    TensorBuffer,
};
pub use tessera_core::{Error, Result};

/// Collectives: all-reduces between devices of one process and between processes.
pub mod comm {
    pub use tessera_core::comm::{
        Algorithm, AllReduce, COMM_ALLREDUCE, COMM_FREE, COMM_INIT, DEFAULT_RING_THRESHOLD,
        DistComm, ReducePath, ThreadGroup, Wire, check_same,
    };
}

mod host_io;
/// The `half` crate, whose `f16` and `bf16` [`HostIo`] reads and writes.
pub use half;
pub use host_io::{HostElement, HostIo};

#[cfg(feature = "cpu")]
pub use tessera_cpu as cpu;
#[cfg(feature = "cuda")]
pub use tessera_cuda as cuda;
#[cfg(feature = "hip")]
pub use tessera_hip as hip;
#[cfg(feature = "sycl")]
pub use tessera_sycl as sycl;
#[cfg(feature = "vulkan")]
pub use tessera_vulkan as vulkan;

/// Collectives between the processes of a distributed job (the `tessera-dist` crate; its MPI
/// engine with the `mpi` feature).
pub use tessera_dist as dist;
/// GGUF model files (the `tessera-gguf` crate).
pub use tessera_gguf as gguf;
/// Backends as shared libraries loaded at run time (the `tessera-plugin` crate).
pub use tessera_plugin as plugin;

mod plugins;

pub use plugins::{load_all, register_plugin};

use std::sync::Once;

/// Vendor backends Tessera knows, and whether this build includes each.
pub const BACKENDS: [(&str, bool); 5] = [
    ("cpu", cfg!(feature = "cpu")),
    ("cuda", cfg!(feature = "cuda")),
    ("hip", cfg!(feature = "hip")),
    ("sycl", cfg!(feature = "sycl")),
    ("vulkan", cfg!(feature = "vulkan")),
];

/// The process-wide registry with every compiled-in backend registered, plus the plugins in
/// `TESSERA_BACKEND_PATH` (see [`load_all`] for the executable's directory too).
pub fn registry() -> &'static DeviceRegistry {
    static INIT: Once = Once::new();
    let reg = DeviceRegistry::global();
    INIT.call_once(|| {
        #[cfg(feature = "cpu")]
        reg.register(tessera_cpu::registry());
        #[cfg(feature = "cuda")]
        reg.register(tessera_cuda::registry());
        #[cfg(feature = "hip")]
        reg.register(tessera_hip::registry());
        #[cfg(feature = "sycl")]
        reg.register(tessera_sycl::registry());
        #[cfg(feature = "vulkan")]
        reg.register(tessera_vulkan::registry());
        plugins::load_env_path(reg);
    });
    reg
}

/// Encodes f32 values as `dtype` bytes (quantizing with ggml's reference quantizers for the
/// quantized types, rounding to nearest for
/// F16/BF16, truncating toward zero for I32).
///
/// # Errors
/// [`Error::InvalidArgument`] if the value count is not a multiple of the block size.
pub fn encode_f32(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    use tessera_kernels::cpu as k;
    let bytes = dtype.row_size(values.len()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{} values are not a whole number of {dtype} blocks of {}",
            values.len(),
            dtype.block_size()
        ))
    })?;
    let mut out = vec![0u8; bytes];
    match dtype {
        DType::F32 => out
            .chunks_exact_mut(4)
            .zip(values)
            .for_each(|(o, v)| o.copy_from_slice(&v.to_le_bytes())),
        DType::F16 => out
            .chunks_exact_mut(2)
            .zip(values)
            .for_each(|(o, v)| o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes())),
        DType::BF16 => out
            .chunks_exact_mut(2)
            .zip(values)
            .for_each(|(o, v)| o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes())),
        DType::I32 => out
            .chunks_exact_mut(4)
            .zip(values)
            .for_each(|(o, v)| o.copy_from_slice(&(*v as i32).to_le_bytes())),
        DType::Q8_0 => k::quantize_row_q8_0(values, &mut out),
        DType::Q4_0 => k::quantize_row_q4_0(values, &mut out),
        DType::Q5_0 => k::quantize_row_q5_0(values, &mut out),
        DType::Q4_1 => k::quantize_row_q4_1(values, &mut out),
        DType::Q5_1 => k::quantize_row_q5_1(values, &mut out),
        DType::Q4_K => k::quantize_row_q4_k(values, &mut out),
        DType::Q5_K => k::quantize_row_q5_k(values, &mut out),
        DType::Q6_K => k::quantize_row_q6_k(values, &mut out),
        DType::Q8_K => k::quantize_row_q8_k(values, &mut out),
        DType::Q2_K => k::quantize_row_q2_k(values, &mut out),
        DType::Q3_K => k::quantize_row_q3_k(values, &mut out),
        DType::IQ4_NL => k::quantize_row_iq4_nl(values, &mut out),
        DType::IQ4_XS => k::quantize_row_iq4_xs(values, &mut out),
        DType::MXFP4 => k::quantize_row_mxfp4(values, &mut out),
        other => return Err(Error::InvalidArgument(format!("cannot encode {other}"))),
    }
    Ok(out)
}

/// Decodes `dtype` bytes to f32 values (the inverse of [`encode_f32`]).
///
/// # Errors
/// [`Error::InvalidArgument`] if the byte count is not a whole number of blocks.
pub fn decode_to_f32(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    use tessera_kernels::cpu as k;
    if !bytes.len().is_multiple_of(dtype.type_size()) {
        return Err(Error::InvalidArgument(format!(
            "{} bytes are not a whole number of {dtype} blocks",
            bytes.len()
        )));
    }
    let n = bytes.len() / dtype.type_size() * dtype.block_size();
    let mut out = vec![0f32; n];
    match dtype {
        DType::F32 => out
            .iter_mut()
            .zip(bytes.chunks_exact(4))
            .for_each(|(o, c)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        DType::F16 => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(o, c)| *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        DType::BF16 => out
            .iter_mut()
            .zip(bytes.chunks_exact(2))
            .for_each(|(o, c)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        DType::I32 => out
            .iter_mut()
            .zip(bytes.chunks_exact(4))
            .for_each(|(o, c)| *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32),
        DType::Q8_0 => k::dequantize_row_q8_0(bytes, &mut out),
        DType::Q4_0 => k::dequantize_row_q4_0(bytes, &mut out),
        DType::Q5_0 => k::dequantize_row_q5_0(bytes, &mut out),
        DType::Q4_1 => k::dequantize_row_q4_1(bytes, &mut out),
        DType::Q5_1 => k::dequantize_row_q5_1(bytes, &mut out),
        DType::Q4_K => k::dequantize_row_q4_k(bytes, &mut out),
        DType::Q5_K => k::dequantize_row_q5_k(bytes, &mut out),
        DType::Q6_K => k::dequantize_row_q6_k(bytes, &mut out),
        DType::Q8_K => k::dequantize_row_q8_k(bytes, &mut out),
        DType::Q2_K => k::dequantize_row_q2_k(bytes, &mut out),
        DType::Q3_K => k::dequantize_row_q3_k(bytes, &mut out),
        DType::IQ4_NL => k::dequantize_row_iq4_nl(bytes, &mut out),
        DType::IQ4_XS => k::dequantize_row_iq4_xs(bytes, &mut out),
        DType::MXFP4 => k::dequantize_row_mxfp4(bytes, &mut out),
        other => return Err(Error::InvalidArgument(format!("cannot decode {other}"))),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let v: Vec<f32> = (0..256).map(|i| (i % 64) as f32 / 8.0 - 4.0).collect();
        for d in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q5_0,
            DType::Q4_1,
            DType::Q5_1,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::Q8_K,
            DType::Q2_K,
            DType::Q3_K,
            DType::IQ4_NL,
            DType::IQ4_XS,
            DType::MXFP4,
        ] {
            let back = decode_to_f32(d, &encode_f32(d, &v).unwrap()).unwrap();
            let err = v
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let tol = match d {
                DType::Q4_0 | DType::Q4_1 | DType::Q4_K => 0.3,
                DType::Q5_0 | DType::Q5_1 | DType::Q5_K => 0.15,
                DType::Q6_K | DType::Q8_K => 0.05,
                // 4 levels per 16 values (Q2_K), symmetric levels for one-signed groups (Q3_K).
                DType::Q2_K => 0.6,
                DType::Q3_K => 0.5,
                // The OCP scale rule, 2^(⌊log2 amax⌋ − 2), saturates values above 6/8 of the
                // next power of two (3.875 → 3 here).
                DType::MXFP4 => 0.9,
                DType::IQ4_NL | DType::IQ4_XS => 0.4,
                _ => 0.02,
            };
            assert!(err <= tol, "{d}: max error {err}");
        }
        assert!(encode_f32(DType::Q8_0, &[1.0; 31]).is_err());
        assert!(encode_f32(DType::Q4_K, &[1.0; 128]).is_err());
        assert!(decode_to_f32(DType::Q6_K, &[0; 209]).is_err());
        assert!(encode_f32(DType::IQ4_XS, &[1.0; 32]).is_err());
        assert!(decode_to_f32(DType::MXFP4, &[0; 18]).is_err());
    }

    /// The book's settings table (docs/src/library.md) has a row per setting, key and variable
    /// as the code names them, and no other row.
    #[test]
    fn the_book_lists_every_setting() {
        use settings::Setting;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/library.md");
        let book = std::fs::read_to_string(path).expect("the book's library chapter");
        let section = book
            .split("## Settings\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("a Settings section");
        let rows: Vec<(&str, &str)> = section
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let env = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((key, env))
            })
            .collect();
        let want: Vec<(&str, &str)> = Setting::ALL.iter().map(|s| (s.key(), s.env())).collect();
        assert_eq!(rows, want);
    }

    #[test]
    fn registry_lists_the_cpu_device() {
        let reg = registry();
        assert!(reg.device("CPU").is_ok() || std::env::var(cpu::DEVICES_ENV).is_ok());
        assert!(matches!(
            reg.device("nope"),
            Err(Error::NoSuchDevice { .. })
        ));
        assert_eq!(reg.select("cpu:3").unwrap().len(), 3);
        assert!(reg.select("cpu:x").is_err());
        if !cfg!(feature = "cuda") {
            assert!(reg.select("cuda:1").is_err());
        }
    }

    /// With the `cuda` feature the backend is always registered: with devices, or with the
    /// reason it has none (no driver on CI), and selecting it then fails instead of panicking.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_backend_is_registered() {
        let reg = registry();
        let info = reg
            .backends()
            .into_iter()
            .find(|b| b.name == "cuda")
            .unwrap();
        match (&info.devices, cuda::CudaRegistry::new().reason()) {
            (Err(text), Some(why)) => {
                assert!(text.contains(&why));
                assert!(reg.select("cuda:1").is_err());
            }
            (Ok(devs), None) => assert!(!devs.is_empty()),
            (got, want) => panic!("registry says {got:?}, cuda says {want:?}"),
        }
    }

    /// With the `sycl` feature the backend is always registered, with devices or with the
    /// reason it has none.
    #[cfg(feature = "sycl")]
    #[test]
    fn sycl_backend_is_registered() {
        let reg = registry();
        let info = reg
            .backends()
            .into_iter()
            .find(|b| b.name == "sycl")
            .unwrap();
        match (&info.devices, sycl::SyclRegistry::new().reason()) {
            (Err(text), Some(why)) => {
                assert!(text.contains(&why));
                assert!(reg.select("sycl:1").is_err());
            }
            (Ok(devs), None) => assert!(!devs.is_empty()),
            (got, want) => panic!("registry says {got:?}, sycl says {want:?}"),
        }
    }

    /// With the `vulkan` feature the backend is always registered, with devices or with the
    /// reason it has none.
    #[cfg(feature = "vulkan")]
    #[test]
    fn vulkan_backend_is_registered() {
        let reg = registry();
        let info = reg
            .backends()
            .into_iter()
            .find(|b| b.name == "vulkan")
            .unwrap();
        match (&info.devices, vulkan::VulkanRegistry::new().reason()) {
            (Err(text), Some(why)) => {
                assert!(text.contains(&why));
                assert!(reg.select("vulkan:1").is_err());
            }
            (Ok(devs), None) => assert!(!devs.is_empty()),
            (got, want) => panic!("registry says {got:?}, vulkan says {want:?}"),
        }
    }

    /// With the `hip` feature the backend is always registered, with devices or with the reason
    /// it has none (no ROCm, or no AMD GPU on CI), and selecting it then fails.
    #[cfg(feature = "hip")]
    #[test]
    fn hip_backend_is_registered() {
        let reg = registry();
        let info = reg
            .backends()
            .into_iter()
            .find(|b| b.name == "hip")
            .unwrap();
        match (&info.devices, hip::HipRegistry::new().reason()) {
            (Err(text), Some(why)) => {
                assert!(text.contains(&why));
                assert!(reg.select("hip:1").is_err());
            }
            (Ok(devs), None) => assert!(!devs.is_empty()),
            (got, want) => panic!("registry says {got:?}, hip says {want:?}"),
        }
    }
}
