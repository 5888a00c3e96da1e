//! The router: the clients' side of the system. It releases the trace's requests at their
//! arrival times, assigns each to a serving instance, and records what happens to it.
//!
//! Assignment strategies: `round-robin` cycles through the instances; `least-loaded` picks the
//! instance with the fewest requests the router has sent it that are not yet finished (ties go
//! to the lowest index); `kv-aware` weighs the prompt blocks each instance would have to
//! prefill against its load ([`super::kv_routing`]). The router only knows what it has been told by messages, as a real
//! router would. Arrivals are chained timers (one pending at a time), so the event queue
//! holds the requests in flight, not the whole trace.
//!
//! Faults: when told that a node is down ([`Msg::NodeDown`]), the router stops sending to the
//! node's instances and fails their requests over: a request that has not streamed a token yet
//! is sent to a live instance (chosen as any other, and counted in `Report::failovers`); one
//! that has is failed with the reason, as is any request when no live instance is left.
//! Messages that a crashed instance sent before it crashed are ignored when they arrive.

use std::sync::Arc;

use super::Msg;
use super::kv_routing::KvRouting;
use super::prompt_hashes::PromptHashes;
use crate::actor::{Actor, ActorId, Context, unexpected};
use crate::metrics::{Report, RequestRecord};
use crate::workload::{ReqId, Trace};

/// How the router picks an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterStrategy {
    RoundRobin,
    LeastLoaded,
    KvAware,
}

/// Bytes per token id on the wire.
pub const TOKEN_ID_BYTES: u64 = 4;

pub struct Router {
    trace: Arc<Trace>,
    instances: Vec<ActorId>,
    strategy: RouterStrategy,
    next_rr: usize,
    outstanding: Vec<u32>,
    records: Vec<RequestRecord>,
    /// Unexpected messages (errors are values).
    violations: Vec<String>,
    /// Requests sent to an instance and not yet finished or rejected.
    in_flight: u64,
    /// The node of each instance, and whether it is alive.
    nodes: Vec<u32>,
    alive: Vec<bool>,
    failovers: u64,
    /// What the router knows of each instance's KV cache (`kv-aware` only).
    kv: Option<KvRouting>,
    /// The prompts' block hashes (`kv-aware` only; a memo shared by the actors).
    hashes: Option<Arc<PromptHashes>>,
}

impl Router {
    /// A router over `instances`, running on `nodes` (one per instance).
    pub fn new(
        trace: Arc<Trace>,
        instances: Vec<ActorId>,
        nodes: Vec<u32>,
        strategy: RouterStrategy,
    ) -> Router {
        let records = trace
            .ids()
            .map(|id| {
                let r = trace.request(id);
                RequestRecord::new(id.0, r.arrival, r.prompt_tokens, r.output_tokens)
            })
            .collect();
        Router {
            outstanding: vec![0; instances.len()],
            trace,
            instances,
            strategy,
            next_rr: 0,
            records,
            violations: Vec::new(),
            in_flight: 0,
            alive: vec![true; nodes.len()],
            nodes,
            failovers: 0,
            kv: None,
            hashes: None,
        }
    }

    /// Routes by [`KvRouting`]'s score (the strategy must be `kv-aware`).
    pub fn with_kv(mut self, kv: KvRouting) -> Router {
        self.kv = Some(kv);
        self
    }

    /// Takes the prompts' block hashes from `hashes` (shared with the other actors).
    pub fn with_prompt_hashes(mut self, hashes: Arc<PromptHashes>) -> Router {
        self.hashes = Some(hashes);
        self
    }

    fn schedule_arrival(&self, next: u32, ctx: &mut dyn Context<Msg>) {
        if let Some(r) = self.trace.requests.get(next as usize) {
            ctx.timer(r.arrival - ctx.now(), Msg::Arrival(ReqId(next)));
        }
    }

    /// The instance for `req`, among the live ones; `None` when none is left.
    fn pick(&mut self, req: ReqId) -> Option<usize> {
        let n = self.instances.len();
        match self.strategy {
            RouterStrategy::KvAware if self.kv.is_some() => {
                let kv = self.kv.as_mut().expect("checked");
                let mut hashes = Vec::new();
                let block_size = kv.block_size() as usize;
                match &self.hashes {
                    Some(memo) => memo.block_hashes(req, block_size, &mut hashes),
                    None => self.trace.block_hashes(req, block_size, &mut hashes),
                }
                kv.pick(hashes, &self.alive)
            }
            RouterStrategy::RoundRobin => {
                // Bounded: at most one round over the instances.
                for _ in 0..n {
                    let i = self.next_rr;
                    self.next_rr = (i + 1) % n;
                    if self.alive[i] {
                        return Some(i);
                    }
                }
                None
            }
            RouterStrategy::LeastLoaded | RouterStrategy::KvAware => self
                .outstanding
                .iter()
                .enumerate()
                .filter(|&(i, _)| self.alive[i])
                .min_by_key(|&(i, &n)| (n, i))
                .map(|(i, _)| i),
        }
    }

    /// Sends `req` to a live instance, or fails it with `reason` when none is left.
    fn dispatch(&mut self, req: ReqId, reason: &str, ctx: &mut dyn Context<Msg>) {
        let Some(i) = self.pick(req) else {
            self.records[req.0 as usize].failed = Some(reason.to_string());
            return;
        };
        let record = &mut self.records[req.0 as usize];
        if let Some(kv) = &mut self.kv {
            kv.sent(i, kv.blocks(record.prompt_tokens, record.output_tokens));
        }
        self.outstanding[i] += 1;
        self.in_flight += 1;
        record.instance = i as u32;
        let bytes = TOKEN_ID_BYTES * record.prompt_tokens as u64;
        record.network_bytes += bytes;
        ctx.send(self.instances[i], Msg::Submit(req), bytes);
    }

