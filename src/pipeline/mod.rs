//! Pipeline routes with a per-node generation cache, as actors (DESIGN, "The two systems it
//! models", 1).
//!
//! A model's layers are split into contiguous ranges, one per [`ShardNode`]; a [`Head`] plays
//! the client and the route's head: it receives the requests of a trace, runs at most
//! `max_active` route sessions at once (the rest wait in a bounded queue), and drives each one
//! with greedy decoding:
//!
//! ```text
//!   Head ──Step(prefill: token ids)──► shard 0 ──Step(activation [1, n, hidden])──► shard 1 … ─┐
//!    ▲                                                                                        │
//!    └──────────────── Reply(Token) from the tail, or Reply(CacheMiss) from any shard ◄───────┘
//! ```
//!
//! Step 0 of a session is a **prefill** of the whole prompt; each later step is a **decode**
//! that carries only the newest token (and, between shards, its `[1, 1, hidden]` activation)
//! with the sequence length. In **stateless** mode every step is a full pass over the
//! sequence so far. A shard that lacks the session's cache state answers a cache miss and the
//! head re-prefills the sequence so far under the same session id (counted as the request's
//! `preemptions`: the recompute a miss forces, like vLLM's recompute preemption).
//!
//! Each shard handles one step at a time: it asks its [`crate::backend::ModelBackend`] to run
//! the step (which, under the sim backend, returns the modelled duration, analytic or from a
//! measured profile), then occupies its device for that long ([`Work::Compute`]) before it
//! sends the result on. Steps that arrive meanwhile wait in the shard's FIFO queue, whose
//! length is bounded by the head's `max_active` (a session has at most one step in flight).
//! Pipelining comes from different sessions occupying different shards at the same time.
//!
//! These actors are sans-IO: the same code runs on the simulator ([`crate::sim::host`]) with
//! [`crate::backend::SimBackend`] and on the live host ([`crate::live::host`]) with
//! [`crate::backend::CandleBackend`], ractor actors and the wall clock.
//!
//! Fault injection: a [`RestartAt`] makes the head send [`Msg::Restart`] to a shard once a
//! request has generated a given number of tokens; the shard drops every session state (a
//! restarted process with its weights still loaded), and the next decode step misses.

pub mod compare;
pub mod run;
pub mod scenario;

use std::collections::{BTreeMap, VecDeque};

use crate::actor::{Actor, Context, Msg, Work};
use crate::backend::TOKEN_ID_BYTES;
use crate::metrics::{Report, RequestRecord};
use crate::serving::block_pool::PoolStats;
use crate::serving::instance::InstanceStats;
use crate::shard::{DecodeMode, Generation, Mode, SessionId, Shard, ShardReply, ShardRequest};
use crate::sim::kernel::ActorId;
use crate::units::Nanos;
use crate::workload::ReqId;

/// Bytes of a cache-miss reply on the wire (session id and layer range).
pub const MISS_REPLY_BYTES: u64 = 24;

/// One request of a pipeline trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineRequest {
    pub arrival: Nanos,
    pub prompt: Vec<u32>,
    pub output_tokens: u32,
}

/// Restart shard `shard` once request `request` has generated `after_tokens` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartAt {
    pub request: u32,
    pub after_tokens: u32,
    pub shard: usize,
}

/// How the head runs its sessions.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadConfig {
    pub mode: DecodeMode,
    /// Sessions generating at once.
    pub max_active: usize,
    /// Requests waiting for a session slot; an arrival beyond it is rejected.
    pub max_waiting: usize,
    /// Closed loop: `max_active` clients, each sending its next request when its previous one
    /// ends; the trace's arrival times are ignored.
    pub closed_loop: bool,
    pub restarts: Vec<RestartAt>,
}

/// What a session's step in flight is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// A pass over the whole sequence: the first (prefill or stateless), a later stateless
    /// one, or a re-prefill after a cache miss.
    Full,
    Decode,
}

struct Active {
    g: Generation,
    phase: Phase,
    target: u32,
}

