//! The SYCL backend as a plugin: `libtessera_sycl.so`, loaded with `tessera::register_plugin` or
//! found by `tessera::load_all` in `TESSERA_BACKEND_PATH` or next to the executable.
#![deny(unsafe_code)]

tessera_plugin::export_backend!(tessera_sycl::registry);
