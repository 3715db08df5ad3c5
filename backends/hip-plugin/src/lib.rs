//! The HIP backend as a plugin: `libtessera_hip.so`, loaded with `tessera::register_plugin` or found
//! by `tessera::load_all` in `TESSERA_BACKEND_PATH` or next to the executable. It builds without
//! ROCm and loads without a GPU (the registry then has no devices and says why).
#![deny(unsafe_code)]

tessera_plugin::export_backend!(tessera_hip::registry);
