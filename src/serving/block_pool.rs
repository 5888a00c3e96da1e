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
//! block indices. Releases and registrations ask for the block records they will touch a few
//! blocks ahead, so that the cache misses of a cold pool overlap.
//!
//! **Chains, not one index entry per block.** Hashes are chained (a block's hash names its
//! whole prefix), and a prompt registers its blocks in order, so a registered block keeps a
//! link (`next`) to the block registered after it by the same sequence; only a block that
//! cannot be linked (the first of a prompt, the first after a block another sequence holds
//! the hash of, or one whose predecessor already links elsewhere) gets an entry in the hash
//! index ([`BlockIndex`]), which is therefore small (a few entries per prompt) and stays in
//! the cache. The registered block of a chain's `i`-th hash is the link of the registered
//! block of its `i-1`-th hash, if that link holds the hash, or else the index's entry
//! ([`BlockPool::find`]). Why the link is always there when it must be: a link `P -> B` is
//! made only when the registering sequence holds `P`, and every later holder of `B` took it
//! as a hit through `P`; so whoever holds `B` holds `P`, a sequence releases its last blocks
//! first, and `B` is always evicted before `P`. While `B` is registered, `P` is, and `P`'s
//! link is not moved (a link is only replaced when its block is no longer registered). An
//! eviction only clears the block's record: its index slot goes stale (see [`BlockIndex`]),
//! its predecessor's link points at a block that no longer holds the hash, and both are
//! skipped by every lookup, which checks a candidate block's record against the hash it
//! wants. The pool's differential test checks every answer against a pool with a map of
//! every registered hash.
//!
//! **Memory and speed.** A pool starts with every block free and untouched, in id order at the
//! head of the queue; nothing is ever queued ahead of an untouched block (released blocks join
//! the tail, and only registered blocks, which were touched, leave from the middle). So the
//! untouched blocks are kept implicitly, as the ids from `blocks.len()` up to `num_blocks`,
//! and a block's record is made when it is first allocated: a pool costs memory for the
//! blocks it has used, not for the whole KV memory of its GPU (a cluster of 2,240 GPUs has 26 M
//! blocks). Without caching, no block carries a hash or is shared, so which free block an
//! allocation gets changes nothing that can be observed: free blocks then sit on a stack (the
//! most recently released taken first), and blocks keep no record at all.

use super::block_index::BlockIndex;
use crate::metrics::PoolStats;
use crate::sim::prefetch;

/// How many blocks ahead a run of operations asks for the block records it will touch.
const AHEAD: usize = 16;

pub type BlockId = u32;
/// The bits of `Block::link` that hold a block id; all ones is no block.
const ID: u32 = (1 << 30) - 1;
const NIL: u32 = ID;
/// `Block::link`: the block is in use (`word` counts its references).
const USED: u32 = 1 << 31;
/// `Block::link`: the block is registered under `hash`.
const REGISTERED: u32 = 1 << 30;

/// A block's record: 16 bytes, four to a cache line. A free block needs its queue links and no
/// reference count, a block in use the count and no links, so one word serves both; block ids
/// fit in 30 bits (instances have at most 2^24 blocks, see
/// [`crate::serving::scenario::MAX_BLOCKS_PER_INSTANCE`]), which leaves two flag bits.
#[derive(Clone, Copy, Debug)]
struct Block {
    /// Registered hash, if `REGISTERED`.
    hash: u64,
    /// In use: its references. Free: the previous block of the free queue (`NIL` at the head).
    word: u32,
    /// The next block of the free queue (`NIL` at the tail and while in use), and the flags.
    link: u32,
}

impl Block {
    /// A block taken from the untouched ones by an allocation.
    const ALLOCATED: Block = Block {
        hash: 0,
        word: 1,
        link: USED | NIL,
    };

    fn hash(&self) -> Option<u64> {
        self.registered().then_some(self.hash)
    }

    fn registered(&self) -> bool {
        self.link & REGISTERED != 0
    }

    fn used(&self) -> bool {
        self.link & USED != 0
    }

