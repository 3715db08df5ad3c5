//! Embeds HIP kernel code objects built ahead of time when `hipcc` is present (see
//! `tessera_toolchain::hip`): writes `$OUT_DIR/hip_aot.rs` with the targets and one offload bundle
//! per kernel source, or empty lists (hipRTC then compiles at run time).

use std::path::PathBuf;
use tessera_toolchain::{discover, hip};

fn main() {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    // tessera-kernels' build script says where it lives (its `links` metadata).
    let kernels =
        PathBuf::from(std::env::var("DEP_TESSERA_KERNELS_ROOT").expect("tessera-kernels sets it"));
    let cuda_dir = kernels.join("gpu");
    let compat = kernels.join("hip/compat.h");
    println!("cargo:rerun-if-changed={}", cuda_dir.display());
    println!("cargo:rerun-if-changed={}", compat.display());
    println!("cargo:rerun-if-env-changed={}", hip::AOT_ENV);
    println!("cargo:rerun-if-env-changed=HIPCC");
    let mut archs = hip::archs();
    let mut bundles = Vec::new();
    if let (Some(hipcc), false) = (hip::find_hipcc(), archs.is_empty()) {
        let mut sources: Vec<PathBuf> = std::fs::read_dir(&cuda_dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        sources.retain(|p| p.extension().is_some_and(|e| e == "cu"));
        sources.sort();
        // One hipcc per source, all at once (each is single-threaded).
        let results: Vec<(String, PathBuf, Result<(), String>)> = std::thread::scope(|scope| {
            let jobs: Vec<_> = sources
                .iter()
                .map(|src| {
                    let name = src
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let out = out_dir.join(name.replace(".cu", ".co"));
                    let (hipcc, compat, cuda_dir, archs) = (&hipcc, &compat, &cuda_dir, &archs);
                    scope.spawn(move || {
                        let r = hip::genco(hipcc, src, compat, cuda_dir, archs, &out);
                        (name, out, r)
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| (String::new(), PathBuf::new(), Err("panicked".into())))
                })
                .collect()
        });
        for (name, out, r) in results {
            match r {
                Ok(()) => bundles.push((name, out)),
                Err(e) => {
                    discover::warn(&format!(
                        "tessera-hip: ahead-of-time kernels off, hipRTC will compile at run time: {e}"
                    ));
                    bundles.clear();
                    break;
                }
            }
        }
    }
    if bundles.is_empty() {
        archs.clear();
    }
    let rs = hip::embed_rs(&archs, &bundles);
    std::fs::write(out_dir.join("hip_aot.rs"), rs).expect("OUT_DIR is writable");
}
