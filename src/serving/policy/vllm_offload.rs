//! `vllm-offload`: vLLM's native CPU KV offloading (`OffloadingConnector`), vLLM 0.34.0.
//!
//! Mirrors, in the vLLM 0.34.0 source:
//! - `vllm/config/cache.py`: `--kv-offloading-size` (GiB) with the `native` backend sets
//!   `cpu_bytes_to_use`, which has no default (the offload is off without it); the GPU block
//!   size default is 64 tokens (`DEFAULT_BLOCK_SIZE`).
//! - `vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py`: the offloaded unit is
//!   `blocks_per_chunk` GPU blocks, 1 by default: a 64-token chunk.
//! - `vllm/v1/kv_offload/cpu/spec.py`, `cpu/manager.py`, `cpu/policies/lru.py`: one CPU
//!   manager per engine (no sharing between engines), `eviction_policy = "lru"` by default
//!   (`"arc"` the alternative), `store_threshold = 0` (no admission filter).
//! - `.../offloading/scheduler.py`: every newly full chunk is stored, every step (write-through);
//!   `vllm/v1/kv_offload/base.py`: `offload_prompt_only = True` (decode tokens' KV is not).
//! - `vllm/v1/kv_offload/cpu/gpu_worker.py`: a load copies whole chunks, all layers at once
//!   (not layer-wise), and the request waits for it (`WAITING_FOR_REMOTE_KVS`).
//! - `vllm/v1/core/kv_cache_utils.py`: the GPU prefix cache, on by default, LRU.
//!
//! As meshsim composes it: the GPU prefix cache, then host memory of scope `instance`, chunks
//! of 64 tokens, LRU, every chunk admitted, loads before compute (`load_overlap = "none"`).
//! Its capacity is the `[store]` table's `host_capacity_gib` (vLLM has no default to copy).
//! Left out: LRU's tail-before-head order within one request, stores dropped while the CPU
//! pool is pinned by loads, the optional secondary tiers (`TieringOffloadingSpec`).

use super::{Policy, Scope, Setting};
use crate::serving::store::LoadOverlap;
use crate::serving::store::eviction::Eviction;

/// vLLM 0.34.0's default GPU block size, and so its offloaded chunk.
const CHUNK_TOKENS: u32 = 64;

pub fn policy(setting: &Setting) -> Policy {
    Policy::host_tier(
        Scope::Instance,
        CHUNK_TOKENS,
        setting.store.host_capacity_bytes,
        Eviction::Lru,
        LoadOverlap::None,
    )
}
