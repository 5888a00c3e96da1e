//! The simulation host: runs the actors of one system on the event kernel and charges their
//! effects from the hardware model.
//!
//! For each effect an actor asks for through its [`Context`], the host decides the cost:
//!
//! * `send`: the message arrives when its payload has crossed the links between the two
//!   actors' places ([`Network`]: links shared fairly between the transfers on them);
//! * `start(Work::Compute(d))`: for `d`, the duration the actor's model backend (or service
//!   model) gave, on the device of the actor's place: compute work of actors that share a
//!   place runs one piece at a time, in the order it was started (FIFO), so shards sharing one
//!   device wait for each other. The host never prices model work itself (DESIGN contract 3);
//! * `start(Work::Fetch)`: the bytes cross the links from the source (host memory, or SSD
//!   streamed through host memory) to the actor's place; the posting overhead (per request
//!   plus per segment: work requests the NIC or DMA engine processes) is added to the arrival;
//! * `start(Work::Ssd)`: the bytes cross the node's DRAM and its SSD write (or read) channel;
//! * when work ends, [`Then`] says what happens: a message to the actor itself, a message sent
//!   to another actor at that instant (a server's reply), or nothing;
//! * `timer`: after exactly the requested delay;
//! * `rng`: the actor's own ChaCha8 stream, numbered `ACTOR_BASE + actor id`.
//!
//! A transfer that is a flow of the fair share ends with a *network event* (its finish time
//! changes as other flows come and go; superseded finish events are skipped), and hardware
//! changes (faults) are events of their own at their times. Network events are not actor
//! events: [`SimOutcome::events`] counts the messages handled by actors, and
//! [`SimOutcome::network_events`] the rest.
//!
//! Every actor is started by an event at time 0, in the order actors were added. Every
//! `check_every` actor events (by default [`DEFAULT_CHECK_EVERY`]: in builds with debug
//! assertions, such as the tests', and never in release builds) every actor checks its
//! invariants ([`Actor::check`]); checks are read-only, so results are the same with or
//! without them. At the end of a run (no event left), every actor checks its invariants once
//! more where checks are on, then reports its results and the violations it found itself
//! ([`Report::merge`]; in every build, cheap end-of-run conditions such as an idle instance
//! holding no block); any violation turns the run into an error that names the seed and the
//! simulated time.

use std::collections::HashMap;

use crate::actor::{Actor, ActorId, Context, Hot, Medium, Then, Work};
use crate::cpu::prefetch;
use crate::hardware::Place;
use crate::hardware::network::{FlowId, LinkLoad, MICE_BYTES, Network, Purpose, Transfer};
use crate::metrics::Report;
use crate::rng::{Stream, streams};
use crate::sim::kernel::{Kernel, Limits, SimError};
use crate::sim::progress::{PROGRESS_EVERY, Progress};
use crate::units::Nanos;
use ctx::{Net, SimCtx};

/// What the kernel carries: the start of an actor, one of its system's messages, or an event
/// of the hardware (a flow's finish time, a fault's change, a bulk send that starts later).
#[derive(Debug)]
enum Event<M> {
    Start,
    Msg(M),
    Flow { flow: FlowId, version: u32 },
    Change,
    Send(Pending<M>),
}

/// What to do when a transfer or a piece of work ends: deliver a message to an actor, start
/// sending one (a reply that leaves when work ends), or nothing.
#[derive(Debug)]
enum After<M> {
    Deliver(ActorId, M),
    /// A fetch's end: `done` to `to`, or `failed` when its source node's memory was lost
    /// meanwhile (see [`MemoryLoss`]).
    Fetched {
        to: ActorId,
        done: M,
        failed: M,
        node: u32,
        epoch: u32,
        started: Nanos,
    },
    Send(Pending<M>),
    /// The first leg of a load staged hop after hop has arrived at `from` (the reader's host
    /// memory): the second leg moves `bytes` on to `to`, and `then` happens `extra` after it
    /// arrives.
    Onward {
        from: Place,
        to: Place,
        bytes: u64,
        extra: Nanos,
        then: Box<After<M>>,
    },
    Nothing,
}

/// A node's host memory (and what it serves) lost at `at`: for good when the node crashed
/// (every read from it that ends later fails), or at a store restart (reads in flight then
/// fail; later ones read the restarted store).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryLoss {
    pub node: u32,
    pub at: Nanos,
    pub crash: bool,
}

