//! A map from well-mixed 64-bit ids (chained hashes, see [`crate::hash`]) to records, whose
//! probes can be asked for ahead.
//!
//! **Why.** A store lookup walks a prompt's chain of tensor ids (16 for a SQuAD prompt) in
//! the directory's map of every stored tensor, tens of MiB at 2,240 GPUs: with a
//! `HashMap`, each step was two cache misses (the control bytes and the bucket) that the
//! walk waited for in turn. Here a lookup first asks the processor for every id's slot
//! line ([`IdMap::prefetch`]), then for every found record ([`IdMap::prefetch_record`]),
//! so the misses of the whole chain overlap, and the walk finds them in the cache.
//!
//! **Layout.** Open addressing with linear probing over 16-byte slots (the id and the
//! record's index, four to a line), at most half full; an id's home slot is given by its top
//! bits. Records sit densely in an array beside their ids; removing one moves the last record
//! into its place (and fixes that record's slot), and a slot is removed by shifting back the
//! slots after it that would otherwise be cut off from their home (no tombstones). Nothing
//! reads the map in slot or record order except [`IdMap::iter`], whose order the callers do
//! not depend on (checks sort what they collect).

use crate::sim::prefetch;

/// A slot with no id.
const EMPTY: u32 = u32::MAX;

/// The smallest table: four lines.
const MIN_SLOTS: usize = 16;

#[derive(Clone, Copy, Debug)]
struct Slot {
    id: u64,
    /// Index of the record, `EMPTY` for an empty slot.
    at: u32,
}

const FREE: Slot = Slot { id: 0, at: EMPTY };

/// Id -> record (see the module doc).
#[derive(Clone, Debug)]
pub struct IdMap<V> {
    slots: Vec<Slot>,
    /// `64 - log2(slots)`: an id's home is its top bits.
    shift: u32,
    ids: Vec<u64>,
    records: Vec<V>,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap {
            slots: vec![FREE; MIN_SLOTS],
            shift: 64 - MIN_SLOTS.trailing_zeros(),
            ids: Vec::new(),
            records: Vec::new(),
        }
    }
}

impl<V> IdMap<V> {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn home(&self, id: u64) -> usize {
        (id >> self.shift) as usize
    }

    fn next(&self, i: usize) -> usize {
        (i + 1) & (self.slots.len() - 1)
    }

    /// The slot that holds `id`, or the empty slot where its probe ends. Bounded: the table
    /// is at most half full, so a probe meets an empty slot.
    fn find(&self, id: u64) -> (usize, bool) {
        let mut i = self.home(id);
        loop {
            let s = self.slots[i];
            if s.at == EMPTY {
                return (i, false);
            }
            if s.id == id {
                return (i, true);
            }
            i = self.next(i);
        }
    }

    pub fn contains_key(&self, id: &u64) -> bool {
        self.find(*id).1
    }

    pub fn get(&self, id: &u64) -> Option<&V> {
        match self.find(*id) {
            (i, true) => Some(&self.records[self.slots[i].at as usize]),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, id: &u64) -> Option<&mut V> {
        match self.find(*id) {
            (i, true) => Some(&mut self.records[self.slots[i].at as usize]),
            _ => None,
        }
    }

    /// Asks the processor for the line of `id`'s home slot (a cache hint: nothing changes).
    #[inline]
    pub fn prefetch(&self, id: u64) {
        prefetch::bytes(self.slots.as_ptr().wrapping_add(self.home(id)).cast(), 1);
    }

    /// Asks for the record of `id`, if present (its slot is read: ask for it first with
    /// [`IdMap::prefetch`]).
    #[inline]
    pub fn prefetch_record(&self, id: u64) {
        if let (i, true) = self.find(id) {
            let at = self.slots[i].at as usize;
            prefetch::bytes(
                self.records.as_ptr().wrapping_add(at).cast(),
                std::mem::size_of::<V>(),
            );
        }
    }

    /// Maps `id` to `v`; returns the record it replaces, if any.
    pub fn insert(&mut self, id: u64, v: V) -> Option<V> {
        if let (i, true) = self.find(id) {
            let at = self.slots[i].at as usize;
            return Some(std::mem::replace(&mut self.records[at], v));
        }
        if 2 * (self.records.len() + 1) > self.slots.len() {
            self.grow();
        }
        let at = u32::try_from(self.records.len()).expect("fewer than 2^32 - 1 records");
        assert!(at != EMPTY, "fewer than 2^32 - 1 records");
        let (i, _) = self.find(id);
        self.slots[i] = Slot { id, at };
        self.ids.push(id);
        self.records.push(v);
        None
    }

    /// Doubles the table and places every id again (in record order, so the layout follows
    /// from the operations alone).
    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        self.slots = vec![FREE; n];
        self.shift = 64 - n.trailing_zeros();
        for (at, &id) in self.ids.iter().enumerate() {
            let (i, found) = self.find(id);
            debug_assert!(!found);
            self.slots[i] = Slot { id, at: at as u32 };
        }
    }

