//! Kernel-level checks of the GLSL ports (kernels/vulkan/*.comp) that op conformance does not
//! reach or checks only within a tolerance: bit-exact f16 / bf16 conversions and quantizers
//! (against `half` and `tessera_tests::reference`), the all-reduce helpers of comm.cu (not an op), grid-stride
//! kernels whose grid the runtime splits above `maxComputeWorkGroupCount` (each element exactly
//! once), one-block-per-row kernels past 65535 rows, ROPE at large positions, ERR_INDEX, and
//! GEMV of every weight format on both of its read paths.
//! Without a loader or device every trial is ignored with the reason in its name;
//! `TESSERA_REQUIRE=vulkan` makes that a failure.

use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::Arc;
use tessera_core::DType;
use tessera_gpu::{Driver, GpuContext};
use tessera_kernels::gpu::launch::{Arg, Launch};
use tessera_tests::reference::{decode, encode, round_to_q8_0, rounds_activations_to_q8};
use tessera_vulkan::{Vulkan, VulkanRegistry};

type TrialResult = Result<(), Failed>;
type Named = (&'static str, fn() -> TrialResult);

fn check(ok: bool, what: impl FnOnce() -> String) -> TrialResult {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn e<T>(r: tessera_core::Result<T>) -> Result<T, Failed> {
    r.map_err(|e| Failed::from(e.to_string()))
}

fn rr<T>(r: Result<T, String>) -> Result<T, Failed> {
    r.map_err(Failed::from)
}

fn ctx() -> Result<&'static Arc<GpuContext<Vulkan>>, Failed> {
    e(VulkanRegistry::new().contexts())?
        .first()
        .ok_or_else(|| Failed::from("no Vulkan context"))
}

/// Device memory holding `bytes` (or zeros).
struct Buf {
    mem: <Vulkan as Driver>::Mem,
    len: usize,
}

impl Buf {
    fn new(bytes: &[u8]) -> Result<Buf, Failed> {
        let c = ctx()?;
        let mem = e(Vulkan::alloc(c.gpu(), bytes.len().max(4)))?;
        e(Vulkan::write(&mem, 0, bytes))?;
        Ok(Buf {
            mem,
            len: bytes.len(),
        })
    }

    fn zeros(len: usize) -> Result<Buf, Failed> {
        Buf::new(&vec![0u8; len])
    }

    fn ptr(&self) -> u64 {
        Vulkan::mem_ptr(&self.mem)
    }

    fn get(&self) -> Result<Vec<u8>, Failed> {
        let mut v = vec![0u8; self.len];
        e(Vulkan::read(&self.mem, 0, &mut v))?;
        Ok(v)
    }

    /// `struct Tensor` for a contiguous `dtype` array of shape `ne` at this buffer.
    fn tensor(&self, dtype: DType, ne: [usize; 4]) -> Arg {
        let code: i32 = match dtype {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::I32 => 3,
            DType::Q8_0 => 4,
            DType::Q4_0 => 5,
            DType::Q4_1 => 6,
            DType::Q5_1 => 7,
            DType::Q2_K => 8,
            DType::Q3_K => 9,
            DType::IQ4_NL => 10,
            DType::IQ4_XS => 11,
            DType::MXFP4 => 12,
            DType::Q5_0 => 13,
            DType::Q4_K => 14,
            DType::Q5_K => 15,
            DType::Q6_K => 16,
            other => panic!("no kernel type for {other}"),
        };
        let row = dtype.row_size(ne[0]).expect("whole blocks");
        let nb = [
            dtype.type_size() as i64,
            row as i64,
            (row * ne[1]) as i64,
            (row * ne[1] * ne[2]) as i64,
        ];
        let mut t = [0u8; 80];
        t[..8].copy_from_slice(&self.ptr().to_le_bytes());
        for d in 0..4 {
            t[8 + 8 * d..16 + 8 * d].copy_from_slice(&(ne[d] as i64).to_le_bytes());
            t[40 + 8 * d..48 + 8 * d].copy_from_slice(&nb[d].to_le_bytes());
        }
        t[72..76].copy_from_slice(&code.to_le_bytes());
        Arg::Tensor(t)
    }
}

fn run(kernel: &'static str, grid: u32, block: u32, args: Vec<Arg>) -> TrialResult {
    let c = ctx()?;
    let f = e(c.kernels().get(kernel))?;
    let s = e(Vulkan::stream_create(c.gpu()))?;
    let launch = Launch {
        kernel,
        grid: (grid, 1, 1),
        block,
        args,
    };
    // SAFETY: every test passes the kernel's parameter list (kernels/gpu/*.cu) with buffers
    // that cover what the kernel touches and outlive the synchronization below.
    e(unsafe { Vulkan::launch(&s, &f, &launch) })?;
    e(Vulkan::stream_sync(&s))
}

/// grid_1d of plan.rs.
fn grid(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 1 << 20) as u32
}

