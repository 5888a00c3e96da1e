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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
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

    /// Whether the policy uses the distributed prefix store.
    pub fn uses_store(self) -> bool {
        matches!(self, PolicyKind::EvoStore | PolicyKind::PtStore)
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
