//! The simulation host: runs the actors of one system on the event kernel and charges their
//! effects from the hardware model.
//!
//! For each effect an actor asks for through its [`Context`], the host decides the cost:
//!
//! * `send`: the message arrives when the network model says its payload has crossed the
//!   links between the two actors' places ([`Network::transfer`], FIFO per link);
//! * `start(Work::Compute(d))`: for `d`, the duration the actor's model backend (or service
//!   model) gave, on the device of the actor's place: compute work of actors that share a
//!   place runs one piece at a time, in the order it was started (FIFO), so shards sharing one
//!   device wait for each other. The host never prices model work itself (DESIGN contract 3);
//! * `start(Work::Fetch)`: after the posting overhead (per request plus per segment), the bytes
//!   cross the links from the source to the actor's place;
//! * `start(Work::Ssd)`: the bytes cross the node's SSD read or write channel;
//! * when work ends, [`Then`] says what happens: a message to the actor itself, a message sent
//!   to another actor at that instant (a server's reply), or nothing;
//! * `timer`: after exactly the requested delay;
//! * `rng`: the actor's own ChaCha8 stream, numbered `ACTOR_BASE + actor id`.
//!
//! Every actor is started by an event at time 0, in the order actors were added. Every
//! `check_every` events (by default [`DEFAULT_CHECK_EVERY`]: in builds with debug assertions,
//! such as the tests', and never in release builds) every actor checks its invariants
//! ([`Actor::check`]); checks are read-only, so results are the same with or without them. At
//! the end of a run (no event left), every actor reports its results and checks its
//! invariants ([`Report::merge`]); any violation turns the run into an error that names the
//! seed and the simulated time.

use std::collections::HashMap;

use crate::actor::{Actor, ActorId, Context, Then, Work};
use crate::hardware::Place;
use crate::hardware::network::{LinkBytes, Network};
use crate::metrics::Report;
use crate::rng::{Stream, streams};
use crate::sim::kernel::{Kernel, Limits, SimError};
use crate::units::Nanos;

/// What the kernel carries: the start of an actor, or one of its system's messages.
#[derive(Debug)]
enum Event<M> {
    Start,
    Msg(M),
}

struct Slot<M> {
    actor: Box<dyn Actor<M>>,
    /// Index into `places` (and `compute_free`): actors at one place share its device.
    device: usize,
    rng: Stream,
}

/// A change of the hardware at a time: a `link-slow` or `gpu-slow` fault starting or ending.
#[derive(Clone, Copy, Debug)]
enum Change {
    Nics {
        node: u32,
        factor: f64,
        blocked_until: Nanos,
    },
    Device {
        device: usize,
        factor: f64,
    },
}

/// Events between two checks of every actor's invariants: 1,024 in builds with debug
/// assertions (tests), none (0) in release builds.
pub const DEFAULT_CHECK_EVERY: u64 = if cfg!(debug_assertions) { 1024 } else { 0 };

/// A set of actors of one system (messages `M`) on a simulated cluster.
pub struct SimHost<M> {
    kernel: Kernel<Event<M>>,
    slots: Vec<Slot<M>>,
    network: Network,
    seed: u64,
    fetch_overhead: FetchOverhead,
    /// The distinct places of the actors, and when each one's device is free of compute work.
    places: Vec<Place>,
    device_of: HashMap<Place, usize>,
    compute_free: Vec<Nanos>,
    /// Effects the hardware cannot perform (errors are values: the run fails with them).
    violations: Vec<String>,
    /// Events between invariant checks of every actor; 0 for none.
    check_every: u64,
    /// Hardware changes still to come, latest first (applied before the first event at or
    /// after their time), and each device's fraction of its full compute speed.
    changes: Vec<(Nanos, Change)>,
    device_speed: Vec<f64>,
}

/// Fixed costs of posting a bulk fetch: per request and per gathered segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchOverhead {
    pub request: Nanos,
    pub segment: Nanos,
}

