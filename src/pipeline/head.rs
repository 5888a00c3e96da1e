//! The head of a pipeline route: client and route head in one actor (see the module doc of
//! [`crate::pipeline`]).

use std::collections::{BTreeMap, VecDeque};

use super::shard::{DecodeMode, Generation, Mode, SessionId, ShardReply, ShardRequest};
use super::{HeadConfig, Msg, PipelineRequest};
use crate::actor::{Actor, ActorId, Context};
use crate::backend::TOKEN_ID_BYTES;
use crate::metrics::{Report, RequestRecord};
use crate::workload::ReqId;

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

/// The pass a session is on: its steps carry it, and a reply to an older pass is stale.
type Attempt = u32;

/// The client and head of a pipeline route. See the module doc.
pub struct Head {
    cfg: HeadConfig,
    shards: Vec<ActorId>,
    trace: Vec<PipelineRequest>,
    records: Vec<RequestRecord>,
    active: BTreeMap<u64, Active>,
    /// Each request's current pass (0 until a shard is lost while it runs).
    attempts: Vec<Attempt>,
    /// Sessions started over after a shard was lost.
    restarted: u64,
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
            attempts: vec![0; trace.len()],
            restarted: 0,
            trace,
            records,
            active: BTreeMap::new(),
            waiting: VecDeque::new(),
            arrived: 0,
            outputs: Vec::new(),
            violations: Vec::new(),
        }
    }

    fn schedule_next_arrival(&mut self, ctx: &mut dyn Context<Msg>) {
        if self.cfg.closed_loop {
            return;
        }
        if let Some(r) = self.trace.get(self.arrived) {
            let after = r.arrival.saturating_sub(ctx.now());
            ctx.timer(after, Msg::Arrival(ReqId(self.arrived as u32)));
        }
    }

    fn arrive(&mut self, id: u32, ctx: &mut dyn Context<Msg>) {
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

    fn begin(&mut self, id: u32, ctx: &mut dyn Context<Msg>) {
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

    fn send_step(&mut self, id: u32, mut req: ShardRequest, ctx: &mut dyn Context<Msg>) {
        req.attempt = self.attempts[id as usize];
        let bytes = req.input.bytes();
        self.records[id as usize].network_bytes += bytes;
        ctx.send(self.shards[0], Msg::Step(Box::new(req)), bytes);
    }

    fn reply(&mut self, reply: ShardReply, attempt: Attempt, ctx: &mut dyn Context<Msg>) {
        let session = match &reply {
            ShardReply::Token { session, .. }
            | ShardReply::CacheMiss { session, .. }
            | ShardReply::Failed { session, .. } => *session,
            ShardReply::Forward(req) => req.session,
        };
        match self.attempts.get(session.0 as usize) {
            Some(&current) if attempt < current => {
                // The answer to a step sent before the session was started over: dropped.
                return;
            }
            Some(&current) if attempt == current => {}
            _ => {
                self.violations.push(format!(
                    "a reply for pass {attempt} of session {}, which is not running it",
                    session.0
                ));
                return;
            }
        }
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

    fn inject_restarts(&mut self, id: u32, generated: u32, ctx: &mut dyn Context<Msg>) {
        for r in &self.cfg.restarts {
            if r.request == id && r.after_tokens == generated {
                ctx.send(self.shards[r.shard], Msg::Restart, 0);
            }
        }
    }

    /// A shard was lost with whatever it held and computed: every running session starts
    /// over with a full pass under the same session id (a re-prefill, as after a cache miss,
    /// counted as a preemption), on its next attempt, so that replies to its earlier steps are
    /// told apart and dropped.
    fn lost(&mut self, actor: ActorId, ctx: &mut dyn Context<Msg>) {
        if !self.shards.contains(&actor) {
            return;
        }
        let ids: Vec<u64> = self.active.keys().copied().collect();
        for id in ids {
            let Some(a) = self.active.get_mut(&id) else {
                continue;
            };
            a.phase = Phase::Full;
            let req = a.g.full_request(a.g.first_mode());
            self.attempts[id as usize] += 1;
            self.records[id as usize].preemptions += 1;
            self.restarted += 1;
            self.send_step(id as u32, req, ctx);
        }
    }

    fn admit_waiting(&mut self, ctx: &mut dyn Context<Msg>) {
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

impl Actor<Msg> for Head {
    fn start(&mut self, ctx: &mut dyn Context<Msg>) {
        if self.cfg.closed_loop {
            self.admit_waiting(ctx)
        } else {
            self.schedule_next_arrival(ctx)
        }
    }

    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        match msg {
            Msg::Arrival(ReqId(id)) => self.arrive(id, ctx),
            Msg::Reply { reply, attempt } => self.reply(*reply, attempt, ctx),
            Msg::Lost(actor) => self.lost(actor, ctx),
            other => self
                .violations
                .push(format!("the pipeline head got {other:?}")),
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.active.len() > self.cfg.max_active || self.waiting.len() > self.cfg.max_waiting {
            return Err(format!(
                "the pipeline head runs {} sessions (at most {}) with {} waiting (at most {})",
                self.active.len(),
                self.cfg.max_active,
                self.waiting.len(),
                self.cfg.max_waiting
            ));
        }
        Ok(())
    }

    fn report(&mut self, report: &mut Report) {
        report.records.extend(self.records.iter().cloned());
        report.failovers += self.restarted;
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
