//! The live host (DESIGN, "Architecture"): pipeline shards as ractor actors on tokio, real
//! candle tensors and the real wall clock.
//!
//! Each shard runs as one [`ShardActor`] that owns the same pure [`Shard`] state machine as the
//! in-process [`crate::shard::Route`] (its session cache and a [`CandleBackend`]); the actor only
//! turns messages ([`ShardMsg`]) into calls of [`Shard::handle`] at the host's current time.
//! The actor definition is stateless; its state ([`ShardState`]) is built in `pre_start` from
//! [`ShardArgs`], as ractor recommends.
//!
//! Addressing stays abstract: the head-side driver talks to shards only through
//! [`ShardAddr`], a thin wrapper around an [`ActorRef`]. Under `ractor_cluster` the same
//! reference can point at an actor in another process once [`ShardMsg`] is serializable; nothing
//! else in the driver would change.
//!
//! The driver ([`LiveHost::start`], [`LiveHost::step`], [`LiveHost::generate`]) mirrors
//! [`crate::shard::Route`]: a prefill (or, stateless, the whole sequence) first, then decode
//! steps carrying only the newest token; on [`ShardReply::CacheMiss`] it re-prefills the
//! sequence so far under the same session id and carries on. It relays each shard's output to
//! the next shard (a star around the head, not shard-to-shard forwarding). Greedy decoding.
//!
//! Time: [`LiveHost::now`] is the wall time since the host started, in [`Nanos`]; shards get it
//! with every message (for their caches' TTL and LRU), so the shard code stays sans-IO.
//!
//! Model work runs inside the actor's handler on a tokio worker thread (wrapped in
//! `block_in_place` on a multi-threaded runtime), so one shard computes one step at a time.

pub mod host;

use host::compute;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, rpc::CallResult};

use crate::backend::{CandleBackend, TOKEN_ID_BYTES};
use crate::exec::{TransformerConfig, WeightSource};
use crate::metrics::write::{write_requests, write_summary};
use crate::metrics::{Report, RequestRecord, Summary};
use crate::policy::Tier;
use crate::shard::{
    CacheLimits, DecodeMode, Generation, Mode, Pass, SessionId, Shard, ShardError, ShardReply,
    ShardRequest, ShardStats,
};
use crate::units::Nanos;

/// What can go wrong on the live host.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error("shard actor: {0}")]
    Actor(String),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Io(String),
}

/// A message to a shard actor.
pub enum ShardMsg {
    /// Handle one step of a session at host time `now`.
    Step {
        now: Nanos,
        req: ShardRequest,
        reply: RpcReplyPort<Result<ShardReply, ShardError>>,
    },
    /// The shard's counters.
    Stats(RpcReplyPort<ShardStats>),
}

/// How to build one shard: model, layer range, weights, cache limits.
#[derive(Clone, Debug)]
pub struct ShardArgs {
    pub config: TransformerConfig,
    pub layers: Range<usize>,
    pub weights: WeightSource,
    pub limits: CacheLimits,
}

/// A shard actor's state: the pure shard state machine.
pub struct ShardState {
    shard: Shard,
}

/// The shard actor (no fields: everything it owns is in [`ShardState`]).
pub struct ShardActor;

impl Actor for ShardActor {
    type Msg = ShardMsg;
    type State = ShardState;
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<ShardMsg>,
        args: ShardArgs,
    ) -> Result<ShardState, ActorProcessingErr> {
        let backend = CandleBackend::load(
            &args.config,
            args.layers,
            &args.weights,
            DType::F32,
            &Device::Cpu,
        )?;
        Ok(ShardState {
            shard: Shard::new(Box::new(backend), args.limits),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ShardMsg>,
        msg: ShardMsg,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ShardMsg::Step { now, req, reply } => {
                let out = compute(|| state.shard.handle(now, req).map(|h| h.reply));
                // The asker may have gone away; nothing to do then.
                let _ = reply.send(out);
            }
            ShardMsg::Stats(reply) => {
                let _ = reply.send(state.shard.stats());
            }
        }
        Ok(())
    }
}


