//! Eviction orders for store caches: LRU, GDSF, LFU, S3-FIFO and ARC.
//!
//! A queue decides the *order* in which its entries go; the store decides *when* a tier must
//! give up an entry (it is full) and which entries may go (its leaves that no insert pins and
//! no read lease holds: see [`super::directory`]). So every order answers one question,
//! [`EvictionQueue::pop_entry_where`]: the first entry in its order among those `eligible`.
//! Entries that are not leaves of the prefix trie are *hidden* ([`EvictionQueue::set_hidden`]):
//! they stay in the queue, with their history and their place, but are no candidates.
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
//! **LFU** evicts the entry of fewest accesses, the least recently accessed of those first
//! (SGLang's radix-cache `lfu`: `(hit_count, last_access_time)`; LMCache's `LFU` breaks ties
//! FIFO). Counts never age: an entry read often long ago outlives any entry read less since
//! (GDSF is the order that ages). A tensor demoted to SSD takes its count with it.
//!
//! These three are *keyed*: keys are totally ordered (a GDSF priority is a non-negative
//! `f64`, whose IEEE bits order like the number; LFU's key is the pair (count, tick)); ties
//! break by tensor id, so eviction order is deterministic. Every operation is O(log n)
//! amortised.
//!
//! **S3-FIFO** (Yang et al., SOSP 2023; libCacheSim's `S3FIFO.c`): a small FIFO S (its share
//! is 10 % of the capacity, in entries), a main FIFO M (the rest) and a ghost FIFO G of the ids
//! last evicted from S (as many as M holds). Each entry has a counter capped at 3, 0 when
//! inserted, raised by every access. An insert goes to M's head when its id is in G (and
//! leaves G), else to S's head. To evict: from M when M holds more than its share or S is
//! empty, else from S. From S, the tail moves to M's head with its counter reset when it was
//! read at least twice (counter >= 2, libCacheSim's `move-to-main-threshold`), else it is
//! the victim and its id enters G; from M, the tail goes back to M's head with its counter
//! less one when it is above 0 (a 2-bit CLOCK), else it is the victim (no ghost).
//!
//! **ARC** (Megiddo & Modha, FAST 2003): T1 holds entries seen once, T2 entries seen again
//! (every access moves an entry to T2's MRU end); B1 and B2 are the ghosts of what left T1 and
//! T2; a target p for T1's size (0 at first) grows on a hit in B1 (by `max(1, |B2| / |B1|)`,
//! up to the capacity c) and shrinks on a hit in B2 (by `max(1, |B1| / |B2|)`, down to 0).
//! A ghost hit is inserted into T2, any other miss into T1. REPLACE evicts T1's LRU entry
//! into B1 when `|T1| > p` (or `|T1| = p` on a hit in B2), else T2's into B2; on a cold miss
//! with `|T1| + |B1| = c` the LRU of B1 is forgotten, or, when T1 alone fills the cache, T1's
//! LRU entry goes without a ghost; on another cold miss with all four lists at 2c the LRU of
//! B2 is forgotten. p is a real number, as in the paper.
//!
//! **What the store changes in S3-FIFO and ARC, and what it does not.** Sizes (S, M, T1,
//! T2) count every resident entry, hidden or not, and the tests of when to evict from which
//! list are exactly the published ones. The capacity in entries is given when the queue is
//! made ([`EvictionQueue::with_capacity`]; every tensor of a store has the same size). A miss
//! is announced before its room is made ([`EvictionQueue::announce`]), so that, as in the
//! published access path, its ghost hit (S3-FIFO: it leaves G; ARC: p adapts and the tie rule
//! of REPLACE applies) is known before the victims are chosen; an insert that was not
//! announced (a replica batch makes room for all its tensors at once) is classified when
//! inserted. Then:
//! - *Victims are eligible entries only.* Where a list is scanned from its tail, hidden and
//!   ineligible entries are passed over *in place*: they keep their position and their
//!   counter (S3-FIFO neither promotes nor decrements them; ARC does not move them). An
//!   eligible entry met on the way is treated exactly as published: promoted from S to M, or
//!   reinserted at M's head with its counter less one.
//! - *When the list the algorithm picks has no eligible victim, the other one gives it*:
//!   S3-FIFO tries S then M (or M, then S, then M again, since S may have promoted entries
//!   into M); ARC takes the LRU eligible entry of the other resident list (into its ghost).
//!   The published algorithms never meet this case (every entry is a candidate).
//! - *The store decides when to evict*: only when a tier is full. ARC's REPLACE on a ghost
//!   hit into a cache that is not full (possible only after removals, which plain ARC has
//!   not) does not happen. A removal ([`EvictionQueue::remove`]: a tensor dropped with its
//!   prefix, a replica gone with its owner) is no eviction and leaves no ghost.
//! - An announced insert that the store then refuses has still left its ghost (and ARC's p
//!   has adapted), as if it had been inserted and removed at once.
//! - An insert of a tensor demoted to SSD (or of a replica) is a miss of that tier's cache: its
//!   S3-FIFO counter starts at 0, it starts in ARC's T1 unless a ghost knows it; its access
//!   count and last access ([`Access`]) still travel with it.
//!
//! Left out of libCacheSim's S3-FIFO (kept as the paper has it): before the first eviction it
//! inserts into M once S is full, and it refuses objects as large as S (with a capacity under
//! 10 entries, S's share is 0 and S then only holds what waits for eviction).

