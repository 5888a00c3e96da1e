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

use super::Policy;
use crate::serving::store::{StoreConfig, TierEviction};

/// The `ptstore` policy with the scenario's `[store]` settings: `evostore`'s, with
/// `[store.ptstore]`'s eviction, replication and consolidation.
pub fn policy(cfg: &StoreConfig) -> Policy {
    let p = &cfg.ptstore;
    let mut policy = super::evostore::policy(cfg);
    if let Some(s) = policy.store.as_mut() {
        s.eviction = TierEviction::all(p.eviction);
        s.replica_fraction = if p.replicate_after_reads.is_some() {
            p.replica_fraction
        } else {
            0.0
        };
        s.replicate_after_reads = p.replicate_after_reads;
        s.consolidate = p.consolidate;
    }
    policy
}
