//! Tensor parallelism across real processes under `mpirun -np 2`: `tessera test-tp --dist mpi`
//! with one and two devices per rank (logits against the unsplit run, on every rank), the
//! expert split, mismatched arguments, and `tessera bench-allreduce --dist mpi`; healthy and
//! with a rank that exits or hangs mid-job (`TESSERA_DIST_FAULT`): the job ends within a bound
//! with an error naming the rank.
//!
//! Needs `mpirun` (Open MPI): without it the tests fail when `CI` is set and are skipped
//! otherwise.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every job must end within this, or the test kills it and fails.
const BOUND: Duration = Duration::from_secs(90);

/// One `mpirun` job at a time: each starts two ranks, and jobs of parallel tests would share the
/// cores with each other, stretching the timeouts the fault tests measure (one such test failed
/// once on 2 cores under a load of 4.5).
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_job() -> std::sync::MutexGuard<'static, ()> {
    // A test that panicked while holding it left nothing to repair.
    ONE_JOB
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `mpirun` runs; panics under CI when it does not.
fn have_mpirun() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpirun is missing (install openmpi-bin libopenmpi-dev): required under CI"
        );
        eprintln!("skipped: mpirun is missing (install openmpi-bin libopenmpi-dev)");
    }
    ok
}

struct Outcome {
    code: Option<i32>,
    output: String,
    took: Duration,
}

/// `mpirun -np 2 --oversubscribe tessera bench-allreduce --dist mpi ARGS`: see [`mpirun_cmd`].
fn mpirun(name: &str, fault: Option<&str>, args: &[&str]) -> Outcome {
    let mut all = vec!["bench-allreduce", "--dist", "mpi"];
    all.extend_from_slice(args);
    mpirun_cmd(name, fault, &all)
}

