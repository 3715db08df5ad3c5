//! Specialization constants of a launch (`kernels/vulkan/ABI.md`, "Specialization"): besides
//! constant 0 (the block size), a kernel may declare constants 1..=4, the element type codes of
//! its first four `Tensor` arguments, 5, their layout bits, and 6, its first `int` argument (an
//! op or mode code), so that the driver compiles a pipeline per type, layout and code and dead
//! switches and general index paths fold away. A pipeline is keyed by the constants its module
//! declares only ([`declared`]), so kernels that declare none keep one pipeline per block size.
//! Constant 7 is the GEMV kernels' weight rows per workgroup, part of the launch's [`Geometry`],
//! which the driver picks per device type ([`geometry`]).

use tessera_core::DType;
use tessera_kernels::gpu::codes::type_code;
use tessera_kernels::gpu::launch::{Arg, Launch};

/// Tensor arguments whose type and layout are specialization constants.
pub(crate) const SPEC_TENSORS: usize = 4;
/// Constant id of the first argument's type code (`TS_TYPE_0`); ids 1..=4.
const TYPE_ID: u32 = 1;
/// Constant id of the layout bits (`TS_LAYOUT`): 4 bits per tensor argument, argument i at 4i.
const LAYOUT_ID: u32 = 5;
/// Constant id of the first `int` argument (`TS_INT_0`).
const INT_ID: u32 = 6;
/// Constant id of the weight rows per GEMV workgroup (`TS_ROWS`, [`Geometry::rows`]).
const ROWS_ID: u32 = 7;
/// `TS_INT_0` when unset (the shader then reads the argument; a launch whose first `int` is this
/// value gets the same result either way).
pub(crate) const INT_UNSET: i32 = i32::MAX;

/// Layout bit: rows are contiguous (`nb[0]` is the element size; always for quantized types).
pub(crate) const ROW: u32 = 1;
/// Layout bit: the whole tensor is packed (rows contiguous and each stride the previous extent).
pub(crate) const DENSE: u32 = 2;
/// Layout bit: the same shape as argument 0 (so dense tensors share its flat index).
pub(crate) const SAME: u32 = 4;
/// Layout bit: the address and the strides of axes 1..3 are multiples of 16 bytes.
pub(crate) const ALIGN16: u32 = 8;

/// What a kernel's pipeline is specialized on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Spec {
    /// Threads per block (constant 0).
    pub(crate) block: u32,
    /// Type codes of tensor arguments 0..3 (-1: absent or not declared).
    pub(crate) types: [i32; SPEC_TENSORS],
    /// Layout bits (0 when not declared).
    pub(crate) layout: u32,
    /// The first `int` argument ([`INT_UNSET`] when absent or not declared).
    pub(crate) int0: i32,
    /// Weight rows per GEMV workgroup (0 when not declared).
    pub(crate) rows: u32,
}

/// The bit set of specialization constant ids (0..=31) that SPIR-V `words` decorates with
/// `SpecId`.
pub(crate) fn declared(words: &[u32]) -> u32 {
    const OP_DECORATE: u32 = 71;
    const SPEC_ID: u32 = 1;
    let mut ids = 0u32;
    let mut at = 5; // after the header
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        if count == 0 {
            break;
        }
        if op == OP_DECORATE && count >= 4 && at + 3 < words.len() && words[at + 2] == SPEC_ID {
            let id = words[at + 3];
            if id < 32 {
                ids |= 1 << id;
            }
        }
        at += count;
    }
    ids
}

/// A tensor argument's fields (`struct Tensor`, 80 bytes).
struct Fields {
    data: u64,
    ne: [i64; 4],
    nb: [i64; 4],
    code: i32,
}

fn fields(b: &[u8; 80]) -> Fields {
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        w
    };
    let mut code = [0u8; 4];
    code.copy_from_slice(&b[72..76]);
    Fields {
        data: u64::from_ne_bytes(word(0)),
        ne: std::array::from_fn(|d| i64::from_ne_bytes(word(8 + 8 * d))),
        nb: std::array::from_fn(|d| i64::from_ne_bytes(word(40 + 8 * d))),
        code: i32::from_ne_bytes(code),
    }
}

/// The element type of kernel type code `code`.
fn dtype_of(code: i32) -> Option<DType> {
    if code < 0 {
        return None;
    }
    DType::ALL.into_iter().find(|&d| type_code(d) == code)
}

/// The first `n` tensor arguments of `launch`, in parameter order.
fn tensor_args(launch: &Launch, n: usize) -> Vec<Fields> {
    launch
        .args
        .iter()
        .filter_map(|a| match a {
            Arg::Tensor(b) => Some(fields(b)),
            _ => None,
        })
        .take(n)
        .collect()
}

