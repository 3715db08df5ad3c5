//! NCCL as a `libloading` table (`libnccl.so.2`, or RCCL's `librccl.so.1`, which exports the same
//! C API: the HIP backend loads this same table from RCCL with [`Nccl::load_named`]). [`Nccl::load`]
//! finds NCCL through `TESSERA_NCCL_PATH` (a file or a directory), the loader's search path, or
//! the `nvidia-nccl-cu12` wheel of the active or nearest `.venv`.

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use tessera_core::{Error, Result};

/// Environment variable naming the NCCL library (or its directory).
pub const NCCL_PATH_ENV: &str = "TESSERA_NCCL_PATH";

/// `ncclFloat32`.
pub const NCCL_FLOAT32: c_int = 7;
/// `ncclBfloat16` (NCCL ≥ 2.10).
pub const NCCL_BFLOAT16: c_int = 9;
/// `ncclSum`.
pub const NCCL_SUM: c_int = 0;

type Comm = *mut c_void;
type Status = c_int;

struct Fns {
    version: unsafe extern "C" fn(*mut c_int) -> Status,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Status,
    destroy: unsafe extern "C" fn(Comm) -> Status,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Status,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
    group_start: unsafe extern "C" fn() -> Status,
    group_end: unsafe extern "C" fn() -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// `ncclUniqueId`: the job id rank 0 makes and every process joins with.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// A loaded NCCL library.
pub struct Nccl {
    fns: Fns,
    backend: &'static str,
    path: PathBuf,
    /// Never unloaded: `ncclGetUniqueId` starts a bootstrap thread, and communicators start proxy
    /// threads, that outlive every handle of ours. Unloading the library under them crashed the
    /// process at exit (the toolchain test on an H200, NCCL 2.28.3).
    _lib: std::mem::ManuallyDrop<libloading::Library>,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("path", &self.path).finish()
    }
}

impl Nccl {
    /// Loads NCCL from the first candidate that works (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unavailable`] naming the variable to set when no candidate loads.
    pub fn load() -> Result<Nccl> {
        Nccl::load_named(
            "cuda",
            NCCL_PATH_ENV,
            &["libnccl.so.2", "libnccl.so", "librccl.so.1"],
            &["nccl/lib", "cu13/lib"],
        )
    }

    /// Loads the NCCL C API from the first of `names` found through `env`, the loader's path or
    /// the venv wheel directories `wheel_dirs` (see [`super::library_candidates`]); errors name
    /// `backend`. RCCL: `Nccl::load_named("hip", "TESSERA_RCCL_PATH", &["librccl.so.1"], &[])`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] naming `env` when no candidate loads or one lacks an entry point.
    pub fn load_named(
        backend: &'static str,
        env: &str,
        names: &[&str],
        wheel_dirs: &[&str],
    ) -> Result<Nccl> {
        let candidates = super::library_candidates(env, names, wheel_dirs);
        let (lib, path) = super::open_first(&candidates).map_err(|e| Error::Unavailable {
            backend: backend.into(),
            reason: format!("{} not found (set {env}): {e}", names.join(" / ")),
        })?;
        Nccl::from_library(lib, path, backend)
    }

    /// Loads NCCL from `path`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the file does not load or lacks an entry point.
    pub fn load_from(path: &Path) -> Result<Nccl> {
        let (lib, path) =
            super::open_first(&[path.to_path_buf()]).map_err(|e| Error::Unavailable {
                backend: "cuda".into(),
                reason: format!("NCCL: {e}"),
            })?;
        Nccl::from_library(lib, path, "cuda")
    }

    fn from_library(
        lib: libloading::Library,
        path: PathBuf,
        backend: &'static str,
    ) -> Result<Nccl> {
        let missing = |name: &str, e: libloading::Error| Error::Unavailable {
            backend: backend.into(),
            reason: format!("{}: missing {name}: {e}", path.display()),
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is NCCL's documented C entry point of this name, stored in a
                // field of exactly its C signature (nccl.h; handles and streams as pointers).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| missing($name, e))?
            };
        }
        let fns = Fns {
            version: sym!("ncclGetVersion"),
            init_all: sym!("ncclCommInitAll"),
            destroy: sym!("ncclCommDestroy"),
            all_reduce: sym!("ncclAllReduce"),
            get_unique_id: sym!("ncclGetUniqueId"),
            init_rank: sym!("ncclCommInitRank"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            error_string: sym!("ncclGetErrorString"),
        };
        Ok(Nccl {
            fns,
            backend,
            path,
            _lib: std::mem::ManuallyDrop::new(lib),
        })
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check(&self, call: &str, rc: Status) -> Result<()> {
        // SAFETY: ncclGetErrorString returns a static C string for any code.
        unsafe { super::check_status(self.backend, call, rc, self.fns.error_string) }
    }

    /// NCCL's version code (`major * 10000 + minor * 100 + patch`, e.g. 22703 for 2.27.3).
    ///
    /// # Errors
    /// NCCL's status as [`Error::Driver`].
    pub fn version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer; needs no GPU.
        self.check("ncclGetVersion", unsafe { (self.fns.version)(&mut v) })?;
        Ok(v)
    }

