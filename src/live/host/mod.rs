//! The live host for any set of sans-IO actors: each [`Actor`] runs inside one ractor actor on
//! tokio, effects are performed for real, and time is the wall clock.
//!
//! It is the counterpart of [`crate::sim::host::SimHost`], with the same numbering (actors get
//! ids 0, 1, ... in the order given) and the same [`Report`] at the end. For each effect an
//! actor asks for through its [`Context`]:
//!
//! * `now`: nanoseconds of wall time since the run started;
//! * `send`: the message goes into the target's ractor mailbox; actors share one process, so
//!   the payload size is only counted;
//! * `timer`: a tokio timer that delivers the message to the actor itself;
//! * `start(work)`: the work has already run for real inside the handler, so it ends at once:
//!   `done` is delivered (or the [`Then::Send`] message sent) right away. A `Work::Compute` is
//!   the candle forward pass that took its wall time there; a `Work::Fetch` is a store load
//!   whose bytes the instance's backend copied from the store server's memory as it started
//!   it (one process: the copy is the transfer; its bytes are counted); a `Work::Ssd` is a
//!   demotion whose bytes the server already moved to its SSD tier (host memory here);
//! * `rng`: the actor's own ChaCha8 stream, numbered as on the sim host.
//!
//! A handler runs on a tokio worker thread inside `block_in_place` (on a multi-threaded
//! runtime), so CPU-bound model work does not starve the runtime; each actor handles one
//! message at a time, in mailbox order.
//!
//! After every message it handles, an actor's invariants are checked ([`Actor::check`]);
//! a broken one ends the run at once with the actor's id and the invariant's message (which
//! names the request where one is concerned). Live runs are small, so checking after every
//! message costs little next to the real work of a handler.
//!
//! The end of a run follows the sim kernel's rule, "no event left": the host counts messages
//! in flight (sent, or due on a timer, and not yet handled) and ends the run when the count
//! falls to zero. A handler that panics, or a message that cannot be delivered, ends the run
//! at once with that error; a run that does not end within its wall-clock limit is an error
//! too. Addressing stays abstract ([`ActorId`] to a route): [`run`] hosts every actor in this
//! process; [`super::cluster`] uses the same shells with routes to other processes (a
//! [`Route::Remote`] message is encoded and handed to that process's agent), counting
//! messages per peer process so that its coordinator can tell when the whole run is quiet.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ractor::{Actor as RactorActor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::LiveError;
use super::wire::Counts;
use crate::actor::{Actor, ActorId, Context, Message, Then, Work};
use crate::metrics::Report;
use crate::rng::{Stream, streams};
use crate::units::Nanos;

/// What a shell's mailbox carries.
pub enum Envelope<M> {
    /// The start of the run, for [`Actor::start`].
    Start,
    /// A message for the actor from this process (counted in `in_flight`).
    Deliver(M),
    /// A message for the actor from an actor of process `from` (counted per peer).
    Remote(M, u16),
    /// The actor's report, at the end of the run.
    Report(RpcReplyPort<Report>),
}

// ractor's `cluster` feature (which `ractor_cluster` needs) drops the blanket `Message`
// impl: a shell's envelope never leaves its process.
impl<M: Message> ractor::Message for Envelope<M> {}

/// Where an actor's messages go.
pub enum Route<M> {
    /// A shell in this process.
    Local(ActorRef<Envelope<M>>),
    /// An actor of another process of the run, by its index there.
    Remote(u16),
    /// An actor whose process was lost and that has not been placed again: its messages are
    /// lost, as they would be on the wire.
    Gone,
}

impl<M> Clone for Route<M> {
    fn clone(&self) -> Self {
        match self {
            Route::Local(r) => Route::Local(r.clone()),
            Route::Remote(n) => Route::Remote(*n),
            Route::Gone => Route::Gone,
        }
    }
}

/// Sends actor messages to other processes (`super::cluster`): encodes `msg` for actor `to`
/// and hands it to process `node`'s agent. An error (the message cannot be encoded, or is
/// over the frame limit) ends the run.
pub trait Outbound<M>: Send + Sync {
    fn send(&self, node: u16, to: ActorId, msg: M) -> Result<u64, String>;
}

