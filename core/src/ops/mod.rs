//! The op set of the graph IR, with ggml's semantics and spellings.
//!
//! An [`Op`] carries its parameters; sources live in the tensor descriptor. [`OpKind`] is the
//! parameter-free tag that reports, filters and `supports_op` answers use.

use std::fmt;

/// Element-wise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// x · sigmoid(x).
    Silu,
    /// tanh approximation of GELU, as ggml.
    Gelu,
    /// x · sigmoid(1.702 x).
    GeluQuick,
    /// max(x, 0).
    Relu,
    /// tanh(x).
    Tanh,
    /// −x.
    Neg,
    /// eˣ.
    Exp,
    /// 1 / (1 + e⁻ˣ).
    Sigmoid,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 8] = [
        UnaryOp::Silu,
        UnaryOp::Gelu,
        UnaryOp::GeluQuick,
        UnaryOp::Relu,
        UnaryOp::Tanh,
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Sigmoid,
    ];

    /// ggml spelling.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Silu => "SILU",
            UnaryOp::Gelu => "GELU",
            UnaryOp::GeluQuick => "GELU_QUICK",
            UnaryOp::Relu => "RELU",
            UnaryOp::Tanh => "TANH",
            UnaryOp::Neg => "NEG",
            UnaryOp::Exp => "EXP",
            UnaryOp::Sigmoid => "SIGMOID",
        }
    }
}

/// Gated linear units: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluOp {
    /// silu(gate) · up.
    Swiglu,
    /// gelu(gate) · up.
    Geglu,
}

impl GluOp {
    /// ggml spelling.
    pub const fn name(self) -> &'static str {
        match self {
            GluOp::Swiglu => "SWIGLU",
            GluOp::Geglu => "GEGLU",
        }
    }
}

/// Which elements ROPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` — ggml mode 0 (llama).
    Normal,
    /// Halves `(x[i], x[i + n_dims/2])` — ggml mode 2 (GPT-NeoX, Qwen, Gemma).
    Neox,
}

/// ROPE parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Leading dimensions of each head that are rotated (even, ≤ head size); the rest is copied.
    pub n_dims: usize,
    /// Pairing of rotated elements.
    pub mode: RopeMode,
    /// θ base (10000 for llama 2).
    pub freq_base: f32,
    /// Linear position scaling (1 = none).
    pub freq_scale: f32,
}

/// An operation and its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A leaf: weights, inputs, caches.
    None,
    /// A strided window onto another tensor.
    View,
    /// The same contiguous data with another shape.
    Reshape,
    /// Axes reordered: source axis `i` becomes axis `axes[i]`.
    Permute([usize; 4]),
    /// Axes 0 and 1 swapped.
    Transpose,
    /// A contiguous copy (dtype kept).
    Cont,
    /// Copy of src0 into the destination's storage, converting the dtype.
    Cpy,
    /// Rows of src0 picked by the i32 indices of src1.
    GetRows,
    /// src0's rows written into the destination at the i32 row indices of src1.
    SetRows,
    /// src0 and src1 joined along `dim`.
    Concat {
        /// The joined axis.
        dim: usize,
    },
    /// src0 + src1 (src1 broadcast).
    Add,
    /// src0 − src1 (src1 broadcast).
    Sub,
    /// src0 · src1 (src1 broadcast).
    Mul,
    /// src0 / src1 (src1 broadcast).
    Div,
    /// src0 · scale + bias.
    Scale {
        /// Multiplier.
        scale: f32,
        /// Added afterwards.
        bias: f32,
    },
    /// x².
    Sqr,
    /// √x.
    Sqrt,
    /// min(max(x, min), max).
    Clamp {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// An element-wise function.
    Unary(UnaryOp),
    /// `act(gate) * up`: with one source, gate and up are its two halves along axis 0
    /// (`swapped` exchanges them); with two, src0 is the gate and src1 the up.
    Glu {
        /// The activation.
        op: GluOp,
        /// Single-source form only: the up half comes first.
        swapped: bool,
    },
    /// x / √(mean(x²) + eps) per row.
    RmsNorm {
        /// Stabiliser.
        eps: f32,
    },
    /// (x − mean) / √(var + eps) per row.
    Norm {
        /// Stabiliser.
        eps: f32,
    },
    /// Sum of each row.
    SumRows,
    /// Index of each row's maximum (i32).
    Argmax,
    /// softmax(x · scale + slope · mask) per row; optional mask in src1.
    SoftMax {
        /// Logit multiplier.
        scale: f32,
        /// ALiBi maximum bias (0 = off).
        max_bias: f32,
    },
    /// Rotary position embedding; src1 holds i32 positions (one per ne2 index).
    Rope(RopeParams),
    /// src0ᵀ · src1: src0 `[k, m, ...]` weights, src1 `[k, n, ...]` activations → `[m, n, ...]` f32.
    MulMat,
    /// Expert-indexed MUL_MAT: src0 weights `[k, m, n_expert]`, src1 activations
    /// `[k, n_b, T]`, src2 i32 expert ids `[n_used, T]` → f32 `[m, n_used, T]`, where output
    /// column `(i, t)` is `src0[ids[i, t]]ᵀ · src1[:, i mod n_b, t]`.
    MulMatId {
        /// `None`: src0 holds every expert, and an id outside `0..n_expert` is an error.
        /// `Some(first)`: the local-range form of expert parallelism: src0 holds experts
        /// `first..first + ne2` only; pairs routed to other experts are skipped (never
        /// computed) and their output columns are zero.
        first_expert: Option<usize>,
    },
    /// src0 `[n, n_used, T]` + row `ids[i, t]` of src1 `[n, n_expert]` (per-expert biases).
    AddId,
    /// Indices that sort each row (i32), ascending or descending; ties keep index order.
    Argsort {
        /// Largest first.
        descending: bool,
    },
    /// gpt-oss's clamped SwiGLU of gate src0 and up src1:
    /// `g·σ(α·g)·(u + 1)` with `g = min(gate, limit)`, `u = clamp(up, −limit, limit)`.
    SwigluOai {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (7).
        limit: f32,
    },
    /// Fused attention: q `[d, n_q, h, b]`, k `[d, n_kv, h_kv, b]`, v `[dv, n_kv, h_kv, b]`,
    /// optional mask `[n_kv, ≥n_q]` (src3), optional attention sinks f32 `[h]` (src4: one extra
    /// logit per head in the softmax denominator, with no value) → `[dv, h, n_q, b]` f32.
    FlashAttnExt {
        /// Multiplier of q·k.
        scale: f32,
        /// ALiBi maximum bias (0 = off).
        max_bias: f32,
        /// If non-zero, logits become softcap · tanh(logit / softcap).
        softcap: f32,
    },
}

