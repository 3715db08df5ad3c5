//! Ahead-of-time HIP kernels: when `hipcc` is present at build time, the HIP backend's build
//! script compiles every CUDA C kernel source through the HIP compat header into one offload
//! bundle per source holding code objects for several gfx targets (`hipcc --genco`), and embeds
//! them; without hipcc it embeds nothing and hipRTC compiles at run time.

use crate::discover;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable turning the ahead-of-time build off (`0`) or naming its targets
/// (comma-separated, e.g. `gfx90a,gfx1030`).
pub const AOT_ENV: &str = "TESSERA_HIP_AOT";

/// The targets built by default: the ones ROCm 5.2 (Debian 12) compiles. gfx1100 needs ROCm ≥ 5.5.
pub const DEFAULT_ARCHS: &[&str] = &["gfx90a", "gfx1030"];

/// `hipcc`: the `HIPCC` variable, then `PATH`, then `/opt/rocm/bin/hipcc`.
pub fn find_hipcc() -> Option<PathBuf> {
    if let Some(p) = discover::env_var("HIPCC") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("hipcc"))
        .chain([PathBuf::from("/opt/rocm/bin/hipcc")])
        .find(|p| p.is_file())
}

/// The targets to build ahead of time, or none when [`AOT_ENV`] is `0`.
pub fn archs() -> Vec<String> {
    match discover::env_var(AOT_ENV) {
        Some(v) if v == "0" => Vec::new(),
        Some(v) if !v.is_empty() => v.split(',').map(|a| a.trim().to_string()).collect(),
        _ => DEFAULT_ARCHS.iter().map(|a| a.to_string()).collect(),
    }
}

/// Compiles `source` (a CUDA C file) with `-include compat` and `-I include_dir` into an offload
/// bundle at `out` for `archs`.
///
/// # Errors
/// hipcc's output when it fails or cannot start.
pub fn genco(
    hipcc: &Path,
    source: &Path,
    compat: &Path,
    include_dir: &Path,
    archs: &[String],
    out: &Path,
) -> Result<(), String> {
    let mut cmd = Command::new(hipcc);
    cmd.args(["--genco", "-x", "hip", "-O3", "-std=c++17"]);
    for a in archs {
        cmd.arg(format!("--offload-arch={a}"));
    }
    cmd.arg("-include").arg(compat).arg("-I").arg(include_dir);
    cmd.arg(source).arg("-o").arg(out);
    // hipcc's device compile leaves an empty `<source>-<random>` folder in TMPDIR on every run;
    // give it a scratch folder beside the output and remove that, so builds do not fill /tmp.
    let scratch = out.with_extension("hipcc-tmp");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    cmd.env("TMPDIR", &scratch);
    let output = cmd.output();
    let _ = std::fs::remove_dir_all(&scratch);
    let output = output.map_err(|e| format!("{}: {e}", hipcc.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} on {} failed: {}",
            hipcc.display(),
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The Rust source that embeds `bundles` (`(source file name, bundle path)`) built for `archs`:
/// `ARCHS: &[&str]` and `BUNDLES: &[(&str, &[u8])]`.
pub fn embed_rs(archs: &[String], bundles: &[(String, PathBuf)]) -> String {
    let mut s =
        String::from("/// gfx targets of the embedded bundles.\npub const ARCHS: &[&str] = &[");
    for a in archs {
        let _ = write!(s, "{a:?}, ");
    }
    s.push_str(
        "];\n/// `(source file, offload bundle)`.\npub const BUNDLES: &[(&str, &[u8])] = &[\n",
    );
    for (name, path) in bundles {
        let _ = writeln!(
            s,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    s.push_str("];\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embed_rs_lists_bundles() {
        let s = embed_rs(
            &["gfx90a".into()],
            &[("norm.cu".into(), PathBuf::from("/o/norm.co"))],
        );
        assert!(s.contains("\"gfx90a\", "));
        assert!(s.contains("(\"norm.cu\", include_bytes!(\"/o/norm.co\")),"));
        assert!(embed_rs(&[], &[]).contains("ARCHS: &[&str] = &[];"));
    }
}
