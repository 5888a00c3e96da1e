//! The pool itself: lookup, hits, allocation and release (see the module doc of [`super`]);
//! registration is in [`super::register`], the invariants' check in [`super::check`].

use super::blocks::{Blocks, Piece};
use super::index::BlockIndex;
use super::prompt_hashes::ChainHashes;
use super::segments::{Run, Seg, Starts};
use super::*;
use crate::metrics::PoolStats;
use crate::serving::msg::KvEvent;

/// A fixed pool of KV blocks.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// Blocks allocated at least once: ids from `touched` to `num_blocks` are untouched.
    pub(super) touched: u32,
    pub(super) num_blocks: u32,
    pub(super) free: u32,
    pub(super) caching: bool,
    /// Whether blocks have ids (see the module doc).
    pub(super) keep_ids: bool,
    /// With caching: segments and runs (slabs, with lists of their unused slots), the free
    /// queue's touched runs (behind the untouched blocks), and segment start hash -> segment.
    pub(super) segs: Vec<Seg>,
    pub(super) unused_segs: Vec<u32>,
    pub(super) runs: Vec<Run>,
    pub(super) unused_runs: Vec<u32>,
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) index: BlockIndex,
    /// Live segments by the chain position of their first block: a hash at a position no
    /// segment starts at is not in the index, and registration asks the index only where
    /// one does.
    pub(super) starts: Starts,
    /// Without caching: free touched blocks, most recently released last.
    pub(super) stack: Vec<BlockId>,
    pub stats: PoolStats,
    /// With KV events on ([`super::GpuPool::publish_events`]): the blocks registered and
    /// evicted since they were last taken, in order.
    pub(super) events: Option<Vec<KvEvent>>,
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
            events: None,
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

    /// Free blocks (including free blocks that still hold a registered prefix).
    pub fn free_blocks(&self) -> u32 {
        self.free
    }

    /// Number of registered blocks (in use or free).
    #[cfg(test)]
    pub fn cached_blocks(&self) -> usize {
        self.live_segs().map(|(_, s)| s.len as usize).sum()
    }

    pub(super) fn live_segs(&self) -> impl Iterator<Item = (u32, &Seg)> {
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
    pub(super) fn untouched(&self) -> u32 {
        self.num_blocks - self.touched
    }

    /// Segment `s`'s first hash (`None` once it has no block: an index slot naming it is
    /// stale).
    pub(super) fn first_hash(&self, s: u32) -> Option<u64> {
        self.segs[s as usize].get(0)
    }

    /// The segment that starts with hash `h`.
    pub(super) fn starting(&self, h: u64) -> Option<u32> {
        self.index.get(h, |s| self.first_hash(s))
    }

    /// Whether a live segment starts at chain position `at`.
    #[inline]
    pub(super) fn starts_at(&self, at: usize) -> bool {
        self.starts.any_at(at)
    }

    /// The segment that starts with hash `h`, at chain position `at`.
    #[inline]
    pub(super) fn starting_at(&self, at: usize, h: u64) -> Option<u32> {
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
    pub(super) fn step(&self, hashes: &ChainHashes, upto: usize, at: usize) -> Option<(u32, u32)> {
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
    pub(super) fn hold(&mut self, s: u32, k: u32) {
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
                if let Some(events) = &mut self.events {
                    // Last position first: the chain is never cut at its head while its tail
                    // is still published.
                    let gone = (kept as u32..hi).rev();
                    events.extend(gone.filter_map(|p| seg.get(p)).map(KvEvent::Removed));
                }
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
    pub(super) fn drop_holder(&mut self, s: u32, k: u32) {
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
    pub(super) fn push_anon(&mut self, n: u32, ids: &[BlockId]) {
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
    pub(super) fn new_run(&mut self, seg: u32, lo: u32, hi: u32) -> u32 {
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
    pub(super) fn remove_run(&mut self, r: u32) {
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
}
