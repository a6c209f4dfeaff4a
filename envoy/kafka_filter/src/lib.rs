//! keg's Kafka network filter, loaded by Envoy's `envoy.filters.network.dynamic_modules`.
//!
//! - [`core`]: the protocol core, no Envoy types and no I/O (bytes in, bytes out).
//! - [`config`]: the module's JSON `filter_config` and the process-wide route tables.
//! - `ffi`: the event hooks Envoy calls, a thin adapter that catches every panic.
//! - [`abi`]: the hand-written part of Envoy's C ABI the module uses, pinned to a version.

pub mod abi;
pub mod config;
pub mod core;
pub mod handoff;
pub mod metrics;
mod ffi;
