//! The running batch of an instance, with sequences that decode in lockstep kept implicitly.
//!
//! Under load most of a batch is *decoding*: every iteration each such sequence computes its one
//! known token and samples the next, and nothing else happens to it until it needs a new KV block
//! (every `block_size` tokens) or samples its last token. Visiting every sequence at every
//! iteration to add one to two counters (scheduling it, then applying its result) would cost
//! instructions in proportion to the batch at every iteration, most of them on sequences whose
//! state does not change, and more where batches decode long outputs. So a sequence that only
//! decodes becomes *steady*: its counters stay as they were when it became steady (at tick
//! `since`), and its true counts are those plus the ticks since then; the scheduler visits it again
//! at the tick it is `due` (a block to allocate, or its last token), and the batch keeps the sum of
//! the steady sequences' computed tokens for the iteration's shape. An iteration then costs a scan
//! of one word a sequence and a visit of the sequences whose state changes, not a visit of each.
//! The instance decides which sequences are steady and when they are due (it knows the block size
//! and what decoding leaves unchanged); this type keeps the bookkeeping exact: a sequence leaves
//! the batch ([`Running::pop`], [`Running::remove`]) with its counters made true.
//!
//! A *tick* is one applied iteration in which every steady sequence computed one token: the
//! instance calls [`Running::advance`] at the end of each iteration, and makes every sequence
//! active again ([`Running::materialize_all`]) before an iteration in which one might not.
//!
//! **Sequences stay where they are.** A sequence keeps the slot it was pushed into until it
//! leaves; the admission order is a list of slots, kept in the low bits of the `due` words
//! that every iteration scans anyway. A sequence that finishes (or is preempted) leaves a free
//! slot, which the next one pushed takes (the last freed first): nothing moves. In an array
//! kept in admission order, a sequence that finished would close its gap by moving every one
//! admitted after it, mostly steady sequences that no iteration reads, so the move would read
//! and write lines brought in for nothing.

use super::Seq;

/// `since` of a sequence that is not steady.
const ACTIVE: u64 = u64::MAX;

/// Low bits of a `due` word that name the sequence's slot. A tick is at most the events a run
/// processes (below 2^39, [`crate::sim::kernel::MAX_EVENTS`]) plus a request's tokens (below
/// 2^32), so a due tick fits the 40 bits above them; slots are at most the batch's
/// `max_num_seqs` (at most 65,536).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// The running sequences in admission order (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Running {
    /// The sequences by slot; a free slot is `None` (a `Seq` holds a box, so that costs no
    /// room: an element is one sequence, two lines).
    slots: Vec<Option<Seq>>,
    /// Free slots, the last freed last.
    free: Vec<u32>,
    /// By position in admission order: the first tick at which the scheduler must visit the
    /// sequence (0 if it is active: visited at every iteration) above [`SLOT_BITS`], and its
    /// slot below.
    due: Vec<u64>,
    /// By position: the tick it became steady at, or [`ACTIVE`].
    since: Vec<u64>,
    /// Iterations applied.
    tick: u64,
    /// Steady sequences, and the sum over them of `computed - since` (wrapping): their
    /// computed tokens sum to `base + steady * tick`.
    steady: u64,
    base: u64,
}

impl std::ops::Index<usize> for Running {
    type Output = Seq;

    /// The sequence at position `i` in admission order. A steady sequence's `computed` and
    /// `generated` are those of its tick `since`, not its true ones.
    #[inline]
    fn index(&self, i: usize) -> &Seq {
        self.slots[self.slot(i)]
            .as_ref()
            .expect("a position names a full slot")
    }
}

impl std::ops::IndexMut<usize> for Running {
    /// As [`Index`](std::ops::Index): what a caller changes of a steady sequence must not be
    /// its counters.
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut Seq {
        let slot = self.slot(i);
        self.slots[slot]
            .as_mut()
            .expect("a position names a full slot")
    }
}

impl Running {
    pub fn with_capacity(n: usize) -> Running {
        Running {
            slots: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            due: Vec::with_capacity(n),
            since: Vec::with_capacity(n),
            ..Running::default()
        }
    }

    /// Running sequences.
    #[inline]
    pub fn len(&self) -> usize {
        self.due.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// The sequences in admission order (see [`Index`](std::ops::Index)).
    pub fn iter(&self) -> impl Iterator<Item = &Seq> + '_ {
        (0..self.len()).map(move |i| &self[i])
    }

    /// The position of the first sequence (in admission order) for which `f` holds.
    pub fn position(&self, mut f: impl FnMut(&Seq) -> bool) -> Option<usize> {
        (0..self.len()).find(|&i| f(&self[i]))
    }

    /// The slot of the sequence at position `i`.
    #[inline]
    fn slot(&self, i: usize) -> usize {
        (self.due[i] & SLOT_MASK) as usize
    }

