//! The op conformance suite on every SYCL device (`tessera_tests::harness`): every case on the
//! root device (`SYCL0`, the OpenCL CPU device on CI), a different sixteenth of them on each
//! sub-device (`SYCL0.0`, `SYCL0.1`; `TESSERA_CONFORMANCE_EVERY_DEVICE=1` for all), one trial
//! per (device × case) against the f64 reference. Without a runtime the trials are ignored with
//! the reason in their names; `TESSERA_REQUIRE=sycl` (set by CI) makes that a failure.

fn main() {
    tessera_tests::harness::run_device_suite(
        "sycl",
        tessera_sycl::registry(),
        Some("sycl:2"),
        Some(&tessera_tests::GPU_KERNEL_DTYPES),
    );
}
