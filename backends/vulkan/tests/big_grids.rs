//! MUL_MAT / MUL_MAT_ID launches whose grids exceed lavapipe's maxComputeWorkGroupCount (65535),
//! so the runtime splits them with vkCmdDispatchBase: the kernels must index by the global
//! workgroup id and recover CUDA's gridDim. (CI also runs them with `TESSERA_VULKAN_GEOMETRY=plan`,
//! where the GEMV's grid is the planned one.)
use tessera_core::{BackendOptions, DType};
use tessera_tests::cases::{Built, Init};
use tessera_tests::{Case, Status, Tolerance, format_line, run_case};

fn run(case: Case) {
    let devs = match tessera_vulkan::registry().devices() {
        Ok(d) if !d.is_empty() => d,
        _ => {
            eprintln!("no Vulkan device: skipped");
            return;
        }
    };
    let dev = &devs[0];
    let mut b = dev.init_backend(&BackendOptions::default()).unwrap();
    let o = run_case(dev.as_ref(), b.as_mut(), &case);
    eprintln!("{}", format_line(&o));
    assert!(
        matches!(o.status, Status::Pass { .. }),
        "{}",
        format_line(&o)
    );
}

#[test]
fn gemv_over_65535_blocks() {
    // m = 270000 rows: ceil(m / 4) = 67500 blocks as planned (split; lavapipe's own geometry
    // takes 64 rows per workgroup, 4219 blocks: `TESSERA_VULKAN_GEOMETRY=plan` keeps the split).
    run(Case::new(
        "MUL_MAT",
        "big gemv f16",
        Tolerance::Nmse(5e-4),
        |ctx| {
            let w = ctx.new_tensor(DType::F16, [32, 270_000])?;
            let x = ctx.new_tensor(DType::F32, [32, 1])?;
            Ok(Built::out(ctx.mul_mat(w, x)?))
        },
    ));
}

#[test]
fn mul_mat_id_over_65535_blocks() {
    // ceil(2880 / 4) * 4 slots * 40 tokens = 115200 work blocks.
    run(Case::new(
        "MUL_MAT_ID",
        "big mmid",
        Tolerance::Nmse(5e-4),
        |ctx| {
            let w = ctx.new_tensor(DType::Q8_0, [32, 2880, 8])?;
            let x = ctx.new_tensor(DType::F32, [32, 1, 40])?;
            let ids = ctx.new_tensor(DType::I32, [4, 40])?;
            let y = ctx.mul_mat_id(w, x, ids)?;
            Ok(Built::out(y).init(ids, Init::DistinctIds { n: 8 }))
        },
    ));
}
