//! The model backend of serving instances: one iteration of continuous batching.
//!
//! A serving instance decides what its next iteration computes (prefill chunks and decode
//! steps of the sequences in its batch, summarised as a [`BatchShape`]) and asks its
//! [`BatchBackend`] for the iteration; it then occupies its device with
//! [`crate::actor::Work::Compute`] for the duration the backend gives. Exactly as a pipeline
//! shard asks its [`super::ModelBackend`]: the host never prices model work (DESIGN contract 3).
//!
//! [`SimBatchBackend`] prices the iteration with the analytic roofline [`CostModel`] of the
//! instance's GPU (or tensor-parallel group). A candle backend that runs the batch for real
//! (and so returns zero: the work has already taken its wall time) belongs to live serving.

use super::BackendError;
use crate::model::cost::{BatchShape, CostModel};
use crate::units::Nanos;

/// Runs or prices one iteration of a serving instance's batch.
pub trait BatchBackend: Send {
    /// Runs the iteration `batch`; returns its modelled duration (zero for a backend that ran
    /// it for real).
    fn iteration(&mut self, batch: &BatchShape) -> Result<Nanos, BackendError>;
}

/// The analytic batch backend: the roofline duration of the cost model.
#[derive(Clone, Debug)]
pub struct SimBatchBackend {
    cost: CostModel,
}

impl SimBatchBackend {
    pub fn new(cost: CostModel) -> SimBatchBackend {
        SimBatchBackend { cost }
    }
}

impl BatchBackend for SimBatchBackend {
    fn iteration(&mut self, batch: &BatchShape) -> Result<Nanos, BackendError> {
        Ok(self.cost.iteration(batch))
    }
}