struct SimCtx<'a, M> {
    fetch_overhead: FetchOverhead,
    kernel: &'a mut Kernel<Event<M>>,
    network: &'a mut Network,
    /// The place of every actor, by id.
    actor_places: &'a [Place],
    compute_free: &'a mut [Nanos],
    /// The fraction of full speed this actor's device computes at now.
    device_speed: f64,
    violations: &'a mut Vec<String>,
    device: usize,
    me: ActorId,
    rng: &'a mut Stream,
}

impl<M> Context<M> for SimCtx<'_, M> {
    fn now(&self) -> Nanos {
        self.kernel.now()
    }
    fn me(&self) -> ActorId {
        self.me
    }
    fn send(&mut self, to: ActorId, msg: M, payload_bytes: u64) {
        let now = self.kernel.now();
        self.send_at(now, to, msg, payload_bytes);
    }
    fn timer(&mut self, after: Nanos, msg: M) {
        let at = self.kernel.now() + after;
        self.kernel.schedule(at, self.me, Event::Msg(msg));
    }
    fn start_then(&mut self, work: Work, then: Then<M>) {
        let now = self.kernel.now();
        let here = self.actor_places[self.me.0 as usize];
        let at = match work {
            Work::Fetch {
                from,
                bytes,
                segments,
            } => {
                let overhead = self.fetch_overhead.request
                    + Nanos(self.fetch_overhead.segment.0 * segments as u64);
                self.network.transfer(now + overhead, from, here, bytes)
            }
            Work::Ssd { write, bytes } => {
                let done = here
                    .node()
                    .and_then(|node| self.network.ssd(now, node, write, bytes));
                done.unwrap_or_else(|| {
                    // Errors are values: the work ends at once and the run fails with this.
                    self.violations.push(format!(
                        "actor {} at {here:?} started SSD work, but its place has no SSDs",
                        self.me.0
                    ));
                    now
                })
            }
            Work::Compute(d) => {
                let d = if self.device_speed == 1.0 {
                    d
                } else {
                    Nanos::from_secs_f64(d.as_secs_f64() / self.device_speed)
                };
                let free = &mut self.compute_free[self.device];
                *free = now.max(*free) + d;
                *free
            }
        };
        match then {
            Then::Notify(done) => self.kernel.schedule(at, self.me, Event::Msg(done)),
            Then::Send {
                to,
                msg,
                payload_bytes,
            } => self.send_at(at, to, msg, payload_bytes),
            Then::Nothing => {}
        }
    }
    fn rng(&mut self) -> &mut Stream {
        self.rng
    }
}

impl<M> SimCtx<'_, M> {
    /// Sends `msg` from this actor's place, its first byte leaving at `at`.
    fn send_at(&mut self, at: Nanos, to: ActorId, msg: M, payload_bytes: u64) {
        let from = self.actor_places[self.me.0 as usize];
        let dest = self.actor_places[to.0 as usize];
        let arrival = self.network.transfer(at, from, dest, payload_bytes);
        self.kernel.schedule(arrival, to, Event::Msg(msg));
    }
}

/// What a finished simulation gives back.
#[derive(Debug)]
pub struct SimOutcome {
    pub report: Report,
    pub events: u64,
    pub end: Nanos,
    pub link_bytes: LinkBytes,
}

impl<M> SimHost<M> {
    pub fn new(network: Network, limits: Limits, seed: u64) -> SimHost<M> {
        SimHost {
            kernel: Kernel::new(limits, seed),
            slots: Vec::new(),
            network,
            seed,
            fetch_overhead: FetchOverhead::default(),
            places: Vec::new(),
            device_of: HashMap::new(),
            compute_free: Vec::new(),
            violations: Vec::new(),
            check_every: DEFAULT_CHECK_EVERY,
            changes: Vec::new(),
            device_speed: Vec::new(),
        }
    }

