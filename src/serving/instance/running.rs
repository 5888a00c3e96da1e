//! The running batch of an instance, with sequences that decode in lockstep kept implicitly.
//!
//! Under load most of a batch is *decoding*: every iteration each such sequence computes its
//! one known token and samples the next, and nothing else happens to it until it needs a new
//! KV block (every `block_size` tokens) or samples its last token. Visiting every sequence at
//! every iteration to add one to two counters (scheduling it, then applying its result) was
//! 14 % of local-prefix's instructions at 2,240 GPUs, though little of its time (cheap
//! instructions over lines already in cache), and more of both where batches decode long
//! outputs (see the README, "Sixteenth session"). So a sequence that only decodes
//! becomes *steady*: its counters stay as they were when it became steady (at tick `since`),
//! and its true counts are those plus the ticks since then; the scheduler visits it again at
//! the tick it is `due` (a block to allocate, or its last token), and the batch keeps the sum
//! of the steady sequences' computed tokens for the iteration's shape. An iteration then
//! costs a scan of one word a sequence and a visit of the sequences whose state changes, not
//! a visit of each. The instance decides which sequences are steady and when they are due
//! (it knows the block size and what decoding leaves unchanged); this type keeps the
//! bookkeeping exact: a sequence leaves the batch ([`Running::pop`], [`Running::remove`]) with
//! its counters made true.
//!
//! A *tick* is one applied iteration in which every steady sequence computed one token: the
//! instance calls [`Running::advance`] at the end of each iteration, and makes every sequence
//! active again ([`Running::materialize_all`]) before an iteration in which one might not.

use super::Seq;

/// Most sequences whose lines [`Running::hint_visits`] asks for: a core keeps a few dozen
/// misses outstanding, and more would only wait in its queue.
const VISIT_HINTS: usize = 32;

/// `since` of a sequence that is not steady.
const ACTIVE: u64 = u64::MAX;

/// The running sequences in admission order (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Running {
    seqs: Vec<Seq>,
    /// By sequence: the first tick at which the scheduler must visit it (0 if it is active:
    /// visited at every iteration).
    due: Vec<u64>,
    /// By sequence: the tick it became steady at, or [`ACTIVE`].
    since: Vec<u64>,
    /// Iterations applied.
    tick: u64,
    /// Steady sequences, and the sum over them of `computed - since` (wrapping): their
    /// computed tokens sum to `base + steady * tick`.
    steady: u64,
    base: u64,
}

impl std::ops::Deref for Running {
    type Target = [Seq];

    /// The sequences, in admission order. A steady sequence's `computed` and `generated` are
    /// those of its tick `since`, not its true ones.
    fn deref(&self) -> &[Seq] {
        &self.seqs
    }
}

impl std::ops::DerefMut for Running {
    /// As [`Deref`](std::ops::Deref): what a caller changes of a steady sequence must not be
    /// its counters.
    fn deref_mut(&mut self) -> &mut [Seq] {
        &mut self.seqs
    }
}

impl Running {
    pub fn with_capacity(n: usize) -> Running {
        Running {
            seqs: Vec::with_capacity(n),
            due: Vec::with_capacity(n),
            since: Vec::with_capacity(n),
            ..Running::default()
        }
    }

    /// Adds `seq` at the back (the most recently admitted), active.
    pub fn push(&mut self, seq: Seq) {
        self.seqs.push(seq);
        self.due.push(0);
        self.since.push(ACTIVE);
    }

    /// Takes the most recently admitted sequence out, with its true counters.
    pub fn pop(&mut self) -> Option<Seq> {
        let last = self.seqs.len().checked_sub(1)?;
        Some(self.remove(last))
    }

    /// Takes the `i`-th sequence out, with its true counters.
    pub fn remove(&mut self, i: usize) -> Seq {
        self.materialize(i);
        self.due.remove(i);
        self.since.remove(i);
        self.seqs.remove(i)
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
        let seq = &mut self.seqs[i];
        self.base = self
            .base
            .wrapping_sub(u64::from(seq.computed).wrapping_sub(since));
        self.steady -= 1;
        // The ticks it was steady for fit its counters (a request's tokens are u32).
        let ticks = (self.tick - since) as u32;
        seq.computed += ticks;
        seq.generated += ticks;
        self.since[i] = ACTIVE;
        self.due[i] = 0;
    }