/// The client and head of a pipeline route. See the module doc.
pub struct Head {
    cfg: HeadConfig,
    shards: Vec<ActorId>,
    trace: Vec<PipelineRequest>,
    records: Vec<RequestRecord>,
    active: BTreeMap<u64, Active>,
    waiting: VecDeque<u32>,
    arrived: usize,
    outputs: Vec<(u32, Vec<u32>)>,
    violations: Vec<String>,
}

impl Head {
    /// A head for `trace` (sorted by arrival) on the route `shards` (head shard first).
    pub fn new(cfg: HeadConfig, shards: Vec<ActorId>, trace: Vec<PipelineRequest>) -> Head {
        let records = trace
            .iter()
            .enumerate()
            .map(|(i, r)| RequestRecord {
                instance: 0,
                ..RequestRecord::arrived(i as u32, r.arrival, r.prompt.len() as u32)
            })
            .collect();
        Head {
            cfg,
            shards,
            trace,
            records,
            active: BTreeMap::new(),
            waiting: VecDeque::new(),
            arrived: 0,
            outputs: Vec::new(),
            violations: Vec::new(),
        }
    }

    fn schedule_next_arrival(&mut self, ctx: &mut dyn Context) {
        if self.cfg.closed_loop {
            return;
        }
        if let Some(r) = self.trace.get(self.arrived) {
            let after = r.arrival.saturating_sub(ctx.now());
            ctx.timer(after, Msg::Arrival(ReqId(self.arrived as u32)));
        }
    }

    fn arrive(&mut self, id: u32, ctx: &mut dyn Context) {
        self.arrived += 1;
        // When the request really arrives: the trace's time on the sim host (timers are
        // exact), a little later on the live host (tokio timers fire up to ~1 ms late), and
        // the end of the client's previous request in a closed loop.
        self.records[id as usize].arrival = ctx.now();
        self.schedule_next_arrival(ctx);
        if self.active.len() < self.cfg.max_active {
            self.begin(id, ctx);
        } else if self.waiting.len() < self.cfg.max_waiting {
            self.waiting.push_back(id);
        } else {
            self.records[id as usize].rejected = true;
        }
    }

    fn begin(&mut self, id: u32, ctx: &mut dyn Context) {
        let r = &self.trace[id as usize];
        let g = match Generation::new(SessionId(id as u64), r.prompt.clone(), self.cfg.mode) {
            Ok(g) => g,
            Err(e) => {
                self.violations.push(format!("request {id}: {e}"));
                return;
            }
        };
        self.records[id as usize].admitted = Some(ctx.now());
        let req = g.full_request(g.first_mode());
        let a = Active {
            g,
            phase: Phase::Full,
            target: r.output_tokens.max(1),
        };
        self.active.insert(id as u64, a);
        self.send_step(id, req, ctx);
    }

    fn send_step(&mut self, id: u32, req: ShardRequest, ctx: &mut dyn Context) {
        let bytes = req.input.bytes();
        self.records[id as usize].network_bytes += bytes;
        ctx.send(self.shards[0], Msg::Step(Box::new(req)), bytes);
    }

