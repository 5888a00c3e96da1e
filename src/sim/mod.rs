//! The deterministic simulator: the event kernel and the host that runs actors on it.

pub mod host;
pub mod kernel;
mod parallel;
pub mod progress;
mod queue;

pub use parallel::{parallel_map, parallel_map_in};
