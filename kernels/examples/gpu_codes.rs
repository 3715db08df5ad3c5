//! Writes `kernels/gpu/codes.cuh` and `kernels/vulkan/codes.glsl` from the table in
//! `kernels/src/gpu/codes.rs` (the kernels' type, operation and error codes). Run it after
//! editing the table; the Vulkan shaders then need `scripts/vulkan-shaders.sh`.

use tessera_kernels::gpu::codes::{Dialect, header};

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for dialect in [Dialect::CudaC, Dialect::Glsl] {
        let path = root.join(dialect.path());
        let text = header(dialect);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            println!("{} is current", path.display());
        } else {
            std::fs::write(&path, text)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
