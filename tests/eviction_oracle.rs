//! The eviction orders against reference caches written again from their papers.
//!
//! Each reference is a plain cache of a capacity in entries, `access(id)` a hit or a miss
//! that returns what it evicted, built as simply as possible (vectors scanned end to end):
//! LRU, LFU (fewest accesses, then least recent, then lowest id), GDSF (Cherkasova 1998),
//! S3-FIFO (Yang et al., SOSP 2023, with libCacheSim's move-to-main threshold of 2 and its
//! counter reset on the move) and ARC (Megiddo & Modha, FAST 2003, its figure's cases I to IV
//! and REPLACE verbatim). The queue under test plays the same cache: a hit touches the entry;
//! a miss announces the id, pops victims while the cache is full, then inserts it. After
//! every access the two must agree on hit or miss, on the victims in order, and on what the
//! cache holds, on random access sequences at capacities 0, 1 and up to 12.

use std::collections::VecDeque;

use meshsim::serving::store::eviction::{Eviction, EvictionQueue};
use proptest::prelude::*;

/// A cache: the reference or the queue.
trait Cache {
    /// Hit or miss, and the ids evicted (in order).
    fn access(&mut self, id: u64) -> (bool, Vec<u64>);
    fn holds(&self, id: u64) -> bool;
}

/// The queue under test, playing a cache.
struct Queue {
    q: EvictionQueue,
    capacity: u64,
    tick: u64,
}

/// The GDSF value (cost / size) of an id in both caches.
fn value(id: u64) -> f64 {
    (id % 3 + 1) as f64
}

impl Queue {
    fn new(kind: Eviction, capacity: u64) -> Queue {
        Queue {
            q: EvictionQueue::with_capacity(kind, capacity),
            capacity,
            tick: 0,
        }
    }
}

impl Cache for Queue {
    fn access(&mut self, id: u64) -> (bool, Vec<u64>) {
        self.tick += 1;
        if self.q.contains(id) {
            self.q.touch(id, self.tick);
            return (true, Vec::new());
        }
        if self.capacity == 0 {
            return (false, Vec::new());
        }
        self.q.announce(id);
        let mut evicted = Vec::new();
        while self.q.len() as u64 >= self.capacity {
            evicted.push(self.q.pop().expect("a full cache has a victim"));
        }
        self.q.insert(id, 1, value(id), self.tick);
        (false, evicted)
    }

    fn holds(&self, id: u64) -> bool {
        self.q.contains(id)
    }
}

/// LRU, LFU and GDSF: resident (id, accesses, last access, GDSF priority) in a vector; the
/// victim is the minimum by the order's key, then by id.
struct Keyed {
    kind: Eviction,
    capacity: usize,
    entries: Vec<(u64, u32, u64, f64)>,
    clock: f64,
    tick: u64,
}

impl Keyed {
    fn new(kind: Eviction, capacity: usize) -> Keyed {
        Keyed {
            kind,
            capacity,
            entries: Vec::new(),
            clock: 0.0,
            tick: 0,
        }
    }

    fn victim(&self) -> usize {
        let key = |e: &(u64, u32, u64, f64)| match self.kind {
            Eviction::Lru => (0, e.2, 0.0, e.0),
            Eviction::Lfu => (e.1, e.2, 0.0, e.0),
            _ => (0, 0, e.3, e.0),
        };
        (0..self.entries.len())
            .min_by(|&a, &b| {
                let (ka, kb) = (key(&self.entries[a]), key(&self.entries[b]));
                (ka.0, ka.1)
                    .cmp(&(kb.0, kb.1))
                    .then(ka.2.total_cmp(&kb.2))
                    .then(ka.3.cmp(&kb.3))
            })
            .expect("not empty")
    }
}