impl MemoryLoss {
    /// Whether a read from `node` started at `started` and ending at `end` fails.
    fn fails(&self, node: u32, started: Nanos, end: Nanos) -> bool {
        self.node == node && self.at <= end && (self.crash || self.at > started)
    }
}

/// Whether a read from `node` that started at `started`, ends at `end` and was planned
/// knowing of `epoch` losses of `node` fails: its memory is lost before it ends, or was lost
/// more often than its plan knew when it started (a store restarted since: what it names is
/// gone).
fn read_fails(losses: &[MemoryLoss], node: u32, epoch: u32, started: Nanos, end: Nanos) -> bool {
    let before = losses
        .iter()
        .filter(|l| l.node == node && l.at <= started)
        .count();
    before > epoch as usize || losses.iter().any(|l| l.fails(node, started, end))
}

/// A message to send from `from` to `to` with a payload.
#[derive(Debug)]
struct Pending<M> {
    from: ActorId,
    to: ActorId,
    msg: M,
    payload_bytes: u64,
}

/// What a flow in the network does when it arrives: `after`, `extra` later.
#[derive(Debug)]
struct OnArrival<M> {
    after: After<M>,
    extra: Nanos,
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
    /// The actors, by id: each with what the host reads of it at every one of its events, in
    /// one cache line ([`Seat`]).
    seats: Vec<Seat<M>>,
    /// Each actor's random stream, by id.
    rngs: Vec<Stream>,
    network: Network,
    seed: u64,
    fetch_overhead: FetchOverhead,
    /// The place of each actor, by id (what a message to it crosses the network to; the
    /// actor's own is in its seat too).
    places: Vec<Place>,
    /// The device of each distinct place (actors at one place share its device).
    device_of: HashMap<Place, usize>,
    /// Each device's compute queue and speed, by device.
    devices: Vec<Device>,
    /// Effects the hardware cannot perform (errors are values: the run fails with them).
    violations: Vec<String>,
    /// Events between invariant checks of every actor; 0 for none.
    check_every: u64,
    /// Where the run's progress goes, for a display (never read back).
    progress: Option<std::sync::Arc<Progress>>,
    /// Hardware changes still to come, latest first (applied before the first event at or
    /// after their time), and each device's fraction of its full compute speed.
    changes: Vec<(Nanos, Change)>,
    /// Node crashes and store restarts: reads whose source memory they lose fail.
    losses: Vec<MemoryLoss>,
    /// What each flow in the network does when it arrives, by flow id.
    arrivals: Vec<Option<OnArrival<M>>>,
    /// Events handled by actors (the others are network events).
    actor_events: u64,
    /// What each message is for ([`SimHost::set_purpose`]).
    purpose: fn(&M) -> Purpose,
}

/// An actor and what the host reads of it at each of its events, in one 64-byte line: at
/// cluster scale the actors' seats are out of the first-level cache, and reading an actor's
/// pointer, its device, its place and the hint for its next event ([`Actor::hot`] as of its
/// last one) from one record is one miss.
#[repr(C, align(64))]
struct Seat<M> {
    actor: Box<dyn Actor<M>>,
    hot: Hot,
    device: u32,
    place: Place,
}

// One line: a larger seat would straddle two.
const _: () = assert!(std::mem::size_of::<Seat<()>>() == 64);

impl<M> Seat<M> {
    /// Asks for the actor's value (eight lines from its first, [`ACTOR_BYTES`] in all) and
    /// for what it said its next event reads.
    fn prefetch(&self) {
        let value: *const dyn Actor<M> = &*self.actor;
        let bytes = std::mem::size_of_val(&*self.actor).min(ACTOR_BYTES);
        prefetch::lines(value.cast(), bytes.div_ceil(prefetch::LINE));
        hot(self.hot);
    }
}

/// Most bytes of an actor's value asked for ahead of its event: the first 512 bytes, which
/// hold what every event of a serving instance reads. Asking for every line of a larger actor
/// fills the processor's queue of outstanding misses with lines most events never read.
pub(crate) const ACTOR_BYTES: usize = 512;

/// Most lines of an actor's [`Hot`] region that [`hot`] asks for.
const MAX_HOT_LINES: u32 = 32;

