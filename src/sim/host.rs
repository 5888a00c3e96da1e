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
use crate::hardware::Place;
use crate::hardware::network::{FlowId, LinkBytes, MICE_BYTES, Network, Transfer};
use crate::metrics::Report;
use crate::rng::{Stream, streams};
use crate::sim::kernel::{Kernel, Limits, SimError};
use crate::sim::prefetch;
use crate::sim::progress::{PROGRESS_EVERY, Progress};
use crate::units::Nanos;

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
    /// Where each actor's place's own network links lie, by id ([`Network::end_pairs`]), for
    /// a cache hint ahead of its events. Kept rather than derived from `places` at each
    /// event: deriving them (a division by the NICs a node) cost 1-2 % at 32 GPUs.
    end_pairs: Vec<[u32; 2]>,
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
}

/// An actor and what the host reads of it at each of its events, in one 64-byte line: at
/// cluster scale the actors' seats are out of the first-level cache, and reading an actor's
/// pointer, its device, its place and the hint for its next event ([`Actor::hot`] as of its
/// last one) from one record is one miss, where the five dense lists it replaced were five
/// (`cachegrind`, evostore at 2,240 GPUs: 12 % fewer first-level misses in all). The seat
/// of the event after next is asked for while an event runs, so that it is there when its
/// hint is read.
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
    /// Asks for the actor's value (eight lines from its first, [`ACTOR_BYTES`] in all; not
    /// a ninth where the value starts inside a line: `sim_scale` at 2,240 GPUs, evostore,
    /// six pairs, the ninth at 0.983 of without in the median) and the hint of its next event.
    fn prefetch(&self) {
        let value: *const dyn Actor<M> = &*self.actor;
        let bytes = std::mem::size_of_val(&*self.actor).min(ACTOR_BYTES);
        prefetch::lines(value.cast(), bytes.div_ceil(prefetch::LINE));
        prefetch::hot(self.hot);
    }
}

/// Most bytes of an actor's value asked for ahead of its event. A serving instance is 840
/// bytes, and asking for all 14 lines at every event filled the processor's queue of
/// outstanding misses with lines most events never read: the event loop then waited on its
/// own hints (`perf`, evostore at 2,240 GPUs: a quarter of the loop's samples on the
/// prefetch). `sim_scale` at 2,240 GPUs, pairs of runs, this against every line: 512 bytes
/// +4 % (evostore), +8 % (local-prefix), +2 % (ptstore); 384 bytes below 512 by 4 %
/// (evostore) and 10 % (local-prefix); 256 bytes no better than every line; none at all 12 %
/// slower (local-prefix). Those pairs timed first rounds only; retried in three-round pairs
/// (the twenty-first session in `docs/performance.md`): 768 bytes 1.011 (local-prefix) and 1.023
/// (evostore) of 512, 384 bytes 0.939 and 0.988. Since an instance keeps what every event
/// reads in its first 440 bytes (see [`crate::serving::instance::Instance`]), local-prefix,
/// six three-round pairs against 512: 704 bytes (the whole pool too) 0.987, 448 bytes 1.006.
pub(crate) const ACTOR_BYTES: usize = 512;

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

struct SimCtx<'a, M> {
    fetch_overhead: FetchOverhead,
    kernel: &'a mut Kernel<Event<M>>,
    net: Net<'a, M>,
    /// This actor's device.
    device: &'a mut Device,
    violations: &'a mut Vec<String>,
    me: ActorId,
    /// This actor's place.
    here: Place,
    rng: &'a mut Stream,
}

/// The network and what the host keeps about its flows.
struct Net<'a, M> {
    network: &'a mut Network,
    arrivals: &'a mut Vec<Option<OnArrival<M>>>,
    /// The place of every actor, by id.
    places: &'a [Place],
    /// Memory losses of the run (node crashes, store restarts).
    losses: &'a [MemoryLoss],
}

