//! A plugin whose device table is smaller than the ABI says (an older, truncated table).

use tessera_plugin::abi::{RawDeviceTable, RawRegistry};

fn truncate_device_table(t: &mut RawRegistry) {
    // SAFETY: the real table lives for the process; the copy is leaked likewise.
    let mut dev: RawDeviceTable = unsafe { *t.device };
    dev.header.struct_size = 24;
    t.device = Box::leak(Box::new(dev));
}

/// The entry point, pointing to a device table that claims 24 bytes.
///
/// # Safety
/// As every entry point: `host` is null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_backend_init(
    host: *const tessera_plugin::abi::RawHost,
) -> *const RawRegistry {
    // SAFETY: forwarded from this function's contract.
    unsafe { tessera_test_plugins::edited_table(host, truncate_device_table) }
}