/// `mpirun -np 2 --oversubscribe tessera ARGS` with `fault` in `TESSERA_DIST_FAULT` (passed to
/// the ranks with `-x`), killed (and failed) after [`BOUND`].
fn mpirun_cmd(name: &str, fault: Option<&str>, args: &[&str]) -> Outcome {
    let _job = one_job();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let log = dir.join(format!("dist_mpi_{name}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", "2", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("TESSERA_DIST_FAULT");
    if let Some(f) = fault {
        cmd.env("TESSERA_DIST_FAULT", f)
            .args(["-x", "TESSERA_DIST_FAULT"]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("mpirun starts");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name}: the job did not end within {BOUND:?}; output:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log).unwrap();
    Outcome {
        code: status.code(),
        output,
        took: start.elapsed(),
    }
}

#[test]
fn two_ranks_reduce_and_print_the_table() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun("ok", None, &["--sizes", "4K..64K", "--min-time", "0.05"]);
    assert_eq!(out.code, Some(0), "{}", out.output);
    assert!(
        out.output.contains("2 ranks × 1 local device"),
        "{}",
        out.output
    );
    let rows: Vec<&str> = out
        .output
        .lines()
        .filter(|l| {
            l.starts_with("| ")
                && l[2..]
                    .trim_start()
                    .starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    let sizes: Vec<&str> = rows
        .iter()
        .map(|r| r.split('|').nth(1).unwrap().trim())
        .collect();
    assert_eq!(sizes, ["4096", "16384", "65536"], "{}", out.output);
    for r in rows {
        let ratio = r.split('|').nth(9).unwrap().trim().trim_end_matches('x');
        let ratio: f64 = ratio.parse().unwrap_or_else(|_| panic!("ratio in {r}"));
        assert!(ratio.is_finite() && ratio > 0.0, "{r}");
    }
}

#[test]
fn a_rank_that_exits_ends_the_job_and_is_named() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun(
        "exit",
        Some("rank=1,after=2,mode=exit"),
        &["--sizes", "4K..16K", "--min-time", "0.05"],
    );
    assert!(
        out.code != Some(0),
        "exit status {:?}:\n{}",
        out.code,
        out.output
    );
    assert!(out.took < BOUND, "{:?}", out.took);
    // Our own last words, and Open MPI's report of the process that exited with status 86.
    assert!(
        out.output.contains("rank 1: TESSERA_DIST_FAULT: exiting"),
        "{}",
        out.output
    );
    // Open MPI: "Process name: [[JOB,1],1]" (the last number is the rank), "Exit code: 86".
    let line = |key: &str| {
        out.output
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .map(|l| l.trim().to_string())
            .unwrap_or_default()
    };
    assert!(line("Process name:").ends_with(",1]"), "{}", out.output);
    assert!(line("Exit code:").ends_with(" 86"), "{}", out.output);
}

#[test]
fn a_rank_that_hangs_is_named_after_the_timeout() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun(
        "hang",
        Some("rank=1,after=2,mode=hang"),
        &[
            "--sizes",
            "4K..16K",
            "--min-time",
            "0.05",
            "--dist-timeout",
            "3",
        ],
    );
    assert!(
        out.code != Some(0),
        "exit status {:?}:\n{}",
        out.code,
        out.output
    );
    assert!(
        out.output.contains("timed out after 3s on rank 0")
            && out.output.contains("ranks [1] have not answered"),
        "{}",
        out.output
    );
    assert!(out.output.contains("MPI_Abort"), "{}", out.output);
}

/// `test-tp --dist mpi` with `args`, expected to pass on every rank.
fn test_tp_passes(name: &str, args: &[&str], expect: &[&str]) {
    let mut all = vec!["test-tp", "--dist", "mpi"];
    all.extend_from_slice(args);
    let out = mpirun_cmd(name, None, &all);
    assert_eq!(out.code, Some(0), "{}", out.output);
    assert!(out.output.contains("\nPASS"), "{}", out.output);
    assert!(!out.output.contains("FAIL"), "{}", out.output);
    for e in expect {
        assert!(out.output.contains(e), "missing {e:?}:\n{}", out.output);
    }
}

#[test]
fn two_ranks_of_one_device_match_the_unsplit_model() {
    if !have_mpirun() {
        return;
    }
    // F32 within 1e-6 and Q8_0 within 1e-5 NMSE of the unsplit run, on every rank's logits.
    test_tp_passes(
        "tp_1x2",
        &["--devices", "cpu:1"],
        &[
            "META(r0/CPU0,r1/CPU0): tensor-parallel over 2 devices of 2 ranks (mpi)",
            "then mpi across 2 ranks",
            "36 all-reduces (36 across ranks)",
        ],
    );
}

#[test]
fn two_ranks_of_two_devices_with_uneven_ratios_match_the_unsplit_model() {
    if !have_mpirun() {
        return;
    }
    test_tp_passes(
        "tp_2x2",
        &["--devices", "cpu:2", "--ratios", "3,1,0,2"],
        &[
            "META(r0/CPU0,r0/CPU1,r1/CPU0,r1/CPU1)",
            "all-reduce: cpu comm, then mpi across 2 ranks",
        ],
    );
}

#[test]
fn two_ranks_split_quantized_kv_caches_by_heads() {
    if !have_mpirun() {
        return;
    }
    // Each rank holds whole heads of q8_0 keys and q4_0 values (rotated, as llama.cpp's).
    test_tp_passes(
        "tp_kv",
        &[
            "--devices",
            "cpu:1",
            "--cache-type-k",
            "q8_0",
            "--cache-type-v",
            "q4_0",
        ],
        &[
            "KV caches: K q8_0, V q4_0 (heads of 32)",
            "then mpi across 2 ranks",
        ],
    );
}

#[test]
fn two_ranks_split_whole_experts() {
    if !have_mpirun() {
        return;
    }
    test_tp_passes(
        "tp_expert",
        &["--devices", "cpu:1", "--split-mode", "expert"],
        // The last step is three sequences' one token each: 3 rows of 64.
        &["EP layers", "ffn_moe_out.0 ×192"],
    );
}

/// The reference suite's synthetic model `name` (`tessera write-reference --only`), written into
/// the test's temporary folder, and its recording `recording` in `tests/reference/`.
fn reference_files(name: &str, recording: &str) -> (String, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dist_mpi_reference");
    let gguf = dir.join(format!("{name}.gguf"));
    // Written every time (a fraction of a second): a file left by an older build or a killed
    // run would be checked against today's recording.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["write-reference", "--only", name])
        .arg(&dir)
        .output()
        .expect("tessera starts");
    assert!(out.status.success(), "{out:?}");
    let rec = format!(
        "{}/../tests/reference/synthetic/{recording}",
        env!("CARGO_MANIFEST_DIR")
    );
    (gguf.display().to_string(), rec)
}

#[test]
fn two_ranks_match_llama_cpp_with_caches_its_tensor_split_refuses() {
    if !have_mpirun() {
        return;
    }
    // q4_1 caches, which llama.cpp's own tensor split asserts on, split by heads across two
    // processes and held to the reference suite's bound against llama.cpp's unsplit recording.
    let (gguf, rec) = reference_files("llama-f32-gqa", "kv/llama-f32-gqa.q4_1-q4_1.txt");
    test_tp_passes(
        "tp_reference_kv",
        &[
            "--devices",
            "cpu:1",
            "-m",
            &gguf,
            "--reference",
            &rec,
            "-ctk",
            "q4_1",
            "-ctv",
            "q4_1",
        ],
        &[
            "reference check of",
            "KV caches K q4_1, V q4_1",
            "1 device per rank, 2 ranks",
            "argmax",
            "then mpi across 2 ranks",
        ],
    );
}

#[test]
fn two_ranks_of_whole_experts_match_llama_cpp() {
    if !have_mpirun() {
        return;
    }
    let (gguf, rec) = reference_files("qwen3moe-f32-gqa", "qwen3moe-f32-gqa.txt");
    test_tp_passes(
        "tp_reference_expert",
        &[
            "--devices",
            "cpu:1",
            "--split-mode",
            "expert",
            "-m",
            &gguf,
            "--reference",
            &rec,
        ],
        &["expert-parallel reference check of", "EP layers"],
    );
}

#[test]
fn ranks_started_with_different_arguments_refuse_to_run() {
    if !have_mpirun() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_tessera");
    let _job = one_job();
    let out = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "-np",
            "1",
            bin,
            "test-tp",
            "--dist",
            "mpi",
            "--devices",
            "cpu:1",
        ])
        .args([
            ":",
            "-np",
            "1",
            bin,
            "test-tp",
            "--dist",
            "mpi",
            "--devices",
            "cpu:1",
            "--generic",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("mpirun starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("ranks [1] were started with a different command line"),
        "{text}"
    );
}

#[test]
fn a_rank_that_exits_mid_model_ends_the_job() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun_cmd(
        "tp_exit",
        Some("rank=1,after=5,mode=exit"),
        &["test-tp", "--dist", "mpi", "--devices", "cpu:1"],
    );
    assert!(out.code != Some(0), "{}", out.output);
    assert!(out.took < BOUND, "{:?}", out.took);
    assert!(
        out.output.contains("rank 1: TESSERA_DIST_FAULT: exiting"),
        "{}",
        out.output
    );
    assert!(!out.output.contains("\nPASS"), "{}", out.output);
}

#[test]
fn a_rank_that_hangs_mid_model_is_named_after_the_timeout() {
    if !have_mpirun() {
        return;
    }
    let out = mpirun_cmd(
        "tp_hang",
        Some("rank=1,after=5,mode=hang"),
        &[
            "test-tp",
            "--dist",
            "mpi",
            "--devices",
            "cpu:1",
            "--dist-timeout",
            "3",
        ],
    );
    assert!(out.code != Some(0), "{}", out.output);
    assert!(out.took < BOUND, "{:?}", out.took);
    assert!(
        out.output.contains("ranks [1] have not answered") && out.output.contains("all-reduce of"),
        "{}",
        out.output
    );
}
