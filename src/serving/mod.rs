//! The serving system (DESIGN, "The two systems it models", 2): a router that clients talk
//! to, serving instances with continuous batching over paged KV block pools, and the prefix
//! policies and distributed prefix stores they use.
//!
//! Actors ([`router::Router`], [`instance::Instance`], [`store::server::StoreServer`],
//! [`store::metadata::Metadata`]) exchange [`Msg`]; [`policy`] holds the strategies.
//! [`build`] builds them once; three runners run them: [`sim`] on the simulator, [`live`] on
//! the live host in one process with real K/V on candle, [`cluster`] across processes.
//! [`outcome`] is what a run gives, whichever ran it.

pub mod build;
pub mod chaos;
pub mod cluster;
pub mod instance;
pub mod kv;
pub mod kv_events;
pub mod kv_routing;
pub mod live;
pub mod metadata;
pub mod msg;
pub mod optimal;
pub mod outcome;
pub mod policy;
pub mod router;
pub mod scenario;
pub mod sim;
pub mod store;
pub mod store_server;
pub mod wire;

pub use msg::Msg;
