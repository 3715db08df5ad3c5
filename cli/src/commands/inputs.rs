//! Deterministic pseudo-random tensor contents for benchmarks.

use tessera::{DType, Result, TensorBuffer, TensorDesc, TensorId};

/// SplitMix64: tiny, fast, and good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next value uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Next value uniform in `0..n` (0 for `n` = 0), as llama.cpp's random tokens.
    pub fn below(&mut self, n: usize) -> usize {
        let u = (self.uniform() + 1.0) * 0.5;
        ((u * n as f32) as usize).min(n.saturating_sub(1))
    }
}

/// Uniform floats in [-1, 1) for `desc`, encoded to its dtype (which must be a float or a block
/// format), rows on every core (a quantized 14336 x 4096 weight is seconds of one core's work).
pub fn encode(desc: &TensorDesc, rng: &mut Rng) -> Result<Vec<u8>> {
    let v: Vec<f32> = (0..desc.nelements()).map(|_| rng.uniform()).collect();
    tessera_model::encode_rows_in_parallel(desc.dtype(), &v, desc.ne()[0])
}

/// Fills leaf `id`: floats uniform in [-1, 1) encoded to the tensor's dtype, i32 as `0..n` modulo
/// `i32_modulo`.
pub fn fill(
    buf: &TensorBuffer,
    desc: &TensorDesc,
    id: TensorId,
    rng: &mut Rng,
    i32_modulo: usize,
) -> Result<()> {
    let n = desc.nelements();
    let bytes = if desc.dtype() == DType::I32 {
        let v: Vec<f32> = (0..n).map(|i| (i % i32_modulo.max(1)) as f32).collect();
        tessera::encode_f32(DType::I32, &v)?
    } else {
        encode(desc, rng)?
    };
    buf.set(id, &bytes)
}
