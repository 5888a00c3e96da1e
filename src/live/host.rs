//! The live host for any set of sans-IO actors: each [`Actor`] runs inside one ractor actor on
//! tokio, effects are performed for real, and time is the wall clock.
//!
//! It is the counterpart of [`crate::sim::host::SimHost`], with the same numbering (actors get
//! ids 0, 1, ... in the order given) and the same [`Report`] at the end. For each effect an
//! actor asks for through its [`Context`]:
//!
//! * `now`: nanoseconds of wall time since the run started;
//! * `send` / `send_after`: the message goes into the target's ractor mailbox (after the
//!   delay, on a tokio timer); actors share one process, so the payload size is only counted;
//! * `timer`: a tokio timer that delivers the message to the actor itself;
//! * `start(Work::Compute(_))`: the work has already run for real inside the handler (a
//!   candle forward pass takes its wall time there), so `done` is delivered at once;
//!   other kinds of work (batches, fetches, SSD) have no live implementation yet and are
//!   reported as violations;
//! * `rng`: the actor's own ChaCha8 stream, numbered as on the sim host.
//!
//! A handler runs on a tokio worker thread inside `block_in_place` (on a multi-threaded
//! runtime), so CPU-bound model work does not starve the runtime; each actor handles one
//! message at a time, in mailbox order.
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
use crate::actor::{Actor, Context, Msg, Work};
use crate::metrics::Report;
use crate::rng::{Stream, streams};
use crate::sim::kernel::ActorId;
use crate::units::Nanos;

/// What a shell's mailbox carries.
pub enum Envelope {
    /// A message for the actor.
    Deliver(Msg),
    /// The actor's report, at the end of the run.
    Report(RpcReplyPort<Report>),
}

struct Shared {
    started: Instant,
    peers: OnceLock<Vec<ActorRef<Envelope>>>,
    /// Messages sent (or due on a timer) and not yet handled.
    in_flight: AtomicU64,
    /// An actor panicked or a message could not be delivered.
    failed: AtomicBool,
    wake: tokio::sync::Notify,
    messages: AtomicU64,
    bytes: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Shared {
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
    fn deliver(&self, to: ActorId, msg: Msg) {
        let Some(peer) = self.peers.get().and_then(|p| p.get(to.0 as usize)) else {
            self.error(format!("a message to unknown actor {}", to.0));
            self.landed();
            return;
        };
        self.messages.fetch_add(1, Ordering::Relaxed);
        if peer.cast(Envelope::Deliver(msg)).is_err() {
            self.error(format!("actor {} has stopped", to.0));
            self.landed();
        }
    }
}

struct LiveCtx<'a> {
    shared: &'a Arc<Shared>,
    me: ActorId,
    rng: &'a mut Stream,
}

impl Context for LiveCtx<'_> {
    fn now(&self) -> Nanos {
        self.shared.now()
    }
    fn me(&self) -> ActorId {
        self.me
    }
    fn send_after(&mut self, delay: Nanos, to: ActorId, msg: Msg, payload_bytes: u64) {
        self.shared
            .bytes
            .fetch_add(payload_bytes, Ordering::Relaxed);
        self.shared.sent();
        if delay == Nanos::ZERO {
            self.shared.deliver(to, msg);
        } else {
            let shared = Arc::clone(self.shared);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_nanos(delay.0)).await;
                shared.deliver(to, msg);
            });
        }
    }
    fn timer(&mut self, after: Nanos, msg: Msg) {
        let me = self.me;
        self.send_after(after, me, msg, 0);
    }
    fn start(&mut self, work: Work, done: Msg) {
        if !matches!(work, Work::Compute(_)) {
            self.shared.error(format!(
                "actor {}: {work:?} cannot run on the live host",
                self.me.0
            ));
        }
        self.shared.sent();
        self.shared.deliver(self.me, done);
    }
    fn rng(&mut self) -> &mut Stream {
        self.rng
    }
}

struct Shell;

struct ShellState {
    actor: Box<dyn Actor>,
    me: ActorId,
    shared: Arc<Shared>,
    rng: Stream,
}

