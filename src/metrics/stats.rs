//! Counters that actors report at the end of a run: serving instances (and pipeline shards,
//! which report in the same shape), their KV block pools, and the prefix store.

use crate::units::Nanos;

/// Counters kept by the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Registered blocks dropped to make room.
    pub evictions: u64,
    /// Blocks reused from the cache.
    pub hit_blocks: u64,
}

/// Counters of one instance, for results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceStats {
    pub iterations: u64,
    pub busy: Nanos,
    pub preemptions: u64,
    pub rejected: u64,
    pub pool: PoolStats,
}

/// Counters over the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreStats {
    pub stored: u64,
    pub demoted: u64,
    pub dropped: u64,
    pub replicated: u64,
    pub replicas_evicted: u64,
    /// Inserts stopped early because the writer's node had no room without evicting the
    /// prefix being extended (not a column of `summary.csv`).
    pub refused: u64,
    /// Inserts stopped early because the store's admission rule did not admit a tensor
    /// (not a column of `summary.csv`).
    #[serde(default)]
    pub not_admitted: u64,
    /// Tensors lost with their node or store server (faults), and the ones that extended
    /// them; not a column of `summary.csv`.
    pub lost: u64,
}

/// What the store did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreReport {
    pub lookups: u64,
    pub stats: StoreStats,
    /// Bytes copied into replica caches.
    pub replication_bytes: u64,
    /// Bytes demoted from host memory to SSD.
    pub demoted_bytes: u64,
}
