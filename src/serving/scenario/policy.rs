//! `policies` and the `[policy.NAME]` tables: each listed policy resolved to its full
//! composition ([`Policy`]), and what cannot work refused naming the key.
//!
//! A listed name is a preset ([`crate::serving::policy::PRESETS`]) or has a table. A table
//! starts from `base` (a preset; the table's own name when that is a preset) and replaces
//! the keys it gives; a policy that gains tiers beyond the GPU from a base without them
//! starts from the `[store]` table's figures (as `evostore` does). [`table`] writes a
//! policy back as the table that makes it, every key given: what `meshsim check` prints.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hardware::{HardwareSpec, RemoteKvPath};
use crate::model::ModelConfig;
use crate::scenario::{Check, MAX_TOKENS, ScenarioError, is_file_name, non_negative};
use crate::serving::kv::GpuEviction;
use crate::serving::policy::{PRESETS, Policy, Scope, Setting, preset};
use crate::serving::store::admission::Admission;
use crate::serving::store::eviction::Eviction;
use crate::serving::store::{LoadChoice, LoadOverlap, StoreConfig, TierEviction};
use crate::units::{GB, GIB};

/// Longest policy name: it names rows, plots and files of the results.
const MAX_POLICY_NAME: usize = 64;

/// A tier beyond the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawTier {
    Host,
    Ssd,
}

/// `[policy.NAME]` as written: every key optional, the base's value where absent.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// The preset to start from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Whether the GPU keeps freed prompt blocks for later requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_prefix_cache: Option<bool>,
    /// The order the GPU prefix cache evicts in: `lru`, `lfu` or `s3-fifo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_eviction: Option<GpuEviction>,
    /// Tiers beyond the GPU: `[]`, `["host"]` or `["host", "ssd"]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiers: Option<Vec<RawTier>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_capacity_gib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssd_capacity_gb: Option<f64>,
    /// Every tier's eviction at once (the per-tier keys win).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction: Option<Eviction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_eviction: Option<Eviction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssd_eviction: Option<Eviction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_eviction: Option<Eviction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// 0: no replication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicate_after_reads: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consolidate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_overlap: Option<LoadOverlap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_kv_path: Option<RemoteKvPath>,
}

/// What a composition is checked against.
pub(super) struct Bounds<'a> {
    pub hw: &'a HardwareSpec,
    pub model: &'a ModelConfig,
    pub block_size: u32,
}

/// What the presets of a scenario depend on.
pub(super) fn setting<'a>(
    store: &'a StoreConfig,
    hw: &HardwareSpec,
    serving: &super::Serving,
    model: &ModelConfig,
) -> Setting<'a> {
    let i = &serving.instance;
    Setting {
        store,
        instances_per_node: (hw.gpus_per_node / serving.tensor_parallel).max(1),
        kv_pool_bytes: i.num_blocks as u64 * i.block_size as u64 * model.kv_bytes_per_token(),
        host_memory_bytes: hw.host.memory_bytes,
        block_size: i.block_size,
    }
}

/// Resolves every listed policy, in order.
pub(super) fn policies(
    c: &Check,
    listed: &[String],
    tables: &BTreeMap<String, RawPolicy>,
    setting: &Setting,
    b: &Bounds,
) -> Result<Vec<Policy>, ScenarioError> {
    if listed.is_empty() {
        return Err(c.err("policies", "expected at least one policy"));
    }
    for (i, n) in listed.iter().enumerate() {
        if listed[..i].contains(n) {
            return Err(c.err("policies", format!("{n:?} is listed twice")));
        }
    }
    if let Some(n) = tables.keys().find(|n| !listed.contains(n)) {
        return Err(c.err(
            &format!("policy.{n}"),
            format!("a table for a policy that `policies` does not list ({listed:?})"),
        ));
    }
    listed
        .iter()
        .map(|n| resolve(c, n, tables.get(n), setting, b))
        .collect()
}

