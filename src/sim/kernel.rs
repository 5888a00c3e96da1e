//! The deterministic event kernel.
//!
//! Events are totally ordered by `(time, sequence number)`: the sequence number is a counter
//! incremented at every schedule, so two events at the same nanosecond are delivered in the
//! order they were scheduled, on every machine and every run. The kernel is generic over the
//! message type and knows nothing about actors beyond their index.
//!
//! Limits (DESIGN contract 6): a run ends with a typed [`SimError`] naming the seed when it
//! processes more than `max_events` events, when an event lies beyond `max_time`, or when more
//! than `max_pending` events wait at once.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::actor::ActorId;
use crate::units::Nanos;

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

impl<M> PartialEq for Event<M> {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl<M> Eq for Event<M> {}
impl<M> PartialOrd for Event<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for Event<M> {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// The event queue and clock.
#[derive(Debug)]
pub struct Kernel<M> {
    heap: BinaryHeap<Event<M>>,
    now: Nanos,
    next_seq: u64,
    processed: u64,
    limits: Limits,
    seed: u64,
}

impl<M> Kernel<M> {
    pub fn new(limits: Limits, seed: u64) -> Kernel<M> {
        Kernel {
            heap: BinaryHeap::new(),
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
    /// scheduled first).
    pub fn next_target(&self) -> Option<ActorId> {
        self.heap.peek().map(|e| e.target)
    }

    /// Schedules `msg` for `target` at `time` (never before now).
    pub fn schedule(&mut self, time: Nanos, target: ActorId, msg: M) {
        let time = time.max(self.now);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Event {
            time,
            seq,
            target,
            msg,
        });
    }

    /// Removes the earliest event and advances the clock to it, or reports a broken limit.
    pub fn pop(&mut self) -> Result<Option<Event<M>>, SimError> {
        if self.heap.len() > self.limits.max_pending {
            return Err(SimError::PendingLimit {
                limit: self.limits.max_pending,
                at: self.now,
                seed: self.seed,
            });
        }
        let Some(event) = self.heap.pop() else {
            return Ok(None);
        };
        if self.processed >= self.limits.max_events {
            return Err(SimError::EventLimit {
                limit: self.limits.max_events,
                at: event.time,
                seed: self.seed,
            });
        }
        if event.time > self.limits.max_time {
            return Err(SimError::TimeLimit {
                limit: self.limits.max_time,
                at: event.time,
                seed: self.seed,
            });
        }
        debug_assert!(event.time >= self.now, "time went backwards");
        self.now = event.time;
        self.processed += 1;
        Ok(Some(event))
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
}