/// Layout bits of `t` (`first`: argument 0's shape).
fn layout(t: &Fields, first: &[i64; 4]) -> u32 {
    let Some(d) = dtype_of(t.code) else {
        return 0;
    };
    let mut bits = 0;
    let row = d.is_quantized() || t.nb[0] == d.type_size() as i64;
    if row {
        bits |= ROW;
        let row_bytes = usize::try_from(t.ne[0])
            .ok()
            .and_then(|n| d.row_size(n))
            .and_then(|r| i64::try_from(r).ok());
        if row_bytes == Some(t.nb[1])
            && t.nb[2] == t.nb[1].wrapping_mul(t.ne[1])
            && t.nb[3] == t.nb[2].wrapping_mul(t.ne[2])
        {
            bits |= DENSE;
        }
    }
    if t.ne == *first {
        bits |= SAME;
    }
    let aligned =
        t.data.is_multiple_of(16) && (1..4).all(|k| t.ne[k] <= 1 || t.nb[k].rem_euclid(16) == 0);
    if aligned {
        bits |= ALIGN16;
    }
    bits
}

impl Spec {
    /// The constants of `launch`, dispatched as `geo`, for a module declaring the ids in
    /// `declared`.
    pub(crate) fn of(launch: &Launch, geo: &Geometry, declared: u32) -> Spec {
        let mut spec = Spec {
            block: geo.block.max(1),
            types: [-1; SPEC_TENSORS],
            layout: 0,
            int0: INT_UNSET,
            rows: 0,
        };
        if declared & !1 == 0 {
            return spec;
        }
        if declared & (1 << ROWS_ID) != 0 {
            spec.rows = geo.rows;
        }
        if declared & (1 << INT_ID) != 0
            && let Some(v) = launch.args.iter().find_map(|a| match a {
                Arg::I32(v) => Some(*v),
                _ => None,
            })
        {
            spec.int0 = v;
        }
        let tensors = tensor_args(launch, SPEC_TENSORS);
        let Some(first) = tensors.first().map(|t| t.ne) else {
            return spec;
        };
        for (i, t) in tensors.iter().enumerate() {
            if declared & (1 << (TYPE_ID + i as u32)) != 0 {
                spec.types[i] = t.code;
            }
            if declared & (1 << LAYOUT_ID) != 0 {
                spec.layout |= layout(t, &first) << (4 * i);
            }
        }
        spec
    }

    /// The map entries and data of these constants (ids 0..=7, 4 bytes each; a module ignores
    /// entries for ids it does not declare).
    pub(crate) fn data(&self) -> ([u32; 8], [u8; 32]) {
        let mut words = [0u32; 8];
        words[0] = self.block;
        for (i, &t) in self.types.iter().enumerate() {
            words[TYPE_ID as usize + i] = t as u32;
        }
        words[LAYOUT_ID as usize] = self.layout;
        words[INT_ID as usize] = self.int0 as u32;
        words[ROWS_ID as usize] = self.rows;
        let mut bytes = [0u8; 32];
        for (i, w) in words.iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        (std::array::from_fn(|i| i as u32), bytes)
    }
}

/// Op kernels whose only use of the grid is a grid-stride loop over the threads of the launch
/// (`GRID_STRIDE` / `ts_grid_threads` in `common.glsl`), so any smaller grid computes the same.
/// (The all-reduce helpers are grid-stride too, but keep their planned grids: the split-dispatch
/// tests run on them.)
pub(crate) const GRID_STRIDE_KERNELS: &[&str] = &[
    "k_add_id",
    "k_binary",
    "k_concat",
    "k_copy_rows",
    "k_cpy",
    "k_get_rows",
    "k_glu",
    "k_map",
    "k_quantize",
    "k_rope",
    "k_set_rows",
    "k_set_rows_q",
    "k_swiglu_oai",
];

/// Planned blocks a grid-stride launch keeps per dispatched workgroup on a CPU device.
const CPU_STRIDE_FACTOR: u32 = 16;

/// Kernels whose invocations stride over their row (or their rows' k) by the workgroup size and
/// reduce over the whole workgroup, so any block size (a multiple of 32, at most 256) computes
/// the same.
const ROW_KERNELS: &[&str] = &["k_mul_mat_vec_f", "k_mul_mat_vec_q", "k_norm"];