    fn reply(&mut self, reply: ShardReply, ctx: &mut dyn Context) {
        let (session, outcome) = match reply {
            ShardReply::Token { session, token, .. } => (session, Ok(Some(token))),
            ShardReply::CacheMiss { session, .. } => (session, Ok(None)),
            ShardReply::Failed { session, error } => (session, Err(error)),
            ShardReply::Forward(req) => (
                req.session,
                Err("the tail forwarded an activation to the head".into()),
            ),
        };
        let id = session.0 as u32;
        let Some(mut a) = self.active.remove(&session.0) else {
            self.violations.push(format!(
                "a reply for session {} that is not running",
                session.0
            ));
            return;
        };
        let token = match outcome {
            Ok(t) => t,
            Err(e) => {
                self.violations.push(format!("request {id}: {e}"));
                self.admit_waiting(ctx);
                return;
            }
        };
        let now = ctx.now();
        let next = match (token, a.phase) {
            (None, Phase::Decode) => {
                // Re-prefill the sequence so far under the same session id.
                a.phase = Phase::Full;
                self.records[id as usize].preemptions += 1;
                a.g.full_request(Mode::Prefill)
            }
            (None, Phase::Full) => {
                self.violations
                    .push(format!("request {id}: a full pass answered a cache miss"));
                self.admit_waiting(ctx);
                return;
            }
            (Some(t), _) => {
                a.g.push(t, None, 0);
                let rec = &mut self.records[id as usize];
                rec.network_bytes += TOKEN_ID_BYTES;
                rec.output_tokens = a.g.output().len() as u32;
                if rec.first_token.is_none() {
                    rec.first_token = Some(now);
                }
                let generated = rec.output_tokens;
                if generated >= a.target {
                    rec.end = Some(now);
                    self.outputs.push((id, a.g.output().to_vec()));
                    self.admit_waiting(ctx);
                    return;
                }
                self.inject_restarts(id, generated, ctx);
                match a.g.mode {
                    DecodeMode::Cached => {
                        a.phase = Phase::Decode;
                        match a.g.decode_request() {
                            Ok(r) => r,
                            Err(e) => {
                                self.violations.push(format!("request {id}: {e}"));
                                return;
                            }
                        }
                    }
                    DecodeMode::Stateless => {
                        a.phase = Phase::Full;
                        a.g.full_request(Mode::Stateless)
                    }
                }
            }
        };
        self.active.insert(session.0, a);
        self.send_step(id, next, ctx);
    }

    fn inject_restarts(&mut self, id: u32, generated: u32, ctx: &mut dyn Context) {
        for r in &self.cfg.restarts {
            if r.request == id && r.after_tokens == generated {
                ctx.send(self.shards[r.shard], Msg::Restart, 0);
            }
        }
    }

    fn admit_waiting(&mut self, ctx: &mut dyn Context) {
        if self.cfg.closed_loop {
            // The client whose request ended sends its next one now.
            while self.active.len() < self.cfg.max_active && self.arrived < self.trace.len() {
                let id = self.arrived as u32;
                self.arrive(id, ctx);
            }
            return;
        }
        while self.active.len() < self.cfg.max_active {
            match self.waiting.pop_front() {
                Some(id) => self.begin(id, ctx),
                None => break,
            }
        }
    }
}

impl Actor for Head {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
        match msg {
            Msg::Start if self.cfg.closed_loop => self.admit_waiting(ctx),
            Msg::Start => self.schedule_next_arrival(ctx),
            Msg::Arrival(ReqId(id)) => self.arrive(id, ctx),
            Msg::Reply(r) => self.reply(*r, ctx),
            other => self
                .violations
                .push(format!("the pipeline head got {other:?}")),
        }
    }

    fn report(&self, report: &mut Report) {
        report.records.extend(self.records.iter().cloned());
        let mut outputs = self.outputs.clone();
        outputs.sort();
        report.outputs.extend(outputs);
        report.violations.extend(self.violations.iter().cloned());
        if !self.active.is_empty() || !self.waiting.is_empty() {
            report.violations.push(format!(
                "the pipeline head ended with {} sessions running and {} waiting",
                self.active.len(),
                self.waiting.len()
            ));
        }
    }
}

/// One pipeline shard as an actor: a [`Shard`] state machine, a FIFO of waiting steps, and
/// where its results go. See the module doc.
pub struct ShardNode {
    shard: Shard,
    index: usize,
    /// The next shard, or `None` for the tail.
    next: Option<ActorId>,
    head: ActorId,
    queue: VecDeque<ShardRequest>,
    max_queue: usize,
    /// The answer of the step in progress, sent when its work ends.
    busy: Option<ShardReply>,
    busy_since: Nanos,
    /// The modelled duration of the step in progress (none on the live host, whose steps
    /// have run by the time the work starts).
    busy_for: Option<Nanos>,
    busy_total: Nanos,
    steps: u64,
    violations: Vec<String>,
}

