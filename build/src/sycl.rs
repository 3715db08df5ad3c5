//! Finding a SYCL runtime (DPC++'s `libsycl` and headers) and building the SYCL backend's host
//! shim against it.

use crate::discover;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A SYCL runtime: `root/include/sycl/sycl.hpp` and `root/lib/libsycl.so`.
#[derive(Debug, Clone)]
pub struct SyclRuntime {
    /// The prefix holding `include/` and `lib/` (a venv with the `dpcpp-cpp-rt` wheel, or a
    /// oneAPI compiler directory).
    pub root: PathBuf,
}

impl SyclRuntime {
    /// Whether `root` holds the headers and the library.
    pub fn at(root: &Path) -> Option<SyclRuntime> {
        let ok =
            root.join("include/sycl/sycl.hpp").is_file() && root.join("lib/libsycl.so").exists();
        ok.then(|| SyclRuntime {
            root: root.to_path_buf(),
        })
    }

    /// The OpenCL CPU runtime shipped with the wheel, if present (`lib/libintelocl.so`).
    pub fn opencl_cpu_runtime(&self) -> Option<PathBuf> {
        let p = self.root.join("lib/libintelocl.so");
        p.exists().then_some(p)
    }
}

/// Where to look, in order: `SYCL_ROOT`, then `.venv-sycl` and `.venv` in `start` and its
/// ancestors, then `/opt/intel/oneapi/compiler/latest`.
pub fn candidates(start: &Path) -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(root) = discover::env_var("SYCL_ROOT") {
        c.push(PathBuf::from(root));
    }
    for dir in start.ancestors() {
        for venv in [".venv-sycl", ".venv"] {
            let v = dir.join(venv);
            if v.is_dir() {
                c.push(v);
            }
        }
    }
    c.push(PathBuf::from("/opt/intel/oneapi/compiler/latest"));
    c
}

/// The first runtime among [`candidates`].
pub fn find_runtime(start: &Path) -> Option<SyclRuntime> {
    candidates(start).iter().find_map(|c| SyclRuntime::at(c))
}

/// What to tell a user whose build found no runtime.
pub fn missing_explanation(start: &Path) -> String {
    let looked: Vec<String> = candidates(start)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    format!(
        "tessera-sycl: no SYCL runtime found, so the SYCL backend will report no devices.\n\
         Looked for include/sycl/sycl.hpp and lib/libsycl.so in: {}.\n\
         Install one with `python3 -m venv .venv-sycl && .venv-sycl/bin/pip install \
         dpcpp-cpp-rt==2026.2.0` (or set SYCL_ROOT) and rebuild.",
        looked.join(", ")
    )
}

/// Compiles `source` (a host-only C++ file) into the shared library `out_dir/lib{name}.so`
/// linked to the runtime's `libsycl` (with an rpath to it), using the C++ compiler the `cc` crate
/// picks. Returns the library's path or the compiler's output.
pub fn build_shim(
    rt: &SyclRuntime,
    source: &Path,
    out_dir: &Path,
    name: &str,
) -> Result<PathBuf, String> {
    let out = out_dir.join(format!("lib{name}.so"));
    let compiler = cc::Build::new()
        .cpp(true)
        .opt_level(2)
        .cargo_metadata(false)
        .try_get_compiler()
        .map_err(|e| format!("no C++ compiler: {e}"))?;
    let lib = rt.root.join("lib");
    let mut cmd: Command = compiler.to_command();
    cmd.args(["-std=c++17", "-fPIC", "-shared", "-Wall", "-Wextra"])
        .arg("-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING=1")
        .arg("-I")
        .arg(rt.root.join("include"))
        .arg(source)
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", lib.display()))
        .arg("-lsycl")
        .arg(format!("-Wl,-rpath,{}", lib.display()));
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run the C++ compiler: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "compiling {} failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(out)
}
