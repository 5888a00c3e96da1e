//! The instance's block pool in the eviction order its policy chose (`gpu_eviction`): the
//! segment pool for LRU, the ordered pool for LFU and S3-FIFO (see the module doc of
//! [`super`]).

use super::BlockPool;
use super::blocks::Blocks;
use super::ordered::OrderedPool;
use super::prompt_hashes::ChainHashes;
use crate::actor::Hot;
use crate::metrics::PoolStats;
use crate::serving::msg::KvEvent;

/// The order in which the GPU prefix cache evicts free registered blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuEviction {
    /// Least recently used first: vLLM's automatic prefix caching ([`BlockPool`]).
    #[default]
    Lru,
    /// Fewest accesses first, then least recently used ([`OrderedPool`]).
    Lfu,
    /// S3-FIFO ([`OrderedPool`]).
    S3Fifo,
}

/// A serving instance's KV block pool: the same calls, answered by the pool of its order.
/// The segment pool, the default and on every step's path, is in place (boxed, each call
/// would read a pointer first); the ordered pool is boxed.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum GpuPool {
    Lru(BlockPool),
    Ordered(Box<OrderedPool>),
}

/// Calls the same method on whichever pool it is.
macro_rules! each {
    ($self:expr, $p:ident => $call:expr) => {
        match $self {
            GpuPool::Lru($p) => $call,
            GpuPool::Ordered($p) => $call,
        }
    };
}

impl GpuPool {
    /// A pool of `num_blocks` blocks, with prefix caching or without, whose blocks have ids
    /// (for a backend that keeps KV by block) or are only counted, evicting in `order`. The
    /// ordered pool keeps ids always, and caches: a pool without caching evicts nothing, and
    /// is the segment pool whatever the order (the scenario refuses another order there).
    pub fn new(num_blocks: u32, caching: bool, keep_ids: bool, order: GpuEviction) -> GpuPool {
        if order == GpuEviction::Lru || !caching {
            GpuPool::Lru(BlockPool::new(num_blocks, caching, keep_ids))
        } else {
            GpuPool::Ordered(Box::new(OrderedPool::new(num_blocks, order)))
        }
    }

    #[inline]
    pub fn num_blocks(&self) -> u32 {
        each!(self, p => p.num_blocks())
    }

    /// `hot` with what the pool's next allocation reads (see [`BlockPool::hint`]; nothing
    /// for the ordered pool).
    #[inline]
    pub fn hint(&self, hot: Hot) -> Hot {
        match self {
            GpuPool::Lru(p) => p.hint(hot),
            GpuPool::Ordered(_) => hot,
        }
    }

    /// Free blocks (including free blocks that still hold a registered prefix).
    #[inline]
    pub fn free_blocks(&self) -> u32 {
        each!(self, p => p.free_blocks())
    }

    /// Number of registered blocks (in use or free).
    #[cfg(test)]
    #[inline]
    pub fn cached_blocks(&self) -> usize {
        each!(self, p => p.cached_blocks())
    }

    /// Registered blocks in use (for the instance's checks).
    #[inline]
    pub fn held_registered(&self) -> u32 {
        each!(self, p => p.held_registered())
    }

    /// The longest run of the first `upto` of `hashes` that are registered, and how many of
    /// those are free.
    #[inline]
    pub fn longest_cached_prefix(&self, hashes: &ChainHashes, upto: usize) -> (u32, u32) {
        each!(self, p => p.longest_cached_prefix(hashes, upto))
    }

    /// Takes a reference on the blocks registered under the first `upto` of `hashes`.
    #[inline]
    pub fn take_cached(&mut self, hashes: &ChainHashes, upto: usize, blocks: &mut Blocks) {
        each!(self, p => p.take_cached(hashes, upto, blocks))
    }

    /// Allocates `n` fresh blocks, evicting as the order says; nothing if fewer are free.
    #[inline]
    pub fn allocate(&mut self, n: u32, blocks: &mut Blocks) -> bool {
        each!(self, p => p.allocate(n, blocks))
    }

    /// Drops the sequence's reference on each of its blocks and empties `blocks`.
    #[inline]
    pub fn release(&mut self, blocks: &mut Blocks) {
        each!(self, p => p.release(blocks))
    }

    /// Registers the sequence's blocks `from..upto` under their hashes.
    #[inline]
    pub fn register_all(
        &mut self,
        blocks: &mut Blocks,
        hashes: &ChainHashes,
        upto: usize,
        from: usize,
    ) {
        each!(self, p => p.register_all(blocks, hashes, upto, from))
    }

    /// From now on, the pool keeps the blocks it registers and evicts as KV events, for
    /// [`Self::take_events`].
    pub fn publish_events(&mut self) {
        match self {
            GpuPool::Lru(p) => p.events = Some(Vec::new()),
            GpuPool::Ordered(p) => p.events = Some(Vec::new()),
        }
    }

    /// The KV events since the last call (none unless [`Self::publish_events`]), moved into
    /// `out`.
    pub fn take_events(&mut self, out: &mut Vec<KvEvent>) {
        let events = match self {
            GpuPool::Lru(p) => p.events.as_mut(),
            GpuPool::Ordered(p) => p.events.as_mut(),
        };
        if let Some(e) = events {
            out.append(e);
        }
    }

    /// Checks the pool's invariants.
    #[inline]
    pub fn check(&self) -> Result<(), String> {
        each!(self, p => p.check())
    }

    /// The pool's counters.
    #[inline]
    pub fn stats(&self) -> PoolStats {
        each!(self, p => p.stats)
    }
}
