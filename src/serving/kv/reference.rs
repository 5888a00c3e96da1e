//! vLLM's prefix-caching pool written the obvious way: the oracle of the differential test.

use super::BlockId;

/// vLLM's prefix-caching pool written the obvious way (a queue of free blocks, LRU at
/// the front, and a map of registered hashes), against which [`BlockPool`] must agree
/// operation by operation: the same blocks handed out, the same hits, the same evictions.
#[derive(Default)]
pub(super) struct Reference {
    pub(super) refs: Vec<u32>,
    pub(super) hash: Vec<Option<u64>>,
    pub(super) free: std::collections::VecDeque<BlockId>,
    pub(super) index: std::collections::HashMap<u64, BlockId>,
    pub(super) evictions: u64,
    pub(super) hit_blocks: u64,
    /// Without caching: the most recently released block is handed out first, then the
    /// untouched ones in id order (nothing is cached, so which one is unobservable).
    pub(super) caching: bool,
    pub(super) stack: Vec<BlockId>,
}

impl Reference {
    pub(super) fn new(n: u32, caching: bool) -> Reference {
        Reference {
            refs: vec![0; n as usize],
            hash: vec![None; n as usize],
            free: (0..n).collect(),
            caching,
            ..Reference::default()
        }
    }
    pub(super) fn longest_cached_prefix(&self, hashes: &[u64]) -> (u32, u32) {
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
    pub(super) fn take_cached(&mut self, hashes: &[u64], out: &mut Vec<BlockId>) {
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
    pub(super) fn allocate(&mut self, n: u32, out: &mut Vec<BlockId>) -> bool {
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
    pub(super) fn release(&mut self, blocks: &[BlockId]) {
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
    pub(super) fn register(&mut self, b: BlockId, h: u64) {
        if self.caching && self.hash[b as usize].is_none() && !self.index.contains_key(&h) {
            self.index.insert(h, b);
            self.hash[b as usize] = Some(h);
        }
    }
}