    /// Node `node` is down: its instances take no more requests, and theirs fail over.
    fn node_down(&mut self, node: u32, ctx: &mut dyn Context<Msg>) {
        let mut moved = Vec::new();
        for i in 0..self.instances.len() {
            if self.nodes[i] != node || !self.alive[i] {
                continue;
            }
            self.alive[i] = false;
            if let Some(kv) = &mut self.kv {
                kv.lost(i);
            }
            // Bounded by the trace: the records of the instance's requests in flight.
            for r in &self.records {
                let in_flight = r.end.is_none() && !r.rejected && r.failed.is_none();
                if r.instance == i as u32 && in_flight {
                    moved.push((ReqId(r.id), r.first_token.is_some()));
                }
            }
            self.in_flight -= self.outstanding[i] as u64;
            self.outstanding[i] = 0;
        }
        for (req, streamed) in moved {
            let old = self.records[req.0 as usize].instance;
            if streamed {
                self.records[req.0 as usize].failed = Some(format!(
                    "instance {old} crashed with node {node} after the first token"
                ));
                continue;
            }
            self.failovers += 1;
            let reason = format!("instance {old} crashed with node {node}; no live instance left");
            self.dispatch(req, &reason, ctx);
        }
    }

    /// Whether a message from instance `i` about `req` is current (not from a crashed
    /// instance, or about a request since sent elsewhere).
    fn current(&self, req: ReqId, i: u32) -> bool {
        let r = &self.records[req.0 as usize];
        r.instance == i && self.alive.get(i as usize) == Some(&true) && r.failed.is_none()
    }

    fn done(&mut self, req: ReqId) {
        let instance = self.records[req.0 as usize].instance as usize;
        match self.outstanding.get_mut(instance) {
            Some(n) if *n > 0 && self.in_flight > 0 => {
                *n -= 1;
                self.in_flight -= 1;
                if let Some(kv) = &mut self.kv {
                    let r = &self.records[req.0 as usize];
                    kv.ended(instance, kv.blocks(r.prompt_tokens, r.output_tokens));
                }
            }
            _ => unexpected(
                &mut self.violations,
                "router",
                &format!("an end of request {} that is not in flight", req.0),
            ),
        }
    }

    /// Whether `req` names a request of the trace; records a violation if not.
    fn known(&mut self, req: ReqId) -> bool {
        let ok = (req.0 as usize) < self.records.len();
        if !ok {
            let what = format!(
                "a message about request {}, which is not in the trace",
                req.0
            );
            unexpected(&mut self.violations, "router", &what);
        }
        ok
    }
}

impl Actor<Msg> for Router {
    fn start(&mut self, ctx: &mut dyn Context<Msg>) {
        self.schedule_arrival(0, ctx);
    }

    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        match msg {
            Msg::Arrival(req) | Msg::FirstToken(req, _) | Msg::Rejected(req, _)
                if !self.known(req) => {}
            Msg::Finished(c) if !self.known(c.req) => {}
            Msg::Arrival(req) => {
                // A request arrives when the router has it: on the sim host exactly at the
                // trace's time; on the live host when its timer fired, which is later by the
                // timer's granularity (tokio's is a millisecond). Measuring from the trace's
                // time would charge the load generator's lateness to the served request.
                self.records[req.0 as usize].arrival = ctx.now();
                self.dispatch(req, "no live instance", ctx);
                self.schedule_arrival(req.0 + 1, ctx);
            }
            Msg::FirstToken(req, i) if self.current(req, i) => {
                let record = &mut self.records[req.0 as usize];
                record.first_token = Some(ctx.now());
                record.network_bytes += TOKEN_ID_BYTES;
            }
            Msg::Finished(c) if self.current(c.req, c.instance) => {
                let record = &mut self.records[c.req.0 as usize];
                record.end = Some(ctx.now());
                record.admitted = Some(c.admitted_at);
                record.reused = c.reused;
                record.loaded_bytes = c.loaded_bytes;
                record.preemptions = c.preemptions;
                record.network_bytes +=
                    TOKEN_ID_BYTES * (record.output_tokens as u64).saturating_sub(1);
                self.done(c.req);
            }
            Msg::Rejected(req, i) if self.current(req, i) => {
                self.records[req.0 as usize].rejected = true;
                self.done(req);
            }
            // Sent by an instance before it crashed: the request has moved on.
            Msg::FirstToken(..) | Msg::Finished(_) | Msg::Rejected(..) => {}
            Msg::NodeDown(node) => self.node_down(node, ctx),
            other => unexpected(&mut self.violations, "router", &other),
        }
    }

    fn check(&self) -> Result<(), String> {
        let in_flight: u64 = self.outstanding.iter().map(|&n| n as u64).sum();
        if in_flight != self.in_flight {
            return Err(format!(
                "router: {in_flight} requests outstanding at instances, {} in flight",
                self.in_flight
            ));
        }
        Ok(())
    }

    fn report(&self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
        for r in &self.records {
            if r.end.is_none() && !r.rejected && r.failed.is_none() {
                report
                    .violations
                    .push(format!("request {} never finished", r.id));
                break;
            }
        }
        report.records.extend(self.records.iter().cloned());
        report.failovers += self.failovers;
    }
}