fn resolve(
    c: &Check,
    name: &str,
    raw: Option<&RawPolicy>,
    setting: &Setting,
    b: &Bounds,
) -> Result<Policy, ScenarioError> {
    if !is_file_name(name) || name.len() > MAX_POLICY_NAME {
        return Err(c.err(
            "policies",
            format!(
                "expected a policy name of letters, digits, '-', '_' or '.', at most \
                 {MAX_POLICY_NAME} characters (it names results), found {name:?}"
            ),
        ));
    }
    let base_name = match raw.and_then(|r| r.base.as_deref()) {
        Some(b) => b,
        None if preset(name, setting).is_some() => name,
        None if raw.is_some() => {
            return Err(c.err(
                &format!("policy.{name}.base"),
                format!("expected the preset to start from, one of {PRESETS:?}"),
            ));
        }
        None => {
            return Err(c.err(
                "policies",
                format!(
                    "unknown policy {name:?}: expected a preset ({}) or a [policy.{name}] \
                     table with a base",
                    PRESETS.join(", ")
                ),
            ));
        }
    };
    let Some(mut p) = preset(base_name, setting) else {
        return Err(c.err(
            &format!("policy.{name}.base"),
            format!("expected one of the presets {PRESETS:?}, found {base_name:?}"),
        ));
    };
    p.name = name.to_string();
    p.base = base_name.to_string();
    if let Some(r) = raw {
        apply(c, name, r, setting, &mut p)?;
    }
    check(c, name, &p, b)?;
    Ok(p)
}

/// Replaces the base's values by the table's.
fn apply(
    c: &Check,
    name: &str,
    r: &RawPolicy,
    setting: &Setting,
    p: &mut Policy,
) -> Result<(), ScenarioError> {
    let store = setting.store;
    let key = |k: &str| format!("policy.{name}.{k}");
    if let Some(g) = r.gpu_prefix_cache {
        p.gpu_prefix_cache = g;
    }
    if let Some(e) = r.gpu_eviction {
        p.gpu_eviction = e;
    }
    let tiers = match &r.tiers {
        None => None,
        Some(t) if t.is_empty() => Some((false, false)),
        Some(t) if t == &[RawTier::Host] => Some((true, false)),
        Some(t) if t == &[RawTier::Host, RawTier::Ssd] => Some((true, true)),
        Some(t) => {
            return Err(c.err(
                &key("tiers"),
                format!(
                    "expected [], [\"host\"] or [\"host\", \"ssd\"] (a store writes to host \
                     memory first), found {t:?}"
                ),
            ));
        }
    };
    match tiers {
        Some((false, _)) => p.store = None,
        Some((true, _)) if p.store.is_none() => {
            p.store = preset("evostore", setting).and_then(|e| e.store);
        }
        _ => {}
    }
    let Some(s) = p.store.as_mut() else {
        return refuse_store_keys(c, name, r);
    };
    match tiers {
        Some((true, false)) => s.ssd_capacity_bytes = 0,
        Some((true, true)) if s.ssd_capacity_bytes == 0 && r.ssd_capacity_gb.is_none() => {
            s.ssd_capacity_bytes = store.ssd_capacity_bytes;
        }
        _ => {}
    }
    if let Some(v) = r.scope {
        s.scope = v;
    }
    if let Some(v) = r.tensor_tokens {
        s.tensor_tokens = v;
    }
    if let Some(v) = r.host_capacity_gib {
        let gib = c.positive(&key("host_capacity_gib"), v)?;
        s.host_capacity_bytes = (gib * GIB as f64) as u64;
    }
    if let Some(v) = r.ssd_capacity_gb {
        let gb = non_negative(c, &key("ssd_capacity_gb"), v)?;
        if tiers == Some((true, false)) && gb > 0.0 {
            return Err(c.err(
                &key("ssd_capacity_gb"),
                format!("the policy's tiers are [\"host\"]: expected no SSD, found {v} GB"),
            ));
        }
        s.ssd_capacity_bytes = (gb * GB) as u64;
    }
    if let Some(e) = r.eviction {
        s.eviction = TierEviction::all(e);
    }
    s.eviction.host = r.host_eviction.unwrap_or(s.eviction.host);
    s.eviction.ssd = r.ssd_eviction.unwrap_or(s.eviction.ssd);
    s.eviction.replica = r.replica_eviction.unwrap_or(s.eviction.replica);
    if let Some(v) = r.admission {
        s.admission = v;
    }
    if let Some(v) = r.replicate_after_reads {
        s.replicate_after_reads = (v > 0).then_some(v);
    }
    if let Some(v) = r.replica_fraction {
        s.replica_fraction = v;
    }
    if let Some(v) = r.consolidate {
        s.consolidate = v;
    }
    if let Some(v) = r.load_overlap {
        s.load_overlap = v;
    }
    if let Some(v) = r.load {
        s.load = v;
    }
    if let Some(v) = r.remote_kv_path {
        s.remote_kv_path = Some(v);
    }
    Ok(())
}

