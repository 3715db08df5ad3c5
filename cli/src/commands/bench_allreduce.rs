//! `tessera bench-allreduce`: time the all-reduce between devices, with nccl-tests' definitions
//! (algbw = bytes / time, busbw = algbw · 2(n−1)/n) and a memcpy baseline from the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::comm::{Algorithm, AllReduce, DEFAULT_RING_THRESHOLD, Wire};
use tessera::{BackendOptions, Buffer, Device};
use tessera_core::comm::CommSlice;
use tessera_core::comm::{CommApi, CommOutcome};

/// Options of `bench-allreduce`.
pub struct Options {
    /// Smallest and largest slice size in bytes; sizes step by ×4.
    pub sizes: (usize, usize),
    /// Exchange format.
    pub wire: Wire,
    /// Exchange pattern.
    pub algorithm: Algorithm,
    /// Threads in all, divided among the CPU devices (`None`: each device's default).
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

/// Parses `--dist-timeout`: seconds, finite, above 0 and at most a day.
pub fn timeout(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => Ok(t),
        _ => Err(format!("'{s}': expected seconds above 0, at most 86400")),
    }
}

/// Rounds per size: the all-reduce and the memcpy baseline alternate, and the median round of each
/// is reported, so a burst of load from elsewhere hits both or is voted out.
const ROUNDS: usize = 3;

/// One-thread memcpy of `bytes` (the bandwidth baseline), with reusable buffers.
struct Memcpy {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl Memcpy {
    fn new(bytes: usize) -> Memcpy {
        let mut m = Memcpy {
            src: vec![1u8; bytes],
            dst: vec![0u8; bytes],
        };
        m.dst.copy_from_slice(&m.src); // fault the pages in
        m
    }