    /// Removes `id`; returns its record.
    pub fn remove(&mut self, id: &u64) -> Option<V> {
        let (i, found) = self.find(*id);
        if !found {
            return None;
        }
        let at = self.slots[i].at as usize;
        let shift = self.shift;
        let left = close_gap(&mut self.slots, i, |s| {
            (s.at != EMPTY).then(|| (s.id >> shift) as usize)
        });
        self.slots[left] = FREE;
        // The last record fills the removed one's place.
        let last = self.records.len() - 1;
        if at != last {
            let moved = self.ids[last];
            let (k, found) = self.find(moved);
            debug_assert!(found);
            self.slots[k].at = at as u32;
        }
        self.ids.swap_remove(at);
        Some(self.records.swap_remove(at))
    }

    /// Ids, in no order the callers may rely on.
    pub fn keys(&self) -> impl Iterator<Item = &u64> + '_ {
        self.ids.iter()
    }

    /// Ids and records, in no order the callers may rely on.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> + '_ {
        self.ids.iter().zip(&self.records)
    }
}

/// Backward shift after removing slot `hole` of a linear-probing table: a later slot of the
/// run moves into the hole unless its home (`home`, `None` for an empty slot) lies cyclically
/// after the hole (then it stays reachable where it is). Returns the slot left empty, for the
/// caller to clear. Bounded: the table has an empty slot, so the run ends.
fn close_gap<S: Copy>(
    slots: &mut [S],
    mut hole: usize,
    home: impl Fn(&S) -> Option<usize>,
) -> usize {
    let mask = slots.len() - 1;
    let mut j = hole;
    loop {
        j = (j + 1) & mask;
        let s = slots[j];
        let Some(h) = home(&s) else {
            return hole;
        };
        let stays = if hole <= j {
            hole < h && h <= j
        } else {
            hole < h || h <= j
        };
        if !stays {
            slots[hole] = s;
            hole = j;
        }
    }
}

impl<V> std::ops::Index<&u64> for IdMap<V> {
    type Output = V;
    /// The record of `id`. Panics if there is none.
    fn index(&self, id: &u64) -> &V {
        self.get(id).expect("an id in the map")
    }
}

impl<'a, V> IntoIterator for &'a IdMap<V> {
    type Item = (&'a u64, &'a V);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, u64>, std::slice::Iter<'a, V>>;
    fn into_iter(self) -> Self::IntoIter {
        self.ids.iter().zip(&self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;
    use std::collections::HashMap;

    /// Ids from a small set (so removals and re-inserts meet), some with equal top bits (so
    /// probe runs form and wrap), including 0 and u64::MAX.
    fn id_pool() -> Vec<u64> {
        (0..300u64)
            .map(|k| match k % 3 {
                0 => k.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                1 => u64::MAX - k,
                _ => k,
            })
            .collect()
    }

    #[test]
    fn answers_as_a_hash_map_does_under_random_inserts_and_removals() {
        let mut rng = Stream::new(7, 0);
        let mut m: IdMap<u32> = IdMap::default();
        let mut r: HashMap<u64, u32> = HashMap::new();
        let pool = id_pool();
        for step in 0..20_000u32 {
            let id = pool[rng.below(pool.len() as u64) as usize];
            match rng.below(3) {
                0 => assert_eq!(m.insert(id, step), r.insert(id, step)),
                1 => assert_eq!(m.remove(&id), r.remove(&id)),
                _ => assert_eq!(m.get(&id), r.get(&id)),
            }
            assert_eq!(m.len(), r.len());
            if step % 997 == 0 {
                for (&k, &v) in &r {
                    assert_eq!(m.get(&k), Some(&v), "id {k:#x}");
                    m.prefetch(k);
                    m.prefetch_record(k);
                }
                let mut a: Vec<(u64, u32)> = m.iter().map(|(&k, &v)| (k, v)).collect();
                let mut b: Vec<(u64, u32)> = r.iter().map(|(&k, &v)| (k, v)).collect();
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b);
            }
        }
    }

    /// Ids whose homes are all the last slot, so that their run wraps past the table's end
    /// at every size: every id is still found after each doubling places them again.
    #[test]
    fn tables_that_grow_with_a_run_wrapped_past_their_end_keep_every_id() {
        let mut m: IdMap<u64> = IdMap::default();
        for k in 0..2_000u64 {
            let id = u64::MAX - k;
            assert_eq!(m.insert(id, k), None);
            // A second, well-spread id, so that runs elsewhere grow too.
            let other = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            m.insert(other, k);
            if k % 97 == 0 || k < 40 {
                for j in 0..=k {
                    assert_eq!(m.get(&(u64::MAX - j)), Some(&j), "id {j} after {k}");
                }
            }
        }
        assert_eq!(m.len(), 4_000);
    }

    #[test]
    fn get_mut_changes_the_record_in_place() {
        let mut m: IdMap<Vec<u32>> = IdMap::default();
        m.insert(5, vec![1]);
        m.get_mut(&5).unwrap().push(2);
        assert_eq!(m.get(&5), Some(&vec![1, 2]));
        assert!(m.contains_key(&5) && !m.contains_key(&6));
        assert_eq!(m.remove(&5), Some(vec![1, 2]));
        assert!(m.is_empty());
    }
}