    fn refs(&self) -> u32 {
        if self.used() { self.word } else { 0 }
    }

    fn next(&self) -> u32 {
        self.link & ID
    }

    fn set_next(&mut self, next: u32) {
        self.link = (self.link & !ID) | next;
    }

    fn set_registered(&mut self, hash: Option<u64>) {
        match hash {
            Some(h) => {
                self.hash = h;
                self.link |= REGISTERED;
            }
            None => self.link &= !REGISTERED,
        }
    }
}

/// A fixed pool of KV blocks.
#[derive(Debug)]
pub struct BlockPool {
    /// The blocks used so far, by id (with caching on; without, blocks have no record).
    blocks: Vec<Block>,
    /// Each used block's link: the block registered after it in its chain (`NIL`: none),
    /// meaningful while both are registered (see the module doc).
    next: Vec<BlockId>,
    /// Blocks allocated at least once: ids from `touched` to `num_blocks` are untouched.
    touched: u32,
    num_blocks: u32,
    /// The free queue's touched blocks (behind the untouched ones), with caching on.
    head: u32,
    tail: u32,
    /// Free touched blocks, most recently released last, with caching off.
    stack: Vec<BlockId>,
    free: u32,
    index: BlockIndex,
    caching: bool,
    pub stats: PoolStats,
}