pub(crate) struct Shared<M> {
    started: Instant,
    routes: RwLock<Vec<Route<M>>>,
    outbound: Option<Arc<dyn Outbound<M>>>,
    /// Messages sent within this process (or due on a timer) and not yet handled.
    in_flight: AtomicU64,
    /// Per process: messages sent from here to an actor there, and handled here from there.
    sent_to: Vec<AtomicU64>,
    handled_from: Vec<AtomicU64>,
    handled: AtomicU64,
    /// An actor panicked or a message could not be delivered.
    failed: AtomicBool,
    wake: tokio::sync::Notify,
    messages: AtomicU64,
    bytes: AtomicU64,
    /// Frames sent to other processes, and their bytes.
    wire_frames: AtomicU64,
    wire_bytes: AtomicU64,
    /// Bytes of `Work::Fetch`es (store loads).
    fetched: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl<M: Message> Shared<M> {
    fn now(&self) -> Nanos {
        Nanos(self.started.elapsed().as_nanos() as u64)
    }

    /// Records a failure and ends the run.
    pub(crate) fn error(&self, e: String) {
        if let Ok(mut v) = self.errors.lock() {
            v.push(e);
        }
        self.failed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Counts a local message as in flight from now until its handler returns.
    fn sent(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// A local message left flight (handled, or lost); wakes the host when none is left.
    fn landed(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake.notify_one();
        }
    }

    fn route(&self, to: ActorId) -> Option<Route<M>> {
        self.routes.read().ok()?.get(to.0 as usize).cloned()
    }

    /// Puts a local envelope into `to`'s mailbox; it must already be counted by
    /// [`Self::sent`].
    fn deliver_local(&self, to: ActorId, msg: Envelope<M>) {
        match self.route(to) {
            Some(Route::Local(peer)) => {
                self.messages.fetch_add(1, Ordering::Relaxed);
                if peer.cast(msg).is_err() {
                    self.error(format!("actor {} has stopped", to.0));
                    self.landed();
                }
            }
            _ => {
                self.error(format!(
                    "a local message to actor {}, which is not here",
                    to.0
                ));
                self.landed();
            }
        }
    }

    /// Sends an actor message to `to`, wherever it lives.
    fn send_msg(&self, to: ActorId, msg: M) {
        match self.route(to) {
            Some(Route::Local(_)) => {
                self.sent();
                self.deliver_local(to, Envelope::Deliver(msg));
            }
            Some(Route::Remote(node)) => {
                let Some(out) = &self.outbound else {
                    self.error(format!(
                        "actor {} is remote but this host has no network",
                        to.0
                    ));
                    return;
                };
                match out.send(node, to, msg) {
                    Ok(frame_bytes) => {
                        self.messages.fetch_add(1, Ordering::Relaxed);
                        self.wire_bytes.fetch_add(frame_bytes, Ordering::Relaxed);
                        self.wire_frames.fetch_add(1, Ordering::Relaxed);
                        if let Some(c) = self.sent_to.get(node as usize) {
                            c.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) => self.error(e),
                }
            }
            Some(Route::Gone) => {
                tracing::debug!("a message to actor {} is lost with its process", to.0);
            }
            None => self.error(format!("a message to unknown actor {}", to.0)),
        }
    }
}

struct LiveCtx<'a, M> {
    shared: &'a Arc<Shared<M>>,
    me: ActorId,
    rng: &'a mut Stream,
}

impl<M: Message> Context<M> for LiveCtx<'_, M> {
    fn now(&self) -> Nanos {
        self.shared.now()
    }
    fn me(&self) -> ActorId {
        self.me
    }
    fn send(&mut self, to: ActorId, msg: M, payload_bytes: u64) {
        self.shared
            .bytes
            .fetch_add(payload_bytes, Ordering::Relaxed);
        self.shared.send_msg(to, msg);
    }
    fn timer(&mut self, after: Nanos, msg: M) {
        let me = self.me;
        self.shared.sent();
        let shared = Arc::clone(self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_nanos(after.0)).await;
            shared.deliver_local(me, Envelope::Deliver(msg));
        });
    }
    fn start_then(&mut self, work: Work, then: Then<M>) {
        if let Work::Fetch { bytes, .. } = work {
            self.shared.fetched.fetch_add(bytes, Ordering::Relaxed);
        }
        match then {
            Then::Notify(done) => {
                self.shared.sent();
                self.shared.deliver_local(self.me, Envelope::Deliver(done));
            }
            Then::Send {
                to,
                msg,
                payload_bytes,
            } => self.send(to, msg, payload_bytes),
            Then::Nothing => {}
        }
    }
    fn rng(&mut self) -> &mut Stream {
        self.rng
    }
}

