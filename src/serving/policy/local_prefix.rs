//! `local-prefix`: vLLM-style automatic prefix caching inside each serving instance.
//!
//! A prompt is cut into blocks of `block_size_tokens` (16 by default); a *full* block is
//! identified by the chained hash of its parent block's hash and its own token ids
//! ([`crate::hash::block_hash`]), so equal hashes mean equal prefixes. When a request is
//! admitted, the instance reuses the longest run of leading blocks whose hashes it holds
//! (recomputing at least the prompt's last token, which must produce logits). Blocks no running
//! request references stay indexed in the free pool and are evicted least recently used first
//! when a new block is needed; the capacity is therefore the instance's free KV memory. Only
//! the instance's own GPU is searched: instances do not share blocks.

use super::Policy;
use crate::serving::kv::GpuEviction;

pub fn policy() -> Policy {
    Policy {
        name: "local-prefix".into(),
        base: "local-prefix".into(),
        gpu_prefix_cache: true,
        gpu_eviction: GpuEviction::Lru,
        store: None,
    }
}
