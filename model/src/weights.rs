//! Deterministic synthetic weights: each tensor's values come from a SplitMix64 stream seeded by
//! the model seed and the tensor's name, so any tensor can be generated on its own, in any order,
//! on any thread, and always gets the same values.

use tessera::{DType, Error, Result, encode_f32};

/// SplitMix64 (Steele et al.): one add and three xor-shift-multiplies per value.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix(u64);

impl SplitMix {
    /// A generator for tensor `name` of a model with seed `seed`.
    pub(crate) fn for_tensor(seed: u64, name: &str) -> SplitMix {
        // FNV-1a of the name, mixed with the seed.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        SplitMix(h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fills `out` with values uniform in `[center - half_width, center + half_width)`; two
    /// values per 64-bit draw.
    pub(crate) fn fill_uniform(&mut self, out: &mut [f32], center: f32, half_width: f32) {
        const SCALE: f32 = 2.0 / (1u64 << 24) as f32;
        let map = |bits: u64| ((bits & 0xFF_FFFF) as f32 * SCALE - 1.0) * half_width + center;
        let mut pairs = out.chunks_exact_mut(2);
        for p in &mut pairs {
            let z = self.next_u64();
            p[0] = map(z >> 40);
            p[1] = map(z >> 8);
        }
        if let [last] = pairs.into_remainder() {
            *last = map(self.next_u64() >> 40);
        }
    }
}

/// [`encode_f32`] of whole rows of `row_len` values, on every core for a large tensor: the
/// K-quant search makes a synthetic 1B model's weights a minute and a half of one core's work.
/// Rows encode independently, so the bytes are those of one call.
///
/// # Errors
/// As [`encode_f32`] (a dtype that cannot be encoded, values that do not fill whole blocks).
pub fn encode_rows_in_parallel(dtype: DType, values: &[f32], row_len: usize) -> Result<Vec<u8>> {
    const MIN_PER_THREAD: usize = 1 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = values.len().checked_div(row_len).unwrap_or(0);
    if threads < 2
        || values.len() < 2 * MIN_PER_THREAD
        || rows < 2
        || !values.len().is_multiple_of(row_len)
    {
        return encode_f32(dtype, values);
    }
    let parts = threads.min(values.len() / MIN_PER_THREAD).min(rows);
    let chunk = rows.div_ceil(parts) * row_len;
    let encoded: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = values
            .chunks(chunk)
            .map(|part| s.spawn(move || encode_f32(dtype, part)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::InvalidArgument(format!(
                        "encoding {dtype} weights panicked"
                    )))
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(dtype.row_size(row_len).unwrap_or(0) * rows);
    for part in encoded {
        out.extend_from_slice(&part?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_bounded_and_distinct() {
        let gen_vals = |seed, name| {
            let mut v = vec![0f32; 1001];
            SplitMix::for_tensor(seed, name).fill_uniform(&mut v, 1.0, 0.1);
            v
        };
        let a = gen_vals(7, "blk.0.attn_q.weight");
        assert_eq!(a, gen_vals(7, "blk.0.attn_q.weight"));
        assert_ne!(a, gen_vals(8, "blk.0.attn_q.weight"));
        assert_ne!(a, gen_vals(7, "blk.1.attn_q.weight"));
        assert!(a.iter().all(|x| (0.9..1.1).contains(x)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
    }
}
