//! `ptstore`: EvoStore plus a replication cache, GDSF eviction and consolidation.
//!
//! Each server splits host memory between an owned cache and a replica cache of
//! `replica_fraction` of it (a fixed threshold: neither takes room from the other). A node that
//! has read a tensor from a remote owner `replicate_after_reads` times copies the remote part
//! of that prefix into its replica cache, so later reads are local. Replicas are evicted
//! within their cache (they can be fetched again); owned tensors are demoted to SSD rather
//! than dropped; eviction is GDSF by default (`[store.ptstore]`), the same in every tier.
//! Without replication the replica cache is 0 and the owned cache is all host memory.
//! Increments appended to a prefix on its owner extend the prefix's contiguous region, so a
//! load gathers fewer segments. With replication and consolidation off and the same eviction
//! order, it behaves exactly like `evostore`. Sizes, chunk and load overlap are the `[store]`
//! table's.

use super::{Policy, Scope, StoreRules};
use crate::serving::store::admission::Admission;
use crate::serving::store::{StoreConfig, TierEviction};

/// The `ptstore` policy with the scenario's `[store]` settings.
pub fn policy(cfg: &StoreConfig) -> Policy {
    let p = &cfg.ptstore;
    Policy {
        name: "ptstore".into(),
        base: "ptstore".into(),
        gpu_prefix_cache: cfg.gpu_prefix_cache,
        store: Some(StoreRules {
            scope: Scope::Cluster,
            tensor_tokens: cfg.tensor_tokens,
            host_capacity_bytes: cfg.host_capacity_bytes,
            ssd_capacity_bytes: cfg.ssd_capacity_bytes,
            eviction: TierEviction::all(p.eviction),
            admission: Admission::Always,
            replica_fraction: if p.replicate_after_reads.is_some() {
                p.replica_fraction
            } else {
                0.0
            },
            replicate_after_reads: p.replicate_after_reads,
            consolidate: p.consolidate,
            load_overlap: cfg.load_overlap,
        }),
    }
}
