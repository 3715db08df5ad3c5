//! Launch planning for the CUDA C kernels, shared by every backend that runs them (CUDA through
//! NVRTC, HIP through hipRTC, SYCL through the compat header): [`supports`] says which nodes the
//! kernels implement, [`plan`] turns one node into a kernel name, a CUDA-style grid and block, and
//! an argument list that mirrors the kernel's C signature one for one.

use tessera_core::{DType, Op, OpKind, RopeMode, Support, TensorDesc, TensorId};
use tessera_kernels::gpu::launch::{Arg, Launch, tensor_arg as ktensor};

/// What [`resolve`] returns: one device address per tensor, and the buffers used.
pub type Resolved = (Vec<u64>, Vec<std::sync::Arc<dyn tessera_core::Buffer>>);

/// Resolves the device address of every leaf and node of `graph` for a stream of device
/// `device`: `addr` gives a buffer's base address (or the error for memory the stream cannot
/// use, describing the tensor with the text its second argument makes), offsets come from `bindings`, and every address and stride must be aligned for its
/// element type. Returns one address per tensor (0 for tensors the graph does not touch) and the
/// buffers used, once each, for the caller to keep alive while the work is queued.
///
/// # Errors
/// Binding errors, `addr`'s errors, and [`tessera_core::Error::Unsupported`] naming the tensor
/// for misaligned data.
pub fn resolve(
    graph: &tessera_core::Graph,
    bindings: &tessera_core::Bindings,
    device: &str,
    addr: impl Fn(&dyn tessera_core::Buffer, &dyn Fn() -> String) -> tessera_core::Result<u64>,
) -> tessera_core::Result<Resolved> {
    let tensors = graph.tensors();
    let mut ptrs = vec![0u64; tensors.len()];
    let mut held: Vec<std::sync::Arc<dyn tessera_core::Buffer>> = Vec::new();
    for &id in graph.leafs().iter().chain(graph.nodes()) {
        let (buf, off) = bindings.resolve(tensors, id)?;
        let t = &tensors[id.index()];
        // The label is formatted only for an error: this runs for every tensor of every graph.
        let base = addr(buf.as_ref(), &|| format!("tensor {} in", graph.label(id)))?;
        let at = base + off as u64;
        let align = alignment_of(t.dtype()) as u64;
        if !at.is_multiple_of(align) || t.nb().iter().any(|&s| !(s as u64).is_multiple_of(align)) {
            return Err(tessera_core::Error::Unsupported {
                op: t.op().name().to_string(),
                dtype: t.dtype(),
                device: device.to_string(),
                reason: format!("tensor {} is not {align}-byte aligned", graph.label(id)),
            });
        }
        ptrs[id.index()] = at;
        if !held.iter().any(|h| std::sync::Arc::ptr_eq(h, &buf)) {
            held.push(buf);
        }
    }
    Ok((ptrs, held))
}

/// What one node runs: its launches, in order, and the bytes of the stream's scratch memory
/// they use (from the scratch's start; nodes run one after another on a stream, so every node
/// may use the same scratch).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodePlan {
    /// Launches, in the order they must run.
    pub launches: Vec<Launch>,
    /// Scratch bytes used.
    pub scratch: usize,
}

impl NodePlan {
    fn one(l: Launch) -> NodePlan {
        NodePlan {
            launches: vec![l],
            scratch: 0,
        }
    }
    /// The node's main launch (its last), if it launches anything.
    pub fn main(&self) -> Option<&Launch> {
        self.launches.last()
    }
}

/// Device addresses the plans of a stream's nodes take besides their tensors'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamMem {
    /// The stream's status words (`int[2]`), where kernels report index errors.
    pub status: u64,
    /// The stream's scratch memory (aligned to 256 bytes), of `scratch_len` bytes.
    pub scratch: u64,
    /// Bytes of scratch memory at `scratch`; a plan may ask for more ([`NodePlan::scratch`]),
    /// and is then made again with a larger scratch.
    pub scratch_len: usize,
}

/// Whether `l` rounds activations into scratch for the GEMV on 8-bit activations. Two such
/// launches with equal arguments write the same scratch from the same tensor: the second may
/// be left out while every launch between them only [`reads_rounded_activations`].
pub fn rounds_activations(l: &Launch) -> bool {
    l.kernel == "k_quantize_x8"
}

/// Whether `l` is a product on 8-bit activations (GEMV or GEMM): it reads the rounded
/// activations and its weights and writes only its output tensor.
pub fn reads_rounded_activations(l: &Launch) -> bool {
    l.kernel.starts_with("k_gemv8_") || l.kernel.starts_with("k_mmq_")
}

/// The device bytes tensor `t` at `ptr` may touch (a bound: it covers every element whatever
/// the strides; empty for an empty tensor).
pub fn extent(t: &TensorDesc, ptr: u64) -> std::ops::Range<u64> {
    if t.nelements() == 0 {
        return ptr..ptr;
    }
    let span: u64 = (1..4)
        .map(|d| (t.ne()[d] as u64 - 1) * t.nb()[d] as u64)
        .sum();
    // A row: its bytes when its elements are packed, else its last element's end.
    let row = if t.nb()[0] == t.dtype().type_size() {
        t.row_bytes()
    } else {
        (t.ne()[0] - 1) * t.nb()[0] + t.dtype().type_size()
    };
    ptr..ptr + span + row as u64
}

/// Alignment of every scratch region a plan uses.
const SCRATCH_ALIGN: usize = 256;

/// Builds argument lists.
#[derive(Default)]
struct Args(Vec<Arg>);

impl Args {
    fn push_bytes(&mut self, t: &[u8; 80]) -> &mut Args {
        self.0.push(Arg::Tensor(*t));
        self
    }
    fn i32(&mut self, v: i32) -> &mut Args {
        self.0.push(Arg::I32(v));
        self
    }
    fn i64(&mut self, v: i64) -> &mut Args {
        self.0.push(Arg::I64(v));
        self
    }
    fn f32(&mut self, v: f32) -> &mut Args {
        self.0.push(Arg::F32(v));
        self
    }
    fn f64(&mut self, v: f64) -> &mut Args {
        self.0.push(Arg::F64(v));
        self
    }
    fn ptr(&mut self, v: u64) -> &mut Args {
        self.0.push(Arg::Ptr(v));
        self
    }
}

/// Largest head size FLASH_ATTN_EXT takes (`FA_MAX_D` in attn.cu).
const FA_MAX_D: usize = 512;
/// Longest row ARGSORT takes (`ARGSORT_MAX` in moe.cu: the row's keys sit in shared memory).
const ARGSORT_MAX: usize = 4096;
/// Whether MUL_MAT_ID takes weights of `d`: every type `ld` in common.cuh dequantises (every
/// kernel type code but I32), which k_mul_mat_id reads its weights with.
fn mul_mat_id_weight(d: DType) -> bool {
    d != DType::I32 && type_code(d) >= 0
}
/// Threads per block of the grid-stride kernels.
const BLOCK: u32 = 256;
/// Upper bound of blocks for grid-stride kernels (they loop past it).
const MAX_BLOCKS: u64 = 1 << 20;