impl BlockPool {
    pub fn new(num_blocks: u32, caching: bool) -> BlockPool {
        assert!(
            num_blocks > 0 && num_blocks < NIL,
            "block count out of range"
        );
        BlockPool {
            // Reserved, not written: the system maps the pages that allocations touch.
            blocks: if caching {
                Vec::with_capacity(num_blocks as usize)
            } else {
                Vec::new()
            },
            next: if caching {
                Vec::with_capacity(num_blocks as usize)
            } else {
                Vec::new()
            },
            touched: 0,
            num_blocks,
            head: NIL,
            tail: NIL,
            // Reserved, not written, as `blocks`: the stack never grows by copying.
            stack: if caching {
                Vec::new()
            } else {
                Vec::with_capacity(num_blocks as usize)
            },
            free: num_blocks,
            index: BlockIndex::new(if caching { num_blocks as usize } else { 0 }),
            caching,
            stats: PoolStats::default(),
        }
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// Free blocks (including free blocks that still hold a registered prefix).
    pub fn free_blocks(&self) -> u32 {
        self.free
    }

    /// Number of registered blocks (in use or free).
    #[cfg(test)]
    pub fn cached_blocks(&self) -> usize {
        self.blocks.iter().filter(|b| b.registered()).count()
    }

    /// Untouched blocks: the head of the free queue.
    fn untouched(&self) -> u32 {
        self.num_blocks - self.touched
    }

    /// The block registered under `h`, given `prev`, the block registered under the hash
    /// before `h` in its chain (`None` at a chain's start, or if no block holds it): `prev`'s
    /// link, if that holds `h`, or else the index's entry (see the module doc).
    #[inline]
    fn find(&self, prev: Option<BlockId>, h: u64) -> Option<BlockId> {
        if let Some(p) = prev {
            let t = self.next[p as usize];
            if t != NIL && self.holds(t, h) {
                return Some(t);
            }
        }
        self.index.get(h, |b| self.hash_of(b))
    }

    /// Whether block `b` is registered under `h`.
    #[inline]
    fn holds(&self, b: BlockId, h: u64) -> bool {
        self.blocks[b as usize].hash() == Some(h)
    }

    /// Asks for the records around block `b`: a chain's blocks mostly have neighbouring ids
    /// (runs of the free queue, or untouched blocks), in either order.
    #[inline]
    fn prefetch_around(&self, b: BlockId) {
        let ahead = AHEAD as u32;
        self.prefetch_record(b.wrapping_add(ahead));
        self.prefetch_record(b.wrapping_sub(ahead));
    }

    /// The longest run of leading `hashes` (a prompt's chain, from its first block) that are
    /// registered, and how many of those are free.
    pub fn longest_cached_prefix(&self, hashes: &[u64]) -> (u32, u32) {
        if !self.caching {
            return (0, 0);
        }
        let mut hits = 0;
        let mut free = 0;
        let mut prev = None;
        for &h in hashes {
            match self.find(prev, h) {
                Some(b) => {
                    self.prefetch_around(b);
                    hits += 1;
                    free += !self.blocks[b as usize].used() as u32;
                    prev = Some(b);
                }
                None => break,
            }
        }
        (hits, free)
    }

    /// Takes a reference on the blocks registered under `hashes` (a prompt's chain from its
    /// first block; all must be registered) and appends them to `out`.
    pub fn take_cached(&mut self, hashes: &[u64], out: &mut Vec<BlockId>) {
        let mut prev = None;
        for &h in hashes {
            let b = self
                .find(prev, h)
                .expect("take_cached takes registered blocks");
            if !self.blocks[b as usize].used() {
                self.unlink(b);
            }
            self.blocks[b as usize].word += 1;
            out.push(b);
            prev = Some(b);
        }
        self.stats.hit_blocks += hashes.len() as u64;
    }

    /// Allocates `n` fresh blocks (evicting registered free blocks, least recently used first)
    /// and appends them to `out`; allocates nothing and returns false if fewer are free.
    pub fn allocate(&mut self, n: u32, out: &mut Vec<BlockId>) -> bool {
        if n > self.free {
            return false;
        }
        if !self.caching {
            // Recently released blocks first, then untouched ones.
            let reused = (n as usize).min(self.stack.len());
            out.extend(self.stack.drain(self.stack.len() - reused..).rev());
            let fresh = n - reused as u32;
            out.extend(self.touched..self.touched + fresh);
            self.touched += fresh;
            self.free -= n;
            return true;
        }
        // Untouched blocks first: they head the free queue, in id order.
        let fresh = n.min(self.untouched());
        let first = self.touched;
        self.blocks.extend((0..fresh).map(|_| Block::ALLOCATED));
        self.next.extend((0..fresh).map(|_| NIL));
        self.touched += fresh;
        out.extend(first..first + fresh);
        self.free -= fresh;
        // Then the head of the linked queue. Evicting a block drops its hash from its record
        // only: the index slot or the link that named it is stale from now on.
        for _ in fresh..n {
            let b = self.head;
            self.unlink(b);
            let block = &mut self.blocks[b as usize];
            if block.registered() {
                block.set_registered(None);
                self.stats.evictions += 1;
            }
            block.word = 1;
            out.push(b);
        }
        true
    }

    /// Drops one reference on each block, last block first; unreferenced blocks join the tail
    /// of the free queue (most recently used), keeping their hash if they have one.
    pub fn release(&mut self, blocks: &[BlockId]) {
        if !self.caching {
            // Each block has one holder; `check` finds blocks held twice.
            self.stack.extend(blocks.iter().rev());
            self.free += blocks.len() as u32;
            assert!(self.free <= self.num_blocks, "blocks released twice");
            return;
        }
        for (i, &b) in blocks.iter().enumerate().rev() {
            if let Some(ahead) = i.checked_sub(AHEAD) {
                self.prefetch_record(blocks[ahead]);
            }
            let block = &mut self.blocks[b as usize];
            assert!(block.refs() > 0, "block {b} released twice");
            block.word -= 1;
            if block.word == 0 {
                self.push_tail(b);
            }
        }
    }

    /// Registers `blocks[i]` under `hashes[i]` for every `i` from `from` on, once their KV is
    /// computed; `blocks` and `hashes` are a sequence's blocks and its prompt's chain, from its
    /// first block. A block whose hash another block holds already stays unregistered (the
    /// index keeps that one: both hold identical KV).
    pub fn register_all(&mut self, blocks: &[BlockId], hashes: &[u64], from: usize) {
        debug_assert_eq!(blocks.len(), hashes.len());
        if !self.caching {
            return;
        }
        // The block registered under the hash before each one.
        let mut prev = self.owner_before(blocks, hashes, from);
        for i in from..blocks.len() {
            if let Some(&ahead) = blocks.get(i + AHEAD) {
                self.prefetch_record(ahead);
            }
            let (b, h) = (blocks[i], hashes[i]);
            if self.blocks[b as usize].registered() {
                // Taken as a hit, or registered by an earlier call.
                debug_assert!(self.holds(b, h), "block {b} holds another hash");
                prev = Some(b);
                continue;
            }
            if let Some(x) = self.find(prev, h) {
                prev = Some(x);
                continue;
            }
            // Linked from this sequence's previous block if that is registered (so this
            // sequence holds it) and links nowhere registered; indexed otherwise.
            let link = i.checked_sub(1).map(|j| blocks[j]).filter(|&p| {
                let t = self.next[p as usize];
                prev == Some(p) && (t == NIL || !self.blocks[t as usize].registered())
            });
            if let Some(p) = link {
                self.next[p as usize] = b;
            } else {
                let records = &self.blocks;
                self.index.make_room(|x| records[x as usize].hash());
                let new = self.index.insert_new(h, b, |x| records[x as usize].hash());
                debug_assert!(new, "hash {h:#x} held by a block find missed");
            }
            self.blocks[b as usize].set_registered(Some(h));
            self.next[b as usize] = NIL;
            prev = Some(b);
        }
    }

    /// The block registered under `hashes[from - 1]` (`None` if `from` is 0 or no block holds
    /// it): the sequence's own block there, or else the one a walk of the chain finds.
    fn owner_before(&self, blocks: &[BlockId], hashes: &[u64], from: usize) -> Option<BlockId> {
        let j = from.checked_sub(1)?;
        if self.holds(blocks[j], hashes[j]) {
            return Some(blocks[j]);
        }
        // The registered block of each hash follows from that of the one before (the module
        // doc); a hash no block holds leaves only the index for the next.
        hashes[..from]
            .iter()
            .fold(None, |prev, &h| self.find(prev, h))
    }

    /// Asks for block `b`'s record (a cache hint; nothing if it has none yet).
    #[inline]
    fn prefetch_record(&self, b: BlockId) {
        if let Some(r) = self.blocks.get(b as usize) {
            prefetch::value(r);
        }
    }

    /// Block `b`'s registered hash (the index keeps only its top bits).
    fn hash_of(&self, b: BlockId) -> Option<u64> {
        self.blocks[b as usize].hash()
    }

    /// Takes free block `b` out of the free queue: it is in use, with no reference yet.
    fn unlink(&mut self, b: BlockId) {
        let block = self.blocks[b as usize];
        debug_assert!(!block.used());
        let (prev, next) = (block.word, block.next());
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].set_next(next);
        }
        if next == NIL {
            self.tail = prev;
        } else {
            // A free block's word is its back link.
            self.blocks[next as usize].word = prev;
        }
        let block = &mut self.blocks[b as usize];
        block.word = 0;
        block.link = (block.link & REGISTERED) | USED | NIL;
        self.free -= 1;
    }

    /// Puts block `b`, in use with no reference left, at the tail of the free queue.
    fn push_tail(&mut self, b: BlockId) {
        let block = &mut self.blocks[b as usize];
        block.word = self.tail;
        block.link = (block.link & REGISTERED) | NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.blocks[self.tail as usize].set_next(b);
        }
        self.tail = b;
        self.free += 1;
    }

    /// Checks the pool's invariants (for tests and debug runs): the free queue (the untouched
    /// blocks, then the linked list or the stack) holds exactly the unreferenced blocks, and
    /// the index points at blocks that carry its hash.
    pub fn check(&self) -> Result<(), String> {
        let mut n = 0;
        let mut b = self.head;
        let mut prev = NIL;
        while b != NIL {
            let Some(block) = self.blocks.get(b as usize) else {
                return Err(format!("the free queue names block {b}, never allocated"));
            };
            if block.used() {
                return Err(format!("block {b} is free with {} references", block.word));
            }
            if block.word != prev {
                return Err(format!("block {b} has a broken back link"));
            }
            n += 1;
            if n > self.blocks.len() {
                return Err("free queue has a cycle".into());
            }
            prev = b;
            b = block.next();
        }
        if !self.caching {
            return self.check_stack();
        }
        if let Some(b) = self
            .blocks
            .iter()
            .position(|r| r.used() && (r.word == 0 || r.next() != NIL))
        {
            return Err(format!("block {b} is in use with no reference, or linked"));
        }
        let unreferenced = self.blocks.iter().filter(|b| !b.used()).count();
        let untouched = self.untouched() as usize;
        if n != unreferenced || n + untouched != self.free as usize {
            return Err(format!(
                "free queue holds {n} and {untouched} untouched, counter says {}, \
                 unreferenced blocks {unreferenced}",
                self.free
            ));
        }
        // Every slot names a block that was allocated, and live slots (whose block holds a
        // hash with the slot's tag) name distinct blocks; no hash is held by two blocks, and
        // every registered block is indexed or linked from a registered block.
        if self.next.len() != self.blocks.len() {
            return Err("a block has no link".into());
        }
        let mut reached = vec![false; self.blocks.len()];
        for (tag, b) in self.index.iter() {
            let Some(block) = self.blocks.get(b as usize) else {
                return Err(format!("the index names block {b}, never allocated"));
            };
            if block.hash().map(|h| (h >> 32) as u32) == Some(tag)
                && std::mem::replace(&mut reached[b as usize], true)
            {
                return Err(format!("the index names block {b} twice"));
            }
        }
        let mut held = std::collections::HashMap::new();
        for (b, block) in self.blocks.iter().enumerate() {
            let Some(h) = block.hash() else { continue };
            if let Some(other) = held.insert(h, b) {
                return Err(format!(
                    "blocks {other} and {b} are both registered under {h:#x}"
                ));
            }
            let t = self.next[b];
            if t != NIL {
                let Some(target) = self.blocks.get(t as usize) else {
                    return Err(format!("block {b} links to block {t}, never allocated"));
                };
                if target.registered() {
                    reached[t as usize] = true;
                }
            }
        }
        for (b, block) in self.blocks.iter().enumerate() {
            if let Some(h) = block.hash()
                && !reached[b]
            {
                return Err(format!(
                    "block {b} is registered under {h:#x}, neither indexed nor linked"
                ));
            }
        }
        Ok(())
    }

    /// Without caching: the stack holds distinct touched blocks, and with the untouched ones
    /// as many as the free counter says. (The instance checks that held blocks are distinct.)
    fn check_stack(&self) -> Result<(), String> {
        if self.head != NIL
            || !self.blocks.is_empty()
            || !self.next.is_empty()
            || self.index.full_slots() != 0
        {
            return Err("a pool without caching keeps block records".into());
        }
        let mut seen = vec![false; self.touched as usize];
        for &b in &self.stack {
            match seen.get_mut(b as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("block {b} is free twice or was never allocated")),
            }
        }
        if self.stack.len() + self.untouched() as usize != self.free as usize {
            return Err(format!(
                "{} free blocks on the stack and {} untouched, counter says {}",
                self.stack.len(),
                self.untouched(),
                self.free
            ));
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
        pool.register_all(&a, &[10, 11], 0);
        pool.release(&a);
        assert_eq!(pool.longest_cached_prefix(&[10, 11, 12]), (2, 2));

        let mut b = Vec::new();
        assert!(pool.allocate(2, &mut b));
        pool.register_all(&b, &[20, 21], 0);
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
        pool.register_all(&a, &[100, 101, 102], 0);
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
        pool.register_all(&a[..1], &[1], 0);
        assert_eq!(pool.cached_blocks(), 0, "caching off registers nothing");
        pool.release(&a);
        assert_eq!(pool.free_blocks(), 4);
        pool.check().unwrap();
    }

    #[test]
    fn a_block_record_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Block>(), 16);
    }

    #[test]
    fn untouched_blocks_head_the_free_queue_in_id_order_and_get_a_record_when_first_used() {
        let mut pool = BlockPool::new(5, true);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        assert_eq!(a, [0, 1]);
        assert_eq!(pool.blocks.len(), 2);
        pool.release(&a);
        // Free queue: the untouched 2, 3, 4, then a1, a0 (released last block first).
        let mut b = Vec::new();
        assert!(pool.allocate(5, &mut b));
        assert_eq!(b, [2, 3, 4, 1, 0]);
        pool.check().unwrap();
        pool.release(&b);
        assert_eq!(pool.free_blocks(), 5);
        pool.check().unwrap();
    }

    #[test]
    fn without_caching_released_blocks_are_reused_first_and_untouched_ones_after() {
        let mut pool = BlockPool::new(4, false);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        pool.release(&a);
        let mut b = Vec::new();
        assert!(pool.allocate(3, &mut b));
        assert_eq!(b, [0, 1, 2]);
        assert_eq!(pool.free_blocks(), 1);
        pool.check().unwrap();
        pool.release(&b);
        assert_eq!(pool.free_blocks(), 4);
        pool.check().unwrap();
    }

    #[test]
    fn shared_blocks_are_freed_only_by_their_last_holder() {
        let mut pool = BlockPool::new(2, true);
        let mut a = Vec::new();
        assert!(pool.allocate(1, &mut a));
        pool.register_all(&a, &[7], 0);
        let mut b = Vec::new();
        pool.take_cached(&[7], &mut b);
        pool.release(&a);
        assert_eq!(pool.free_blocks(), 1);
        pool.release(&b);
        assert_eq!(pool.free_blocks(), 2);
        pool.check().unwrap();
    }

    /// vLLM's prefix-caching pool written the obvious way (a queue of free blocks, LRU at
    /// the front, and a map of registered hashes), against which [`BlockPool`] must agree
    /// operation by operation: the same blocks handed out, the same hits, the same evictions.
    #[derive(Default)]
    struct Reference {
        refs: Vec<u32>,
        hash: Vec<Option<u64>>,
        free: std::collections::VecDeque<BlockId>,
        index: std::collections::HashMap<u64, BlockId>,
        evictions: u64,
        hit_blocks: u64,
        /// Without caching: the most recently released block is handed out first, then the
        /// untouched ones in id order (nothing is cached, so which one is unobservable).
        caching: bool,
        stack: Vec<BlockId>,
    }

    impl Reference {
        fn new(n: u32, caching: bool) -> Reference {
            Reference {
                refs: vec![0; n as usize],
                hash: vec![None; n as usize],
                free: (0..n).collect(),
                caching,
                ..Reference::default()
            }
        }
        fn longest_cached_prefix(&self, hashes: &[u64]) -> (u32, u32) {
            if !self.caching {
                return (0, 0);
            }
            let mut hits = 0;
            let mut free = 0;
            for h in hashes {
                let Some(&b) = self.index.get(h) else { break };
                hits += 1;
                free += (self.refs[b as usize] == 0) as u32;
            }
            (hits, free)
        }
        fn take_cached(&mut self, hashes: &[u64], out: &mut Vec<BlockId>) {
            for h in hashes {
                let b = self.index[h];
                if self.refs[b as usize] == 0 {
                    let at = self.free.iter().position(|&x| x == b).unwrap();
                    self.free.remove(at);
                }
                self.refs[b as usize] += 1;
                out.push(b);
            }
            self.hit_blocks += hashes.len() as u64;
        }
        fn allocate(&mut self, n: u32, out: &mut Vec<BlockId>) -> bool {
            if n as usize > self.free.len() + self.stack.len() {
                return false;
            }
            for _ in 0..n {
                let b = if self.caching {
                    self.free.pop_front().unwrap()
                } else {
                    // The stack of released blocks, then the untouched ones in id order.
                    self.stack
                        .pop()
                        .unwrap_or_else(|| self.free.pop_front().unwrap())
                };
                if let Some(h) = self.hash[b as usize].take() {
                    self.index.remove(&h);
                    self.evictions += 1;
                }
                self.refs[b as usize] = 1;
                out.push(b);
            }
            true
        }
        fn release(&mut self, blocks: &[BlockId]) {
            for &b in blocks.iter().rev() {
                self.refs[b as usize] -= 1;
                if self.refs[b as usize] == 0 {
                    if self.caching {
                        self.free.push_back(b);
                    } else {
                        self.stack.push(b);
                    }
                }
            }
        }
        fn register(&mut self, b: BlockId, h: u64) {
            if self.caching && self.hash[b as usize].is_none() && !self.index.contains_key(&h) {
                self.index.insert(h, b);
                self.hash[b as usize] = Some(h);
            }
        }
    }

    #[test]
    fn the_pool_agrees_with_the_obvious_lru_pool_through_random_serving() {
        use crate::hash::mix64;
        use crate::rng::Stream;
        for seed in 0..80u64 {
            let mut rng = Stream::new(seed, 7);
            let n = 8 + rng.below(40) as u32;
            // One run in four without caching: blocks come and go, nothing is found again.
            let caching = seed % 4 != 0;
            let mut pool = BlockPool::new(n, caching);
            let mut model = Reference::new(n, caching);
            // Running sequences: their hash chain, blocks held, and blocks registered so far.
            let mut running: Vec<(Vec<u64>, Vec<BlockId>, usize)> = Vec::new();
            for step in 0..400 {
                let at = format!("seed {seed}, step {step}");
                match rng.below(4) {
                    // A new sequence: a prompt of one of 4 contexts (shared leading blocks)
                    // then blocks of its own; it takes its cached prefix and allocates the rest.
                    0 | 1 => {
                        let context = rng.below(4);
                        let shared = rng.below(8) as usize;
                        let len = 1 + rng.below(10) as usize;
                        let own = rng.next_u64();
                        let hashes: Vec<u64> = (0..len)
                            .map(|i| {
                                let root = if i < shared { context } else { own };
                                mix64(root ^ mix64(i as u64 + 1))
                            })
                            .collect();
                        let (hits, free) = pool.longest_cached_prefix(&hashes);
                        assert_eq!((hits, free), model.longest_cached_prefix(&hashes), "{at}");
                        let (mut a, mut b) = (Vec::new(), Vec::new());
                        pool.take_cached(&hashes[..hits as usize], &mut a);
                        model.take_cached(&hashes[..hits as usize], &mut b);
                        let rest = len as u32 - hits;
                        let ok = pool.allocate(rest, &mut a);
                        assert_eq!(ok, model.allocate(rest, &mut b), "{at}");
                        assert_eq!(a, b, "{at}: blocks handed out");
                        if ok {
                            running.push((hashes, a, hits as usize));
                        } else {
                            // As an instance that cannot admit it: give the hits back.
                            pool.release(&a);
                            model.release(&b);
                        }
                    }
                    // A running sequence computes some more of its prompt: those blocks are
                    // registered (a block whose hash another holds stays unregistered).
                    2 if !running.is_empty() => {
                        let i = rng.below(running.len() as u64) as usize;
                        let (hashes, blocks, done) = &mut running[i];
                        let upto =
                            *done + rng.range_inclusive(0, (hashes.len() - *done) as u64) as usize;
                        pool.register_all(&blocks[..upto], &hashes[..upto], *done);
                        for j in *done..upto {
                            model.register(blocks[j], hashes[j]);
                        }
                        *done = upto;
                    }
                    // A sequence finishes (or is preempted): it releases every block.
                    _ if !running.is_empty() => {
                        let i = rng.below(running.len() as u64) as usize;
                        let (_, blocks, _) = running.swap_remove(i);
                        pool.release(&blocks);
                        model.release(&blocks);
                    }
                    _ => {}
                }
                let free = model.free.len() + model.stack.len();
                assert_eq!(pool.free_blocks() as usize, free, "{at}");
                assert_eq!(pool.stats.evictions, model.evictions, "{at}");
                assert_eq!(pool.stats.hit_blocks, model.hit_blocks, "{at}");
                assert_eq!(pool.cached_blocks(), model.index.len(), "{at}");
                pool.check().unwrap_or_else(|e| panic!("{at}: {e}"));
            }
        }
    }
}
