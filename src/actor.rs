//! The actor contract (DESIGN contract 1): sans-IO state machines, and the context through
//! which they act. Both systems (pipeline routes, serving with prefix stores) and both hosts
//! (the simulator, the live host) meet here, so this module depends on no system.
//!
//! An actor of a system whose messages are `M` implements [`Actor<M>`]: it owns its state and
//! handles one message at a time. Everything it does to the world goes through its
//! [`Context<M>`]: read the current time, send a message with a payload size, set a timer,
//! start a piece of [`Work`] on its device and be told when it ends (or have a message sent
//! when it ends), draw from its own random stream. It never reads a clock, sleeps, spawns or
//! touches a socket, so the same actor code runs under the deterministic simulator
//! (`sim::host`), where the host charges each effect from the hardware model, and under the
//! live host (`live::host`), which performs them for real.
//!
//! Each system has its own message enum (`serving::Msg`, `pipeline::Msg`), so adding a system
//! never edits a crate-wide enum, and each system's messages can be encoded on their own.
//! What every message enum must offer is [`Message`]: the work-done notice its actors use.
//!
//! Errors are values: an actor that receives a message it does not expect, or whose state
//! breaks an invariant, records a violation and reports it in [`Actor::report`]; the host turns
//! any violation into an error of the whole run. Actors never panic on bad input. Invariants
//! are also checked while a run goes on ([`Actor::check`]), so a broken one is caught near the
//! event that broke it, not only at the end.

use std::fmt::Debug;

use crate::hardware::{Place, RemoteKvPath};
use crate::metrics::Report;
use crate::rng::Stream;
use crate::units::Nanos;

/// An actor's address, given by its host in the order actors are added (0, 1, ...).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ActorId(pub u32);

/// What the messages of one system must be: sendable between threads, printable for
/// violations and logs.
pub trait Message: Send + Debug + 'static {}

impl<T: Send + Debug + 'static> Message for T {}

/// A piece of work an actor starts on the device it runs on. The host decides what it costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    /// A bulk read of `bytes` in `segments` pieces from `from` into this actor's place: from
    /// host memory (an RDMA read from another node, a copy over PCIe from its own), or from
    /// the SSDs of `from`'s node, streamed through that node's host memory.
    Fetch {
        from: Place,
        medium: Medium,
        bytes: u64,
        segments: u32,
        /// The source's memory losses (crashes, store restarts) that the reader's plan had
        /// heard of: a read of memory lost since then reads tensors that are gone, and fails
        /// (see [`Context::start_fetch`]).
        epoch: u32,
        /// How a read of another node's host memory reaches a GPU.
        staging: RemoteKvPath,
    },
    /// Writing `bytes` from this actor's node's host memory to its SSDs (or reading them into
    /// host memory).
    Ssd { write: bool, bytes: u64 },
    /// Compute whose duration the actor's model backend (or service-time model) has already
    /// determined: the modelled time under a simulated backend. The host queues the compute
    /// work of actors that share a device (FIFO). Under the live host the work has already run
    /// for real when the actor starts it, so it ends at once.
    Compute(Nanos),
}

/// Where a [`Work::Fetch`] reads from, at its source place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    Memory,
    Ssd,
}

/// What happens when a piece of [`Work`] ends.
#[derive(Debug)]
pub enum Then<M> {
    /// `M` is delivered to the actor that started the work.
    Notify(M),
    /// `msg` is sent to `to` (with `payload_bytes` on the links between them) the moment the
    /// work ends: a server's reply that leaves when its service time is over.
    Send {
        to: ActorId,
        msg: M,
        payload_bytes: u64,
    },
    /// Nothing: the work only occupies the device (later work queues behind it).
    Nothing,
}

