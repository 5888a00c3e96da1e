//! `sglang-hicache`: SGLang's hierarchical cache (HiCache), SGLang 0.5.23, as enabled by
//! `--enable-hierarchical-cache` with the other flags at their defaults.
//!
//! Mirrors, in the SGLang 0.5.23 source (paths under `python/sglang/`):
//! - `srt/arg_groups/fields/memory.py`, `srt/arg_groups/hicache_hook.py`: the host pool is
//!   `--hicache-ratio` = 2.0 times the device KV pool, per instance (and TP rank), capped so
//!   that all pools together take at most `--hicache-host-memory-fraction` = 0.8 of host
//!   memory; `--hicache-write-policy = write_through` (a node is backed up to host on its
//!   first insertion); `--hicache-storage-backend` unset (no L3).
//! - `srt/mem_cache/unified_radix_cache.py`, `srt/mem_cache/unified_cache/unified_tree_core.py`:
//!   the GPU radix tree evicts leaves, LRU (`--radix-eviction-policy = lru`); the host pool
//!   evicts leaves LRU under pressure.
//! - `srt/managers/cache_controller.py`: host-to-GPU loads overlap the forward pass layer by
//!   layer.
//!
//! As meshsim composes it: the GPU prefix cache, then host memory of scope `instance` sized as
//! above (for the node: the instances' pools together), chunks of one serving block (the
//! finest meshsim models; SGLang's page is 1 token on CUDA), LRU, every chunk admitted,
//! layer-wise loads. Left out: the KV of output tokens (SGLang inserts them in the tree; not
//! modelled here yet), `write_through_selective` and `write_back`, an L3 storage backend
//! (compose a `scope = "cluster"` policy for a shared one), prefetch timeouts.

use super::{Policy, Scope, Setting};
use crate::serving::store::LoadOverlap;
use crate::serving::store::eviction::Eviction;

/// `--hicache-ratio`'s default in `cache` mode.
const HOST_TO_DEVICE_RATIO: u64 = 2;
/// `--hicache-host-memory-fraction`'s default, in tenths.
const HOST_MEMORY_TENTHS: u64 = 8;

pub fn policy(setting: &Setting) -> Policy {
    let pools = HOST_TO_DEVICE_RATIO * setting.kv_pool_bytes * setting.instances_per_node as u64;
    let cap = setting.host_memory_bytes / 10 * HOST_MEMORY_TENTHS;
    Policy::host_tier(
        Scope::Instance,
        setting.block_size,
        pools.min(cap),
        Eviction::Lru,
        LoadOverlap::Layerwise,
    )
}
