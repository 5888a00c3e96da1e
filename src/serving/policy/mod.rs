//! Prefix-reuse policies as compositions (DESIGN contract 5).
//!
//! A policy is a table of independent choices ([`Policy`]): whether the GPU keeps freed
//! prompt blocks indexed for later requests (its prefix cache), in which order it evicts
//! them (`gpu_eviction`: LRU, as vLLM, in every preset), and, when it has tiers beyond
//! the GPU, the store's rules ([`StoreRules`]): the scope within which a stored prefix is
//! visible, the chunk (tensor) size, the capacity of host memory and SSD, eviction per tier,
//! admission, replication and consolidation, and how loads overlap compute. The serving
//! instance, the metadata service and the store servers read the table and do the rest; no
//! code anywhere asks a policy for its name to decide what to do.
//!
//! Every built-in name is a *preset*: a function here that fills the table (one small file
//! each, whose module doc says what it mirrors). A scenario lists policies by name and may
//! write a `[policy.NAME]` table that starts from a preset (`base`) and changes any key (see
//! [`crate::serving::scenario`] and docs/scenarios.md); `meshsim check FILE` prints every
//! policy's resolved table.

mod dynamo_kvbm;
mod evostore;
mod lmcache;
mod local_prefix;
mod mooncake_store;
mod ptstore;
mod sglang_hicache;
mod vanilla;
mod vllm_offload;

pub use local_prefix::policy as local_prefix;
pub use vanilla::policy as vanilla;

use crate::hardware::RemoteKvPath;
use crate::metrics::Tier;
use crate::serving::kv::GpuEviction;
use crate::serving::store::admission::Admission;
use crate::serving::store::{LoadChoice, LoadOverlap, StoreConfig, TierEviction};

/// Where store policies look, in order: the GPU cache first, then the store's tiers.
const STORE_TIERS: &[Tier] = &[
    Tier::Gpu,
    Tier::LocalHost,
    Tier::LocalSsd,
    Tier::RemoteHost,
    Tier::RemoteSsd,
];

/// Where a stored prefix is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Only to the instance that stored it (a store per engine, e.g. LMCache's CPU tier).
    Instance,
    /// To every instance of the node that stored it (a node-wide host pool).
    Node,
    /// To every instance of the cluster, through the metadata service (EvoStore, PTStore).
    Cluster,
}

/// What a policy's store does: everything of the composition beyond the GPU.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoreRules {
    pub scope: Scope,
    /// Tokens per tensor (a multiple of the KV block size).
    pub tensor_tokens: u32,
    /// Host memory per node: the owned cache and the replica cache together.
    pub host_capacity_bytes: u64,
    /// SSD per node (0: no SSD tier).
    pub ssd_capacity_bytes: u64,
    pub eviction: TierEviction,
    pub admission: Admission,
    /// The replica cache's share of host memory, in [0, 1); 0 without replication.
    pub replica_fraction: f64,
    /// Replicate after this many remote reads of a tensor by one node; `None`: never.
    pub replicate_after_reads: Option<u32>,
    pub consolidate: bool,
    pub load_overlap: LoadOverlap,
    /// Load every stored tensor found, or only what is faster to load than to recompute.
    pub load: LoadChoice,
    /// How a load from another node's host memory reaches a GPU; `None`: the hardware's
    /// (`hardware.network.remote_kv_path`).
    pub remote_kv_path: Option<RemoteKvPath>,
}

/// A prefix-reuse policy: a composition, as it crosses processes too.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Policy {
    /// The name used in scenarios and results.
    pub name: String,
    /// The preset it starts from (its own name for a preset).
    pub base: String,
    /// Whether full prompt blocks stay in GPU memory, indexed by their hash, once no running
    /// request uses them (until evicted in `gpu_eviction`'s order), and requests look there.
    pub gpu_prefix_cache: bool,
    /// The order in which the GPU prefix cache evicts free blocks (LRU in every preset; only
    /// LRU without the cache).
    pub gpu_eviction: GpuEviction,
    /// The store beyond the GPU; `None`: the GPU is the only tier.
    pub store: Option<StoreRules>,
}

/// The built-in presets, in the order `meshsim check` and the docs list them: the paper's
/// four, then the systems people deploy.
pub const PRESETS: &[&str] = &[
    "vanilla",
    "local-prefix",
    "evostore",
    "ptstore",
    "vllm-offload",
    "lmcache",
    "sglang-hicache",
    "mooncake-store",
    "dynamo-kvbm",
];

/// What a preset's figures may depend on: the scenario's `[store]` table (the paper's
/// presets take their sizes and rules from it) and the cluster the policy runs on (the
/// deployed systems size their tiers per engine, or relative to its KV pool).
#[derive(Clone, Copy, Debug)]
pub struct Setting<'a> {
    pub store: &'a StoreConfig,
    /// Serving instances (engines) per node.
    pub instances_per_node: u32,
    /// Bytes of one instance's GPU KV pool.
    pub kv_pool_bytes: u64,
    /// Host memory per node.
    pub host_memory_bytes: u64,
    /// The serving KV block size, in tokens.
    pub block_size: u32,
}

