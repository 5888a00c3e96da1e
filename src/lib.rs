//! meshsim: how much time does reusing KV-cache prefixes across the nodes of a GPU cluster
//! save, under which policy, on which hardware and workload?
//!
//! It models the two systems of `DESIGN.md` with one actor contract ([`actor`]): sans-IO
//! state machines that run unchanged on a deterministic discrete-event host ([`sim`]), which
//! charges every effect from a hardware model ([`hardware`]), or on a live host ([`live`]:
//! ractor actors on tokio, real candle tensors, the wall clock). Model work is priced in one
//! place, the model backends ([`backend`]): a simulated backend from the analytic cost model or
//! a measured profile ([`model`]), or a candle backend that computes for real ([`exec`]).
//!
//! The systems, each in its own folder with the same parts (scenario, messages, actors, run):
//! - [`serving`]: a router, serving instances with continuous batching, and the prefix-reuse
//!   policies and distributed prefix stores they use (`vanilla`, `local-prefix`, `evostore`,
//!   `ptstore`);
//! - [`pipeline`]: pipeline routes of shards with per-node generation caches.
//!
//! An [`Experiment`] is one scenario file of either system: it is validated once (shared
//! parsing in `scenario`), run, and written as a results folder ([`results`]: CSV in the
//! schema of [`metrics`], plots, `report.md`, written atomically). [`workload`] generates and
//! replays request traces; [`profiling`] measures the candle backend.
//!
//! Layers, from the bottom: `units`, [`hash`], [`rng`], `text`, [`cpu`] → [`metrics`],
//! [`hardware`], [`fault`] → [`actor`], [`model`] → [`exec`], [`sim`], [`live`], [`workload`] →
//! [`backend`], [`results`], `scenario` → [`serving`], [`pipeline`], [`profiling`] →
//! [`experiment`], [`vopr`]. No module imports one above it.

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod actor;
pub mod backend;
pub mod cpu;
pub mod exec;
pub mod experiment;
pub mod fault;
pub mod hardware;
pub mod hash;
pub mod live;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod profiling;
pub mod results;
pub mod rng;
pub(crate) mod scenario;
pub mod serving;
pub mod sim;
pub(crate) mod text;
pub mod units;
pub mod vopr;
pub mod workload;

pub use actor::{Actor, ActorId, Context, Then, Work};
pub use backend::{BatchBackend, CandleBackend, ModelBackend, SimBackend, SimBatchBackend};
pub use experiment::{Experiment, Runs};
pub use metrics::{Report, RequestRecord, Summary, Tier};
pub use model::{ModelConfig, Preset, preset};
pub use pipeline::scenario::PipelineScenario;
pub use results::RunError;
pub use scenario::ScenarioError;
pub use serving::policy::Policy;
pub use serving::scenario::Scenario;
pub use sim::kernel::SimError;
pub use units::Nanos;
