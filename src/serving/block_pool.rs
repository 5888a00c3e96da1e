//! The KV-cache block pool of a serving instance, with vLLM's automatic prefix caching.
//!
//! The instance's KV memory is cut into fixed blocks of `block_size` tokens. A block is either
//! *in use* (reference count > 0: running sequences hold it) or *free*. Free blocks sit in one
//! queue, least recently used at the head. With caching on, a full prompt block is *registered*
//! under its chained hash once its KV is computed; when it becomes free it keeps its hash and
//! stays findable until it is reused for something else. Allocation pops the head of the free
//! queue and, if that block was registered, *evicts* it (drops its hash). A sequence releases
//! its blocks in reverse order, so its last blocks sit nearer the head and go first: the early
//! blocks of a prompt are the ones other prompts are most likely to share.
//!
//! Every operation is O(1) per block: the free queue is an intrusive doubly linked list over
//! block indices, and the hash index is a map keyed by the (already mixed) block hash.

use std::collections::HashMap;

use crate::hash::IdBuildHasher;
use crate::metrics::PoolStats;

pub type BlockId = u32;
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Block {
    refs: u32,
    /// Registered hash, if any.
    hash: Option<u64>,
    prev: u32,
    next: u32,
}

/// A fixed pool of KV blocks.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    free: u32,
    index: HashMap<u64, BlockId, IdBuildHasher>,
    caching: bool,
    pub stats: PoolStats,
}

impl BlockPool {
    pub fn new(num_blocks: u32, caching: bool) -> BlockPool {
        assert!(
            num_blocks > 0 && num_blocks < NIL,
            "block count out of range"
        );
        let blocks = (0..num_blocks)
            .map(|i| Block {
                refs: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks { NIL } else { i + 1 },
            })
            .collect();
        BlockPool {
            blocks,
            head: 0,
            tail: num_blocks - 1,
            free: num_blocks,
            index: HashMap::default(),
            caching,
            stats: PoolStats::default(),
        }
    }

    pub fn num_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Free blocks (including free blocks that still hold a registered prefix).
    pub fn free_blocks(&self) -> u32 {
        self.free
    }

    /// Number of registered blocks (in use or free).
    #[cfg(test)]
    pub fn cached_blocks(&self) -> usize {
        self.index.len()
    }

    /// The longest run of leading `hashes` that are registered, and how many of those are free.
    pub fn longest_cached_prefix(&self, hashes: &[u64]) -> (u32, u32) {
        if !self.caching {
            return (0, 0);
        }
        let mut hits = 0;
        let mut free = 0;
        for h in hashes {
            match self.index.get(h) {
                Some(&b) => {
                    hits += 1;
                    free += (self.blocks[b as usize].refs == 0) as u32;
                }
                None => break,
            }
        }
        (hits, free)
    }