impl<M> Net<'_, M> {
    /// Applies `after` at `at` (now or later).
    fn after(&mut self, kernel: &mut Kernel<Event<M>>, at: Nanos, after: After<M>) {
        match after {
            After::Deliver(to, msg) => kernel.schedule(at, to, Event::Msg(msg)),
            After::Fetched {
                to,
                done,
                failed,
                node,
                epoch,
                started,
            } => {
                let lost = read_fails(self.losses, node, epoch, started, at);
                let msg = if lost { failed } else { done };
                kernel.schedule(at, to, Event::Msg(msg));
            }
            After::Send(p) => self.send_at(kernel, at, p),
            After::Nothing => {}
        }
    }

    /// Sends `p`, its first byte leaving at `at`. A small message sent later is priced now
    /// (its share of the links at the time it is sent hardly depends on what happens in
    /// between); a bulk one starts its flow then.
    fn send_at(&mut self, kernel: &mut Kernel<Event<M>>, at: Nanos, p: Pending<M>) {
        if at > kernel.now() && p.payload_bytes > MICE_BYTES {
            kernel.schedule(at, p.from, Event::Send(p));
            return;
        }
        let from = self.places[p.from.0 as usize];
        let dest = self.places[p.to.0 as usize];
        let t = self.network.transfer(at, from, dest, p.payload_bytes);
        self.on(kernel, t, After::Deliver(p.to, p.msg), Nanos::ZERO);
    }

    /// Does `after` when transfer `t` arrives, `extra` later.
    fn on(&mut self, kernel: &mut Kernel<Event<M>>, t: Transfer, after: After<M>, extra: Nanos) {
        match t {
            Transfer::At(arrival) => self.after(kernel, arrival + extra, after),
            Transfer::Flow(flow) => {
                let i = flow as usize;
                if self.arrivals.len() <= i {
                    self.arrivals.resize_with(i + 1, || None);
                }
                self.arrivals[i] = Some(OnArrival { after, extra });
                self.schedule_flows(kernel);
            }
        }
    }

    /// Schedules the finish events of the flows whose finish time changed.
    fn schedule_flows(&mut self, kernel: &mut Kernel<Event<M>>) {
        for r in self.network.reschedules() {
            kernel.schedule(
                r.at,
                ActorId(0),
                Event::Flow {
                    flow: r.flow,
                    version: r.version,
                },
            );
        }
    }

    /// A flow's finish event: if current, the flow arrives and what waits on it happens.
    fn finish(&mut self, kernel: &mut Kernel<Event<M>>, flow: FlowId, version: u32) {
        let now = kernel.now();
        if let Some(arrival) = self.network.finish(now, flow, version) {
            let on = self.arrivals[flow as usize].take();
            if let Some(OnArrival { after, extra }) = on {
                self.after(kernel, arrival + extra, after);
            }
        }
        self.schedule_flows(kernel);
    }
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
        let p = Pending {
            from: self.me,
            to,
            msg,
            payload_bytes,
        };
        self.net.send_at(self.kernel, now, p);
    }
    fn timer(&mut self, after: Nanos, msg: M) {
        let at = self.kernel.now() + after;
        self.kernel.schedule(at, self.me, Event::Msg(msg));
    }
    fn start_fetch(&mut self, work: Work, done: M, failed: M) {
        let node = match &work {
            Work::Fetch { from, epoch, .. } => from.node().map(|n| (n, *epoch)),
            _ => None,
        };
        match node {
            Some((node, epoch)) => {
                let after = After::Fetched {
                    to: self.me,
                    done,
                    failed,
                    node,
                    epoch,
                    started: self.kernel.now(),
                };
                self.start_after(work, after);
            }
            None => self.start(work, done),
        }
    }
    fn start_then(&mut self, work: Work, then: Then<M>) {
        let after = match then {
            Then::Notify(done) => After::Deliver(self.me, done),
            Then::Send {
                to,
                msg,
                payload_bytes,
            } => After::Send(Pending {
                from: self.me,
                to,
                msg,
                payload_bytes,
            }),
            Then::Nothing => After::Nothing,
        };
        self.start_after(work, after);
    }
    fn rng(&mut self) -> &mut Stream {
        self.rng
    }
}

