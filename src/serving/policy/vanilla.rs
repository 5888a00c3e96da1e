//! `vanilla`: no reuse between requests. Every prompt is prefilled in full, and a request's KV
//! blocks are returned to the free pool, unindexed, when it ends.

use super::Policy;
use crate::metrics::Tier;

#[derive(Debug, Clone, Copy)]
pub struct Vanilla;

impl Policy for Vanilla {
    fn name(&self) -> &'static str {
        "vanilla"
    }
    fn lookup_tiers(&self) -> &'static [Tier] {
        &[]
    }
    fn keep_gpu_blocks(&self) -> bool {
        false
    }
}