impl ShardNode {
    /// Shard number `index` of a route, sending activations to `next` (none for the tail)
    /// and tokens and misses to `head`, with at most `max_queue` steps waiting.
    pub fn new(
        shard: Shard,
        index: usize,
        next: Option<ActorId>,
        head: ActorId,
        max_queue: usize,
    ) -> ShardNode {
        ShardNode {
            shard,
            index,
            next,
            head,
            queue: VecDeque::new(),
            max_queue,
            busy: None,
            busy_since: Nanos::ZERO,
            busy_for: None,
            busy_total: Nanos::ZERO,
            steps: 0,
            violations: Vec::new(),
        }
    }

    fn process(&mut self, req: ShardRequest, ctx: &mut dyn Context) {
        let now = ctx.now();
        let session = req.session;
        let (reply, duration) = match self.shard.handle(now, req) {
            Ok(h) => (h.reply, h.duration),
            Err(e) => (
                ShardReply::Failed {
                    session,
                    error: format!("shard {}: {e}", self.index),
                },
                None,
            ),
        };
        self.steps += 1;
        self.busy = Some(reply);
        self.busy_since = now;
        self.busy_for = duration;
        ctx.start(
            Work::Compute(duration.unwrap_or(Nanos::ZERO)),
            Msg::WorkDone,
        );
    }

    fn finish(&mut self, ctx: &mut dyn Context) {
        let Some(reply) = self.busy.take() else {
            self.violations
                .push(format!("shard {}: work ended while idle", self.index));
            return;
        };
        // Busy for the step's own duration: not the time it waited for a shared device.
        // Live steps ran inside `process`, so their wall time since then is the measure.
        self.busy_total += self.busy_for.unwrap_or(ctx.now() - self.busy_since);
        match (reply, self.next) {
            (ShardReply::Forward(req), Some(next)) => {
                let bytes = req.input.bytes();
                ctx.send(next, Msg::Step(Box::new(req)), bytes);
            }
            (r @ ShardReply::Token { .. }, _) => ctx.send(self.head, Msg::Reply(Box::new(r)), 4),
            (r @ ShardReply::CacheMiss { .. }, _) => {
                ctx.send(self.head, Msg::Reply(Box::new(r)), MISS_REPLY_BYTES)
            }
            (r, _) => {
                let bytes = match &r {
                    ShardReply::Failed { error, .. } => error.len() as u64,
                    _ => 0,
                };
                ctx.send(self.head, Msg::Reply(Box::new(r)), bytes)
            }
        }
        if let Some(req) = self.queue.pop_front() {
            self.process(req, ctx);
        }
    }
}

impl Actor for ShardNode {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
        match msg {
            Msg::Start => {}
            Msg::Step(req) => {
                if self.busy.is_none() {
                    self.process(*req, ctx);
                } else if self.queue.len() < self.max_queue {
                    self.queue.push_back(*req);
                } else {
                    let session = req.session;
                    self.violations.push(format!(
                        "shard {}: more than {} steps waiting",
                        self.index, self.max_queue
                    ));
                    let error = format!("shard {}: queue full", self.index);
                    let r = ShardReply::Failed { session, error };
                    ctx.send(self.head, Msg::Reply(Box::new(r)), 0);
                }
            }
            Msg::WorkDone => self.finish(ctx),
            Msg::Restart => self.shard.restart(),
            other => self
                .violations
                .push(format!("shard {} got {other:?}", self.index)),
        }
    }

    fn report(&self, report: &mut Report) {
        let s = self.shard.stats();
        report.instances.push(InstanceStats {
            iterations: self.steps,
            busy: self.busy_total,
            preemptions: s.cache_misses,
            rejected: 0,
            pool: PoolStats {
                evictions: self.shard.cache().evictions(),
                hit_blocks: 0,
            },
        });
        report.violations.extend(self.violations.iter().cloned());
    }
}