mod arc;
mod keyed;
mod lanes;
mod s3fifo;

use keyed::Keyed;

/// Which order a cache evicts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Eviction {
    Lru,
    Gdsf,
    Lfu,
    S3Fifo,
    Arc,
}

/// The access history of an entry, carried along when it moves to another queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Accesses counted so far (1 when the entry was added).
    pub freq: u32,
    /// The tick of the last access.
    pub tick: u64,
}

#[derive(Debug)]
enum Inner {
    /// LRU and GDSF.
    Keyed(Keyed<u64>),
    Lfu(Keyed<(u32, u64)>),
    S3Fifo(s3fifo::S3Fifo),
    Arc(arc::Arc),
}

/// Calls the same method on whichever order the queue runs.
macro_rules! each {
    ($self:expr, $q:ident => $call:expr) => {
        match $self {
            Inner::Keyed($q) => $call,
            Inner::Lfu($q) => $call,
            Inner::S3Fifo($q) => $call,
            Inner::Arc($q) => $call,
        }
    };
}

/// An eviction queue over entries identified by `u64` ids, in one of the orders of
/// [`Eviction`] (see the module doc).
///
/// An entry may be *hidden* (the store hides tensors that are not leaves of their tier): it
/// keeps its key and history but scans for a victim never pass over it; unhiding puts it back
/// in the same place of the order.
#[derive(Debug)]
pub struct EvictionQueue {
    inner: Inner,
}

impl EvictionQueue {
    /// A queue of unbounded capacity: right for the keyed orders (LRU, GDSF, LFU), which do
    /// not depend on it; S3-FIFO and ARC size their lists from it (use
    /// [`Self::with_capacity`]).
    pub fn new(kind: Eviction) -> EvictionQueue {
        EvictionQueue::with_capacity(kind, u64::MAX)
    }

    /// A queue for a cache that holds `entries` entries.
    pub fn with_capacity(kind: Eviction, entries: u64) -> EvictionQueue {
        let inner = match kind {
            Eviction::Lru | Eviction::Gdsf => Inner::Keyed(Keyed::new(kind)),
            Eviction::Lfu => Inner::Lfu(Keyed::new(kind)),
            Eviction::S3Fifo => Inner::S3Fifo(s3fifo::S3Fifo::new(entries)),
            Eviction::Arc => Inner::Arc(arc::Arc::new(entries)),
        };
        EvictionQueue { inner }
    }