fn f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u16s(raw: &[u8]) -> Vec<u16> {
    raw.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// xorshift values: random bit patterns and values of many magnitudes (halfway cases included).
fn test_floats(n: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 16) as u32;
            match i % 4 {
                0 => f32::from_bits(u),
                1 => (u as f32 / 4294967296.0 - 0.5) * [1e-7f32, 1e-5, 1.0, 1e3, 7e4][i % 5],
                // Exactly halfway between two f16 / bf16 values.
                2 => f32::from_bits((u & 0xffff_e000) | 0x1000),
                _ => f32::from_bits((u & 0xffff_0000) | 0x8000),
            }
        })
        .collect()
}

/// `got` is `a + b` rounded as IEEE f32, or as a device that flushes subnormal inputs and results
/// to zero computes it: Vulkan makes denormal preservation optional
/// (`shaderDenormPreserveFloat32`), and NVIDIA's driver flushes (seen on an H200).
fn sum_matches(got: f32, a: f32, b: f32) -> bool {
    let ftz = |v: f32| if v.is_subnormal() { 0.0 } else { v };
    let same = |x: f32, y: f32| x.to_bits() == y.to_bits() || (x == 0.0 && y == 0.0);
    same(got, a + b) || same(got, ftz(ftz(a) + ftz(b)))
}

fn same_or_nan(dtype: DType, got: u16, want: u16) -> bool {
    let nan = |b: u16| match dtype {
        DType::F16 => b & 0x7c00 == 0x7c00 && b & 0x3ff != 0,
        _ => b & 0x7f80 == 0x7f80 && b & 0x7f != 0,
    };
    got == want || (nan(got) && nan(want))
}

fn conversions() -> TrialResult {
    // Every f16 and bf16 to f32.
    for dtype in [DType::F16, DType::BF16] {
        let n = 65536;
        let src: Vec<u8> = (0..n as u32)
            .flat_map(|i| (i as u16).to_le_bytes())
            .collect();
        let want = rr(decode(dtype, &src, n))?;
        let (s, d) = (Buf::new(&src)?, Buf::zeros(4 * n)?);
        run(
            "k_cpy",
            grid(n),
            256,
            vec![
                d.tensor(DType::F32, [n, 1, 1, 1]),
                s.tensor(dtype, [n, 1, 1, 1]),
                Arg::I32(1),
                Arg::I64(n as i64),
            ],
        )?;
        let got = f32s(&d.get()?);
        if let Some(i) = (0..n).find(|&i| {
            !(got[i].to_bits() == (want[i] as f32).to_bits()
                || (got[i].is_nan() && want[i].is_nan()))
        }) {
            return Err(format!("{dtype} {i:#06x} -> {} (want {})", got[i], want[i]).into());
        }
    }
    // f32 to f16 / bf16, round to nearest even, as the `half` crate.
    let n = 1 << 18;
    let vals = test_floats(n);
    let s = Buf::new(&bytes_f32(&vals))?;
    for dtype in [DType::F16, DType::BF16] {
        let d = Buf::zeros(2 * n)?;
        run(
            "k_cpy",
            grid(n),
            256,
            vec![
                d.tensor(dtype, [n, 1, 1, 1]),
                s.tensor(DType::F32, [n, 1, 1, 1]),
                Arg::I32(1),
                Arg::I64(n as i64),
            ],
        )?;
        let got = u16s(&d.get()?);
        // half's from_f32 (from_f64, which the reference's `encode` uses, drops the low 32
        // mantissa bits of the f64 before rounding: wrong just above a halfway case).
        let want: Vec<u16> = vals
            .iter()
            .map(|&v| match dtype {
                DType::F16 => half::f16::from_f32(v).to_bits(),
                _ => half::bf16::from_f32(v).to_bits(),
            })
            .collect();
        if let Some(i) = (0..n).find(|&i| !same_or_nan(dtype, got[i], want[i])) {
            return Err(format!(
                "{} -> {dtype} {:#06x} (want {:#06x})",
                vals[i], got[i], want[i]
            )
            .into());
        }
    }
    Ok(())
}

