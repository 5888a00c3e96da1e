//! Statistics of a trace, and its prefix-reuse potential.
//!
//! Lengths are summarised by mean and nearest-rank percentiles (p50, p90, p99) and maximum.
//! The arrival rate is `requests / (last arrival - first arrival)`.
//!
//! **Prefix-hit ratio** (the reuse a cache could give, before any serving effect): prompts are
//! cut into blocks of `block_size` tokens (the last one may be partial); a block is identified
//! by the chained hash of its tokens and of everything before it ([`block_hash`]), so equal
//! blocks mean equal prefixes. Requests are taken in arrival order. A request's hit is its
//! longest run of leading blocks present in the cache, counted in tokens (a partial last
//! block counts its real length); then every block of the request becomes most recently used
//! (missing ones are inserted), and least recently used blocks are evicted while the cache
//! holds more than its capacity in tokens. The ratio is hits over prompt tokens, summed over
//! requests. With an unbounded cache nothing is evicted. The LRU is a hash map into an
//! intrusive doubly linked list: O(1) per block.
//!
//! **Belady bound**: the hit ratio of Belady's rule (furthest next use goes first, with bypass)
//! on the same blocks taken as independent accesses, with a cache of as many tokens: an upper
//! bound on the prefix-hit ratio of the LRU, or of any eviction, with that capacity on that
//! trace ([`super::optimal`] says what it is exactly and why it bounds).

use std::collections::{HashMap, HashSet};

use super::optimal::optimal_hit_tokens;
use super::{ReqId, Trace};
use crate::hash::{IdBuildHasher, ROOT_PARENT, block_hash};

/// A length distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LenDist {
    pub mean: f64,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
}

impl LenDist {
    pub fn of(mut v: Vec<u32>) -> LenDist {
        if v.is_empty() {
            return LenDist::default();
        }
        v.sort_unstable();
        let n = v.len();
        let pct = |q: f64| crate::metrics::nearest_rank(&v, q);
        LenDist {
            mean: v.iter().map(|&x| x as f64).sum::<f64>() / n as f64,
            p50: pct(50.0),
            p90: pct(90.0),
            p99: pct(99.0),
            max: v[n - 1],
        }
    }
}

/// The blocks of every request: `(identity, tokens)`, request after request.
pub struct Blocks {
    blocks: Vec<(u64, u32)>,
    /// Request `i`'s blocks are `blocks[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
    prompt_tokens: u64,
}

impl Blocks {
    pub fn of(trace: &Trace, block_size: u32) -> Blocks {
        let bs = block_size.max(1) as usize;
        let mut blocks = Vec::new();
        let mut starts = Vec::with_capacity(trace.requests.len() + 1);
        let mut block = Vec::with_capacity(bs);
        let mut prompt_tokens = 0;
        for id in trace.ids() {
            starts.push(blocks.len());
            let mut parent = ROOT_PARENT;
            block.clear();
            for t in trace.prompt(id) {
                block.push(t);
                if block.len() == bs {
                    parent = block_hash(parent, &block);
                    blocks.push((parent, bs as u32));
                    block.clear();
                }
            }
            if !block.is_empty() {
                blocks.push((block_hash(parent, &block), block.len() as u32));
            }
            prompt_tokens += trace.request(ReqId(id.0)).prompt_tokens as u64;
        }
        starts.push(blocks.len());
        Blocks {
            blocks,
            starts,
            prompt_tokens,
        }
    }

    /// Every block of every request, in order: the accesses of [`super::optimal`].
    pub fn accesses(&self) -> &[(u64, u32)] {
        &self.blocks
    }

    fn requests(&self) -> impl Iterator<Item = &[(u64, u32)]> {
        self.starts.windows(2).map(|w| &self.blocks[w[0]..w[1]])
    }

    /// Hit ratio with an unbounded cache.
    pub fn unbounded_hit_ratio(&self) -> f64 {
        let mut seen: HashSet<u64, IdBuildHasher> = HashSet::default();
        let mut hit = 0u64;
        for r in self.requests() {
            hit += r
                .iter()
                .take_while(|b| seen.contains(&b.0))
                .map(|b| b.1 as u64)
                .sum::<u64>();
            seen.extend(r.iter().map(|b| b.0));
        }
        hit as f64 / self.prompt_tokens.max(1) as f64
    }