    pub fn len(&self) -> usize {
        each!(&self.inner, q => q.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, id: u64) -> bool {
        each!(&self.inner, q => q.contains(id))
    }

    /// Hides `id` from victim scans (or shows it again), keeping its place and history.
    pub fn set_hidden(&mut self, id: u64, hidden: bool) {
        each!(&mut self.inner, q => q.set_hidden(id, hidden))
    }

    /// Announces that `id` (not present) is about to be inserted: the miss it fills, which
    /// the orders with ghosts (S3-FIFO, ARC) classify now, before the victims that make its
    /// room are chosen. Nothing for the keyed orders.
    pub fn announce(&mut self, id: u64) {
        match &mut self.inner {
            Inner::S3Fifo(q) => q.announce(id),
            Inner::Arc(q) => q.announce(id),
            Inner::Keyed(_) | Inner::Lfu(_) => {}
        }
    }

    /// Adds `id` (not present) with `freq` accesses so far; `value` is cost / size (GDSF).
    pub fn insert(&mut self, id: u64, freq: u32, value: f64, tick: u64) {
        debug_assert!(value >= 0.0 && value.is_finite());
        match &mut self.inner {
            Inner::Keyed(q) => q.insert(id, freq, value, tick),
            Inner::Lfu(q) => q.insert(id, freq, value, tick),
            Inner::S3Fifo(q) => q.insert(id, freq, tick),
            Inner::Arc(q) => q.insert(id, freq, tick),
        }
    }

    /// Records an access to `id` (if present).
    pub fn touch(&mut self, id: u64, tick: u64) {
        each!(&mut self.inner, q => q.touch(id, tick))
    }

    /// Whether `id` is hidden from victim scans (`None` if absent).
    pub fn is_hidden(&self, id: u64) -> Option<bool> {
        each!(&self.inner, q => q.is_hidden(id))
    }

    /// Access count of `id` (0 if absent).
    pub fn freq(&self, id: u64) -> u32 {
        each!(&self.inner, q => q.freq(id))
    }

    /// ARC's target size of T1 (`None` for the other orders).
    pub fn arc_target(&self) -> Option<f64> {
        match &self.inner {
            Inner::Arc(q) => Some(q.target()),
            _ => None,
        }
    }

    /// Removes `id` (not an eviction: no ghost remembers it).
    pub fn remove(&mut self, id: u64) -> bool {
        each!(&mut self.inner, q => q.remove(id))
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

    /// The id that [`Self::pop_first_where`] with the same `eligible` would return now,
    /// changing nothing (what an admission rule compares a new entry with).
    pub fn peek_where(&mut self, eligible: impl FnMut(u64) -> bool) -> Option<u64> {
        match &mut self.inner {
            Inner::Keyed(q) => q.peek_where(eligible),
            Inner::Lfu(q) => q.peek_where(eligible),
            Inner::S3Fifo(q) => q.peek_where(eligible),
            Inner::Arc(q) => q.peek_where(eligible),
        }
    }

    /// Like [`Self::pop_first_where`], and also returns the entry's access history.
    pub fn pop_entry_where(&mut self, eligible: impl FnMut(u64) -> bool) -> Option<(u64, Access)> {
        each!(&mut self.inner, q => q.pop_entry_where(eligible))
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

    #[test]
    fn lfu_evicts_the_least_counted_then_the_least_recent() {
        let mut q = EvictionQueue::new(Eviction::Lfu);
        q.insert(1, 1, 0.0, 1);
        q.insert(2, 1, 0.0, 2);
        q.insert(3, 3, 0.0, 3); // carried count: 3
        q.touch(1, 4); // count 2
        q.touch(2, 5); // count 2, more recent than 1
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), Some(3));
    }

    #[test]
    fn s3fifo_promotes_twice_read_entries_and_remembers_ghosts() {
        // Capacity 10: S's share 1, M's 9, ghost 9.
        let mut q = EvictionQueue::with_capacity(Eviction::S3Fifo, 10);
        for id in 1..=10 {
            q.insert(id, 1, 0.0, id);
        }
        q.touch(1, 11);
        q.touch(1, 12);
        // S holds all ten; 1 was read twice: it moves to M, 2 is the victim.
        assert_eq!(q.pop(), Some(2));
        // A hidden entry is passed over in place: 3 is hidden, 4 goes.
        q.set_hidden(3, true);
        assert_eq!(q.pop(), Some(4));
        q.set_hidden(3, false);
        assert_eq!(q.pop(), Some(3));
        // 2 is in the ghost: inserted again, it goes to M, where it outlives S's entries.
        q.announce(2);
        q.insert(2, 1, 0.0, 13);
        for want in 5..=10 {
            assert_eq!(q.pop(), Some(want));
        }
        // S is empty: M evicts in FIFO order; 1 (counter 0 after its move) first.
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn arc_adapts_its_target_on_ghost_hits() {
        let mut q = EvictionQueue::with_capacity(Eviction::Arc, 2);
        q.insert(1, 1, 0.0, 1);
        q.insert(2, 1, 0.0, 2);
        q.touch(2, 3); // 2 in T2
        // A cold miss: |T1| = 1 > p = 0, so T1's LRU (1) goes to B1.
        q.announce(3);
        assert_eq!(q.pop(), Some(1));
        q.insert(3, 1, 0.0, 4);
        // 1 comes back: a hit in B1 raises p to 1 and sends it to T2.
        q.announce(1);
        assert_eq!(q.arc_target(), Some(1.0));
        // |T1| = 1 = p: T2's LRU (2) goes to B2.
        assert_eq!(q.pop(), Some(2));
        q.insert(1, 1, 0.0, 5);
        // 2 comes back: a hit in B2 lowers p to 0; |T1| = 1 > 0: 3 goes.
        q.announce(2);
        assert_eq!(q.arc_target(), Some(0.0));
        assert_eq!(q.pop(), Some(3));
        q.insert(2, 1, 0.0, 6);
        assert_eq!(q.pop(), Some(1), "T2 in LRU order");
    }
}
