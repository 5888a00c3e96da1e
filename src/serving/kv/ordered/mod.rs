//! The block pool for the GPU prefix cache's other eviction orders: LFU and S3-FIFO
//! (`gpu_eviction`; LRU, the default, is [`super::BlockPool`]).
//!
//! **The model.** The pool holds `num_blocks` blocks, block by block: each has a record (its
//! holders, the hash it is registered under if any, and its access history) once an
//! allocation first touches it. A full prompt block is *registered* under its chained hash once
//! its KV is computed (a block whose hash another block holds stays unregistered: that one
//! holds identical KV); a registered block stays findable, in use or free, until it is
//! *evicted*. A lookup finds the longest run of a prompt's leading blocks that are registered
//! (the first missing block ends it), and taking them pins them: a block in use is never
//! evicted. An allocation takes free blocks that hold no hash first (released unregistered
//! blocks, most recent first, then untouched ones in id order), and only then evicts free
//! registered blocks, one at a time, in the order the policy chose:
//!
//! - **LFU** (SGLang's radix cache, `--radix-eviction-policy lfu`: entries evicted by
//!   `(hit_count, last_access_time)`): the free registered block of fewest accesses goes
//!   first, the least recently used of those first, then the lowest hash (so the order is
//!   total and a run is deterministic). Registration is a block's first access and every hit
//!   (a lookup that takes it) one more; counts never age. A block's last use is its release:
//!   its KV is read by every iteration of the sequences that hold it, until the last of them
//!   lets it go (SGLang likewise stamps a finished request's path when it inserts it). A
//!   sequence releases its blocks last block first, so at equal counts a prompt's early
//!   blocks are the more recent and outlive its tail, as in the LRU pool and as SGLang's
//!   leaf-first eviction has it.
//! - **S3-FIFO** (Yang et al., SOSP 2023, as libCacheSim's `S3FIFO.c`), the store's queue
//!   ([`crate::serving::store::eviction`]) over block hashes, with a capacity of `num_blocks`
//!   entries: a small FIFO of 10 % of it, a main FIFO, a ghost of the hashes last evicted from
//!   the small FIFO (as many as the main FIFO's share), 2-bit counters raised by every hit, a
//!   move to the main FIFO at a counter of 2. A registration is the insert; a block in use is
//!   *hidden*: it keeps its place and counter, and the scans pass over it in place.
//!
//! **What differs from the published algorithms, and why.** They manage a cache whose every
//! entry can go; here room is shared with KV that is never cached (decode blocks, a prompt's
//! partial last block, blocks whose hash another block holds) and blocks in use cannot go.
//! So: eviction happens only when an allocation finds no free block without a hash (not when
//! a count of cached entries reaches the capacity), and sizes count every registered block,
//! in use or free, as the store's S3-FIFO counts hidden entries. S3-FIFO's scans pass over
//! blocks in use in place, and when the list it picks holds no free block the other gives the
//! victim (the store's conventions, see its module doc); an insert is classified by the ghost
//! when the block is registered, after the allocation that made its room (only then is it
//! known to be inserted at all: another sequence may register the same hash first). Neither
//! order keeps a tree: a block is evicted whatever the blocks after it in its chain (they
//! stay registered, unreachable by lookups, until they are evicted in turn), where SGLang's
//! radix cache evicts only leaves; under LFU the release order above makes a chain lose its
//! tail first at equal counts, and S3-FIFO gives no such guarantee.
//!
//! **Cost.** Block by block, unlike [`super::BlockPool`]'s segments: a lookup, a hit, an
//! allocation and a release touch every block, with an ordered set (LFU) or the store's
//! queue (S3-FIFO) at O(log n) an operation. A record is 32 bytes a touched block (830 MB for
//! the 26 M blocks of a cluster of 2,240 GPUs), and a registered block has an entry in the
//! hash index and in the order's set or queue besides. It is not the default: the default
//! pool stays the segment one.

mod check;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};

use super::blocks::{Blocks, Piece};
use super::prompt_hashes::ChainHashes;
use super::{BlockId, GpuEviction, NONE};
use crate::hash::IdBuildHasher;
use crate::metrics::PoolStats;
use crate::serving::msg::KvEvent;
use crate::serving::store::eviction::{Eviction, EvictionQueue};

/// A touched block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Block {
    /// The hash it is registered under.
    hash: Option<u64>,
    /// Sequences that hold it.
    refs: u32,
    /// LFU: accesses since it was registered (1 at registration, one more a hit).
    hits: u32,
    /// LFU: the tick at which it was last released by its last holder.
    freed: u64,
}