fn quantizers_bit_exact() -> TrialResult {
    let ne = [256usize, 9, 2, 1];
    let n = ne[0] * ne[1] * ne[2];
    let mut vals: Vec<f32> = test_floats(4 * n)
        .into_iter()
        .filter(|v| v.is_finite() && v.abs() < 1e6)
        .take(n)
        .collect();
    vals[..32].fill(0.0); // an all-zero block (d = 0)
    vals[32..64].fill(-2.5); // a constant block
    let s = Buf::new(&bytes_f32(&vals))?;
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::IQ4_NL,
    ] {
        let want = rr(encode(
            dtype,
            &vals.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        ))?;
        let d = Buf::zeros(want.len())?;
        run(
            "k_quantize",
            grid(n / 32),
            256,
            vec![
                d.tensor(dtype, ne),
                s.tensor(DType::F32, ne),
                Arg::I64((n / 32) as i64),
            ],
        )?;
        let got = d.get()?;
        let bs = dtype.type_size();
        if let Some(b) =
            (0..n / 32).find(|&b| got[b * bs..(b + 1) * bs] != want[b * bs..(b + 1) * bs])
        {
            return Err(format!(
                "{dtype} block {b}: {:02x?} (want {:02x?})",
                &got[b * bs..(b + 1) * bs],
                &want[b * bs..(b + 1) * bs]
            )
            .into());
        }
    }
    Ok(())
}

fn dequantizers_exact() -> TrialResult {
    let ne = [512usize, 3, 1, 1];
    let n = ne[0] * ne[1];
    let vals: Vec<f64> = test_floats(4 * n)
        .into_iter()
        .filter(|v| v.is_finite() && v.abs() < 100.0)
        .take(n)
        .map(f64::from)
        .collect();
    // Every quantized type the kernels decode.
    for dtype in tessera_kernels::gpu::codes::TYPES
        .into_iter()
        .filter(|d| d.is_quantized())
    {
        let q = rr(encode(dtype, &vals))?;
        let want = rr(decode(dtype, &q, n))?;
        let (s, d) = (Buf::new(&q)?, Buf::zeros(4 * n)?);
        run(
            "k_cpy",
            grid(n),
            256,
            vec![
                d.tensor(DType::F32, ne),
                s.tensor(dtype, ne),
                Arg::I32(1),
                Arg::I64(n as i64),
            ],
        )?;
        let got = f32s(&d.get()?);
        if let Some(i) = (0..n).find(|&i| got[i] != want[i] as f32) {
            return Err(format!("{dtype} element {i}: {} (want {})", got[i], want[i]).into());
        }
    }
    Ok(())
}