    /// Makes every sequence active (before an iteration that may not schedule them all).
    pub fn materialize_all(&mut self) {
        if self.steady == 0 {
            return;
        }
        for i in 0..self.seqs.len() {
            self.materialize(i);
        }
        debug_assert_eq!((self.steady, self.base), (0, 0));
    }

    /// Makes the active `i`-th sequence steady from now until tick `due` (later than now).
    pub fn make_steady(&mut self, i: usize, due: u64) {
        debug_assert!(self.since[i] == ACTIVE && due > self.tick);
        self.since[i] = self.tick;
        self.due[i] = due;
        self.steady += 1;
        self.base =
            (self.base).wrapping_add(u64::from(self.seqs[i].computed).wrapping_sub(self.tick));
    }

    /// The positions of the sequences to visit now (active, or steady and due), in
    /// admission order, into `out` (cleared first).
    pub fn due_now(&self, out: &mut Vec<u32>) {
        out.clear();
        let now = self.tick;
        out.extend(
            (self.due.iter().enumerate())
                .filter(|&(_, &d)| d <= now)
                .map(|(i, _)| i as u32),
        );
    }

    /// Asks for what the end of this iteration and the scheduling of the next visit (a cache
    /// hint, see [`crate::sim::prefetch`]): each sequence that is active or due by the next
    /// tick (at most [`VISIT_HINTS`]), both of its lines (its counters and blocks; its pieces
    /// and the pointer to its cold part), and for those that are steady, their `since` word,
    /// which making them active reads. At 2,240 GPUs the batch is cold when its instance's
    /// event comes, and these were misses taken one after another as each was visited.
    pub fn hint_visits(&self) {
        self.visits_ahead(|i, steady| {
            let seq: *const Seq = &raw const self.seqs[i];
            crate::sim::prefetch::bytes(seq.cast(), std::mem::size_of::<Seq>());
            if steady {
                crate::sim::prefetch::line((&raw const self.since[i]).cast());
            }
        });
    }

    /// Calls `f` with the position of each sequence (in admission order, at most
    /// [`VISIT_HINTS`]) that is active or due by the next tick, and whether it is steady.
    fn visits_ahead(&self, mut f: impl FnMut(usize, bool)) {
        let next = self.tick + 1;
        let mut asked = 0;
        for (i, &d) in self.due.iter().enumerate() {
            if d <= next {
                f(i, d != 0);
                asked += 1;
                if asked == VISIT_HINTS {
                    return;
                }
            }
        }
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

    fn ahead(r: &Running) -> Vec<(usize, bool)> {
        let mut got = Vec::new();
        r.visits_ahead(|i, steady| got.push((i, steady)));
        got
    }

    #[test]
    fn the_hint_names_the_sequences_the_next_two_visits_read_and_no_others() {
        let mut r = Running::with_capacity(5);
        for i in 0..5 {
            r.push(seq(i));
        }
        // At tick 0: 1 is due at the next tick, 2 at tick 5, 4 at tick 2.
        r.make_steady(1, 1);
        r.make_steady(2, 5);
        r.make_steady(4, 2);
        assert_eq!(ahead(&r), [(0, false), (1, true), (3, false)]);
        r.advance();
        assert_eq!(ahead(&r), [(0, false), (1, true), (3, false), (4, true)]);
        r.materialize(1);
        let _ = r.remove(0);
        assert_eq!(ahead(&r), [(0, false), (2, false), (3, true)]);
    }

    #[test]
    fn the_hint_is_bounded() {
        let mut r = Running::with_capacity(VISIT_HINTS + 8);
        for i in 0..VISIT_HINTS as u32 + 8 {
            r.push(seq(i));
        }
        let got = ahead(&r);
        assert_eq!(got.len(), VISIT_HINTS);
        assert!(got.iter().enumerate().all(|(k, &(i, s))| i == k && !s));
    }
}
