//! The serving system (DESIGN, "The two systems it models", 2): a router that clients talk
//! to, serving instances with continuous batching over paged KV block pools, and the prefix
//! policies and distributed prefix stores they use.
//!
//! Actors ([`router::Router`], [`instance::Instance`], [`store::server::StoreServer`],
//! [`store::metadata::Metadata`]) exchange [`Msg`]; [`policy`] holds the strategies.
//! [`run`] builds them and simulates them; [`live`] runs the same actors on the live host
//! with real K/V on candle.

pub(crate) mod block_index;
pub(crate) mod block_pool;
pub mod chaos;
pub mod cluster;
pub mod instance;
pub mod kv_routing;
pub mod live;
pub mod msg;
pub mod policy;
pub mod prompt_hashes;
pub mod router;
pub mod run;
pub mod scenario;
pub mod store;
pub mod wire;

pub use msg::Msg;
