//! Real execution of a transformer with candle (CPU, or CUDA with the `cuda` feature).
//!
//! [`model`] is the transformer (one architecture, any layer range); [`kv`] its K/V cache,
//! whose token ranges can be exported and imported;
//! [`weights`] loads it from safetensors or generates it from a seed. Nothing outside this
//! module and [`crate::backend`] sees a tensor (DESIGN contract 3).

pub mod kv;
pub mod model;
pub mod weights;

pub use kv::{HostKv, KvCache, KvSlice};
pub use model::{ShardInput, ShardModel, ShardOutput, TransformerConfig};
pub use weights::WeightSource;

/// What can go wrong while executing a model.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("invalid cache: {0}")]
    Cache(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// The device to run on: CUDA device 0 when built with `cuda` and one is present, else the CPU.
pub fn default_device() -> candle_core::Device {
    #[cfg(feature = "cuda")]
    if let Ok(dev) = candle_core::Device::new_cuda(0) {
        return dev;
    }
    candle_core::Device::Cpu
}