/// Where the driver sends a shard's work: an abstract address (today a local actor).
#[derive(Clone)]
pub struct ShardAddr {
    actor: ActorRef<ShardMsg>,
}

impl ShardAddr {
    pub fn new(actor: ActorRef<ShardMsg>) -> ShardAddr {
        ShardAddr { actor }
    }

    /// Sends one step and waits for the shard's answer.
    pub async fn step(&self, now: Nanos, req: ShardRequest) -> Result<ShardReply, LiveError> {
        let r = self
            .actor
            .call(|reply| ShardMsg::Step { now, req, reply }, None)
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))?;
        Ok(answer(r)??)
    }

    /// The shard's counters.
    pub async fn stats(&self) -> Result<ShardStats, LiveError> {
        let r = self
            .actor
            .call(ShardMsg::Stats, None)
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))?;
        answer(r)
    }

    /// Stops the actor and waits until it has stopped (its caches are gone with it).
    pub async fn stop(&self) -> Result<(), LiveError> {
        self.actor
            .stop_and_wait(None, None)
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))
    }
}

fn answer<T>(r: CallResult<T>) -> Result<T, LiveError> {
    match r {
        CallResult::Success(v) => Ok(v),
        CallResult::Timeout => Err(LiveError::Actor("call timed out".into())),
        CallResult::SenderError => Err(LiveError::Actor("the shard dropped the reply".into())),
    }
}

async fn spawn_shard(args: ShardArgs) -> Result<ShardAddr, LiveError> {
    let (actor, _join) = Actor::spawn(None, ShardActor, args)
        .await
        .map_err(|e| LiveError::Actor(e.to_string()))?;
    Ok(ShardAddr::new(actor))
}

/// Splits `layers` into `shards` contiguous ranges, the first ones one layer longer when the
/// split is uneven.
pub fn split_layers(layers: usize, shards: usize) -> Result<Vec<Range<usize>>, LiveError> {
    if shards == 0 || shards > layers {
        return Err(LiveError::Config(format!(
            "cannot split {layers} layers into {shards} shards"
        )));
    }
    let mut out = Vec::with_capacity(shards);
    let mut start = 0;
    for i in 0..shards {
        let len = layers / shards + usize::from(i < layers % shards);
        out.push(start..start + len);
        start += len;
    }
    Ok(out)
}

/// A live pipeline route: one actor per shard, head first, and the host's clock.
pub struct LiveHost {
    started: Instant,
    specs: Vec<ShardArgs>,
    shards: Vec<ShardAddr>,
}

impl LiveHost {
    /// Spawns one shard actor per layer range of `layers` (contiguous, covering the model).
    pub async fn spawn(
        config: &TransformerConfig,
        layers: &[Range<usize>],
        weights: WeightSource,
        limits: CacheLimits,
    ) -> Result<LiveHost, LiveError> {
        let mut next = 0;
        for l in layers {
            if l.start != next || l.is_empty() {
                return Err(LiveError::Config(format!(
                    "shard of layers {l:?} does not follow layer {next}"
                )));
            }
            next = l.end;
        }
        if next != config.layers {
            return Err(LiveError::Config(format!(
                "shards end at layer {next} of {}",
                config.layers
            )));
        }
        let specs: Vec<ShardArgs> = layers
            .iter()
            .map(|l| ShardArgs {
                config: config.clone(),
                layers: l.clone(),
                weights: weights.clone(),
                limits,
            })
            .collect();
        let mut shards = Vec::with_capacity(specs.len());
        for s in &specs {
            shards.push(spawn_shard(s.clone()).await?);
        }
        Ok(LiveHost {
            started: Instant::now(),
            specs,
            shards,
        })
    }

    /// Wall time since the host started.
    pub fn now(&self) -> Nanos {
        Nanos(self.started.elapsed().as_nanos() as u64)
    }

    pub fn shards(&self) -> &[ShardAddr] {
        &self.shards
    }

