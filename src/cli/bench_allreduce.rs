//! `tessera bench-allreduce`: time the all-reduce between devices, with nccl-tests' definitions
//! (algbw = bytes / time, busbw = algbw · 2(n−1)/n) and a memcpy baseline from the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::comm::{Algorithm, AllReduce, CommSlice, DEFAULT_RING_THRESHOLD, Wire};
use tessera::plugin::{CommApi, CommOutcome};
use tessera::{BackendOptions, Buffer, Device};

/// Options of `bench-allreduce`.
pub struct Options {
    /// Smallest and largest slice size in bytes; sizes step by ×4.
    pub sizes: (usize, usize),
    /// Exchange format.
    pub wire: Wire,
    /// Exchange pattern.
    pub algorithm: Algorithm,
    /// Threads per device stream (`None`: the device's default).
    pub threads: Option<usize>,
    /// Minimum measuring time per size.
    pub min_time: Duration,
    /// `auto` (the backend's comm when every device has it, else generic), `vendor` or `generic`.
    pub path: String,
}

/// Parses `4K`, `16M`, `1G` or a plain byte count.
pub fn parse_size(s: &str) -> anyhow::Result<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| anyhow::anyhow!("'{s}' is not a size (e.g. 4K, 16M)"))?;
    n.checked_mul(mul)
        .ok_or_else(|| anyhow::anyhow!("size '{s}' overflows"))
}

/// Parses `MIN..MAX` (or a single size).
pub fn parse_range(s: &str) -> anyhow::Result<(usize, usize)> {
    let (a, b) = s.split_once("..").unwrap_or((s, s));
    let (a, b) = (parse_size(a)?, parse_size(b)?);
    if a == 0 || a > b {
        anyhow::bail!("size range '{s}' must be MIN..MAX with 0 < MIN <= MAX");
    }
    Ok((a, b))
}

/// Bytes per second of copying a 16 MiB buffer on one thread (the bandwidth baseline).
fn memcpy_bandwidth() -> f64 {
    let src = vec![1u8; 16 << 20];
    let mut dst = vec![0u8; 16 << 20];
    dst.copy_from_slice(&src);
    let (mut runs, t0) = (0u32, Instant::now());
    while runs < 10 || t0.elapsed() < Duration::from_millis(300) {
        dst.copy_from_slice(std::hint::black_box(&src));
        runs += 1;
    }
    std::hint::black_box(&dst);
    (16u64 << 20) as f64 * runs as f64 / t0.elapsed().as_secs_f64()
}

/// Runs the benchmark over `devices` and prints a table.
pub fn run(devices: &[Arc<dyn Device>], opts: &Options) -> anyhow::Result<()> {
    let n = devices.len();
    let copy_bw = memcpy_bandwidth();
    println!(
        "memcpy 16 MiB, 1 thread: {:.2} GB/s copied ({:.2} GB/s read+write)",
        copy_bw / 1e9,
        2.0 * copy_bw / 1e9
    );
    println!(
        "all-reduce over {n} device(s) [{}], wire {:?}, algorithm {:?}",
        devices
            .iter()
            .map(|d| d.name().to_string())
            .collect::<Vec<_>>()
            .join(","),
        opts.wire,
        opts.algorithm
    );
    println!(
        "| {:>10} | {:>10} | {:>10} | {:>9} | {:>9} | {:<26} |",
        "size (B)", "count", "time (us)", "algbw GB/s", "busbw GB/s", "path"
    );
    println!(
        "|{:-<12}|{:-<12}|{:-<12}|{:-<11}|{:-<11}|{:-<28}|",
        "", "", "", "", "", ""
    );
    let bopts = opts
        .threads
        .map(BackendOptions::with_threads)
        .unwrap_or_default();
    let mut streams = devices
        .iter()
        .map(|d| d.init_backend(&bopts))
        .collect::<tessera::Result<Vec<_>>>()?;
    let mut ar = AllReduce::new(devices, opts.wire, opts.algorithm)?;
    // The backend's comm is usable only when one registry covers every device and accepts them.
    let vendor_api = devices
        .first()
        .map(|d| d.backend_name().to_string())
        .filter(|name| devices.iter().all(|d| d.backend_name() == name))
        .and_then(|name| tessera::registry().registry(&name))
        .and_then(|reg| CommApi::from_registry(reg.as_ref()));
    let mut vendor = match opts.path.as_str() {
        "generic" => None,
        "auto" | "vendor" => vendor_api.and_then(|api| api.init(&mut streams)),
        other => anyhow::bail!("--path {other}: expected auto, vendor or generic"),
    };
    if opts.path == "vendor" && vendor.is_none() {
        anyhow::bail!("the devices' backend has no comm for them (use --path generic)");
    }
    if vendor.is_some() && opts.wire == Wire::Bf16 {
        println!(
            "note: the backend comm exchanges f32 (shared memory needs no wire format); --wire applies to the generic path"
        );
    }
    let mut size = opts.sizes.0.max(4);
    while size <= opts.sizes.1 {
        let len = size / 4;
        let bufs: Vec<Arc<dyn Buffer>> = devices
            .iter()
            .map(|d| d.buffer_type().alloc(len * 4))
            .collect::<tessera::Result<_>>()?;
        for b in &bufs {
            b.write(0, &vec![0u8; len * 4])?;
        }
        let slices: Vec<CommSlice> = bufs
            .iter()
            .map(|b| CommSlice {
                buffer: b.clone(),
                offset: 0,
                len,
                contributes: true,
            })
            .collect();
        // Queues `iters` reductions back to back and waits once, as nccl-tests times them: the
        // streams stay busy, so the figure is the per-reduce cost, not thread wake-ups.
        let mut batch =
            |streams: &mut [Box<dyn tessera::Backend>], iters: u32| -> anyhow::Result<String> {
                let mut path = String::new();
                for _ in 0..iters {
                    path = match vendor.as_mut().map(|v| v.allreduce(&slices)).transpose()? {
                        Some(CommOutcome::Done) => format!("{} comm", devices[0].backend_name()),
                        _ => ar.run(streams, &slices)?.to_string(),
                    };
                }
                for s in streams.iter_mut() {
                    s.synchronize()?;
                }
                Ok(path)
            };
        let path = batch(&mut streams, 2)?;
        let (mut runs, t0) = (0u32, Instant::now());
        while runs < 20 || (t0.elapsed() < opts.min_time && runs < 1_000_000) {
            batch(&mut streams, 10)?;
            runs += 10;
        }
        let secs = t0.elapsed().as_secs_f64() / runs as f64;
        let algbw = size as f64 / secs;
        let busbw = if n > 1 {
            algbw * 2.0 * (n - 1) as f64 / n as f64
        } else {
            0.0
        };
        println!(
            "| {:>10} | {:>10} | {:>10.1} | {:>10.2} | {:>10.2} | {:<26} |",
            size,
            len,
            secs * 1e6,
            algbw / 1e9,
            busbw / 1e9,
            path
        );
        size = size.saturating_mul(4);
    }
    if matches!(opts.algorithm, Algorithm::Auto { .. }) {
        println!(
            "auto uses the ring from {} KiB per peer device ({} KiB with {n} devices)",
            DEFAULT_RING_THRESHOLD >> 10,
            (DEFAULT_RING_THRESHOLD * n.saturating_sub(1)) >> 10
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("x").is_err());
        assert_eq!(parse_range("4K..64M").unwrap(), (4096, 64 << 20));
        assert!(parse_range("64M..4K").is_err());
        assert!(parse_range("0..4K").is_err());
    }
}
