//! `--dist`: one model split over the ranks of an MPI job (`mpirun -np R tessera … --dist mpi`).
//! Every rank runs the same command on its own `--devices`; the meta device spans the devices
//! of every rank in rank order, and `--ratios` are global (one per device of every rank).

use std::sync::Arc;
use std::time::Duration;
use tessera::comm::DistComm;

/// The engine joining the ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DistEngine {
    /// One process (the default).
    #[default]
    None,
    /// The processes of an `mpirun` job (MPI on the host; the `mpi` cargo feature).
    Mpi,
}

/// The arguments of a command that can run distributed.
#[derive(Clone, Debug, clap::Args)]
pub struct DistArgs {
    /// Split over the processes of an MPI job (start with `mpirun -np R`; each rank gives its
    /// own --devices, the same everywhere in the usual case). Needs --split-mode tensor or
    /// expert.
    #[arg(long, value_enum, default_value = "none")]
    pub dist: DistEngine,
    /// Seconds a rank waits in a collective before ending the whole job with an error naming
    /// the ranks it waited for (a peer died or hangs).
    #[arg(long, default_value_t = 300.0, value_parser = timeout)]
    pub dist_timeout: f64,
}

impl Default for DistArgs {
    fn default() -> DistArgs {
        DistArgs {
            dist: DistEngine::None,
            dist_timeout: 300.0,
        }
    }
}

/// `--dist-timeout`: finite seconds in `0.1..=86400`.
pub fn timeout(s: &str) -> Result<f64, String> {
    let t: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if t.is_finite() && (0.1..=86_400.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!("{t} seconds: expected 0.1..=86400"))
    }
}

/// This process's place in the job.
pub struct Job {
    comm: Option<Arc<dyn DistComm>>,
    #[cfg(feature = "mpi")]
    mpi: Option<Arc<tessera::dist::Mpi>>,
}

impl Job {
    /// One process, no collectives.
    pub fn single() -> Job {
        Job {
            comm: None,
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// Joins the job `args` asks for, and checks that every rank got the same `fingerprint`
    /// (the command line and the model file's size and metadata).
    ///
    /// # Errors
    /// A build without the engine; the engine's start-up errors; a fingerprint mismatch.
    pub fn start(args: &DistArgs, fingerprint: &[u8]) -> anyhow::Result<Job> {
        match args.dist {
            DistEngine::None => Ok(Job::single()),
            DistEngine::Mpi => Self::start_mpi(args, fingerprint),
        }
    }

    #[cfg(feature = "mpi")]
    fn start_mpi(args: &DistArgs, fingerprint: &[u8]) -> anyhow::Result<Job> {
        let mpi = tessera::dist::Mpi::init(Duration::from_secs_f64(args.dist_timeout))?;
        let comm: Arc<dyn DistComm> = mpi.clone();
        let job = Job {
            comm: Some(comm.clone()),
            mpi: Some(mpi),
        };
        if let Err(e) =
            tessera::comm::check_same(comm.as_ref(), fingerprint, "command line or model file")
        {
            return Err(job.fail(e.into()));
        }
        tracing::info!(
            rank = comm.rank(),
            ranks = comm.size(),
            "joined the MPI job"
        );
        Ok(job)
    }

    #[cfg(not(feature = "mpi"))]
    fn start_mpi(_args: &DistArgs, _fingerprint: &[u8]) -> anyhow::Result<Job> {
        let _ = Duration::ZERO;
        anyhow::bail!(
            "--dist mpi: this tessera was built without the `mpi` cargo feature (rebuild with \
             `cargo build --release --features mpi`, which needs Open MPI: apt-get install \
             libopenmpi-dev openmpi-bin libclang-dev)"
        )
    }

    /// The rank collectives, when distributed.
    pub fn comm(&self) -> Option<Arc<dyn DistComm>> {
        self.comm.clone()
    }

    /// This process's rank (0 when not distributed).
    pub fn rank(&self) -> usize {
        self.comm.as_ref().map_or(0, |c| c.rank())
    }

    /// Ranks in the job (1 when not distributed).
    pub fn size(&self) -> usize {
        self.comm.as_ref().map_or(1, |c| c.size())
    }

    /// Whether this process prints results (rank 0).
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Ends a distributed job on this rank's error: the error is printed naming the rank and
    /// every rank is ended at once (MPI_Abort), so none waits for this one until its timeout.
    /// A single process just returns the error.
    pub fn fail(&self, e: anyhow::Error) -> anyhow::Error {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = &self.mpi
            && self.size() > 1
        {
            eprintln!("error: rank {} of {}: {e:#}", self.rank(), self.size());
            mpi.abort(2);
        }
        e
    }

    /// `result`, with [`Job::fail`] applied to an error.
    ///
    /// # Errors
    /// `result`'s.
    pub fn finish<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        result.map_err(|e| self.fail(e))
    }
}

/// What every rank must agree on: the command line and the model file (its size and first
/// 4 MiB: the GGUF header, metadata and tensor table of any usual file).
pub fn fingerprint(model: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut out: Vec<u8> = std::env::args()
        .skip(1)
        .flat_map(|a| a.into_bytes().into_iter().chain([0]))
        .collect();
    if let Some(path) = model {
        let mut f = std::fs::File::open(path)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
        let len = f.metadata()?.len();
        out.extend(len.to_le_bytes());
        let mut head = Vec::new();
        f.by_ref().take(4 << 20).read_to_end(&mut head)?;
        out.extend(tessera_core::comm::fnv1a(&head).to_le_bytes());
    }
    Ok(out)
}

/// Resident memory of this process: (all, anonymous) bytes from `/proc/self/status` (the
/// anonymous part is what the weights' slices and compute memory take; the rest is mapped
/// files such as the model, counted while their pages are cached).
pub fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((kib("VmRSS:")? * 1024, kib("RssAnon:")? * 1024))
}
