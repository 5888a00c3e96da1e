//! The hash index of a block pool: registered block hash -> block id.
//!
//! An open-addressing table with linear probing: a key's home slot is given by its top 32
//! bits (keys are already well-mixed 64-bit block hashes, see [`crate::hash`]), a lookup walks
//! from there to the key or to an empty slot, and a removal shifts the following entries back
//! instead of leaving a tombstone. A pool registers at most one hash per block, so the table
//! is sized once for its pool's blocks at 3/5 full at most (short probe runs: about 2 slots
//! for a hit, 4 for a miss). The slots are allocated zeroed, so the system maps their pages
//! only as entries land in them.
//!
//! **A slot is 8 bytes**: the key's top 32 bits (its *tag*, from which its home follows) and
//! the block id plus one (0 marks an empty slot). The rest of the key lives in the block's
//! record, which the pool reads anyway (a hit takes a reference on the block), so a lookup
//! confirms a tag match by asking the pool whether the block holds the full key (`holds`),
//! and a removal, which knows the block, matches the block id. Eight slots share a cache
//! line, and a full-size Polaris's 2,240 indexes take half the memory of 16-byte slots.
//!
//! Why not `HashMap`: at cluster scale every pool is cold when its instance's event comes (a
//! run touches 2,240 pools in turn), so each block registered, looked up or evicted costs a
//! cache miss. The pool knows the keys of a whole run of blocks in advance, and
//! [`BlockIndex::prefetch`] lets it ask for their slots a few blocks ahead, so the misses
//! overlap instead of following one another. Nothing iterates the table except checks, so its
//! order never reaches a result.

use crate::sim::prefetch;

/// An empty slot.
const EMPTY: u64 = 0;

fn tag(key: u64) -> u32 {
    (key >> 32) as u32
}

fn slot(tag: u32, block: u32) -> u64 {
    (u64::from(tag) << 32) | (u64::from(block) + 1)
}

/// The block of a full slot.
fn block(s: u64) -> u32 {
    (s as u32).wrapping_sub(1)
}

/// Registered hash -> block id (see the module doc).
#[derive(Debug)]
pub struct BlockIndex {
    /// `tag << 32 | block + 1`.
    slots: Vec<u64>,
    len: usize,
    /// Most entries (3/5 of the slots).
    max: usize,
}

impl BlockIndex {
    /// An index for at most `max` entries, of blocks below `u32::MAX`.
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

    /// The home slot of a key with tag `t`.
    fn home(&self, t: u32) -> usize {
        ((u64::from(t) * self.slots.len() as u64) >> 32) as usize
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

    /// The slot holding `key` (a slot with its tag whose block `holds` it), or the empty slot
    /// where it would go.
    fn find(&self, key: u64, holds: impl Fn(u32) -> bool) -> (usize, bool) {
        let t = tag(key);
        let mut i = self.home(t);
        // Bounded: the table always has an empty slot (it is at most 3/5 full).
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return (i, false);
            }
            if tag(s) == t && holds(block(s)) {
                return (i, true);
            }
            i = self.next(i);
        }
    }

    /// The block registered under `key`; `holds(b)` says whether block `b` holds `key`.
    pub fn get(&self, key: u64, holds: impl Fn(u32) -> bool) -> Option<u32> {
        match self.find(key, holds) {
            (i, true) => Some(block(self.slots[i])),
            _ => None,
        }
    }

    /// Maps `key` to `block` unless a block that `holds` it is mapped already; returns
    /// whether it inserted.
    pub fn insert_new(&mut self, key: u64, block: u32, holds: impl Fn(u32) -> bool) -> bool {
        assert!(block < u32::MAX, "block id out of range");
        match self.find(key, holds) {
            (_, true) => false,
            (i, false) => {
                assert!(
                    self.len < self.max,
                    "block index over its {} entries",
                    self.max
                );
                self.slots[i] = slot(tag(key), block);
                self.len += 1;
                true
            }
        }
    }

    /// Unmaps `key`, registered to `block`; returns whether it was.
    pub fn remove(&mut self, key: u64, block: u32) -> bool {
        let want = slot(tag(key), block);
        let mut hole = self.home(tag(key));
        // Bounded: the table always has an empty slot.
        loop {
            let s = self.slots[hole];
            if s == EMPTY {
                return false;
            }
            if s == want {
                break;
            }
            hole = self.next(hole);
        }
        let mut j = hole;
        // Backward shift: move up every following entry whose home is not between the hole
        // and it (cyclically). Bounded by the run of full slots after the hole.
        loop {
            j = self.next(j);
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            let home = self.home(tag(s));
            // Distance from home to j, and from the hole to j, going forward.
            if self.distance(home, j) >= self.distance(hole, j) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Asks the processor to bring `key`'s home slot into the cache (a hint:
    /// [`crate::sim::prefetch`]).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        prefetch::value(&self.slots[self.home(tag(key))]);
    }

    /// Every `(tag, block)`, in no meaningful order (for checks).
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != EMPTY)
            .map(|&s| (tag(s), block(s)))
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
        // key -> block, and what each block holds (as a pool's records do).
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut holds: HashMap<u32, u64> = HashMap::new();
        // Keys with equal top bits collide (same tag, other low bits); keys near u64::MAX have
        // homes at the end, so their runs wrap around.
        let key = |i: u64| match i % 3 {
            0 => mix64(i),
            1 => (7 << 32) | i,
            _ => u64::MAX - (i << 20),
        };
        for round in 0..5_000u64 {
            let k = key(round % 700);
            if round % 5 < 3 {
                let fresh = !model.contains_key(&k);
                let b = round as u32;
                let held = |x: u32| holds.get(&x) == Some(&k);
                assert_eq!(index.insert_new(k, b, held), fresh);
                if fresh {
                    model.insert(k, b);
                    holds.insert(b, k);
                }
            } else {
                let b = model.remove(&k);
                assert_eq!(index.remove(k, b.unwrap_or(u32::MAX - 1)), b.is_some());
                if let Some(b) = b {
                    holds.remove(&b);
                }
            }
            assert_eq!(index.len(), model.len());
        }
        for i in 0..700 {
            let k = key(i);
            let got = index.get(k, |x| holds.get(&x) == Some(&k));
            assert_eq!(got, model.get(&k).copied());
        }
        let mut all: Vec<(u32, u32)> = index.iter().collect();
        all.sort();
        let mut want: Vec<(u32, u32)> =
            model.iter().map(|(&k, &b)| ((k >> 32) as u32, b)).collect();
        want.sort();
        assert_eq!(all, want);
    }

    #[test]
    fn a_tag_match_whose_block_does_not_hold_the_key_is_not_a_hit() {
        let mut index = BlockIndex::new(10);
        let a = (5 << 32) | 1;
        let b = (5 << 32) | 2;
        assert!(index.insert_new(a, 3, |_| false));
        // Block 3 holds `a`, not `b`: same tag, another key.
        let holds = |x: u32, k: u64| x == 3 && k == a;
        assert_eq!(index.get(b, |x| holds(x, b)), None);
        assert!(index.insert_new(b, 4, |x| holds(x, b)));
        assert_eq!(index.get(a, |x| holds(x, a)), Some(3));
        assert!(index.remove(a, 3));
        assert!(!index.remove(a, 3));
        assert_eq!(index.get(b, |x| x == 4), Some(4));
    }
}