fn comm_helpers() -> TrialResult {
    let n = 70_001;
    let x = test_floats(n);
    let xb = bytes_f32(&x);
    let wire_want: Vec<u16> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let bf = |b: u16| f32::from_bits(u32::from(b) << 16);
    let (src, wire) = (Buf::new(&xb)?, Buf::zeros(2 * n)?);
    run(
        "k_f32_to_bf16",
        grid(n),
        256,
        vec![
            Arg::Ptr(wire.ptr()),
            Arg::Ptr(src.ptr()),
            Arg::I64(n as i64),
        ],
    )?;
    let w = u16s(&wire.get()?);
    if let Some(i) = (0..n).find(|&i| !same_or_nan(DType::BF16, w[i], wire_want[i])) {
        return Err(format!(
            "k_f32_to_bf16 [{i}]: {:#06x} (want {:#06x})",
            w[i], wire_want[i]
        )
        .into());
    }
    let back = Buf::zeros(4 * n)?;
    run(
        "k_bf16_to_f32",
        grid(n),
        256,
        vec![
            Arg::Ptr(back.ptr()),
            Arg::Ptr(wire.ptr()),
            Arg::I64(n as i64),
        ],
    )?;
    let b = f32s(&back.get()?);
    check((0..n).all(|i| b[i].to_bits() == bf(w[i]).to_bits()), || {
        "k_bf16_to_f32".into()
    })?;
    // Finite values for the adds.
    let y: Vec<f32> = x
        .iter()
        .map(|&v| if v.is_finite() { v } else { 1.5 })
        .collect();
    let acc = Buf::new(&bytes_f32(&y))?;
    let ys = Buf::new(&bytes_f32(&y))?;
    run(
        "k_add_f32",
        grid(n),
        256,
        vec![Arg::Ptr(acc.ptr()), Arg::Ptr(ys.ptr()), Arg::I64(n as i64)],
    )?;
    let a1 = f32s(&acc.get()?);
    check((0..n).all(|i| sum_matches(a1[i], y[i], y[i])), || {
        "k_add_f32".into()
    })?;
    let yw = Buf::new(
        &y.iter()
            .flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect::<Vec<_>>(),
    )?;
    run(
        "k_add_bf16",
        grid(n),
        256,
        vec![Arg::Ptr(acc.ptr()), Arg::Ptr(yw.ptr()), Arg::I64(n as i64)],
    )?;
    let a2 = f32s(&acc.get()?);
    check(
        (0..n).all(|i| sum_matches(a2[i], a1[i], bf((y[i].to_bits() >> 16) as u16))),
        || "k_add_bf16".into(),
    )?;
    let (xs, wire2) = (Buf::new(&xb)?, Buf::zeros(2 * n)?);
    run(
        "k_round_to_bf16",
        grid(n),
        256,
        vec![
            Arg::Ptr(wire2.ptr()),
            Arg::Ptr(xs.ptr()),
            Arg::I64(n as i64),
        ],
    )?;
    let (w2, x2) = (u16s(&wire2.get()?), f32s(&xs.get()?));
    check(
        (0..n).all(|i| {
            same_or_nan(DType::BF16, w2[i], wire_want[i])
                && (x2[i].to_bits() == bf(w2[i]).to_bits())
        }),
        || "k_round_to_bf16".into(),
    )
}

fn split_grids() -> TrialResult {
    // 65540 blocks of 256: split by the runtime into 65535 + 5 on lavapipe; each element must be
    // added exactly once.
    let n = 65_536 * 256 + 1000;
    let v: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let (acc, src) = (Buf::new(&bytes_f32(&v))?, Buf::new(&bytes_f32(&v))?);
    run(
        "k_add_f32",
        grid(n),
        256,
        vec![Arg::Ptr(acc.ptr()), Arg::Ptr(src.ptr()), Arg::I64(n as i64)],
    )?;
    let got = f32s(&acc.get()?);
    if let Some(i) = (0..n).find(|&i| got[i] != 2.0 * v[i]) {
        return Err(format!("k_add_f32 [{i}] = {} (want {})", got[i], 2.0 * v[i]).into());
    }
    // One block per row, 70000 rows.
    let rows = 70_000;
    let a: Vec<f32> = (0..3 * rows).map(|i| (i % 977) as f32).collect();
    let (sa, d) = (Buf::new(&bytes_f32(&a))?, Buf::zeros(4 * rows)?);
    run(
        "k_sum_rows",
        rows as u32,
        32,
        vec![
            d.tensor(DType::F32, [1, rows, 1, 1]),
            sa.tensor(DType::F32, [3, rows, 1, 1]),
        ],
    )?;
    let s = f32s(&d.get()?);
    match (0..rows).find(|&r| s[r] != a[3 * r] + a[3 * r + 1] + a[3 * r + 2]) {
        Some(r) => Err(format!("k_sum_rows row {r} = {}", s[r]).into()),
        None => Ok(()),
    }
}

