//! Serving: the router that clients talk to, the serving instances, and their KV block pools.

pub mod block_pool;
pub mod instance;
pub mod router;