    /// Stops shard `i`'s actor and spawns a fresh one for the same layers, with empty caches
    /// (a restarted process: the weights are loaded again).
    pub async fn restart_shard(&mut self, i: usize) -> Result<(), LiveError> {
        self.shards[i].stop().await?;
        self.shards[i] = spawn_shard(self.specs[i].clone()).await?;
        Ok(())
    }

    /// Stops every shard actor.
    pub async fn shutdown(self) -> Result<(), LiveError> {
        for s in &self.shards {
            s.stop().await?;
        }
        Ok(())
    }

    /// Sends `req` through every shard in order; `bytes` counts what flows between shards.
    async fn pass(&self, mut req: ShardRequest, bytes: &mut u64) -> Result<Pass, LiveError> {
        let last = self.shards.len() - 1;
        for (i, shard) in self.shards.iter().enumerate() {
            match shard.step(self.now(), req).await? {
                ShardReply::Forward(next) if i < last => {
                    *bytes += next.input.bytes();
                    req = next;
                }
                ShardReply::Token { token, logits, .. } if i == last => {
                    return Ok(Pass::Token(token, logits));
                }
                ShardReply::CacheMiss { .. } => return Ok(Pass::Miss),
                other => {
                    return Err(ShardError::BadRoute(format!(
                        "shard {i} of {} answered {other:?}",
                        last + 1
                    ))
                    .into());
                }
            }
        }
        Err(ShardError::BadRoute("a route without shards".into()).into())
    }

    /// Runs the whole sequence of `g` in `mode` (prefill or stateless) and appends the token.
    async fn full(&self, g: &mut Generation, mode: Mode) -> Result<(), LiveError> {
        let mut bytes = 0;
        let pass = self.pass(g.full_request(mode), &mut bytes).await?;
        Ok(g.finish_full(mode, pass, bytes)?)
    }

    /// Starts a session: prefills `prompt` and samples the first token.
    pub async fn start(
        &self,
        session: SessionId,
        prompt: Vec<u32>,
        mode: DecodeMode,
    ) -> Result<Generation, LiveError> {
        let mut g = Generation::new(session, prompt, mode)?;
        let first = g.first_mode();
        self.full(&mut g, first).await?;
        Ok(g)
    }

    /// Generates one more token of `g`.
    pub async fn step(&self, g: &mut Generation) -> Result<u32, LiveError> {
        match g.mode {
            DecodeMode::Stateless => self.full(g, Mode::Stateless).await?,
            DecodeMode::Cached => {
                let mut bytes = 0;
                match self.pass(g.decode_request()?, &mut bytes).await? {
                    Pass::Token(t, logits) => g.push(t, logits, bytes),
                    Pass::Miss => {
                        // Re-prefill the sequence so far under the same session id.
                        self.full(g, Mode::Prefill).await?;
                        g.record_miss(bytes);
                    }
                }
            }
        }
        Ok(g.newest())
    }

    /// Greedy generation of `max_new` tokens (at least one).
    pub async fn generate(
        &self,
        session: SessionId,
        prompt: Vec<u32>,
        max_new: usize,
        mode: DecodeMode,
    ) -> Result<Generation, LiveError> {
        let mut g = self.start(session, prompt, mode).await?;
        for _ in 1..max_new {
            self.step(&mut g).await?;
        }
        Ok(g)
    }

    /// Serves one request, measuring arrival (now), first token and end on the host's clock.
    pub async fn serve(
        &self,
        id: u32,
        prompt: Vec<u32>,
        max_new: usize,
        mode: DecodeMode,
    ) -> Result<(RequestRecord, Generation), LiveError> {
        let arrival = self.now();
        let prompt_tokens = prompt.len() as u32;
        let mut g = self.start(SessionId(id as u64), prompt, mode).await?;
        let first_token = self.now();
        for _ in 1..max_new {
            self.step(&mut g).await?;
        }
        let end = self.now();
        let output_tokens = g.output().len() as u32;
        let record = RequestRecord {
            id,
            arrival,
            instance: 0,
            prompt_tokens,
            output_tokens,
            admitted: Some(arrival),
            first_token: Some(first_token),
            end: Some(end),
            reused: [0; Tier::ALL.len()],
            loaded_bytes: [0; Tier::ALL.len()],
            preemptions: 0,
            network_bytes: (prompt_tokens as u64 + output_tokens as u64) * TOKEN_ID_BYTES,
            rejected: false,
        };
        Ok((record, g))
    }
}

