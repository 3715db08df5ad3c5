//! The CUDA backend as a plugin: `libtessera_cuda.so`, loaded with `tessera::register_plugin` or
//! found by `tessera::load_all` in `TESSERA_BACKEND_PATH` or next to the executable. Vendor CI
//! builds one such file per CUDA toolkit line; hosts need no CUDA at build time.
#![deny(unsafe_code)]

tessera_plugin::export_backend!(tessera_cuda::registry);
