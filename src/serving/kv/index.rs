//! The hash index of a block pool: hash of a segment's first block -> segment.
//!
//! The pool keeps registered blocks in segments (see [`crate::serving::kv`]): runs of
//! blocks at consecutive chain positions, found from their first hash, so only that hash
//! needs an entry here. That is one entry or a few per prompt instead of one per block (a
//! SQuAD prompt is 258 blocks), so the table is small and stays in the cache, where a table
//! with an entry per block (twice the pool's blocks, a few hundred KiB) would cost a cache
//! miss per registered block at cluster scale. Below, a *block* is what an entry names: for
//! the pool, a segment's slot.
//!
//! An open-addressing table with linear probing: a key's home slot is given by its top 32
//! bits (keys are already well-mixed 64-bit block hashes, see [`crate::hash`]), and a lookup
//! walks from there to the key or to an empty slot.
//!
//! **A slot is 8 bytes**: the key's top 32 bits (its *tag*, from which its home follows) and
//! the block id plus one (0 marks an empty slot). The rest of the key lives in the pool (a
//! segment's first hash), so every operation asks the pool for a block's hash (`hash_of`),
//! and a slot is *live* when its block holds a hash with the slot's tag.
//!
//! **Evictions do not touch the table.** When a segment loses its last block, the slot that named
//! it becomes *stale* and is skipped by lookups (the segment no longer holds the key). When full
//! slots reach 3/4 of the table, [`BlockIndex::make_room`] keeps the live slots and sizes the table
//! to four times their number (at least [`MIN_SLOTS`], at most `2 * max + 1` for a pool of `max`
//! blocks, which holds every block with room to spare): a rebuild comes after at least as many
//! insertions as the entries it keeps, probe runs stay short, and the table always has an empty
//! slot. A stale slot that names a block being indexed again under a key with the same tag lies on
//! the key's probe path and is reused, so live slots never name a block twice.
//!
//! Why not `HashMap`: entries are checked against the pool's hashes (8-byte slots), stale
//! entries cost nothing until a rebuild, and nothing iterates the table except checks and
//! rebuilds; a lookup's answer (the one live slot of its key) does not depend on where slots
//! lie, so the table's order never reaches a result.

/// An empty slot.
const EMPTY: u64 = 0;

/// The smallest table: eight cache lines.
pub const MIN_SLOTS: usize = 64;

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

/// Segment start hash -> block id (see the module doc).
#[derive(Clone, Debug)]
pub struct BlockIndex {
    /// `tag << 32 | block + 1`.
    slots: Vec<u64>,
    /// Full slots, live or stale.
    full: usize,
    /// Most full slots before a rebuild (3/4 of the slots).
    max_full: usize,
    /// Most live slots (one per block of the pool), and the largest table.
    max_live: usize,
    max_slots: usize,
}

impl BlockIndex {
    /// An index for at most `max` live entries, of blocks below `u32::MAX`.
    pub fn new(max: usize) -> BlockIndex {
        let max_slots = 2 * max + 1;
        let slots = MIN_SLOTS.min(max_slots);
        BlockIndex {
            slots: vec![EMPTY; slots],
            full: 0,
            max_full: slots * 3 / 4,
            max_live: max,
            max_slots,
        }
    }

    /// Slots of the table.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Full slots, live or stale.
    pub fn full_slots(&self) -> usize {
        self.full
    }

    /// The home slot of a key with tag `t`.
    fn home(&self, t: u32) -> usize {
        ((u64::from(t) * self.slots.len() as u64) >> 32) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// The block registered under `key`; `hash_of(b)` is block `b`'s registered hash.
    pub fn get(&self, key: u64, hash_of: impl Fn(u32) -> Option<u64>) -> Option<u32> {
        let t = tag(key);
        let mut i = self.home(t);
        // Bounded: the table always has an empty slot (it is at most 3/4 full).
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if tag(s) == t && hash_of(block(s)) == Some(key) {
                return Some(block(s));
            }
            i = self.next(i);
        }
    }

