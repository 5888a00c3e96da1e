//! `ptstore`: EvoStore plus a replication cache, GDSF eviction and consolidation.
//!
//! Each server splits host memory between owned tensors and a replica cache of at most
//! `replica_fraction` of it. A node that has read a tensor from a remote owner
//! `replicate_after_reads` times copies the remote part of that prefix into its replica cache,
//! so later reads are local. Replicas are evicted before owned tensors; owned tensors are
//! demoted to SSD rather than dropped; eviction is GDSF by default (`[store.ptstore]`).
//! Increments appended to a prefix on its owner extend the prefix's contiguous region, so a
//! load gathers fewer segments. With replication and consolidation off and the same eviction
//! order, it behaves exactly like `evostore`.

use super::{Policy, STORE_TIERS as WITH_GPU, Tier};
use crate::store::{StoreConfig, StoreRules};

#[derive(Debug, Clone, Copy)]
pub struct PtStore {
    rules: StoreRules,
    gpu_cache: bool,
}

impl PtStore {
    pub fn new(cfg: &StoreConfig) -> PtStore {
        let p = &cfg.ptstore;
        PtStore {
            rules: StoreRules {
                eviction: p.eviction,
                replica_fraction: if p.replicate_after_reads.is_some() {
                    p.replica_fraction
                } else {
                    0.0
                },
                replicate_after_reads: p.replicate_after_reads,
                consolidate: p.consolidate,
            },
            gpu_cache: cfg.gpu_prefix_cache,
        }
    }
}

impl Policy for PtStore {
    fn name(&self) -> &'static str {
        "ptstore"
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