    /// Seconds per copy, over at least `min_time` and 10 copies.
    fn time(&mut self, min_time: Duration) -> f64 {
        let (mut runs, t0) = (0u32, Instant::now());
        while runs < 10 || (t0.elapsed() < min_time && runs < 1_000_000) {
            self.dst.copy_from_slice(std::hint::black_box(&self.src));
            runs += 1;
        }
        std::hint::black_box(&self.dst);
        t0.elapsed().as_secs_f64() / runs as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the benchmark over `devices` and prints a table.
pub fn run(devices: &[Arc<dyn Device>], opts: &Options) -> anyhow::Result<()> {
    let n = devices.len();
    let baseline = 16usize << 20;
    let mut copy = Memcpy::new(baseline);
    let copy_secs = median((0..ROUNDS).map(|_| copy.time(opts.min_time / 3)).collect());
    drop(copy);
    println!(
        "memcpy baseline: {:.2} GB/s (16 MiB copied by 1 thread; median of {ROUNDS} rounds)",
        baseline as f64 / copy_secs / 1e9
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
        "busbw = algbw·2(n−1)/n; memcpy = the same size copied by 1 thread, timed in alternation with the all-reduce"
    );
    println!(
        "| {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>11} | {:>9} | {:<16} |",
        "size (B)",
        "count",
        "time (us)",
        "algbw GB/s",
        "busbw GB/s",
        "memcpy GB/s",
        "% memcpy",
        "path"
    );
    println!(
        "|{:-<12}|{:-<12}|{:-<12}|{:-<12}|{:-<12}|{:-<13}|{:-<11}|{:-<18}|",
        "", "", "", "", "", "", "", ""
    );
    let bopts = tessera_core::backend::per_device_options(
        devices,
        &opts
            .threads
            .map(BackendOptions::with_threads)
            .unwrap_or_default(),
    );
    let mut streams = devices
        .iter()
        .zip(&bopts)
        .map(|(d, o)| d.init_backend(o))
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
        let mut copy = Memcpy::new(size);
        let (mut reduce_secs, mut copy_secs) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let (mut runs, t0) = (0u32, Instant::now());
            let min_time = opts.min_time / ROUNDS as u32;
            while runs < 20 || (t0.elapsed() < min_time && runs < 1_000_000) {
                batch(&mut streams, 10)?;
                runs += 10;
            }
            reduce_secs.push(t0.elapsed().as_secs_f64() / runs as f64);
            copy_secs.push(copy.time(min_time / 2));
        }
        let secs = median(reduce_secs);
        let copy_bw = size as f64 / median(copy_secs);
        let algbw = size as f64 / secs;
        let busbw = if n > 1 {
            algbw * 2.0 * (n - 1) as f64 / n as f64
        } else {
            0.0
        };
        println!(
            "| {:>10} | {:>10} | {:>10.1} | {:>10.2} | {:>10.2} | {:>11.2} | {:>8.0}% | {:<16} |",
            size,
            len,
            secs * 1e6,
            algbw / 1e9,
            busbw / 1e9,
            copy_bw / 1e9,
            100.0 * busbw / copy_bw,
            path
        );
        size = size.saturating_mul(4);
    }
    if matches!(opts.algorithm, Algorithm::Auto { .. }) && vendor.is_none() {
        println!(
            "auto uses the ring from {} KiB per peer device ({} KiB with {n} devices)",
            DEFAULT_RING_THRESHOLD >> 10,
            (DEFAULT_RING_THRESHOLD * n.saturating_sub(1)) >> 10
        );
    }
    Ok(())
}

/// `bench-allreduce --dist mpi`: the cross-rank step of a distributed meta device against a
/// plain `MPI_Allreduce`, per size, on every rank of an `mpirun` job (rank 0 prints).
///
/// The Tessera step is what the meta device runs for one reduced slice: read it from the rank's
/// first local device into host f32, [`tessera::dist::Mpi`]'s all-reduce (non-blocking,
/// polled, with the timeout), and write the result into every local device's buffer. The raw
/// step is a blocking `MPI_Allreduce` between host vectors of the same size; the two alternate
/// in rounds, with iteration counts chosen by rank 0 and broadcast, so every rank makes the
/// same calls. A failure (a timeout included) ends the whole job with `MPI_Abort`, after the
/// rank that saw it printed the error.
#[cfg(feature = "mpi")]
pub fn run_dist(
    devices: &[Arc<dyn Device>],
    opts: &Options,
    timeout: Duration,
) -> anyhow::Result<()> {
    use tessera::comm::DistComm;
    let mpi = tessera::dist::Mpi::init(timeout)?;
    match dist_table(&mpi, devices, opts) {
        Ok(()) => Ok(()),
        Err(e) => {
            eprintln!(
                "tessera: rank {} of {} ({}): {e:#}",
                mpi.rank(),
                mpi.size(),
                mpi.processor_name()
            );
            if mpi.size() > 1 {
                eprintln!("tessera: rank {}: aborting the job (MPI_Abort)", mpi.rank());
                mpi.abort(1);
            }
            Err(e)
        }
    }
}

#[cfg(feature = "mpi")]
fn dist_table(
    mpi: &tessera::dist::Mpi,
    devices: &[Arc<dyn Device>],
    opts: &Options,
) -> anyhow::Result<()> {
    use tessera::comm::DistComm;
    let (rank, ranks) = (mpi.rank(), mpi.size());
    let lead = rank == 0;
    if devices.is_empty() {
        anyhow::bail!("no local device selected");
    }
    // Every rank must run the same sizes and devices per rank, or the collectives mismatch.
    let shape = format!("{:?} {} {:?}", opts.sizes, devices.len(), opts.min_time);
    tessera::comm::check_same(mpi, shape.as_bytes(), "bench-allreduce arguments")?;
    if lead {
        let s = |n: usize, one: &str| {
            if n == 1 {
                one.to_string()
            } else {
                format!("{one}s")
            }
        };
        println!(
            "distributed all-reduce over MPI: {ranks} {} × {} local {} [{}] (rank 0 on {}), f32, timeout {:?}",
            s(ranks, "rank"),
            devices.len(),
            s(devices.len(), "device"),
            devices
                .iter()
                .map(|d| d.name().to_string())
                .collect::<Vec<_>>()
                .join(","),
            mpi.processor_name(),
            mpi.timeout()
        );
        println!(
            "tessera = first local device → host f32, Mpi::allreduce_f32 (non-blocking, polled), host → every local device; raw = blocking MPI_Allreduce between host vectors"
        );
        println!(
            "engine = Mpi::allreduce_f32 alone on a host vector (tessera minus the device staging); busbw = algbw·2(R−1)/R over R ranks"
        );
        println!(
            "the three alternate, median of {ROUNDS} rounds; algbw and busbw are tessera's; ratio = tessera time / raw time"
        );
        println!(
            "| {:>10} | {:>10} | {:>12} | {:>11} | {:>10} | {:>10} | {:>10} | {:>10} | {:>11} |",
            "size (B)",
            "count",
            "tessera (us)",
            "engine (us)",
            "algbw GB/s",
            "busbw GB/s",
            "raw (us)",
            "raw busbw",
            "tessera/raw"
        );
        println!(
            "|{:-<12}|{:-<12}|{:-<14}|{:-<13}|{:-<12}|{:-<12}|{:-<12}|{:-<12}|{:-<13}|",
            "", "", "", "", "", "", "", "", ""
        );
    }
    let busbw = |algbw: f64| {
        if ranks > 1 {
            algbw * 2.0 * (ranks - 1) as f64 / ranks as f64
        } else {
            0.0
        }
    };
    let mut size = opts.sizes.0.max(4);
    while size <= opts.sizes.1 {
        let len = size / 4;
        let bufs: Vec<Arc<dyn Buffer>> = devices
            .iter()
            .map(|d| d.buffer_type().alloc(len * 4))
            .collect::<tessera::Result<_>>()?;
        let mut host = vec![0f32; len];
        let what = format!("bench all-reduce of {size} B");
        let step = |host: &mut Vec<f32>| -> anyhow::Result<()> {
            bufs[0].read(0, bytemuck::cast_slice_mut(host.as_mut_slice()))?;
            mpi.allreduce_f32(host, &what)?;
            for b in &bufs {
                b.write(0, bytemuck::cast_slice(host.as_slice()))?;
            }
            Ok(())
        };
        // Correctness first: rank r contributes r + 1 everywhere, so every value sums to
        // R(R+1)/2 on every device of every rank.
        let mine = vec![(rank + 1) as f32; len];
        bufs[0].write(0, bytemuck::cast_slice(&mine))?;
        step(&mut host)?;
        let want = (ranks * (ranks + 1) / 2) as f32;
        let mut back = vec![0f32; len];
        for (i, b) in bufs.iter().enumerate() {
            b.read(0, bytemuck::cast_slice_mut(&mut back))?;
            if let Some(j) = back.iter().position(|&v| v != want) {
                anyhow::bail!(
                    "rank {rank}: all-reduce of {size} B: local device {i} holds {} at {j}, want {want}",
                    back[j]
                );
            }
        }
        for b in &bufs {
            b.write(0, &vec![0u8; len * 4])?;
        }
        let send = vec![0f32; len];
        let mut recv = vec![0f32; len];
        // Rank 0 sizes the rounds from a short calibration and tells the others.
        let t0 = Instant::now();
        for _ in 0..3 {
            step(&mut host)?;
            mpi.raw_allreduce_into(&send, &mut recv)?;
        }
        let per = t0.elapsed().as_secs_f64() / 3.0;
        let want_iters = ((opts.min_time.as_secs_f64() / ROUNDS as f64) / per.max(1e-9)) as u64;
        let mut iters = want_iters.clamp(5, 100_000).to_le_bytes();
        mpi.broadcast(0, &mut iters, "bench iteration count")?;
        let iters = u64::from_le_bytes(iters);
        let (mut ours, mut engine, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let mut alone = vec![0f32; len];
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..iters {
                step(&mut host)?;
            }
            ours.push(t.elapsed().as_secs_f64() / iters as f64);
            let t = Instant::now();
            for _ in 0..iters {
                mpi.allreduce_f32(&mut alone, &what)?;
            }
            engine.push(t.elapsed().as_secs_f64() / iters as f64);
            let t = Instant::now();
            for _ in 0..iters {
                mpi.raw_allreduce_into(&send, &mut recv)?;
            }
            raw.push(t.elapsed().as_secs_f64() / iters as f64);
        }
        let (ours, engine, raw) = (median(ours), median(engine), median(raw));
        if lead {
            let algbw = size as f64 / ours;
            println!(
                "| {:>10} | {:>10} | {:>12.1} | {:>11.1} | {:>10.2} | {:>10.2} | {:>10.1} | {:>10.2} | {:>10.2}x |",
                size,
                len,
                ours * 1e6,
                engine * 1e6,
                algbw / 1e9,
                busbw(algbw) / 1e9,
                raw * 1e6,
                busbw(size as f64 / raw) / 1e9,
                ours / raw
            );
        }
        size = size.saturating_mul(4);
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
        assert_eq!(timeout("2.5"), Ok(2.5));
        for bad in ["0", "-1", "nan", "inf", "1e9", "x"] {
            assert!(timeout(bad).is_err(), "{bad}");
        }
    }
}