    /// Takes a reference on the blocks registered under `hashes` (all must be registered) and
    /// appends them to `out`.
    pub fn take_cached(&mut self, hashes: &[u64], out: &mut Vec<BlockId>) {
        for h in hashes {
            let b = self.index[h];
            if self.blocks[b as usize].refs == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].refs += 1;
            out.push(b);
        }
        self.stats.hit_blocks += hashes.len() as u64;
    }

    /// Allocates `n` fresh blocks (evicting registered free blocks, least recently used first)
    /// and appends them to `out`; allocates nothing and returns false if fewer are free.
    pub fn allocate(&mut self, n: u32, out: &mut Vec<BlockId>) -> bool {
        if n > self.free {
            return false;
        }
        for _ in 0..n {
            let b = self.head;
            self.unlink(b);
            let block = &mut self.blocks[b as usize];
            if let Some(h) = block.hash.take() {
                self.index.remove(&h);
                self.stats.evictions += 1;
            }
            block.refs = 1;
            out.push(b);
        }
        true
    }

    /// Drops one reference on each block, last block first; unreferenced blocks join the tail
    /// of the free queue (most recently used), keeping their hash if they have one.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            let block = &mut self.blocks[b as usize];
            assert!(block.refs > 0, "block {b} released twice");
            block.refs -= 1;
            if block.refs == 0 {
                if !self.caching {
                    block.hash = None;
                }
                self.push_tail(b);
            }
        }
    }

    /// Registers a full block under `hash` once its KV is computed. If another block already
    /// holds the same prefix, the index keeps that one (both hold identical KV).
    pub fn register(&mut self, b: BlockId, hash: u64) {
        if !self.caching || self.blocks[b as usize].hash.is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.index.entry(hash) {
            e.insert(b);
            self.blocks[b as usize].hash = Some(hash);
        }
    }

    fn unlink(&mut self, b: BlockId) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.blocks[b as usize].prev = NIL;
        self.blocks[b as usize].next = NIL;
        self.free -= 1;
    }

    fn push_tail(&mut self, b: BlockId) {
        self.blocks[b as usize].prev = self.tail;
        self.blocks[b as usize].next = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.blocks[self.tail as usize].next = b;
        }
        self.tail = b;
        self.free += 1;
    }

    /// Checks the pool's invariants (for tests and debug runs): the free queue holds exactly
    /// the unreferenced blocks, and the index points at blocks that carry its hash.
    pub fn check(&self) -> Result<(), String> {
        let mut n = 0;
        let mut b = self.head;
        let mut prev = NIL;
        while b != NIL {
            let block = &self.blocks[b as usize];
            if block.refs != 0 {
                return Err(format!("block {b} is free with {} references", block.refs));
            }
            if block.prev != prev {
                return Err(format!("block {b} has a broken back link"));
            }
            n += 1;
            if n > self.blocks.len() {
                return Err("free queue has a cycle".into());
            }
            prev = b;
            b = block.next;
        }
        let unreferenced = self.blocks.iter().filter(|b| b.refs == 0).count();
        if n != unreferenced || n != self.free as usize {
            return Err(format!(
                "free queue holds {n}, counter says {}, unreferenced blocks {unreferenced}",
                self.free
            ));
        }
        for (h, &b) in &self.index {
            if self.blocks[b as usize].hash != Some(*h) {
                return Err(format!(
                    "index maps {h:#x} to block {b} which does not hold it"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_blocks_are_found_after_release_until_evicted_lru_first() {
        let mut pool = BlockPool::new(4, true);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        pool.register(a[0], 10);
        pool.register(a[1], 11);
        pool.release(&a);
        assert_eq!(pool.longest_cached_prefix(&[10, 11, 12]), (2, 2));

        let mut b = Vec::new();
        assert!(pool.allocate(2, &mut b));
        pool.register(b[0], 20);
        pool.register(b[1], 21);
        pool.release(&b);
        // Free queue, LRU first: [a1, a0, b1, b0] (each sequence releases last block first).
        let mut c = Vec::new();
        assert!(pool.allocate(1, &mut c));
        assert_eq!(c, [a[1]]);
        assert_eq!(pool.stats.evictions, 1);
        assert_eq!(pool.longest_cached_prefix(&[10, 11]), (1, 1));
        assert_eq!(pool.longest_cached_prefix(&[20, 21]), (2, 2));
        pool.check().unwrap();
    }

    #[test]
    fn a_hit_takes_the_block_out_of_the_free_queue_and_makes_it_recent() {
        let mut pool = BlockPool::new(3, true);
        let mut a = Vec::new();
        assert!(pool.allocate(3, &mut a));
        for (i, &b) in a.iter().enumerate() {
            pool.register(b, 100 + i as u64);
        }
        pool.release(&a);
        let mut held = Vec::new();
        pool.take_cached(&[100], &mut held);
        assert_eq!(held, [a[0]]);
        assert_eq!(pool.free_blocks(), 2);
        pool.release(&held);
        // a0 is now the most recent: the next two allocations evict a2 then a1.
        let mut fresh = Vec::new();
        assert!(pool.allocate(2, &mut fresh));
        assert_eq!(fresh, [a[2], a[1]]);
        assert_eq!(pool.longest_cached_prefix(&[100, 101]), (1, 1));
        pool.check().unwrap();
    }

    #[test]
    fn allocation_is_all_or_nothing_and_capacity_is_never_exceeded() {
        let mut pool = BlockPool::new(4, false);
        let mut a = Vec::new();
        assert!(pool.allocate(3, &mut a));
        assert!(!pool.allocate(2, &mut a));
        assert_eq!(a.len(), 3);
        assert_eq!(pool.free_blocks(), 1);
        pool.register(a[0], 1);
        assert_eq!(pool.cached_blocks(), 0, "caching off registers nothing");
        pool.release(&a);
        assert_eq!(pool.free_blocks(), 4);
        pool.check().unwrap();
    }

    #[test]
    fn shared_blocks_are_freed_only_by_their_last_holder() {
        let mut pool = BlockPool::new(2, true);
        let mut a = Vec::new();
        assert!(pool.allocate(1, &mut a));
        pool.register(a[0], 7);
        let mut b = Vec::new();
        pool.take_cached(&[7], &mut b);
        pool.release(&a);
        assert_eq!(pool.free_blocks(), 1);
        pool.release(&b);
        assert_eq!(pool.free_blocks(), 2);
        pool.check().unwrap();
    }
}
