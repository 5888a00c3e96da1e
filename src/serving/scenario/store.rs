//! The `[store]` table of a serving scenario: the prefix stores of `evostore` and `ptstore`.

use super::raw::*;
use crate::hardware::HardwareSpec;
use crate::model::ModelConfig;
use crate::scenario::{Check, MAX_TOKENS, ScenarioError, non_negative};
use crate::serving::store::{EvoStoreConfig, PtStoreConfig, StoreConfig};
use crate::units::{GB, GIB, Nanos};

pub(super) fn validate_store(
    c: &Check,
    s: &RawStore,
    hw: &HardwareSpec,
    model: &ModelConfig,
    block_size: u32,
) -> Result<StoreConfig, ScenarioError> {
    let tokens = c.count("store.tensor_tokens", s.tensor_tokens, MAX_TOKENS)?;
    if !tokens.is_multiple_of(block_size) {
        return Err(c.err(
            "store.tensor_tokens",
            format!(
                "expected a multiple of serving.block_size_tokens ({block_size}), found {tokens}"
            ),
        ));
    }
    let tensor_bytes = tokens as u64 * model.kv_bytes_per_token();
    let host = c.positive("store.host_capacity_gib", s.host_capacity_gib)? * GIB as f64;
    if host > hw.host.memory_bytes as f64 || (host as u64) < tensor_bytes {
        return Err(c.err(
            "store.host_capacity_gib",
            format!(
                "expected at least one tensor ({:.3} GiB) and at most hardware.host.memory_gib ({:.1}), found {}",
                tensor_bytes as f64 / GIB as f64,
                hw.host.memory_bytes as f64 / GIB as f64,
                s.host_capacity_gib
            ),
        ));
    }
    let drives = hw.ssd.drives as u64 * hw.ssd.capacity_bytes_per_drive;
    let ssd = match s.ssd_capacity_gb {
        None => drives,
        Some(gb) => {
            let b = non_negative(c, "store.ssd_capacity_gb", gb)? * GB;
            if b > drives as f64 {
                return Err(c.err(
                    "store.ssd_capacity_gb",
                    format!(
                        "expected at most the drives' {:.0} GB, found {gb}",
                        drives as f64 / GB
                    ),
                ));
            }
            b as u64
        }
    };
    let us = |key: &str, v: f64| -> Result<Nanos, ScenarioError> {
        Ok(Nanos::from_secs_f64(non_negative(c, key, v)? / 1e6))
    };
    let lease = non_negative(c, "store.read_lease_ms", s.read_lease_ms)?;
    if lease > 3_600_000.0 {
        return Err(c.err(
            "store.read_lease_ms",
            format!("expected at most an hour (3600000 ms), found {lease}"),
        ));
    }
    let f = s.ptstore.replica_fraction;
    if !(f.is_finite() && (0.0..1.0).contains(&f)) {
        return Err(c.err(
            "store.ptstore.replica_fraction",
            format!("expected a fraction in [0, 1), found {f}"),
        ));
    }
    Ok(StoreConfig {
        tensor_tokens: tokens,
        host_capacity_bytes: host as u64,
        ssd_capacity_bytes: ssd,
        metadata_service: us("store.metadata_service_us", s.metadata_service_us)?,
        fetch_request_overhead: us(
            "store.fetch_request_overhead_us",
            s.fetch_request_overhead_us,
        )?,
        fetch_segment_overhead: us(
            "store.fetch_segment_overhead_us",
            s.fetch_segment_overhead_us,
        )?,
        gpu_prefix_cache: s.gpu_prefix_cache,
        load_overlap: s.load_overlap,
        load: s.load,
        read_lease: Nanos::from_secs_f64(lease / 1e3),
        evostore: EvoStoreConfig {
            eviction: s.evostore.eviction,
        },
        ptstore: PtStoreConfig {
            eviction: s.ptstore.eviction,
            replica_fraction: f,
            replicate_after_reads: (s.ptstore.replicate_after_reads > 0)
                .then_some(s.ptstore.replicate_after_reads),
            consolidate: s.ptstore.consolidate,
        },
    })
}
