//! The hash index of a block pool: registered block hash -> block id.
//!
//! An open-addressing table with linear probing: a key's home slot is given by its top bits
//! (keys are already well-mixed 64-bit block hashes, see [`crate::hash`]), a lookup walks from
//! there to the key or to an empty slot, and a removal shifts the following entries back
//! instead of leaving a tombstone. A pool registers at most one hash per block, so the table
//! is sized once for its pool's blocks at 3/5 full at most (short probe runs: about 2 slots
//! for a hit, 4 for a miss). A slot is 16 bytes (the key, and the block id plus one, 0
//! marking an empty slot), so a lookup usually reads one cache line; the slots are allocated
//! zeroed, so the system maps their pages only as entries land in them.
//!
//! Why not `HashMap`: at cluster scale every pool is cold when its instance's event comes (a
//! run touches 2,240 pools in turn), so each block registered, looked up or evicted costs a
//! cache miss. The pool knows the keys of a whole run of blocks in advance, and
//! [`BlockIndex::prefetch`] lets it ask for their slots a few blocks ahead, so the misses
//! overlap instead of following one another. Nothing iterates the table except checks, so its
//! order never reaches a result.

use crate::sim::prefetch;

/// An empty slot: block field 0.
const EMPTY: [u64; 2] = [0, 0];

/// Registered hash -> block id (see the module doc).
#[derive(Debug)]
pub struct BlockIndex {
    /// `[key, block + 1]`.
    slots: Vec<[u64; 2]>,
    len: usize,
    /// Most entries (3/5 of the slots).
    max: usize,
}

impl BlockIndex {
    /// An index for at most `max` entries.
    pub fn new(max: usize) -> BlockIndex {
        let slots = max * 5 / 3 + 1;
        BlockIndex {
            slots: vec![EMPTY; slots],
            len: 0,
            max,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The home slot of `key`, from its top 32 bits.
    fn home(&self, key: u64) -> usize {
        (((key >> 32) * self.slots.len() as u64) >> 32) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// Slots from `from` forward to `to`, cyclically.
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.slots.len() - from
        }
    }

    /// The slot holding `key`, or the empty slot where it would go.
    fn find(&self, key: u64) -> (usize, bool) {
        let mut i = self.home(key);
        // Bounded: the table always has an empty slot (it is at most 3/5 full).
        loop {
            let s = self.slots[i];
            if s[1] == 0 {
                return (i, false);
            }
            if s[0] == key {
                return (i, true);
            }
            i = self.next(i);
        }
    }

    pub fn get(&self, key: u64) -> Option<u32> {
        match self.find(key) {
            (i, true) => Some((self.slots[i][1] - 1) as u32),
            _ => None,
        }
    }

    /// Maps `key` to `block` unless it is mapped already; returns whether it inserted.
    pub fn insert_new(&mut self, key: u64, block: u32) -> bool {
        match self.find(key) {
            (_, true) => false,
            (i, false) => {
                assert!(
                    self.len < self.max,
                    "block index over its {} entries",
                    self.max
                );
                self.slots[i] = [key, block as u64 + 1];
                self.len += 1;
                true
            }
        }
    }

    /// Unmaps `key`; returns the block it was mapped to.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let (mut hole, found) = self.find(key);
        if !found {
            return None;
        }
        let block = (self.slots[hole][1] - 1) as u32;
        let mut j = hole;
        // Backward shift: move up every following entry whose home is not between the hole
        // and it (cyclically). Bounded by the run of full slots after the hole.
        loop {
            j = self.next(j);
            let s = self.slots[j];
            if s[1] == 0 {
                break;
            }
            let home = self.home(s[0]);
            // Distance from home to j, and from the hole to j, going forward.
            if self.distance(home, j) >= self.distance(hole, j) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        Some(block)
    }

    /// Asks the processor to bring `key`'s home slot into the cache (a hint:
    /// [`crate::sim::prefetch`]).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch::value(&self.slots[self.home(key)]);
    }

    /// Every `(key, block)`, in no meaningful order (for checks).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| s[1] != 0)
            .map(|s| (s[0], (s[1] - 1) as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::mix64;
    use std::collections::HashMap;

    #[test]
    fn the_index_agrees_with_a_map_through_inserts_and_removals_that_wrap_and_collide() {
        let mut index = BlockIndex::new(700);
        let mut model: HashMap<u64, u32> = HashMap::new();
        // Keys with equal top bits collide; keys near u64::MAX have homes at the end, so
        // their runs wrap around.
        let key = |i: u64| match i % 3 {
            0 => mix64(i),
            1 => (i << 8) | 0xff,
            _ => u64::MAX - (i << 20),
        };
        for round in 0..5_000u64 {
            let k = key(round % 700);
            if round % 5 < 3 {
                let fresh = !model.contains_key(&k);
                assert_eq!(index.insert_new(k, round as u32), fresh);
                model.entry(k).or_insert(round as u32);
            } else {
                assert_eq!(index.remove(k), model.remove(&k));
            }
            assert_eq!(index.len(), model.len());
        }
        for i in 0..700 {
            assert_eq!(index.get(key(i)), model.get(&key(i)).copied());
        }
        let mut all: Vec<(u64, u32)> = index.iter().collect();
        all.sort();
        let mut want: Vec<(u64, u32)> = model.into_iter().collect();
        want.sort();
        assert_eq!(all, want);
    }
}
