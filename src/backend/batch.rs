//! The model backend of serving instances: one iteration of continuous batching, and the
//! K/V that a prefix store moves.
//!
//! A serving instance decides what its next iteration computes (prefill chunks and decode
//! steps of the sequences in its batch, summarised as a [`BatchShape`] and listed as
//! [`Member`]s) and asks its [`BatchBackend`] for the iteration; it then occupies its device
//! with [`crate::actor::Work::Compute`] for the duration the backend gives. Exactly as a
//! pipeline shard asks its [`super::ModelBackend`]: the host never prices model work (DESIGN
//! contract 3).
//!
//! Two backends:
//! - [`SimBatchBackend`] prices the iteration with the analytic roofline [`CostModel`] of
//!   the instance's GPU (or tensor-parallel group), or with a measured profile. It knows no
//!   values: it needs no members, samples nothing and moves no K/V.
//! - [`super::PagedCandleBackend`] runs the iteration for real on candle, with the K/V of
//!   every sequence in a paged cache of the instance's blocks (so it returns zero: the work
//!   has already taken its wall time), and moves real K/V to and from a live prefix store.

use std::ops::Range;
use std::sync::Arc;

use super::BackendError;
use crate::exec::HostKv;
use crate::model::batch_profile::BatchFit;
use crate::model::cost::{BatchShape, CostModel};
use crate::units::Nanos;
use crate::workload::ReqId;

/// A KV block of an instance (the serving system's block ids).
pub type BlockId = u32;
/// A prefix store's tensor id.
pub type TensorId = u64;
/// The K/V of tensors, by id, as an instance writes them to a store.
pub type KvData = Vec<(TensorId, Arc<HostKv>)>;

/// Where a real backend reads a store's tensors from: the store servers' memory, read
/// one-sided (the serving system's live store memory implements it).
pub trait KvSource: Send + Sync {
    /// Tensor `id` from node `node`'s host memory (or its SSD tier when `ssd`), if there.
    fn read(&self, node: u32, ssd: bool, id: TensorId) -> Option<Arc<HostKv>>;
}

/// One sequence of an iteration, as a real backend needs it.
#[derive(Debug)]
pub struct Member<'a> {
    pub req: ReqId,
    /// Its block table: block `j` holds positions `j x block_size ..`.
    pub blocks: &'a [BlockId],
    /// Tokens whose K/V its blocks hold.
    pub computed: u32,
    /// Tokens to compute now: positions `computed .. computed + n` of its prompt followed by
    /// the tokens it generated.
    pub n: u32,
    /// The tokens it generated so far.
    pub generated: &'a [u32],
    /// Set by the backend when the iteration computes its last known token: the next token.
    pub sampled: Option<Sampled>,
}

/// A sampled (greedy) token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// The logits it was chosen from, for a sequence's first token only (to compare runs).
    pub logits: Option<Vec<f32>>,
}

/// One tensor of a store load: where it is read from and which positions it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadItem {
    pub node: u32,
    /// From its SSD tier (else from host memory).
    pub ssd: bool,
    pub id: TensorId,
    /// Its first position (its index in the chain times the tensor's tokens).
    pub start: u32,
}

/// Runs or prices one iteration of a serving instance's batch.
pub trait BatchBackend: Send {
    /// Runs the iteration `batch`; returns its modelled duration (zero for a backend that ran
    /// it for real). A real backend computes `members` (a simulated one gets none) and sets
    /// the token each samples.
    fn iteration(
        &mut self,
        batch: &BatchShape,
        members: &mut [Member<'_>],
    ) -> Result<Nanos, BackendError>;

    /// What the iteration `batch` would take under the backend's model, without running it
    /// (an instance weighing a load against recomputing); `None` for a backend without a
    /// model (a real one: its time is the wall clock's).
    fn estimate(&self, _batch: &BatchShape) -> Option<Nanos> {
        None
    }

    /// Whether it computes real tensors: the instance then lists the members of each
    /// iteration, keeps the sampled tokens and moves real K/V to and from the store.
    fn real(&self) -> bool {
        false
    }

    /// The K/V of whole tensors `(id, first position)` of `tensor_tokens` positions each,
    /// read from the blocks `blocks` of a sequence, to write to a store.
    fn export(
        &mut self,
        _blocks: &[BlockId],
        _tensors: &[(TensorId, u32)],
        _tensor_tokens: u32,
    ) -> Result<KvData, BackendError> {
        Ok(Vec::new())
    }

    /// Reads the tensors `items` of a store load into the blocks `blocks` of a sequence,
    /// writing only positions within `within` (what the GPU cache does not already hold,
    /// and not the last prompt token, which is computed). An error if a tensor is not there.
    fn load(
        &mut self,
        _blocks: &[BlockId],
        _items: &[LoadItem],
        _tensor_tokens: u32,
        _within: Range<u32>,
    ) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The simulated batch backend: the roofline duration of the cost model, or a measured
/// profile's.
///
/// Its clones share one pricing: the instances of a simulation price their iterations the
/// same way, and at cluster scale a copy of the cost model per instance would be one more
/// cold read (several cache lines) at every iteration of every instance, where a shared one
/// stays in cache.
#[derive(Clone, Debug)]
pub struct SimBatchBackend {
    pricing: Arc<Pricing>,
}

#[derive(Clone, Debug)]
enum Pricing {
    Roofline(CostModel),
    Profiled { fit: BatchFit, overhead: Nanos },
}

impl SimBatchBackend {
    pub fn new(cost: CostModel) -> SimBatchBackend {
        SimBatchBackend {
            pricing: Arc::new(Pricing::Roofline(cost)),
        }
    }

    /// Prices iterations with a measured profile's fitted model (see
    /// [`crate::model::batch_profile`]) plus `overhead` per iteration.
    pub fn profiled(fit: BatchFit, overhead: Nanos) -> SimBatchBackend {
        SimBatchBackend {
            pricing: Arc::new(Pricing::Profiled { fit, overhead }),
        }
    }

    /// The modelled time of `batch`.
    pub fn price(&self, batch: &BatchShape) -> Nanos {
        match &*self.pricing {
            Pricing::Roofline(cost) => cost.iteration(batch),
            Pricing::Profiled { .. } if batch.is_empty() => Nanos::ZERO,
            Pricing::Profiled { fit, overhead } => fit.iteration(batch) + *overhead,
        }
    }
}

impl BatchBackend for SimBatchBackend {
    fn iteration(
        &mut self,
        batch: &BatchShape,
        _members: &mut [Member<'_>],
    ) -> Result<Nanos, BackendError> {
        Ok(self.price(batch))
    }

    fn estimate(&self, batch: &BatchShape) -> Option<Nanos> {
        Some(self.price(batch))
    }
}