/// A policy without a store given a key of the store: refused, naming it.
fn refuse_store_keys(c: &Check, name: &str, r: &RawPolicy) -> Result<(), ScenarioError> {
    let given = [
        ("scope", r.scope.is_some()),
        ("tensor_tokens", r.tensor_tokens.is_some()),
        ("host_capacity_gib", r.host_capacity_gib.is_some()),
        ("ssd_capacity_gb", r.ssd_capacity_gb.is_some()),
        ("eviction", r.eviction.is_some()),
        ("host_eviction", r.host_eviction.is_some()),
        ("ssd_eviction", r.ssd_eviction.is_some()),
        ("replica_eviction", r.replica_eviction.is_some()),
        ("admission", r.admission.is_some()),
        ("replicate_after_reads", r.replicate_after_reads.is_some()),
        ("replica_fraction", r.replica_fraction.is_some()),
        ("consolidate", r.consolidate.is_some()),
        ("load_overlap", r.load_overlap.is_some()),
        ("load", r.load.is_some()),
        ("remote_kv_path", r.remote_kv_path.is_some()),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((k, _)) => Err(c.err(
            &format!("policy.{name}.{k}"),
            "the policy has no tier beyond the GPU (tiers = []): give it tiers, or drop the key",
        )),
        None => Ok(()),
    }
}

