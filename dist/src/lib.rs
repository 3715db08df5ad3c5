//! Engines for [`tessera_core::comm::DistComm`]: collectives between the processes (ranks) of one
//! distributed tensor-parallel job.
//!
//! With the `mpi` cargo feature, `Mpi` runs them over MPI (start the job with `mpirun`);
//! without it, [`mpi_unavailable`] says how to get it. Fault injection for tests
//! ([`FAULT_ENV`]) is parsed here in every build.

#![deny(unsafe_code)]

#[cfg(feature = "mpi")]
#[allow(unsafe_code)]
mod mpi;

#[cfg(feature = "mpi")]
pub use self::mpi::Mpi;

use tessera_core::{Error, Result};

/// Whether this build includes the MPI engine (the `mpi` cargo feature).
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// Why `--dist mpi` cannot run in this build, or `None` when it can.
pub fn mpi_unavailable() -> Option<String> {
    (!MPI_BUILT).then(|| {
        "this tessera was built without the `mpi` feature: rebuild with `--features mpi` \
         (needs an MPI library such as Open MPI, and libclang) and start it under mpirun"
            .to_string()
    })
}

/// Environment variable that arms fault injection in the distributed engines, for tests:
/// `rank=R,after=N,mode=exit|hang` makes rank R, on its (N+1)-th `allreduce_f32`, exit at once
/// without finalizing (`exit`, status [`FAULT_EXIT_CODE`]) or never return (`hang`).
pub const FAULT_ENV: &str = "TESSERA_DIST_FAULT";

/// The exit status of a rank that [`FAULT_ENV`] made exit.
pub const FAULT_EXIT_CODE: i32 = 86;

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Exit the process at once, without finalizing the engine.
    Exit,
    /// Sleep forever inside the collective.
    Hang,
}

/// A fault armed by [`FAULT_ENV`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The rank that misbehaves.
    pub rank: usize,
    /// How many all-reduces it completes first.
    pub after: u64,
    /// What it then does.
    pub mode: FaultMode,
}

impl Fault {
    /// Parses `rank=R,after=N,mode=exit|hang` (keys in any order, all three required).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming [`FAULT_ENV`] and what is wrong.
    pub fn parse(s: &str) -> Result<Fault> {
        let bad = |why: String| {
            Error::InvalidArgument(format!(
                "{FAULT_ENV}='{s}': {why} (expected rank=R,after=N,mode=exit|hang)"
            ))
        };
        let (mut rank, mut after, mut mode) = (None, None, None);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            let v = v.trim();
            match k.trim() {
                "rank" => {
                    rank = Some(
                        v.parse::<usize>()
                            .map_err(|_| bad(format!("rank '{v}' is not a number")))?,
                    )
                }
                "after" => {
                    after = Some(
                        v.parse::<u64>()
                            .map_err(|_| bad(format!("after '{v}' is not a number")))?,
                    )
                }
                "mode" => {
                    mode = Some(match v {
                        "exit" => FaultMode::Exit,
                        "hang" => FaultMode::Hang,
                        other => return Err(bad(format!("unknown mode '{other}'"))),
                    })
                }
                other => return Err(bad(format!("unknown key '{other}'"))),
            }
        }
        match (rank, after, mode) {
            (Some(rank), Some(after), Some(mode)) => Ok(Fault { rank, after, mode }),
            _ => Err(bad("rank, after and mode are all required".into())),
        }
    }

    /// The fault armed in the environment, if any.
    ///
    /// # Errors
    /// As [`Fault::parse`], or when the variable is not UTF-8.
    pub fn from_env() -> Result<Option<Fault>> {
        match std::env::var(FAULT_ENV) {
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Fault::parse(&s).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::InvalidArgument(format!("{FAULT_ENV} is not UTF-8")))
            }
        }
    }

    /// Called by the engine at the start of all-reduce number `call` (0-based) on `rank`:
    /// exits or hangs when this fault fires there.
    pub fn fire(&self, rank: usize, call: u64) {
        if rank != self.rank || call != self.after {
            return;
        }
        match self.mode {
            FaultMode::Exit => {
                eprintln!(
                    "rank {rank}: {FAULT_ENV}: exiting with status {FAULT_EXIT_CODE} in \
                     all-reduce #{} without finalizing",
                    call + 1
                );
                std::process::exit(FAULT_EXIT_CODE);
            }
            FaultMode::Hang => {
                eprintln!(
                    "rank {rank}: {FAULT_ENV}: hanging forever in all-reduce #{}",
                    call + 1
                );
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(
            Fault::parse("rank=1,after=2,mode=exit").unwrap(),
            Fault {
                rank: 1,
                after: 2,
                mode: FaultMode::Exit
            }
        );
        assert_eq!(
            Fault::parse(" mode=hang , rank=0, after=0").unwrap().mode,
            FaultMode::Hang
        );
        for bad in [
            "",
            "rank=1",
            "rank=1,after=2,mode=crash",
            "rank=x,after=2,mode=exit",
            "rank=1,after=2,mode=exit,when=now",
            "rank1,after=2,mode=exit",
        ] {
            let e = Fault::parse(bad).unwrap_err().to_string();
            assert!(e.contains(FAULT_ENV), "{e}");
        }
    }

    #[test]
    fn availability_matches_the_feature() {
        assert_eq!(mpi_unavailable().is_none(), cfg!(feature = "mpi"));
        if let Some(why) = mpi_unavailable() {
            assert!(why.contains("--features mpi"), "{why}");
        }
    }
}
