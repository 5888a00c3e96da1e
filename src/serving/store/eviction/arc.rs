//! ARC (Megiddo & Modha, FAST 2003): two resident LRU lists T1 (seen once) and T2 (seen
//! twice or more), their ghosts B1 and B2, and a target size p of T1 that adapts on ghost
//! hits (see the module doc of [`super`] for how the store's constraints change it).

use std::collections::HashMap;

use super::Access;
use super::lanes::{Ghost, Lane};
use crate::hash::IdBuildHasher;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    T1,
    T2,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    list: List,
    seq: u64,
    access: Access,
    hidden: bool,
}

/// What the miss being filled was (see [`super::EvictionQueue::announce`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Miss {
    /// In neither ghost.
    Cold,
    InB1,
    InB2,
}

#[derive(Debug)]
pub(super) struct Arc {
    entries: HashMap<u64, Entry, IdBuildHasher>,
    t1: Lane,
    t2: Lane,
    b1: Ghost,
    b2: Ghost,
    /// Target size of T1, in [0, c].
    p: f64,
    /// The cache's capacity c, in entries.
    c: u64,
    next_seq: u64,
    pending: Option<(u64, Miss)>,
}

impl Arc {
    pub(super) fn new(capacity: u64) -> Arc {
        Arc {
            entries: HashMap::default(),
            t1: Lane::default(),
            t2: Lane::default(),
            b1: Ghost::default(),
            b2: Ghost::default(),
            p: 0.0,
            c: capacity,
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

    /// The target size of T1 (for tests).
    pub(super) fn target(&self) -> f64 {
        self.p
    }

    fn lane(&mut self, list: List) -> &mut Lane {
        match list {
            List::T1 => &mut self.t1,
            List::T2 => &mut self.t2,
        }
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// The miss of `id`: cases II to IV of the paper's ARC(c), less REPLACE (which
    /// [`Self::pop_entry_where`] does): a ghost hit adapts p and leaves its ghost; a cold miss
    /// trims the ghosts.
    fn miss(&mut self, id: u64) -> Miss {
        let (b1, b2) = (self.b1.len() as f64, self.b2.len() as f64);
        let c = self.c as f64;
        if self.b1.remove(id) {
            self.p = c.min(self.p + (b2 / b1).max(1.0));
            return Miss::InB1;
        }
        if self.b2.remove(id) {
            self.p = (self.p - (b1 / b2).max(1.0)).max(0.0);
            return Miss::InB2;
        }
        let t1 = self.t1.len() as u64;
        let l1 = t1 + self.b1.len() as u64;
        let total = l1 + (self.t2.len() + self.b2.len()) as u64;
        if l1 >= self.c {
            // Case IV.A; when T1 alone fills the cache, the victim leaves no ghost (at pop).
            if t1 < self.c {
                self.b1.pop_oldest();
            }
        } else if total >= 2 * self.c {
            // Case IV.B.
            self.b2.pop_oldest();
        }
        Miss::Cold
    }

    pub(super) fn announce(&mut self, id: u64) {
        if !self.contains(id) {
            let m = self.miss(id);
            self.pending = Some((id, m));
        }
    }

    pub(super) fn insert(&mut self, id: u64, freq: u32, tick: u64) {
        let m = match self.pending.take() {
            Some((p, m)) if p == id => m,
            _ => self.miss(id),
        };
        let list = if m == Miss::Cold { List::T1 } else { List::T2 };
        let seq = self.seq();
        self.lane(list).add(seq, id, false);
        let e = Entry {
            list,
            seq,
            access: Access { freq, tick },
            hidden: false,
        };
        let old = self.entries.insert(id, e);
        debug_assert!(old.is_none(), "entry inserted twice");
    }

    /// A hit: the entry moves to the MRU end of T2.
    pub(super) fn touch(&mut self, id: u64, tick: u64) {
        let seq = self.seq();
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.access.freq = e.access.freq.saturating_add(1);
        e.access.tick = tick;
        let (list, old, hidden) = (e.list, e.seq, e.hidden);
        e.list = List::T2;
        e.seq = seq;
        self.lane(list).take(old);
        self.t2.add(seq, id, hidden);
    }

    pub(super) fn set_hidden(&mut self, id: u64, hidden: bool) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.hidden == hidden {
            return;
        }
        e.hidden = hidden;
        let (list, seq) = (e.list, e.seq);
        self.lane(list).set_hidden(seq, id, hidden);
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
        self.lane(e.list).take(e.seq);
        true
    }

    /// Evicts the LRU eligible entry of `list`, into its ghost if `ghost`.
    fn evict_from(
        &mut self,
        list: List,
        ghost: bool,
        eligible: &mut impl FnMut(u64) -> bool,
    ) -> Option<(u64, Access)> {
        let (seq, id) = self.lane(list).first_where(&mut *eligible)?;
        self.lane(list).take(seq);
        let e = self.entries.remove(&id).expect("victim exists");
        if ghost {
            match list {
                List::T1 => self.b1.push(id),
                List::T2 => self.b2.push(id),
            }
        }
        Some((id, e.access))
    }

    /// The list REPLACE of the paper evicts from for the miss announced (a cold miss if
    /// none), and whether its victim enters a ghost: the LRU of T1 goes to B1 when T1
    /// exceeds its target (or meets it, on a hit in B2), else the LRU of T2 goes to B2; when
    /// T1 alone fills the cache on a cold miss, its LRU leaves no ghost.
    fn replace_list(&self) -> (List, bool) {
        let m = self.pending.map_or(Miss::Cold, |(_, m)| m);
        let t1 = self.t1.len() as u64;
        if m == Miss::Cold && t1 >= self.c {
            return (List::T1, false);
        }
        let t1f = t1 as f64;
        let from_t1 = t1 >= 1 && ((m == Miss::InB2 && t1f == self.p) || t1f > self.p);
        (if from_t1 { List::T1 } else { List::T2 }, true)
    }

    fn other(list: List) -> List {
        match list {
            List::T1 => List::T2,
            List::T2 => List::T1,
        }
    }

    /// REPLACE (see [`Self::replace_list`]). When the chosen list has no eligible entry the
    /// other gives the victim, into its ghost.
    pub(super) fn pop_entry_where(
        &mut self,
        mut eligible: impl FnMut(u64) -> bool,
    ) -> Option<(u64, Access)> {
        let (list, ghost) = self.replace_list();
        self.evict_from(list, ghost, &mut eligible)
            .or_else(|| self.evict_from(Self::other(list), true, &mut eligible))
    }

    /// The id [`Self::pop_entry_where`] would return, changing nothing.
    pub(super) fn peek_where(&self, mut eligible: impl FnMut(u64) -> bool) -> Option<u64> {
        let (list, _) = self.replace_list();
        let lane = |l| match l {
            List::T1 => &self.t1,
            List::T2 => &self.t2,
        };
        lane(list)
            .first_where(&mut eligible)
            .or_else(|| lane(Self::other(list)).first_where(&mut eligible))
            .map(|(_, id)| id)
    }
}
