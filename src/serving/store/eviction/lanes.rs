//! The lists of the list-based orders (S3-FIFO, ARC): resident lists whose hidden entries
//! keep their place, and ghost lists of ids.

use std::collections::{BTreeMap, HashMap};

use crate::hash::IdBuildHasher;

/// A list of resident entries ordered by position (a sequence number: smallest = oldest =
/// the tail, which eviction looks at first; largest = the head). Only entries shown to victim
/// scans are in `order`; a hidden entry keeps its position in its record, so showing it
/// again puts it back in the same place. `len` counts them all.
#[derive(Debug, Default)]
pub(super) struct Lane {
    order: BTreeMap<u64, u64>,
    len: usize,
}

impl Lane {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds an entry at position `seq` (shown unless `hidden`).
    pub(super) fn add(&mut self, seq: u64, id: u64, hidden: bool) {
        self.len += 1;
        if !hidden {
            self.order.insert(seq, id);
        }
    }

    /// Removes the entry at position `seq`.
    pub(super) fn take(&mut self, seq: u64) {
        self.len -= 1;
        self.order.remove(&seq);
    }

    /// Hides (or shows) the entry of `id` at position `seq`.
    pub(super) fn set_hidden(&mut self, seq: u64, id: u64, hidden: bool) {
        if hidden {
            self.order.remove(&seq);
        } else {
            self.order.insert(seq, id);
        }
    }

    /// The first shown entry at position `from` or later, oldest first: (position, id).
    pub(super) fn next_from(&self, from: u64) -> Option<(u64, u64)> {
        self.order.range(from..).next().map(|(&s, &id)| (s, id))
    }

    /// The shown entries' ids, oldest first.
    pub(super) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.order.values().copied()
    }

    /// The oldest shown entry for which `eligible` holds (skipping the others in place).
    pub(super) fn first_where(&self, mut eligible: impl FnMut(u64) -> bool) -> Option<(u64, u64)> {
        self.order
            .iter()
            .map(|(&s, &id)| (s, id))
            .find(|&(_, id)| eligible(id))
    }
}

/// A list of ids no longer resident (a ghost), oldest first: added at the head, trimmed at
/// the tail, and any id may leave it (on a ghost hit).
#[derive(Debug, Default)]
pub(super) struct Ghost {
    by_id: HashMap<u64, u64, IdBuildHasher>,
    order: BTreeMap<u64, u64>,
    next: u64,
}

impl Ghost {
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Adds `id` at the head (moving it there if present).
    pub(super) fn push(&mut self, id: u64) {
        self.remove(id);
        self.next += 1;
        self.by_id.insert(id, self.next);
        self.order.insert(self.next, id);
    }

    /// Removes `id`; whether it was there.
    pub(super) fn remove(&mut self, id: u64) -> bool {
        match self.by_id.remove(&id) {
            Some(seq) => {
                self.order.remove(&seq);
                true
            }
            None => false,
        }
    }

    /// Removes the oldest id.
    pub(super) fn pop_oldest(&mut self) -> Option<u64> {
        let (_, id) = self.order.pop_first()?;
        self.by_id.remove(&id);
        Some(id)
    }
}