fn rope_large_positions() -> TrialResult {
    // Positions up to 10^6: theta is carried in float-float precision and reduced mod pi/2.
    let ne = [128usize, 2, 6, 1];
    let n = ne[0] * ne[1] * ne[2];
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
        .collect();
    let pos = [0i32, 1, 4000, 65_537, 1_000_000, -7];
    for (neox, n_dims, base, fs) in [(0, 128, 10000.0f64, 1.0f64), (1, 96, 500000.0, 0.25)] {
        let (a, d) = (Buf::new(&bytes_f32(&x))?, Buf::zeros(4 * n)?);
        let p = Buf::new(&pos.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())?;
        let half = n_dims / 2;
        let slots = half + (ne[0] - n_dims).div_ceil(2);
        let total = slots * ne[1] * ne[2];
        let ts = base.powf(-2.0 / n_dims as f64);
        run(
            "k_rope",
            grid(total),
            256,
            vec![
                d.tensor(DType::F32, ne),
                a.tensor(DType::F32, ne),
                p.tensor(DType::I32, [6, 1, 1, 1]),
                p.tensor(DType::I32, [6, 1, 1, 1]),
                Arg::I32(0),
                Arg::I32(n_dims as i32),
                Arg::I32(neox),
                Arg::F64(ts),
                Arg::F64(fs),
                Arg::I64(slots as i64),
                Arg::I64(total as i64),
            ],
        )?;
        let got = f32s(&d.get()?);
        let mut want = x.clone();
        for r in 0..ne[1] * ne[2] {
            let o = r * ne[0];
            let mut theta = pos[r / ne[1]] as f64 * fs;
            for s in 0..half {
                let (c, sn) = (theta.cos() as f32, theta.sin() as f32);
                let (j0, j1) = if neox == 1 {
                    (s, s + half)
                } else {
                    (2 * s, 2 * s + 1)
                };
                want[o + j0] = x[o + j0] * c - x[o + j1] * sn;
                want[o + j1] = x[o + j0] * sn + x[o + j1] * c;
                theta *= ts;
            }
        }
        let worst = (0..n)
            .map(|i| (got[i] - want[i]).abs())
            .fold(0.0f32, f32::max);
        check(worst < 1e-5, || {
            format!("rope neox={neox}: max error {worst:e}")
        })?;
    }
    Ok(())
}

