//! The op conformance suite on every CUDA device (`tessera_tests::harness`): one trial per
//! (device × case) against the f64 reference. Without a GPU the trials are ignored with the
//! reason in their names (`[skipped: libcuda.so.1 not found ...] cuda/...`);
//! `TESSERA_REQUIRE=cuda` makes that a failure. On a GPU, also runs every case on `cuda:2`'s
//! second device (a second GPU, or the same GPU shared).

fn main() {
    tessera_tests::harness::run_device_suite(
        "cuda",
        tessera_cuda::registry(),
        Some("cuda:2"),
        Some(&tessera_tests::GPU_KERNEL_DTYPES),
    );
}
