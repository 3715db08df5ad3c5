//! Uneven splits: per-device lengths of one segment from the `-ts` ratios, a granularity and a
//! rotation (meta-device.md §8–9).

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

/// Parses one split ratio (an element of `--ratios`): a finite, non-negative number.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the text for anything else (`nan`, `inf`, `-1`, `x`).
pub fn parse_ratio(text: &str) -> Result<f32> {
    let t = text.trim();
    match t.parse::<f32>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        Ok(_) => Err(Error::InvalidArgument(format!(
            "split ratio '{t}' is not a finite non-negative number"
        ))),
        Err(_) => Err(Error::InvalidArgument(format!(
            "split ratio '{t}' is not a number"
        ))),
    }
}

/// Checks a whole ratio list for `n_devices` devices: empty (an even split), or one finite,
/// non-negative ratio per device with a positive, finite sum.
///
/// # Errors
/// [`Error::InvalidArgument`] saying which rule the list breaks.
pub fn check_ratios(ratios: &[f32], n_devices: usize) -> Result<()> {
    if ratios.is_empty() {
        return Ok(());
    }
    if ratios.len() != n_devices {
        return Err(Error::InvalidArgument(format!(
            "{} split ratios for {n_devices} devices",
            ratios.len()
        )));
    }
    if let Some(r) = ratios.iter().find(|r| !r.is_finite() || **r < 0.0) {
        return Err(Error::InvalidArgument(format!(
            "split ratio {r} is not a finite non-negative number"
        )));
    }
    let sum: f64 = ratios.iter().map(|&r| f64::from(r)).sum();
    if sum <= 0.0 {
        return Err(Error::InvalidArgument(
            "split ratios sum to zero: give at least one device a share".into(),
        ));
    }
    Ok(())
}

/// Parses a comma-separated ratio list (`2,1,1`; empty is an even split) for `n_devices`
/// devices, as [`parse_ratio`] and [`check_ratios`] do.
///
/// # Errors
/// As [`parse_ratio`] for any element and [`check_ratios`] for the list.
pub fn parse_ratios(text: &str, n_devices: usize) -> Result<Vec<f32>> {
    let ratios = if text.trim().is_empty() {
        Vec::new()
    } else {
        text.split(',')
            .map(parse_ratio)
            .collect::<Result<Vec<_>>>()?
    };
    check_ratios(&ratios, n_devices)?;
    Ok(ratios)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_text_is_checked() {
        assert_eq!(parse_ratios("2, 1,1", 3).unwrap(), vec![2.0, 1.0, 1.0]);
        assert!(parse_ratios("", 5).unwrap().is_empty());
        for bad in ["nan,1", "inf,1", "-1,1", "x,1", "0,0", "1,,1", "1"] {
            let e = parse_ratios(bad, 2).unwrap_err().to_string();
            assert!(e.contains("ratio"), "{bad}: {e}");
        }
        // Large ratios whose f32 sum overflows are still a valid (finite) split.
        let big = parse_ratios("3e38,3e38", 2).unwrap();
        assert_eq!(split_lengths(64, 2, &big, 1, 0).unwrap(), vec![32, 32]);
    }
}
