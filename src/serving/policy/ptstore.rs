//! `ptstore`: EvoStore plus a replication cache, GDSF eviction and consolidation.
//!
//! Each server splits host memory between an owned cache and a replica cache of
//! `replica_fraction` of it (a fixed threshold: neither takes room from the other). A node that
//! has read a tensor from a remote owner `replicate_after_reads` times copies the remote part
//! of that prefix into its replica cache, so later reads are local. Replicas are evicted
//! within their cache (they can be fetched again); owned tensors are demoted to SSD rather
//! than dropped; eviction is GDSF by default (`[store.ptstore]`). Without replication the
//! replica cache is 0 and the owned cache is all host memory.
//! Increments appended to a prefix on its owner extend the prefix's contiguous region, so a
//! load gathers fewer segments. With replication and consolidation off and the same eviction
//! order, it behaves exactly like `evostore`.

use super::StorePolicy;
use crate::serving::store::{StoreConfig, StoreRules};

/// The `ptstore` policy with the scenario's `[store]` settings.
pub fn policy(cfg: &StoreConfig) -> StorePolicy {
    let p = &cfg.ptstore;
    StorePolicy {
        name: "ptstore",
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
