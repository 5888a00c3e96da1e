//! The KV-cache block pool of a serving instance, with vLLM's automatic prefix caching.
//!
//! The instance's KV memory is cut into fixed blocks of `block_size` tokens. A block is either
//! *in use* (running sequences hold it) or *free*. Free blocks sit in one queue, least recently
//! used at the head. With caching on, a full prompt block is *registered* under its chained
//! hash once its KV is computed; when it becomes free it keeps its hash and stays findable
//! until it is reused for something else. Allocation pops the head of the free queue and, if
//! that block was registered, *evicts* it (drops its hash). A sequence releases its blocks in
//! reverse order, so its last blocks sit nearer the head and go first: the early blocks of a
//! prompt are the ones other prompts are most likely to share. That is the whole behaviour;
//! the test module holds it written the obvious way (a queue of blocks and a map of hashes),
//! and a differential test checks every answer of this pool against it.
//!
//! **Segments, not blocks.** A SQuAD prompt is 258 blocks, and a pool that keeps a record per
//! block touches each of them at every step of a request (lookup, hit, allocation,
//! registration, release): at cluster scale, where the pools of 2,240 GPUs do not fit in the
//! caches, that was a cache miss per block and step, and most of a run. This pool keeps
//! registered blocks in *segments* instead, and does its work per segment:
//!
//! - A segment is a run of registered blocks at consecutive chain positions, registered by
//!   sequences that each held the whole run before them: its block ids in position order,
//!   and its hashes, which are those of the chain of the sequence that registered its last
//!   block at the same positions. So a segment keeps that chain (a [`ChainHashes`], whose
//!   arrays it shares with the request and the other pools that hold them) and its length,
//!   and copies no hash: registering a block is a count. A prompt registers its blocks in
//!   order, so its new blocks extend the segment it holds the end of, or start a new one
//!   (after a block whose hash another block held, or where a held segment goes on with
//!   other hashes). Only a segment's first hash is in the hash index ([`BlockIndex`], a few
//!   entries per prompt).
//! - **Every holder of a segment holds a prefix of it.** A lookup walks a prompt's chain
//!   segment by segment: it enters a segment at its start (the index), and leaves it where
//!   the hashes part (a hash names its whole prefix, so one comparison at the far end, or a
//!   binary search, finds that place) or the segment ends. So a segment's reference counts
//!   never grow with position, and the segment only needs its holders' prefix lengths;
//!   its free blocks are the positions from the longest of them on. The longest and how
//!   many hold it live in the segment's record, the others in a list beside it (`below`),
//!   which most segments never use: the questions about one window hold its whole segment,
//!   so a release or a hit touches only the record (the list was a cache miss of its own in
//!   every release at cluster scale).
//! - **Where prompts part.** Prompts that share only a system prompt all part from the
//!   segment that holds it (registered by the first of them) at the same place, so a
//!   segment keeps where the last lookup found its hashes parting, and the next one checks
//!   there first: two comparisons instead of a binary search, which at cluster scale read a
//!   dozen cold lines of two chains at every admission (`sim_scale`'s local-prefix round at
//!   2,240 GPUs: 6 % fewer simulated cache misses). The place is only taken once checked,
//!   so the hint changes no answer.
//! - **The free queue holds runs.** Blocks reaching no reference in one release are appended
//!   as runs: the newly free positions of each segment the sequence held (highest first, as
//!   the release order has it) and its own unregistered blocks (ids in queue order). Within a
//!   segment, queued runs hold decreasing positions: the highest free positions are nearest
//!   the head. So an eviction takes a segment's last positions (the arrays shrink), and a hit
//!   takes the lowest free ones (the runs queued last shrink from their low end): both touch
//!   one run or a few, not a block each.
//!
//! **Ids only where KV is real.** With a backend that keeps KV by block (a live run), blocks
//! have ids: a sequence's [`Blocks`] list them in prompt order, segments and runs keep theirs,
//! and they are the ones the obvious pool hands out. A simulated backend never reads them,
//! and which free block an allocation gets is then unobservable (only which hashes stay
//! registered is), so a simulation's pool keeps no ids at all: blocks are counted. The
//! differential test runs a counting pool in lockstep with the one with ids and the obvious
//! one.
//!
//! **Memory.** A pool starts with every block free and untouched, in id order at the head of
//! the queue; nothing is ever queued ahead of an untouched block, so they are kept implicitly
//! (ids from `touched` to `num_blocks`), and a pool costs memory for its segments and runs (4
//! bytes a registered block with ids; the hash arrays its segments share are those of at
//! most one chain each), not for the KV memory of its GPU (a cluster of 2,240 GPUs has 26 M
//! blocks). Without caching, no block carries a hash or is shared, so
//! which free block an allocation gets changes nothing that can be observed: free blocks with
//! ids then sit on a stack (the most recently released taken first), and a counting pool
//! keeps only its count of free blocks.

use std::cell::Cell;

use super::block_index::BlockIndex;
use super::prompt_hashes::ChainHashes;
use crate::metrics::PoolStats;

pub type BlockId = u32;
/// No run, segment or block.
const NONE: u32 = u32::MAX;
/// Most block ids an unused segment slot keeps room for (a SQuAD prompt is 258 blocks).
const KEEP_BLOCKS: usize = 4096;
/// Segments and runs a caching pool makes room for when it is built (8 and 8 KiB). They are
/// records aligned to cache lines, whose arrays grew by aligned allocations (each a new one,
/// a copy and a free, where glibc first merges the small free chunks it holds): `sim_scale`'s
/// local-prefix round at 2,240 GPUs ends with 65 to 128 runs and 33 to 64 segments in every
/// pool, and the eleven growths of each pool on the way there were about 3 % of its samples
/// (`perf`). A pool that needs more grows as before.
const RESERVE_SEGS: usize = 64;
const RESERVE_RUNS: usize = 128;
/// Most block ids an unused run keeps room for (a run of a sequence's own blocks is mostly
/// its last prompt block and its decode blocks).
const KEEP_IDS: usize = 256;

/// A sequence's KV blocks: how many, their ids in prompt order (if the pool keeps ids), and
/// which of them are registered in segments (the rest are its own, unregistered). Only the
/// pool changes it.
///
/// `repr(C)` with the count first: an iteration reads a sequence's block count, and the
/// instance keeps that in the sequence's first cache line. The pieces are in place while
/// they are at most [`INLINE_PIECES`] (nearly every SQuAD sequence holds two: the segment of
/// its system prompt and one of its own), so that a release, which reads them, finds them in
/// the sequence's record: kept in an array of their own, they were a cache miss at every
/// release at cluster scale (`perf`: two fifths of the release's time in local-prefix at
/// 2,240 GPUs).
#[derive(Debug, Default)]
#[repr(C)]
pub struct Blocks {
    n: u32,
    /// How many pieces it holds: in `inline` up to [`INLINE_PIECES`], else all in `more`.
    pieces_len: u32,
    ids: Vec<BlockId>,
    /// In prompt order: `ids[at..at + n]` are positions `0..n` of segment `seg`.
    inline: [Piece; INLINE_PIECES],
    more: Vec<Piece>,
}

/// Most segment pieces a sequence's [`Blocks`] keeps in place.
const INLINE_PIECES: usize = 2;

#[derive(Clone, Copy, Debug, Default)]
struct Piece {
    seg: u32,
    at: u32,
    n: u32,
}