    /// Hit ratio with an LRU cache of `capacity` tokens.
    pub fn lru_hit_ratio(&self, capacity: u64) -> f64 {
        let mut lru = Lru::new(capacity);
        let mut hit = 0u64;
        for r in self.requests() {
            hit += r
                .iter()
                .take_while(|b| lru.contains(b.0))
                .map(|b| b.1 as u64)
                .sum::<u64>();
            for &(h, len) in r {
                lru.touch(h, len);
            }
        }
        hit as f64 / self.prompt_tokens.max(1) as f64
    }

    /// Hit ratio of Belady's rule with a cache of `capacity` tokens: an upper bound on
    /// [`Blocks::lru_hit_ratio`] of the same capacity, and on any eviction's.
    pub fn optimal_hit_ratio(&self, capacity: u64) -> f64 {
        optimal_hit_tokens(&self.blocks, capacity) as f64 / self.prompt_tokens.max(1) as f64
    }
}

const NIL: u32 = u32::MAX;

struct Node {
    key: u64,
    len: u32,
    prev: u32,
    next: u32,
}

/// An LRU set of blocks bounded in tokens; O(1) per operation.
pub struct Lru {
    map: HashMap<u64, u32, IdBuildHasher>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    used: u64,
    capacity: u64,
}

impl Lru {
    pub fn new(capacity: u64) -> Lru {
        Lru {
            map: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            used: 0,
            capacity,
        }
    }

    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// Tokens held.
    pub fn used(&self) -> u64 {
        self.used
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = (self.nodes[i as usize].prev, self.nodes[i as usize].next);
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// Makes `key` the most recently used block (inserting it), then evicts least recently
    /// used blocks while more than the capacity is held.
    pub fn touch(&mut self, key: u64, len: u32) {
        if let Some(&i) = self.map.get(&key) {
            self.unlink(i);
            self.push_front(i);
            return;
        }
        let node = Node {
            key,
            len,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() as u32 - 1
            }
        };
        self.map.insert(key, i);
        self.push_front(i);
        self.used += len as u64;
        // Bounded: each round removes one block.
        while self.used > self.capacity && self.tail != NIL {
            let t = self.tail;
            self.unlink(t);
            let n = &self.nodes[t as usize];
            self.used -= n.len as u64;
            self.map.remove(&n.key);
            self.free.push(t);
        }
    }
}

/// Statistics of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceStats {
    pub requests: u64,
    pub contexts: u32,
    pub prompt: LenDist,
    pub output: LenDist,
    pub duration_s: f64,
    pub arrival_rate_per_s: f64,
    pub block_size: u32,
    pub unbounded_hit_ratio: f64,
    /// `(capacity in tokens, hit ratio)`.
    pub lru_hit_ratio: Vec<(u64, f64)>,
    /// `(capacity in tokens, Belady bound)`: see [`Blocks::optimal_hit_ratio`].
    pub optimal_hit_ratio: Vec<(u64, f64)>,
    /// Requests about a context an earlier request was about.
    pub revisits: u64,
    /// Their reuse distances: distinct other contexts since that context's previous request
    /// (see [`crate::workload::reuse::reuse_distances`]).
    pub reuse_distance: LenDist,
}

impl TraceStats {
    /// One line on how requests come back to their contexts.
    pub fn reuse_line(&self) -> String {
        let d = &self.reuse_distance;
        let share = 100.0 * self.revisits as f64 / self.requests.max(1) as f64;
        if self.revisits == 0 {
            return format!("contexts {}: no request revisits a context", self.contexts);
        }
        format!(
            "contexts {}: {:.1}% of requests revisit one; reuse distance (distinct contexts \
             since its last request) mean {:.1}, p50 {}, p90 {}, p99 {}, max {}",
            self.contexts, share, d.mean, d.p50, d.p90, d.p99, d.max
        )
    }