/// The parameter-free tag of an [`Op`]. `Display` is ggml's spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum OpKind {
    None,
    View,
    Reshape,
    Permute,
    Transpose,
    Cont,
    Cpy,
    GetRows,
    SetRows,
    Concat,
    Add,
    Sub,
    Mul,
    Div,
    Scale,
    Sqr,
    Sqrt,
    Clamp,
    Unary,
    Glu,
    RmsNorm,
    Norm,
    SumRows,
    Argmax,
    SoftMax,
    Rope,
    MulMat,
    FlashAttnExt,
    MulMatId,
    AddId,
    Argsort,
    SwigluOai,
}

impl OpKind {
    /// ggml spelling.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::None => "NONE",
            OpKind::View => "VIEW",
            OpKind::Reshape => "RESHAPE",
            OpKind::Permute => "PERMUTE",
            OpKind::Transpose => "TRANSPOSE",
            OpKind::Cont => "CONT",
            OpKind::Cpy => "CPY",
            OpKind::GetRows => "GET_ROWS",
            OpKind::SetRows => "SET_ROWS",
            OpKind::Concat => "CONCAT",
            OpKind::Add => "ADD",
            OpKind::Sub => "SUB",
            OpKind::Mul => "MUL",
            OpKind::Div => "DIV",
            OpKind::Scale => "SCALE",
            OpKind::Sqr => "SQR",
            OpKind::Sqrt => "SQRT",
            OpKind::Clamp => "CLAMP",
            OpKind::Unary => "UNARY",
            OpKind::Glu => "GLU",
            OpKind::RmsNorm => "RMS_NORM",
            OpKind::Norm => "NORM",
            OpKind::SumRows => "SUM_ROWS",
            OpKind::Argmax => "ARGMAX",
            OpKind::SoftMax => "SOFT_MAX",
            OpKind::Rope => "ROPE",
            OpKind::MulMat => "MUL_MAT",
            OpKind::FlashAttnExt => "FLASH_ATTN_EXT",
            OpKind::MulMatId => "MUL_MAT_ID",
            OpKind::AddId => "ADD_ID",
            OpKind::Argsort => "ARGSORT",
            OpKind::SwigluOai => "SWIGLU_OAI",
        }
    }

    /// Ops that only reinterpret their source's storage and compute nothing.
    pub const fn is_view(self) -> bool {
        matches!(
            self,
            OpKind::None | OpKind::View | OpKind::Reshape | OpKind::Permute | OpKind::Transpose
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Op {
    /// The tag of this op.
    pub const fn kind(&self) -> OpKind {
        match self {
            Op::None => OpKind::None,
            Op::View => OpKind::View,
            Op::Reshape => OpKind::Reshape,
            Op::Permute(_) => OpKind::Permute,
            Op::Transpose => OpKind::Transpose,
            Op::Cont => OpKind::Cont,
            Op::Cpy => OpKind::Cpy,
            Op::GetRows => OpKind::GetRows,
            Op::SetRows => OpKind::SetRows,
            Op::Concat { .. } => OpKind::Concat,
            Op::Add => OpKind::Add,
            Op::Sub => OpKind::Sub,
            Op::Mul => OpKind::Mul,
            Op::Div => OpKind::Div,
            Op::Scale { .. } => OpKind::Scale,
            Op::Sqr => OpKind::Sqr,
            Op::Sqrt => OpKind::Sqrt,
            Op::Clamp { .. } => OpKind::Clamp,
            Op::Unary(_) => OpKind::Unary,
            Op::Glu { .. } => OpKind::Glu,
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::Norm { .. } => OpKind::Norm,
            Op::SumRows => OpKind::SumRows,
            Op::Argmax => OpKind::Argmax,
            Op::SoftMax { .. } => OpKind::SoftMax,
            Op::Rope(_) => OpKind::Rope,
            Op::MulMat => OpKind::MulMat,
            Op::FlashAttnExt { .. } => OpKind::FlashAttnExt,
            Op::MulMatId { .. } => OpKind::MulMatId,
            Op::AddId => OpKind::AddId,
            Op::Argsort { .. } => OpKind::Argsort,
            Op::SwigluOai { .. } => OpKind::SwigluOai,
        }
    }

    /// The name reports print: ggml's op name, or the function for UNARY and GLU (`SILU`, `SWIGLU`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(u) => u.name(),
            Op::Glu { op, .. } => op.name(),
            _ => self.kind().name(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
