//! S3-FIFO (Yang et al., SOSP 2023): a small FIFO, a main FIFO and a ghost FIFO (see the
//! module doc of [`super`] for the rules and how the store's constraints change them).

use std::collections::HashMap;

use super::Access;
use super::lanes::{Ghost, Lane};
use crate::hash::IdBuildHasher;

/// The cap of the frequency counter (2 bits).
const MAX_FREQ: u8 = 3;
/// An entry leaves the small FIFO for the main one when its counter is at least this.
const MOVE_TO_MAIN: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fifo {
    Small,
    Main,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    fifo: Fifo,
    seq: u64,
    /// The 2-bit counter of S3-FIFO (0 on insert).
    freq: u8,
    access: Access,
    hidden: bool,
}

#[derive(Debug)]
pub(super) struct S3Fifo {
    entries: HashMap<u64, Entry, IdBuildHasher>,
    small: Lane,
    main: Lane,
    ghost: Ghost,
    /// Capacity of the main FIFO and of the ghost, in entries.
    main_capacity: u64,
    next_seq: u64,
    /// An announced insert and whether it was in the ghost (see
    /// [`super::EvictionQueue::announce`]).
    pending: Option<(u64, bool)>,
}

impl S3Fifo {
    pub(super) fn new(capacity: u64) -> S3Fifo {
        S3Fifo {
            entries: HashMap::default(),
            small: Lane::default(),
            main: Lane::default(),
            ghost: Ghost::default(),
            main_capacity: capacity - capacity / 10,
            next_seq: 0,
            pending: None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    fn lane(&mut self, fifo: Fifo) -> &mut Lane {
        match fifo {
            Fifo::Small => &mut self.small,
            Fifo::Main => &mut self.main,
        }
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    pub(super) fn announce(&mut self, id: u64) {
        if !self.contains(id) {
            self.pending = Some((id, self.ghost.remove(id)));
        }
    }

    pub(super) fn insert(&mut self, id: u64, freq: u32, tick: u64) {
        let in_ghost = match self.pending.take() {
            Some((p, hit)) if p == id => hit,
            _ => self.ghost.remove(id),
        };
        let fifo = if in_ghost { Fifo::Main } else { Fifo::Small };
        let seq = self.seq();
        self.lane(fifo).add(seq, id, false);
        let access = Access { freq, tick };
        let e = Entry {
            fifo,
            seq,
            freq: 0,
            access,
            hidden: false,
        };
        let old = self.entries.insert(id, e);
        debug_assert!(old.is_none(), "entry inserted twice");
    }

    pub(super) fn touch(&mut self, id: u64, tick: u64) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.freq = (e.freq + 1).min(MAX_FREQ);
            e.access.freq = e.access.freq.saturating_add(1);
            e.access.tick = tick;
        }
    }

    pub(super) fn set_hidden(&mut self, id: u64, hidden: bool) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.hidden == hidden {
            return;
        }
        e.hidden = hidden;
        let (fifo, seq) = (e.fifo, e.seq);
        self.lane(fifo).set_hidden(seq, id, hidden);
    }

    pub(super) fn is_hidden(&self, id: u64) -> Option<bool> {
        self.entries.get(&id).map(|e| e.hidden)
    }

    pub(super) fn freq(&self, id: u64) -> u32 {
        self.entries.get(&id).map_or(0, |e| e.access.freq)
    }

    pub(super) fn remove(&mut self, id: u64) -> bool {
        let Some(e) = self.entries.remove(&id) else {
            return false;
        };
        self.lane(e.fifo).take(e.seq);
        true
    }

    /// Moves `id` to the head of `fifo` with counter `freq`.
    fn requeue(&mut self, id: u64, fifo: Fifo, freq: u8) {
        let seq = self.seq();
        let e = self.entries.get_mut(&id).expect("requeued entry exists");
        let (old_fifo, old_seq, hidden) = (e.fifo, e.seq, e.hidden);
        e.fifo = fifo;
        e.seq = seq;
        e.freq = freq;
        self.lane(old_fifo).take(old_seq);
        self.lane(fifo).add(seq, id, hidden);
    }

    fn evict(&mut self, id: u64) -> (u64, Access) {
        let e = self.entries.remove(&id).expect("victim exists");
        self.lane(e.fifo).take(e.seq);
        (id, e.access)
    }

