//! `dynamo-kvbm`: NVIDIA Dynamo's KV Block Manager (KVBM) under vLLM, Dynamo 1.2.0 (the v1
//! connector, `kvbm.vllm_integration.connector.DynamoConnector`, the documented default),
//! with its CPU tier (G2) on and the rest at its defaults.
//!
//! Mirrors, in the Dynamo source (`lib/bindings/kvbm/` and `lib/llm/src/block_manager/`):
//! - `distributed/leader.rs`: the tiers are sized by `DYN_KVBM_CPU_CACHE_GB` and
//!   `DYN_KVBM_DISK_CACHE_GB`, both 0 when unset, and KVBM refuses to start with no tier: a
//!   deployment must name the CPU tier's size, so the preset takes the `[store]` table's
//!   `host_capacity_gib` (KVBM's guide asks for at least the GPU KV cache). The disk tier
//!   (G3) stays off, as its default. One leader per engine (`connector_leader.py`): the
//!   pools are the engine's, never shared between engines or nodes.
//! - `vllm/connector_worker.py`: KVBM's page is vLLM's block (`page_size =
//!   cache_config.block_size`): chunks of one serving block.
//! - `vllm/connector/leader/slot.rs`: every newly completed full block is offloaded to the CPU
//!   tier, write-through, with no admission filter (the disk tier's frequency filter,
//!   `FrequencyFilter::new(2, 600 s, ..)`, applies only to G2 to G3); lookups match a
//!   contiguous prefix, CPU tier first.
//! - `pool/managed/inactive.rs`: a tier evicts its inactive blocks by `(priority,
//!   returned_tick)`: with every block at one priority, least recently used first.
//! - `connector/leader.rs`, `dynamo_connector.py`: matched blocks are onboarded
//!   asynchronously before the request is scheduled to compute (`wait_for_layer_load` does
//!   nothing): no layer-wise overlap, and no choice between loading and recomputing.
//!
//! As meshsim composes it: the GPU prefix cache, then host memory of scope `instance` with the
//! `[store]` capacity, chunks of one serving block, LRU, every chunk admitted, loads before
//! compute (`load_overlap = "none"`). Left out: decode tokens' blocks (KVBM offloads them
//! too; meshsim stores prompts only), the disk tier with its frequency filter (compose
//! `ssd_capacity_gb` for it), the object-store and peer tiers (G4, opt-in), the last block of a
//! whole-prompt match being recomputed, offloads dropped while the CPU tier is full of blocks
//! in use, and the transfer engine's concurrency limits.

use super::{Policy, Scope, Setting};
use crate::serving::store::LoadOverlap;
use crate::serving::store::eviction::Eviction;

pub fn policy(setting: &Setting) -> Policy {
    Policy::host_tier(
        Scope::Instance,
        setting.block_size,
        setting.store.host_capacity_bytes,
        Eviction::Lru,
        LoadOverlap::None,
    )
}
