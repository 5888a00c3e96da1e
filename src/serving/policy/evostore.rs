//! `evostore`: an EvoStore-like distributed store of incremental tensors.
//!
//! Every prompt's full tensors are stored after its prefill, incrementally (only what lies
//! beyond the longest stored prefix), owned by the writer's node; metadata is flat; a load
//! from another node is one bulk RDMA request gathering all segments. No replication: a prefix
//! owned by another node is always fetched from it. No consolidation: every increment is its
//! own region. Eviction order per the scenario (`[store.evostore] eviction`, LRU by default),
//! the same in every tier. Combined with the GPU-local prefix cache when `[store]
//! gpu_prefix_cache` is true. Sizes, chunk and load overlap are the `[store]` table's.

use super::{Policy, Scope, StoreRules};
use crate::serving::kv::GpuEviction;
use crate::serving::store::admission::Admission;
use crate::serving::store::{StoreConfig, TierEviction};

/// The `evostore` policy with the scenario's `[store]` settings.
pub fn policy(cfg: &StoreConfig) -> Policy {
    Policy {
        name: "evostore".into(),
        base: "evostore".into(),
        gpu_prefix_cache: cfg.gpu_prefix_cache,
        gpu_eviction: GpuEviction::Lru,
        store: Some(StoreRules {
            scope: Scope::Cluster,
            tensor_tokens: cfg.tensor_tokens,
            host_capacity_bytes: cfg.host_capacity_bytes,
            ssd_capacity_bytes: cfg.ssd_capacity_bytes,
            eviction: TierEviction::all(cfg.evostore.eviction),
            admission: Admission::Always,
            replica_fraction: 0.0,
            replicate_after_reads: None,
            consolidate: false,
            load_overlap: cfg.load_overlap,
            load: cfg.load,
            remote_kv_path: None,
        }),
    }
}