fn index_errors() -> TrialResult {
    let table = Buf::new(&bytes_f32(&(0..160).map(|i| i as f32).collect::<Vec<_>>()))?;
    let ids = Buf::new(
        &[3i32, 0, 12, 5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    )?;
    let (d, status) = (Buf::zeros(4 * 64)?, Buf::zeros(8)?);
    run(
        "k_get_rows",
        1,
        256,
        vec![
            d.tensor(DType::F32, [16, 4, 1, 1]),
            table.tensor(DType::F32, [16, 10, 1, 1]),
            ids.tensor(DType::I32, [4, 1, 1, 1]),
            Arg::Ptr(status.ptr()),
            Arg::I64(64),
        ],
    )?;
    let st: Vec<i32> = status
        .get()?
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    check(st == [1, 12], || format!("status {st:?} (want [1, 12])"))?;
    let got = f32s(&d.get()?);
    check(
        (0..16).all(|k| got[k] == (48 + k) as f32 && got[48 + k] == (80 + k) as f32),
        || "rows beside the bad index".into(),
    )
}

/// dst[m] = w[k, m]^T · x[k] by the GEMV kernel of `dtype` (`k_mul_mat_vec_q` or
/// `k_mul_mat_vec_f`), launched as the plan does.
fn gemv(dtype: DType, m: usize, k: usize, w: &[u8], xb: &Buf) -> Result<Vec<f32>, Failed> {
    let wb = Buf::new(w)?;
    let db = Buf::zeros(4 * m)?;
    let kernel = if dtype.is_quantized() {
        "k_mul_mat_vec_q"
    } else {
        "k_mul_mat_vec_f"
    };
    run(
        kernel,
        m.div_ceil(4) as u32,
        128,
        vec![
            db.tensor(DType::F32, [m, 1, 1, 1]),
            wb.tensor(dtype, [k, m, 1, 1]),
            xb.tensor(DType::F32, [k, 1, 1, 1]),
            Arg::I64(1),
            Arg::I64(1),
        ],
    )?;
    Ok(f32s(&db.get()?))
}

/// llama.cpp's `quantize_row_q8_0` (reference C): per 32 values d = amax / 127 stored as fp16,
/// q = roundf(x / d) computed as x * (1 / d).
fn q8_0_blocks(x: &[f32]) -> Vec<(f32, [i32; 32])> {
    x.chunks_exact(32)
        .map(|b| {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let q = std::array::from_fn(|j| (b[j] * id).round() as i32);
            (half::f16::from_f32(d).to_f32(), q)
        })
        .collect()
}

/// The int8 GEMV variant (loaded as `k_mul_mat_vec_q` on devices with shaderIntegerDotProduct)
/// against llama.cpp's Q8_0 / Q4_0 / Q5_0 / IQ4_NL dot products (activations rounded to Q8_0, int32 sums per
/// block times d_w * d_x), and proof it is not the exact-activation path.
fn gemv_int8() -> TrialResult {
    let c = ctx()?;
    if !c.gpu().int8_dot() {
        let why = if std::env::var("TESSERA_VULKAN_INT8").is_ok_and(|v| v == "0") {
            "TESSERA_VULKAN_INT8=0"
        } else {
            "the device lacks shaderIntegerDotProduct"
        };
        eprintln!("gemv_int8 skipped: {why}");
        return Ok(());
    }
    let (m, nblk) = (6usize, 40usize);
    let k = 32 * nblk;
    let mut x: Vec<f32> = test_floats(k)
        .iter()
        .map(|v| {
            if v.is_finite() {
                (v % 100.0).sin()
            } else {
                0.25
            }
        })
        .collect();
    // An all-zero block (d = 0, id = 0), a block of exact halves (amax 127: q ties round away
    // from zero), and an all-negative one; the rest straddle lanes (40 blocks > 32 lanes).
    x[32..64].fill(0.0);
    for j in 0..32 {
        x[64 + j] = if j == 0 {
            127.0
        } else {
            (j as f32 - 16.0) + 0.5
        };
        x[96 + j] = -x[96 + j].abs() - 0.01;
    }
    let xq = q8_0_blocks(&x);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    const IQ4NL: [i32; 16] = [
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
    ];
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::IQ4_NL] {
        let bb = dtype.type_size();
        let mut w = vec![0u8; m * nblk * bb];
        // (d_w, levels) of each block, row-major.
        let mut levels: Vec<(f32, [i32; 32])> = Vec::new();
        for blk in w.chunks_exact_mut(bb) {
            let r = next();
            let d = half::f16::from_f32(0.001 + (r % 1000) as f32 * 1e-5);
            blk[..2].copy_from_slice(&d.to_le_bytes());
            for b in &mut blk[2..] {
                *b = (next() >> 24) as u8;
            }
            let nib = |j: usize, base: usize| {
                let b = blk[base + (j & 15)];
                i32::from(if j < 16 { b & 15 } else { b >> 4 })
            };
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let q: [i32; 32] = std::array::from_fn(|j| match dtype {
                DType::Q8_0 => i32::from(blk[2 + j] as i8),
                DType::Q4_0 => nib(j, 2) - 8,
                DType::Q5_0 => (nib(j, 6) | (((qh >> j) & 1) << 4) as i32) - 16,
                _ => IQ4NL[nib(j, 2) as usize],
            });
            levels.push((d.to_f32(), q));
        }
        let got = gemv(dtype, m, k, &w, &Buf::new(&bytes_f32(&x))?)?;
        let mut differs = false;
        for r in 0..m {
            let (mut want, mut mag, mut exact) = (0.0f32, 0.0f64, 0.0f64);
            for (b, (dx, qx)) in xq.iter().enumerate() {
                let (dw, qw) = &levels[r * nblk + b];
                let sumi: i32 = (0..32).map(|j| qw[j] * qx[j]).sum();
                want += sumi as f32 * (dw * dx);
                mag += (0..32)
                    .map(|j| f64::from((qw[j] * qx[j]).abs()))
                    .sum::<f64>()
                    * f64::from(dw * dx);
                exact += (0..32)
                    .map(|j| f64::from(*dw) * f64::from(qw[j]) * f64::from(x[b * 32 + j]))
                    .sum::<f64>();
            }
            let tol = 1e-5 * mag;
            check(f64::from((got[r] - want).abs()) <= tol, || {
                format!(
                    "{dtype} row {r}: got {} want llama.cpp's {want} (tol {tol:e})",
                    got[r]
                )
            })?;
            // The exact-activation result would fail the tolerance above.
            differs |= (f64::from(got[r]) - exact).abs() > 2.0 * tol;
        }
        check(differs, || {
            format!("{dtype}: every row matches exact activations; the int8 path did not run")
        })?;
    }
    Ok(())
}

