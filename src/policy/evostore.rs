//! `evostore`: an EvoStore-like distributed store of incremental tensors.
//!
//! Every prompt's full tensors are stored after its prefill, incrementally (only what lies
//! beyond the longest stored prefix), owned by the writer's node; metadata is flat; a load
//! from another node is one bulk RDMA request gathering all segments. No replication: a prefix
//! owned by another node is always fetched from it. No consolidation: every increment is its
//! own region. Eviction order per the scenario (`[store.evostore] eviction`, LRU by default).
//! Combined with the GPU-local prefix cache when `[store] gpu_prefix_cache` is true.

use super::{Policy, STORE_TIERS as WITH_GPU, Tier};
use crate::store::{StoreConfig, StoreRules};

#[derive(Debug, Clone, Copy)]
pub struct EvoStore {
    rules: StoreRules,
    gpu_cache: bool,
}

impl EvoStore {
    pub fn new(cfg: &StoreConfig) -> EvoStore {
        EvoStore {
            rules: StoreRules {
                eviction: cfg.evostore.eviction,
                replica_fraction: 0.0,
                replicate_after_reads: None,
                consolidate: false,
            },
            gpu_cache: cfg.gpu_prefix_cache,
        }
    }
}

impl Policy for EvoStore {
    fn name(&self) -> &'static str {
        "evostore"
    }
    fn lookup_tiers(&self) -> &'static [Tier] {
        if self.gpu_cache {
            WITH_GPU
        } else {
            &WITH_GPU[1..]
        }
    }
    fn keep_gpu_blocks(&self) -> bool {
        self.gpu_cache
    }
    fn store_rules(&self) -> Option<StoreRules> {
        Some(self.rules)
    }
}
