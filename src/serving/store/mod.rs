//! Distributed prefix tensor stores (EvoStore-like and PTStore).
//!
//! Every node runs a **store server** ([`super::store_server::StoreServer`]) that pools the
//! node's host memory and SSDs for the GPU instances of its own node (over PCIe) and of other
//! nodes (over the NICs). One **metadata service** ([`super::metadata::Metadata`]) at node 0's
//! host keeps the flat records of what is stored where ([`directory::Directory`]) and makes
//! every placement, eviction and replication decision; the servers and instances move the
//! bytes. This folder holds the store's model (records, eviction orders, read counts, the bytes
//! of a live store); the two actors sit beside it, above the system's messages.
//!
//! The life of a request under a store policy:
//!
//! 1. On arrival at an instance, the instance sends the chain of its prompt's tensor ids to the
//!    metadata service (one request; payload 8 bytes per id), skipping the tensors its own GPU
//!    cache already holds. The service answers after `metadata_service_us` (requests queue
//!    FIFO) with the load plan: per source (node and tier) the tensors, bytes and segments.
//! 2. The request joins the instance's queue with its plan not started. When the scheduler
//!    admits it, GPU blocks are allocated for every token it will hold after the loads (the
//!    reservation: loads need blocks to land in, as vLLM allocates blocks for external KV
//!    before its KV connector loads into them), and every group starts at once: one bulk
//!    read per group (RDMA from another node's host memory, a copy over PCIe from its own, or
//!    an SSD read that the owner's node streams through a bounce buffer in its host memory),
//!    paying the per-request and per-segment overhead. Each load crosses every link on its
//!    way ([`crate::hardware::network`]: DRAM, NICs, the reader GPU's PCIe, the SSD channel),
//!    sharing them fairly with the other transfers. How loads overlap compute is
//!    `load_overlap` ([`LoadOverlap`]): `none` parks the request (holding its blocks,
//!    computing nothing) until all groups have arrived, `layerwise` lets it compute at once,
//!    each layer waiting for its own KV (see [`crate::serving::instance`]). Loaded tokens are
//!    not recomputed (under `none`, TTFT = lookup + queueing + loads + prefill of the rest).
//! 3. After its prefill, the instance writes the tensors beyond the stored prefix to its own
//!    node's server (GPU to host over PCIe); the server registers them with the metadata
//!    service, which demotes owned tensors (the server then writes them to SSD) or drops
//!    them as needed to make room in the node's owned cache.
//! 4. PTStore only: when the plan says a remote prefix is now hot, the instance copies what it
//!    loaded remotely into its own node's replica cache (GPU to host over PCIe); the metadata
//!    service evicts older replicas as needed to make room there.
//!
//! **Host memory of a server** is split in two caches with a fixed threshold: the replica
//! cache (`replica_fraction` of it; none under EvoStore) and the owned cache (the rest).
//! Neither takes room from the other: owned tensors are demoted to SSD (dropped when SSD is
//! full), replicas are evicted (they can be fetched again), each within its own cache, leaves
//! of the prefix trie first. Eviction order (LRU, GDSF, LFU, S3-FIFO or ARC, per tier) is
//! over the accesses the metadata service sees: every load it plans counts once for the copy
//! that serves it (a replica for its node's reads, else the owner's tensor). The rules in full
//! are in [`directory`].
//!
//! Not modelled: metadata updates are instantaneous at the service; SSD reads do not
//! promote tensors back to host memory. The model is not split into layer ranges here (one
//! instance holds all layers), so a tensor covers every layer of its chunk.

pub mod admission;
pub mod directory;
pub mod eviction;
pub mod memory;
pub mod read_counts;

use eviction::Eviction;

use crate::units::Nanos;

/// The scenario's `[store]` settings, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// Tokens per tensor (a multiple of the KV block size).
    pub tensor_tokens: u32,
    pub host_capacity_bytes: u64,
    pub ssd_capacity_bytes: u64,
    pub metadata_service: Nanos,
    pub fetch_request_overhead: Nanos,
    pub fetch_segment_overhead: Nanos,
    /// Whether store policies also keep the GPU-local prefix cache.
    pub gpu_prefix_cache: bool,
    pub load_overlap: LoadOverlap,
    /// Whether loads are always made, or only where faster than recomputing.
    pub load: LoadChoice,
    /// How long a lookup holds the tensors it plans to load against eviction.
    pub read_lease: Nanos,
    pub evostore: EvoStoreConfig,
    pub ptstore: PtStoreConfig,
}

/// How a request's store loads overlap its compute (`store.load_overlap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadOverlap {
    /// The request computes nothing until every load has arrived (vLLM's
    /// `WAITING_FOR_REMOTE_KVS`): its prefill starts after the loads.
    #[default]
    None,
    /// Layer by layer (LMCache's and Mooncake's layer-wise loading): layer i's KV arrives
    /// while earlier layers compute, so an iteration waits only for what it has not yet got.
    Layerwise,
}

/// Whether a request loads the stored prefix it was offered (`store.load`, `policy.NAME.load`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadChoice {
    /// Every stored tensor the lookup found is loaded (the paper's stores, and the deployed
    /// connectors: vLLM's `OffloadingConnector`, LMCache, Mooncake's store, SGLang's HiCache).
    #[default]
    Always,
    /// Only the leading part of it whose load is estimated faster than recomputing it; the
    /// rest is recomputed (see `serving::instance`, "Load or recompute").
    WhenFaster,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvoStoreConfig {
    pub eviction: Eviction,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PtStoreConfig {
    pub eviction: Eviction,
    /// Fraction of a server's host capacity reserved for the replica cache (the owned cache
    /// has the rest; neither uses the other's share). In [0, 1).
    pub replica_fraction: f64,
    /// Replicate after this many remote reads of a tensor by one node; `None` disables it.
    pub replicate_after_reads: Option<u32>,
    pub consolidate: bool,
}

/// The order each tier of a server evicts in: its owned host cache, its SSD and its replica
/// cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierEviction {
    pub host: Eviction,
    pub ssd: Eviction,
    pub replica: Eviction,
}

impl TierEviction {
    /// The same order in every tier.
    pub fn all(e: Eviction) -> TierEviction {
        TierEviction {
            host: e,
            ssd: e,
            replica: e,
        }
    }
}