impl Block {
    /// Its key in LFU's set of free registered blocks.
    fn lfu_key(&self, hash: u64) -> (u32, u64, u64) {
        (self.hits, self.freed, hash)
    }
}

/// The eviction order's state.
#[derive(Debug)]
enum Order {
    /// The free registered blocks' keys (fewest accesses, least recently released, lowest
    /// hash): the first goes first.
    Lfu(BTreeSet<(u32, u64, u64)>),
    /// Every registered block's hash, those in use hidden.
    S3Fifo(Box<EvictionQueue>),
}

/// A fixed pool of KV blocks evicting in LFU or S3-FIFO order (see the module doc).
#[derive(Debug)]
pub struct OrderedPool {
    num_blocks: u32,
    /// Records of the touched blocks, by id: ids from `blocks.len()` on are untouched.
    blocks: Vec<Block>,
    /// Free touched blocks that hold no hash, most recently released last.
    plain: Vec<BlockId>,
    /// Hash -> the block registered under it.
    index: HashMap<u64, BlockId, IdBuildHasher>,
    order: Order,
    /// Registered blocks that no sequence holds.
    free_cached: u32,
    /// Releases of registered blocks so far (LFU's clock of last use).
    tick: u64,
    pub stats: PoolStats,
    /// With KV events on: the blocks registered and evicted since they were last taken.
    pub(crate) events: Option<Vec<KvEvent>>,
}

impl OrderedPool {
    /// A pool of `num_blocks` blocks evicting in `order` (not LRU: that is
    /// [`super::BlockPool`]).
    pub fn new(num_blocks: u32, order: GpuEviction) -> OrderedPool {
        assert!(
            num_blocks > 0 && num_blocks < NONE,
            "block count out of range"
        );
        let order = match order {
            GpuEviction::Lfu => Order::Lfu(BTreeSet::new()),
            GpuEviction::S3Fifo => Order::S3Fifo(Box::new(EvictionQueue::with_capacity(
                Eviction::S3Fifo,
                num_blocks as u64,
            ))),
            GpuEviction::Lru => panic!("the LRU order is the segment pool's"),
        };
        OrderedPool {
            num_blocks,
            blocks: Vec::new(),
            plain: Vec::new(),
            index: HashMap::default(),
            order,
            free_cached: 0,
            tick: 0,
            stats: PoolStats::default(),
            events: None,
        }
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    fn untouched(&self) -> u32 {
        self.num_blocks - self.blocks.len() as u32
    }

    /// Free blocks (including free blocks that still hold a registered prefix).
    pub fn free_blocks(&self) -> u32 {
        self.plain.len() as u32 + self.untouched() + self.free_cached
    }

    /// Number of registered blocks (in use or free).
    pub fn cached_blocks(&self) -> usize {
        self.index.len()
    }

    /// Registered blocks in use.
    pub fn held_registered(&self) -> u32 {
        self.index.len() as u32 - self.free_cached
    }

    /// The registered hashes, in increasing order (for tests).
    #[cfg(test)]
    pub(crate) fn cached_hashes(&self) -> Vec<u64> {
        let mut h: Vec<u64> = self.index.keys().copied().collect();
        h.sort_unstable();
        h
    }

    /// The longest run of the first `upto` of `hashes` (a prompt's chain, from its first
    /// block) that are registered, and how many of those are free.
    pub fn longest_cached_prefix(&self, hashes: &ChainHashes, upto: usize) -> (u32, u32) {
        let (mut hits, mut free) = (0, 0);
        for i in 0..upto.min(hashes.len()) {
            let Some(&b) = self.index.get(&hashes.get(i)) else {
                break;
            };
            hits += 1;
            free += u32::from(self.blocks[b as usize].refs == 0);
        }
        (hits, free)
    }

    /// Takes a reference on the blocks registered under the first `upto` of `hashes` (a
    /// prompt's chain from its first block; all must be registered) and appends them to
    /// `blocks`, which must hold none yet: each is a hit.
    pub fn take_cached(&mut self, hashes: &ChainHashes, upto: usize, blocks: &mut Blocks) {
        assert!(blocks.is_empty(), "hits come first");
        assert!(upto <= hashes.len(), "hashes for every block taken");
        for i in 0..upto {
            let h = hashes.get(i);
            let b = *self
                .index
                .get(&h)
                .expect("take_cached takes registered blocks");
            let blk = &mut self.blocks[b as usize];
            if blk.refs == 0 {
                self.free_cached -= 1;
                match &mut self.order {
                    Order::Lfu(free) => {
                        let gone = free.remove(&blk.lfu_key(h));
                        debug_assert!(gone, "a free registered block is a candidate");
                    }
                    Order::S3Fifo(q) => q.set_hidden(h, true),
                }
            }
            blk.refs += 1;
            blk.hits = blk.hits.saturating_add(1);
            if let Order::S3Fifo(q) = &mut self.order {
                q.touch(h, self.tick);
            }
            blocks.ids.push(b);
        }
        if upto > 0 {
            blocks.push_piece(Piece {
                seg: NONE,
                at: 0,
                n: upto as u32,
            });
        }
        blocks.n += upto as u32;
        self.stats.hit_blocks += upto as u64;
    }

    /// Allocates `n` fresh blocks (free blocks without a hash first, then evicting free
    /// registered blocks in the pool's order) and appends them to `blocks`; allocates nothing
    /// and returns false if fewer are free.
    pub fn allocate(&mut self, n: u32, blocks: &mut Blocks) -> bool {
        if n > self.free_blocks() {
            return false;
        }
        for _ in 0..n {
            let b = match self.plain.pop() {
                Some(b) => b,
                None if self.untouched() > 0 => {
                    self.blocks.push(Block::default());
                    self.blocks.len() as BlockId - 1
                }
                None => self.evict(),
            };
            self.blocks[b as usize].refs = 1;
            blocks.ids.push(b);
        }
        blocks.n += n;
        true
    }

    /// Evicts the first free registered block in the pool's order and returns it, hashless.
    fn evict(&mut self) -> BlockId {
        let h = match &mut self.order {
            Order::Lfu(free) => free.pop_first().map(|(_, _, h)| h),
            // Blocks in use are hidden: every shown entry is free.
            Order::S3Fifo(q) => q.pop_first_where(|_| true),
        };
        // The free count held a registered block when no other free block was left.
        let h = h.expect("a free registered block to evict");
        let b = self
            .index
            .remove(&h)
            .expect("an evicted hash is registered");
        self.blocks[b as usize] = Block::default();
        if let Some(events) = &mut self.events {
            events.push(KvEvent::Removed(h));
        }
        self.free_cached -= 1;
        self.stats.evictions += 1;
        b
    }

    /// Drops the sequence's reference on each of its blocks, last block first, and empties
    /// `blocks`: a block no sequence holds any more is free, and keeps its hash if it has one.
    pub fn release(&mut self, blocks: &mut Blocks) {
        assert_eq!(
            blocks.ids.len(),
            blocks.len(),
            "an ordered pool's blocks have ids"
        );
        for &b in blocks.ids.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            assert!(blk.refs > 0, "block {b} released twice");
            blk.refs -= 1;
            if blk.refs > 0 {
                continue;
            }
            let Some(h) = blk.hash else {
                self.plain.push(b);
                continue;
            };
            self.free_cached += 1;
            self.tick += 1;
            blk.freed = self.tick;
            match &mut self.order {
                Order::Lfu(free) => {
                    free.insert(blk.lfu_key(h));
                }
                Order::S3Fifo(q) => q.set_hidden(h, false),
            }
        }
        blocks.ids.clear();
        blocks.n = 0;
        blocks.clear_pieces();
    }

