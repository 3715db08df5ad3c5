//! Builds the host shim (shim/tessera_sycl_shim.cpp) against the SYCL runtime when one is found,
//! and tells the crate where it is (`TESSERA_SYCL_SHIM_BUILT`, `TESSERA_SYCL_ROOT_BUILT`) or why
//! there is none (`TESSERA_SYCL_MISSING`). The crate builds either way; without a shim its
//! registry has no devices and gives that reason.

use std::path::PathBuf;
use tessera_toolchain::{discover, sycl};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let source = manifest.join("shim/tessera_sycl_shim.cpp");
    println!("cargo:rerun-if-changed={}", source.display());
    let (shim, root, missing) = match sycl::find_runtime(&manifest) {
        Some(rt) => match sycl::build_shim(&rt, &source, &out_dir, "tessera_sycl_shim") {
            Ok(path) => (
                path.display().to_string(),
                rt.root.display().to_string(),
                String::new(),
            ),
            Err(e) => {
                discover::warn(&format!("tessera-sycl: the SYCL shim did not build: {e}"));
                (String::new(), rt.root.display().to_string(), e)
            }
        },
        None => {
            let why = sycl::missing_explanation(&manifest);
            discover::warn(&why);
            (String::new(), String::new(), why)
        }
    };
    println!("cargo:rustc-env=TESSERA_SYCL_SHIM_BUILT={shim}");
    println!("cargo:rustc-env=TESSERA_SYCL_ROOT_BUILT={root}");
    println!(
        "cargo:rustc-env=TESSERA_SYCL_MISSING={}",
        missing.replace('\n', " ")
    );
}