impl Blocks {
    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Its segment pieces, in prompt order.
    fn pieces(&self) -> &[Piece] {
        let n = self.pieces_len as usize;
        if n <= INLINE_PIECES {
            &self.inline[..n]
        } else {
            &self.more
        }
    }

    /// Its last segment piece, if any.
    fn last_piece_mut(&mut self) -> Option<&mut Piece> {
        let n = self.pieces_len as usize;
        if n <= INLINE_PIECES {
            self.inline[..n].last_mut()
        } else {
            self.more.last_mut()
        }
    }

    /// Appends a segment piece (past the last).
    fn push_piece(&mut self, p: Piece) {
        let n = self.pieces_len as usize;
        if n < INLINE_PIECES {
            self.inline[n] = p;
        } else {
            if n == INLINE_PIECES {
                // Empty while the pieces are in place (`clear_pieces` empties it).
                debug_assert!(self.more.is_empty());
                self.more.extend_from_slice(&self.inline);
            }
            self.more.push(p);
        }
        self.pieces_len += 1;
    }

    fn clear_pieces(&mut self) {
        self.pieces_len = 0;
        self.more.clear();
    }

    /// Their ids, in prompt order: empty unless the pool keeps ids.
    pub fn ids(&self) -> &[BlockId] {
        &self.ids
    }

    /// Blocks of its own, not in segments (unregistered).
    pub fn own(&self) -> u32 {
        self.n - self.pieces().iter().map(|p| p.n).sum::<u32>()
    }

    pub fn capacity(&self) -> usize {
        self.ids.capacity()
    }

    /// Room for `n` more block ids, once.
    pub fn reserve_exact(&mut self, n: usize) {
        self.ids.reserve_exact(n);
    }

    /// Where its segment pieces end: blocks from here on are its own and unregistered.
    fn registered_end(&self) -> usize {
        self.pieces().last().map_or(0, |p| (p.at + p.n) as usize)
    }
}

/// How many live segments start at each chain position, and a bit a position for whether any
/// does: registration looks for the next position a segment starts at past each block it
/// registers (a SQuAD prompt: 258 positions), and at cluster scale, where a pool's counts are
/// cold at every request, reading them a word a position was a cache miss every 16 positions
/// (`cachegrind` with an 8 MiB last-level cache: 4 % of the run's misses, 5 a request), where
/// the bits of a prompt's positions are one line.
#[derive(Clone, Debug, Default)]
struct Starts {
    counts: Vec<u32>,
    /// Bit `p % 64` of word `p / 64`: whether `counts[p] > 0`.
    any: Vec<u64>,
}

impl Starts {
    fn add(&mut self, at: usize) {
        if self.counts.len() <= at {
            self.counts.resize(at + 1, 0);
            self.any.resize(at / 64 + 1, 0);
        }
        self.counts[at] += 1;
        self.any[at / 64] |= 1 << (at % 64);
    }

    fn remove(&mut self, at: usize) {
        self.counts[at] -= 1;
        if self.counts[at] == 0 {
            self.any[at / 64] &= !(1 << (at % 64));
        }
    }

    #[inline]
    fn any_at(&self, at: usize) -> bool {
        self.any
            .get(at / 64)
            .is_some_and(|&w| w >> (at % 64) & 1 == 1)
    }

    /// The first position from `from` below `upto` that a segment starts at, or `upto`.
    fn next(&self, from: usize, upto: usize) -> usize {
        let mut w = from / 64;
        let mut bits = match self.any.get(w) {
            Some(&b) => b & (u64::MAX << (from % 64)),
            None => return upto,
        };
        // Bounded: one pass a word, up to the last.
        loop {
            if bits != 0 {
                return (w * 64 + bits.trailing_zeros() as usize).min(upto);
            }
            w += 1;
            if w * 64 >= upto || w >= self.any.len() {
                return upto;
            }
            bits = self.any[w];
        }
    }

    /// Whether the bits say what the counts do.
    fn check(&self) -> Result<(), String> {
        let bits = (0..self.any.len() * 64).filter(|&p| self.any_at(p));
        if !bits.eq((0..self.counts.len()).filter(|&p| self.counts[p] > 0)) {
            return Err("segment start bits disagree with their counts".into());
        }
        Ok(())
    }
}

/// Registered blocks at consecutive chain positions (see the module doc). Positions are
/// relative to the segment's first block.
///
/// Two 64-byte lines, aligned (`repr(C)`): the first holds what a lookup reads (the chain,
/// where it starts, its length, where hashes last parted, where its free blocks begin), the
/// second what holding, releasing and registering change. Unaligned in a `Vec`, a segment's
/// 128 bytes straddled three lines seven times in eight.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct Seg {
    /// The chain its hashes are positions `start..start + len` of.
    chain: ChainHashes,
    /// Chain position of its first block.
    start: u32,
    /// Its blocks (positions `0..len`).
    len: u32,
    /// Where the last lookup that entered it found the hashes parting from its own (0 if
    /// none did): tried first by the next (see [`BlockPool::step`]).
    parted: Cell<u32>,
    /// Positions from here on are free: the longest holder's length (0 with none), kept
    /// in the record so that a lookup counting free hits does not read them.
    free_from: u32,
    /// How many holders hold the longest prefix (0 with none).
    at_max: u32,
    /// Its runs in the free queue: the one with its highest positions (nearest the head) and
    /// the one with its lowest (queued last).
    top: u32,
    low: u32,
    ids: Vec<BlockId>,
    /// Its holders' prefix lengths shorter than the longest (`free_from`), ascending.
    below: Vec<u32>,
}

// Two lines a segment, the lookup's fields in the first.
const _: () = assert!(std::mem::size_of::<Seg>() == 128);
const _: () = assert!(std::mem::offset_of!(Seg, free_from) + 4 <= 64);

impl Seg {
    /// An unused slot.
    fn empty() -> Seg {
        Seg {
            start: 0,
            len: 0,
            chain: ChainHashes::default(),
            ids: Vec::new(),
            below: Vec::new(),
            at_max: 0,
            free_from: 0,
            top: NONE,
            low: NONE,
            parted: Cell::new(0),
        }
    }

    fn len(&self) -> u32 {
        self.len
    }

    /// The hash of position `p` (below its length).
    #[inline]
    fn hash(&self, p: u32) -> u64 {
        debug_assert!(p < self.len);
        self.chain.get((self.start + p) as usize)
    }

    /// The hash of position `p`, if it has one.
    #[inline]
    fn get(&self, p: u32) -> Option<u64> {
        (p < self.len).then(|| self.hash(p))
    }
}

/// A run of the free queue: positions `lo..hi` of segment `seg` (queued from `hi - 1` down),
/// or, with `seg` `NONE`, unregistered blocks: the `lo`-th to the `hi`-th queued to it, whose
/// ids are `anon[lo..hi]` (in queue order) if the pool keeps ids.
///
/// One 64-byte line, aligned: unaligned in a `Vec`, a run's 56 bytes straddled two lines
/// more often than not.
#[derive(Clone, Debug, Default)]
#[repr(align(64))]
struct Run {
    prev: u32,
    next: u32,
    seg: u32,
    lo: u32,
    hi: u32,
    /// Within its segment: the run of the next lower positions (queued after this one), and
    /// of the next higher.
    down: u32,
    up: u32,
    anon: Vec<BlockId>,
}

