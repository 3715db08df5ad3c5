//! Value parsers of the numeric command-line arguments: a nonsensical number (`nan`, `inf`, a
//! negative temperature, 0 threads, a million threads) is a clear error naming the accepted
//! range at parse time, never a panic or a silent clamp later.

/// Most threads one device stream may be given (far above any core count Tessera runs on; a
/// larger count is a typo that would spawn that many OS threads).
pub const MAX_THREADS: usize = 1024;

/// Most seconds a benchmark may measure one case.
pub const MAX_MIN_TIME: f64 = 600.0;

/// Largest `bench-ops -k`: a 4096 × k F32 weight is 1 GiB there.
pub const MAX_K: usize = 65536;

fn number<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim()
        .parse::<T>()
        .map_err(|_| format!("'{s}' is not {what}"))
}

/// `-t`: an integer thread count in `1..=MAX_THREADS`.
pub fn threads(s: &str) -> Result<usize, String> {
    match number::<usize>(s, "a thread count")? {
        n @ 1..=MAX_THREADS => Ok(n),
        n => Err(format!("{n} threads: expected 1..={MAX_THREADS}")),
    }
}

/// `--split-mode`: one of [`SplitMode::ACCEPTED`](tessera_model::SplitMode::ACCEPTED).
pub fn split_mode(s: &str) -> Result<tessera_model::SplitMode, String> {
    s.parse().map_err(|e: tessera::Error| e.to_string())
}

/// `--temp`: a finite temperature ≥ 0 (0 is greedy).
pub fn temperature(s: &str) -> Result<f32, String> {
    let t = number::<f32>(s, "a number")?;
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(format!(
            "temperature {t} is not a finite number >= 0 (0 is greedy)"
        ))
    }
}

/// `--min-time`: finite seconds in `0..=MAX_MIN_TIME`.
pub fn seconds(s: &str) -> Result<f64, String> {
    let t = number::<f64>(s, "a number of seconds")?;
    if t.is_finite() && (0.0..=MAX_MIN_TIME).contains(&t) {
        Ok(t)
    } else {
        Err(format!(
            "{t} seconds: expected a finite number in 0..={MAX_MIN_TIME}"
        ))
    }
}

/// One element of `--ratios`: a finite, non-negative number (the list is checked against the
/// device count where the devices are known).
pub fn ratio(s: &str) -> Result<f32, String> {
    tessera::meta::ratio::parse_ratio(s).map_err(|e| e.to_string())
}

/// `-c`: a positive context length.
pub fn context(s: &str) -> Result<usize, String> {
    match number::<usize>(s, "a token count")? {
        0 => Err("a context of 0 tokens holds nothing".into()),
        n => Ok(n),
    }
}

/// A count that must be at least 1 (`soak --requests`, `--max-prompt`, `--max-gen`,
/// `--tp-groups`).
pub fn count(s: &str) -> Result<usize, String> {
    match number::<usize>(s, "a count")? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `bench-ops -k`: a reduction length in `1..=MAX_K`.
pub fn reduction(s: &str) -> Result<usize, String> {
    match number::<usize>(s, "a length")? {
        k @ 1..=MAX_K => Ok(k),
        k => Err(format!("k = {k}: expected 1..={MAX_K}")),
    }
}

/// `bench --weight-type`: a dtype by its ggml name (`q4_0`, `q4_K`, `f16`; any case) that
/// weights can be stored in: a float or a block format.
pub fn dtype(s: &str) -> Result<tessera::DType, String> {
    let weights = tessera::DType::ALL
        .iter()
        .filter(|d| d.is_float() || d.is_quantized());
    weights
        .clone()
        .find(|d| d.to_string().eq_ignore_ascii_case(s))
        .copied()
        .ok_or_else(|| {
            let names: Vec<String> = weights.map(|d| d.to_string()).collect();
            format!("unknown weight type {s:?} (accepted: {})", names.join(", "))
        })
}

/// `--cache-type-k` / `--cache-type-v`: a KV cache type by llama.cpp's name.
pub fn cache_type(s: &str) -> Result<tessera::DType, String> {
    tessera_model::KvCacheTypes::parse_type(s).map_err(|e| e.to_string())
}

/// `--set`: `KEY=VALUE` with a key (or `TESSERA_*` variable) of
/// [`tessera::settings::Setting`] and a value it takes.
pub fn setting(s: &str) -> Result<(tessera::settings::Setting, String), String> {
    use tessera::settings::Setting;
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected KEY=VALUE, e.g. cpu.repack=0"))?;
    let setting = Setting::parse(k).ok_or_else(|| {
        let keys: Vec<&str> = Setting::ALL.iter().map(|s| s.key()).collect();
        format!("unknown setting '{k}' (settings: {})", keys.join(", "))
    })?;
    let v = setting.check(v).map_err(|e| e.to_string())?;
    Ok((setting, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_a_known_key_and_value() {
        let (s, v) = setting("cpu.repack=0").unwrap();
        assert_eq!((s.key(), v.as_str()), ("cpu.repack", "0"));
        assert_eq!(
            setting("TESSERA_VULKAN_SPLIT=2").unwrap().0.key(),
            "vulkan.split"
        );
        assert!(setting("cpu.repack").unwrap_err().contains("KEY=VALUE"));
        assert!(setting("cpu.nope=1").unwrap_err().contains("cpu.repack"));
        assert!(setting("vulkan.split=99").unwrap_err().contains("1..=16"));
    }

    #[test]
    fn nonsensical_numbers_are_refused() {
        for bad in ["nan", "NaN", "inf", "-inf", "-1", "x", ""] {
            assert!(temperature(bad).is_err(), "--temp {bad}");
            assert!(seconds(bad).is_err(), "--min-time {bad}");
            assert!(ratio(bad).is_err(), "--ratios {bad}");
        }
        assert_eq!(temperature("0").unwrap(), 0.0);
        assert_eq!(temperature("0.8").unwrap(), 0.8);
        assert!(seconds("601").is_err());
        assert_eq!(seconds("0.3").unwrap(), 0.3);
        for bad in ["0", "-1", "1e3", "1025", "99999999999999999999"] {
            assert!(threads(bad).is_err(), "-t {bad}");
        }
        assert_eq!(threads("4").unwrap(), 4);
        assert!(context("0").is_err() && count("0").is_err() && count("-2").is_err());
        assert_eq!(count("3").unwrap(), 3);
        assert!(reduction("0").is_err() && reduction("65537").is_err());
        assert_eq!(ratio(" 2 ").unwrap(), 2.0);
    }

    #[test]
    fn cache_types_parse_by_llama_cpp_name() {
        assert_eq!(cache_type("q8_0").unwrap(), tessera::DType::Q8_0);
        assert_eq!(cache_type("IQ4_NL").unwrap(), tessera::DType::IQ4_NL);
        let err = cache_type("q4_k").unwrap_err();
        assert!(err.contains("'q4_k'") && err.contains("q5_1"), "{err}");
    }

    #[test]
    fn weight_types_parse_by_ggml_name() {
        assert_eq!(dtype("q4_k").unwrap(), tessera::DType::Q4_K);
        assert_eq!(dtype("Q8_0").unwrap(), tessera::DType::Q8_0);
        assert_eq!(dtype("bf16").unwrap(), tessera::DType::BF16);
        let err = dtype("i32").unwrap_err();
        assert!(err.contains("accepted") && err.contains("q4_0"), "{err}");
        assert!(dtype("q9_9").is_err());
    }
}
