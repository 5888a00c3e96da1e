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
//! Every operation is O(log n) amortised.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::hash::IdBuildHasher;

/// Which order a cache evicts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Eviction {
    Lru,
    Gdsf,
}

/// What the queue knows of an entry.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    /// Bumped on every re-keying; heap items of older versions are stale.
    version: u32,
    freq: u32,
    /// The tick of the last access.
    tick: u64,
    /// cost / size, in ns per byte.
    value: f64,
    /// Not a candidate now (see [`EvictionQueue::set_hidden`]): it has no heap item.
    hidden: bool,
}

/// The access history of an entry, carried along when it moves to another queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Accesses counted so far (1 when the entry was added).
    pub freq: u32,
    /// The tick of the last access.
    pub tick: u64,
}

/// A heap item: (key, id, version), smallest first.
type Item = Reverse<(u64, u64, u32)>;

/// The key of an entry in a queue of `kind` at GDSF clock `clock`.
fn key_of(kind: Eviction, clock: f64, freq: u32, value: f64, tick: u64) -> u64 {
    match kind {
        Eviction::Lru => tick,
        Eviction::Gdsf => (clock + freq as f64 * value).to_bits(),
    }
}

/// An eviction queue over entries identified by `u64` ids.
///
/// The order lives in a binary min-heap with lazy deletion: re-keying an entry pushes a new
/// item and leaves the old one stale, to be skipped when it surfaces. Under LRU a touched
/// entry gets the largest key, so its push costs O(1); under GDSF it is O(log n). Stale items
/// are bounded: when they outnumber live entries the heap is rebuilt from the entries.
///
/// An entry may be *hidden* (the store hides tensors that are not leaves of their tier): it
/// keeps its key and history but has no item in the heap, so scans for a victim never pass
/// over it; unhiding pushes it back with the same key, in the same place of the order.
#[derive(Debug)]
pub struct EvictionQueue {
    heap: BinaryHeap<Item>,
    /// The entries by id, in a map whose probes can be asked for ahead (a lookup touches
    /// every tensor it plans, in the queues of their nodes: see [`EvictionQueue::prefetch`]).
    entries: HashMap<u64, Entry, IdBuildHasher>,
    kind: Eviction,
    /// GDSF clock L.
    clock: f64,
}

impl EvictionQueue {
    pub fn new(kind: Eviction) -> EvictionQueue {
        EvictionQueue {
            heap: BinaryHeap::new(),
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
        key_of(self.kind, self.clock, freq, value, tick)
    }

    fn push(&mut self, id: u64, e: Entry) {
        if e.hidden {
            return;
        }
        self.heap.push(Reverse((e.key, id, e.version)));
        if self.heap.len() > 2 * self.entries.len() + 64 {
            self.compact();
        }
    }

    /// Rebuilds the heap from the live entries, dropping stale items.
    fn compact(&mut self) {
        let items: Vec<Item> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.hidden)
            .map(|(&id, e)| Reverse((e.key, id, e.version)))
            .collect();
        self.heap = BinaryHeap::from(items);
    }

    fn is_live(&self, &Reverse((key, id, version)): &Item) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|e| e.version == version && e.key == key && !e.hidden)
    }

    /// Hides `id` from victim scans (or shows it again), keeping its key and history. Hiding
    /// leaves its heap item stale; showing pushes a new one.
    pub fn set_hidden(&mut self, id: u64, hidden: bool) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.hidden == hidden {
            return;
        }
        e.hidden = hidden;
        e.version = e.version.wrapping_add(1);
        let e = *e;
        self.push(id, e);
    }

    /// Adds `id` (not present) with `freq` accesses so far; `value` is cost / size.
    pub fn insert(&mut self, id: u64, freq: u32, value: f64, tick: u64) {
        debug_assert!(value >= 0.0 && value.is_finite());
        let e = Entry {
            key: self.key(freq, value, tick),
            version: 0,
            freq,
            tick,
            value,
            hidden: false,
        };
        let old = self.entries.insert(id, e);
        debug_assert!(old.is_none(), "entry inserted twice");
        self.push(id, e);
    }

    /// Records an access to `id` (if present).
    pub fn touch(&mut self, id: u64, tick: u64) {
        // One probe of the map: the entry is re-keyed in place.
        let (kind, clock) = (self.kind, self.clock);
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.freq = e.freq.saturating_add(1);
        e.key = key_of(kind, clock, e.freq, e.value, tick);
        e.version = e.version.wrapping_add(1);
        e.tick = tick;
        let e = *e;
        self.push(id, e);
    }

    /// Whether `id` is hidden from victim scans (`None` if absent).
    pub fn is_hidden(&self, id: u64) -> Option<bool> {
        self.entries.get(&id).map(|e| e.hidden)
    }

    /// Access count of `id` (0 if absent).
    pub fn freq(&self, id: u64) -> u32 {
        self.entries.get(&id).map_or(0, |e| e.freq)
    }

    pub fn remove(&mut self, id: u64) -> bool {
        self.entries.remove(&id).is_some()
    }

    /// Removes and returns the entry to evict first, advancing the GDSF clock.
    pub fn pop(&mut self) -> Option<u64> {
        self.pop_first_where(|_| true)
    }

    /// Removes and returns the first entry in eviction order for which `eligible` holds
    /// (scanning at most the whole queue), advancing the GDSF clock.
    pub fn pop_first_where(&mut self, eligible: impl FnMut(u64) -> bool) -> Option<u64> {
        self.pop_entry_where(eligible).map(|(id, _)| id)
    }

    /// Like [`Self::pop_first_where`], and also returns the entry's access history.
    pub fn pop_entry_where(
        &mut self,
        mut eligible: impl FnMut(u64) -> bool,
    ) -> Option<(u64, Access)> {
        let mut passed = Vec::new();
        let mut found = None;
        // Bounded by the heap's length: every round removes one item.
        while let Some(item) = self.heap.pop() {
            if !self.is_live(&item) {
                continue;
            }
            let Reverse((key, id, _)) = item;
            if eligible(id) {
                let e = self.entries.remove(&id).expect("live item has an entry");
                if self.kind == Eviction::Gdsf {
                    self.clock = f64::from_bits(key);
                }
                let access = Access {
                    freq: e.freq,
                    tick: e.tick,
                };
                found = Some((id, access));
                break;
            }
            passed.push(item);
        }
        self.heap.extend(passed);
        found
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
