//! Faults a scenario injects (`[[fault]]`, one table for both systems).
//!
//! Kinds, and what each does:
//! - `node-crash` (serving): at `at_s` node `node` stops for good. Its serving instances and
//!   store server drop every message from then on; the router, the metadata service and every
//!   instance are told (as a membership service would), so the router fails its requests over
//!   to live instances (a request that has already streamed its first token fails instead,
//!   with the reason), the metadata forgets every tensor the node owned or held a replica of,
//!   and instances abandon loads from it (they recompute those tokens).
//! - `store-restart` (serving): at `at_s` the store server of `node` restarts: every tensor it
//!   held (host memory and SSD) is lost; the server, and the node's instances, keep running.
//! - `link-slow` (serving): from `at_s` for `for_s` the NICs of `node` run at `factor` of
//!   their bandwidth (`factor = 0`: cut; transfers wait until the link is back). A transfer is
//!   charged the rate of the moment it starts.
//! - `gpu-slow` (serving): from `at_s` for `for_s` GPU `gpu` of `node` computes at `factor` of
//!   its speed (it slows the serving instance whose tensor-parallel group holds it).
//! - `shard-restart` (pipeline): shard `shard` drops every session state once request
//!   `request` has generated `after_tokens` tokens (the pipeline's `[[pipeline.restart]]`).

use crate::units::Nanos;

/// One validated fault.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    NodeCrash {
        node: u32,
        at: Nanos,
    },
    StoreRestart {
        node: u32,
        at: Nanos,
    },
    LinkSlow {
        node: u32,
        at: Nanos,
        until: Nanos,
        factor: f64,
    },
    GpuSlow {
        node: u32,
        gpu: u32,
        at: Nanos,
        until: Nanos,
        factor: f64,
    },
    ShardRestart {
        shard: usize,
        request: u32,
        after_tokens: u32,
    },
}

impl Fault {
    /// The kind's name, as in scenario files.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::NodeCrash { .. } => "node-crash",
            Fault::StoreRestart { .. } => "store-restart",
            Fault::LinkSlow { .. } => "link-slow",
            Fault::GpuSlow { .. } => "gpu-slow",
            Fault::ShardRestart { .. } => "shard-restart",
        }
    }
}
