//! The driver-facing paths that must hold on any machine: without a driver the registry has zero
//! devices, says why, and nothing panics; with one, the answers agree with each other.

use tessera_core::{DeviceRegistry, Error, Registry};
use tessera_cuda::CudaRegistry;

#[test]
fn registry_reports_devices_or_a_reason() {
    let reg = CudaRegistry::new();
    let reason = reg.reason();
    match &reason {
        Some(why) => {
            println!("CUDA unavailable: {why}");
            assert_eq!(reg.gpu_count(), 0);
            assert!(matches!(reg.probe(), Err(Error::Unavailable { .. })));
            assert!(reg.devices().is_err());
            assert!(reg.devices_with_count(2).is_err());
        }
        None => {
            assert!(reg.gpu_count() > 0);
            assert!(reg.probe().is_ok());
            assert_eq!(reg.devices().unwrap().len(), reg.gpu_count());
        }
    }
    // Registered into a device registry, the reason is what `tessera devices` prints.
    let devices = DeviceRegistry::new();
    devices.register(tessera_cuda::registry());
    let info = devices
        .backends()
        .into_iter()
        .find(|b| b.name == "cuda")
        .unwrap();
    match (&info.devices, &reason) {
        (Err(text), Some(why)) => assert!(text.contains(why.as_str()), "{text}"),
        (Ok(d), None) => assert_eq!(d.len(), reg.gpu_count()),
        (got, want) => panic!("registry says {got:?}, CudaRegistry says {want:?}"),
    }
    assert_eq!(devices.devices().len(), reg.gpu_count());
}

#[test]
fn no_driver_reason_names_libcuda() {
    // Only meaningful where the driver library is absent (the CI machine).
    let candidates = ["libcuda.so.1", "libcuda.so"];
    let present = candidates.iter().any(|c| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ldconfig -p 2>/dev/null | grep -q '{c}'"))
            .status()
            .is_ok_and(|s| s.success())
    });
    let reason = CudaRegistry::new().reason();
    if !present && let Some(why) = reason {
        assert!(
            why.contains("libcuda"),
            "reason should name the driver library: {why}"
        );
    }
}

#[test]
fn comm_trio_is_exported_by_name() {
    let api = tessera_core::comm::CommApi::from_registry(&CudaRegistry::new());
    assert!(api.is_some());
}
