//! `mooncake-store`: the Mooncake store as a cluster-wide KV pool behind each engine's GPU
//! prefix cache, Mooncake at commit 3b5a5941 (2026-08-22), as LMCache 0.5.6 configures it
//! for its remote backend.
//!
//! Mirrors:
//! - `mooncake-store/include/replica.h`: `ReplicateConfig { replica_num = 1 }`: one copy of
//!   each object, no replication.
//! - `mooncake-store/src/master.cpp`, `src/master_service.cpp` (`BatchEvict`,
//!   `EvictionThreadFunc`): every client's segment joins one pool that the master places
//!   objects in; eviction removes objects whose read lease has expired, oldest lease first
//!   (about least recently read); `--enable_offload = false` (no SSD tier).
//! - LMCache 0.5.6 `lmcache/v1/storage_backend/connector/mooncakestore_connector.py`:
//!   `global_segment_size = 3355443200` bytes (3.125 GiB) contributed per engine; objects of
//!   LMCache's 256-token chunks (`lmcache/v1/config.py`). `_register_cpu_buffer` registers
//!   LMCache's pinned CPU buffer with Mooncake and `_batch_get_into` reads into it; the
//!   retrieve path (`cache_engine.py` `retrieve`, `storage_manager.batched_get`,
//!   `remote_backend.py` `batched_get_blocking`) waits for every hit chunk in host memory
//!   before `gpu_connectors.py` `batched_to_gpu` copies them to the GPU: a remote read is
//!   staged through the reader's host memory hop after hop (`remote_kv_path = "host-staged"`).
//!
//! As meshsim composes it: the GPU prefix cache, then host memory of scope `cluster` (each
//! node's server holds its engines' segments, and the metadata service plays the master),
//! 256-token chunks, LRU, every chunk admitted, one copy, loads before compute. A chunk is
//! owned by the node that wrote it (Mooncake places it on a random segment by default). Left
//! out: random placement, eviction in batches at a 90 % watermark (5 % at a time), the 10 s
//! lease, soft pins, the optional SSD tier and its count-min-gated promotion, and dynamic
//! replication of hot keys. (vLLM's own `MooncakeStoreConnector` registers the GPU KV cache
//! and reads into it directly, `remote_kv_path = "gpudirect"`: compose it with that key.)

use super::{Policy, Scope, Setting};
use crate::hardware::RemoteKvPath;
use crate::serving::store::LoadOverlap;
use crate::serving::store::eviction::Eviction;

/// LMCache's chunk.
const CHUNK_TOKENS: u32 = 256;
/// The segment each engine contributes (LMCache's `global_segment_size`).
const SEGMENT_BYTES: u64 = 3_355_443_200;

pub fn policy(setting: &Setting) -> Policy {
    let mut p = Policy::host_tier(
        Scope::Cluster,
        CHUNK_TOKENS,
        SEGMENT_BYTES * setting.instances_per_node as u64,
        Eviction::Lru,
        LoadOverlap::None,
    );
    if let Some(s) = p.store.as_mut() {
        s.remote_kv_path = Some(RemoteKvPath::HostStaged);
    }
    p
}