impl RactorActor for Shell {
    type Msg = Envelope;
    type State = ShellState;
    type Arguments = ShellState;

    async fn pre_start(
        &self,
        _myself: ActorRef<Envelope>,
        state: ShellState,
    ) -> Result<ShellState, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Envelope>,
        msg: Envelope,
        st: &mut ShellState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            Envelope::Deliver(msg) => {
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
                        actor.handle(msg, &mut ctx);
                    }))
                });
                if let Err(panic) = handled {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    shared.error(format!("actor {} panicked: {what}", me.0));
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
}

/// Runs `actors` (ids 0, 1, ... in order) until no message is left in flight, for at most
/// `max_wall`. Like the sim host, it sends [`Msg::Start`] to every actor first; a run whose
/// actors report violations, panic or lose a message is an error.
pub async fn run(
    actors: Vec<Box<dyn Actor>>,
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
        let (r, j) = RactorActor::spawn(None, Shell, state)
            .await
            .map_err(|e| LiveError::Actor(e.to_string()))?;
        refs.push(r);
        joins.push(j);
    }
    let stop_all = |refs: &[ActorRef<Envelope>]| {
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
        shared.deliver(ActorId(i as u32), Msg::Start);
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
        report.records.extend(part.records);
        report.instances.extend(part.instances);
        report.violations.extend(part.violations);
        report.outputs.extend(part.outputs);
        if part.store.is_some() {
            report.store = part.store;
        }
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records whether `Msg::WorkDone` ever reached it.
    struct Sink {
        got: bool,
    }

    impl Actor for Sink {
        fn handle(&mut self, msg: Msg, _ctx: &mut dyn Context) {
            if matches!(msg, Msg::WorkDone) {
                self.got = true;
            }
        }
        fn report(&self, report: &mut Report) {
            if !self.got {
                report.violations.push("the sink got nothing".into());
            }
        }
    }

    /// On `Restart`, works for a while, then sends `WorkDone` to actor 0.
    struct Relay;

    impl Actor for Relay {
        fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
            if matches!(msg, Msg::Restart) {
                std::thread::sleep(Duration::from_millis(50));
                ctx.send(ActorId(0), Msg::WorkDone, 0);
            }
        }
        fn report(&self, _report: &mut Report) {}
    }

    /// On `Start`, sends `Restart` to actor 1 after a timer.
    struct Source;

    impl Actor for Source {
        fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
            match msg {
                Msg::Start => ctx.timer(Nanos::from_ms(5), Msg::WorkDone),
                Msg::WorkDone => ctx.send(ActorId(1), Msg::Restart, 0),
                _ => {}
            }
        }
        fn report(&self, _report: &mut Report) {}
    }

    /// Panics on `Start`.
    struct Faulty;

    impl Actor for Faulty {
        fn handle(&mut self, msg: Msg, _ctx: &mut dyn Context) {
            if matches!(msg, Msg::Start) {
                panic!("boom");
            }
        }
        fn report(&self, _report: &mut Report) {}
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_ends_only_when_no_message_is_in_flight() {
        for _ in 0..5 {
            let actors: Vec<Box<dyn Actor>> = vec![
                Box::new(Sink { got: false }),
                Box::new(Relay),
                Box::new(Source),
            ];
            let out = run(actors, 1, Duration::from_secs(30)).await.unwrap();
            // Start x3, the timer, Restart, WorkDone.
            assert_eq!(out.messages, 6);
            assert!(out.wall >= Duration::from_millis(50));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_actor_ends_the_run_at_once_with_its_message() {
        // Actor 0 keeps a long timer in flight; the panic must not wait for it.
        struct Waiter;
        impl Actor for Waiter {
            fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
                if matches!(msg, Msg::Start) {
                    ctx.timer(Nanos::from_secs(20), Msg::WorkDone);
                }
            }
            fn report(&self, _report: &mut Report) {}
        }
        let started = Instant::now();
        let actors: Vec<Box<dyn Actor>> = vec![Box::new(Waiter), Box::new(Faulty)];
        let err = run(actors, 1, Duration::from_secs(60)).await.unwrap_err();
        assert!(err.to_string().contains("actor 1 panicked: boom"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