use tessera_kernels::gpu::codes::{BinCode, GluCode, MapCode, type_code};

/// Required alignment of a tensor's address and strides for the kernels' loads (MXFP4 blocks
/// are 17 bytes, read byte by byte).
pub fn alignment_of(d: DType) -> usize {
    match d {
        DType::MXFP4 => 1,
        d if d.is_quantized() => 2,
        d => d.type_size(),
    }
}

/// Whether the kernels only read `d` (dequantize it) and have no quantizer for it: Q2_K, Q3_K,
/// IQ4_XS, MXFP4, Q4_K, Q5_K and Q6_K. (Every KV cache type has one.)
pub fn read_only_dtype(d: DType) -> bool {
    matches!(
        d,
        DType::Q2_K
            | DType::Q3_K
            | DType::IQ4_XS
            | DType::MXFP4
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// Whether the kernels implement node `node`.
pub fn supports(tensors: &[TensorDesc], node: TensorId) -> Support {
    let Some(t) = tensors.get(node.index()) else {
        return Support::No(format!("unknown tensor {node}"));
    };
    let src = |i: usize| t.src(i).and_then(|s| tensors.get(s.index()));
    let all_known = std::iter::once(t)
        .chain((0..5).filter_map(src))
        .all(|d| type_code(d.dtype()) >= 0);
    if !all_known {
        return Support::No("a dtype without a CUDA kernel".into());
    }
    let rows_fit = |d: &TensorDesc| d.nrows() <= i32::MAX as usize;
    let same_type_copy = matches!(t.op().kind(), OpKind::Cpy | OpKind::Cont)
        && src(0).is_some_and(|s| s.dtype() == t.dtype() && s.ne() == t.ne());
    if read_only_dtype(t.dtype()) && !t.op().kind().is_view() && !same_type_copy {
        return Support::No(format!("no kernel writes {}", t.dtype()));
    }
    match t.op().kind() {
        OpKind::None | OpKind::View | OpKind::Reshape | OpKind::Permute | OpKind::Transpose => {
            Support::Yes
        }
        // The kernels read one mask plane for every batch.
        OpKind::FlashAttnExt if src(3).is_some_and(|m| m.ne()[3] > 1) => {
            Support::No("FLASH_ATTN_EXT with a mask plane per batch".into())
        }
        OpKind::FlashAttnExt => match (src(0), src(2)) {
            (Some(q), Some(v)) if q.ne()[0] <= FA_MAX_D && v.ne()[0] <= FA_MAX_D => Support::Yes,
            _ => Support::No(format!("FLASH_ATTN_EXT head sizes above {FA_MAX_D}")),
        },
        OpKind::MulMat => {
            let planes = t.ne()[2] * t.ne()[3];
            if planes > 65535 || t.ne()[1].div_ceil(64) > 65535 {
                Support::No(
                    "MUL_MAT grid too large (more than 65535 planes or column tiles)".into(),
                )
            } else {
                Support::Yes
            }
        }
        OpKind::MulMatId => match src(0) {
            Some(w) if mul_mat_id_weight(w.dtype()) => Support::Yes,
            Some(w) => Support::No(format!(
                "MUL_MAT_ID has no kernel for {} weights",
                w.dtype()
            )),
            None => Support::No("MUL_MAT_ID without weights".into()),
        },
        OpKind::Argsort => match src(0) {
            Some(a) if a.ne()[0] <= ARGSORT_MAX && rows_fit(a) => Support::Yes,
            _ => Support::No(format!(
                "ARGSORT rows longer than {ARGSORT_MAX} or more than 2^31 rows"
            )),
        },
        OpKind::RmsNorm | OpKind::Norm | OpKind::SumRows | OpKind::Argmax | OpKind::SoftMax => {
            match src(0) {
                Some(a) if rows_fit(a) => Support::Yes,
                _ => Support::No("more than 2^31 rows".into()),
            }
        }
        OpKind::Cont
        | OpKind::Cpy
        | OpKind::GetRows
        | OpKind::SetRows
        | OpKind::Concat
        | OpKind::Add
        | OpKind::Sub
        | OpKind::Mul
        | OpKind::Div
        | OpKind::Scale
        | OpKind::Sqr
        | OpKind::Sqrt
        | OpKind::Clamp
        | OpKind::Unary
        | OpKind::Glu
        | OpKind::SwigluOai
        | OpKind::AddId
        | OpKind::Rope => Support::Yes,
        other => Support::No(format!("{other} has no CUDA kernel")),
    }
}

fn launch(kernel: &'static str, grid: (u32, u32, u32), block: u32, args: &mut Args) -> Launch {
    Launch {
        kernel,
        grid,
        block,
        args: std::mem::take(&mut args.0),
    }
}

fn grid_1d(n: usize) -> (u32, u32, u32) {
    let blocks = (n as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS);
    (blocks as u32, 1, 1)
}

/// Threads for one block per row: a multiple of 32, at most 256, no more than the row needs.
fn row_block(ne0: usize) -> u32 {
    (ne0.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// ALiBi parameters (alibi on, m0, m1, n_head_log2) for `n_head` heads, as ggml.
fn alibi(max_bias: f32, n_head: usize) -> (i32, f32, f32, i32) {
    if max_bias <= 0.0 {
        return (0, 1.0, 1.0, 1);
    }
    let n_head_log2 = 1usize << (usize::BITS - 1 - n_head.max(1).leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    (1, m0, m1, n_head_log2 as i32)
}

/// The launches of node `node` (none when it computes nothing: views, empty tensors). `ptrs`
/// holds the device address of every tensor (0 for tensors the graph does not touch) and `mem`
/// the stream's status words and scratch. The node must be one [`supports`] accepts, in a
/// validated graph.
pub fn plan(tensors: &[TensorDesc], ptrs: &[u64], mem: StreamMem, node: TensorId) -> NodePlan {
    plan_with(tensors, ptrs, mem, node, &|_| true)
}

/// [`plan`] for a backend that may lack some kernels: `has(name)` says whether it has kernel
/// `name`. Where a faster kernel is optional (the GEMV at memory bandwidth, `k_gemv_*`), a
/// backend without it gets the general one.
pub fn plan_with(
    tensors: &[TensorDesc],
    ptrs: &[u64],
    mem: StreamMem,
    node: TensorId,
    has: &dyn Fn(&str) -> bool,
) -> NodePlan {
    Planner {
        status: mem.status,
        scratch: mem.scratch,
        tensors,
        ptrs,
        has,
    }
    .node(node)
}

/// The fused launch of RMS_NORM or NORM node `norm` and the MUL node `mul` that scales its
/// output (`k_norm_mul`: the norm, written as a node's result, then the product with `mul`'s
/// other source broadcast over the rows), if the device has the kernel and the pair fits it:
/// `mul`'s first source is `norm`, and both are f32 of one shape. The pair then computes what
/// the two launches did, whoever reads the norm.
pub fn plan_norm_mul(
    tensors: &[TensorDesc],
    ptrs: &[u64],
    norm: TensorId,
    mul: TensorId,
    has: &dyn Fn(&str) -> bool,
) -> Option<NodePlan> {
    let (tn, tm) = (tensors.get(norm.index())?, tensors.get(mul.index())?);
    let (eps, mode) = match *tn.op() {
        Op::RmsNorm { eps } => (eps, 0),
        Op::Norm { eps } => (eps, 1),
        _ => return None,
    };
    let w = tm.src(1)?;
    let a = tn.src(0)?;
    let fits = matches!(tm.op(), Op::Mul)
        && tm.src(0) == Some(norm)
        && w != norm
        && tn.dtype() == DType::F32
        && tm.dtype() == DType::F32
        && tn.ne() == tm.ne()
        && tn.nelements() > 0
        && has("k_norm_mul");
    if !fits {
        return None;
    }
    let p = Planner {
        status: 0,
        scratch: 0,
        tensors,
        ptrs,
        has,
    };
    let ta = p.desc(a);
    let mut args = Args::default();
    args.push_bytes(&p.kt(mul))
        .push_bytes(&p.kt(norm))
        .push_bytes(&p.kt(a))
        .push_bytes(&p.kt(w))
        .f32(eps)
        .i32(mode);
    Some(p.go(
        "k_norm_mul",
        (ta.nrows() as u32, 1, 1),
        row_block(ta.ne()[0]),
        &mut args,
    ))
}

/// The environment variable that turns the GEMV on 8-bit activations (`k_gemv8_*`, activations
/// quantized once per product into scratch) off (`0`), for comparisons.
pub const GEMV8_ENV: &str = "TESSERA_GPU_GEMV8";

fn gemv8_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| tessera_core::settings::var_once(GEMV8_ENV).is_none_or(|v| v.trim() != "0"))
}

/// The environment variable that chooses where the kernels on tensor-core tiles run: `0`
/// nowhere (for comparisons: quantized products of more than 8 columns then take
/// `k_mul_mat_tiled` instead of `k_mmq_*`, prompt attention `k_flash_attn_tiled` instead of
/// `k_flash_attn_mma`), `1` everywhere (emulated where the device lacks the instructions: how
/// CI runs them on SYCL's CPU device); unset, on devices that multiply tiles in hardware
/// ([`crate::Driver::has_mma_tiles`]).
pub const MMA_ENV: &str = "TESSERA_GPU_MMA";

/// Whether a device plans the tile kernels, given whether it multiplies tiles in `hardware`
/// ([`MMA_ENV`]).
pub fn mma_tiles(hardware: bool) -> bool {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let forced =
        *FORCED.get_or_init(|| tessera_core::settings::var_once(MMA_ENV).map(|v| v.trim() != "0"));
    forced.unwrap_or(hardware)
}

/// Whether `kernel` is one of the kernels on tensor-core tiles, which a device plans only
/// where [`mma_tiles`] says so.
pub fn is_tile_kernel(kernel: &str) -> bool {
    kernel.starts_with("k_mmq_") || kernel == "k_flash_attn_mma"
}

/// Fewest activation columns the GEMM on integer tiles takes: products of up to 8 columns are
/// the decode issue's (GEMVs and small batches), as in llama.cpp's split between its MMVQ and
/// MMQ kernels.
pub const MMQ_MIN_COLS: usize = 9;

/// The environment variable that sets how many keys one block of the split decode attention
/// takes (`k_flash_attn_split`; a multiple of 32, default at most 256), for tuning.
pub const FA_CHUNK_ENV: &str = "TESSERA_GPU_FA_CHUNK";

/// Most scratch bytes the split attention's partial results may take.
const FA_SCRATCH_MAX: usize = 32 << 20;

/// Most keys per block of the split decode attention.
const FA_CHUNK: usize = 256;

/// Keys per block of the split decode attention over `n_kv` keys: at most [`FA_CHUNK`], and at
/// least two blocks per (query, head) from 64 keys on. On an H200 (1.1B and 8B llamas, 32
/// heads), 128 keys per block beat 256 by 6% in whole-model decode over 256 cached cells, and
/// over 4096 keys 128 and 512 took 11 to 17% and 30% longer than 256.
fn fa_chunk(n_kv: usize) -> usize {
    static CHUNK: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = *CHUNK.get_or_init(|| {
        tessera_core::settings::var_once(FA_CHUNK_ENV)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map(|c| c.next_multiple_of(32).max(32))
    });
    forced.unwrap_or_else(|| (n_kv / 2).next_multiple_of(32).clamp(32, FA_CHUNK))
}

/// Query heads per block of `k_flash_attn_mma` for `group` query heads per KV head: the
/// largest power of two dividing it, at most 16 (a block's 64 rows are 64 / that queries of
/// that many heads, which share each staged key and value).
fn fa_heads_per_block(group: usize) -> usize {
    let pow2 = 1usize << group.max(1).trailing_zeros();
    pow2.min(16)
}

/// The environment variable that sets the weight rows per block of the GEMV on 8-bit
/// activations (`k_gemv8_*`: 1 to 4, default 4), for tuning.
pub const G8_ROWS_ENV: &str = "TESSERA_GPU_G8_ROWS";

/// Weight rows per block of `k_gemv8_*` (at most `G8_MAX_ROWS` in matmul.cu). On an H200, 2
/// rows decoded a 1.1B and an 8B Q4_0 llama 16 to 19% faster than 1, and 4 another 3% and 5%:
/// each thread has that many rows' loads in flight.
const G8_ROWS: usize = 4;

fn g8_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        tessera_core::settings::var_once(G8_ROWS_ENV)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(G8_ROWS, |r| r.clamp(1, 4))
    })
}

