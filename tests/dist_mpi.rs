//! The MPI engine across real processes: `tessera bench-allreduce --dist mpi` under
//! `mpirun -np 2`, healthy and with a rank that exits or hangs (`TESSERA_DIST_FAULT`).
//!
//! Needs `mpirun` (Open MPI): without it the tests fail when `CI` is set and are skipped
//! otherwise.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every job must end within this, or the test kills it and fails.
const BOUND: Duration = Duration::from_secs(90);

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

/// `mpirun -np 2 --oversubscribe tessera bench-allreduce --dist mpi ARGS` with `fault` in
/// `TESSERA_DIST_FAULT` (passed to the ranks with `-x`), killed (and failed) after [`BOUND`].
fn mpirun(name: &str, fault: Option<&str>, args: &[&str]) -> Outcome {
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
        .args(["bench-allreduce", "--dist", "mpi"])
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
