//! Approximate KV-aware routing (`router = "kv-approx"`): what the router guesses of each
//! instance's KV cache, and the score it picks by. (`kv-aware` routes on the KV events the
//! instances and the store publish instead: [`crate::serving::router::kv_index`].)
//!
//! **What the router knows.** Only what it sent where, as the approximate prefix-tree routers
//! of SGLang and llm-d's approximate prefix scorer do (no KV events from instances): for each
//! instance, the chained hashes of the prompt blocks of the requests it sent there, as an LRU
//! set bounded by the instance's KV capacity in blocks (`num_blocks`: more than that cannot be
//! cached there). A prompt's blocks enter the set last first, so that its first block is its
//! most recent and the set forgets a prompt from its tail: losing its head first would lose
//! the whole prefix match while the rest is still held (the store directory and the GPU
//! pool's events order their removals the same way). It is an estimate: the instance may have
//! evicted blocks sooner (under pressure from running sequences), and a block counts as
//! cached as soon as its request is sent.
//!
//! **The score** of instance `i` for a request of `B` prompt blocks, of which the leading `h_i`
//! are in `i`'s set, is Dynamo's KV router cost
//!
//! ```text
//! cost_i = overlap_weight x (B - h_i) + active_i
//! ```
//!
//! with `B - h_i` the blocks it would have to prefill and `active_i` the KV blocks (prompt plus
//! output) of the requests the router has sent to `i` that have not finished: its load. The
//! lowest cost wins; ties go to the lowest index. `overlap_weight` is
//! `serving.kv_overlap_weight` (default 1, Dynamo's default). It works with every policy: under
//! store policies a prefix can be loaded anywhere, but one already in GPU memory costs
//! nothing to load.

use std::collections::{BTreeMap, HashMap};

use crate::hash::IdBuildHasher;

/// The LRU set of prompt-block hashes the router believes one instance holds (here), or
/// that an instance reported ([`crate::serving::router::kv_index`]).
#[derive(Debug)]
pub(crate) struct PrefixSet {
    last_use: HashMap<u64, u64, IdBuildHasher>,
    by_use: BTreeMap<u64, u64>,
    capacity: usize,
}

impl PrefixSet {
    pub(crate) fn new(capacity: usize) -> PrefixSet {
        PrefixSet {
            last_use: HashMap::default(),
            by_use: BTreeMap::new(),
            capacity,
        }
    }

    /// Leading `hashes` in the set.
    pub(crate) fn overlap(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.last_use.contains_key(h))
            .count()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.last_use.len()
    }

    /// Forgets `hash`; whether it was in the set.
    pub(crate) fn remove(&mut self, hash: u64) -> bool {
        match self.last_use.remove(&hash) {
            Some(t) => {
                self.by_use.remove(&t);
                true
            }
            None => false,
        }
    }

    /// Forgets every hash.
    pub(crate) fn clear(&mut self) {
        self.last_use.clear();
        self.by_use.clear();
    }

    /// Puts `hash` in the set as its most recent entry (`tick` must grow from call to call),
    /// forgetting the least recent one when the set is over capacity.
    pub(crate) fn touch(&mut self, hash: u64, tick: u64) {
        if let Some(old) = self.last_use.insert(hash, tick) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(tick, hash);
        // Bounded: at most one entry over capacity at a time.
        while self.last_use.len() > self.capacity {
            let Some((_, h)) = self.by_use.pop_first() else {
                break;
            };
            self.last_use.remove(&h);
        }
    }
}

/// The KV blocks (prompt and output) of the requests the router sent to each instance that
/// have not ended: the load term of both KV routers' cost (this one's and
/// [`super::router::kv_index`]'s).
#[derive(Debug)]
pub(crate) struct ActiveBlocks {
    active: Vec<u64>,
    block_size: u32,
}

impl ActiveBlocks {
    pub(crate) fn new(instances: usize, block_size: u32) -> ActiveBlocks {
        ActiveBlocks {
            active: vec![0; instances],
            block_size,
        }
    }

    pub(crate) fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The KV blocks a request of these sizes holds at most.
    pub(crate) fn blocks(&self, prompt_tokens: u32, output_tokens: u32) -> u64 {
        (prompt_tokens + output_tokens).div_ceil(self.block_size) as u64
    }

    pub(crate) fn sent(&mut self, i: usize, blocks: u64) {
        self.active[i] += blocks;
    }

    pub(crate) fn ended(&mut self, i: usize, blocks: u64) {
        self.active[i] = self.active[i].saturating_sub(blocks);
    }

    pub(crate) fn reset(&mut self, i: usize) {
        self.active[i] = 0;
    }

    /// The live instance of least `overlap_weight x prefill(i) + active_i`; ties go to the
    /// lowest index.
    pub(crate) fn cheapest(
        &self,
        alive: &[bool],
        overlap_weight: f64,
        mut prefill: impl FnMut(usize) -> f64,
    ) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        for i in (0..self.active.len()).filter(|&i| alive[i]) {
            let cost = overlap_weight * prefill(i) + self.active[i] as f64;
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, i));
            }
        }
        best.map(|(_, i)| i)
    }
}

