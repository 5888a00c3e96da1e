//! The hardware catalogue: GPUs and nodes by name, each figure with its source, for
//! `hardware.gpu.preset` and `hardware.preset` (see [`super::hardware::resolve`]).
//!
//! The entries are TOML tables in `catalogue/gpus.toml` and `catalogue/nodes.toml`, written
//! in the scenario's own keys, so that an entry reads as the `[hardware]` tables it stands
//! for; each figure's comment gives its source (a datasheet or a vendor's system guide) or
//! says it is an assumption. A GPU entry holds `[NAME.gpu]` and, where the datasheet gives
//! them, the bandwidths of its `[NAME.pcie]` link (one direction) and `[NAME.nvlink]` port
//! (one direction); a node entry holds what a node adds around its GPUs (`gpus_per_node`, host
//! memory, SSDs, NICs, link latencies) and names its GPU entry as `gpu.preset`. The cluster's
//! size (`hardware.nodes`) always comes from the scenario.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::hardware::{RawGpu, RawHardware, RawLink};
use super::{Check, ScenarioError};

const GPUS: &str = include_str!("catalogue/gpus.toml");
const NODES: &str = include_str!("catalogue/nodes.toml");

/// A GPU of the catalogue: the GPU, and the bandwidths of its host and peer links.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpuEntry {
    pub(crate) gpu: RawGpu,
    pub(crate) pcie: Option<RawLink>,
    pub(crate) nvlink: Option<RawLink>,
}

fn gpus() -> BTreeMap<String, GpuEntry> {
    toml::from_str(GPUS).expect("catalogue/gpus.toml is valid (tested)")
}

fn nodes() -> BTreeMap<String, RawHardware> {
    toml::from_str(NODES).expect("catalogue/nodes.toml is valid (tested)")
}

/// The GPU entry `name`, named at `key`.
pub(crate) fn gpu(c: &Check, key: &str, name: &str) -> Result<GpuEntry, ScenarioError> {
    entry(c, key, name, "GPU", gpus())
}

/// The node entry `name`, named at `key`.
pub(crate) fn node(c: &Check, key: &str, name: &str) -> Result<RawHardware, ScenarioError> {
    entry(c, key, name, "node", nodes())
}

/// Entry `name` of `all` (a `what` preset), or an error at `key` listing the entries.
fn entry<T>(
    c: &Check,
    key: &str,
    name: &str,
    what: &str,
    mut all: BTreeMap<String, T>,
) -> Result<T, ScenarioError> {
    all.remove(name).ok_or_else(|| {
        let known: Vec<&String> = all.keys().collect();
        c.err(
            key,
            format!("no {what} preset {name:?}; the catalogue has {known:?}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry parses, every node names a GPU of the catalogue and leaves the cluster's
    /// size to the scenario, and every GPU has every figure a GPU table needs.
    #[test]
    fn every_entry_is_complete_and_every_node_names_a_gpu_of_the_catalogue() {
        let (gpus, nodes) = (gpus(), nodes());
        assert!(gpus.len() >= 7 && nodes.len() >= 4);
        for (name, e) in &gpus {
            let g = &e.gpu;
            assert!(g.preset.is_none(), "{name}");
            assert!(
                g.name.is_some()
                    && g.memory_gib.is_some()
                    && g.memory_bandwidth_gb_per_s.is_some()
                    && g.peak_tflops.is_some()
                    && g.compute_efficiency.is_some()
                    && g.memory_efficiency.is_some(),
                "{name}"
            );
            let pcie = e.pcie.as_ref().expect("a GPU has a host link");
            assert!(pcie.bandwidth_gb_per_s.is_some() && pcie.latency_ns.is_none());
        }
        for (name, n) in &nodes {
            assert!(n.nodes.is_none() && n.preset.is_none(), "{name}");
            let gpu = n.gpu.as_ref().and_then(|g| g.preset.as_deref());
            assert!(gpu.is_some_and(|g| gpus.contains_key(g)), "{name}: {gpu:?}");
        }
    }
}
