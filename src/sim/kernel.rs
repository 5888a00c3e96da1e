//! The deterministic event kernel.
//!
//! Events are totally ordered by `(time, sequence number)`: the sequence number is a counter
//! incremented at every schedule, so two events at the same nanosecond are delivered in the
//! order they were scheduled, on every machine and every run. The kernel is generic over the
//! message type and knows nothing about actors beyond their index.
//!
//! **The queue.** A pending event is a 16-byte key in a 4-ary min-heap (its time, and its sequence
//! number with the index of the slot that holds its target and message), and the message waits in a
//! slot of its own. Sifting moves and compares only keys: at cluster scale a few thousand events
//! are pending, their keys fit in the processor's first-level cache, and a pop walks half as many
//! levels as in a binary heap. The heap is laid out so that the four children of a node are one
//! 64-byte line (the root sits last in the first line, see [`Heap`]): a level of a sift reads one
//! line, where an unaligned layout straddles two three times in four (at cluster scale the heap's
//! levels below the first few are out of the first-level cache, and their misses are a large share
//! of the run's). Past the last key, the lines hold the largest key, so the earliest of four
//! children is taken without a bounds check. A sift down asks for the next level's four lines while
//! it compares a level, so that the cold levels' misses overlap the comparisons. The message is
//! read once, when its event is popped. The slot's target lives apart from the messages, in an
//! array of 4 bytes a slot, so that the host can learn the next event's actor (to ask for its
//! memory early) without a cache miss on a cold message. Freed slots are reused last-freed first,
//! so the slots in use stay few and warm.
//!
//! Limits (DESIGN contract 6): a run ends with a typed [`SimError`] naming the seed when it
//! processes more than `max_events` events, when an event lies beyond `max_time`, or when more
//! than `max_pending` events wait at once. The key's layout bounds both counts
//! ([`MAX_EVENTS`], [`MAX_PENDING`]): the kernel holds any limit above them to them.

use super::queue::{ARITY, Heap, Key, SLOT_BITS, SLOT_MASK};
use crate::actor::ActorId;
use crate::units::Nanos;

/// Most events pending at once (16.7 M): more cannot be told apart by their keys' slots. A
/// limit above it is held to it.
pub const MAX_PENDING: usize = SLOT_MASK as usize;

/// Most events a run processes (5.5 x 10^11, a week of a simulation at a million events a
/// second): with at most [`MAX_PENDING`] pending, the sequence numbers of every event ever
/// scheduled then fit in the 40 bits the key gives them. A limit above it is held to it.
pub const MAX_EVENTS: u64 = 1 << 39;

/// Bounds on a simulation run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub max_events: u64,
    pub max_time: Nanos,
    pub max_pending: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_events: 200_000_000,
            max_time: Nanos::from_secs(7 * 24 * 3600),
            max_pending: 10_000_000,
        }
    }
}

/// Why a simulation stopped early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error(
        "event limit of {limit} events reached at simulated time {at} (seed {seed}); raise limits.max_events or shorten the workload"
    )]
    EventLimit { limit: u64, at: Nanos, seed: u64 },
    #[error(
        "simulated time limit {limit} passed by an event at {at} (seed {seed}); raise limits.max_sim_time_s or lower the load"
    )]
    TimeLimit { limit: Nanos, at: Nanos, seed: u64 },
    #[error("more than {limit} pending events at simulated time {at} (seed {seed})")]
    PendingLimit { limit: usize, at: Nanos, seed: u64 },
    #[error("invariant violated at simulated time {at} (seed {seed}): {what}")]
    Invariant { what: String, at: Nanos, seed: u64 },
}

/// A message due for an actor at a time.
#[derive(Debug)]
pub struct Event<M> {
    pub time: Nanos,
    pub seq: u64,
    pub target: ActorId,
    pub msg: M,
}

/// The event queue and clock.
#[derive(Debug)]
pub struct Kernel<M> {
    /// The pending events' keys.
    heap: Heap,
    /// The message of each pending event, by slot; `None` in a free slot.
    slots: Vec<Option<M>>,
    /// The target of each pending event, by slot (stale in a free slot): apart from the
    /// messages, so that [`Kernel::next_target`] reads a small, warm array.
    targets: Vec<ActorId>,
    /// Free slots, the last freed on top.
    free: Vec<u32>,
    /// Most slots: [`MAX_PENDING`] (fewer only in tests).
    max_slots: usize,
    /// An event found no free slot (more than `max_slots` pending): the next pop fails.
    overflow: bool,
    now: Nanos,
    next_seq: u64,
    processed: u64,
    limits: Limits,
    seed: u64,
}

