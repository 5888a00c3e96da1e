//! Pipeline routes with a per-node generation cache, as actors (DESIGN, "The two systems it
//! models", 1).
//!
//! A model's layers are split into contiguous ranges, one per [`ShardNode`]; a [`Head`] plays
//! the client and the route's head: it receives the requests of a trace, runs at most
//! `max_active` route sessions at once (the rest wait in a bounded queue), and drives each one
//! with greedy decoding:
//!
//! ```text
//!   Head ──Step(prefill: token ids)──► shard 0 ──Step(activation [1, n, hidden])──► shard 1 … ─┐
//!    ▲                                                                                        │
//!    └──────────────── Reply(Token) from the tail, or Reply(CacheMiss) from any shard ◄───────┘
//! ```
//!
//! Step 0 of a session is a **prefill** of the whole prompt; each later step is a **decode**
//! that carries only the newest token (and, between shards, its `[1, 1, hidden]` activation)
//! with the sequence length. In **stateless** mode every step is a full pass over the
//! sequence so far. A shard that lacks the session's cache state answers a cache miss and the
//! head re-prefills the sequence so far under the same session id (counted as the request's
//! `preemptions`: the recompute a miss forces, like vLLM's recompute preemption).
//!
//! Each shard handles one step at a time: it asks its [`crate::backend::ModelBackend`] to run
//! the step (which, under the sim backend, returns the modelled duration, analytic or from a
//! measured profile), then occupies its device for that long ([`crate::actor::Work::Compute`]) before it
//! sends the result on. Steps that arrive meanwhile wait in the shard's FIFO queue, whose
//! length is bounded by the head's `max_active` (a session has at most one step in flight).
//! Pipelining comes from different sessions occupying different shards at the same time.
//!
//! These actors are sans-IO: the same code runs on the simulator ([`crate::sim::host`]) with
//! [`crate::backend::SimBackend`] and on the live host ([`crate::live::host`]) with
//! [`crate::backend::CandleBackend`], ractor actors and the wall clock.
//!
//! Fault injection: a [`RestartAt`] makes the head send [`Msg::Restart`] to a shard once a
//! request has generated a given number of tokens; the shard drops every session state (a
//! restarted process with its weights still loaded), and the next decode step misses.

pub mod build;
pub mod cluster;
mod head;
pub mod live;
pub mod msg;
pub mod outcome;
pub mod scenario;
pub mod shard;
mod shard_node;
pub mod sim;
pub mod wire;

pub use head::Head;
pub use msg::Msg;
pub use shard_node::ShardNode;

use crate::pipeline::shard::DecodeMode;
use crate::units::Nanos;

/// Bytes of a cache-miss reply on the wire (session id and layer range).
pub const MISS_REPLY_BYTES: u64 = 24;

/// One request of a pipeline trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineRequest {
    pub arrival: Nanos,
    pub prompt: Vec<u32>,
    pub output_tokens: u32,
}

/// Restart shard `shard` once request `request` has generated `after_tokens` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartAt {
    pub request: u32,
    pub after_tokens: u32,
    pub shard: usize,
}

/// How the head runs its sessions.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadConfig {
    pub mode: DecodeMode,
    /// Sessions generating at once.
    pub max_active: usize,
    /// Requests waiting for a session slot; an arrival beyond it is rejected.
    pub max_waiting: usize,
    /// Closed loop: `max_active` clients, each sending its next request when its previous one
    /// ends; the trace's arrival times are ignored.
    pub closed_loop: bool,
    pub restarts: Vec<RestartAt>,
}
