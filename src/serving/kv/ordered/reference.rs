//! The ordered pool written the obvious way, straight from the algorithms: the oracle of its
//! differential test. Every block is a record from the start; LFU scans every free
//! registered block for the smallest `(accesses, last release, hash)`; S3-FIFO keeps plain
//! queues (front = tail = oldest) and walks them as libCacheSim's `S3FIFO.c` does, passing
//! over blocks in use in place.

use std::collections::{HashMap, VecDeque};

use super::super::{BlockId, GpuEviction};

/// S3-FIFO's counter cap (2 bits) and the counter at which the small FIFO promotes.
const MAX_FREQ: u8 = 3;
const MOVE_TO_MAIN: u8 = 2;

#[derive(Default)]
pub(super) struct Reference {
    pub(super) lfu: bool,
    pub(super) refs: Vec<u32>,
    pub(super) hash: Vec<Option<u64>>,
    pub(super) index: HashMap<u64, BlockId>,
    /// Released hashless blocks (most recent last), then untouched ones from `next`.
    stack: Vec<BlockId>,
    next: u32,
    /// LFU: accesses and last release of each block.
    hits: Vec<u32>,
    freed: Vec<u64>,
    tick: u64,
    /// S3-FIFO: the small and main FIFOs and the ghost, oldest at the front; counters.
    small: VecDeque<u64>,
    main: VecDeque<u64>,
    ghost: VecDeque<u64>,
    freq: HashMap<u64, u8>,
    main_capacity: usize,
    pub(super) evictions: u64,
    pub(super) hit_blocks: u64,
    /// S3-FIFO's paths taken (so that the test knows it exercised them): inserts that hit
    /// the ghost, promotions from the small FIFO, reinsertions in the main one, blocks in use
    /// passed over.
    pub(super) ghost_hits: u64,
    pub(super) promotions: u64,
    pub(super) reinsertions: u64,
    pub(super) passed_over: u64,
}

impl Reference {
    pub(super) fn new(n: u32, order: GpuEviction) -> Reference {
        Reference {
            lfu: order == GpuEviction::Lfu,
            refs: vec![0; n as usize],
            hash: vec![None; n as usize],
            hits: vec![0; n as usize],
            freed: vec![0; n as usize],
            main_capacity: (n - n / 10) as usize,
            ..Reference::default()
        }
    }

    pub(super) fn free(&self) -> usize {
        self.refs.iter().filter(|&&r| r == 0).count()
    }

    pub(super) fn cached_hashes(&self) -> Vec<u64> {
        let mut h: Vec<u64> = self.index.keys().copied().collect();
        h.sort_unstable();
        h
    }

    pub(super) fn longest_cached_prefix(&self, hashes: &[u64]) -> (u32, u32) {
        let (mut hits, mut free) = (0, 0);
        for h in hashes {
            let Some(&b) = self.index.get(h) else { break };
            hits += 1;
            free += u32::from(self.refs[b as usize] == 0);
        }
        (hits, free)
    }

    pub(super) fn take_cached(&mut self, hashes: &[u64], out: &mut Vec<BlockId>) {
        for h in hashes {
            let b = self.index[h];
            self.refs[b as usize] += 1;
            self.hits[b as usize] += 1;
            if let Some(f) = self.freq.get_mut(h) {
                *f = (*f + 1).min(MAX_FREQ);
            }
            out.push(b);
        }
        self.hit_blocks += hashes.len() as u64;
    }

    pub(super) fn allocate(&mut self, n: u32, out: &mut Vec<BlockId>) -> bool {
        if n as usize > self.free() {
            return false;
        }
        for _ in 0..n {
            let b = match self.stack.pop() {
                Some(b) => b,
                None if (self.next as usize) < self.refs.len() => {
                    self.next += 1;
                    self.next - 1
                }
                None => {
                    let h = if self.lfu {
                        self.lfu_victim()
                    } else {
                        self.s3fifo_victim()
                    };
                    let b = self.index.remove(&h).unwrap();
                    self.hash[b as usize] = None;
                    self.evictions += 1;
                    b
                }
            };
            self.refs[b as usize] = 1;
            out.push(b);
        }
        true
    }

    pub(super) fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] > 0 {
                continue;
            }
            if self.hash[b as usize].is_some() {
                self.tick += 1;
                self.freed[b as usize] = self.tick;
            } else {
                self.stack.push(b);
            }
        }
    }

    pub(super) fn register(&mut self, b: BlockId, h: u64) {
        if self.hash[b as usize].is_some() || self.index.contains_key(&h) {
            return;
        }
        self.index.insert(h, b);
        self.hash[b as usize] = Some(h);
        self.hits[b as usize] = 1;
        // S3-FIFO's insert: to the main FIFO on a ghost hit (leaving the ghost), else to the
        // small one, with counter 0.
        if let Some(at) = self.ghost.iter().position(|&g| g == h) {
            self.ghost.remove(at);
            self.main.push_back(h);
            self.ghost_hits += 1;
        } else {
            self.small.push_back(h);
        }
        self.freq.insert(h, 0);
    }

    fn in_use(&self, h: u64) -> bool {
        self.refs[self.index[&h] as usize] > 0
    }

    /// The free registered block of fewest accesses, least recently released, lowest hash.
    fn lfu_victim(&self) -> u64 {
        let free = (0..self.refs.len()).filter(|&b| self.refs[b] == 0);
        let cached = free.filter_map(|b| self.hash[b].map(|h| (self.hits[b], self.freed[b], h)));
        cached.min().expect("a free registered block").2
    }

    /// S3-FIFO's eviction: from the main FIFO when it holds more than its share or the small
    /// one is empty, else from the small one; the other list when the chosen one has no free
    /// block (the small one may promote into the main one on the way).
    fn s3fifo_victim(&mut self) -> u64 {
        let h = if self.main.len() > self.main_capacity || self.small.is_empty() {
            self.evict_main()
                .or_else(|| self.evict_small())
                .or_else(|| self.evict_main())
        } else {
            self.evict_small().or_else(|| self.evict_main())
        };
        let h = h.expect("a free registered block");
        self.freq.remove(&h);
        h
    }

    fn evict_small(&mut self) -> Option<u64> {
        let mut i = 0;
        while i < self.small.len() {
            let h = self.small[i];
            if self.in_use(h) {
                i += 1;
                self.passed_over += 1;
            } else if self.freq[&h] >= MOVE_TO_MAIN {
                self.small.remove(i);
                self.main.push_back(h);
                self.freq.insert(h, 0);
                self.promotions += 1;
            } else {
                self.small.remove(i);
                if self.main_capacity > 0 {
                    self.ghost.push_back(h);
                    while self.ghost.len() > self.main_capacity {
                        self.ghost.pop_front();
                    }
                }
                return Some(h);
            }
        }
        None
    }

    fn evict_main(&mut self) -> Option<u64> {
        let mut i = 0;
        while i < self.main.len() {
            let h = self.main[i];
            if self.in_use(h) {
                i += 1;
                self.passed_over += 1;
            } else if self.freq[&h] >= 1 {
                self.main.remove(i);
                self.main.push_back(h);
                *self.freq.get_mut(&h).unwrap() -= 1;
                self.reinsertions += 1;
            } else {
                self.main.remove(i);
                return Some(h);
            }
        }
        None
    }
}