impl<M> Kernel<M> {
    /// A kernel for a run within `limits` (held to [`MAX_EVENTS`] and [`MAX_PENDING`]).
    pub fn new(limits: Limits, seed: u64) -> Kernel<M> {
        let limits = Limits {
            max_events: limits.max_events.min(MAX_EVENTS),
            max_pending: limits.max_pending.min(MAX_PENDING),
            ..limits
        };
        Kernel {
            heap: Heap::default(),
            slots: Vec::new(),
            targets: Vec::new(),
            free: Vec::new(),
            max_slots: MAX_PENDING,
            overflow: false,
            now: Nanos::ZERO,
            next_seq: 0,
            processed: 0,
            limits,
            seed,
        }
    }

    pub fn now(&self) -> Nanos {
        self.now
    }
    pub fn processed(&self) -> u64 {
        self.processed
    }
    pub fn pending(&self) -> usize {
        self.heap.len()
    }
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// The target of the earliest pending event (the next one, unless an earlier one is
    /// scheduled first). Asks the processor for that event's message slot too, which its pop
    /// reads and empties (a cache hint: see [`crate::cpu::prefetch`]).
    pub fn next_target(&self) -> Option<ActorId> {
        let key = self.heap.first()?;
        let slot = key.slot();
        crate::cpu::prefetch::bytes(
            self.slots.as_ptr().wrapping_add(slot).cast(),
            std::mem::size_of::<Option<M>>(),
        );
        Some(self.targets[slot])
    }