/// The preset called `name` in `setting`; `None` for a name that is not a preset.
pub fn preset(name: &str, setting: &Setting) -> Option<Policy> {
    let store = setting.store;
    let mut p = match name {
        "vanilla" => vanilla(),
        "local-prefix" => local_prefix(),
        "evostore" => evostore::policy(store),
        "ptstore" => ptstore::policy(store),
        "vllm-offload" => vllm_offload::policy(setting),
        "lmcache" => lmcache::policy(setting),
        "sglang-hicache" => sglang_hicache::policy(setting),
        "dynamo-kvbm" => dynamo_kvbm::policy(setting),
        "mooncake-store" => mooncake_store::policy(setting),
        _ => return None,
    };
    p.name = name.to_string();
    p.base = name.to_string();
    Some(p)
}

impl Policy {
    /// A policy with the GPU prefix cache and one host tier beyond it: what the deployed
    /// systems' presets share (one copy, no SSD, every chunk admitted, no consolidation); its
    /// name is the preset's, set by [`preset`].
    fn host_tier(
        scope: Scope,
        tensor_tokens: u32,
        host_capacity_bytes: u64,
        eviction: crate::serving::store::eviction::Eviction,
        load_overlap: LoadOverlap,
    ) -> Policy {
        Policy {
            name: String::new(),
            base: String::new(),
            gpu_prefix_cache: true,
            gpu_eviction: GpuEviction::Lru,
            store: Some(StoreRules {
                scope,
                tensor_tokens,
                host_capacity_bytes,
                ssd_capacity_bytes: 0,
                eviction: TierEviction::all(eviction),
                admission: Admission::Always,
                replica_fraction: 0.0,
                replicate_after_reads: None,
                consolidate: false,
                load_overlap,
                load: LoadChoice::Always,
                remote_kv_path: None,
            }),
        }
    }

    /// The name used in scenarios and results.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where a request looks for its prefix, in order.
    pub fn lookup_tiers(&self) -> &'static [Tier] {
        match (self.gpu_prefix_cache, self.store.is_some()) {
            (_, true) if self.gpu_prefix_cache => STORE_TIERS,
            (_, true) => &STORE_TIERS[1..],
            (true, false) => &STORE_TIERS[..1],
            (false, false) => &[],
        }
    }

    /// Whether full prompt blocks stay in GPU memory once no running request uses them.
    pub fn keep_gpu_blocks(&self) -> bool {
        self.gpu_prefix_cache
    }

    /// The store's rules; `None` for a policy without tiers beyond the GPU.
    pub fn store_rules(&self) -> Option<&StoreRules> {
        self.store.as_ref()
    }

    /// Whether the policy uses the prefix store (a metadata service and store servers).
    pub fn uses_store(&self) -> bool {
        self.store.is_some()
    }

    /// Whether nothing is reused between requests (the baseline live runs compare with).
    pub fn reuses_nothing(&self) -> bool {
        !self.gpu_prefix_cache && self.store.is_none()
    }

    /// A policy's simulation time per request relative to a policy that reuses nothing,
    /// rounded: only the order in which a run starts its simulations depends on it (the most
    /// costly first, see [`crate::sim::parallel_map_in`]), never a result. The figures follow
    /// the presets' simulation times on `polaris_full`: a store policy has about five times
    /// vanilla's events (shorter iterations, transfers, store messages), replication adds
    /// more, and every policy with a prefix cache registers and evicts each prompt's blocks.
    pub fn relative_cost(&self) -> u64 {
        match &self.store {
            Some(r) if r.replicate_after_reads.is_some() => 10,
            Some(_) => 8,
            None if self.gpu_prefix_cache => 3,
            None => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_presets_look_where_their_tiers_are() {
        use crate::serving::store::eviction::Eviction;
        use crate::serving::store::{EvoStoreConfig, PtStoreConfig};
        use crate::units::Nanos;
        let store = StoreConfig {
            tensor_tokens: 32,
            host_capacity_bytes: 1 << 30,
            ssd_capacity_bytes: 0,
            metadata_service: Nanos::ZERO,
            fetch_request_overhead: Nanos::ZERO,
            fetch_segment_overhead: Nanos::ZERO,
            gpu_prefix_cache: true,
            load_overlap: Default::default(),
            load: Default::default(),
            read_lease: Nanos::ZERO,
            evostore: EvoStoreConfig {
                eviction: Eviction::Lru,
            },
            ptstore: PtStoreConfig {
                eviction: Eviction::Gdsf,
                replica_fraction: 0.25,
                replicate_after_reads: Some(2),
                consolidate: true,
            },
        };
        let setting = |store| Setting {
            store,
            instances_per_node: 4,
            kv_pool_bytes: 1 << 30,
            host_memory_bytes: 1 << 36,
            block_size: 16,
        };
        let tiers = |n: &str| preset(n, &setting(&store)).unwrap().lookup_tiers();
        assert_eq!(tiers("vanilla"), &[] as &[Tier]);
        assert_eq!(tiers("local-prefix"), &[Tier::Gpu]);
        assert_eq!(tiers("evostore"), STORE_TIERS);
        assert_eq!(tiers("ptstore"), STORE_TIERS);
        let mut off = store.clone();
        off.gpu_prefix_cache = false;
        assert_eq!(
            preset("ptstore", &setting(&off)).unwrap().lookup_tiers(),
            &STORE_TIERS[1..]
        );
        assert!(preset("nothing", &setting(&store)).is_none());
        for n in PRESETS {
            let p = preset(n, &setting(&store)).unwrap();
            assert_eq!((p.name.as_str(), p.base.as_str()), (*n, *n));
        }
    }
}