/// The models the live host knows by name.
pub fn model_by_name(name: &str) -> Option<TransformerConfig> {
    match name {
        "tiny" => Some(TransformerConfig::tiny()),
        "tiny-qwen" => Some(TransformerConfig::tiny_qwen()),
        "small" => Some(TransformerConfig::small()),
        _ => None,
    }
}

/// `n` seeded token ids below `vocab` for request `id` (ChaCha8 stream `id` of `seed`).
pub fn seeded_prompt(seed: u64, id: u32, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = crate::rng::Stream::new(seed, 0x11fe_0000 + id as u64);
    (0..n).map(|_| rng.below(vocab as u64) as u32).collect()
}

/// A live run: what to serve and where to write it.
#[derive(Clone, Debug)]
pub struct LiveRun {
    pub config: TransformerConfig,
    pub shards: usize,
    pub requests: u32,
    pub output_tokens: usize,
    pub mode: DecodeMode,
    pub seed: u64,
    /// One prompt per request (ids below the model's vocabulary).
    pub prompts: Vec<Vec<u32>>,
}

impl LiveRun {
    /// The policy name in the CSV files.
    pub fn policy(&self) -> &'static str {
        match self.mode {
            DecodeMode::Cached => "live-cached",
            DecodeMode::Stateless => "live-stateless",
        }
    }
}

/// Serves every request of `run` one after another on a fresh live host with seeded weights.
pub async fn serve_all(run: &LiveRun) -> Result<Vec<RequestRecord>, LiveError> {
    let layers = split_layers(run.config.layers, run.shards)?;
    let host = LiveHost::spawn(
        &run.config,
        &layers,
        WeightSource::Seeded(run.seed),
        CacheLimits::default(),
    )
    .await?;
    let mut records = Vec::with_capacity(run.prompts.len());
    for (id, prompt) in run.prompts.iter().enumerate() {
        let (r, _) = host
            .serve(id as u32, prompt.clone(), run.output_tokens, run.mode)
            .await?;
        records.push(r);
    }
    host.shutdown().await?;
    Ok(records)
}

/// Writes `requests.csv` and `summary.csv` of `records` into `dir`.
pub fn write_results(
    dir: &Path,
    policy: &str,
    records: &[RequestRecord],
) -> Result<Summary, LiveError> {
    let io = |e: &dyn std::fmt::Display| LiveError::Io(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(|e| io(&e))?;
    let report = Report {
        records: records.to_vec(),
        ..Report::default()
    };
    let summary = Summary::new(policy, &report, 0);
    let f = std::fs::File::create(dir.join("requests.csv")).map_err(|e| io(&e))?;
    write_requests(f, &[(None, policy, records)]).map_err(|e| io(&e))?;
    let f = std::fs::File::create(dir.join("summary.csv")).map_err(|e| io(&e))?;
    write_summary(f, std::slice::from_ref(&summary)).map_err(|e| io(&e))?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_split_evenly_with_the_rest_in_front() {
        assert_eq!(split_layers(8, 2).unwrap(), vec![0..4, 4..8]);
        assert_eq!(split_layers(8, 3).unwrap(), vec![0..3, 3..6, 6..8]);
        assert!(split_layers(4, 0).is_err());
        assert!(split_layers(4, 5).is_err());
    }

    #[test]
    fn seeded_prompts_are_reproducible_and_in_the_vocabulary() {
        let a = seeded_prompt(1, 0, 64, 4096);
        assert_eq!(a, seeded_prompt(1, 0, 64, 4096));
        assert_ne!(a, seeded_prompt(1, 1, 64, 4096));
        assert!(a.iter().all(|&t| t < 4096));
    }
}