struct Shell<M>(std::marker::PhantomData<fn() -> M>);

struct ShellState<M> {
    actor: Box<dyn Actor<M>>,
    me: ActorId,
    shared: Arc<Shared<M>>,
    rng: Stream,
}

impl<M: Message> RactorActor for Shell<M> {
    type Msg = Envelope<M>;
    type State = ShellState<M>;
    type Arguments = ShellState<M>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Envelope<M>>,
        state: ShellState<M>,
    ) -> Result<ShellState<M>, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Envelope<M>>,
        msg: Envelope<M>,
        st: &mut ShellState<M>,
    ) -> Result<(), ActorProcessingErr> {
        let (msg, from) = match msg {
            Envelope::Report(reply) => {
                let mut r = Report::default();
                st.actor.report(&mut r);
                // The host may have given up waiting; nothing to do then.
                let _ = reply.send(r);
                return Ok(());
            }
            Envelope::Start => (None, None),
            Envelope::Deliver(m) => (Some(m), None),
            Envelope::Remote(m, from) => (Some(m), Some(from)),
        };
        let ShellState {
            actor,
            me,
            shared,
            rng,
        } = st;
        let handled = compute(|| {
            catch_unwind(AssertUnwindSafe(|| {
                let mut ctx = LiveCtx {
                    shared,
                    me: *me,
                    rng,
                };
                match msg {
                    Some(m) => actor.handle(m, &mut ctx),
                    None => actor.start(&mut ctx),
                }
            }))
        });
        if let Err(panic) = handled {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            shared.error(format!("actor {} panicked: {what}", me.0));
        } else if let Err(e) = actor.check() {
            // Live runs are small: every actor's invariants after every message.
            shared.error(format!("actor {}: invariant broken: {e}", me.0));
        }
        shared.handled.fetch_add(1, Ordering::SeqCst);
        match from {
            None => shared.landed(),
            Some(n) => {
                if let Some(c) = shared.handled_from.get(n as usize) {
                    c.fetch_add(1, Ordering::SeqCst);
                }
                shared.wake.notify_one();
            }
        }
        Ok(())
    }
}

/// Runs CPU-bound work without starving the runtime's other tasks where the runtime allows it.
pub(crate) fn compute<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// What a live run gives back.
#[derive(Debug)]
pub struct LiveOutcome {
    pub report: Report,
    /// Wall time from the start to the moment no message was left in flight.
    pub wall: Duration,
    /// Messages delivered (including work completions and timers).
    pub messages: u64,
    /// Payload bytes sent between actors.
    pub bytes: u64,
    /// Bytes read by store loads (`Work::Fetch`).
    pub fetched: u64,
    /// Bytes of the frames of actor messages that crossed processes (0 in one process).
    pub wire_bytes: u64,
    /// Frames of actor messages that crossed processes.
    pub wire_frames: u64,
    /// Bytes the actors read from other processes' memory (one-sided reads of store
    /// tensors across processes; 0 in one process).
    pub remote_read: u64,
}

impl LiveOutcome {
    /// The outcome of a run whose actors reported `report` (an error if it holds a
    /// violation), with the totals of [`LocalHost::totals`] (summed over processes).
    pub(crate) fn new(
        report: Report,
        wall: Duration,
        totals: [u64; 6],
    ) -> Result<LiveOutcome, LiveError> {
        if let Some(first) = report.violations.first() {
            return Err(LiveError::Actor(format!(
                "{first} ({} violation(s) in all)",
                report.violations.len()
            )));
        }
        let [
            messages,
            bytes,
            fetched,
            wire_bytes,
            wire_frames,
            remote_read,
        ] = totals;
        Ok(LiveOutcome {
            report,
            wall,
            messages,
            bytes,
            fetched,
            wire_bytes,
            wire_frames,
            remote_read,
        })
    }
}

