//! Actors: sans-IO state machines, and the context through which they act.
//!
//! An actor owns its state and handles one [`Msg`] at a time. Everything it does to the world
//! goes through its [`Context`]: read the current time, send a message with a payload size,
//! set a timer, start a piece of [`Work`] on its device and be told when it ends, draw from its
//! own random stream. It never reads a clock, sleeps, spawns or touches a socket, so the same
//! actor code runs under the deterministic simulator (`sim::host`), where the host charges
//! each effect from the hardware model, and under a live host that performs them for real.

use crate::hardware::Place;
use crate::metrics::{Completion, Report};
use crate::model::cost::BatchShape;
use crate::rng::Stream;
use crate::shard::{ShardReply, ShardRequest};
use crate::sim::kernel::ActorId;
use crate::store::directory::{LoadPlan, TensorId};
use crate::units::Nanos;
use crate::workload::ReqId;

/// Every message of the system. Large payloads are boxed to keep events small.
#[derive(Debug)]
pub enum Msg {
    /// Sent once by the host to every actor before anything else.
    Start,
    /// The router's own timer: request `ReqId` of the trace arrives now.
    Arrival(ReqId),
    /// Router -> instance: serve this request (payload: the prompt's token ids).
    Submit(ReqId),
    /// The work an actor started has finished.
    WorkDone,
    /// Instance -> router: the first output token of a request.
    FirstToken(ReqId),
    /// Instance -> router: a request generated its last token.
    Finished(Box<Completion>),
    /// Instance -> router: the request cannot be served (queue full, or longer than the
    /// instance's whole KV memory).
    Rejected(ReqId),
    /// Instance -> metadata: the longest stored prefix of this chain of tensor ids, skipping
    /// the first `skip` tensors (the instance already holds them).
    Lookup(Box<Lookup>),
    /// Metadata -> instance: where the stored prefix is.
    LookupReply(ReqId, Box<LoadPlan>),
    /// Instance -> store server of another node: read these bytes from SSD and send them.
    ReadSsd {
        req: ReqId,
        to: ActorId,
        bytes: u64,
        segments: u32,
    },
    /// A store server's SSD read for `to` has finished.
    SsdReadDone { req: ReqId, to: ActorId, bytes: u64 },
    /// Store server -> instance: one group of a request's load has arrived.
    Loaded(ReqId),
    /// Instance -> its node's store server: the KV of these tensors (payload), to store.
    StoreWrite {
        chain: Box<Vec<TensorId>>,
        replica: bool,
    },
    /// Store server -> metadata: tensors written on `node` (owned, or replicas).
    Insert {
        chain: Box<Vec<TensorId>>,
        node: u32,
        replica: bool,
    },
    /// Metadata -> store server: write this many demoted bytes to SSD (in the background).
    Demote { bytes: u64 },
    /// Pipeline head or shard -> shard: one step of a route session (DESIGN, "Pipeline
    /// routes"); the payload is the step's input activation.
    Step(Box<ShardRequest>),
    /// Tail shard (a token) or any shard (a cache miss) -> pipeline head.
    Reply(Box<ShardReply>),
    /// Pipeline head -> shard: drop every session state, as a restarted shard process would
    /// (fault injection).
    Restart,
}

/// A prefix lookup.
#[derive(Debug)]
pub struct Lookup {
    pub req: ReqId,
    pub from: ActorId,
    pub node: u32,
    pub chain: Vec<TensorId>,
    pub skip: u32,
}

/// A piece of work an actor starts on the device it runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    /// One forward pass of a serving instance over a batch.
    Batch(BatchShape),
    /// A bulk read of `bytes` in `segments` pieces from `from` into this actor's place
    /// (an RDMA read from another node, or a copy from local host memory over PCIe).
    Fetch {
        from: Place,
        bytes: u64,
        segments: u32,
    },
    /// Reading or writing `bytes` on this actor's node's SSDs.
    Ssd { write: bool, bytes: u64 },
    /// Model work whose duration the actor's model backend has already determined: the
    /// modelled time under the sim backend. Under the live host the work has already run for
    /// real when the actor starts it, so it ends at once.
    Compute(Nanos),
}

/// What an actor can do to the world.
pub trait Context {
    /// The current time.
    fn now(&self) -> Nanos;
    /// This actor's id.
    fn me(&self) -> ActorId;
    /// Sends `msg` to `to`; `payload_bytes` is what travels over the links between them.
    fn send(&mut self, to: ActorId, msg: Msg, payload_bytes: u64) {
        self.send_after(Nanos::ZERO, to, msg, payload_bytes);
    }
    /// Sends `msg` after `delay` of local processing.
    fn send_after(&mut self, delay: Nanos, to: ActorId, msg: Msg, payload_bytes: u64);
    /// Delivers `msg` to this actor after `after`.
    fn timer(&mut self, after: Nanos, msg: Msg);
    /// Starts `work` on this actor's device; `done` is delivered when it ends.
    fn start(&mut self, work: Work, done: Msg);
    /// This actor's own random stream.
    fn rng(&mut self) -> &mut Stream;
}

/// A sans-IO state machine.
pub trait Actor: Send {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context);

    /// Adds this actor's results and invariant violations to `report` at the end of a run.
    fn report(&self, report: &mut Report);
}