    /// Adds `seq` at the back (the most recently admitted), active.
    pub fn push(&mut self, seq: Seq) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(seq);
                u64::from(slot)
            }
            None => {
                self.slots.push(Some(seq));
                self.slots.len() as u64 - 1
            }
        };
        assert!(slot <= SLOT_MASK, "a batch holds at most 2^24 sequences");
        self.due.push(slot);
        self.since.push(ACTIVE);
    }

    /// Takes the most recently admitted sequence out, with its true counters.
    pub fn pop(&mut self) -> Option<Seq> {
        let last = self.len().checked_sub(1)?;
        Some(self.remove(last))
    }

    /// Takes the `i`-th sequence out, with its true counters.
    pub fn remove(&mut self, i: usize) -> Seq {
        self.materialize(i);
        let slot = self.slot(i);
        self.due.remove(i);
        self.since.remove(i);
        self.free.push(slot as u32);
        self.slots[slot]
            .take()
            .expect("a position names a full slot")
    }

    /// Takes out the sequences at `at` (increasing positions) and gives each to `f`, in
    /// admission order, with its true counters.
    pub fn remove_each(&mut self, at: &[u32], mut f: impl FnMut(Seq)) {
        for (k, &i) in at.iter().enumerate() {
            f(self.remove(i as usize - k));
        }
    }

    /// Makes the `i`-th sequence active, its counters true.
    pub fn materialize(&mut self, i: usize) {
        let since = self.since[i];
        if since == ACTIVE {
            return;
        }
        let slot = self.slot(i);
        let seq = self.slots[slot]
            .as_mut()
            .expect("a position names a full slot");
        self.base = self
            .base
            .wrapping_sub(u64::from(seq.computed).wrapping_sub(since));
        self.steady -= 1;
        // The ticks it was steady for fit its counters (a request's tokens are u32).
        let ticks = (self.tick - since) as u32;
        seq.computed += ticks;
        seq.generated += ticks;
        self.since[i] = ACTIVE;
        self.due[i] = slot as u64;
    }

    /// Makes every sequence active (before an iteration that may not schedule them all).
    pub fn materialize_all(&mut self) {
        if self.steady == 0 {
            return;
        }
        for i in 0..self.len() {
            self.materialize(i);
        }
        debug_assert_eq!((self.steady, self.base), (0, 0));
    }

    /// Makes the active `i`-th sequence steady from now until tick `due` (later than now).
    pub fn make_steady(&mut self, i: usize, due: u64) {
        debug_assert!(self.since[i] == ACTIVE && due > self.tick);
        assert!(
            due < 1 << (64 - SLOT_BITS),
            "a due tick fits above the slot"
        );
        let slot = self.slot(i);
        self.since[i] = self.tick;
        self.due[i] = due << SLOT_BITS | slot as u64;
        self.steady += 1;
        self.base = (self.base).wrapping_add(u64::from(self[i].computed).wrapping_sub(self.tick));
    }

    /// The positions of the sequences to visit now (active, or steady and due), in
    /// admission order, into `out` (cleared first).
    pub fn due_now(&self, out: &mut Vec<u32>) {
        out.clear();
        let now = self.tick;
        out.extend(
            (self.due.iter().enumerate())
                .filter(|&(_, &d)| d >> SLOT_BITS <= now)
                .map(|(i, _)| i as u32),
        );
    }

    /// Steady sequences now, and the sum of their true computed tokens.
    pub fn steady(&self) -> (u64, u64) {
        let sum = self.base.wrapping_add(self.steady.wrapping_mul(self.tick));
        (self.steady, sum)
    }

    /// The iteration in which every steady sequence computed one token has been applied.
    pub fn advance(&mut self) {
        self.tick += 1;
    }

    /// The current tick.
    pub fn tick(&self) -> u64 {
        self.tick
    }
}

impl Running {
    /// Where the `due` words lie: the start and how many bytes (for a cache hint).
    pub fn due_bytes(&self) -> (usize, usize) {
        (self.due.as_ptr().addr(), self.due.len() * 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::ReqId;

    fn seq(req: u32) -> Seq {
        Seq {
            req: ReqId(req),
            prompt_len: 32,
            output_len: 64,
            generated: 0,
            computed: 0,
            scheduled: 0,
            registered: 0,
            stored: false,
            done: false,
            load: None,
            blocks: Default::default(),
            cold: Box::default(),
        }
    }

    #[test]
    fn a_sequence_that_leaves_moves_no_other_and_its_slot_is_taken_next() {
        let mut r = Running::with_capacity(2);
        for i in 0..5 {
            r.push(seq(i));
        }
        let at = |r: &Running, i: usize| (&raw const r[i]).addr();
        let before: Vec<usize> = (0..5).map(|i| at(&r, i)).collect();
        r.make_steady(3, 4);
        assert_eq!(r.remove(1).req, ReqId(1));
        assert_eq!(
            r.remove(2).req,
            ReqId(3),
            "positions follow admission order"
        );
        let reqs: Vec<u32> = r.iter().map(|s| s.req.0).collect();
        assert_eq!(reqs, [0, 2, 4]);
        assert_eq!(
            [at(&r, 0), at(&r, 1), at(&r, 2)],
            [before[0], before[2], before[4]],
            "nothing moved"
        );
        // The last freed slot is taken first; the new sequence is the last admitted.
        r.push(seq(9));
        assert_eq!(at(&r, 3), before[3]);
        r.push(seq(10));
        assert_eq!(at(&r, 4), before[1]);
        let reqs: Vec<u32> = r.iter().map(|s| s.req.0).collect();
        assert_eq!(reqs, [0, 2, 4, 9, 10]);
        assert_eq!(r.position(|s| s.req == ReqId(9)), Some(3));
        assert_eq!(r.pop().map(|s| s.req), Some(ReqId(10)));
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn a_steady_sequence_is_due_and_leaves_with_its_true_counters() {
        let mut r = Running::with_capacity(4);
        for i in 0..3 {
            r.push(seq(i));
        }
        r.make_steady(1, 3);
        let mut v = Vec::new();
        r.due_now(&mut v);
        assert_eq!(v, [0, 2]);
        for _ in 0..3 {
            r.advance();
        }
        r.due_now(&mut v);
        assert_eq!(v, [0, 1, 2], "due at tick 3");
        assert_eq!(r.steady(), (1, 3));
        let s = r.remove(1);
        assert_eq!((s.computed, s.generated), (3, 3));
        assert_eq!(r.steady(), (0, 0));
    }
}