    /// One communicator per GPU ordinal in `devices` (single process, `ncclCommInitAll`).
    pub fn init_all(self: &std::sync::Arc<Nccl>, devices: &[i32]) -> Result<Vec<NcclComm>> {
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device; `devices` holds that many ordinals.
        let rc = unsafe {
            (self.fns.init_all)(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr())
        };
        self.check("ncclCommInitAll", rc)?;
        Ok(comms
            .into_iter()
            .map(|raw| NcclComm {
                nccl: self.clone(),
                raw,
            })
            .collect())
    }

    /// A new job id for [`Nccl::init_rank`] (on rank 0; the others receive it).
    ///
    /// # Errors
    /// NCCL's status as [`Error::Driver`] (e.g. no usable network interface).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId([0; UNIQUE_ID_BYTES]);
        // SAFETY: valid out-pointer to a struct of NCCL's layout; needs no GPU.
        self.check("ncclGetUniqueId", unsafe {
            (self.fns.get_unique_id)(&mut id)
        })?;
        Ok(id)
    }

    /// The communicator of global rank `rank` of `n_ranks` in job `id`, on the calling thread's
    /// current GPU (collective across the job: every rank calls it, within one
    /// [`Nccl::group`] when a process joins several GPUs).
    ///
    /// # Errors
    /// NCCL's status as [`Error::Driver`].
    pub fn init_rank(
        self: &std::sync::Arc<Nccl>,
        n_ranks: usize,
        id: UniqueId,
        rank: usize,
    ) -> Result<NcclComm> {
        let (Ok(n), Ok(r)) = (c_int::try_from(n_ranks), c_int::try_from(rank)) else {
            return Err(Error::InvalidArgument(format!(
                "NCCL rank {rank} of {n_ranks} does not fit a C int"
            )));
        };
        let mut raw: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the id is passed by value as NCCL's struct.
        self.check("ncclCommInitRank", unsafe {
            (self.fns.init_rank)(&mut raw, n, id, r)
        })?;
        Ok(NcclComm {
            nccl: self.clone(),
            raw,
        })
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd` (the end runs even if `f` fails).
    pub fn group<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // SAFETY: no arguments; groups nest.
        self.check("ncclGroupStart", unsafe { (self.fns.group_start)() })?;
        let out = f();
        // SAFETY: balances the start above.
        let end = self.check("ncclGroupEnd", unsafe { (self.fns.group_end)() });
        let out = out?;
        end?;
        Ok(out)
    }
}

/// A communicator for one GPU, destroyed on drop.
#[derive(Debug)]
pub struct NcclComm {
    nccl: std::sync::Arc<Nccl>,
    raw: Comm,
}

// SAFETY: a communicator may be used from any thread (one call at a time: callers hold `&mut`
// through the comm context).
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Enqueues an in-place sum of `count` values of `dtype` at device address `ptr` on `stream`.
    ///
    /// # Safety
    /// `ptr` must address `count` values of `dtype` on this communicator's GPU, alive until the
    /// stream has run the reduction; `stream` must be a live stream of that GPU.
    pub unsafe fn all_reduce_in_place(
        &self,
        ptr: u64,
        count: usize,
        dtype: c_int,
        stream: *mut c_void,
    ) -> Result<()> {
        let p = ptr as usize as *mut c_void;
        // SAFETY: the caller's contract (see # Safety); in-place: send and receive are the same.
        let rc =
            unsafe { (self.nccl.fns.all_reduce)(p, p, count, dtype, NCCL_SUM, self.raw, stream) };
        self.nccl.check("ncclAllReduce", rc)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created by ncclCommInitAll or ncclCommInitRank, destroyed once.
        unsafe { (self.nccl.fns.destroy)(self.raw) };
    }
}