    /// The compute device at `place` (made if no actor runs there yet).
    fn device(&mut self, place: Place) -> usize {
        let devices = self.compute_free.len();
        let device = *self.device_of.entry(place).or_insert(devices);
        if device == devices {
            self.compute_free.push(Nanos::ZERO);
            self.device_speed.push(1.0);
        }
        device
    }

    /// From `at` until `until`, the NICs of `node` run at `factor` of their bandwidth
    /// (`factor = 0`: cut, nothing crosses them before `until`). See `crate::sim::fault`.
    pub fn slow_nics(&mut self, node: u32, at: Nanos, until: Nanos, factor: f64) {
        let (factor, blocked_until) = if factor > 0.0 {
            (factor, Nanos::ZERO)
        } else {
            (1.0, until)
        };
        self.changes.push((
            at,
            Change::Nics {
                node,
                factor,
                blocked_until,
            },
        ));
        self.changes.push((
            until,
            Change::Nics {
                node,
                factor: 1.0,
                blocked_until: Nanos::ZERO,
            },
        ));
    }

    /// From `at` until `until`, compute at `place` runs at `factor` (in (0, 1]) of its speed:
    /// work started then takes `d / factor`.
    pub fn slow_device(&mut self, place: Place, at: Nanos, until: Nanos, factor: f64) {
        let device = self.device(place);
        self.changes.push((at, Change::Device { device, factor }));
        self.changes.push((
            until,
            Change::Device {
                device,
                factor: 1.0,
            },
        ));
    }

    /// Applies the hardware changes due at or before `now`.
    fn apply_changes(&mut self, now: Nanos) {
        // Bounded: each round removes one change.
        while let Some(&(at, change)) = self.changes.last() {
            if at > now {
                break;
            }
            self.changes.pop();
            match change {
                Change::Nics {
                    node,
                    factor,
                    blocked_until,
                } => self.network.set_nics(node, factor, blocked_until),
                Change::Device { device, factor } => self.device_speed[device] = factor,
            }
        }
    }

    /// Checks every actor's invariants every `events` events (0: never during the run).
    pub fn set_check_every(&mut self, events: u64) {
        self.check_every = events;
    }

    pub fn set_fetch_overhead(&mut self, o: FetchOverhead) {
        self.fetch_overhead = o;
    }

    /// Adds an actor running at `place`; ids are given in order from 0.
    pub fn add(&mut self, actor: Box<dyn Actor<M>>, place: Place) -> ActorId {
        let id = ActorId(self.slots.len() as u32);
        let device = self.device(place);
        self.places.push(place);
        self.slots.push(Slot {
            actor,
            device,
            rng: Stream::new(self.seed, streams::ACTOR_BASE + id.0 as u64),
        });
        id
    }

    /// The id the next added actor will get (to wire actors that refer to each other).
    pub fn next_id(&self) -> ActorId {
        ActorId(self.slots.len() as u32)
    }

    /// Checks every actor's invariants now; the first broken one is an error.
    fn check_all(&self) -> Result<(), SimError> {
        if let Some(e) = self.violations.first() {
            return Err(self.kernel.invariant(e.clone()));
        }
        for (i, slot) in self.slots.iter().enumerate() {
            if let Err(e) = slot.actor.check() {
                return Err(self.kernel.invariant(format!("actor {i}: {e}")));
            }
        }
        Ok(())
    }