    /// The small FIFO's tail: an entry read at least twice moves to the main FIFO's head
    /// (counter reset), the first other one is evicted into the ghost. Ineligible entries
    /// are passed over in place.
    fn evict_small(&mut self, eligible: &mut impl FnMut(u64) -> bool) -> Option<(u64, Access)> {
        let mut from = 0;
        // Bounded: every round moves past one entry of the small FIFO.
        while let Some((seq, id)) = self.small.next_from(from) {
            from = seq + 1;
            if !eligible(id) {
                continue;
            }
            if self.entries[&id].freq >= MOVE_TO_MAIN {
                self.requeue(id, Fifo::Main, 0);
                continue;
            }
            if self.main_capacity > 0 {
                self.ghost.push(id);
                while self.ghost.len() as u64 > self.main_capacity {
                    self.ghost.pop_oldest();
                }
            }
            return Some(self.evict(id));
        }
        None
    }

    /// The main FIFO's tail (a 2-bit CLOCK): an entry read since it last passed the tail is
    /// reinserted at the head with its counter less one, the first other one is evicted.
    /// Ineligible entries are passed over in place.
    fn evict_main(&mut self, eligible: &mut impl FnMut(u64) -> bool) -> Option<(u64, Access)> {
        let mut from = 0;
        // Bounded: a reinserted entry comes back with a smaller counter, at most 3 times.
        while let Some((seq, id)) = self.main.next_from(from) {
            from = seq + 1;
            if !eligible(id) {
                continue;
            }
            let freq = self.entries[&id].freq;
            if freq >= 1 {
                self.requeue(id, Fifo::Main, freq - 1);
                continue;
            }
            return Some(self.evict(id));
        }
        None
    }

    pub(super) fn pop_entry_where(
        &mut self,
        mut eligible: impl FnMut(u64) -> bool,
    ) -> Option<(u64, Access)> {
        let main_first = self.main.len() as u64 > self.main_capacity || self.small.len() == 0;
        if main_first {
            // What the small FIFO promotes while it finds no victim may go from the main one.
            self.evict_main(&mut eligible)
                .or_else(|| self.evict_small(&mut eligible))
                .or_else(|| self.evict_main(&mut eligible))
        } else {
            self.evict_small(&mut eligible)
                .or_else(|| self.evict_main(&mut eligible))
        }
    }

    /// The id [`Self::pop_entry_where`] would return, changing nothing. From S: the first
    /// eligible entry read less than twice. From M, a CLOCK whose passes lower every counter
    /// by one: the eligible entry of lowest counter, the oldest of those; entries S would
    /// promote on the way join M's head with counter 0, after every entry M holds.
    pub(super) fn peek_where(&self, mut eligible: impl FnMut(u64) -> bool) -> Option<u64> {
        let small = |el: &mut dyn FnMut(u64) -> bool| {
            self.small
                .first_where(|id| el(id) && self.entries[&id].freq < MOVE_TO_MAIN)
                .map(|(_, id)| id)
        };
        // The promoted entries, in S order, after M's entries.
        let main = |el: &mut dyn FnMut(u64) -> bool, promoted: bool| {
            let mut best: Option<(u8, usize, u64)> = None;
            let m = self.main.ids().filter(|&id| el(id));
            let m: Vec<u64> = m.collect();
            let p: Vec<u64> = if promoted {
                self.small.ids().filter(|&id| el(id)).collect()
            } else {
                Vec::new()
            };
            for (rank, id) in m.iter().chain(p.iter()).enumerate() {
                let f = if rank < m.len() {
                    self.entries[id].freq
                } else {
                    0
                };
                if best.is_none_or(|(bf, _, _)| f < bf) {
                    best = Some((f, rank, *id));
                }
            }
            best.map(|(_, _, id)| id)
        };
        let main_first = self.main.len() as u64 > self.main_capacity || self.small.len() == 0;
        if main_first {
            main(&mut eligible, false)
                .or_else(|| small(&mut eligible))
                .or_else(|| main(&mut eligible, true))
        } else {
            small(&mut eligible).or_else(|| main(&mut eligible, true))
        }
    }
}
