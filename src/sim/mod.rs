//! The deterministic simulator: the event kernel and the host that runs actors on it.

pub mod fault;
pub mod host;
pub mod kernel;
mod parallel;
pub mod prefetch;
pub mod progress;

pub use parallel::{parallel_map, parallel_map_in};