    /// Schedules `msg` for `target` at `time` (never before now).
    pub fn schedule(&mut self, time: Nanos, target: ActorId, msg: M) {
        let time = time.max(self.now);
        let seq = self.next_seq;
        self.next_seq += 1;
        // Schedules are at most the events processed plus those pending, so the sequence
        // number fits its 40 bits (see `MAX_EVENTS`).
        debug_assert!(seq < 1 << (64 - SLOT_BITS));
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(msg);
                self.targets[slot as usize] = target;
                slot as usize
            }
            None if self.slots.len() < self.max_slots => {
                self.slots.push(Some(msg));
                self.targets.push(target);
                self.slots.len() - 1
            }
            None => {
                // The run fails at the next pop; this event is never delivered.
                self.overflow = true;
                return;
            }
        };
        let key = Key::new(time.0, seq << SLOT_BITS | slot as u64);
        self.heap.push_last(key);
        self.sift_up(self.heap.len() - 1, key);
    }

    /// Moves `key`, at `pos`, up to where its parent is earlier.
    fn sift_up(&mut self, mut pos: usize, key: Key) {
        let heap = &mut self.heap;
        // Bounded: each round moves one level up.
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            let above = heap.get(parent);
            if above < key {
                break;
            }
            heap.set(pos, above);
            pos = parent;
        }
        heap.set(pos, key);
    }

    /// Puts `key` in the hole at `pos` and moves it down to where its children are later.
    fn sift_down(&mut self, mut pos: usize, key: Key) {
        let heap = &mut self.heap;
        let n = heap.len();
        // Bounded: each round moves one level down.
        loop {
            let first = ARITY * pos + 1;
            if first >= n {
                break;
            }
            // The lines of the next level down (child `first + c`'s children are line
            // `first + c + 1`), asked for while this one is compared: the levels below the
            // first few are cold at scale.
            let below = ARITY * first + 1;
            if below < n {
                let lines = heap.lines.as_ptr();
                for c in 0..ARITY {
                    crate::cpu::prefetch::line(lines.wrapping_add(first + c + 1).cast());
                }
            }
            // The earliest child, chosen by selects rather than jumps; a missing child is
            // `NO_KEY`, never the earliest.
            let kids = heap.children(pos);
            let (mut best, mut at) = (kids[0], 0);
            for (i, &k) in kids.iter().enumerate().skip(1) {
                let earlier = k < best;
                best = if earlier { k } else { best };
                at = if earlier { i } else { at };
            }
            if key < best {
                break;
            }
            heap.set(pos, best);
            pos = first + at;
        }
        heap.set(pos, key);
    }

    /// Removes the earliest event and advances the clock to it, or reports a broken limit.
    pub fn pop(&mut self) -> Result<Option<Event<M>>, SimError> {
        if self.overflow || self.heap.len() > self.limits.max_pending {
            return Err(SimError::PendingLimit {
                limit: self.limits.max_pending,
                at: self.now,
                seed: self.seed,
            });
        }
        let Some(top) = self.heap.first() else {
            return Ok(None);
        };
        if self.processed >= self.limits.max_events {
            return Err(SimError::EventLimit {
                limit: self.limits.max_events,
                at: Nanos(top.time()),
                seed: self.seed,
            });
        }
        if top.time() > self.limits.max_time.0 {
            return Err(SimError::TimeLimit {
                limit: self.limits.max_time,
                at: Nanos(top.time()),
                seed: self.seed,
            });
        }
        let last = self.heap.pop_last().expect("the heap has a first key");
        if !self.heap.is_empty() {
            self.sift_down(0, last);
        }
        let slot = top.slot();
        let target = self.targets[slot];
        let msg = self.slots[slot]
            .take()
            .expect("a pending event's slot holds its message");
        self.free.push(slot as u32);
        debug_assert!(top.time() >= self.now.0, "time went backwards");
        self.now = Nanos(top.time());
        self.processed += 1;
        Ok(Some(Event {
            time: self.now,
            seq: top.seq(),
            target,
            msg,
        }))
    }

    /// Holds the slots to `n`, so that tests can fill them.
    #[cfg(test)]
    fn with_max_slots(mut self, n: usize) -> Kernel<M> {
        self.max_slots = n.min(MAX_PENDING);
        self
    }

    pub fn invariant(&self, what: impl Into<String>) -> SimError {
        SimError::Invariant {
            what: what.into(),
            at: self.now,
            seed: self.seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_at_the_same_time_pop_in_schedule_order() {
        let mut k = Kernel::new(Limits::default(), 1);
        k.schedule(Nanos(10), ActorId(0), "b");
        k.schedule(Nanos(5), ActorId(0), "a");
        k.schedule(Nanos(10), ActorId(0), "c");
        let order: Vec<_> = std::iter::from_fn(|| k.pop().unwrap().map(|e| e.msg)).collect();
        assert_eq!(order, ["a", "b", "c"]);
        assert_eq!(k.now(), Nanos(10));
    }

    #[test]
    fn next_target_names_the_next_event_and_changes_nothing() {
        let mut k = Kernel::new(Limits::default(), 1);
        assert!(k.next_target().is_none());
        k.schedule(Nanos(10), ActorId(3), "late");
        k.schedule(Nanos(5), ActorId(7), "early");
        k.schedule(Nanos(5), ActorId(2), "tie");
        assert_eq!(k.next_target(), Some(ActorId(7)));
        let first = k.pop().unwrap().unwrap();
        assert_eq!((first.target, first.msg), (ActorId(7), "early"));
        assert_eq!(k.next_target(), Some(ActorId(2)));
        assert_eq!(k.pop().unwrap().unwrap().msg, "tie");
        assert_eq!(k.next_target(), Some(ActorId(3)));
        assert_eq!(k.pop().unwrap().unwrap().msg, "late");
        assert!(k.next_target().is_none());
    }

    #[test]
    fn event_limit_names_the_seed() {
        let limits = Limits {
            max_events: 2,
            ..Limits::default()
        };
        let mut k = Kernel::new(limits, 99);
        for t in 0..3 {
            k.schedule(Nanos(t), ActorId(0), ());
        }
        assert!(k.pop().unwrap().is_some());
        assert!(k.pop().unwrap().is_some());
        let err = k.pop().unwrap_err();
        assert!(matches!(err, SimError::EventLimit { seed: 99, .. }));
        assert!(err.to_string().contains("seed 99"));
    }

    #[test]
    fn time_limit_stops_the_run() {
        let limits = Limits {
            max_time: Nanos(100),
            ..Limits::default()
        };
        let mut k = Kernel::new(limits, 5);
        k.schedule(Nanos(101), ActorId(0), ());
        assert!(matches!(k.pop(), Err(SimError::TimeLimit { seed: 5, .. })));
    }

    /// The queue against the obvious one (a binary heap of whole events ordered by time,
    /// then schedule order): random schedules and pops, with many events at equal times,
    /// pop the same events in the same order.
    #[test]
    fn pops_exactly_what_a_heap_of_whole_events_pops() {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        for seed in 0..200u64 {
            let mut rng = crate::rng::Stream::new(seed, 0);
            let mut k: Kernel<u64> = Kernel::new(Limits::default(), seed);
            let mut reference = BinaryHeap::new();
            let mut seq = 0u64;
            let mut popped = 0;
            // Few distinct delays, so that many events share a time.
            let spread = 1 + rng.below(50);
            for step in 0..2_000u64 {
                if rng.below(100) < 55 {
                    let at = k.now() + Nanos(rng.below(spread));
                    let target = ActorId(rng.below(8) as u32);
                    k.schedule(at, target, step);
                    reference.push(Reverse((at, seq, target.0, step)));
                    seq += 1;
                } else {
                    let got = k.pop().unwrap().map(|e| (e.time, e.seq, e.target.0, e.msg));
                    let want = reference.pop().map(|Reverse(e)| e);
                    assert_eq!(got, want, "seed {seed}, step {step}");
                    popped += got.is_some() as u32;
                }
                assert_eq!(k.pending(), reference.len());
                let next = reference.peek().map(|Reverse(e)| ActorId(e.2));
                assert_eq!(k.next_target(), next, "seed {seed}, step {step}");
            }
            while let Some(Reverse(want)) = reference.pop() {
                let e = k.pop().unwrap().expect("as many events as the reference");
                assert_eq!((e.time, e.seq, e.target.0, e.msg), want, "seed {seed}");
            }
            assert!(k.pop().unwrap().is_none());
            assert!(popped > 0);
        }
    }

    #[test]
    fn freed_slots_are_reused_so_slots_stay_as_many_as_pending_events() {
        let mut k: Kernel<u32> = Kernel::new(Limits::default(), 1);
        for round in 0..1_000u32 {
            for i in 0..10 {
                k.schedule(Nanos(round as u64 * 10 + i), ActorId(0), i as u32);
            }
            for _ in 0..10 {
                k.pop().unwrap().unwrap();
            }
        }
        assert_eq!(k.slots.len(), 10);
        assert_eq!(k.free.len(), 10);
    }

    #[test]
    fn more_pending_events_than_slots_fail_the_run_instead_of_losing_one_quietly() {
        let mut k: Kernel<u32> = Kernel::new(Limits::default(), 7).with_max_slots(3);
        for i in 0..4 {
            k.schedule(Nanos(i), ActorId(0), i as u32);
        }
        let err = k.pop().unwrap_err();
        assert!(
            matches!(err, SimError::PendingLimit { seed: 7, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_pending_limit_counts_events_waiting_at_once() {
        let limits = Limits {
            max_pending: 2,
            ..Limits::default()
        };
        let mut k: Kernel<()> = Kernel::new(limits, 3);
        k.schedule(Nanos(1), ActorId(0), ());
        k.schedule(Nanos(2), ActorId(0), ());
        assert!(k.pop().unwrap().is_some());
        k.schedule(Nanos(3), ActorId(0), ());
        k.schedule(Nanos(4), ActorId(0), ());
        assert!(matches!(
            k.pop(),
            Err(SimError::PendingLimit {
                limit: 2,
                seed: 3,
                ..
            })
        ));
    }

    #[test]
    fn limits_beyond_what_keys_can_hold_are_held_to_it() {
        let limits = Limits {
            max_events: u64::MAX,
            max_time: Nanos::MAX,
            max_pending: usize::MAX,
        };
        let k: Kernel<()> = Kernel::new(limits, 0);
        assert_eq!(k.limits.max_events, MAX_EVENTS);
        assert_eq!(k.limits.max_pending, MAX_PENDING);
        // Every sequence number a run can give (events processed plus pending) fits its bits.
        assert!(MAX_EVENTS + MAX_PENDING as u64 <= 1 << (64 - SLOT_BITS));
    }
}
