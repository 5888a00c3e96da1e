//! The live host (DESIGN, "Architecture"): the same sans-IO actors as the simulator, hosted by
//! ractor actors on tokio, with real candle tensors and the real wall clock.
//!
//! [`host`] runs any set of [`crate::actor::Actor`]s: each inside one ractor actor, messages
//! through mailboxes, timers on tokio, `Work::Compute` performed for real by the model backend
//! inside the handler. Pipeline scenarios ([`crate::pipeline`]) use it with a
//! [`crate::backend::CandleBackend`] per shard (`meshsim run <scenario> --live`), so the
//! [`crate::pipeline::Head`] and [`crate::pipeline::ShardNode`] code that the simulator runs is
//! exactly the code that runs live. Serving scenarios (`crate::serving::live`) use it with a
//! [`crate::backend::PagedCandleBackend`] per instance and store servers that hold real K/V:
//! the router, instance, metadata and store-server code is the simulator's.
//!
//! Addressing stays abstract: actors name each other by [`crate::actor::ActorId`], which
//! the host maps to a mailbox, so actors could later live in other processes under
//! `ractor_cluster` once each system's messages are serializable.

pub mod cluster;
pub mod host;
pub mod wire;

/// What can go wrong on the live host.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("actor: {0}")]
    Actor(String),
    #[error("bad configuration: {0}")]
    Config(String),
}
