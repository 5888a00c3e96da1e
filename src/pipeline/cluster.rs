//! Pipeline routes across processes ([`crate::live::cluster`]): the head runs in the
//! coordinator (`meshsim run --live` with `[live] nodes`), shard `i` on node `1 + i mod N`
//! of the `N` nodes named, and nodes beyond the shards' are spares that take a lost shard.
//!
//! A shard crosses to its node as a [`ShardSpec`]: the model's architecture, its layer
//! range, the session-cache limits, its neighbours and the seed of the weights. The node
//! builds it with [`ShardSpec::actor`] over a [`CandleBackend`] with weights seeded as in a
//! one-process run, so both run the same [`ShardNode`] code on the same numbers.

use std::ops::Range;

use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::scenario::{PipelineScenario, mode_name};
use super::shard::{CacheLimits, DecodeMode, Shard};
use super::{Msg, ShardNode};
use crate::actor::{Actor, ActorId};
use crate::backend::{CandleBackend, ModelBackend};
use crate::exec::{TransformerConfig, WeightSource, default_device};
use crate::live::LiveError;
use crate::live::cluster::{Coordinator, Placement, System};
use crate::live::wire::FRAME_OVERHEAD;
use crate::units::Nanos;

/// Everything a node needs to build one shard of a route.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ShardSpec {
    pub model: TransformerConfig,
    pub layers: Range<usize>,
    /// The shard's place on the route (0 is the head shard).
    pub index: usize,
    /// The next shard's actor, or none for the tail.
    pub next: Option<u32>,
    /// The head's actor.
    pub head: u32,
    pub max_queue: usize,
    pub max_sessions: usize,
    pub ttl_ns: u64,
    /// Seed of the weights ([`WeightSource::Seeded`]).
    pub seed: u64,
}

impl ShardSpec {
    /// The shard actor over `backend`: the one constructor of shard actors, for the
    /// simulator, one live process and a node alike.
    pub fn actor(&self, backend: Box<dyn ModelBackend>) -> Box<dyn Actor<Msg>> {
        let limits = CacheLimits {
            max_sessions: self.max_sessions,
            ttl: Nanos(self.ttl_ns),
        };
        Box::new(ShardNode::new(
            Shard::new(backend, limits),
            self.index,
            self.next.map(ActorId),
            ActorId(self.head),
            self.max_queue,
        ))
    }

    /// Bytes of f32 weights this shard holds (embedding on the head shard, norm and LM head
    /// on the tail), an upper bound used to refuse a spec too large for a node.
    pub fn weight_bytes(&self) -> u64 {
        self.model
            .f32_weight_bytes(self.layers.end.saturating_sub(self.layers.start))
    }

    /// The candle backend of this shard: f32 weights seeded as in a one-process run, on the
    /// default device.
    pub fn backend(&self) -> Result<CandleBackend, String> {
        CandleBackend::load(
            &self.model,
            self.layers.clone(),
            &WeightSource::Seeded(self.seed),
            DType::F32,
            &default_device(),
        )
        .map_err(|e| e.to_string())
    }
}

/// The shard specs of `s` (actor `1 + i` is shard `i`; the head is actor 0).
pub fn specs(s: &PipelineScenario) -> Vec<ShardSpec> {
    let n = s.layers.len();
    s.layers
        .iter()
        .enumerate()
        .map(|(i, l)| ShardSpec {
            model: s.model.clone(),
            layers: l.clone(),
            index: i,
            next: (i + 1 < n).then_some(i as u32 + 2),
            head: 0,
            max_queue: s.max_active,
            max_sessions: s.cache.max_sessions,
            ttl_ns: s.cache.ttl.0,
            seed: s.seed,
        })
        .collect()
}

/// The pipeline system on a node.
pub struct Pipeline;

impl System for Pipeline {
    type Msg = Msg;
    /// Shards share nothing inside a process.
    type Shared = ();

    fn shared(
        _setup: &crate::live::wire::Setup,
        _max_memory: u64,
        _reads: std::sync::Arc<crate::live::cluster::Reads>,
    ) -> Result<(), String> {
        Ok(())
    }

    fn build(spec: &[u8], max_memory: u64, _shared: &()) -> Result<Box<dyn Actor<Msg>>, String> {
        let spec: ShardSpec = crate::live::wire::postcard_whole(spec).map_err(|e| e.to_string())?;
        let m = &spec.model;
        if spec.layers.start >= spec.layers.end || spec.layers.end > m.layers {
            return Err(format!(
                "layers {:?} of a {}-layer model",
                spec.layers, m.layers
            ));
        }
        if m.hidden == 0 || m.heads == 0 || m.kv_heads == 0 || m.head_dim == 0 || m.vocab == 0 {
            return Err("a model with a zero dimension".into());
        }
        if spec.max_queue == 0 || spec.max_queue > 1 << 20 || spec.max_sessions > 1 << 20 {
            return Err(format!(
                "queue {} / sessions {}: out of range",
                spec.max_queue, spec.max_sessions
            ));
        }
        let bytes = spec.weight_bytes();
        if bytes > max_memory {
            return Err(format!(
                "shard {} needs {bytes} bytes of weights, over this node's limit of {max_memory} \
                 (--max-memory-gib)",
                spec.index
            ));
        }
        let backend = spec.backend()?;
        Ok(spec.actor(Box::new(backend)))
    }
}

/// The largest frame a run of `s` can send: a prefill's activation of its longest sequence,
/// or the tail's logits.
pub fn max_frame(s: &PipelineScenario) -> u64 {
    let longest = super::run::trace(s)
        .iter()
        .map(|r| r.prompt.len() as u64 + r.output_tokens as u64)
        .max()
        .unwrap_or(1);
    super::wire::largest_message(longest, s.model.hidden as u64, s.model.vocab as u64)
        + FRAME_OVERHEAD
}

/// Runs `s` in `mode` across the coordinator's nodes: the head here, shard `i` on node
/// `1 + i mod N`.
pub async fn live(
    s: &PipelineScenario,
    mode: DecodeMode,
    coordinator: &mut Coordinator,
) -> Result<super::run::PipelineRun, LiveError> {
    let nodes = coordinator.addresses().len();
    if nodes == 0 {
        return Err(LiveError::Config("no nodes to place the shards on".into()));
    }
    let specs = specs(s);
    let head = super::run::head(s, mode);
    let mut placement = Placement {
        local: Default::default(),
        remote: Default::default(),
        shared: Vec::new(),
    };
    placement.local.insert(0, head);
    for (i, spec) in specs.iter().enumerate() {
        let bytes = postcard::to_allocvec(spec).map_err(|e| LiveError::Config(e.to_string()))?;
        placement
            .remote
            .insert(i as u32 + 1, ((1 + i % nodes) as u16, bytes));
    }
    let out = coordinator
        .run::<Pipeline>(placement, s.seed, max_frame(s), s.max_wall)
        .await?;
    tracing::info!(
        mode = mode_name(mode),
        frames = out.wire_frames,
        frame_bytes = out.wire_bytes,
        payload_bytes = out.bytes,
        "actor messages across processes"
    );
    Ok(super::run::PipelineRun::live(
        mode,
        out,
        coordinator.timeline.clone(),
    ))
}
