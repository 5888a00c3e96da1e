//! What every host of a pipeline run needs, built once: the trace, the head, and the shards'
//! specs (what a `meshsim node` receives to build a shard) with the one constructor of shard
//! actors. The runners are peers over this module: [`super::sim`], [`super::live`] and
//! [`super::cluster`].
//!
//! **The trace**: `requests` arrivals of a Poisson process at `arrival_rate_per_s` (ChaCha8 stream
//! `WORKLOAD_ARRIVALS`; in a closed loop the head sets each arrival when it happens), each with
//! a prompt of `prompt_tokens` seeded token ids (as [`crate::workload::seeded_prompt`]) or one of
//! the scenario's tokenized `prompts`, and `output_tokens` to generate. The same trace is used by
//! every mode, point and host.

use std::ops::Range;

use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::scenario::{Arrivals, PipelineScenario};
use super::shard::{CacheLimits, DecodeMode, Shard};
use super::{Head, HeadConfig, Msg, PipelineRequest, ShardNode};
use crate::actor::{Actor, ActorId};
use crate::backend::{CandleBackend, ModelBackend};
use crate::exec::{TransformerConfig, WeightSource, default_device};
use crate::rng::{Stream, streams};
use crate::units::Nanos;

/// The requests of `s`, sorted by arrival.
pub fn trace(s: &PipelineScenario) -> Vec<PipelineRequest> {
    let w = &s.workload;
    let mut rng = Stream::new(s.seed, streams::WORKLOAD_ARRIVALS);
    let mut t = 0.0f64;
    (0..w.requests)
        .map(|id| {
            if let (Arrivals::Poisson(rate), true) = (w.arrivals, id > 0) {
                t += rng.exponential(rate);
            }
            PipelineRequest {
                arrival: Nanos::from_secs_f64(t),
                prompt: match &w.prompts {
                    Some(p) => p[id as usize % p.len()].clone(),
                    None => crate::workload::seeded_prompt(
                        s.seed,
                        id,
                        w.prompt_tokens as usize,
                        s.model.vocab,
                    ),
                },
                output_tokens: w.output_tokens,
            }
        })
        .collect()
}

/// The head of `s` in `mode` (actor 0), driving the shards `1..=layers`.
pub fn head(s: &PipelineScenario, mode: DecodeMode) -> Box<dyn Actor<Msg>> {
    let ids: Vec<ActorId> = (1..=s.layers.len()).map(|i| ActorId(i as u32)).collect();
    let cfg = HeadConfig {
        mode,
        max_active: s.max_active,
        max_waiting: s.max_waiting,
        closed_loop: s.workload.arrivals == Arrivals::ClosedLoop,
        restarts: s.restarts.clone(),
    };
    Box::new(Head::new(cfg, ids, trace(s)))
}

/// The head (id 0) and the shard actors (ids 1..) of `s` in `mode` over `backends`, built
/// from the same [`ShardSpec`]s that a run across processes sends to its nodes.
pub fn actors(
    s: &PipelineScenario,
    mode: DecodeMode,
    backends: Vec<Box<dyn ModelBackend>>,
) -> Vec<Box<dyn Actor<Msg>>> {
    let mut out = vec![head(s, mode)];
    for (spec, b) in specs(s).iter().zip(backends) {
        out.push(spec.actor(b));
    }
    out
}

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