struct Planner<'a> {
    status: u64,
    scratch: u64,
    tensors: &'a [TensorDesc],
    ptrs: &'a [u64],
    has: &'a dyn Fn(&str) -> bool,
}

impl Planner<'_> {
    fn desc(&self, id: TensorId) -> &TensorDesc {
        &self.tensors[id.index()]
    }
    fn kt(&self, id: TensorId) -> [u8; 80] {
        ktensor(self.desc(id), self.ptrs[id.index()])
    }
    /// Whether tensor `id`'s address and row, plane and batch strides are multiples of `a`.
    fn rows_aligned(&self, id: TensorId, a: u64) -> bool {
        let d = self.desc(id);
        self.ptrs[id.index()].is_multiple_of(a)
            && d.nb()[1..].iter().all(|&nb| (nb as u64).is_multiple_of(a))
    }
    fn src(&self, node: TensorId, i: usize) -> TensorId {
        // Validated graphs always carry the sources their op needs; a missing one is a Tessera bug.
        self.desc(node)
            .src(i)
            .unwrap_or_else(|| unreachable!("node {node} lacks source {i}"))
    }

    fn go(
        &self,
        kernel: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut Args,
    ) -> NodePlan {
        NodePlan::one(launch(kernel, grid, block, args))
    }

    fn node(&self, node: TensorId) -> NodePlan {
        let t = self.desc(node);
        let n = t.nelements();
        if n == 0 || t.op().kind().is_view() {
            return NodePlan::default();
        }
        let dst = self.kt(node);
        let mut args = Args::default();
        match *t.op() {
            Op::Add | Op::Sub | Op::Mul | Op::Div => {
                let code = match t.op() {
                    Op::Add => BinCode::Add,
                    Op::Sub => BinCode::Sub,
                    Op::Mul => BinCode::Mul,
                    _ => BinCode::Div,
                } as i32;
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .i32(code)
                    .i64(n as i64);
                self.go("k_binary", grid_1d(n), BLOCK, &mut args)
            }
            Op::Scale { .. } | Op::Sqr | Op::Sqrt | Op::Clamp { .. } | Op::Unary(_) => {
                let (code, p0, p1) = match *t.op() {
                    Op::Scale { scale, bias } => (MapCode::Scale, scale, bias),
                    Op::Sqr => (MapCode::Sqr, 0.0, 0.0),
                    Op::Sqrt => (MapCode::Sqrt, 0.0, 0.0),
                    Op::Clamp { min, max } => (MapCode::Clamp, min, max),
                    Op::Unary(u) => (MapCode::of_unary(u), 0.0, 0.0),
                    _ => unreachable!("matched above"),
                };
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .i32(code as i32)
                    .f32(p0)
                    .f32(p1)
                    .i64(n as i64);
                self.go("k_map", grid_1d(n), BLOCK, &mut args)
            }
            Op::Glu { op, swapped } => {
                let a = self.src(node, 0);
                let b = t.src(1);
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(a))
                    .push_bytes(&self.kt(b.unwrap_or(a)))
                    .i32(b.is_some() as i32)
                    .i32(GluCode::of(op) as i32)
                    .i32(swapped as i32)
                    .i64(n as i64);
                self.go("k_glu", grid_1d(n), BLOCK, &mut args)
            }
            Op::SwigluOai { alpha, limit } => {
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .f32(alpha)
                    .f32(limit)
                    .i64(n as i64);
                self.go("k_swiglu_oai", grid_1d(n), BLOCK, &mut args)
            }
            Op::AddId => {
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .push_bytes(&self.kt(self.src(node, 2)))
                    .ptr(self.status)
                    .i64(n as i64);
                self.go("k_add_id", grid_1d(n), BLOCK, &mut args)
            }
            Op::Argsort { descending } => {
                let a = self.src(node, 0);
                let ta = self.desc(a);
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(a))
                    .i32(descending as i32);
                self.go(
                    "k_argsort",
                    (ta.nrows() as u32, 1, 1),
                    row_block(ta.ne()[0]),
                    &mut args,
                )
            }
            Op::MulMatId { first_expert } => {
                let w = self.src(node, 0);
                // One work block per (4 weight rows, slot, token); the kernel strides past the grid.
                let blocks = self.desc(w).ne()[1].div_ceil(4) * t.ne()[1] * t.ne()[2];
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(w))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .push_bytes(&self.kt(self.src(node, 2)))
                    .ptr(self.status)
                    .i32(first_expert.is_some() as i32)
                    .i64(first_expert.unwrap_or(0) as i64);
                let grid = (blocks as u64).clamp(1, MAX_BLOCKS) as u32;
                self.go("k_mul_mat_id", (grid, 1, 1), 128, &mut args)
            }
            Op::RmsNorm { eps } | Op::Norm { eps } => {
                let a = self.src(node, 0);
                let mode = matches!(t.op(), Op::Norm { .. }) as i32;
                let ta = self.desc(a);
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(a))
                    .f32(eps)
                    .i32(mode);
                self.go(
                    "k_norm",
                    (ta.nrows() as u32, 1, 1),
                    row_block(ta.ne()[0]),
                    &mut args,
                )
            }
            Op::SumRows | Op::Argmax => {
                let a = self.src(node, 0);
                let ta = self.desc(a);
                args.push_bytes(&dst).push_bytes(&self.kt(a));
                let k = if matches!(t.op(), Op::SumRows) {
                    "k_sum_rows"
                } else {
                    "k_argmax"
                };
                self.go(
                    k,
                    (ta.nrows() as u32, 1, 1),
                    row_block(ta.ne()[0]),
                    &mut args,
                )
            }
            Op::SoftMax { scale, max_bias } => {
                let a = self.src(node, 0);
                let mask = t.src(1);
                let (on, m0, m1, nl2) = alibi(max_bias, t.ne()[2]);
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(a))
                    .push_bytes(&self.kt(mask.unwrap_or(a)))
                    .i32(mask.is_some() as i32)
                    .f32(scale)
                    .i32(on)
                    .f32(m0)
                    .f32(m1)
                    .i32(nl2);
                self.go(
                    "k_soft_max",
                    (t.nrows() as u32, 1, 1),
                    row_block(t.ne()[0]),
                    &mut args,
                )
            }
            Op::Rope(p) => {
                let half = p.n_dims / 2;
                let slots = half + (t.ne()[0] - p.n_dims).div_ceil(2);
                let total = slots * t.nrows();
                let theta_scale = (p.freq_base as f64).powf(-2.0 / p.n_dims as f64);
                // Without factors the positions stand in for them; the kernel never reads them.
                let freqs = t.src(2).unwrap_or(self.src(node, 1));
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .push_bytes(&self.kt(freqs))
                    .i32(t.src(2).is_some() as i32)
                    .i32(p.n_dims as i32)
                    .i32((p.mode == RopeMode::Neox) as i32)
                    .f64(theta_scale)
                    .f64(p.freq_scale as f64)
                    .i64(slots as i64)
                    .i64(total as i64);
                self.go("k_rope", grid_1d(total), BLOCK, &mut args)
            }
            Op::MulMat => self.mul_mat(node, &dst),
            Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
            } => {
                let (q, k, v) = (self.src(node, 0), self.src(node, 1), self.src(node, 2));
                let (mask, sinks) = (t.src(3), t.src(4));
                let tq = self.desc(q);
                let tasks = tq.ne()[1] * tq.ne()[2] * tq.ne()[3];
                let (on, m0, m1, nl2) = alibi(max_bias, tq.ne()[2]);
                let scale = if softcap != 0.0 {
                    scale / softcap
                } else {
                    scale
                };
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(q))
                    .push_bytes(&self.kt(k))
                    .push_bytes(&self.kt(v))
                    .push_bytes(&self.kt(mask.unwrap_or(q)))
                    .i32(mask.is_some() as i32)
                    .f32(scale)
                    .f32(softcap)
                    .i32(on)
                    .f32(m0)
                    .f32(m1)
                    .i32(nl2)
                    .push_bytes(&self.kt(sinks.unwrap_or(q)))
                    .i32(sinks.is_some() as i32);
                let (d, dv) = (tq.ne()[0], self.desc(v).ne()[0]);
                // Prompts on tensor-core tiles: F16 or BF16 caches, d == dv a multiple of 16 up
                // to 128; 64 (query, head) rows per block, `gq` heads of one KV group each, the
                // head groups and batches on the grid's y and z axes.
                let half = |id: TensorId| matches!(self.desc(id).dtype(), DType::F16 | DType::BF16);
                let group = tq.ne()[2] / self.desc(k).ne()[2].max(1);
                let gq = fa_heads_per_block(group);
                let on_mma = tq.ne()[1] >= 8
                    && d == dv
                    && d.is_multiple_of(16)
                    && d <= 128
                    && half(k)
                    && half(v)
                    && tq.ne()[2] / gq <= 65535
                    && tq.ne()[3] <= 65535
                    && (self.has)("k_flash_attn_mma");
                if on_mma {
                    let grid = (
                        tq.ne()[1].div_ceil(64 / gq) as u32,
                        (tq.ne()[2] / gq) as u32,
                        tq.ne()[3] as u32,
                    );
                    args.i32(gq as i32);
                    return self.go("k_flash_attn_mma", grid, 128, &mut args);
                }
                // Prompts: FT_Q (16) queries per block of one head, keys through shared memory
                // (attn.cu); d == dv, a multiple of 32 up to 128.
                let tiled = tq.ne()[1] >= 8
                    && d == dv
                    && d.is_multiple_of(32)
                    && d <= 128
                    && (self.has)("k_flash_attn_tiled");
                if tiled {
                    let blocks = tq.ne()[1].div_ceil(16) * tq.ne()[2] * tq.ne()[3];
                    self.go("k_flash_attn_tiled", (blocks as u32, 1, 1), 128, &mut args)
                } else if (self.has)("k_flash_attn_split") && (self.has)("k_flash_attn_merge") {
                    // Decoding: nsplit blocks of 128 threads per (query, head), each on `chunk`
                    // keys; partial softmaxes in scratch and a merge when there are several.
                    let n_kv = self.desc(k).ne()[1];
                    let mut chunk = fa_chunk(n_kv);
                    let mut nsplit = n_kv.div_ceil(chunk).max(1);
                    // Partial results grow with queries × splits: past FA_SCRATCH_MAX (long
                    // prompts the tiled kernel does not take) fewer, longer splits, down to
                    // one block per task, which needs no scratch.
                    let per_split = tasks * (dv + 2) * 4;
                    if nsplit * per_split > FA_SCRATCH_MAX {
                        nsplit = (FA_SCRATCH_MAX / per_split).max(1);
                        chunk = n_kv.div_ceil(nsplit).next_multiple_of(32);
                        nsplit = n_kv.div_ceil(chunk).max(1);
                    }
                    let part_bytes = nsplit * per_split;
                    let part = if nsplit > 1 { self.scratch } else { 0 };
                    args.ptr(part).i32(nsplit as i32).i64(chunk as i64);
                    // Heads up to 128 take the kernel with a quarter of the accumulators.
                    let kernel = if d <= 128 && dv <= 128 && (self.has)("k_flash_attn_split128") {
                        "k_flash_attn_split128"
                    } else {
                        "k_flash_attn_split"
                    };
                    let split = launch(kernel, ((tasks * nsplit) as u32, 1, 1), 128, &mut args);
                    if nsplit == 1 {
                        return NodePlan::one(split);
                    }
                    let mut margs = Args::default();
                    margs
                        .push_bytes(&dst)
                        .push_bytes(&self.kt(q))
                        .push_bytes(&self.kt(v))
                        .push_bytes(&self.kt(sinks.unwrap_or(q)))
                        .i32(sinks.is_some() as i32)
                        .ptr(part)
                        .i32(nsplit as i32);
                    let merge = launch("k_flash_attn_merge", (tasks as u32, 1, 1), 128, &mut margs);
                    NodePlan {
                        launches: vec![split, merge],
                        scratch: part_bytes,
                    }
                } else {
                    self.go(
                        "k_flash_attn_ext",
                        (tasks.div_ceil(4) as u32, 1, 1),
                        128,
                        &mut args,
                    )
                }
            }
            Op::Cont | Op::Cpy => {
                let s = self.src(node, 0);
                let ts = self.desc(s);
                let same_shape = ts.ne() == t.ne();
                args.push_bytes(&dst).push_bytes(&self.kt(s));
                if ts.dtype() == t.dtype() && t.dtype().is_quantized() {
                    let rb = t.row_bytes();
                    let total = rb * t.nrows();
                    args.i64(rb as i64).i64(total as i64);
                    self.go("k_copy_rows", grid_1d(total), BLOCK, &mut args)
                } else if t.dtype().is_quantized() {
                    let blocks = n / 32;
                    args.i64(blocks as i64);
                    self.go("k_quantize", grid_1d(blocks), BLOCK, &mut args)
                } else {
                    args.i32(same_shape as i32).i64(n as i64);
                    self.go("k_cpy", grid_1d(n), BLOCK, &mut args)
                }
            }
            Op::GetRows => {
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .ptr(self.status)
                    .i64(n as i64);
                self.go("k_get_rows", grid_1d(n), BLOCK, &mut args)
            }
            Op::SetRows => {
                let s = self.src(node, 0);
                let ts = self.desc(s);
                let planes = ts.ne()[2] * ts.ne()[3];
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(s))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .ptr(self.status);
                if t.dtype().is_quantized() {
                    let total = ts.ne()[0] / 32 * planes;
                    args.i64(total as i64);
                    self.go("k_set_rows_q", grid_1d(total), BLOCK, &mut args)
                } else {
                    let total = ts.ne()[0] * planes;
                    args.i64(total as i64);
                    self.go("k_set_rows", grid_1d(total), BLOCK, &mut args)
                }
            }
            Op::Concat { dim } => {
                args.push_bytes(&dst)
                    .push_bytes(&self.kt(self.src(node, 0)))
                    .push_bytes(&self.kt(self.src(node, 1)))
                    .i32(dim as i32)
                    .i64(n as i64);
                self.go("k_concat", grid_1d(n), BLOCK, &mut args)
            }
            // View-like ops compute nothing; others are refused by `supports` before a run.
            _ => NodePlan::default(),
        }
    }

    /// The GEMV at memory bandwidth (`k_gemv_*` in matmul.cu) for MUL_MAT `node` (one column),
    /// if the device has it and the node fits it: a weight type it reads, f32 activations
    /// contiguous along k, and every row it loads at the alignment of its widest load (16 bytes
    /// for float weights and the activations, 4 for Q4_K, 2 for the other block formats); k a
    /// multiple of 8 (its lanes take 8 elements each).
    fn fast_gemv(&self, node: TensorId, w: TensorId, x: TensorId) -> Option<&'static str> {
        let (t, tw, tx) = (self.desc(node), self.desc(w), self.desc(x));
        let (kernel, align) = match tw.dtype() {
            DType::F32 => ("k_gemv_f32", 16),
            DType::F16 => ("k_gemv_f16", 16),
            DType::BF16 => ("k_gemv_bf16", 16),
            DType::Q8_0 => ("k_gemv_q8_0", 2),
            DType::Q4_0 => ("k_gemv_q4_0", 2),
            DType::Q4_K => ("k_gemv_q4_k", 4),
            DType::Q6_K => ("k_gemv_q6_k", 2),
            _ => return None,
        };
        let fits = (self.has)(kernel)
            && t.dtype() == DType::F32
            && tx.dtype() == DType::F32
            && tx.nb()[0] == 4
            && tw.nb()[0] == tw.dtype().type_size()
            && tw.ne()[0].is_multiple_of(8)
            && self.rows_aligned(w, align)
            && self.rows_aligned(x, 16);
        fits.then_some(kernel)
    }

    /// The GEMV on 8-bit activations (matmul.cu) for MUL_MAT `node` (one column), if the
    /// device has it and the node fits it: `k_quantize_x8` rounds every activation row once
    /// into scratch (as ggml's `quantize_row_q8_0`, which llama.cpp multiplies these weights
    /// with), then `k_gemv8_*` multiplies the weights' integer levels with them, a block of 128
    /// threads per weight row. For Q8_0, Q4_0, Q4_K and Q6_K weights (rows aligned as the
    /// widest load needs: 4 bytes for Q4_K, 2 for the others) and f32 activations contiguous
    /// along k in 16-byte aligned rows. `args` holds the GEMV's tensors and broadcast factors.
    fn gemv8(&self, node: TensorId, w: TensorId, x: TensorId, args: &mut Args) -> Option<NodePlan> {
        let (t, tw) = (self.desc(node), self.desc(w));
        let (kernel, align) = match tw.dtype() {
            DType::Q8_0 => ("k_gemv8_q8_0", 2),
            DType::Q4_0 => ("k_gemv8_q4_0", 2),
            DType::Q4_K => ("k_gemv8_q4_k", 4),
            DType::Q6_K => ("k_gemv8_q6_k", 2),
            _ => return None,
        };
        if !gemv8_on() || !self.fits_x8(node, w, x, kernel, align) {
            return None;
        }
        let (quantize, xq, xd, scratch) = self.quantize_x8(x);
        // One block of 128 threads per `rows` weight rows of a plane.
        let rows = g8_rows();
        let blocks = tw.ne()[1].div_ceil(rows) * t.ne()[2] * t.ne()[3];
        args.ptr(xq).ptr(xd).i32(rows as i32);
        let gemv = launch(kernel, (blocks as u32, 1, 1), 128, args);
        Some(NodePlan {
            launches: vec![quantize, gemv],
            scratch,
        })
    }

    /// Whether the device has `kernel` and `k_quantize_x8`, and MUL_MAT `node` of weights `w`
    /// and activations `x` fits a product on 8-bit activations: f32 output, weight rows packed
    /// and aligned to `align` bytes (the widest weight load), k a multiple of 32, and f32
    /// activations contiguous along k in 16-byte aligned rows.
    fn fits_x8(&self, node: TensorId, w: TensorId, x: TensorId, kernel: &str, align: u64) -> bool {
        let (t, tw, tx) = (self.desc(node), self.desc(w), self.desc(x));
        (self.has)(kernel)
            && (self.has)("k_quantize_x8")
            && t.dtype() == DType::F32
            && tx.dtype() == DType::F32
            && tx.nb()[0] == 4
            && tw.nb()[0] == tw.dtype().type_size()
            && tw.ne()[0].is_multiple_of(32)
            && self.rows_aligned(w, align)
            && self.rows_aligned(x, 16)
    }

    /// `k_quantize_x8` rounding every row of activations `x` (f32, contiguous along k, a
    /// multiple of 32) into scratch, as `(launch, levels, scales, scratch bytes)`: the levels
    /// (k bytes per row), then one f32 scale per 32. Every product on 8-bit activations asks
    /// for the same launch, so the stream can leave out a rounding already in scratch.
    fn quantize_x8(&self, x: TensorId) -> (Launch, u64, u64, usize) {
        let tx = self.desc(x);
        let (rows, k) = (tx.nrows(), tx.ne()[0]);
        let levels = (rows * k).next_multiple_of(SCRATCH_ALIGN);
        let scales = rows * (k / 32) * 4;
        let (xq, xd) = (self.scratch, self.scratch + levels as u64);
        let groups = rows * k / 8;
        let mut qargs = Args::default();
        qargs
            .push_bytes(&self.kt(x))
            .ptr(xq)
            .ptr(xd)
            .i64(groups as i64);
        let quantize = launch("k_quantize_x8", grid_1d(groups), BLOCK, &mut qargs);
        (quantize, xq, xd, levels + scales)
    }

    /// The GEMM on integer tensor-core tiles (`k_mmq_*`, matmul.cu) for MUL_MAT `node` of more
    /// than [`MMQ_MIN_COLS`]` - 1` columns, if the device has it and the node fits it: the
    /// activations rounded once into scratch as for [`Planner::gemv8`] (same weight types,
    /// alignment and activation layout), then blocks of 128 threads over 64 weight rows by 64
    /// columns. `args` holds the product's tensors and broadcast factors.
    fn mmq(&self, node: TensorId, w: TensorId, x: TensorId, args: &mut Args) -> Option<NodePlan> {
        let (t, tw, tx) = (self.desc(node), self.desc(w), self.desc(x));
        let (kernel, align) = match tw.dtype() {
            DType::Q8_0 => ("k_mmq_q8_0", 2),
            DType::Q4_0 => ("k_mmq_q4_0", 2),
            DType::Q5_0 => ("k_mmq_q5_0", 2),
            DType::Q4_K => ("k_mmq_q4_k", 4),
            DType::Q6_K => ("k_mmq_q6_k", 2),
            _ => return None,
        };
        let fits = tx.ne()[1] >= MMQ_MIN_COLS && self.fits_x8(node, w, x, kernel, align);
        if !fits {
            return None;
        }
        let (quantize, xq, xd, scratch) = self.quantize_x8(x);
        args.ptr(xq).ptr(xd);
        let grid = (
            tw.ne()[1].div_ceil(64) as u32,
            tx.ne()[1].div_ceil(64) as u32,
            (t.ne()[2] * t.ne()[3]) as u32,
        );
        let gemm = launch(kernel, grid, 128, args);
        Some(NodePlan {
            launches: vec![quantize, gemm],
            scratch,
        })
    }

    fn mul_mat(&self, node: TensorId, dst: &[u8; 80]) -> NodePlan {
        let t = self.desc(node);
        let (w, x) = (self.src(node, 0), self.src(node, 1));
        let (tw, tx) = (self.desc(w), self.desc(x));
        let (m, ncols) = (tw.ne()[1], tx.ne()[1]);
        let planes = t.ne()[2] * t.ne()[3];
        let r2 = (t.ne()[2] / tw.ne()[2].max(1)) as i64;
        let r3 = (t.ne()[3] / tw.ne()[3].max(1)) as i64;
        let mut args = Args::default();
        args.push_bytes(dst)
            .push_bytes(&self.kt(w))
            .push_bytes(&self.kt(x))
            .i64(r2)
            .i64(r3);
        if ncols == 1
            && let Some(p) = self.gemv8(node, w, x, &mut args)
        {
            return p;
        }
        if let Some(p) = self.mmq(node, w, x, &mut args) {
            return p;
        }
        let fast = if ncols == 1 {
            self.fast_gemv(node, w, x)
        } else {
            None
        };
        if let Some(kernel) = fast {
            // GV_BLOCK_ROWS (8) rows per block (matmul.cu).
            let blocks = m.div_ceil(8) * planes;
            self.go(kernel, (blocks as u32, 1, 1), 128, &mut args)
        } else if ncols == 1 {
            let blocks = m.div_ceil(4) * ncols * planes;
            let k = if tw.dtype().is_quantized() {
                "k_mul_mat_vec_q"
            } else {
                "k_mul_mat_vec_f"
            };
            self.go(k, (blocks as u32, 1, 1), 128, &mut args)
        } else {
            let grid = (
                m.div_ceil(64) as u32,
                ncols.div_ceil(64) as u32,
                planes as u32,
            );
            self.go("k_mul_mat_tiled", grid, 256, &mut args)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The type set of planned launches: a K-quant GEMV reads its weights and activations and
    /// writes f32; a copy converts f16 to bf16.
    #[test]
    fn planned_launches_carry_their_type_sets() {
        use tessera_kernels::gpu::unit::{TypeSet, Unit};
        let mut ctx = tessera_core::Context::new();
        let w = ctx.new_tensor(DType::Q4_K, [256, 8]).unwrap();
        let x = ctx.new_tensor(DType::F16, [256, 1]).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let h = ctx.new_tensor(DType::F16, [16, 3]).unwrap();
        let b = ctx.cast(h, DType::BF16).unwrap();
        let ts = ctx.tensors();
        let ptrs = vec![0x1000; ts.len()];
        let mem = StreamMem {
            status: 0x40,
            ..Default::default()
        };
        let l = plan(ts, &ptrs, mem, y).launches.remove(0);
        assert_eq!(l.kernel, "k_mul_mat_vec_q");
        assert_eq!(TypeSet::of_launch(&l).to_string(), "f32,f16,q4_K");
        let u = Unit::launch(&l).unwrap();
        assert_eq!(u.label(), "matmul.cu:k_mul_mat_vec_q[f32,f16,q4_K]");
        let l = plan(ts, &ptrs, mem, b).launches.remove(0);
        assert_eq!(TypeSet::of_launch(&l).to_string(), "f16,bf16");
    }

    /// [`plan`] of `node` with every tensor at an aligned address and 1 MiB of scratch at
    /// 0x10000.
    fn plan_aligned(ts: &[TensorDesc], node: TensorId) -> NodePlan {
        let ptrs = vec![0x1000u64; ts.len()];
        let mem = StreamMem {
            status: 0x40,
            scratch: 0x10000,
            scratch_len: 1 << 20,
        };
        plan(ts, &ptrs, mem, node)
    }

    /// Products of 9 or more columns with Q8_0, Q4_0, Q5_0, Q4_K or Q6_K weights round their
    /// activations and take the integer-tile GEMM, whose rounding launch is the GEMV's for the
    /// same input (so the stream can share it); 8 columns and other weight types take the tiled
    /// GEMM.
    #[test]
    fn wide_quantized_products_take_the_tile_gemm() {
        let mut ctx = tessera_core::Context::new();
        let w = ctx.new_tensor(DType::Q4_0, [288, 70]).unwrap();
        let w6 = ctx.new_tensor(DType::Q5_1, [256, 70]).unwrap();
        let x = ctx.new_tensor(DType::F32, [288, 9]).unwrap();
        let x8 = ctx.new_tensor(DType::F32, [288, 8]).unwrap();
        let x6 = ctx.new_tensor(DType::F32, [256, 9]).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let y8 = ctx.mul_mat(w, x8).unwrap();
        let y6 = ctx.mul_mat(w6, x6).unwrap();
        let ts = ctx.tensors();
        let p = plan_aligned(ts, y);
        let kernels: Vec<&str> = p.launches.iter().map(|l| l.kernel).collect();
        assert_eq!(kernels, ["k_quantize_x8", "k_mmq_q4_0"]);
        // 9 rows of 288 levels (to 256 bytes), then 9 × 9 scales.
        assert_eq!(p.scratch, 2816 + 9 * 9 * 4);
        let gemm = &p.launches[1];
        assert_eq!((gemm.grid, gemm.block), ((2, 1, 1), 128));
        assert_eq!(
            gemm.args[5..],
            [Arg::Ptr(0x10000), Arg::Ptr(0x10000 + 2816)]
        );
        assert!(rounds_activations(&p.launches[0]) && reads_rounded_activations(gemm));
        assert_eq!(plan_aligned(ts, y8).launches[0].kernel, "k_mul_mat_tiled");
        assert_eq!(plan_aligned(ts, y6).launches[0].kernel, "k_mul_mat_tiled");
    }

    /// Prompt attention over F16/BF16 caches takes the tensor-core kernel, a block holding the
    /// largest power-of-two share of each KV group's heads (at most 16); quantized caches and
    /// decoding take the other kernels.
    #[test]
    fn prompt_attention_takes_the_tile_kernel() {
        let heads: Vec<usize> = [1, 2, 3, 4, 6, 8, 12, 32]
            .into_iter()
            .map(fa_heads_per_block)
            .collect();
        assert_eq!(heads, [1, 2, 1, 4, 2, 8, 4, 16]);
        let mut ctx = tessera_core::Context::new();
        let q = ctx.new_tensor(DType::F32, [128, 70, 32, 2]).unwrap();
        let q1 = ctx.new_tensor(DType::F32, [128, 1, 32, 2]).unwrap();
        let k = ctx.new_tensor(DType::F16, [128, 256, 8, 2]).unwrap();
        let v = ctx.new_tensor(DType::BF16, [128, 256, 8, 2]).unwrap();
        let k8 = ctx.new_tensor(DType::Q8_0, [128, 256, 8, 2]).unwrap();
        let m = ctx.new_tensor(DType::F16, [256, 80]).unwrap();
        let y = ctx.flash_attn_ext(q, k, v, Some(m), 0.1, 0.0, 0.0).unwrap();
        let y8 = ctx
            .flash_attn_ext(q, k8, v, Some(m), 0.1, 0.0, 0.0)
            .unwrap();
        let y1 = ctx
            .flash_attn_ext(q1, k, v, Some(m), 0.1, 0.0, 0.0)
            .unwrap();
        let ts = ctx.tensors();
        let l = plan_aligned(ts, y).launches.remove(0);
        // Groups of 4 heads: 16 queries of 4 heads per block.
        assert_eq!(
            (l.kernel, l.grid, l.block),
            ("k_flash_attn_mma", (5, 8, 2), 128)
        );
        assert_eq!(l.args.last(), Some(&Arg::I32(4)));
        assert_eq!(
            plan_aligned(ts, y8).launches[0].kernel,
            "k_flash_attn_tiled"
        );
        assert_ne!(plan_aligned(ts, y1).launches[0].kernel, "k_flash_attn_mma");
    }

    /// MUL_MAT_ID takes the listed weight types only, ARGSORT rows up to ARGSORT_MAX, and the
    /// planned launches carry the arguments their kernels declare.
    #[test]
    fn moe_support_and_launches() {
        let mut ctx = tessera_core::Context::new();
        let w = ctx.new_tensor(DType::Q4_0, [64, 10, 4]).unwrap();
        let wk = ctx.new_tensor(DType::Q8_K, [256, 10, 4]).unwrap();
        let x = ctx.new_tensor(DType::F32, [64, 1, 3]).unwrap();
        let xk = ctx.new_tensor(DType::F32, [256, 1, 3]).unwrap();
        let ids = ctx.new_tensor(DType::I32, [2, 3]).unwrap();
        let y = ctx.mul_mat_id(w, x, ids).unwrap();
        let yk = ctx.mul_mat_id(wk, xk, ids).unwrap();
        let short = ctx.new_tensor(DType::F32, [ARGSORT_MAX, 2]).unwrap();
        let long = ctx.new_tensor(DType::F32, [ARGSORT_MAX + 1, 2]).unwrap();
        let s = ctx.argsort(short, true).unwrap();
        let l = ctx.argsort(long, false).unwrap();
        let ts = ctx.tensors();
        assert_eq!(supports(ts, y), Support::Yes);
        assert!(matches!(supports(ts, yk), Support::No(_)));
        assert_eq!(supports(ts, s), Support::Yes);
        assert!(matches!(supports(ts, l), Support::No(_)));

        let ptrs = vec![0x100u64; ts.len()];
        let mem = StreamMem {
            status: 0x40,
            ..Default::default()
        };
        let l = plan(ts, &ptrs, mem, y).launches.remove(0);
        assert_eq!((l.kernel, l.block), ("k_mul_mat_id", 128));
        // ceil(10 / 4) row blocks × 2 slots × 3 tokens.
        assert_eq!(l.grid, (18, 1, 1));
        assert_eq!(l.args.len(), 7);
        assert_eq!(l.args[4], Arg::Ptr(0x40));
        // The plain form: not local, first expert 0.
        assert_eq!((&l.args[5], &l.args[6]), (&Arg::I32(0), &Arg::I64(0)));
        let l = plan(ts, &ptrs, mem, s).launches.remove(0);
        assert_eq!((l.kernel, l.grid, l.block), ("k_argsort", (2, 1, 1), 256));
        assert_eq!(l.args[2], Arg::I32(1));
    }

    #[test]
    fn low_bit_dtypes_are_read_but_not_written() {
        use tessera_core::Context;
        let support = |wt: DType, write: bool| {
            let mut ctx = Context::new();
            let w = ctx.new_tensor(wt, [256, 4]).unwrap();
            let x = ctx.new_tensor(DType::F32, [256, 4]).unwrap();
            let y = if write {
                ctx.cpy(x, w).unwrap()
            } else {
                ctx.mul_mat(w, x).unwrap()
            };
            let g = ctx.build_forward(y).unwrap();
            matches!(supports(g.tensors(), y), Support::Yes)
        };
        for d in [
            DType::Q2_K,
            DType::Q3_K,
            DType::IQ4_XS,
            DType::MXFP4,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ] {
            assert!(read_only_dtype(d));
            assert!(support(d, false), "MUL_MAT with {d} weights");
            assert!(!support(d, true), "CPY into {d}");
        }
        assert!(support(DType::Q8_0, true) && support(DType::Q4_0, false));
        // Every KV cache type is written (SET_ROWS) as well as read.
        for d in [
            DType::Q5_0,
            DType::IQ4_NL,
            DType::Q4_1,
            DType::Q5_1,
            DType::Q4_0,
        ] {
            assert!(!read_only_dtype(d) && support(d, true), "CPY into {d}");
        }
        assert_eq!(alignment_of(DType::MXFP4), 1);
    }

    /// Decode attention splits over the keys with a merge and scratch for the partials; a long
    /// prompt the tiled kernel declines (head size 256) keeps its partials under the cap, here
    /// by one block per query and head, with no scratch.
    #[test]
    fn split_attention_scratch_is_bounded() {
        let fa = |d: usize, n_q: usize, n_kv: usize| {
            let mut ctx = tessera_core::Context::new();
            let q = ctx.new_tensor(DType::F32, [d, n_q, 8]).unwrap();
            let k = ctx.new_tensor(DType::F16, [d, n_kv, 2]).unwrap();
            let v = ctx.new_tensor(DType::F16, [d, n_kv, 2]).unwrap();
            let y = ctx.flash_attn_ext(q, k, v, None, 0.1, 0.0, 0.0).unwrap();
            let ts = ctx.tensors();
            let mem = StreamMem {
                status: 0x40,
                scratch: 0x10000,
                scratch_len: 0,
            };
            plan(ts, &vec![0x100u64; ts.len()], mem, y)
        };
        let p = fa(128, 1, 4096);
        let kernels: Vec<_> = p.launches.iter().map(|l| l.kernel).collect();
        assert_eq!(kernels, ["k_flash_attn_split128", "k_flash_attn_merge"]);
        // 8 heads × 16 blocks of 256 keys, each block's maximum, sum and 128 columns.
        assert_eq!(p.launches[0].grid.0, 8 * 16);
        assert_eq!(p.scratch, 8 * 16 * 130 * 4);
        let p = fa(256, 4096, 4096);
        assert_eq!(p.launches.len(), 1);
        assert_eq!(p.launches[0].kernel, "k_flash_attn_split");
        assert_eq!((p.launches[0].grid.0, p.scratch), (4096 * 8, 0));
    }

    #[test]
    fn alibi_off_and_on() {
        assert_eq!(alibi(0.0, 8).0, 0);
        let (on, m0, _, nl2) = alibi(8.0, 12);
        assert_eq!((on, nl2), (1, 8));
        assert!((m0 - 0.5).abs() < 1e-6);
    }
}