/// GEMV (`k_mul_mat_vec_q` / `k_mul_mat_vec_f`) of every weight format against the f64 dot
/// products of the decoded weights, at k = 136 blocks (the 32-element block formats read as
/// words, in quads for the planned 128 invocations as for a CPU device's 32) and 70 rows (two
/// 64-row workgroups on a CPU device, a partial last 4-row block as planned), within 1e-5 of the
/// magnitude. For the weight types whose activations llama.cpp rounds to Q8_0 blocks (the int8
/// variant with integer dot products, the f32 path in f32) the products are taken with
/// activations rounded the same way (`gemv_int8` checks the int8 path's bits).
fn gemv_shapes() -> TrialResult {
    let (m, k) = (70usize, 32 * 136);
    let x: Vec<f32> = (0..k)
        .map(|i| (i * 7919 % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let w: Vec<f64> = (0..m * k)
        .map(|i| (i * 104_729 % 2001) as f64 / 1000.0 - 1.0)
        .collect();
    let xb = Buf::new(&bytes_f32(&x))?;
    // Every weight type the kernels take.
    let weights = DType::ALL
        .into_iter()
        .filter(|&d| d != DType::I32 && tessera_kernels::gpu::codes::type_code(d) >= 0);
    for dtype in weights {
        let bytes = rr(encode(dtype, &w))?;
        let deq = rr(decode(dtype, &bytes, m * k))?;
        let got = gemv(dtype, m, k, &bytes, &xb)?;
        let exact: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let xs = if rounds_activations_to_q8(dtype) {
            round_to_q8_0(&exact)
        } else {
            exact
        };
        for r in 0..m {
            let row = &deq[r * k..(r + 1) * k];
            let want: f64 = row.iter().zip(&xs).map(|(a, b)| a * b).sum();
            let mag: f64 = row.iter().zip(&xs).map(|(a, b)| (a * b).abs()).sum();
            let tol = 1e-5 * mag;
            check((f64::from(got[r]) - want).abs() <= tol, || {
                format!(
                    "GEMV {dtype} row {r}: got {} want {want} (tol {tol:e})",
                    got[r]
                )
            })?;
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let require =
        std::env::var("TESSERA_REQUIRE").is_ok_and(|v| v.split(',').any(|b| b.trim() == "vulkan"));
    let reason = VulkanRegistry::new().reason();
    let all: &[Named] = &[
        ("conversions", conversions),
        ("quantizers_bit_exact", quantizers_bit_exact),
        ("dequantizers_exact", dequantizers_exact),
        ("comm_helpers", comm_helpers),
        ("split_grids", split_grids),
        ("rope_large_positions", rope_large_positions),
        ("index_errors", index_errors),
        ("gemv_int8", gemv_int8),
        ("gemv_shapes", gemv_shapes),
    ];
    let trials =
        all.iter()
            .map(|&(name, f)| match &reason {
                None => Trial::test(name, f),
                Some(why) if require => {
                    let msg = format!("TESSERA_REQUIRE=vulkan: {why}");
                    Trial::test(name, move || Err(Failed::from(msg)))
                }
                Some(why) => Trial::test(format!("[skipped: {why}] {name}"), || Ok(()))
                    .with_ignored_flag(true),
            })
            .collect();
    libtest_mimic::run(&args, trials).exit();
}
