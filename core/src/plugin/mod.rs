//! The C boundary of Tessera: functions found by name through [`crate::Registry::proc_address`],
//! and (with the plugin issue) whole backends loaded from shared libraries.
//!
//! This is one of the two places in core allowed to use `unsafe`: turning an address back into a
//! function is only sound for the exact signature its name documents, so callers go through the
//! typed wrappers here and never transmute themselves.

mod comm;

pub use comm::{
    COMM_ALLREDUCE, COMM_FREE, COMM_INIT, CommAllReduceFn, CommApi, CommFreeFn, CommInitFn,
    CommOutcome, RawCommSlice, VendorComm,
};