    /// Runs until no event is left, then collects the actors' reports.
    pub fn run(mut self) -> Result<SimOutcome, SimError> {
        for i in 0..self.slots.len() {
            self.kernel
                .schedule(Nanos::ZERO, ActorId(i as u32), Event::Start);
        }
        // Latest first, so that the next change is the last; changes at one time apply in the
        // order they were given (a stable sort, then reversed).
        self.changes.sort_by_key(|c| c.0);
        self.changes.reverse();
        while let Some(event) = self.kernel.pop()? {
            if !self.changes.is_empty() {
                self.apply_changes(event.time);
            }
            let slot = &mut self.slots[event.target.0 as usize];
            let mut ctx = SimCtx {
                fetch_overhead: self.fetch_overhead,
                kernel: &mut self.kernel,
                network: &mut self.network,
                actor_places: &self.places,
                compute_free: &mut self.compute_free,
                device_speed: self.device_speed[slot.device],
                violations: &mut self.violations,
                device: slot.device,
                me: event.target,
                rng: &mut slot.rng,
            };
            match event.msg {
                Event::Start => slot.actor.start(&mut ctx),
                Event::Msg(m) => slot.actor.handle(m, &mut ctx),
            }
            if self.check_every > 0 && self.kernel.processed().is_multiple_of(self.check_every) {
                self.check_all()?;
            }
        }
        let mut report = Report {
            violations: std::mem::take(&mut self.violations),
            ..Report::default()
        };
        for slot in &self.slots {
            let mut part = Report::default();
            slot.actor.report(&mut part);
            report.merge(part);
        }
        if let Some(first) = report.violations.first() {
            return Err(self.kernel.invariant(format!(
                "{first} ({} violation(s) in all)",
                report.violations.len()
            )));
        }
        Ok(SimOutcome {
            report,
            events: self.kernel.processed(),
            end: self.kernel.now(),
            link_bytes: self.network.totals(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::LinkSpec;

    /// Ticks every microsecond; its invariant breaks at the `breaks_at`-th tick.
    struct Ticker {
        ticks: u64,
        breaks_at: u64,
        limit: u64,
    }

    impl Actor<()> for Ticker {
        fn start(&mut self, ctx: &mut dyn Context<()>) {
            ctx.timer(Nanos(1_000), ());
        }
        fn handle(&mut self, _msg: (), ctx: &mut dyn Context<()>) {
            self.ticks += 1;
            if self.ticks < self.limit {
                ctx.timer(Nanos(1_000), ());
            }
        }
        fn check(&self) -> Result<(), String> {
            if self.ticks >= self.breaks_at {
                Err(format!("{} ticks", self.ticks))
            } else {
                Ok(())
            }
        }
        fn report(&self, _report: &mut Report) {}
    }

    fn host(check_every: u64, breaks_at: u64) -> SimHost<()> {
        let link = LinkSpec {
            bandwidth: 1e9,
            latency: Nanos::ZERO,
        };
        let mut h = SimHost::new(Network::fabric(1, link), Limits::default(), 9);
        h.set_check_every(check_every);
        h.add(
            Box::new(Ticker {
                ticks: 0,
                breaks_at,
                limit: 100,
            }),
            Place::Host { node: 0 },
        );
        h
    }

    #[test]
    fn a_broken_invariant_ends_the_run_at_the_event_that_broke_it() {
        // Event 1 starts the ticker; tick n is event n + 1, at n microseconds.
        let err = host(1, 10).run().unwrap_err();
        match err {
            SimError::Invariant { what, at, seed } => {
                assert!(what.contains("actor 0: 10 ticks"), "{what}");
                assert_eq!(at, Nanos(10_000));
                assert_eq!(seed, 9);
            }
            other => panic!("expected an invariant error, found {other:?}"),
        }
        // Checked every 8 events, it is caught at the first check after it broke.
        let SimError::Invariant { at, .. } = host(8, 10).run().unwrap_err() else {
            panic!("expected an invariant error");
        };
        assert_eq!(at, Nanos(15_000));
    }

    #[test]
    fn checks_never_change_a_run_that_keeps_its_invariants() {
        let a = host(1, u64::MAX).run().unwrap();
        let b = host(0, u64::MAX).run().unwrap();
        assert_eq!((a.events, a.end), (b.events, b.end));
        assert_eq!(a.events, 101);
    }
}