impl Cache for Keyed {
    fn access(&mut self, id: u64) -> (bool, Vec<u64>) {
        self.tick += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == id) {
            e.1 += 1;
            e.2 = self.tick;
            e.3 = self.clock + e.1 as f64 * value(id);
            return (true, Vec::new());
        }
        if self.capacity == 0 {
            return (false, Vec::new());
        }
        let mut evicted = Vec::new();
        while self.entries.len() >= self.capacity {
            let v = self.entries.remove(self.victim());
            self.clock = v.3;
            evicted.push(v.0);
        }
        let h = self.clock + value(id);
        self.entries.push((id, 1, self.tick, h));
        (false, evicted)
    }

    fn holds(&self, id: u64) -> bool {
        self.entries.iter().any(|e| e.0 == id)
    }
}

/// S3-FIFO: each FIFO a deque of (id, counter), tail at the front.
struct S3 {
    capacity: usize,
    main_capacity: usize,
    small: VecDeque<(u64, u8)>,
    main: VecDeque<(u64, u8)>,
    ghost: VecDeque<u64>,
}

impl S3 {
    fn new(capacity: usize) -> S3 {
        S3 {
            capacity,
            // Small: 10 % of the cache; main: the rest; ghost: as many as main.
            main_capacity: capacity - capacity / 10,
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
        }
    }

    /// One eviction, if it evicts (the small FIFO may only promote).
    fn evict(&mut self) -> Option<u64> {
        if self.main.len() > self.main_capacity || self.small.is_empty() {
            while let Some((id, f)) = self.main.pop_front() {
                if f >= 1 {
                    self.main.push_back((id, f - 1));
                } else {
                    return Some(id);
                }
            }
            return None;
        }
        while let Some((id, f)) = self.small.pop_front() {
            if f >= 2 {
                self.main.push_back((id, 0));
            } else {
                if self.main_capacity > 0 {
                    self.ghost.push_back(id);
                    if self.ghost.len() > self.main_capacity {
                        self.ghost.pop_front();
                    }
                }
                return Some(id);
            }
        }
        None
    }
}

impl Cache for S3 {
    fn access(&mut self, id: u64) -> (bool, Vec<u64>) {
        let hit = self
            .small
            .iter_mut()
            .chain(self.main.iter_mut())
            .find(|e| e.0 == id);
        if let Some(e) = hit {
            e.1 = (e.1 + 1).min(3);
            return (true, Vec::new());
        }
        if self.capacity == 0 {
            return (false, Vec::new());
        }
        let in_ghost = self.ghost.iter().position(|&g| g == id);
        if let Some(i) = in_ghost {
            self.ghost.remove(i);
        }
        let mut evicted = Vec::new();
        while self.small.len() + self.main.len() >= self.capacity {
            evicted.extend(self.evict());
        }
        match in_ghost {
            Some(_) => self.main.push_back((id, 0)),
            None => self.small.push_back((id, 0)),
        }
        (false, evicted)
    }

    fn holds(&self, id: u64) -> bool {
        self.small.iter().chain(self.main.iter()).any(|e| e.0 == id)
    }
}

/// ARC: the four lists as vectors, LRU end first.
struct Arc {
    c: usize,
    p: f64,
    t1: Vec<u64>,
    t2: Vec<u64>,
    b1: Vec<u64>,
    b2: Vec<u64>,
}

fn take(list: &mut Vec<u64>, id: u64) -> bool {
    match list.iter().position(|&x| x == id) {
        Some(i) => {
            list.remove(i);
            true
        }
        None => false,
    }
}

impl Arc {
    fn new(c: usize) -> Arc {
        Arc {
            c,
            p: 0.0,
            t1: Vec::new(),
            t2: Vec::new(),
            b1: Vec::new(),
            b2: Vec::new(),
        }
    }

    /// REPLACE(x, p): returns the page it evicts.
    fn replace(&mut self, x_in_b2: bool) -> u64 {
        let t1 = self.t1.len() as f64;
        if !self.t1.is_empty() && ((x_in_b2 && t1 == self.p) || t1 > self.p) {
            let v = self.t1.remove(0);
            self.b1.push(v);
            v
        } else {
            let v = self.t2.remove(0);
            self.b2.push(v);
            v
        }
    }
}

