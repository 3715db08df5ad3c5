//! `tessera bench-mem`: this machine's memory read bandwidth, measured the way a decode step
//! reads its weights (each thread streams its own contiguous share of a buffer far larger than
//! the caches), with several read loops, so that `tessera bench` can print a decode's GB/s as a
//! fraction of what the memory gives. A naive loop understates the limit (a decode can pull more
//! than one plain read loop reaches), so every loop is tried and the best one counts.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Arguments of `tessera bench-mem`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchMemArgs {
    /// Thread counts, comma-separated (default: 1 and every core of the machine).
    #[arg(short = 't', long, value_delimiter = ',', value_parser = super::args::count)]
    pub threads: Vec<usize>,
    /// Buffer size in MiB (far past the last-level cache).
    #[arg(long, default_value_t = 1024, value_parser = super::args::count)]
    pub size_mib: usize,
    /// Minimum seconds to measure each loop at each thread count.
    #[arg(long, default_value_t = 0.5, value_parser = super::args::seconds)]
    pub min_time: f64,
}

/// The largest buffer `--size-mib` takes (1 TiB; allocation fails cleanly below that where
/// memory is short).
const MAX_MIB: usize = 1 << 20;

/// One read loop: its name and the function that reads a slice and returns a value that
/// depends on every word (so the reads cannot be optimised away).
#[derive(Clone, Copy)]
struct Loop {
    name: &'static str,
    read: fn(&[u64]) -> u64,
}

/// The loops this CPU can run, plainest first.
fn loops() -> Vec<Loop> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v = vec![Loop {
        name: "scalar x8",
        read: read_portable,
    }];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            v.push(Loop {
                name: "avx2 x4",
                read: x86::read_avx2,
            });
            v.push(Loop {
                name: "avx2 x4 prefetch",
                read: x86::read_avx2_prefetch,
            });
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            v.push(Loop {
                name: "avx512 x4",
                read: x86::read_avx512,
            });
            v.push(Loop {
                name: "avx512 x4 prefetch",
                read: x86::read_avx512_prefetch,
            });
        }
    }
    v
}

/// Eight independent sums of 64-bit words: the compiler vectorises it for the baseline ISA
/// (SSE2 on x86-64, NEON on arm64).
fn read_portable(s: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*x);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, x| a.wrapping_add(*x));
    acc.iter().fold(tail, |a, x| a ^ x)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Bytes ahead of the load that the prefetching loops ask for (a few pages' worth of
    /// lines in flight per thread, past what the hardware prefetcher keeps).
    const AHEAD: usize = 1024;

    pub fn read_avx2(s: &[u64]) -> u64 {
        // SAFETY: `loops` lists this loop only where the CPU has AVX2.
        unsafe { avx2(s, false) }
    }

    pub fn read_avx2_prefetch(s: &[u64]) -> u64 {
        // SAFETY: as `read_avx2`.
        unsafe { avx2(s, true) }
    }

    pub fn read_avx512(s: &[u64]) -> u64 {
        // SAFETY: `loops` lists this loop only where the CPU has AVX-512F.
        unsafe { avx512(s, false) }
    }

    pub fn read_avx512_prefetch(s: &[u64]) -> u64 {
        // SAFETY: as `read_avx512`.
        unsafe { avx512(s, true) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2(s: &[u64], prefetch: bool) -> u64 {
        let n = s.len() / 16 * 16;
        let p = s.as_ptr();
        let mut a = [_mm256_setzero_si256(); 4];
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= s.len(): four 32-byte loads inside the slice; the
            // prefetch address may pass its end, which a prefetch never faults on.
            unsafe {
                if prefetch {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(i).cast::<i8>().wrapping_add(AHEAD));
                }
                for (k, acc) in a.iter_mut().enumerate() {
                    let v = _mm256_loadu_si256(p.add(i + 4 * k).cast());
                    *acc = _mm256_add_epi64(*acc, v);
                }
            }
            i += 16;
        }
        let all = _mm256_xor_si256(_mm256_xor_si256(a[0], a[1]), _mm256_xor_si256(a[2], a[3]));
        let mut out = [0u64; 4];
        // SAFETY: `out` holds 32 bytes.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), all) };
        out.iter().fold(super::read_portable(&s[n..]), |x, y| x ^ y)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(s: &[u64], prefetch: bool) -> u64 {
        let n = s.len() / 32 * 32;
        let p = s.as_ptr();
        let mut a = [_mm512_setzero_si512(); 4];
        let mut i = 0;
        while i < n {
            // SAFETY: i + 32 <= n <= s.len(): four 64-byte loads inside the slice; prefetches
            // past its end do not fault.
            unsafe {
                if prefetch {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(i).cast::<i8>().wrapping_add(AHEAD));
                    _mm_prefetch::<_MM_HINT_T0>(p.add(i).cast::<i8>().wrapping_add(AHEAD + 128));
                }
                for (k, acc) in a.iter_mut().enumerate() {
                    let v = _mm512_loadu_si512(p.add(i + 8 * k).cast());
                    *acc = _mm512_add_epi64(*acc, v);
                }
            }
            i += 32;
        }
        let all = _mm512_xor_si512(_mm512_xor_si512(a[0], a[1]), _mm512_xor_si512(a[2], a[3]));
        _mm512_reduce_add_epi64(all) as u64 ^ super::read_portable(&s[n..])
    }
}

