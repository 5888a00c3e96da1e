//! `evostore`: an EvoStore-like distributed store of incremental tensors.
//!
//! Every prompt's full tensors are stored after its prefill, incrementally (only what lies
//! beyond the longest stored prefix), owned by the writer's node; metadata is flat; a load
//! from another node is one bulk RDMA request gathering all segments. No replication: a prefix
//! owned by another node is always fetched from it. No consolidation: every increment is its
//! own region. Eviction order per the scenario (`[store.evostore] eviction`, LRU by default).
//! Combined with the GPU-local prefix cache when `[store] gpu_prefix_cache` is true.

use super::StorePolicy;
use crate::serving::store::{StoreConfig, StoreRules};

/// The `evostore` policy with the scenario's `[store]` settings.
pub fn policy(cfg: &StoreConfig) -> StorePolicy {
    StorePolicy {
        name: "evostore",
        rules: StoreRules {
            eviction: cfg.evostore.eviction,
            replica_fraction: 0.0,
            replicate_after_reads: None,
            consolidate: false,
        },
        gpu_cache: cfg.gpu_prefix_cache,
    }
}
