//! The keyed orders (LRU, GDSF, LFU): a binary min-heap over keys with lazy deletion.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::{Access, Eviction};
use crate::hash::IdBuildHasher;

/// A key of a keyed order: smaller goes first, ties by id.
pub(super) trait Key: Copy + Ord + std::fmt::Debug {
    /// The key of an entry in a queue of `kind` at GDSF clock `clock`.
    fn of(kind: Eviction, clock: f64, freq: u32, value: f64, tick: u64) -> Self;
    /// The GDSF clock once an entry of this key is evicted (GDSF keys only).
    fn clock(self) -> f64;
}

/// LRU (the tick) and GDSF (`L + freq x value`, as IEEE bits: a non-negative `f64` orders
/// like its bits).
impl Key for u64 {
    fn of(kind: Eviction, clock: f64, freq: u32, value: f64, tick: u64) -> u64 {
        match kind {
            Eviction::Gdsf => (clock + freq as f64 * value).to_bits(),
            _ => tick,
        }
    }

    fn clock(self) -> f64 {
        f64::from_bits(self)
    }
}

/// LFU: the access count, then the tick of the last access.
impl Key for (u32, u64) {
    fn of(_: Eviction, _: f64, freq: u32, _: f64, tick: u64) -> (u32, u64) {
        (freq, tick)
    }

    fn clock(self) -> f64 {
        0.0
    }
}

/// What the queue knows of an entry.
#[derive(Clone, Copy, Debug)]
struct Entry<K> {
    key: K,
    /// Bumped on every re-keying; heap items of older versions are stale.
    version: u32,
    freq: u32,
    /// The tick of the last access.
    tick: u64,
    /// cost / size, in ns per byte.
    value: f64,
    /// Not a candidate now: it has no heap item.
    hidden: bool,
}

/// A heap item: (key, id, version), smallest first.
type Item<K> = Reverse<(K, u64, u32)>;

/// A keyed eviction queue (see [`super::EvictionQueue`]).
///
/// The order lives in a binary min-heap with lazy deletion: re-keying an entry pushes a new
/// item and leaves the old one stale, to be skipped when it surfaces. Under LRU a touched
/// entry gets the largest key, so its push costs O(1); under GDSF it is O(log n). Stale items
/// are bounded: when they outnumber live entries the heap is rebuilt from the entries. A
/// hidden entry keeps its key and history but has no item in the heap; unhiding pushes it
/// back with the same key, in the same place of the order.
#[derive(Debug)]
pub(super) struct Keyed<K> {
    heap: BinaryHeap<Item<K>>,
    entries: HashMap<u64, Entry<K>, IdBuildHasher>,
    kind: Eviction,
    /// GDSF clock L.
    clock: f64,
}

impl<K: Key> Keyed<K> {
    pub(super) fn new(kind: Eviction) -> Keyed<K> {
        Keyed {
            heap: BinaryHeap::new(),
            entries: HashMap::default(),
            kind,
            clock: 0.0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    fn push(&mut self, id: u64, e: Entry<K>) {
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
        let items: Vec<Item<K>> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.hidden)
            .map(|(&id, e)| Reverse((e.key, id, e.version)))
            .collect();
        self.heap = BinaryHeap::from(items);
    }

    fn is_live(&self, &Reverse((key, id, version)): &Item<K>) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|e| e.version == version && e.key == key && !e.hidden)
    }

    pub(super) fn set_hidden(&mut self, id: u64, hidden: bool) {
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

    pub(super) fn insert(&mut self, id: u64, freq: u32, value: f64, tick: u64) {
        let e = Entry {
            key: K::of(self.kind, self.clock, freq, value, tick),
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

    pub(super) fn touch(&mut self, id: u64, tick: u64) {
        // One probe of the map: the entry is re-keyed in place.
        let (kind, clock) = (self.kind, self.clock);
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.freq = e.freq.saturating_add(1);
        e.key = K::of(kind, clock, e.freq, e.value, tick);
        e.version = e.version.wrapping_add(1);
        e.tick = tick;
        let e = *e;
        self.push(id, e);
    }

    pub(super) fn is_hidden(&self, id: u64) -> Option<bool> {
        self.entries.get(&id).map(|e| e.hidden)
    }

    pub(super) fn freq(&self, id: u64) -> u32 {
        self.entries.get(&id).map_or(0, |e| e.freq)
    }

    pub(super) fn remove(&mut self, id: u64) -> bool {
        self.entries.remove(&id).is_some()
    }

    pub(super) fn pop_entry_where(
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
                    self.clock = key.clock();
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

    /// The id [`Self::pop_entry_where`] would return, changing nothing (the items it looks
    /// at go back to the heap; stale ones are dropped, as a pop would).
    pub(super) fn peek_where(&mut self, mut eligible: impl FnMut(u64) -> bool) -> Option<u64> {
        let mut passed = Vec::new();
        let mut found = None;
        // Bounded by the heap's length: every round removes one item.
        while let Some(item) = self.heap.pop() {
            if !self.is_live(&item) {
                continue;
            }
            let id = item.0.1;
            passed.push(item);
            if eligible(id) {
                found = Some(id);
                break;
            }
        }
        self.heap.extend(passed);
        found
    }
}
