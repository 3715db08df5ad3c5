//! Tells the build scripts of the crates that depend on this one where the kernel sources are
//! (`DEP_TESSERA_KERNELS_ROOT`): HIP compiles `gpu/*.cu` ahead of time and Vulkan embeds
//! `vulkan/spv/*.spv`, and both must read them from this crate wherever cargo unpacked it (a
//! workspace checkout or a published package).

fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it");
    println!("cargo::metadata=root={root}");
    println!("cargo::rerun-if-changed=build.rs");
}