    /// Maps `key` to `block` (which holds no hash now) unless a block registered under `key`
    /// is mapped already; returns whether it mapped it. The table must not be full.
    pub fn insert_new(&mut self, key: u64, b: u32, hash_of: impl Fn(u32) -> Option<u64>) -> bool {
        assert!(b < u32::MAX, "block id out of range");
        assert!(!self.is_full(), "block index full: rebuild it first");
        let t = tag(key);
        let want = slot(t, b);
        let mut i = self.home(t);
        let mut stale = false;
        // Bounded: the table always has an empty slot.
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                break;
            }
            if s == want {
                // A stale slot of this block, on this key's probe path: the key's slot, unless
                // another block holds the key further on.
                stale = true;
            } else if tag(s) == t && hash_of(block(s)) == Some(key) {
                return false;
            }
            i = self.next(i);
        }
        if !stale {
            self.slots[i] = want;
            self.full += 1;
        }
        true
    }

    /// Whether the table is as full as it may be: the pool rebuilds it before it inserts.
    pub fn is_full(&self) -> bool {
        self.full >= self.max_full
    }

    /// Keeps the live slots (`hash_of(b)` is block `b`'s registered hash), in a table four
    /// times their number (within the bounds of the module doc), if the table is full.
    pub fn make_room(&mut self, hash_of: impl Fn(u32) -> Option<u64>) {
        if !self.is_full() {
            return;
        }
        let live: Vec<u64> = (self.slots.iter().copied())
            .filter(|&s| s != EMPTY && hash_of(block(s)).map(tag) == Some(tag(s)))
            .collect();
        assert!(
            live.len() <= self.max_live,
            "block index over its {} live entries",
            self.max_live
        );
        let len = (4 * live.len()).max(MIN_SLOTS).min(self.max_slots);
        self.slots.clear();
        self.slots.resize(len, EMPTY);
        self.max_full = len * 3 / 4;
        self.full = 0;
        for s in live {
            let mut i = self.home(tag(s));
            while self.slots[i] != EMPTY {
                i = self.next(i);
            }
            self.slots[i] = s;
            self.full += 1;
        }
    }

    /// Every full slot's `(tag, block)`, live or stale, in no meaningful order (for tests).
    #[cfg(test)]
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
    fn the_index_agrees_with_a_map_through_registrations_evictions_and_rebuilds() {
        const BLOCKS: u32 = 300;
        let mut index = BlockIndex::new(BLOCKS as usize);
        // What each block is registered under, as a pool's records say; and the inverse.
        let mut holds: HashMap<u32, u64> = HashMap::new();
        let mut model: HashMap<u64, u32> = HashMap::new();
        // Keys with equal top bits collide (same tag, other low bits); keys near u64::MAX have
        // homes at the end, so their runs wrap around.
        let key = |i: u64| match i % 3 {
            0 => mix64(i),
            1 => (7 << 32) | i,
            _ => u64::MAX - (i << 20),
        };
        let mut rebuilds = 0;
        for round in 0..20_000u64 {
            let k = key(mix64(round) % 900);
            let b = (mix64(round ^ 0xb10c) % u64::from(BLOCKS)) as u32;
            if let Some(old) = holds.remove(&b) {
                // Evict the block: only its record changes.
                model.remove(&old);
            } else {
                if index.is_full() {
                    rebuilds += 1;
                }
                index.make_room(|x| holds.get(&x).copied());
                let fresh = !model.contains_key(&k);
                let inserted = index.insert_new(k, b, |x| holds.get(&x).copied());
                assert_eq!(inserted, fresh, "round {round}");
                if fresh {
                    holds.insert(b, k);
                    model.insert(k, b);
                }
            }
            if round % 97 == 0 {
                for i in 0..900 {
                    let k = key(i);
                    let got = index.get(k, |x| holds.get(&x).copied());
                    assert_eq!(got, model.get(&k).copied(), "round {round}, key {i}");
                }
            }
            assert!(index.full_slots() <= index.max_full, "round {round}");
        }
        assert!(rebuilds > 10, "only {rebuilds} rebuilds");
        index.max_full = 0;
        index.make_room(|x| holds.get(&x).copied());
        assert!(index.len() >= MIN_SLOTS && index.len() <= 2 * BLOCKS as usize + 1);
        let mut all: Vec<(u32, u32)> = index.iter().collect();
        all.sort();
        let mut want: Vec<(u32, u32)> =
            model.iter().map(|(&k, &b)| ((k >> 32) as u32, b)).collect();
        want.sort();
        assert_eq!(all, want, "after a rebuild, only the live slots are left");
    }

    #[test]
    fn the_table_starts_small_grows_with_its_live_entries_and_shrinks_back() {
        let mut index = BlockIndex::new(10_000);
        assert_eq!(index.len(), MIN_SLOTS);
        let mut holds: HashMap<u32, u64> = HashMap::new();
        for b in 0..5_000u32 {
            index.make_room(|x| holds.get(&x).copied());
            let k = mix64(u64::from(b));
            assert!(index.insert_new(k, b, |x| holds.get(&x).copied()));
            holds.insert(b, k);
        }
        assert!(index.len() >= 4 * 5_000 / 3, "{} slots", index.len());
        for b in 0..5_000u32 {
            assert_eq!(
                index.get(mix64(u64::from(b)), |x| holds.get(&x).copied()),
                Some(b)
            );
        }
        // All evicted but ten: the next rebuild sizes the table for those.
        holds.retain(|&b, _| b < 10);
        index.max_full = 0;
        index.make_room(|x| holds.get(&x).copied());
        assert_eq!(index.len(), MIN_SLOTS);
        assert_eq!(index.full_slots(), 10);
        // A pool smaller than the smallest table has a table for the whole pool.
        assert_eq!(BlockIndex::new(3).len(), 7);
    }

    #[test]
    fn a_tag_match_whose_block_does_not_hold_the_key_is_not_a_hit() {
        let mut index = BlockIndex::new(10);
        let a = (5 << 32) | 1;
        let b = (5 << 32) | 2;
        assert!(index.insert_new(a, 3, |_| None));
        // Block 3 holds `a`; `b` has the same tag.
        let holds = |x: u32| (x == 3).then_some(a);
        assert_eq!(index.get(b, holds), None);
        assert!(index.insert_new(b, 4, holds));
        let holds = |x: u32| match x {
            3 => Some(a),
            4 => Some(b),
            _ => None,
        };
        assert_eq!(index.get(a, holds), Some(3));
        assert_eq!(index.get(b, holds), Some(4));
        // Block 3 evicted: its slot is stale, and no longer a hit.
        let holds = |x: u32| (x == 4).then_some(b);
        assert_eq!(index.get(a, holds), None);
        assert_eq!(index.get(b, holds), Some(4));
    }

    #[test]
    fn a_block_registered_again_under_a_key_with_its_stale_slots_tag_reuses_the_slot() {
        let mut index = BlockIndex::new(10);
        let a = (5 << 32) | 1;
        let c = (5 << 32) | 3;
        assert!(index.insert_new(a, 3, |_| None));
        // Block 3 evicted, then registered under `c`: same tag, so the stale slot serves.
        assert!(index.insert_new(c, 3, |_| None));
        assert_eq!(index.full_slots(), 1);
        assert_eq!(index.get(c, |x| (x == 3).then_some(c)), Some(3));
        assert_eq!(index.get(a, |x| (x == 3).then_some(c)), None);
    }
}