/// What an actor can do to the world.
pub trait Context<M> {
    /// The current time.
    fn now(&self) -> Nanos;
    /// This actor's id.
    fn me(&self) -> ActorId;
    /// Sends `msg` to `to`; `payload_bytes` is what travels over the links between them.
    fn send(&mut self, to: ActorId, msg: M, payload_bytes: u64);
    /// Delivers `msg` to this actor after `after`.
    fn timer(&mut self, after: Nanos, msg: M);
    /// Starts `work` on this actor's device; `then` says what happens when it ends.
    fn start_then(&mut self, work: Work, then: Then<M>);
    /// Starts `work` on this actor's device; `done` is delivered when it ends.
    fn start(&mut self, work: Work, done: M) {
        self.start_then(work, Then::Notify(done));
    }
    /// Starts a [`Work::Fetch`]: `done` is delivered when it ends, or `failed` when its source
    /// lost that memory before the last byte landed (the source's node crashed, before or
    /// during the read, or its store restarted during the read), or had lost it more times
    /// than the fetch's `epoch` says when the read started (a store restarted since the plan
    /// was made: what the plan names is gone): a one-sided read of memory that is gone ends
    /// with an error, never with the data. A host without memory losses delivers `done`.
    fn start_fetch(&mut self, work: Work, done: M, failed: M) {
        let _ = failed;
        self.start(work, done);
    }
    /// This actor's own random stream.
    fn rng(&mut self) -> &mut Stream;
    /// How long `work` would take if it started now, from what the host sees now: for a
    /// [`Work::Fetch`], its posting overheads and the share of its path's bottleneck it would
    /// get now. `None` where the host cannot say (the live host, and other work).
    fn estimate(&self, _work: &Work) -> Option<Nanos> {
        None
    }
}

/// A sans-IO state machine of a system whose messages are `M`.
pub trait Actor<M>: Send {
    /// Called once by the host before any message, at time 0.
    fn start(&mut self, _ctx: &mut dyn Context<M>) {}

    /// Handles one message.
    fn handle(&mut self, msg: M, ctx: &mut dyn Context<M>);

    /// Checks this actor's invariants now (hosts call it while a run goes on: the sim host
    /// every `check_every` events, see `sim::host`). Read-only: it never changes what the
    /// actor does, so a run gives the same results with or without checks.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// Adds this actor's results and invariant violations to `report` at the end of a run.
    /// Hosts ask once, when no event is left: an actor may move its results out rather than
    /// copy them (the router's records of every request are hundreds of MiB at full scale).
    fn report(&mut self, report: &mut Report);

    /// Memory outside its own value that this actor expects to read at its next event: the
    /// one performance hint of the contract ([`Hot`]). The sim host asks for it after each
    /// event, while the actor is in cache, and asks the processor for those lines just before
    /// the actor's next event; other hosts ignore it. It never changes a result.
    fn hot(&self) -> Hot {
        Hot::default()
    }
}

/// Where an actor's state outside its own value lies that its next event will read: the
/// first line of each of `count` elements, `stride` bytes apart from the address `base`, and
/// up to two more values at `values`, of `value_bytes` bytes. Only a hint for the simulator,
/// which asks the processor for these lines while the event before runs (`cpu::prefetch`):
/// the addresses are never dereferenced, so a hint that went stale is harmless and changes no
/// result. Its 32 bytes share a cache line with the rest of what the simulator reads of an
/// actor at every event, so the counts are held to 16 bits (the simulator asks for at most
/// 32 elements and 1 KiB of a value anyway; a stride held to 65,535 only asks for other
/// lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hot {
    pub base: usize,
    pub values: [usize; 2],
    pub value_bytes: [u16; 2],
    pub stride: u16,
    pub count: u16,
}

/// `n` held to what 16 bits hold.
fn held(n: usize) -> u16 {
    n.min(u16::MAX as usize) as u16
}

impl Hot {
    /// The elements of `items`, one line asked for each.
    pub fn of<T>(items: &[T]) -> Hot {
        Hot {
            base: items.as_ptr().addr(),
            stride: held(std::mem::size_of::<T>()),
            count: held(items.len()),
            ..Hot::default()
        }
    }

    /// Adds `v` (its first 65,535 bytes) as the `i`-th more value (0 or 1).
    pub fn with<T: ?Sized>(mut self, i: usize, v: &T) -> Hot {
        self.values[i] = (v as *const T).cast::<u8>().addr();
        self.value_bytes[i] = held(std::mem::size_of_val(v));
        self
    }
}

/// Records that `actor` got a message it has no use for (errors are values, see the module
/// doc): the message is dropped and the run ends with this violation.
pub fn unexpected<M: Debug>(violations: &mut Vec<String>, actor: &str, msg: &M) {
    // Bounded: one violation ends the run anyway; keep the first few for the report.
    const KEEP: usize = 16;
    if violations.len() < KEEP {
        violations.push(format!("{actor} cannot handle {msg:?}"));
    }
}
