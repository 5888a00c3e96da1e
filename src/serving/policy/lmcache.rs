//! `lmcache`: LMCache in-process (`LMCacheConnectorV1` in vLLM), LMCache 0.5.6, as configured
//! by default.
//!
//! Mirrors, in the LMCache 0.5.6 source:
//! - `lmcache/v1/config.py`: `chunk_size = 256` tokens; `local_cpu = True` with
//!   `max_local_cpu_size = 5.0` GB per LMCache engine, i.e. per vLLM worker process;
//!   `local_disk = None` and `max_local_disk_size = 0.0` (no disk); `remote_url = None` (no
//!   remote backend); `cache_policy = "LRU"`; `save_unfull_chunk = False` (full chunks only);
//!   `save_decode_cache = False` (prompts only); `use_layerwise = False`.
//! - `lmcache/v1/storage_backend/local_cpu_backend.py`, `cache_policy/lru.py`: the CPU
//!   backend evicts least recently used chunks when an allocation fails.
//! - `lmcache/v1/storage_backend/storage_manager.py`: every save goes to every configured
//!   backend (write-through); there is no admission filter.
//! - `lmcache/integration/vllm/vllm_v1_adapter.py`: only tokens beyond the saved prefix are
//!   saved, in whole chunks.
//!
//! As meshsim composes it: vLLM's GPU prefix cache, then host memory of scope `instance`,
//! 5 GiB per engine (the node's capacity is 5 GiB times its engines), 256-token chunks, LRU,
//! every chunk admitted, loads before compute. Left out: the remote backend (`remote_url`:
//! an LMCache server, Redis or Mooncake shared by the cluster; compose it as a `scope =
//! "cluster"` policy), the multi-process mode (one LMCache server per node, vLLM 0.34's
//! default `--kv-offloading-backend lmcache`: `scope = "node"`), per-TP-rank objects.

use super::{Policy, Scope, Setting};
use crate::serving::store::LoadOverlap;
use crate::serving::store::eviction::Eviction;
use crate::units::GIB;

/// `chunk_size`'s default.
const CHUNK_TOKENS: u32 = 256;
/// `max_local_cpu_size`'s default, per engine.
const CPU_BYTES_PER_ENGINE: u64 = 5 * GIB;

pub fn policy(setting: &Setting) -> Policy {
    Policy::host_tier(
        Scope::Instance,
        CHUNK_TOKENS,
        CPU_BYTES_PER_ENGINE * setting.instances_per_node as u64,
        Eviction::Lru,
        LoadOverlap::None,
    )
}
