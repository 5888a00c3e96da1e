//! The simulation host: runs actors on the event kernel and charges their effects.
//!
//! For each effect an actor asks for through its [`Context`], the host decides the cost:
//!
//! * `send`: the message arrives when the network model says its payload has crossed the
//!   links between the two actors' places ([`Network::transfer`], FIFO per link);
//! * `start(Work::Batch)`: the batch ends after the roofline duration of the cost model
//!   ([`CostModel::iteration`]);
//! * `start(Work::Fetch)`: after the posting overhead (per request plus per segment), the bytes
//!   cross the links from the source to the actor's place;
//! * `start(Work::Ssd)`: the bytes cross the node's SSD read or write channel;
//! * `start(Work::Compute(d))`: for `d`, the backend's modelled duration, on the device of the
//!   actor's place: compute work of actors that share a place runs one piece at a time, in
//!   the order it was started (FIFO), so shards sharing one device wait for each other;
//! * `timer`: after exactly the requested delay;
//! * `rng`: the actor's own ChaCha8 stream, numbered `ACTOR_BASE + actor id`.
//!
//! At the end of a run (no event left), every actor reports its results and checks its
//! invariants; any violation turns the run into an error that names the seed.

use crate::actor::{Actor, Context, Msg, Work};
use crate::hardware::Place;
use crate::hardware::network::{LinkBytes, Network};
use crate::metrics::Report;
use crate::model::cost::CostModel;
use crate::rng::{Stream, streams};
use crate::sim::kernel::{ActorId, Kernel, Limits, SimError};
use crate::units::Nanos;

struct Slot {
    actor: Box<dyn Actor>,
    place: Place,
    rng: Stream,
}

/// A set of actors on a simulated cluster.
pub struct SimHost {
    kernel: Kernel<Msg>,
    slots: Vec<Slot>,
    network: Network,
    cost: CostModel,
    seed: u64,
    fetch_overhead: FetchOverhead,
    /// When each place's device is free of compute work (places that ran any).
    compute_free: Vec<(Place, Nanos)>,
}

/// Fixed costs of posting a bulk fetch: per request and per gathered segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchOverhead {
    pub request: Nanos,
    pub segment: Nanos,
}

struct SimCtx<'a> {
    fetch_overhead: FetchOverhead,
    kernel: &'a mut Kernel<Msg>,
    network: &'a mut Network,
    cost: &'a CostModel,
    places: &'a [Place],
    compute_free: &'a mut Vec<(Place, Nanos)>,
    me: ActorId,
    rng: &'a mut Stream,
}

impl Context for SimCtx<'_> {
    fn now(&self) -> Nanos {
        self.kernel.now()
    }
    fn me(&self) -> ActorId {
        self.me
    }
    fn send_after(&mut self, delay: Nanos, to: ActorId, msg: Msg, payload_bytes: u64) {
        let from = self.places[self.me.0 as usize];
        let dest = self.places[to.0 as usize];
        let at = self
            .network
            .transfer(self.kernel.now() + delay, from, dest, payload_bytes);
        self.kernel.schedule(at, to, msg);
    }
    fn timer(&mut self, after: Nanos, msg: Msg) {
        let at = self.kernel.now() + after;
        self.kernel.schedule(at, self.me, msg);
    }
    fn start(&mut self, work: Work, done: Msg) {
        let now = self.kernel.now();
        let here = self.places[self.me.0 as usize];
        let at = match work {
            Work::Batch(shape) => now + self.cost.iteration(&shape),
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
                let node = here.node().expect("SSD work runs on a node");
                self.network.ssd(now, node, write, bytes)
            }
            Work::Compute(d) => {
                let slot = match self.compute_free.iter().position(|(p, _)| *p == here) {
                    Some(i) => i,
                    None => {
                        self.compute_free.push((here, Nanos::ZERO));
                        self.compute_free.len() - 1
                    }
                };
                let end = now.max(self.compute_free[slot].1) + d;
                self.compute_free[slot].1 = end;
                end
            }
        };
        self.kernel.schedule(at, self.me, done);
    }
    fn rng(&mut self) -> &mut Stream {
        self.rng
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

impl SimHost {
    pub fn new(network: Network, cost: CostModel, limits: Limits, seed: u64) -> SimHost {
        SimHost {
            kernel: Kernel::new(limits, seed),
            slots: Vec::new(),
            network,
            cost,
            seed,
            fetch_overhead: FetchOverhead::default(),
            compute_free: Vec::new(),
        }
    }

    pub fn set_fetch_overhead(&mut self, o: FetchOverhead) {
        self.fetch_overhead = o;
    }

    /// Adds an actor running at `place`; ids are given in order from 0.
    pub fn add(&mut self, actor: Box<dyn Actor>, place: Place) -> ActorId {
        let id = ActorId(self.slots.len() as u32);
        self.slots.push(Slot {
            actor,
            place,
            rng: Stream::new(self.seed, streams::ACTOR_BASE + id.0 as u64),
        });
        id
    }

    /// The id the next added actor will get (to wire actors that refer to each other).
    pub fn next_id(&self) -> ActorId {
        ActorId(self.slots.len() as u32)
    }

    /// Runs until no event is left, then collects the actors' reports.
    pub fn run(mut self) -> Result<SimOutcome, SimError> {
        for i in 0..self.slots.len() {
            self.kernel
                .schedule(Nanos::ZERO, ActorId(i as u32), Msg::Start);
        }
        let places: Vec<Place> = self.slots.iter().map(|s| s.place).collect();
        while let Some(event) = self.kernel.pop()? {
            let slot = &mut self.slots[event.target.0 as usize];
            let mut ctx = SimCtx {
                fetch_overhead: self.fetch_overhead,
                kernel: &mut self.kernel,
                network: &mut self.network,
                cost: &self.cost,
                places: &places,
                compute_free: &mut self.compute_free,
                me: event.target,
                rng: &mut slot.rng,
            };
            slot.actor.handle(event.msg, &mut ctx);
        }
        let mut report = Report::default();
        for slot in &self.slots {
            slot.actor.report(&mut report);
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