impl Cache for Arc {
    fn access(&mut self, x: u64) -> (bool, Vec<u64>) {
        // Case I: a hit.
        if take(&mut self.t1, x) || take(&mut self.t2, x) {
            self.t2.push(x);
            return (true, Vec::new());
        }
        if self.c == 0 {
            return (false, Vec::new());
        }
        let c = self.c as f64;
        let (b1, b2) = (self.b1.len() as f64, self.b2.len() as f64);
        // Case II: in B1.
        if take(&mut self.b1, x) {
            self.p = c.min(self.p + if b1 >= b2 { 1.0 } else { b2 / b1 });
            let v = self.replace(false);
            self.t2.push(x);
            return (false, vec![v]);
        }
        // Case III: in B2.
        if take(&mut self.b2, x) {
            self.p = (self.p - if b2 >= b1 { 1.0 } else { b1 / b2 }).max(0.0);
            let v = self.replace(true);
            self.t2.push(x);
            return (false, vec![v]);
        }
        // Case IV: in none.
        let mut evicted = Vec::new();
        let l1 = self.t1.len() + self.b1.len();
        let total = l1 + self.t2.len() + self.b2.len();
        if l1 == self.c {
            if self.t1.len() < self.c {
                self.b1.remove(0);
                evicted.push(self.replace(false));
            } else {
                evicted.push(self.t1.remove(0));
            }
        } else if total >= self.c {
            if total == 2 * self.c {
                self.b2.remove(0);
            }
            evicted.push(self.replace(false));
        }
        self.t1.push(x);
        (false, evicted)
    }

    fn holds(&self, id: u64) -> bool {
        self.t1.contains(&id) || self.t2.contains(&id)
    }
}

fn reference(kind: Eviction, capacity: usize) -> Box<dyn Cache> {
    match kind {
        Eviction::S3Fifo => Box::new(S3::new(capacity)),
        Eviction::Arc => Box::new(Arc::new(capacity)),
        _ => Box::new(Keyed::new(kind, capacity)),
    }
}

/// Runs `ids` through the queue and the reference of `kind`, comparing every step.
fn compare(kind: Eviction, capacity: usize, ids: &[u64]) -> Result<(), TestCaseError> {
    let mut q = Queue::new(kind, capacity as u64);
    let mut r = reference(kind, capacity);
    let universe = ids.iter().copied().max().unwrap_or(0);
    for (step, &id) in ids.iter().enumerate() {
        let (got, want) = (q.access(id), r.access(id));
        prop_assert_eq!(&got, &want, "{:?} at step {} (access {})", kind, step, id);
        for x in 0..=universe {
            prop_assert_eq!(
                q.holds(x),
                r.holds(x),
                "{:?} holds {} at step {}",
                kind,
                x,
                step
            );
        }
        prop_assert!(q.q.len() <= capacity);
    }
    Ok(())
}

const KINDS: [Eviction; 5] = [
    Eviction::Lru,
    Eviction::Gdsf,
    Eviction::Lfu,
    Eviction::S3Fifo,
    Eviction::Arc,
];

/// Access sequences over a few more ids than the capacity (so ghosts matter), with skew.
fn accesses() -> impl Strategy<Value = (usize, Vec<u64>)> {
    prop_oneof![Just(0usize), Just(1), 2usize..13].prop_flat_map(|c| {
        let ids = (2 * c as u64 + 3).max(3);
        let id = prop_oneof![0..ids, 0..(c as u64 / 2 + 2)];
        (Just(c), prop::collection::vec(id, 0..300))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_order_evicts_like_its_reference((capacity, ids) in accesses()) {
        for kind in KINDS {
            compare(kind, capacity, &ids)?;
        }
    }
}

#[test]
fn arc_and_s3fifo_adapt_on_a_long_loop() {
    // A loop a little larger than the cache, then a hot set: every order stays in step.
    let mut ids: Vec<u64> = (0..200).map(|i| i % 14).collect();
    ids.extend((0..200).map(|i| [1, 2, 3, 40 + i % 30][i as usize % 4]));
    for kind in KINDS {
        for capacity in [0, 1, 10, 12] {
            compare(kind, capacity, &ids).unwrap();
        }
    }
}
