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
//! too. Addressing stays abstract ([`ActorId`] to a mailbox), so actors could later live in
//! other processes under `ractor_cluster`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ractor::{Actor as RactorActor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::LiveError;
use crate::actor::{Actor, ActorId, Context, Message, Then, Work};
use crate::metrics::Report;
use crate::rng::{Stream, streams};
use crate::units::Nanos;

/// What a shell's mailbox carries.
pub enum Envelope<M> {
    /// The start of the run, for [`Actor::start`].
    Start,
    /// A message for the actor.
    Deliver(M),
    /// The actor's report, at the end of the run.
    Report(RpcReplyPort<Report>),
}

struct Shared<M> {
    started: Instant,
    peers: OnceLock<Vec<ActorRef<Envelope<M>>>>,
    /// Messages sent (or due on a timer) and not yet handled.
    in_flight: AtomicU64,
    /// An actor panicked or a message could not be delivered.
    failed: AtomicBool,
    wake: tokio::sync::Notify,
    messages: AtomicU64,
    bytes: AtomicU64,
    /// Bytes of `Work::Fetch`es (store loads).
    fetched: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl<M: Message> Shared<M> {
    fn now(&self) -> Nanos {
        Nanos(self.started.elapsed().as_nanos() as u64)
    }

    /// Records a failure and ends the run.
    fn error(&self, e: String) {
        if let Ok(mut v) = self.errors.lock() {
            v.push(e);
        }
        self.failed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Counts a message as in flight from now until its handler returns.
    fn sent(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// A message left flight (handled, or lost); wakes the host when none is left.
    fn landed(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake.notify_one();
        }
    }

    /// Puts `msg` into `to`'s mailbox; it must already be counted by [`Self::sent`].
    fn deliver(&self, to: ActorId, msg: Envelope<M>) {
        let Some(peer) = self.peers.get().and_then(|p| p.get(to.0 as usize)) else {
            self.error(format!("a message to unknown actor {}", to.0));
            self.landed();
            return;
        };
        self.messages.fetch_add(1, Ordering::Relaxed);
        if peer.cast(msg).is_err() {
            self.error(format!("actor {} has stopped", to.0));
            self.landed();
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
        self.shared.sent();
        self.shared.deliver(to, Envelope::Deliver(msg));
    }
    fn timer(&mut self, after: Nanos, msg: M) {
        let me = self.me;
        self.shared.sent();
        let shared = Arc::clone(self.shared);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_nanos(after.0)).await;
            shared.deliver(me, Envelope::Deliver(msg));
        });
    }
    fn start_then(&mut self, work: Work, then: Then<M>) {
        if let Work::Fetch { bytes, .. } = work {
            self.shared.fetched.fetch_add(bytes, Ordering::Relaxed);
        }
        match then {
            Then::Notify(done) => {
                self.shared.sent();
                self.shared.deliver(self.me, Envelope::Deliver(done));
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
        match msg {
            Envelope::Start | Envelope::Deliver(_) => {
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
                            Envelope::Deliver(m) => actor.handle(m, &mut ctx),
                            _ => actor.start(&mut ctx),
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
                shared.landed();
            }
            Envelope::Report(reply) => {
                let mut r = Report::default();
                st.actor.report(&mut r);
                // The host may have given up waiting; nothing to do then.
                let _ = reply.send(r);
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
}

/// Runs `actors` (ids 0, 1, ... in order) until no message is left in flight, for at most
/// `max_wall`. Like the sim host, it starts every actor first ([`Actor::start`]); a run whose
/// actors report violations, panic or lose a message is an error.
pub async fn run<M: Message>(
    actors: Vec<Box<dyn Actor<M>>>,
    seed: u64,
    max_wall: Duration,
) -> Result<LiveOutcome, LiveError> {
    let shared = Arc::new(Shared {
        started: Instant::now(),
        peers: OnceLock::new(),
        in_flight: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        wake: tokio::sync::Notify::new(),
        messages: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        fetched: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
    });
    let n = actors.len();
    let mut refs = Vec::with_capacity(n);
    let mut joins = Vec::with_capacity(n);
    for (i, actor) in actors.into_iter().enumerate() {
        let state = ShellState {
            actor,
            me: ActorId(i as u32),
            shared: Arc::clone(&shared),
            rng: Stream::new(seed, streams::ACTOR_BASE + i as u64),
        };
        let (r, j) = RactorActor::spawn(None, Shell(std::marker::PhantomData), state)
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))?;
        refs.push(r);
        joins.push(j);
    }
    let stop_all = |refs: &[ActorRef<Envelope<M>>]| {
        for r in refs {
            r.stop(None);
        }
    };
    if shared.peers.set(refs.clone()).is_err() {
        stop_all(&refs);
        return Err(LiveError::Actor("peers set twice".into()));
    }
    let started = Instant::now();
    // Count every Start before delivering any, so that the count cannot touch zero early.
    for _ in 0..n {
        shared.sent();
    }
    for i in 0..n {
        shared.deliver(ActorId(i as u32), Envelope::Start);
    }
    let over =
        || shared.in_flight.load(Ordering::SeqCst) == 0 || shared.failed.load(Ordering::SeqCst);
    let waited = tokio::time::timeout(max_wall, async {
        while !over() {
            shared.wake.notified().await;
        }
    })
    .await;
    let wall = started.elapsed();
    let errors = || shared.errors.lock().map(|e| e.clone()).unwrap_or_default();
    if waited.is_err() || shared.failed.load(Ordering::SeqCst) {
        stop_all(&refs);
        let mut e = errors();
        if waited.is_err() {
            e.insert(
                0,
                format!(
                    "the live run did not end within its wall-clock limit of {:.0} s",
                    max_wall.as_secs_f64()
                ),
            );
        }
        return Err(LiveError::Actor(e.join("; ")));
    }
    let mut report = Report::default();
    for r in &refs {
        let part = r
            .call(Envelope::Report, Some(Duration::from_secs(60)))
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))?;
        let part = match part {
            ractor::rpc::CallResult::Success(p) => p,
            _ => return Err(LiveError::Actor("an actor did not report".into())),
        };
        report.merge(part);
    }
    stop_all(&refs);
    for j in joins {
        let _ = j.await;
    }
    report.violations.extend(errors());
    if let Some(first) = report.violations.first() {
        return Err(LiveError::Actor(format!(
            "{first} ({} violation(s) in all)",
            report.violations.len()
        )));
    }
    Ok(LiveOutcome {
        report,
        wall,
        messages: shared.messages.load(Ordering::Relaxed),
        bytes: shared.bytes.load(Ordering::Relaxed),
        fetched: shared.fetched.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of the test actors.
    #[derive(Debug)]
    enum T {
        Ping,
        Done,
    }

    /// Records whether `T::Done` ever reached it.
    struct Sink {
        got: bool,
    }

    impl Actor<T> for Sink {
        fn handle(&mut self, msg: T, _ctx: &mut dyn Context<T>) {
            if matches!(msg, T::Done) {
                self.got = true;
            }
        }
        fn report(&self, report: &mut Report) {
            if !self.got {
                report.violations.push("the sink got nothing".into());
            }
        }
    }

    /// On `Ping`, works for a while, then sends `Done` to actor 0.
    struct Relay;

    impl Actor<T> for Relay {
        fn handle(&mut self, msg: T, ctx: &mut dyn Context<T>) {
            if matches!(msg, T::Ping) {
                std::thread::sleep(Duration::from_millis(50));
                ctx.send(ActorId(0), T::Done, 0);
            }
        }
        fn report(&self, _report: &mut Report) {}
    }

    /// At the start, sets a timer; then sends `Ping` to actor 1.
    struct Source;

    impl Actor<T> for Source {
        fn start(&mut self, ctx: &mut dyn Context<T>) {
            ctx.timer(Nanos::from_ms(5), T::Done);
        }
        fn handle(&mut self, msg: T, ctx: &mut dyn Context<T>) {
            if matches!(msg, T::Done) {
                ctx.send(ActorId(1), T::Ping, 0);
            }
        }
        fn report(&self, _report: &mut Report) {}
    }

    /// Panics at the start.
    struct Faulty;

    impl Actor<T> for Faulty {
        fn start(&mut self, _ctx: &mut dyn Context<T>) {
            panic!("boom");
        }
        fn handle(&mut self, _msg: T, _ctx: &mut dyn Context<T>) {}
        fn report(&self, _report: &mut Report) {}
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_ends_only_when_no_message_is_in_flight() {
        for _ in 0..5 {
            let actors: Vec<Box<dyn Actor<T>>> = vec![
                Box::new(Sink { got: false }),
                Box::new(Relay),
                Box::new(Source),
            ];
            let out = run(actors, 1, Duration::from_secs(30)).await.unwrap();
            // Start x3, the timer, Ping, Done.
            assert_eq!(out.messages, 6);
            assert!(out.wall >= Duration::from_millis(50));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_actor_ends_the_run_at_once_with_its_message() {
        // Actor 0 keeps a long timer in flight; the panic must not wait for it.
        struct Waiter;
        impl Actor<T> for Waiter {
            fn start(&mut self, ctx: &mut dyn Context<T>) {
                ctx.timer(Nanos::from_secs(20), T::Done);
            }
            fn handle(&mut self, _msg: T, _ctx: &mut dyn Context<T>) {}
            fn report(&self, _report: &mut Report) {}
        }
        let started = Instant::now();
        let actors: Vec<Box<dyn Actor<T>>> = vec![Box::new(Waiter), Box::new(Faulty)];
        let err = run(actors, 1, Duration::from_secs(60)).await.unwrap_err();
        assert!(err.to_string().contains("actor 1 panicked: boom"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
