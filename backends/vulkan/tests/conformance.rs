//! The op conformance suite on every Vulkan device (`tessera_tests::harness`): `VK0` (lavapipe
//! on CI) and the second device of `vulkan:2`, one trial per (device × case) against the f64
//! reference. Ops whose kernels have no SPIR-V yet are declined by the device and reported as
//! unsupported, not failed. Without a loader or device the trials are ignored with the reason in
//! their names; `TESSERA_REQUIRE=vulkan` (set by CI) makes that a failure.

fn main() {
    tessera_tests::harness::run_device_suite_declining(
        "vulkan",
        tessera_vulkan::registry(),
        Some("vulkan:2"),
        Some(&tessera_tests::GPU_KERNEL_DTYPES),
    );
}