/// The router's view of every instance's KV cache.
#[derive(Debug)]
pub struct KvRouting {
    sets: Vec<PrefixSet>,
    active: ActiveBlocks,
    overlap_weight: f64,
    tick: u64,
    hashes: Vec<u64>,
}

impl KvRouting {
    /// For `instances` instances of `num_blocks` KV blocks of `block_size` tokens.
    pub fn new(instances: usize, num_blocks: u32, block_size: u32, overlap_weight: f64) -> Self {
        KvRouting {
            sets: (0..instances)
                .map(|_| PrefixSet::new(num_blocks as usize))
                .collect(),
            active: ActiveBlocks::new(instances, block_size),
            overlap_weight,
            tick: 0,
            hashes: Vec::new(),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.active.block_size()
    }

    /// The KV blocks a request of these sizes holds at most.
    pub fn blocks(&self, prompt_tokens: u32, output_tokens: u32) -> u64 {
        self.active.blocks(prompt_tokens, output_tokens)
    }

    /// The cheapest instance among those `alive` for a prompt whose block hashes are
    /// `hashes` (kept for [`Self::sent`]).
    pub fn pick(&mut self, hashes: Vec<u64>, alive: &[bool]) -> Option<usize> {
        self.hashes = hashes;
        let (sets, hashes) = (&self.sets, &self.hashes);
        let b = hashes.len() as f64;
        self.active.cheapest(alive, self.overlap_weight, |i| {
            b - sets[i].overlap(hashes) as f64
        })
    }

    /// The request whose hashes were last given to [`Self::pick`] went to `i`, holding
    /// `blocks` KV blocks until it ends.
    pub fn sent(&mut self, i: usize, blocks: u64) {
        self.active.sent(i, blocks);
        // Last block first, so that the first is the most recent: evictions take a prompt's
        // tail before its head, and a set that lost some of a prompt still matches its head.
        for k in (0..self.hashes.len()).rev() {
            self.tick += 1;
            self.sets[i].touch(self.hashes[k], self.tick);
        }
    }

    /// A request of `blocks` KV blocks at `i` ended (finished, rejected or failed over).
    pub fn ended(&mut self, i: usize, blocks: u64) {
        self.active.ended(i, blocks);
    }

    /// Instance `i` is gone: nothing of its cache remains.
    pub fn lost(&mut self, i: usize) {
        self.sets[i].clear();
        self.active.reset(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_holding_the_prefix_wins_until_its_load_outweighs_it() {
        let mut kv = KvRouting::new(2, 100, 16, 1.0);
        let alive = [true, true];
        let a: Vec<u64> = (1..=10).collect();
        // Nothing known: a tie, the lowest index.
        assert_eq!(kv.pick(a.clone(), &alive), Some(0));
        kv.sent(0, 12);
        // Instance 0 holds all 10 blocks but carries 12 active blocks: cost 0 + 12 against
        // 10 + 0 for instance 1.
        assert_eq!(kv.pick(a.clone(), &alive), Some(1));
        kv.ended(0, 12);
        assert_eq!(kv.pick(a.clone(), &alive), Some(0));
        // Weighting the prefill more keeps a loaded instance with the prefix.
        let mut kv = KvRouting::new(2, 100, 16, 2.0);
        kv.pick(a.clone(), &alive);
        kv.sent(0, 12);
        assert_eq!(kv.pick(a, &alive), Some(0));
    }

    #[test]
    fn an_instances_set_is_bounded_by_its_kv_blocks_and_forgets_the_oldest() {
        let mut kv = KvRouting::new(1, 4, 16, 1.0);
        kv.pick(vec![1, 2, 3], &[true]);
        kv.sent(0, 0);
        kv.pick(vec![7, 8], &[true]);
        kv.sent(0, 0);
        // 5 hashes sent, room for 4: the oldest went first, and of prompt [1, 2, 3] that is
        // its last block (touched first), so its head still matches.
        assert_eq!(kv.sets[0].last_use.len(), 4);
        assert_eq!(kv.sets[0].overlap(&[1, 2, 3]), 2);
        assert_eq!(kv.sets[0].overlap(&[7, 8]), 2);
        // Two more blocks: [1, 2] goes tail first, block 2 then block 1.
        kv.pick(vec![9], &[true]);
        kv.sent(0, 0);
        assert_eq!(kv.sets[0].overlap(&[1, 2, 3]), 1);
        kv.pick(vec![10], &[true]);
        kv.sent(0, 0);
        assert_eq!(kv.sets[0].overlap(&[1, 2, 3]), 0);
        assert_eq!(kv.sets[0].overlap(&[7, 8]), 2);
        kv.lost(0);
        assert_eq!(kv.sets[0].overlap(&[7, 8]), 0);
        assert_eq!(kv.pick(vec![7], &[false]), None);
    }
}