/// Asks for the first line of each of the (at most [`MAX_HOT_LINES`]) elements of `h`, and
/// for its other values.
#[inline]
fn hot(h: Hot) {
    let stride = h.stride.max(1) as usize;
    for i in 0..u32::from(h.count).min(MAX_HOT_LINES) as usize {
        prefetch::line(h.base.wrapping_add(i * stride) as *const u8);
    }
    for (at, n) in h.values.into_iter().zip(h.value_bytes) {
        prefetch::bytes(at as *const u8, n as usize);
    }
}

/// A compute device: when it is free of the work queued on it, and the fraction of its full
/// speed it computes at now (a `gpu-slow` fault).
#[derive(Clone, Copy, Debug)]
struct Device {
    free: Nanos,
    speed: f64,
}

/// Fixed costs of posting a bulk fetch: per request and per gathered segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchOverhead {
    pub request: Nanos,
    pub segment: Nanos,
}

/// What a finished simulation gives back.
#[derive(Debug)]
pub struct SimOutcome {
    pub report: Report,
    /// Messages handled by actors (including their start).
    pub events: u64,
    /// Events of the hardware: flows' finish events (current or superseded), fault changes,
    /// bulk sends started later.
    pub network_events: u64,
    pub end: Nanos,
    /// What the links carried ([`Network::link_load`] up to `end`).
    pub links: LinkLoad,
}

impl<M> SimHost<M> {
    pub fn new(network: Network, limits: Limits, seed: u64) -> SimHost<M> {
        SimHost {
            kernel: Kernel::new(limits, seed),
            seats: Vec::new(),
            rngs: Vec::new(),
            network,
            seed,
            fetch_overhead: FetchOverhead::default(),
            places: Vec::new(),
            device_of: HashMap::new(),
            devices: Vec::new(),
            violations: Vec::new(),
            check_every: DEFAULT_CHECK_EVERY,
            progress: None,
            changes: Vec::new(),
            losses: Vec::new(),
            arrivals: Vec::new(),
            actor_events: 0,
            purpose: |_| Purpose::Message,
        }
    }

    /// The compute device at `place` (made if no actor runs there yet).
    fn device(&mut self, place: Place) -> usize {
        let devices = self.devices.len();
        let device = *self.device_of.entry(place).or_insert(devices);
        if device == devices {
            self.devices.push(Device {
                free: Nanos::ZERO,
                speed: 1.0,
            });
        }
        device
    }

    /// The compute of actors at any of `places` queues on one device (FIFO), as on a machine
    /// whose places share one processor (a live run's CPU). Call before adding those actors.
    pub fn share_device(&mut self, places: &[Place]) {
        let Some(&first) = places.first() else {
            return;
        };
        let d = self.device(first);
        for &p in &places[1..] {
            self.device_of.insert(p, d);
        }
    }

