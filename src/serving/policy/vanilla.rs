//! `vanilla`: no reuse between requests. Every prompt is prefilled in full, and a request's KV
//! blocks are returned to the free pool, unindexed, when it ends.

use super::Policy;
use crate::serving::kv::GpuEviction;

pub fn policy() -> Policy {
    Policy {
        name: "vanilla".into(),
        base: "vanilla".into(),
        gpu_prefix_cache: false,
        gpu_eviction: GpuEviction::Lru,
        store: None,
    }
}