/// Refuses a composition that cannot work, naming the key.
fn check(c: &Check, name: &str, p: &Policy, b: &Bounds) -> Result<(), ScenarioError> {
    let key = |k: &str| format!("policy.{name}.{k}");
    if !p.gpu_prefix_cache && p.gpu_eviction != GpuEviction::Lru {
        return Err(c.err(
            &key("gpu_eviction"),
            format!(
                "the policy has no GPU prefix cache (gpu_prefix_cache = false): expected \"lru\" \
                 (nothing is evicted), found {:?}",
                gpu_eviction_name(p.gpu_eviction)
            ),
        ));
    }
    let Some(s) = &p.store else {
        return Ok(());
    };
    let tokens = c.count(&key("tensor_tokens"), s.tensor_tokens, MAX_TOKENS)?;
    if !tokens.is_multiple_of(b.block_size) {
        return Err(c.err(
            &key("tensor_tokens"),
            format!(
                "expected a multiple of serving.block_size_tokens ({}), found {tokens}",
                b.block_size
            ),
        ));
    }
    let tensor = tokens as u64 * b.model.kv_bytes_per_token();
    let host = s.host_capacity_bytes;
    if host > b.hw.host.memory_bytes || host < tensor {
        return Err(c.err(
            &key("host_capacity_gib"),
            format!(
                "expected at least one tensor ({:.3} GiB) and at most hardware.host.memory_gib \
                 ({:.1}), found {:.3}",
                tensor as f64 / GIB as f64,
                b.hw.host.memory_bytes as f64 / GIB as f64,
                host as f64 / GIB as f64
            ),
        ));
    }
    let drives = b.hw.ssd.drives as u64 * b.hw.ssd.capacity_bytes_per_drive;
    if s.ssd_capacity_bytes > drives {
        return Err(c.err(
            &key("ssd_capacity_gb"),
            format!(
                "expected at most the drives' {:.0} GB, found {:.0}",
                drives as f64 / GB,
                s.ssd_capacity_bytes as f64 / GB
            ),
        ));
    }
    let f = s.replica_fraction;
    if !(f.is_finite() && (0.0..1.0).contains(&f)) {
        return Err(c.err(
            &key("replica_fraction"),
            format!("expected a fraction in [0, 1), found {f}"),
        ));
    }
    match (s.replicate_after_reads, f > 0.0) {
        (Some(_), _) if s.scope != Scope::Cluster => Err(c.err(
            &key("replicate_after_reads"),
            format!(
                "replication copies prefixes that other nodes own: expected scope = \
                 \"cluster\", found {:?} (or replicate_after_reads = 0)",
                scope_name(s.scope)
            ),
        )),
        (Some(_), false) => Err(c.err(
            &key("replica_fraction"),
            "replication needs a replica cache: expected a fraction above 0",
        )),
        (None, true) => Err(c.err(
            &key("replica_fraction"),
            "the policy never replicates (replicate_after_reads = 0): expected 0",
        )),
        _ => Ok(()),
    }
}

fn gpu_eviction_name(e: GpuEviction) -> &'static str {
    match e {
        GpuEviction::Lru => "lru",
        GpuEviction::Lfu => "lfu",
        GpuEviction::S3Fifo => "s3-fifo",
    }
}

fn scope_name(s: Scope) -> &'static str {
    match s {
        Scope::Instance => "instance",
        Scope::Node => "node",
        Scope::Cluster => "cluster",
    }
}

/// The table that makes `p`, every key given, as TOML (`[policy.NAME]` and its keys).
pub fn table(p: &Policy) -> String {
    let mut r = RawPolicy {
        base: Some(p.base.clone()),
        gpu_prefix_cache: Some(p.gpu_prefix_cache),
        gpu_eviction: Some(p.gpu_eviction),
        tiers: Some(Vec::new()),
        ..RawPolicy::default()
    };
    if let Some(s) = &p.store {
        r.tiers = Some(if s.ssd_capacity_bytes > 0 {
            vec![RawTier::Host, RawTier::Ssd]
        } else {
            vec![RawTier::Host]
        });
        r.scope = Some(s.scope);
        r.tensor_tokens = Some(s.tensor_tokens);
        r.host_capacity_gib = Some(s.host_capacity_bytes as f64 / GIB as f64);
        r.ssd_capacity_gb = Some(s.ssd_capacity_bytes as f64 / GB);
        r.host_eviction = Some(s.eviction.host);
        r.ssd_eviction = Some(s.eviction.ssd);
        r.replica_eviction = Some(s.eviction.replica);
        r.admission = Some(s.admission);
        r.replicate_after_reads = Some(s.replicate_after_reads.unwrap_or(0));
        r.replica_fraction = Some(s.replica_fraction);
        r.consolidate = Some(s.consolidate);
        r.load_overlap = Some(s.load_overlap);
        r.load = Some(s.load);
        r.remote_kv_path = s.remote_kv_path;
    }
    #[derive(Serialize)]
    struct Outer<'a> {
        policy: BTreeMap<&'a str, RawPolicy>,
    }
    let outer = Outer {
        policy: BTreeMap::from([(p.name.as_str(), r)]),
    };
    toml::to_string(&outer).expect("a policy table is plain TOML")
}
