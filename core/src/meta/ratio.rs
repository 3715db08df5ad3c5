//! Uneven splits: per-device lengths of one segment from the `-ts` ratios, a granularity and a
//! rotation (meta-backend.md §8–9).

use crate::error::{Error, Result};

/// Per-device lengths of a segment of `ne_s` elements over `n` devices.
///
/// With `scan_j = Σ_{i≤j} r[(i+rot) mod N]` and, for `j < N−1`,
/// `high_j = ne_s·(j+1)/N` (even) or `⌊ne_s·scan_j/scan_{N−1}⌋`, rounded down to a multiple of
/// `granularity`: device `(j+rot) mod N` gets `high_j − high_{j−1}` and device
/// `(N−1+rot) mod N` gets the remainder `ne_s − high_{N−2}`. Zero lengths are possible.
///
/// `ratios` empty or all zero means an even split.
///
/// # Errors
/// [`Error::InvalidArgument`] if `n` or `granularity` is 0, `ne_s` is not a multiple of
/// `granularity`, or the ratios are not `n` finite non-negative numbers with a positive sum.
pub fn split_lengths(
    ne_s: usize,
    n: usize,
    ratios: &[f32],
    granularity: usize,
    rotation: usize,
) -> Result<Vec<usize>> {
    let bad = |why: String| Err(Error::InvalidArgument(format!("split lengths: {why}")));
    if n == 0 {
        return bad("0 devices".into());
    }
    if granularity == 0 || !ne_s.is_multiple_of(granularity) {
        return bad(format!(
            "{ne_s} elements are not a multiple of the granularity {granularity}"
        ));
    }
    let even = ratios.iter().all(|&r| r == 0.0);
    if !even {
        if ratios.len() != n {
            return bad(format!("{} ratios for {n} devices", ratios.len()));
        }
        if let Some(r) = ratios.iter().find(|r| !r.is_finite() || **r < 0.0) {
            return bad(format!("ratio {r} is not a finite non-negative number"));
        }
    }
    let rot = rotation % n;
    let mut scan = Vec::with_capacity(n);
    let mut acc = 0.0f64;
    for i in 0..n {
        if !even {
            acc += f64::from(ratios[(i + rot) % n]);
        }
        scan.push(acc);
    }
    let mut lens = vec![0; n];
    let mut low = 0usize;
    for j in 0..n - 1 {
        let high = if even {
            // u128: ne_s·(j+1) cannot overflow.
            (ne_s as u128 * (j as u128 + 1) / n as u128) as usize
        } else {
            ((ne_s as f64 * scan[j] / scan[n - 1]).floor() as usize).min(ne_s)
        };
        let high = (high - high % granularity).max(low);
        lens[(j + rot) % n] = high - low;
        low = high;
    }
    lens[(n - 1 + rot) % n] = ne_s - low;
    Ok(lens)
}