/// The actors of a run that live in this process: their shells, routes to every actor of
/// the run, and the counts of messages in flight. [`run`] uses one for a whole run;
/// `super::cluster` one per process of a run.
pub(crate) struct LocalHost<M: Message> {
    pub(crate) shared: Arc<Shared<M>>,
    seed: u64,
    local: Vec<(ActorId, ActorRef<Envelope<M>>)>,
    joins: Vec<tokio::task::JoinHandle<()>>,
}

impl<M: Message> LocalHost<M> {
    /// A host for one of the `nodes` processes of a run, whose actors go by `routes` (by id),
    /// with `outbound` for the remote ones.
    pub(crate) fn new(
        nodes: usize,
        routes: Vec<Route<M>>,
        seed: u64,
        outbound: Option<Arc<dyn Outbound<M>>>,
    ) -> LocalHost<M> {
        let shared = Arc::new(Shared {
            started: Instant::now(),
            routes: RwLock::new(routes),
            outbound,
            in_flight: AtomicU64::new(0),
            sent_to: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            handled_from: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            handled: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            wire_bytes: AtomicU64::new(0),
            wire_frames: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
        });
        LocalHost {
            shared,
            seed,
            local: Vec::new(),
            joins: Vec::new(),
        }
    }

    /// Spawns the shell of `actor` as actor `id` here (its route becomes local).
    pub(crate) async fn add(
        &mut self,
        id: ActorId,
        actor: Box<dyn Actor<M>>,
    ) -> Result<(), LiveError> {
        let state = ShellState {
            actor,
            me: id,
            shared: Arc::clone(&self.shared),
            rng: Stream::new(self.seed, streams::ACTOR_BASE + id.0 as u64),
        };
        let (r, j) = RactorActor::spawn(None, Shell(std::marker::PhantomData), state)
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))?;
        self.set_route(id, Route::Local(r.clone()));
        self.local.push((id, r));
        self.joins.push(j);
        Ok(())
    }

    /// Points actor `id`'s messages to `route` from now on.
    pub(crate) fn set_route(&self, id: ActorId, route: Route<M>) {
        if let Ok(mut routes) = self.shared.routes.write()
            && let Some(r) = routes.get_mut(id.0 as usize)
        {
            *r = route;
        }
    }

    /// Starts every actor of this process ([`Actor::start`]), in id order.
    pub(crate) fn start(&self) {
        // Count every Start before delivering any, so that the count cannot touch zero early.
        for _ in &self.local {
            self.shared.sent();
        }
        for (id, _) in &self.local {
            self.shared.deliver_local(*id, Envelope::Start);
        }
    }

    /// Delivers a message from an actor of process `from` to the local actor `to`.
    pub(crate) fn deliver_remote(&self, to: ActorId, msg: M, from: u16) -> Result<(), String> {
        match self.shared.route(to) {
            Some(Route::Local(peer)) => {
                self.shared.messages.fetch_add(1, Ordering::Relaxed);
                peer.cast(Envelope::Remote(msg, from))
                    .map_err(|_| format!("actor {} has stopped", to.0))
            }
            _ => Err(format!("a message for actor {}, which is not here", to.0)),
        }
    }

    /// Sends `msg` to actor `to` as the host (a notice such as a lost peer), counted as any
    /// message.
    pub(crate) fn send(&self, to: ActorId, msg: M) {
        self.shared.send_msg(to, msg);
    }

    /// Counts a message sent to process `node` by the host itself (a control message that
    /// the termination waves must see land, such as the coordinator's `Go`).
    pub(crate) fn shared_count_sent(&self, node: u16) {
        if let Some(c) = self.shared.sent_to.get(node as usize) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts a host message from process `node` as handled here.
    pub(crate) fn shared_count_handled(&self, node: u16) {
        if let Some(c) = self.shared.handled_from.get(node as usize) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// This process's message counts (see [`Counts`]).
    pub(crate) fn counts(&self) -> Counts {
        let s = &self.shared;
        let load = |v: &[AtomicU64]| v.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        Counts {
            local_in_flight: s.in_flight.load(Ordering::SeqCst),
            handled: s.handled.load(Ordering::SeqCst),
            sent_to: load(&s.sent_to),
            handled_from: load(&s.handled_from),
        }
    }

    /// The first error of the run here, if any.
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.shared.failed.load(Ordering::SeqCst) {
            return None;
        }
        let e = self
            .shared
            .errors
            .lock()
            .map(|e| e.join("; "))
            .unwrap_or_default();
        Some(if e.is_empty() { "a failure".into() } else { e })
    }

    /// Waits until something changes here (a message handled, a failure), or `at_most`.
    pub(crate) async fn changed(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.shared.wake.notified()).await;
    }

    /// The merged report of this process's actors (errors recorded here among its
    /// violations).
    pub(crate) async fn report(&self) -> Result<Report, LiveError> {
        let mut report = Report::default();
        for (id, r) in &self.local {
            let part = r
                .call(Envelope::Report, Some(Duration::from_secs(60)))
                .await
                .map_err(|e| LiveError::Actor(format!("actor {}: {e}", id.0)))?;
            let part = match part {
                ractor::rpc::CallResult::Success(p) => p,
                _ => return Err(LiveError::Actor(format!("actor {} did not report", id.0))),
            };
            report.merge(part);
        }
        if let Ok(e) = self.shared.errors.lock() {
            report.violations.extend(e.iter().cloned());
        }
        Ok(report)
    }

    /// Messages, payload bytes, bytes fetched, frame bytes and frames sent to other
    /// processes, so far; the last place (bytes read from other processes' memory) is the
    /// cluster layer's to fill.
    pub(crate) fn totals(&self) -> [u64; 6] {
        let s = &self.shared;
        [
            s.messages.load(Ordering::Relaxed),
            s.bytes.load(Ordering::Relaxed),
            s.fetched.load(Ordering::Relaxed),
            s.wire_bytes.load(Ordering::Relaxed),
            s.wire_frames.load(Ordering::Relaxed),
            0,
        ]
    }

    /// Stops every shell here and waits for them.
    pub(crate) async fn stop(self) {
        for (_, r) in &self.local {
            r.stop(None);
        }
        for j in self.joins {
            let _ = j.await;
        }
    }
}