/// GEMV kernels: `GEMV_ROWS` (4) weight rows per workgroup as planned, or `TS_ROWS` (constant 7).
const GEMV_KERNELS: &[&str] = &["k_mul_mat_vec_f", "k_mul_mat_vec_q"];
/// Weight rows per GEMV workgroup as the plan's grid has them.
const GEMV_ROWS: u32 = 4;
/// Weight rows per GEMV workgroup on a CPU device.
const CPU_GEMV_ROWS: u32 = 64;

/// How a launch is dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: u32,
    /// Weight rows per GEMV workgroup (GEMV kernels only; the plan's 4 elsewhere).
    pub(crate) rows: u32,
}

/// How to dispatch `launch`: the plan's grid and block, except on a CPU implementation (`cpu`:
/// lavapipe), where every dispatch wakes a thread pool, every invocation loads its arguments and
/// every memory access happens one lane at a time:
/// - grid-stride kernels run a sixteenth of the planned workgroups (each invocation taking 16
///   times the elements; one workgroup for up to 4096), below 65535 so that the dispatch is
///   never split and `ts_grid_threads` reads the true grid from `gl_NumWorkGroups`;
/// - row kernels take 32 invocations (a subgroup's lanes still read consecutive values);
/// - GEMV workgroups take 64 weight rows instead of 4, each invocation keeping its activations in
///   registers across the rows, so activations are read once per 64 rows (the grid: a workgroup
///   per 64 rows, column and plane).
pub(crate) fn geometry(cpu: bool, launch: &Launch) -> Geometry {
    let planned = Geometry {
        grid: launch.grid,
        block: launch.block,
        rows: GEMV_ROWS,
    };
    let kernel = launch.kernel;
    if !cpu {
        return planned;
    }
    let (gx, gy, gz) = launch.grid;
    if GRID_STRIDE_KERNELS.binary_search(&kernel).is_ok() && (gy, gz) == (1, 1) && gx > 0 {
        return Geometry {
            grid: (gx.div_ceil(CPU_STRIDE_FACTOR).min(65_534), 1, 1),
            ..planned
        };
    }
    if !ROW_KERNELS.contains(&kernel) {
        return planned;
    }
    let block = launch.block.clamp(1, 32);
    if !GEMV_KERNELS.contains(&kernel) {
        return Geometry { block, ..planned };
    }
    // Arguments dst, w, x: rows of w, columns of x, planes of dst.
    let t = tensor_args(launch, 3);
    let [dst, w, x] = t.as_slice() else {
        return Geometry { block, ..planned };
    };
    let work = u64::try_from(w.ne[1])
        .ok()
        .map(|m| m.div_ceil(u64::from(CPU_GEMV_ROWS)))
        .zip(u64::try_from(x.ne[1]).ok())
        .zip(u64::try_from(dst.ne[2].saturating_mul(dst.ne[3])).ok())
        .and_then(|((r, n), p)| r.checked_mul(n)?.checked_mul(p))
        .and_then(|g| u32::try_from(g).ok());
    match work {
        Some(g) if g > 0 => Geometry {
            grid: (g, 1, 1),
            block,
            rows: CPU_GEMV_ROWS,
        },
        _ => Geometry { block, ..planned },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(data: u64, dtype: DType, ne: [i64; 4], nb: [i64; 4]) -> Arg {
        let mut b = [0u8; 80];
        b[..8].copy_from_slice(&data.to_ne_bytes());
        for d in 0..4 {
            b[8 + 8 * d..16 + 8 * d].copy_from_slice(&ne[d].to_ne_bytes());
            b[40 + 8 * d..48 + 8 * d].copy_from_slice(&nb[d].to_ne_bytes());
        }
        b[72..76].copy_from_slice(&type_code(dtype).to_ne_bytes());
        Arg::Tensor(b)
    }

    fn launch(args: Vec<Arg>) -> Launch {
        Launch {
            kernel: "k_binary",
            grid: (1, 1, 1),
            block: 256,
            args,
        }
    }

    #[test]
    fn types_and_layouts() {
        let dense = tensor(0x1000, DType::F32, [8, 3, 1, 1], [4, 32, 96, 96]);
        // Rows of 8 f16 every 32 bytes: contiguous rows, not packed.
        let strided = tensor(0x1010, DType::F16, [8, 3, 1, 1], [2, 32, 96, 96]);
        // A transposed view: rows not contiguous; odd address.
        let view = tensor(0x1004, DType::F32, [3, 8, 1, 1], [32, 4, 96, 96]);
        let q = tensor(0x2000, DType::Q8_0, [64, 2, 1, 1], [34, 68, 136, 136]);
        let l = launch(vec![dense, strided, Arg::I32(7), view, q]);
        let g = Geometry {
            grid: (1, 1, 1),
            block: 256,
            rows: 64,
        };
        let all = Spec::of(&l, &g, 0b1111_1111);
        assert_eq!(all.block, 256);
        assert_eq!(all.types, [0, 1, 0, 4]);
        assert_eq!((all.int0, all.rows), (7, 64));
        assert_eq!(all.layout & 0xf, ROW | DENSE | SAME | ALIGN16);
        assert_eq!((all.layout >> 4) & 0xf, ROW | SAME | ALIGN16);
        assert_eq!((all.layout >> 8) & 0xf, 0);
        assert_eq!((all.layout >> 12) & 0xf, ROW | DENSE);
        // Only what the module declares is part of the key.
        let types_only = Spec::of(&l, &g, 0b000_0111);
        assert_eq!((types_only.types, types_only.layout), ([0, 1, -1, -1], 0));
        assert_eq!(types_only.int0, INT_UNSET);
        assert_eq!(Spec::of(&l, &g, 1).types, [-1; 4]);
        let (ids, bytes) = all.data();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(&bytes[..4], &256u32.to_ne_bytes());
        assert_eq!(&bytes[8..12], &1u32.to_ne_bytes());
        assert_eq!(&bytes[24..28], &7u32.to_ne_bytes());
        assert_eq!(&bytes[28..32], &64u32.to_ne_bytes());
    }

    #[test]
    fn cpu_geometry() {
        let (cpu, gpu) = (true, false);
        assert!(GRID_STRIDE_KERNELS.is_sorted());
        let geo = |kind, kernel: &'static str, gx: u32, block: u32, args: Vec<Arg>| {
            let g = geometry(
                kind,
                &Launch {
                    kernel,
                    grid: (gx, 1, 1),
                    block,
                    args,
                },
            );
            (g.grid.0, g.block, g.rows)
        };
        assert_eq!(geo(cpu, "k_binary", 16, 256, vec![]), (1, 256, 4));
        assert_eq!(geo(cpu, "k_map", 257, 256, vec![]), (17, 256, 4));
        assert_eq!(geo(cpu, "k_map", 1 << 20, 256, vec![]), (65_534, 256, 4));
        assert_eq!(geo(gpu, "k_binary", 16, 256, vec![]), (16, 256, 4));
        assert_eq!(geo(cpu, "k_add_f32", 65_540, 256, vec![]), (65_540, 256, 4));
        assert_eq!(geo(cpu, "k_norm", 512, 256, vec![]), (512, 32, 4));
        assert_eq!(geo(gpu, "k_norm", 512, 256, vec![]), (512, 256, 4));
        assert_eq!(geo(cpu, "k_soft_max", 512, 256, vec![]), (512, 256, 4));
        // GEMV of 4100 rows, 3 columns, 2 planes: ceil(4100 / 64) * 3 * 2 workgroups.
        let f = |dt, ne| tensor(0, dt, ne, [4, 0, 0, 0]);
        let gemv = vec![
            f(DType::F32, [4100, 3, 2, 1]),
            f(DType::Q8_0, [64, 4100, 1, 1]),
            f(DType::F32, [64, 3, 2, 1]),
            Arg::I64(2),
            Arg::I64(1),
        ];
        let planned = 4100u32.div_ceil(4) * 6;
        assert_eq!(
            geo(cpu, "k_mul_mat_vec_q", planned, 128, gemv.clone()),
            (65 * 6, 32, 64)
        );
        assert_eq!(
            geo(gpu, "k_mul_mat_vec_q", planned, 128, gemv),
            (planned, 128, 4)
        );
        // Each listed kernel strides over the grid through common.glsl's helpers.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/vulkan");
        for k in GRID_STRIDE_KERNELS {
            let src = std::fs::read_to_string(dir.join(format!("{k}.comp"))).unwrap();
            assert!(
                src.contains("GRID_STRIDE") || src.contains("ts_grid_threads"),
                "{k} is not a grid-stride kernel"
            );
            assert!(
                !src.contains("gl_NumWorkGroups"),
                "{k} reads the grid itself"
            );
        }
    }

    #[test]
    fn spec_ids_of_spirv() {
        // Header, then OpDecorate %5 SpecId 0, OpDecorate %6 SpecId 5, OpNop.
        let words = [
            0x0723_0203,
            0x0001_0500,
            0,
            10,
            0,
            (4 << 16) | 71,
            5,
            1,
            0,
            (4 << 16) | 71,
            6,
            1,
            5,
            (1 << 16),
        ];
        assert_eq!(declared(&words), 0b10_0001);
        // A zero word count stops the scan instead of looping.
        assert_eq!(declared(&[0, 0, 0, 0, 0, 0]), 0);
    }
}
