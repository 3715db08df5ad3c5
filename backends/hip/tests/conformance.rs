//! The op conformance suite on every HIP device (`tessera_tests::harness`): one trial per
//! (device × case) against the f64 reference. Without a GPU the trials are ignored with the
//! reason in their names (`[skipped: no AMD GPU ...] hip/...`);
//! `TESSERA_REQUIRE=hip` makes that a failure. On a GPU, also runs every case on `hip:2`'s
//! second device (a second GPU, or the same GPU shared).

fn main() {
    tessera_tests::harness::run_device_suite(
        "hip",
        tessera_hip::registry(),
        Some("hip:2"),
        Some(&tessera_tests::GPU_KERNEL_DTYPES),
    );
}