impl<M> SimCtx<'_, M> {
    /// Starts `work`; `after` happens when it ends.
    fn start_after(&mut self, work: Work, after: After<M>) {
        let now = self.kernel.now();
        let here = self.here;
        let (transfer, extra) = match work {
            Work::Fetch {
                from,
                medium,
                bytes,
                segments,
                ..
            } => {
                let overhead = self.fetch_overhead.request
                    + Nanos(self.fetch_overhead.segment.0 * segments as u64);
                let t = match (medium, from.node()) {
                    (Medium::Memory, _) => Some(self.net.network.transfer(now, from, here, bytes)),
                    (Medium::Ssd, Some(node)) => self.net.network.ssd_read(now, node, here, bytes),
                    (Medium::Ssd, None) => None,
                };
                (t, overhead)
            }
            Work::Ssd { write, bytes } => {
                let t = here.node().and_then(|node| {
                    if write {
                        self.net.network.ssd_write(now, node, bytes)
                    } else {
                        self.net
                            .network
                            .ssd_read(now, node, Place::Host { node }, bytes)
                    }
                });
                (t, Nanos::ZERO)
            }
            Work::Compute(d) => {
                let device = &mut *self.device;
                let d = if device.speed == 1.0 {
                    d
                } else {
                    Nanos::from_secs_f64(d.as_secs_f64() / device.speed)
                };
                device.free = now.max(device.free) + d;
                (Some(Transfer::At(device.free)), Nanos::ZERO)
            }
        };
        let transfer = transfer.unwrap_or_else(|| {
            // Errors are values: the work ends at once and the run fails with this.
            self.violations.push(format!(
                "actor {} at {here:?} started {work:?}, but there are no SSDs there",
                self.me.0
            ));
            Transfer::At(now)
        });
        self.net.on(self.kernel, transfer, after, extra);
    }
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
    pub link_bytes: LinkBytes,
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
            end_pairs: Vec::new(),
            device_of: HashMap::new(),
            devices: Vec::new(),
            violations: Vec::new(),
            check_every: DEFAULT_CHECK_EVERY,
            progress: None,
            changes: Vec::new(),
            losses: Vec::new(),
            arrivals: Vec::new(),
            actor_events: 0,
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
    /// (`factor = 0`: cut, nothing crosses them before `until`). See `crate::sim::fault`.
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

    /// From `at` until `until`, compute at `place` runs at `factor` (in (0, 1]) of its speed:
    /// work started then takes `d / factor`.
    /// Node `node`'s memory is lost at `at`, for good (`crash`) or by a store restart: reads
    /// from it started with [`Context::start_fetch`] fail as [`MemoryLoss`] says.
    pub fn lose_memory(&mut self, loss: MemoryLoss) {
        self.losses.push(loss);
    }

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

    pub fn set_fetch_overhead(&mut self, o: FetchOverhead) {
        self.fetch_overhead = o;
    }

    /// Adds an actor running at `place`; ids are given in order from 0.
    pub fn add(&mut self, actor: Box<dyn Actor<M>>, place: Place) -> ActorId {
        let id = ActorId(self.seats.len() as u32);
        let device = self.device(place);
        self.places.push(place);
        self.end_pairs.push(self.network.end_pairs(place));
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
                // And for the network links at its GPU, which its messages cross.
                if let Some(&pairs) = self.end_pairs.get(next.0 as usize) {
                    self.network.end_link_addrs(pairs, prefetch::line);
                }
                // And for the seat of the event after it, so that its own loads (a line of
                // a few thousand actors' seats, cold at scale) are there one event from now.
                if let Some(after) = self.kernel.second_target() {
                    prefetch::line(self.seats.as_ptr().wrapping_add(after.0 as usize).cast());
                }
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
            // The next event's actor may ask for what its message will read, and name the
            // peer it will send to (whose network links are then asked for): the pop that
            // comes first gives the hints a little time to land.
            if let Some((next, Event::Msg(m))) = self.kernel.peek()
                && let Some(seat) = self.seats.get(next.0 as usize)
                && let Some(peer) = seat.actor.ahead(m)
                && let Some(&pairs) = self.end_pairs.get(peer.0 as usize)
            {
                self.network.end_link_addrs(pairs, prefetch::line);
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
        fn report(&mut self, _report: &mut Report) {}
    }

    fn host(check_every: u64, breaks_at: u64) -> SimHost<()> {
        let link = LinkSpec::ideal(1e9, Nanos::ZERO);
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

    /// Fetches 1 MB from node 1's memory at `start_at` (its timer: `None`) and records which
    /// message ended the read (`Some(done)`).
    struct Reader {
        got: std::sync::Arc<std::sync::Mutex<Vec<(bool, Nanos)>>>,
        start_at: Nanos,
        epoch: u32,
    }

    impl Actor<Option<bool>> for Reader {
        fn start(&mut self, ctx: &mut dyn Context<Option<bool>>) {
            ctx.timer(self.start_at, None);
        }
        fn handle(&mut self, msg: Option<bool>, ctx: &mut dyn Context<Option<bool>>) {
            match msg {
                None => {
                    let work = Work::Fetch {
                        from: Place::Host { node: 1 },
                        medium: Medium::Memory,
                        bytes: 1_000_000,
                        segments: 1,
                        epoch: self.epoch,
                    };
                    ctx.start_fetch(work, Some(true), Some(false));
                }
                Some(ok) => self.got.lock().unwrap().push((ok, ctx.now())),
            }
        }
        fn report(&mut self, _report: &mut Report) {}
    }

    /// (delivered `done`, at) of a 1 MB read at 1 GB/s (1 ms) started at `start_at`, with
    /// `loss` applied to node 1.
    fn read(start_at: Nanos, loss: Option<(Nanos, bool)>) -> (bool, Nanos) {
        read_knowing(start_at, loss, 0)
    }

    /// [`read`] by a reader whose plan knew of `epoch` losses of node 1.
    fn read_knowing(start_at: Nanos, loss: Option<(Nanos, bool)>, epoch: u32) -> (bool, Nanos) {
        let link = LinkSpec::ideal(1e9, Nanos::ZERO);
        let mut h: SimHost<Option<bool>> =
            SimHost::new(Network::fabric(2, link), Limits::default(), 1);
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        h.add(
            Box::new(Reader {
                got: got.clone(),
                start_at,
                epoch,
            }),
            Place::Host { node: 0 },
        );
        if let Some((at, crash)) = loss {
            h.lose_memory(MemoryLoss { node: 1, at, crash });
        }
        h.run().unwrap();
        let v = got.lock().unwrap().clone();
        assert_eq!(v.len(), 1, "{v:?}");
        v[0]
    }

    #[test]
    fn a_read_fails_when_its_source_loses_the_memory_before_its_last_byte() {
        let ms = |x: u64| Nanos(x * 1_000_000);
        let (ok, end) = read(Nanos::ZERO, None);
        assert!(ok);
        assert!(end >= ms(1) && end < ms(2), "{end:?}");
        // A crash or a restart while the read is in flight: it fails, when it would have
        // ended (the reader learns from the read itself, whatever notice comes later).
        assert_eq!(
            read(Nanos::ZERO, Some((Nanos(500_000), true))),
            (false, end)
        );
        assert_eq!(
            read(Nanos::ZERO, Some((Nanos(500_000), false))),
            (false, end)
        );
        // A loss after the read ended changes nothing.
        assert_eq!(read(Nanos::ZERO, Some((ms(5), true))), (true, end));
        // A read started after a crash fails. After a restart, a read planned before the
        // restart was known (epoch 0) names tensors that are gone: it fails; one planned
        // knowing of it (epoch 1) reads the restarted store.
        let later = read(ms(2), None);
        assert!(later.0);
        assert_eq!(read(ms(2), Some((ms(1), true))), (false, later.1));
        assert_eq!(read(ms(2), Some((ms(1), false))), (false, later.1));
        assert_eq!(
            read_knowing(ms(2), Some((ms(1), false)), 1),
            (true, later.1)
        );
        assert!(!read_knowing(ms(2), Some((ms(1), true)), 1).0);
        // Another node's loss does not touch it.
        let link = LinkSpec::ideal(1e9, Nanos::ZERO);
        let mut h: SimHost<Option<bool>> =
            SimHost::new(Network::fabric(3, link), Limits::default(), 1);
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        h.add(
            Box::new(Reader {
                got: got.clone(),
                start_at: Nanos::ZERO,
                epoch: 0,
            }),
            Place::Host { node: 0 },
        );
        h.lose_memory(MemoryLoss {
            node: 2,
            at: Nanos(500_000),
            crash: true,
        });
        h.run().unwrap();
        assert!(got.lock().unwrap()[0].0);
    }
}
