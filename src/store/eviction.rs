//! Eviction orders for store caches: LRU and GDSF.
//!
//! **LRU** evicts the entry whose last access is oldest (key = a global access tick).
//!
//! **GDSF** (Greedy-Dual-Size-Frequency, Cherkasova 1998) evicts the entry of lowest priority
//! `H = L + frequency x cost / size`, where `cost` is what it costs to get the entry back
//! (fetch it again, or recompute it) and `L` is the queue's *clock*: the priority of the last
//! evicted entry. Raising `L` on every eviction ages entries that are no longer read, so a
//! tensor read often long ago does not stay forever. Prefix tensors early in a prompt are read
//! by every request that shares the prompt's beginning, so their frequency, and their
//! priority, is highest: GDSF keeps them where LRU would treat them like any other block.
//!
//! Keys are totally ordered `u64`s (a GDSF priority is a non-negative `f64`, whose IEEE bits
//! order like the number); ties break by tensor id, so eviction order is deterministic.
//! Every operation is O(log n).

use std::collections::{BTreeSet, HashMap};

use crate::hash::IdBuildHasher;

/// Which order a cache evicts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Eviction {
    Lru,
    Gdsf,
}

/// What the queue knows of an entry.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    freq: u32,
    /// cost / size, in ns per byte.
    value: f64,
}

/// An eviction queue over entries identified by `u64` ids.
#[derive(Debug)]
pub struct EvictionQueue {
    order: BTreeSet<(u64, u64)>,
    entries: HashMap<u64, Entry, IdBuildHasher>,
    kind: Eviction,
    /// GDSF clock L.
    clock: f64,
}

impl EvictionQueue {
    pub fn new(kind: Eviction) -> EvictionQueue {
        EvictionQueue {
            order: BTreeSet::new(),
            entries: HashMap::default(),
            kind,
            clock: 0.0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    fn key(&self, freq: u32, value: f64, tick: u64) -> u64 {
        match self.kind {
            Eviction::Lru => tick,
            Eviction::Gdsf => (self.clock + freq as f64 * value).to_bits(),
        }
    }

    /// Adds `id` (not present) with `freq` accesses so far; `value` is cost / size.
    pub fn insert(&mut self, id: u64, freq: u32, value: f64, tick: u64) {
        debug_assert!(value >= 0.0 && value.is_finite());
        let key = self.key(freq, value, tick);
        let old = self.entries.insert(id, Entry { key, freq, value });
        debug_assert!(old.is_none(), "entry inserted twice");
        self.order.insert((key, id));
    }

    /// Records an access to `id` (if present).
    pub fn touch(&mut self, id: u64, tick: u64) {
        let Some(e) = self.entries.get(&id).copied() else {
            return;
        };
        self.order.remove(&(e.key, id));
        let freq = e.freq.saturating_add(1);
        let key = self.key(freq, e.value, tick);
        self.entries.insert(
            id,
            Entry {
                key,
                freq,
                value: e.value,
            },
        );
        self.order.insert((key, id));
    }

    /// Access count of `id` (0 if absent).
    pub fn freq(&self, id: u64) -> u32 {
        self.entries.get(&id).map_or(0, |e| e.freq)
    }

    pub fn remove(&mut self, id: u64) -> bool {
        match self.entries.remove(&id) {
            Some(e) => {
                self.order.remove(&(e.key, id));
                true
            }
            None => false,
        }
    }

    /// Removes and returns the entry to evict first, advancing the GDSF clock.
    pub fn pop(&mut self) -> Option<u64> {
        self.pop_first_where(|_| true)
    }

    /// Removes and returns the first entry in eviction order for which `eligible` holds
    /// (scanning at most the whole queue), advancing the GDSF clock.
    pub fn pop_first_where(&mut self, mut eligible: impl FnMut(u64) -> bool) -> Option<u64> {
        let &(key, id) = self.order.iter().find(|&&(_, id)| eligible(id))?;
        self.order.remove(&(key, id));
        self.entries.remove(&id);
        if self.kind == Eviction::Gdsf {
            self.clock = f64::from_bits(key);
        }
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_the_least_recently_touched() {
        let mut q = EvictionQueue::new(Eviction::Lru);
        q.insert(1, 1, 1.0, 1);
        q.insert(2, 1, 1.0, 2);
        q.insert(3, 1, 1.0, 3);
        q.touch(1, 4);
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), Some(3));
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn gdsf_keeps_frequent_and_costly_entries_and_ages_the_rest() {
        let mut q = EvictionQueue::new(Eviction::Gdsf);
        q.insert(1, 1, 1.0, 0); // H = 1
        q.insert(2, 1, 1.0, 0); // H = 1
        q.insert(3, 1, 5.0, 0); // H = 5: costly to get back
        for t in 0..4 {
            q.touch(1, t); // freq 5: H = 5
        }
        assert_eq!(q.pop(), Some(2), "the cheap, rarely read entry goes first");
        // Clock is now 1: a new entry starts at 1 + 1 x 1 = 2 and goes before 1 and 3.
        q.insert(4, 1, 1.0, 0);
        assert_eq!(q.pop(), Some(4));
        // 1 and 3 tie at H = 5; the lower id breaks the tie.
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(3));
    }
}