/// Runs `actors` (ids 0, 1, ... in order) until no message is left in flight, for at most
/// `max_wall`. Like the sim host, it starts every actor first ([`Actor::start`]); a run whose
/// actors report violations, panic or lose a message is an error.
pub async fn run<M: Message>(
    actors: Vec<Box<dyn Actor<M>>>,
    seed: u64,
    max_wall: Duration,
) -> Result<LiveOutcome, LiveError> {
    let n = actors.len();
    let mut host = LocalHost::new(1, vec![Route::Gone; n], seed, None);
    for (i, actor) in actors.into_iter().enumerate() {
        host.add(ActorId(i as u32), actor).await?;
    }
    let started = Instant::now();
    host.start();
    let shared = Arc::clone(&host.shared);
    let over =
        || shared.in_flight.load(Ordering::SeqCst) == 0 || shared.failed.load(Ordering::SeqCst);
    let waited = tokio::time::timeout(max_wall, async {
        while !over() {
            shared.wake.notified().await;
        }
    })
    .await;
    let wall = started.elapsed();
    if waited.is_err() || host.failure().is_some() {
        let mut e = host.failure().into_iter().collect::<Vec<_>>();
        if waited.is_err() {
            e.insert(
                0,
                format!(
                    "the live run did not end within its wall-clock limit of {:.0} s",
                    max_wall.as_secs_f64()
                ),
            );
        }
        host.stop().await;
        return Err(LiveError::Actor(e.join("; ")));
    }
    let report = host.report().await;
    let totals = host.totals();
    host.stop().await;
    LiveOutcome::new(report?, wall, totals)
}

#[cfg(test)]
mod tests;