    /// From `at` until `until`, the NICs of `node` run at `factor` of their bandwidth
    /// (`factor = 0`: cut, nothing crosses them before `until`). See `crate::fault`.
    pub fn slow_nics(&mut self, node: u32, at: Nanos, until: Nanos, factor: f64) {
        // A cut link (factor 0) stops its flows until it is restored; small messages sent
        // meanwhile leave when it is back.
        let blocked_until = if factor > 0.0 { Nanos::ZERO } else { until };
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

    /// Node `node`'s memory is lost at `at`, for good (`crash`) or by a store restart: reads
    /// from it started with [`Context::start_fetch`] fail as [`MemoryLoss`] says.
    pub fn lose_memory(&mut self, loss: MemoryLoss) {
        self.losses.push(loss);
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

    /// Applies the hardware changes due at or before `now` (at a change event).
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
                } => self.network.set_nics(now, node, factor, blocked_until),
                Change::Device { device, factor } => self.devices[device].speed = factor,
            }
        }
    }

    /// Checks every actor's invariants every `events` events (0: never during the run).
    /// Reports the event count and simulated time into `p` as the run goes on.
    pub fn set_progress(&mut self, p: std::sync::Arc<Progress>) {
        self.progress = Some(p);
    }

    pub fn set_check_every(&mut self, events: u64) {
        self.check_every = events;
    }

    /// Says what each message is for, in the link counters ([`LinkLoad`]); by default every
    /// message is [`Purpose::Message`]. Work says its own: fetches load, SSD writes demote.
    pub fn set_purpose(&mut self, purpose: fn(&M) -> Purpose) {
        self.purpose = purpose;
    }

    pub fn set_fetch_overhead(&mut self, o: FetchOverhead) {
        self.fetch_overhead = o;
    }

    /// Adds an actor running at `place`; ids are given in order from 0.
    pub fn add(&mut self, actor: Box<dyn Actor<M>>, place: Place) -> ActorId {
        let id = ActorId(self.seats.len() as u32);
        let device = self.device(place);
        self.places.push(place);
        self.seats.push(Seat {
            hot: actor.hot(),
            actor,
            device: u32::try_from(device).expect("fewer than 2^32 devices"),
            place,
        });
        self.rngs
            .push(Stream::new(self.seed, streams::ACTOR_BASE + id.0 as u64));
        id
    }

    /// The id the next added actor will get (to wire actors that refer to each other).
    pub fn next_id(&self) -> ActorId {
        ActorId(self.seats.len() as u32)
    }

    /// Checks every actor's invariants now; the first broken one is an error.
    fn check_all(&self) -> Result<(), SimError> {
        if let Some(e) = self.violations.first() {
            return Err(self.kernel.invariant(e.clone()));
        }
        for (i, seat) in self.seats.iter().enumerate() {
            if let Err(e) = seat.actor.check() {
                return Err(self.kernel.invariant(format!("actor {i}: {e}")));
            }
        }
        Ok(())
    }

    /// Runs until no event is left, then collects the actors' reports.
    pub fn run(mut self) -> Result<SimOutcome, SimError> {
        for i in 0..self.seats.len() {
            self.kernel
                .schedule(Nanos::ZERO, ActorId(i as u32), Event::Start);
        }
        // Latest first, so that the next change is the last; changes at one time apply in the
        // order they were given (a stable sort, then reversed). Each time gets an event, so
        // that a change applies at its time even when nothing else happens then.
        self.changes.sort_by_key(|c| c.0);
        self.changes.reverse();
        let mut times: Vec<Nanos> = self.changes.iter().map(|c| c.0).collect();
        times.dedup();
        for at in times.into_iter().rev() {
            self.kernel.schedule(at, ActorId(0), Event::Change);
        }
        while let Some(event) = self.kernel.pop()? {
            // The next event's actor is likely cold at scale: ask for it, and for what it said
            // its next event reads, while this one runs.
            if let Some(next) = self.kernel.next_target()
                && let Some(seat) = self.seats.get(next.0 as usize)
            {
                seat.prefetch();
            }
            if let Event::Change = event.msg {
                self.apply_changes(event.time);
            }
            let who = event.target.0 as usize;
            let mut net = Net {
                network: &mut self.network,
                arrivals: &mut self.arrivals,
                places: &self.places,
                losses: &self.losses,
                purpose: self.purpose,
            };
            let msg = match event.msg {
                Event::Flow { flow, version } => {
                    net.finish(&mut self.kernel, flow, version);
                    continue;
                }
                Event::Send(p) => {
                    let now = self.kernel.now();
                    net.send_at(&mut self.kernel, now, p);
                    continue;
                }
                Event::Change => {
                    net.schedule_flows(&mut self.kernel);
                    continue;
                }
                Event::Start => None,
                Event::Msg(m) => Some(m),
            };
            let seat = &mut self.seats[who];
            let mut ctx = SimCtx {
                fetch_overhead: self.fetch_overhead,
                kernel: &mut self.kernel,
                net,
                device: &mut self.devices[seat.device as usize],
                violations: &mut self.violations,
                me: event.target,
                here: seat.place,
                rng: &mut self.rngs[who],
            };
            match msg {
                None => seat.actor.start(&mut ctx),
                Some(m) => seat.actor.handle(m, &mut ctx),
            }
            seat.hot = seat.actor.hot();
            self.actor_events += 1;
            if self.check_every > 0 && self.actor_events.is_multiple_of(self.check_every) {
                self.check_all()?;
            }
            if self.actor_events.is_multiple_of(PROGRESS_EVERY)
                && let Some(p) = &self.progress
            {
                p.update(self.actor_events, self.kernel.now());
            }
        }
        if self.check_every > 0 {
            self.check_all()?;
        }
        let mut report = Report {
            violations: std::mem::take(&mut self.violations),
            ..Report::default()
        };
        for seat in &mut self.seats {
            let mut part = Report::default();
            seat.actor.report(&mut part);
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
            events: self.actor_events,
            network_events: self.kernel.processed() - self.actor_events,
            end: self.kernel.now(),
            links: self.network.link_load(self.kernel.now()),
        })
    }
}

mod ctx;
#[cfg(test)]
mod tests;
