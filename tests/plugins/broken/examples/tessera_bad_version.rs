//! A plugin whose registry table claims ABI version 999.

/// The entry point, with a wrong version in the registry table.
///
/// # Safety
/// As every entry point: `host` is null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_backend_init(
    host: *const tessera_plugin::abi::RawHost,
) -> *const tessera_plugin::abi::RawRegistry {
    // SAFETY: forwarded from this function's contract.
    unsafe { tessera_test_plugins::edited_table(host, |t| t.header.abi_version = 999) }
}
