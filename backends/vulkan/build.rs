//! Embeds the committed SPIR-V kernels (`kernels/vulkan/spv/*.spv` of tessera-kernels) as a table generated into
//! `OUT_DIR/spirv.rs`: `(kernel name, bytes)`, sorted by name. Kernels not ported yet are simply
//! absent; the runtime reports them as such.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    // tessera-kernels' build script says where it lives (its `links` metadata).
    let kernels = PathBuf::from(
        std::env::var_os("DEP_TESSERA_KERNELS_ROOT").expect("tessera-kernels sets it"),
    );
    let dir = kernels.join("vulkan/spv");
    // Cargo scans a watched folder recursively; a watched path that does not exist would rerun
    // this script (and rebuild the crate) on every build, so `spv/` is watched through its parent.
    println!(
        "cargo:rerun-if-changed={}",
        kernels.join("vulkan").display()
    );
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "spv"))
                .filter_map(|p| {
                    let stem = p.file_stem()?.to_str()?.to_string();
                    Some((stem, p.canonicalize().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    let mut out = String::from(
        "/// Committed SPIR-V kernels as `(kernel name, bytes)`, sorted by name.\npub static SPIRV: &[(&str, &[u8])] = &[\n",
    );
    for (name, path) in &found {
        writeln!(
            out,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .expect("writing to a String");
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it")).join("spirv.rs");
    std::fs::write(dest, out).expect("OUT_DIR is writable");
}