    /// Registers the sequence's blocks under `hashes.get(i)` (its prompt's chain from its
    /// first block) for every `i` from `from` to `upto`, once their KV is computed. A block
    /// registered already (a hit) stays as it is; a block whose hash another block holds stays
    /// unregistered (that one holds identical KV).
    pub fn register_all(
        &mut self,
        blocks: &mut Blocks,
        hashes: &ChainHashes,
        upto: usize,
        from: usize,
    ) {
        assert!(upto <= hashes.len(), "a hash for every block registered");
        assert!(upto <= blocks.len(), "a block for every hash");
        for i in from..upto {
            let b = blocks.ids[i];
            let h = hashes.get(i);
            if self.blocks[b as usize].hash.is_some() || self.index.contains_key(&h) {
                continue;
            }
            self.index.insert(h, b);
            if let Some(events) = &mut self.events {
                events.push(KvEvent::Stored(h));
            }
            let blk = &mut self.blocks[b as usize];
            debug_assert!(blk.refs > 0, "a sequence holds the blocks it registers");
            (blk.hash, blk.hits) = (Some(h), 1);
            if let Order::S3Fifo(q) = &mut self.order {
                q.insert(h, 1, 0.0, self.tick);
                q.set_hidden(h, true);
            }
            // Its registered blocks, as pieces in prompt order (what `Blocks::own` counts).
            match blocks.last_piece_mut() {
                Some(p) if (p.at + p.n) as usize == i => p.n += 1,
                _ => blocks.push_piece(Piece {
                    seg: NONE,
                    at: i as u32,
                    n: 1,
                }),
            }
        }
    }
}
