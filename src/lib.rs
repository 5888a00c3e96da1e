//! meshsim: how much time does reusing KV-cache prefixes across the nodes of a GPU cluster
//! save, under which policy, on which hardware and workload?
//!
//! The crate models a cluster serving LLM requests as sans-IO actors ([`actor`]) run by a
//! deterministic discrete-event host ([`sim`]) that charges every effect from a hardware model
//! ([`hardware`], [`model::cost`]). A [`scenario::Scenario`] (one TOML file) fixes hardware,
//! model, serving, workload, policies and limits; [`run`] simulates each policy on the same
//! generated trace and writes per-request and per-policy CSV ([`metrics`]), then plots and a
//! report made from those files ([`plot`]).
//!
//! Real execution: [`exec`] is a transformer on candle tensors that runs any layer range;
//! [`backend`] is the boundary that shards use (simulated or real); [`shard`] holds the
//! pipeline shard state machine with its session caches and an in-process route. [`pipeline`]
//! turns shards into actors (a head and one actor per layer range) that run unchanged on the
//! simulator or on the [`live`] host (ractor, candle, wall clock); [`profile`] measures the
//! candle backend so that simulations can use measured step times, and
//! [`pipeline::compare`] reports how far a simulation is from a live run.

pub mod actor;
pub mod backend;
pub mod exec;
pub mod experiment;
pub mod hardware;
pub mod hash;
pub mod live;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod profiling;
pub mod results;
pub mod rng;
pub mod scenario;
pub mod serving;
pub mod sim;
pub mod text;
pub mod units;
pub mod workload;

pub use metrics::Tier;
pub use scenario::ScenarioError;
pub use serving::policy::{Policy, PolicyKind};
pub use serving::scenario::Scenario;
pub use sim::kernel::SimError;
pub use units::Nanos;