const _: () = assert!(std::mem::size_of::<Run>() == 64);

impl Run {
    fn blocks(&self) -> u32 {
        self.hi - self.lo
    }
}

/// A fixed pool of KV blocks.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// Blocks allocated at least once: ids from `touched` to `num_blocks` are untouched.
    touched: u32,
    num_blocks: u32,
    free: u32,
    caching: bool,
    /// Whether blocks have ids (see the module doc).
    keep_ids: bool,
    /// With caching: segments and runs (slabs, with lists of their unused slots), the free
    /// queue's touched runs (behind the untouched blocks), and segment start hash -> segment.
    segs: Vec<Seg>,
    unused_segs: Vec<u32>,
    runs: Vec<Run>,
    unused_runs: Vec<u32>,
    head: u32,
    tail: u32,
    index: BlockIndex,
    /// Live segments by the chain position of their first block: a hash at a position no
    /// segment starts at is not in the index, and registration asks the index only where
    /// one does.
    starts: Starts,
    /// Without caching: free touched blocks, most recently released last.
    stack: Vec<BlockId>,
    pub stats: PoolStats,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, with prefix caching or without, whose blocks have ids
    /// (for a backend that keeps KV by block) or are only counted.
    pub fn new(num_blocks: u32, caching: bool, keep_ids: bool) -> BlockPool {
        assert!(
            num_blocks > 0 && num_blocks < NONE,
            "block count out of range"
        );
        BlockPool {
            touched: 0,
            num_blocks,
            free: num_blocks,
            caching,
            keep_ids,
            segs: Vec::with_capacity(if caching { RESERVE_SEGS } else { 0 }),
            unused_segs: Vec::new(),
            runs: Vec::with_capacity(if caching { RESERVE_RUNS } else { 0 }),
            unused_runs: Vec::new(),
            head: NONE,
            tail: NONE,
            // At most one live entry a segment, and a segment has at least one block.
            index: BlockIndex::new(if caching { num_blocks as usize } else { 0 }),
            starts: Starts::default(),
            // Reserved, not written: the system maps the pages that releases touch, and the
            // stack never grows by copying.
            stack: if caching || !keep_ids {
                Vec::new()
            } else {
                Vec::with_capacity(num_blocks as usize)
            },
            stats: PoolStats::default(),
        }
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// `hot` with the free queue's head run as its second value: the run the next allocation
    /// past the untouched blocks takes from (a cache hint, see [`crate::actor::Hot`]).
    pub fn hint(&self, hot: crate::actor::Hot) -> crate::actor::Hot {
        match self.runs.get(self.head as usize) {
            Some(run) if self.untouched() == 0 => hot.with(1, run),
            _ => hot,
        }
    }

    /// Asks for what a lookup of a chain that starts with hash `first` reads first: the
    /// index slot of a segment starting with it (a cache hint, see [`crate::sim::prefetch`]).
    /// Whether a segment starts at a chain's first position is not asked first: that list
    /// is a line of its own, and the hint would wait on it.
    pub fn hint_lookup(&self, first: u64) {
        if self.caching {
            self.index.hint(first);
        }
    }

    /// Free blocks (including free blocks that still hold a registered prefix).
    pub fn free_blocks(&self) -> u32 {
        self.free
    }

    /// Number of registered blocks (in use or free).
    #[cfg(test)]
    pub fn cached_blocks(&self) -> usize {
        self.live_segs().map(|(_, s)| s.len as usize).sum()
    }

    fn live_segs(&self) -> impl Iterator<Item = (u32, &Seg)> {
        (self.segs.iter().enumerate())
            .filter(|(_, s)| s.len > 0)
            .map(|(i, s)| (i as u32, s))
    }

    /// Registered blocks in use: every holder of a segment holds a prefix of it, so its
    /// blocks in use are its longest holder's (for the instance's checks).
    pub fn held_registered(&self) -> u32 {
        self.live_segs().map(|(_, s)| s.free_from).sum()
    }

    /// Untouched blocks: the head of the free queue.
    fn untouched(&self) -> u32 {
        self.num_blocks - self.touched
    }

    /// Segment `s`'s first hash (`None` once it has no block: an index slot naming it is
    /// stale).
    fn first_hash(&self, s: u32) -> Option<u64> {
        self.segs[s as usize].get(0)
    }

    /// The segment that starts with hash `h`.
    fn starting(&self, h: u64) -> Option<u32> {
        self.index.get(h, |s| self.first_hash(s))
    }

    /// Whether a live segment starts at chain position `at`.
    #[inline]
    fn starts_at(&self, at: usize) -> bool {
        self.starts.any_at(at)
    }

    /// The segment that starts with hash `h`, at chain position `at`.
    #[inline]
    fn starting_at(&self, at: usize, h: u64) -> Option<u32> {
        if self.starts_at(at) {
            self.starting(h)
        } else {
            None
        }
    }

    /// The segment the first `upto` blocks of a prompt's chain (`hashes`, from its first
    /// block) enter at position `at` (the segment that starts with hash `at`), and how many
    /// of the hashes from there it holds: the hashes part where one differs, and a hash names
    /// its whole prefix, so the agreeing positions are a prefix (found by one comparison at
    /// the far end, or else a binary search).
    fn step(&self, hashes: &ChainHashes, upto: usize, at: usize) -> Option<(u32, u32)> {
        if at >= upto {
            return None;
        }
        let s = self.starting_at(at, hashes.get(at))?;
        let seg = &self.segs[s as usize];
        let m = (upto - at).min(seg.len as usize);
        let agrees = |p: usize| seg.hash(p as u32) == hashes.get(at + p);
        if agrees(m - 1) {
            return Some((s, m as u32));
        }
        // Position 0 agrees and m - 1 does not. Prompts that share a leading segment (a
        // system prompt) part from the chain of the segment that holds it at the same place,
        // where the last lookup found it: two comparisons there, not a search.
        let k = seg.parted.get() as usize;
        if k > 0 && k < m && agrees(k - 1) && (k == m - 1 || !agrees(k)) {
            return Some((s, k as u32));
        }
        let (mut yes, mut no) = (0, m - 1);
        while no - yes > 1 {
            let mid = (yes + no) / 2;
            if agrees(mid) {
                yes = mid;
            } else {
                no = mid;
            }
        }
        seg.parted.set(no as u32);
        Some((s, no as u32))
    }

    /// The longest run of the first `upto` of `hashes` (a prompt's chain, from its first
    /// block) that are registered, and how many of those are free.
    pub fn longest_cached_prefix(&self, hashes: &ChainHashes, upto: usize) -> (u32, u32) {
        if !self.caching {
            return (0, 0);
        }
        let upto = upto.min(hashes.len());
        let (mut hits, mut free) = (0, 0);
        // Bounded: every step moves on by at least one hash.
        while let Some((s, k)) = self.step(hashes, upto, hits as usize) {
            hits += k;
            free += k.saturating_sub(self.segs[s as usize].free_from);
        }
        (hits, free)
    }

    /// Takes a reference on the blocks registered under the first `upto` of `hashes` (a
    /// prompt's chain from its first block; all must be registered) and appends them to
    /// `blocks`, which must hold none yet.
    pub fn take_cached(&mut self, hashes: &ChainHashes, upto: usize, blocks: &mut Blocks) {
        assert!(blocks.is_empty(), "hits come first");
        assert!(upto <= hashes.len(), "hashes for every block taken");
        let mut at = 0;
        while at < upto {
            let (s, k) = self
                .step(hashes, upto, at)
                .expect("take_cached takes registered blocks");
            self.hold(s, k);
            let seg = &self.segs[s as usize];
            blocks.push_piece(Piece {
                seg: s,
                at: at as u32,
                n: k,
            });
            if self.keep_ids {
                blocks.ids.extend_from_slice(&seg.ids[..k as usize]);
            }
            blocks.n += k;
            at += k as usize;
        }
        self.stats.hit_blocks += upto as u64;
    }

    /// A new holder of segment `s`'s first `k` positions: those that were free leave the
    /// free queue (the segment's lowest runs, queued last).
    fn hold(&mut self, s: u32, k: u32) {
        debug_assert!(k > 0, "a holder holds a block at least");
        let seg = &mut self.segs[s as usize];
        if k == seg.free_from {
            seg.at_max += 1;
            return;
        }
        if k < seg.free_from {
            let at = seg.below.partition_point(|&x| x < k);
            seg.below.insert(at, k);
            return;
        }
        // A new longest holder: the old longest ones are now below it.
        let (was, n) = (seg.free_from, seg.at_max);
        seg.below.extend(std::iter::repeat_n(was, n as usize));
        seg.at_max = 1;
        self.free -= k - seg.free_from;
        seg.free_from = k;
        // Bounded by the segment's runs: each pass removes one or ends. They cover its free
        // positions, so those below `k` are the lowest runs'.
        loop {
            let r = self.segs[s as usize].low;
            let run = &mut self.runs[r as usize];
            if run.hi > k {
                run.lo = k;
                break;
            }
            let done = run.hi == k;
            self.remove_run(r);
            if done {
                break;
            }
        }
    }

    /// Allocates `n` fresh blocks (evicting registered free blocks, least recently used first)
    /// and appends them to `blocks`; allocates nothing and returns false if fewer are free.
    pub fn allocate(&mut self, n: u32, blocks: &mut Blocks) -> bool {
        if n > self.free {
            return false;
        }
        let out = &mut blocks.ids;
        let keep = self.keep_ids;
        self.free -= n;
        blocks.n += n;
        if !self.caching {
            if !keep {
                return true;
            }
            // Recently released blocks first, then untouched ones.
            let reused = (n as usize).min(self.stack.len());
            out.extend(self.stack.drain(self.stack.len() - reused..).rev());
            let fresh = n - reused as u32;
            out.extend(self.touched..self.touched + fresh);
            self.touched += fresh;
            return true;
        }
        // Untouched blocks first: they head the free queue, in id order.
        let fresh = n.min(self.untouched());
        if keep {
            out.extend(self.touched..self.touched + fresh);
        }
        self.touched += fresh;
        // Then the runs at the head of the queue. Bounded: each pass takes a block at least.
        let mut left = n - fresh;
        while left > 0 {
            let r = self.head;
            let run = &mut self.runs[r as usize];
            let c = left.min(run.blocks());
            left -= c;
            if run.seg == NONE {
                if keep {
                    let lo = run.lo as usize;
                    out.extend_from_slice(&run.anon[lo..lo + c as usize]);
                }
                run.lo += c;
            } else {
                // The segment's last positions: evicted.
                let (s, hi) = (run.seg, run.hi);
                run.hi -= c;
                let seg = &mut self.segs[s as usize];
                debug_assert_eq!(seg.len(), hi, "a segment's top run holds its last blocks");
                let kept = (hi - c) as usize;
                if keep {
                    out.extend(seg.ids[kept..].iter().rev());
                    seg.ids.truncate(kept);
                }
                seg.len = kept as u32;
                self.stats.evictions += c as u64;
                if kept == 0 {
                    // Its last run goes with it, and its index slot is stale from now on.
                    self.remove_run(r);
                    let seg = &mut self.segs[s as usize];
                    self.starts.remove(seg.start as usize);
                    debug_assert!(seg.at_max == 0, "only a free segment is evicted");
                    // It lets go of its chain's arrays.
                    seg.chain = ChainHashes::default();
                    if seg.ids.capacity() > KEEP_BLOCKS {
                        seg.ids = Vec::new();
                    }
                    self.unused_segs.push(s);
                    continue;
                }
            }
            if self.runs[r as usize].blocks() == 0 {
                self.remove_run(r);
            }
        }
        true
    }

    /// Drops the sequence's reference on each of its blocks, last block first, and empties
    /// `blocks`: unreferenced blocks join the tail of the free queue (most recently used),
    /// keeping their hash if they have one.
    pub fn release(&mut self, blocks: &mut Blocks) {
        let n = std::mem::take(&mut blocks.n);
        if !self.caching {
            // Each block has one holder; `check` finds blocks held twice.
            self.stack.extend(blocks.ids.iter().rev());
            self.free += n;
            assert!(self.free <= self.num_blocks, "blocks released twice");
            blocks.ids.clear();
            return;
        }
        // The ids of blocks `range`, if blocks have ids.
        let keep = self.keep_ids;
        let ids = |range: std::ops::Range<usize>| if keep { &blocks.ids[range] } else { &[] };
        let mut end = n as usize;
        for p in blocks.pieces().iter().rev() {
            let own = (p.at + p.n) as usize..end;
            self.push_anon(own.len() as u32, ids(own));
            self.drop_holder(p.seg, p.n);
            end = p.at as usize;
        }
        self.push_anon(end as u32, ids(0..end));
        blocks.ids.clear();
        blocks.clear_pieces();
    }

    /// Segment `s` loses a holder of its first `k` positions: those no other holder holds
    /// join the queue's tail, highest first.
    fn drop_holder(&mut self, s: u32, k: u32) {
        let seg = &mut self.segs[s as usize];
        let was = seg.free_from;
        if k != was || seg.at_max == 0 {
            let at = seg.below.partition_point(|&x| x < k);
            assert!(seg.below.get(at) == Some(&k), "segment {s} released twice");
            seg.below.remove(at);
            return;
        }
        seg.at_max -= 1;
        if seg.at_max > 0 {
            return;
        }
        // The longest holder left: the longest of the others take its place.
        let now = seg.below.last().copied().unwrap_or(0);
        let n = seg.below.len() - seg.below.partition_point(|&x| x < now);
        seg.below.truncate(seg.below.len() - n);
        seg.at_max = n as u32;
        seg.free_from = now;
        self.free += was - now;
        let t = self.tail;
        if t != NONE && self.runs[t as usize].seg == s && self.runs[t as usize].lo == was {
            // The segment's run queued last ends the queue and goes on with these positions.
            self.runs[t as usize].lo = now;
            return;
        }
        let r = self.new_run(s, now, was);
        let seg = &mut self.segs[s as usize];
        let up = std::mem::replace(&mut seg.low, r);
        if up == NONE {
            seg.top = r;
        } else {
            self.runs[up as usize].down = r;
        }
        self.runs[r as usize].up = up;
    }

    /// Appends `n` of a sequence's own unregistered blocks to the queue, last first: `ids`,
    /// in prompt order, if the pool keeps ids.
    fn push_anon(&mut self, n: u32, ids: &[BlockId]) {
        if n == 0 {
            return;
        }
        self.free += n;
        let t = self.tail;
        let r = if t != NONE && self.runs[t as usize].seg == NONE {
            t
        } else {
            self.new_run(NONE, 0, 0)
        };
        let run = &mut self.runs[r as usize];
        if run.lo > 0 {
            // The run heads the queue too (allocations took from it): drop what they took,
            // so that a run that is never emptied does not grow.
            if self.keep_ids {
                run.anon.drain(..run.lo as usize);
            }
            (run.hi, run.lo) = (run.hi - run.lo, 0);
        }
        run.hi += n;
        if self.keep_ids {
            run.anon.extend(ids.iter().rev());
        }
    }

    /// A new run at the queue's tail.
    fn new_run(&mut self, seg: u32, lo: u32, hi: u32) -> u32 {
        let r = match self.unused_runs.pop() {
            Some(r) => r,
            None => {
                self.runs.push(Run::default());
                self.runs.len() as u32 - 1
            }
        };
        let prev = self.tail;
        let run = &mut self.runs[r as usize];
        (run.prev, run.next, run.seg, run.lo, run.hi) = (prev, NONE, seg, lo, hi);
        (run.down, run.up) = (NONE, NONE);
        debug_assert!(run.anon.is_empty());
        if prev == NONE {
            self.head = r;
        } else {
            self.runs[prev as usize].next = r;
        }
        self.tail = r;
        r
    }

    /// Takes run `r` out of the queue and of its segment's runs.
    fn remove_run(&mut self, r: u32) {
        let run = &mut self.runs[r as usize];
        let (prev, next, seg, up, down) = (run.prev, run.next, run.seg, run.up, run.down);
        if run.anon.capacity() > KEEP_IDS {
            run.anon = Vec::new();
        } else {
            run.anon.clear();
        }
        if prev == NONE {
            self.head = next;
        } else {
            self.runs[prev as usize].next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.runs[next as usize].prev = prev;
        }
        if seg != NONE {
            let s = &mut self.segs[seg as usize];
            if s.top == r {
                s.top = down;
            } else {
                self.runs[up as usize].down = down;
            }
            if s.low == r {
                s.low = up;
            } else {
                self.runs[down as usize].up = up;
            }
        }
        self.unused_runs.push(r);
    }

    /// Registers the sequence's blocks under `hashes.get(i)` (its prompt's chain from its
    /// first block) for every `i` from `from` to `upto`, once their KV is computed. A block
    /// whose hash another block holds already stays unregistered (that one holds identical
    /// KV). Each block extends the segment whose last block is the sequence's block before
    /// it, or starts a segment.
    pub fn register_all(
        &mut self,
        blocks: &mut Blocks,
        hashes: &ChainHashes,
        upto: usize,
        from: usize,
    ) {
        if !self.caching {
            return;
        }
        assert!(upto <= hashes.len(), "a hash for every block registered");
        assert!(upto <= blocks.len(), "a block for every hash");
        // Blocks before the sequence's registered end are registered already.
        let from = from.max(blocks.registered_end());
        let (mut prev, mut own) = self.owner_before(blocks, hashes, from);
        let mut i = from;
        // Bounded: every pass registers a block at least, or moves on by one.
        while i < upto {
            let h = hashes.get(i);
            if let Some(x) = self.find(prev, i, h) {
                (prev, own) = (Some(x), false);
                i += 1;
                continue;
            }
            let (s, fresh) = match prev {
                Some((s, p)) if own && p + 1 == self.segs[s as usize].len() => (s, false),
                _ => (self.new_seg(i, upto - i), true),
            };
            // The sequence holds the whole segment `s` and extends it with block `i`, and
            // with the blocks after it up to the next position a segment starts at: the hash
            // of such a block can be in no other segment (it would be at `s`'s next position,
            // past its end, or start a segment there).
            let j = self.starts.next(i + 1, upto);
            let k = (j - i) as u32;
            let seg = &mut self.segs[s as usize];
            // Holding the whole segment, the sequence's chain agrees with it at its positions,
            // so its chain serves as the segment's from now on.
            if !seg.chain.same_arrays(hashes) {
                seg.chain = hashes.clone();
            }
            seg.len += k;
            if self.keep_ids {
                seg.ids.extend_from_slice(&blocks.ids[i..j]);
            }
            // The sequence held the whole segment (the longest holding) and now holds it with
            // the new blocks: the only longest holder.
            if !fresh && seg.at_max > 1 {
                let (was, n) = (seg.free_from, seg.at_max - 1);
                seg.below.extend(std::iter::repeat_n(was, n as usize));
            }
            seg.at_max = 1;
            seg.free_from = seg.len();
            (prev, own) = (Some((s, seg.len() - 1)), true);
            if fresh {
                blocks.push_piece(Piece {
                    seg: s,
                    at: i as u32,
                    n: k,
                });
                self.index_seg(s);
            } else {
                blocks.last_piece_mut().expect("held").n += k;
            }
            i = j;
        }
    }

    /// Where `h` is registered (segment, position), given `prev`, where the hash before it
    /// in its chain is (`None` at a chain's start, or if no block holds it): the next
    /// position of `prev`'s segment, or a segment's start.
    /// `at` is `h`'s chain position.
    fn find(&self, prev: Option<(u32, u32)>, at: usize, h: u64) -> Option<(u32, u32)> {
        if let Some((s, p)) = prev
            && self.segs[s as usize].get(p + 1) == Some(h)
        {
            return Some((s, p + 1));
        }
        self.starting_at(at, h).map(|s| (s, 0))
    }

    /// Where `hashes[from - 1]` is registered, and whether the sequence's own block there is
    /// the registered one (`None` if `from` is 0 or no block holds it). Blocks between the
    /// sequence's registered end and `from` hold hashes other blocks held: the chain is
    /// followed from there.
    fn owner_before(
        &self,
        blocks: &Blocks,
        hashes: &ChainHashes,
        from: usize,
    ) -> (Option<(u32, u32)>, bool) {
        if from == 0 {
            return (None, false);
        }
        let (start, at) = match blocks.pieces().last() {
            Some(p) => ((p.at + p.n) as usize, Some((p.seg, p.n - 1))),
            None => (0, None),
        };
        if start == from {
            return (at, true);
        }
        let found = (start..from).fold(at, |prev, i| self.find(prev, i, hashes.get(i)));
        (found, false)
    }

    /// A new segment at chain position `start`, empty, with room for `most` blocks: the
    /// caller fills it (and so it is indexed, by its first hash, when that is known).
    fn new_seg(&mut self, start: usize, most: usize) -> u32 {
        let s = match self.unused_segs.pop() {
            Some(s) => s,
            None => {
                self.segs.push(Seg::empty());
                self.segs.len() as u32 - 1
            }
        };
        self.starts.add(start);
        // An unused slot keeps the room of its arrays (see `allocate`).
        let seg = &mut self.segs[s as usize];
        debug_assert!(seg.len == 0 && seg.at_max == 0 && seg.below.is_empty());
        if self.keep_ids {
            seg.ids.reserve(most);
        }
        (seg.start, seg.free_from, seg.top, seg.low) = (start as u32, 0, NONE, NONE);
        seg.parted.set(0);
        s
    }

    /// Indexes segment `s`, which holds its first block now.
    fn index_seg(&mut self, s: u32) {
        let segs = &self.segs;
        let first = |x: u32| segs[x as usize].get(0);
        let h = first(s).expect("a segment with a block");
        self.index.make_room(first);
        let new = self.index.insert_new(h, s, first);
        debug_assert!(new, "hash {h:#x} held by a block find missed");
    }

    /// Checks the pool's invariants (for tests and debug runs): the free queue (the untouched
    /// blocks, then the runs, or the stack) holds exactly the free blocks; every segment's
    /// runs are its free positions, highest first in queue order; no block is in two places
    /// and no hash is held twice; the index finds every segment by its first hash.
    pub fn check(&self) -> Result<(), String> {
        if !self.caching {
            return self.check_stack();
        }
        let mut seen = vec![false; self.touched as usize];
        let mut mark = |b: BlockId, what: &str| -> Result<(), String> {
            match seen.get_mut(b as usize) {
                Some(s) if !*s => {
                    *s = true;
                    Ok(())
                }
                _ => Err(format!("block {b} ({what}) is untouched or in two places")),
            }
        };
        // The queue: where each run stands in it.
        let mut place = vec![NONE; self.runs.len()];
        let (mut free, mut k, mut prev, mut r) = (0u64, 0, NONE, self.head);
        while r != NONE {
            let Some(run) = self.runs.get(r as usize) else {
                return Err(format!("the free queue names run {r}, never made"));
            };
            if run.prev != prev {
                return Err(format!("run {r} has a broken back link"));
            }
            if std::mem::replace(&mut place[r as usize], k) != NONE {
                return Err("the free queue has a cycle".into());
            }
            if run.blocks() == 0 {
                return Err(format!("run {r} is empty"));
            }
            if run.seg == NONE {
                if self.keep_ids {
                    if run.anon.len() != run.hi as usize {
                        return Err(format!("run {r} has ids for other blocks"));
                    }
                    for &b in &run.anon[run.lo as usize..] {
                        mark(b, "free")?;
                    }
                }
            } else {
                let seg = self.segs.get(run.seg as usize).filter(|s| s.len() > 0);
                match seg {
                    Some(s) if run.lo >= s.free_from && run.hi <= s.len() && run.lo < run.hi => {}
                    _ => return Err(format!("run {r} names no free positions of a segment")),
                }
            }
            free += run.blocks() as u64;
            (k, prev, r) = (k + 1, r, run.next);
        }
        if self.tail != prev {
            return Err("the free queue's tail is not its last run".into());
        }
        if free + self.untouched() as u64 != self.free as u64 {
            return Err(format!(
                "the queue holds {free} blocks and {} untouched, the counter says {}",
                self.untouched(),
                self.free
            ));
        }
        if k as usize + self.unused_runs.len() != self.runs.len() {
            return Err("a run is neither queued nor unused".into());
        }
        let mut held = std::collections::HashMap::new();
        for (s, seg) in self.live_segs() {
            if (self.keep_ids && seg.ids.len() != seg.len as usize)
                || seg.chain.len() < (seg.start + seg.len) as usize
                || !seg.below.is_sorted()
                || seg.below.last().is_some_and(|&b| b >= seg.free_from)
                || (seg.at_max == 0) != (seg.free_from == 0)
                || seg.free_from > seg.len()
            {
                return Err(format!("segment {s} has inconsistent holders or arrays"));
            }
            // Its runs, from its highest positions down: consecutive, later in the queue.
            let (mut r, mut above, mut at) = (seg.top, NONE, seg.len());
            while r != NONE {
                let run = &self.runs[r as usize];
                if run.seg != s || run.hi != at || run.up != above {
                    return Err(format!("segment {s}'s runs do not cover its free blocks"));
                }
                if above != NONE && place[r as usize] <= place[above as usize] {
                    return Err(format!("segment {s}'s runs are out of queue order"));
                }
                (above, at, r) = (r, run.lo, run.down);
            }
            if at != seg.free_from || seg.low != above {
                return Err(format!("segment {s}'s runs do not reach its held blocks"));
            }
            for &b in &seg.ids {
                mark(b, "registered")?;
            }
            for h in (0..seg.len).map(|p| seg.hash(p)) {
                if let Some(other) = held.insert(h, s) {
                    return Err(format!("segments {other} and {s} both hold {h:#x}"));
                }
            }
            if self.starting(seg.hash(0)) != Some(s) {
                return Err(format!("the index does not find segment {s}"));
            }
        }
        self.starts.check()?;
        let mut starts = vec![0; self.starts.counts.len()];
        for (_, seg) in self.live_segs() {
            match starts.get_mut(seg.start as usize) {
                Some(n) => *n += 1,
                None => return Err("a segment starts where no start is counted".into()),
            }
        }
        if starts != self.starts.counts {
            return Err("segment starts are miscounted".into());
        }
        if let Some(s) = self
            .unused_segs
            .iter()
            .find(|&&s| self.segs[s as usize].len() > 0)
        {
            return Err(format!("segment {s} is unused and holds blocks"));
        }
        Ok(())
    }

    /// Without caching: the stack holds distinct touched blocks, and with the untouched ones
    /// as many as the free counter says. (The instance checks that held blocks are distinct.)
    fn check_stack(&self) -> Result<(), String> {
        if !self.segs.is_empty() || !self.runs.is_empty() || self.index.full_slots() != 0 {
            return Err("a pool without caching keeps segments".into());
        }
        if !self.keep_ids {
            return if self.free <= self.num_blocks && self.stack.is_empty() {
                Ok(())
            } else {
                Err(format!("{} blocks free of {}", self.free, self.num_blocks))
            };
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

    /// A chain of its own.
    fn ch(hashes: &[u64]) -> ChainHashes {
        ChainHashes::from(hashes.to_vec())
    }

    #[test]
    fn segment_start_bits_find_the_next_start_as_the_counts_do() {
        let mut rng = crate::rng::Stream::new(3, 1);
        for round in 0..200 {
            let mut starts = Starts::default();
            let span = 1 + rng.below(300) as usize;
            // Adds and removes at random positions, a position at most a few times.
            for _ in 0..rng.below(40) {
                let at = rng.below(span as u64) as usize;
                if starts.counts.get(at).is_some_and(|&n| n > 0) && rng.below(2) == 0 {
                    starts.remove(at);
                } else {
                    starts.add(at);
                }
            }
            starts.check().unwrap();
            for from in 0..span + 70 {
                for upto in [
                    0,
                    from,
                    from + 1,
                    from + 63,
                    from + 64,
                    from + 65,
                    span,
                    400,
                ] {
                    let want = (from..upto)
                        .find(|&p| starts.counts.get(p).is_some_and(|&n| n > 0))
                        .unwrap_or(upto);
                    assert_eq!(
                        starts.next(from, upto),
                        want,
                        "round {round}: {from}..{upto}"
                    );
                    assert_eq!(
                        starts.any_at(from),
                        starts.counts.get(from).is_some_and(|&n| n > 0)
                    );
                }
            }
        }
    }

    #[test]
    fn registered_blocks_are_found_after_release_until_evicted_lru_first() {
        let mut pool = BlockPool::new(4, true, true);
        let mut a = Blocks::default();
        assert!(pool.allocate(2, &mut a));
        pool.register_all(&mut a, &ch(&[10, 11]), 2, 0);
        let a_ids = a.ids().to_vec();
        pool.release(&mut a);
        assert!(a.is_empty());
        assert_eq!(pool.longest_cached_prefix(&ch(&[10, 11, 12]), 3), (2, 2));

        let mut b = Blocks::default();
        assert!(pool.allocate(2, &mut b));
        pool.register_all(&mut b, &ch(&[20, 21]), 2, 0);
        pool.release(&mut b);
        // Free queue, LRU first: [a1, a0, b1, b0] (each sequence releases last block first).
        let mut c = Blocks::default();
        assert!(pool.allocate(1, &mut c));
        assert_eq!(c.ids(), [a_ids[1]]);
        assert_eq!(pool.stats.evictions, 1);
        assert_eq!(pool.longest_cached_prefix(&ch(&[10, 11]), 2), (1, 1));
        assert_eq!(pool.longest_cached_prefix(&ch(&[20, 21]), 2), (2, 2));
        pool.check().unwrap();
    }

    #[test]
    fn lookups_that_part_from_a_segment_find_where_whether_or_not_the_last_one_parted_there() {
        // One segment of ten blocks; the chains looked up share its first `k` hashes (a
        // system prompt), then go their own way. Hashes name their prefix: a chain that
        // parts at `k` differs at every position from `k` on.
        let mut pool = BlockPool::new(64, true, false);
        let mut a = Blocks::default();
        assert!(pool.allocate(10, &mut a));
        let own: Vec<u64> = (0..10).collect();
        pool.register_all(&mut a, &ch(&own), 10, 0);
        let parting = |k: u64, tag: u64| -> Vec<u64> {
            (0..12)
                .map(|p| if p < k { p } else { 1000 * tag + p })
                .collect()
        };
        // The first search finds 3 and leaves it as the hint; the next ones part at 3 (the
        // hint holds), at 6 and 1 (it does not: searched), at 3 again, and not at all (the
        // whole segment, and the lookup stops at its end).
        for (tag, k, want) in [
            (1, 3, 3),
            (2, 3, 3),
            (3, 6, 6),
            (4, 1, 1),
            (5, 3, 3),
            (6, 12, 10),
        ] {
            let chain = ch(&parting(k, tag));
            for upto in [12, 5, 2] {
                let got = pool.longest_cached_prefix(&chain, upto);
                let hits = want.min(upto as u32);
                assert_eq!(got, (hits, 0), "parting at {k}, up to {upto}");
            }
        }
        // Upto below the hint's place: the hint is out of range and not used.
        assert_eq!(pool.longest_cached_prefix(&ch(&parting(3, 7)), 3), (3, 0));
        pool.release(&mut a);
        assert_eq!(pool.longest_cached_prefix(&ch(&parting(3, 8)), 12), (3, 3));
        pool.check().unwrap();
    }

    #[test]
    fn a_hit_takes_the_block_out_of_the_free_queue_and_makes_it_recent() {
        let mut pool = BlockPool::new(3, true, true);
        let mut a = Blocks::default();
        assert!(pool.allocate(3, &mut a));
        pool.register_all(&mut a, &ch(&[100, 101, 102]), 3, 0);
        let a = {
            let ids = a.ids().to_vec();
            pool.release(&mut a);
            ids
        };
        let mut held = Blocks::default();
        pool.take_cached(&ch(&[100]), 1, &mut held);
        assert_eq!(held.ids(), [a[0]]);
        assert_eq!(pool.free_blocks(), 2);
        pool.release(&mut held);
        // a0 is now the most recent: the next two allocations evict a2 then a1.
        let mut fresh = Blocks::default();
        assert!(pool.allocate(2, &mut fresh));
        assert_eq!(fresh.ids(), [a[2], a[1]]);
        assert_eq!(pool.longest_cached_prefix(&ch(&[100, 101]), 2), (1, 1));
        pool.check().unwrap();
    }

    #[test]
    fn allocation_is_all_or_nothing_and_capacity_is_never_exceeded() {
        let mut pool = BlockPool::new(4, false, true);
        let mut a = Blocks::default();
        assert!(pool.allocate(3, &mut a));
        assert!(!pool.allocate(2, &mut a));
        assert_eq!(a.len(), 3);
        assert_eq!(pool.free_blocks(), 1);
        pool.register_all(&mut a, &ch(&[1]), 1, 0);
        assert_eq!(pool.cached_blocks(), 0, "caching off registers nothing");
        pool.release(&mut a);
        assert_eq!(pool.free_blocks(), 4);
        pool.check().unwrap();
    }

    #[test]
    fn the_cache_hint_names_the_head_run_once_no_block_is_untouched() {
        use crate::actor::Hot;
        let mut pool = BlockPool::new(4, true, false);
        let mut a = Blocks::default();
        assert!(pool.allocate(2, &mut a));
        pool.release(&mut a);
        // Untouched blocks are taken first: no run is read by the next allocation.
        assert_eq!(pool.hint(Hot::default()), Hot::default());
        let mut b = Blocks::default();
        assert!(pool.allocate(2, &mut b));
        let head = &pool.runs[pool.head as usize];
        let h = pool.hint(Hot::default());
        assert_eq!(h.values[1], (head as *const Run).addr());
        assert_eq!(h.value_bytes[1] as usize, std::mem::size_of::<Run>());
        pool.release(&mut b);
    }

    #[test]
    fn untouched_blocks_head_the_free_queue_in_id_order() {
        let mut pool = BlockPool::new(5, true, true);
        let mut a = Blocks::default();
        assert!(pool.allocate(2, &mut a));
        assert_eq!(a.ids(), [0, 1]);
        assert_eq!(pool.touched, 2);
        pool.release(&mut a);
        // Free queue: the untouched 2, 3, 4, then a1, a0 (released last block first).
        let mut b = Blocks::default();
        assert!(pool.allocate(5, &mut b));
        assert_eq!(b.ids(), [2, 3, 4, 1, 0]);
        pool.check().unwrap();
        pool.release(&mut b);
        assert_eq!(pool.free_blocks(), 5);
        pool.check().unwrap();
    }

    #[test]
    fn without_caching_released_blocks_are_reused_first_and_untouched_ones_after() {
        let mut pool = BlockPool::new(4, false, true);
        let mut a = Blocks::default();
        assert!(pool.allocate(2, &mut a));
        pool.release(&mut a);
        let mut b = Blocks::default();
        assert!(pool.allocate(3, &mut b));
        assert_eq!(b.ids(), [0, 1, 2]);
        assert_eq!(pool.free_blocks(), 1);
        pool.check().unwrap();
        pool.release(&mut b);
        assert_eq!(pool.free_blocks(), 4);
        pool.check().unwrap();
    }

    #[test]
    fn the_check_finds_each_kind_of_broken_pool() {
        for keep_ids in [true, false] {
            let mut pool = BlockPool::new(8, true, keep_ids);
            let mut a = Blocks::default();
            assert!(pool.allocate(4, &mut a));
            pool.register_all(&mut a, &ch(&[1, 2, 3, 4]), 4, 0);
            let mut b = Blocks::default();
            pool.take_cached(&ch(&[1, 2]), 2, &mut b);
            pool.release(&mut a);
            // Segment 0 holds 1..4, held to 2 by `b`; its positions 2 and 3 are one run.
            pool.check().unwrap();
            type Break = (&'static str, fn(&mut BlockPool));
            let breaks: [Break; 8] = [
                ("free counter", |p| p.free -= 1),
                ("start bits", |p| p.starts.any[0] = 0),
                ("free from", |p| p.segs[0].free_from = 1),
                ("holders", |p| p.segs[0].at_max = 0),
                ("a run's end", |p| p.runs[p.head as usize].lo += 1),
                ("starts", |p| p.starts.counts[0] += 1),
                ("index", |p| p.index = BlockIndex::new(8)),
                ("a hash held twice", |p| {
                    let s = p.new_seg(3, 4);
                    let id = p.segs[0].ids.last().copied();
                    // Position 3 of segment 0's chain: its hash 4.
                    p.segs[s as usize].chain = ch(&[1, 2, 3, 4]);
                    p.segs[s as usize].len = 1;
                    p.segs[s as usize].ids.extend(id);
                    p.index_seg(s);
                }),
            ];
            for (what, f) in breaks {
                let mut broken = pool.clone();
                f(&mut broken);
                assert!(broken.check().is_err(), "{what} (ids: {keep_ids})");
            }
        }
    }

    #[test]
    fn a_run_that_is_never_emptied_stays_as_small_as_its_blocks() {
        for keep_ids in [true, false] {
            let mut pool = BlockPool::new(4, true, keep_ids);
            let mut a = Blocks::default();
            assert!(pool.allocate(4, &mut a));
            pool.release(&mut a);
            // One unregistered block taken from the head of the only run and given back to
            // its tail, over and over: the run always holds blocks.
            for _ in 0..10_000 {
                assert!(pool.allocate(1, &mut a));
                pool.release(&mut a);
            }
            pool.check().unwrap();
            let run = &pool.runs[pool.head as usize];
            assert_eq!((pool.runs.len(), run.hi - run.lo), (1, 4));
            assert!(run.hi <= 8 && run.anon.len() <= 8, "{run:?}");
        }
    }

    #[test]
    fn shared_blocks_are_freed_only_by_their_last_holder() {
        let mut pool = BlockPool::new(2, true, true);
        let mut a = Blocks::default();
        assert!(pool.allocate(1, &mut a));
        pool.register_all(&mut a, &ch(&[7]), 1, 0);
        let mut b = Blocks::default();
        pool.take_cached(&ch(&[7]), 1, &mut b);
        pool.release(&mut a);
        assert_eq!(pool.free_blocks(), 1);
        pool.release(&mut b);
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
        for seed in 0..300u64 {
            let mut rng = Stream::new(seed, 7);
            let n = 8 + rng.below(100) as u32;
            // One run in four without caching: blocks come and go, nothing is found again.
            let caching = seed % 4 != 0;
            let mut pool = BlockPool::new(n, caching, true);
            // The same pool counting blocks only, as a simulation has it: it must agree on
            // everything but the ids.
            let mut count = BlockPool::new(n, caching, false);
            let mut model = Reference::new(n, caching);
            // Running sequences: their hash chain, blocks held, and blocks registered so far.
            let mut running: Vec<(ChainHashes, Blocks, Blocks, usize)> = Vec::new();
            let mut leads: std::collections::HashMap<(u64, usize), std::sync::Arc<[u64]>> =
                std::collections::HashMap::new();
            for step in 0..600 {
                let at = format!("seed {seed}, step {step}");
                match rng.below(4) {
                    // A new sequence: a prompt of one of 4 contexts (shared leading blocks)
                    // then blocks of its own; it takes its cached prefix and allocates the rest.
                    0 | 1 => {
                        let context = rng.below(4);
                        let shared = rng.below(24) as usize;
                        let len = 1 + rng.below(30) as usize;
                        let own = rng.next_u64();
                        let hash = |i: usize| {
                            let root = if i < shared { context } else { own };
                            mix64(root ^ mix64(i as u64 + 1))
                        };
                        let hashes: Vec<u64> = (0..len).map(hash).collect();
                        // As the memo gives them: the leading blocks in an array shared by
                        // every prompt with the same leading part (one prompt in two), the
                        // rest its own; or all its own.
                        let chain = if rng.below(2) == 0 {
                            let lead = leads
                                .entry((context, shared.min(len)))
                                .or_insert_with(|| (0..shared.min(len)).map(hash).collect())
                                .clone();
                            ChainHashes::from_parts(lead, hashes[shared.min(len)..].to_vec())
                        } else {
                            ChainHashes::from(hashes.clone())
                        };
                        assert_eq!(chain.to_vec(), hashes);
                        let (hits, free) = pool.longest_cached_prefix(&chain, len);
                        assert_eq!((hits, free), model.longest_cached_prefix(&hashes), "{at}");
                        assert_eq!(
                            (hits, free),
                            count.longest_cached_prefix(&chain, len),
                            "{at}"
                        );
                        let (mut a, mut c, mut b) =
                            (Blocks::default(), Blocks::default(), Vec::new());
                        pool.take_cached(&chain, hits as usize, &mut a);
                        count.take_cached(&chain, hits as usize, &mut c);
                        model.take_cached(&hashes[..hits as usize], &mut b);
                        let rest = len as u32 - hits;
                        let ok = pool.allocate(rest, &mut a);
                        assert_eq!(ok, model.allocate(rest, &mut b), "{at}");
                        assert_eq!(ok, count.allocate(rest, &mut c), "{at}");
                        assert_eq!(a.ids(), b, "{at}: blocks handed out");
                        assert_eq!((a.len(), c.len(), c.ids()), (b.len(), b.len(), &[][..]));
                        if ok {
                            running.push((chain, a, c, hits as usize));
                        } else {
                            // As an instance that cannot admit it: give the hits back.
                            pool.release(&mut a);
                            count.release(&mut c);
                            model.release(&b);
                        }
                    }
                    // A running sequence computes some more of its prompt: those blocks are
                    // registered (a block whose hash another holds stays unregistered).
                    2 if !running.is_empty() => {
                        let i = rng.below(running.len() as u64) as usize;
                        let (hashes, blocks, counted, done) = &mut running[i];
                        let upto =
                            *done + rng.range_inclusive(0, (hashes.len() - *done) as u64) as usize;
                        pool.register_all(blocks, hashes, upto, *done);
                        count.register_all(counted, hashes, upto, *done);
                        assert_eq!(blocks.own(), counted.own(), "{at}");
                        let ids = &blocks.ids()[*done..upto];
                        for (k, &b) in ids.iter().enumerate() {
                            model.register(b, hashes.get(*done + k));
                        }
                        *done = upto;
                    }
                    // A sequence finishes (or is preempted): it releases every block.
                    _ if !running.is_empty() => {
                        let i = rng.below(running.len() as u64) as usize;
                        let (_, mut blocks, mut counted, _) = running.swap_remove(i);
                        let ids = blocks.ids().to_vec();
                        pool.release(&mut blocks);
                        count.release(&mut counted);
                        model.release(&ids);
                    }
                    _ => {}
                }
                let free = model.free.len() + model.stack.len();
                assert_eq!(pool.free_blocks() as usize, free, "{at}");
                assert_eq!(pool.stats.evictions, model.evictions, "{at}");
                assert_eq!(pool.stats.hit_blocks, model.hit_blocks, "{at}");
                assert_eq!(pool.cached_blocks(), model.index.len(), "{at}");
                pool.check().unwrap_or_else(|e| panic!("{at}: {e}"));
                let counted = (count.free_blocks(), count.stats, count.cached_blocks());
                assert_eq!(
                    counted,
                    (pool.free_blocks(), pool.stats, pool.cached_blocks())
                );
                assert_eq!(count.held_registered(), pool.held_registered(), "{at}");
                count
                    .check()
                    .unwrap_or_else(|e| panic!("{at}: counting: {e}"));
            }
        }
    }
}
