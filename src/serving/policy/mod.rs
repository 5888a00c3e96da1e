//! Prefix-reuse policies: small strategies behind one narrow trait (DESIGN contract 5).
//!
//! A policy says where a request looks for the KV of its prompt's prefix, and what is kept
//! for later requests. The serving instance asks its policy and does the rest (allocation,
//! scheduling, eviction mechanics), so adding a policy is one new file here plus its name in
//! [`PolicyKind`].

mod evostore;
mod local_prefix;
mod ptstore;
mod vanilla;

pub use local_prefix::LocalPrefix;
pub use vanilla::Vanilla;

use crate::metrics::Tier;
use crate::serving::store::{StoreConfig, StoreRules};

use std::fmt;

/// Where store policies look, in order: the GPU cache first, then the store's tiers.
const STORE_TIERS: &[Tier] = &[
    Tier::Gpu,
    Tier::LocalHost,
    Tier::LocalSsd,
    Tier::RemoteHost,
    Tier::RemoteSsd,
];

/// A policy that uses the distributed prefix store: its rules, and whether it also keeps the
/// GPU-local prefix cache. The store policies (`evostore`, `ptstore`) differ only in rules.
#[derive(Debug, Clone, Copy)]
pub struct StorePolicy {
    name: &'static str,
    rules: StoreRules,
    gpu_cache: bool,
}

impl Policy for StorePolicy {
    fn name(&self) -> &'static str {
        self.name
    }
    fn lookup_tiers(&self) -> &'static [Tier] {
        if self.gpu_cache {
            STORE_TIERS
        } else {
            &STORE_TIERS[1..]
        }
    }
    fn keep_gpu_blocks(&self) -> bool {
        self.gpu_cache
    }
    fn store_rules(&self) -> Option<StoreRules> {
        Some(self.rules)
    }
}

/// A prefix-reuse policy.
pub trait Policy: Send + Sync + fmt::Debug {
    /// The name used in scenarios and results.
    fn name(&self) -> &'static str;

    /// Where a request looks for its prefix, in order.
    fn lookup_tiers(&self) -> &'static [Tier];

    /// Whether full prompt blocks stay in GPU memory, indexed by their hash, once no running
    /// request uses them (until evicted least recently used first).
    fn keep_gpu_blocks(&self) -> bool;

    /// For policies that use the distributed prefix store: what it stores, replicates and
    /// evicts. `None` for policies without a store.
    fn store_rules(&self) -> Option<StoreRules> {
        None
    }
}

/// The policies a scenario can name.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Vanilla,
    LocalPrefix,
    #[serde(rename = "evostore")]
    EvoStore,
    #[serde(rename = "ptstore")]
    PtStore,
}

impl PolicyKind {
    /// The policy with the scenario's store settings.
    pub fn build(self, store: &StoreConfig) -> Box<dyn Policy> {
        match self {
            PolicyKind::Vanilla => Box::new(Vanilla),
            PolicyKind::LocalPrefix => Box::new(LocalPrefix),
            PolicyKind::EvoStore => Box::new(evostore::policy(store)),
            PolicyKind::PtStore => Box::new(ptstore::policy(store)),
        }
    }

    /// The policy with the scenario's store settings, as it crosses processes.
    pub fn spec(self, store: &StoreConfig) -> PolicySpec {
        let p = self.build(store);
        PolicySpec {
            kind: self,
            rules: p.store_rules(),
            gpu_cache: p.keep_gpu_blocks(),
        }
    }

    /// Whether the policy uses the distributed prefix store.
    pub fn uses_store(self) -> bool {
        matches!(self, PolicyKind::EvoStore | PolicyKind::PtStore)
    }

    /// A policy's simulation time per request relative to vanilla's, rounded: only the
    /// order in which a run starts its simulations depends on it (the most costly first, see
    /// [`crate::sim::parallel_map_in`]), never a result. The order follows the policies'
    /// simulation times on `polaris_full`: a store policy has about five times vanilla's
    /// events (shorter iterations, transfers, store messages), and every policy with a prefix
    /// cache registers and evicts each prompt's blocks.
    pub fn relative_cost(self) -> u64 {
        match self {
            PolicyKind::Vanilla => 1,
            PolicyKind::LocalPrefix => 3,
            PolicyKind::EvoStore => 8,
            PolicyKind::PtStore => 10,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Vanilla => "vanilla",
            PolicyKind::LocalPrefix => "local-prefix",
            PolicyKind::EvoStore => "evostore",
            PolicyKind::PtStore => "ptstore",
        }
    }
}

/// A policy as the serving actors get it (what [`PolicyKind::build`] makes of a scenario's
/// store settings), in a form that crosses processes.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicySpec {
    pub kind: PolicyKind,
    /// The store policies' rules (`None` for the others).
    pub rules: Option<StoreRules>,
    /// Whether full prompt blocks stay in GPU memory (store policies: the GPU prefix cache).
    pub gpu_cache: bool,
}

impl PolicySpec {
    /// The policy, or why not (a store policy without rules, or a policy of fixed GPU-cache
    /// behaviour asked for the other).
    pub fn build(&self) -> Result<Box<dyn Policy>, String> {
        let p: Box<dyn Policy> = match (self.kind, self.rules) {
            (PolicyKind::Vanilla, None) => Box::new(Vanilla),
            (PolicyKind::LocalPrefix, None) => Box::new(LocalPrefix),
            (PolicyKind::EvoStore | PolicyKind::PtStore, Some(rules)) => Box::new(StorePolicy {
                name: self.kind.name(),
                rules,
                gpu_cache: self.gpu_cache,
            }),
            (kind, _) => {
                return Err(format!(
                    "policy {} with store rules {:?}",
                    kind.name(),
                    self.rules
                ));
            }
        };
        if p.keep_gpu_blocks() != self.gpu_cache {
            return Err(format!(
                "policy {} cannot have the GPU prefix cache {}",
                p.name(),
                if self.gpu_cache { "on" } else { "off" }
            ));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    #[test]
    fn a_policy_spec_builds_the_policy_the_scenario_would() {
        use crate::serving::store::eviction::Eviction;
        use crate::serving::store::{EvoStoreConfig, PtStoreConfig};
        use crate::units::Nanos;
        let mut store = StoreConfig {
            tensor_tokens: 32,
            host_capacity_bytes: 1 << 30,
            ssd_capacity_bytes: 0,
            metadata_service: Nanos::ZERO,
            fetch_request_overhead: Nanos::ZERO,
            fetch_segment_overhead: Nanos::ZERO,
            gpu_prefix_cache: true,
            load_overlap: Default::default(),
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
        for gpu in [true, false] {
            store.gpu_prefix_cache = gpu;
            for k in [
                PolicyKind::Vanilla,
                PolicyKind::LocalPrefix,
                PolicyKind::EvoStore,
                PolicyKind::PtStore,
            ] {
                let want = k.build(&store);
                let got = k.spec(&store).build().unwrap();
                assert_eq!(got.name(), want.name());
                assert_eq!(got.lookup_tiers(), want.lookup_tiers());
                assert_eq!(got.keep_gpu_blocks(), want.keep_gpu_blocks());
                assert_eq!(got.store_rules(), want.store_rules());
            }
        }
        let bad = PolicySpec {
            kind: PolicyKind::Vanilla,
            rules: None,
            gpu_cache: true,
        };
        assert!(bad.build().is_err());
    }
}