/// What one loop reached at one thread count.
#[derive(Clone, Debug)]
pub struct MemResult {
    /// The loop's name.
    pub name: &'static str,
    /// Threads that read at once.
    pub threads: usize,
    /// Best pass: bytes read over the slowest thread's time, in GB/s (10⁹ bytes).
    pub gb_s: f64,
}

/// Measures every loop at each thread count over a buffer of `bytes`; returns the results in
/// the order run. The buffer is written first, so that every page is backed by memory (an
/// untouched buffer reads the kernel's zero page and measures the cache).
///
/// # Errors
/// When the buffer cannot be allocated.
pub fn measure(
    threads: &[usize],
    bytes: usize,
    min_time: Duration,
) -> anyhow::Result<Vec<MemResult>> {
    let words = (bytes / 8).max(4096);
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words).map_err(|e| {
        anyhow::anyhow!(
            "bench-mem: cannot allocate a {} MiB buffer: {e}",
            bytes >> 20
        )
    })?;
    buf.extend((0..words as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let mut out = Vec::new();
    let mut sink = 0u64;
    for &t in threads {
        let t = t.max(1);
        let share = words.div_ceil(t);
        for l in loops() {
            let mut best = 0.0f64;
            let start = Instant::now();
            let mut passes = 0;
            // At least three passes: the first also warms the TLB.
            while passes < 3 || start.elapsed() < min_time {
                let barrier = Barrier::new(t);
                let (secs, x) = std::thread::scope(|sc| {
                    let handles: Vec<_> = buf
                        .chunks(share)
                        .map(|part| {
                            let barrier = &barrier;
                            sc.spawn(move || {
                                barrier.wait();
                                let t0 = Instant::now();
                                let x = (l.read)(part);
                                (t0.elapsed().as_secs_f64(), x)
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or((f64::INFINITY, 0)))
                        .fold((0.0f64, 0u64), |(s, x), (s1, x1)| (s.max(s1), x ^ x1))
                });
                sink ^= x;
                best = best.max((words * 8) as f64 / secs / 1e9);
                passes += 1;
            }
            out.push(MemResult {
                name: l.name,
                threads: t,
                gb_s: best,
            });
        }
    }
    // The sums feed nothing else; this keeps them, and so the reads, alive.
    std::hint::black_box(sink);
    Ok(out)
}

/// The best of `results` at `threads` threads, if any ran.
pub fn best_at(results: &[MemResult], threads: usize) -> Option<&MemResult> {
    results
        .iter()
        .filter(|r| r.threads == threads)
        .max_by(|a, b| a.gb_s.total_cmp(&b.gb_s))
}

/// Runs `tessera bench-mem` and prints its table.
///
/// # Errors
/// A buffer size past `MAX_MIB` or one that cannot be allocated.
pub fn run(args: &BenchMemArgs) -> anyhow::Result<()> {
    if args.size_mib > MAX_MIB {
        anyhow::bail!("--size-mib {}: at most {MAX_MIB}", args.size_mib);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if args.threads.is_empty() {
        let mut v = vec![1, cores];
        v.dedup();
        v
    } else {
        args.threads.clone()
    };
    eprintln!(
        "reading {} MiB per pass, each thread its own contiguous share",
        args.size_mib
    );
    let results = measure(
        &threads,
        args.size_mib << 20,
        Duration::from_secs_f64(args.min_time),
    )?;
    println!("| {:<20} | {:>7} | {:>8} |", "loop", "threads", "GB/s");
    println!("| {:-<20} | {:->7} | {:->8} |", "", "", "");
    for r in &results {
        println!("| {:<20} | {:>7} | {:>8.2} |", r.name, r.threads, r.gb_s);
    }
    for &t in &threads {
        if let Some(b) = best_at(&results, t) {
            println!(
                "read bandwidth at {t} thread(s): {:.2} GB/s ({})",
                b.gb_s, b.name
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loop_reads_every_word() {
        // The loops sum in different orders; each must see every word, including a tail that
        // is not a whole vector step. A word changed anywhere must change the result.
        let words: Vec<u64> = (0..1000u64).map(|i| i * 7 + 3).collect();
        for l in loops() {
            let base = (l.read)(&words);
            for at in [0, 17, 500, 999] {
                let mut w = words.clone();
                w[at] += 1;
                assert_ne!((l.read)(&w), base, "{} missed word {at}", l.name);
            }
        }
    }

    #[test]
    fn measures_each_loop_at_each_thread_count() {
        let r = measure(&[1, 2], 1 << 20, Duration::ZERO).expect("1 MiB");
        assert_eq!(r.len(), 2 * loops().len());
        assert!(r.iter().all(|x| x.gb_s > 0.0 && x.gb_s.is_finite()));
        assert!(best_at(&r, 2).is_some() && best_at(&r, 3).is_none());
    }
}