    pub fn of(trace: &Trace, block_size: u32, lru_capacities: &[u64]) -> TraceStats {
        TraceStats::with_bounds(trace, block_size, lru_capacities, &[])
    }

    /// [`TraceStats::of`], and the Belady bound for each of `optimal_capacities` (tokens).
    pub fn with_bounds(
        trace: &Trace,
        block_size: u32,
        lru_capacities: &[u64],
        optimal_capacities: &[u64],
    ) -> TraceStats {
        let r = &trace.requests;
        let duration_s = match (r.first(), r.last()) {
            (Some(a), Some(b)) => b.arrival.as_secs_f64() - a.arrival.as_secs_f64(),
            _ => 0.0,
        };
        let blocks = Blocks::of(trace, block_size);
        let distances = super::reuse::reuse_distances(r.iter().map(|r| r.context));
        TraceStats {
            requests: r.len() as u64,
            contexts: trace.contexts,
            prompt: LenDist::of(r.iter().map(|r| r.prompt_tokens).collect()),
            output: LenDist::of(r.iter().map(|r| r.output_tokens).collect()),
            duration_s,
            arrival_rate_per_s: if duration_s > 0.0 {
                r.len() as f64 / duration_s
            } else {
                0.0
            },
            block_size,
            unbounded_hit_ratio: blocks.unbounded_hit_ratio(),
            lru_hit_ratio: lru_capacities
                .iter()
                .map(|&c| (c, blocks.lru_hit_ratio(c)))
                .collect(),
            optimal_hit_ratio: optimal_capacities
                .iter()
                .map(|&c| (c, blocks.optimal_hit_ratio(c)))
                .collect(),
            revisits: distances.len() as u64,
            reuse_distance: LenDist::of(distances),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::units::Nanos;
    use crate::workload::{Request, TokenArena};

    /// A trace of `prompts`, one request each, in order.
    pub(crate) fn trace<P: AsRef<[u32]>>(prompts: &[P]) -> Trace {
        let mut arena = TokenArena::default();
        let requests = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Request {
                arrival: Nanos(i as u64),
                segments: vec![arena.push(p.as_ref().iter().copied())],
                prompt_tokens: p.as_ref().len() as u32,
                output_tokens: 1,
                context: 0,
            })
            .collect();
        Trace {
            arena,
            requests,
            contexts: 1,
        }
    }

    #[test]
    fn hits_are_leading_blocks_and_a_partial_last_block_counts_its_length() {
        // Blocks of 2: [1,2][3,4][5] then [1,2][3,4][5] again: 5 of 10 tokens hit.
        let t = trace(&[&[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5]]);
        let b = Blocks::of(&t, 2);
        assert_eq!(b.unbounded_hit_ratio(), 0.5);
        // A divergent first block hides the later equal ones (hashes are chained anyway).
        let t = trace(&[&[1, 2, 3, 4], &[9, 9, 3, 4]]);
        assert_eq!(Blocks::of(&t, 2).unbounded_hit_ratio(), 0.0);
    }

    #[test]
    fn the_lru_evicts_least_recently_used_blocks_beyond_its_capacity() {
        let mut l = Lru::new(4);
        l.touch(1, 2);
        l.touch(2, 2);
        l.touch(1, 2); // 1 is now most recent
        l.touch(3, 2); // evicts 2
        assert!(l.contains(1) && l.contains(3) && !l.contains(2));
        assert_eq!(l.used(), 4);
        // A capacity of 4 tokens keeps A's blocks for the second A but not after B.
        let t = trace(&[&[1, 2, 3, 4], &[1, 2, 3, 4], &[7, 7, 8, 8], &[1, 2, 3, 4]]);
        let b = Blocks::of(&t, 2);
        assert_eq!(b.lru_hit_ratio(4), 4.0 / 16.0);
        assert_eq!(b.lru_hit_ratio(8), 8.0 / 16.0);
        assert_eq!(b.unbounded_hit_ratio(), 8.0 / 16.0);
    }
}
