//! The model backend boundary (DESIGN contract 3): the only place that knows tensors.
//!
//! A pipeline shard asks its [`ModelBackend`] to run layers `[start, end)` on an
//! [`Activation`] whose first new token sits at position `offset`, with an optional opaque
//! [`CacheState`] of those layers holding exactly `offset` tokens. It gets back a [`Step`]: the
//! new cache state and either the output activation (for the next shard) or, from the tail
//! shard, the greedily sampled token. Shards, routes and stores move activations and cache
//! states around by size only; they never look inside.
//!
//! Two backends:
//! - [`SimBackend`] knows no values. Activations are shapes, cache states are token counts, and
//!   each step carries the duration that [`crate::model::cost::CostModel`] charges for it on the shard's GPU: the
//!   shard's layers only, with the LM head's weights and FLOPs on the tail shard alone.
//!   Embedding lookups are ignored, as in the cost model. Its "sampled" token is always 0.
//!   [`SimBackend::profiled`] charges a measured [`crate::model::profile::ShardProfile`] of the real backend
//!   instead (see [`crate::model::profile`]).
//! - [`CandleBackend`] computes real tensors with [`crate::exec::ShardModel`] and reports no modelled
//!   duration (the caller measures wall time if it wants one).

mod batch;
mod candle;
mod paged;
mod sim;

pub use batch::{
    BatchBackend, BlockId, KvData, KvSource, LoadItem, Member, Sampled, SimBatchBackend, TensorId,
};
pub use candle::CandleBackend;
pub use paged::{DeviceLock, IterationKind, KindTiming, PagedCandleBackend, Timing};
pub use sim::SimBackend;

use candle_core::Tensor;
use std::fmt;
use std::ops::Range;

use crate::exec::{ExecError, KvCache, KvSlice};
use crate::units::Nanos;

/// Bytes of one token id on the wire.
pub const TOKEN_ID_BYTES: u64 = 4;

/// What flows between shards: the prompt's token ids into the head, a hidden activation
/// `[1, n, hidden]` between shards. Opaque but for its length and size.
#[derive(Clone)]
pub struct Activation(pub(crate) ActInner);

#[derive(Clone)]
pub(crate) enum ActInner {
    Tokens(Vec<u32>),
    Shape {
        positions: usize,
        hidden: usize,
        bytes_per_element: usize,
    },
    Tensor(Tensor),
}

impl Activation {
    /// Token ids for the head shard.
    pub fn tokens(ids: Vec<u32>) -> Activation {
        Activation(ActInner::Tokens(ids))
    }

    /// The token ids, if this is the head's input.
    pub fn token_ids(&self) -> Option<&[u32]> {
        match &self.0 {
            ActInner::Tokens(ids) => Some(ids),
            _ => None,
        }
    }

    /// Number of token positions it covers.
    pub fn positions(&self) -> usize {
        match &self.0 {
            ActInner::Tokens(ids) => ids.len(),
            ActInner::Shape { positions, .. } => *positions,
            ActInner::Tensor(t) => t.dims().get(1).copied().unwrap_or(0),
        }
    }

    /// Bytes on the wire.
    pub fn bytes(&self) -> u64 {
        match &self.0 {
            ActInner::Tokens(ids) => ids.len() as u64 * TOKEN_ID_BYTES,
            ActInner::Shape {
                positions,
                hidden,
                bytes_per_element,
            } => (positions * hidden * bytes_per_element) as u64,
            ActInner::Tensor(t) => (t.elem_count() * t.dtype().size_in_bytes()) as u64,
        }
    }
}

impl fmt::Debug for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            ActInner::Tokens(_) => "tokens",
            ActInner::Shape { .. } => "shape",
            ActInner::Tensor(_) => "tensor",
        };
        write!(
            f,
            "Activation({kind}, {} positions, {} B)",
            self.positions(),
            self.bytes()
        )
    }
}

/// The cache state of one shard's layers for one session (or an exported token range of it).
/// Opaque but for its token count and size: K/V tensors for candle, a count for the sim.
#[derive(Clone)]
pub struct CacheState(pub(crate) CacheInner);

#[derive(Clone)]
pub(crate) enum CacheInner {
    Sim {
        positions: Range<usize>,
        bytes_per_token: u64,
    },
    Candle(KvCache),
    CandleSlice(KvSlice),
}

impl CacheState {
    /// Tokens held.
    pub fn tokens(&self) -> usize {
        self.positions().len()
    }

    /// The positions held: `0..tokens` for a session's cache, any range for an exported one.
    pub fn positions(&self) -> Range<usize> {
        match &self.0 {
            CacheInner::Sim { positions, .. } => positions.clone(),
            CacheInner::Candle(kv) => 0..kv.tokens(),
            CacheInner::CandleSlice(s) => s.positions(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        match &self.0 {
            CacheInner::Sim {
                positions,
                bytes_per_token,
            } => positions.len() as u64 * bytes_per_token,
            CacheInner::Candle(kv) => kv.bytes(),
            CacheInner::CandleSlice(s) => s.bytes(),
        }
    }
}

impl fmt::Debug for CacheState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheState({:?}, {} B)", self.positions(), self.bytes())
    }
}

/// What a shard's step produces besides its cache: an activation or the tail's token.
#[derive(Clone, Debug)]
pub enum StepOutput {
    Activation(Activation),
    Token {
        token: u32,
        /// The newest position's logits (real backends only).
        logits: Option<Vec<f32>>,
    },
}

/// The result of running one layer range.
#[derive(Clone, Debug)]
pub struct Step {
    pub output: StepOutput,
    pub cache: CacheState,
    /// The modelled duration (sim backend only).
    pub duration: Option<Nanos>,
}

/// What can go wrong in a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend for layers {have:?} asked to run layers {asked:?}")]
    WrongLayers {
        have: Range<usize>,
        asked: Range<usize>,
    },
    #[error("cache of {cached} tokens given for a step at offset {offset}")]
    CacheMismatch { cached: usize, offset: usize },
    #[error("a cache state from another backend")]
    ForeignCache,
    #[error("an activation from another backend or for another shard")]
    ForeignActivation,
    #[error("store: {0}")]
    Store(String),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// Runs one contiguous layer range of a model. See the module doc.
pub trait ModelBackend: Send {
    /// The layers this backend holds.
    fn layers(&self) -> Range<usize>;
    /// Layers of the whole model.
    fn total_layers(&self) -> usize;
    /// Runs `layers` on `input` (new tokens from position `offset`) with `cache` (which must
    /// hold `offset` tokens; `None` means none, and then `offset` must be 0).
    fn run(
        &mut self,
        layers: Range<usize>,
        input: Activation,
        offset: usize,
        cache: Option<CacheState>,
    ) -> Result<Step, BackendError>;
    /// The cache state of positions `positions` of `cache` (for a prefix store).
    fn export(
        &self,
        cache: &CacheState,
        positions: Range<usize>,
    ) -> Result<CacheState, BackendError>;
    /// `base` (or an empty cache) extended by an exported `part` that starts where it ends.
    fn import(
        &self,
        base: Option<CacheState>,
        part: &CacheState,
    ) -> Result<CacheState, BackendError>;

    fn is_head(&self) -> bool {
        self.layers().start == 0
    }
    fn is_tail(&self) -> bool {
        self.layers().end == self.total_layers()
    }
}

pub(crate) fn check_layers(have: &Range<usize>, asked: &Range<usize>) -> Result<(), BackendError> {
    if have != asked {
        return Err(BackendError::WrongLayers {
            have: have.clone(),
            asked: asked.clone(),
        });
    }
    Ok(())
}
