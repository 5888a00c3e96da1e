//! The router: the clients' side of the system. It releases the trace's requests at their
//! arrival times, assigns each to a serving instance, and records what happens to it.
//!
//! Assignment strategies: `round-robin` cycles through the instances; `least-loaded` picks the
//! instance with the fewest requests the router has sent it that are not yet finished (ties go
//! to the lowest index); `kv-aware` weighs the prompt blocks each instance would have to
//! prefill, less those it holds in GPU memory or can load from the store, as the KV events
//! it received tell ([`kv_index`]), against its load; `kv-approx` weighs them likewise but
//! guesses what each instance holds from what it sent there ([`super::kv_routing`]). The router only knows what it has been
//! told by messages, as a real router would. Arrivals are chained timers (one pending at a
//! time), so the event queue holds the requests in flight, not the whole trace.
//!
//! Faults: when told that a node is down ([`Msg::NodeDown`]), the router stops sending to the
//! node's instances and fails their requests over: a request that has not streamed a token yet
//! is sent to a live instance (chosen as any other, and counted in `Report::failovers`); one
//! that has is failed with the reason, as is any request when no live instance is left.
//! Messages that a crashed instance sent before it crashed are ignored when they arrive.
//! In a run across processes, an instance lost with its process is placed again, empty
//! ([`Msg::ActorLost`]): every request it held runs again, streamed or not, and keeps its first
//! token's time. On real backends the router keeps each request's tokens ([`Msg::Output`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Msg;
use super::kv::prompt_hashes::PromptHashes;
use super::kv_routing::KvRouting;
use super::msg::{Completion, Output};
use crate::actor::{Actor, ActorId, Context, unexpected};
use crate::metrics::{Report, RequestRecord};
use crate::units::Nanos;
use crate::workload::{ReqId, Trace};
use kv_index::KvIndex;

/// How the router picks an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterStrategy {
    RoundRobin,
    LeastLoaded,
    /// On the KV events of instances and store ([`kv_index`]).
    KvAware,
    /// On what the router sent where ([`KvRouting`]).
    KvApprox,
}

impl RouterStrategy {
    /// Whether instances and the store publish KV events for this router.
    pub fn needs_kv_events(self) -> bool {
        self == RouterStrategy::KvAware
    }
}

/// Bytes per token id on the wire.
pub const TOKEN_ID_BYTES: u64 = 4;

/// No instance (in [`Router::assigned`]).
const NONE: u32 = u32::MAX;

/// Most first tokens (and, separately, ends) of requests that the router keeps before it
/// writes them into the requests' records (8 MiB of ends).
const PENDING_RECORDS: usize = 1 << 16;

pub struct Router {
    trace: Arc<Trace>,
    instances: Vec<ActorId>,
    strategy: RouterStrategy,
    next_rr: usize,
    outstanding: Vec<u32>,
    records: Vec<RequestRecord>,
    /// The instance each request is at, by request; [`NONE`] before its dispatch and once it
    /// failed. Dense, and read by every message about a request, where its record (written
    /// only, in cold memory at cluster scale) is not read: see [`Router::current`].
    assigned: Vec<u32>,
    /// First tokens and ends of requests as their messages came, not yet written into the
    /// records: appended in order (warm memory), and written in batches of at most
    /// [`PENDING_RECORDS`] each ([`Router::flush`]), where the misses on the records overlap.
    firsts: Vec<(ReqId, Nanos)>,
    ends: Vec<(Nanos, Completion)>,
    /// [`PENDING_RECORDS`] (smaller in tests).
    pending_limit: usize,
    /// Unexpected messages (errors are values).
    violations: Vec<String>,
    /// Requests sent to an instance and not yet finished or rejected.
    in_flight: u64,
    /// The node of each instance, and whether it is alive.
    nodes: Vec<u32>,
    alive: Vec<bool>,
    failovers: u64,
    /// Its records went into a report (see [`Router::report`]).
    reported: bool,
    /// What the router guesses of each instance's KV cache (`kv-approx` only).
    kv: Option<KvRouting>,
    /// What the KV events told the router (`kv-aware` only).
    index: Option<KvIndex>,
    /// Tests: drop every `k`-th batch of KV events, and say what was scored.
    seam: Option<Box<EventSeam>>,
    /// The prompts' block hashes (`kv-aware` only; a memo shared by the actors).
    hashes: Option<Arc<PromptHashes>>,
    /// Real backends: what each completed request generated ([`Msg::Output`]), by request.
    outputs: BTreeMap<u32, Output>,
    /// Requests run again after their instance was lost past their first token: the first
    /// token of the new run is not the request's first (bounded by the trace).
    streamed_again: BTreeSet<u32>,
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
            assigned: vec![NONE; trace.requests.len()],
            firsts: Vec::new(),
            ends: Vec::new(),
            pending_limit: PENDING_RECORDS,
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
            reported: false,
            kv: None,
            index: None,
            seam: None,
            hashes: None,
            outputs: BTreeMap::new(),
            streamed_again: BTreeSet::new(),
        }
    }

    /// Routes by [`KvRouting`]'s score (the strategy must be `kv-approx`).
    pub fn with_kv(mut self, kv: KvRouting) -> Router {
        self.kv = Some(kv);
        self
    }

    /// Routes by [`KvIndex`]'s score (the strategy must be `kv-aware`).
    pub fn with_kv_index(mut self, index: KvIndex) -> Router {
        self.index = Some(index);
        self
    }

    /// Tests: the router drops every `k`-th batch of KV events it receives (from 1: every
    /// batch), counting their blocks, and logs the GPU hit it scored for each request.
    #[doc(hidden)]
    pub fn with_event_loss(mut self, k: u32) -> Router {
        self.seam = Some(Box::new(EventSeam {
            every: k.max(1),
            ..EventSeam::default()
        }));
        self
    }

    /// Tests: what [`Self::with_event_loss`] kept.
    #[doc(hidden)]
    pub fn event_seam(&self) -> Option<&EventSeam> {
        self.seam.as_deref()
    }

    /// A batch of KV events arrived; those of an instance that is down are stale.
    fn kv_events(&mut self, batch: &super::msg::KvEvents, now: Nanos) {
        let Some(index) = &mut self.index else {
            return;
        };
        if let Some(i) = batch.instance
            && self.alive.get(i as usize) != Some(&true)
        {
            return;
        }
        if let Some(seam) = &mut self.seam {
            seam.batches += 1;
            if seam.batches.is_multiple_of(u64::from(seam.every)) {
                seam.dropped.push((now, batch.clone()));
                return;
            }
        }
        index.apply(batch);
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
            RouterStrategy::KvApprox if self.kv.is_some() => {
                let kv = self.kv.as_mut().expect("checked");
                let hashes = prompt_hashes(&self.trace, &self.hashes, req, kv.block_size());
                kv.pick(hashes, &self.alive)
            }
            RouterStrategy::KvAware if self.index.is_some() => {
                let index = self.index.as_mut().expect("checked");
                let hashes = prompt_hashes(&self.trace, &self.hashes, req, index.block_size());
                let picked = index.pick(hashes, &self.alive);
                if let (Some(seam), Some(i)) = (&mut self.seam, picked) {
                    seam.scored.push((req, i as u32, index.last_gpu_hit()));
                }
                picked
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
            RouterStrategy::LeastLoaded | RouterStrategy::KvAware | RouterStrategy::KvApprox => {
                self.outstanding
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| self.alive[i])
                    .min_by_key(|&(i, &n)| (n, i))
                    .map(|(i, _)| i)
            }
        }
    }

    /// Sends `req` to a live instance, or fails it with `reason` when none is left.
    fn dispatch(&mut self, req: ReqId, reason: &str, ctx: &mut dyn Context<Msg>) {
        let Some(i) = self.pick(req) else {
            self.fail(req, reason.to_string());
            return;
        };
        let record = &mut self.records[req.0 as usize];
        if let Some(kv) = &mut self.kv {
            kv.sent(i, kv.blocks(record.prompt_tokens, record.output_tokens));
        }
        if let Some(index) = &mut self.index {
            index.sent(i, index.blocks(record.prompt_tokens, record.output_tokens));
        }
        self.outstanding[i] += 1;
        self.in_flight += 1;
        record.instance = i as u32;
        self.assigned[req.0 as usize] = i as u32;
        let bytes = TOKEN_ID_BYTES * record.prompt_tokens as u64;
        record.network_bytes += bytes;
        ctx.send(self.instances[i], Msg::Submit(req), bytes);
    }

    /// Node `node` is down: its instances take no more requests, and theirs fail over.
    fn node_down(&mut self, node: u32, ctx: &mut dyn Context<Msg>) {
        // The records say which requests have streamed or ended.
        self.flush();
        // Its store server went with it (its instances' sets go in `empty_instance`).
        if let Some(index) = &mut self.index {
            index.store_cleared(node);
        }
        let mut moved = Vec::new();
        for i in 0..self.instances.len() {
            if self.nodes[i] != node || !self.alive[i] {
                continue;
            }
            self.alive[i] = false;
            moved.extend(self.empty_instance(i));
        }
        for (req, streamed) in moved {
            let old = self.records[req.0 as usize].instance;
            if streamed {
                let why = format!("instance {old} crashed with node {node} after the first token");
                self.fail(req, why);
                continue;
            }
            self.failovers += 1;
            let reason = format!("instance {old} crashed with node {node}; no live instance left");
            self.dispatch(req, &reason, ctx);
        }
    }

    /// Instance `i` holds nothing any more (its records flushed): the kv-aware view of it and
    /// its outstanding count are reset, and its requests in flight are returned, in request
    /// order, each with whether it has streamed its first token. Bounded by the trace.
    fn empty_instance(&mut self, i: usize) -> Vec<(ReqId, bool)> {
        if let Some(kv) = &mut self.kv {
            kv.lost(i);
        }
        if let Some(index) = &mut self.index {
            index.lost(i);
        }
        let held = self
            .records
            .iter()
            .filter(|r| r.instance == i as u32)
            .filter(|r| r.end.is_none() && !r.rejected && r.failed.is_none())
            .map(|r| (ReqId(r.id), r.first_token.is_some()))
            .collect();
        self.in_flight -= self.outstanding[i] as u64;
        self.outstanding[i] = 0;
        held
    }

    /// Instance `i` was lost with its process and placed again, empty (a run across
    /// processes): every request it held is run again, on whichever instance the strategy
    /// picks now, and counted as a failover. One that had streamed its first token keeps it
    /// (the client has it); its output is the new run's, whole.
    fn instance_lost(&mut self, i: usize, ctx: &mut dyn Context<Msg>) {
        self.flush();
        let again = self.empty_instance(i);
        for (req, streamed) in again {
            self.failovers += 1;
            self.assigned[req.0 as usize] = NONE;
            if streamed {
                self.streamed_again.insert(req.0);
            }
            let reason = format!("instance {i} was lost; no live instance left");
            self.dispatch(req, &reason, ctx);
        }
    }

    /// Whether a message from instance `i` about `req` is current (not from a crashed
    /// instance, or about a request since sent elsewhere or failed). Reads no record: at
    /// cluster scale the record of a request that has been running for seconds is cold, and
    /// the messages of a request only write it.
    fn current(&self, req: ReqId, i: u32) -> bool {
        self.assigned[req.0 as usize] == i && self.alive.get(i as usize) == Some(&true)
    }

    /// Writes the first tokens and ends received into the records.
    fn flush(&mut self) {
        write_pending(&mut self.records, &self.firsts, &self.ends);
        self.firsts.clear();
        self.ends.clear();
    }

    /// Fails `req` for `why`: no message about it is current any more.
    fn fail(&mut self, req: ReqId, why: String) {
        self.records[req.0 as usize].failed = Some(why);
        self.assigned[req.0 as usize] = NONE;
    }

    fn done(&mut self, req: ReqId) {
        let instance = self.assigned[req.0 as usize] as usize;
        match self.outstanding.get_mut(instance) {
            Some(n) if *n > 0 && self.in_flight > 0 => {
                *n -= 1;
                self.in_flight -= 1;
                let r = &self.records[req.0 as usize];
                if let Some(kv) = &mut self.kv {
                    kv.ended(instance, kv.blocks(r.prompt_tokens, r.output_tokens));
                }
                if let Some(index) = &mut self.index {
                    index.ended(instance, index.blocks(r.prompt_tokens, r.output_tokens));
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
            Msg::FirstToken(req, i)
                if self.current(req, i) && self.streamed_again.remove(&req.0) => {}
            Msg::FirstToken(req, i) if self.current(req, i) => {
                // The token's bytes are counted with the record's (`Router::report`).
                self.firsts.push((req, ctx.now()));
                if self.firsts.len() >= self.pending_limit {
                    self.flush();
                }
            }
            Msg::Finished(c) if self.current(c.req, c.instance) => {
                self.done(c.req);
                self.ends.push((ctx.now(), *c));
                if self.ends.len() >= self.pending_limit {
                    self.flush();
                }
            }
            Msg::Rejected(req, i) if self.current(req, i) => {
                self.records[req.0 as usize].rejected = true;
                self.done(req);
            }
            // Sent by an instance before it crashed: the request has moved on.
            Msg::FirstToken(..) | Msg::Finished(_) | Msg::Rejected(..) => {}
            Msg::NodeDown(node) => self.node_down(node, ctx),
            Msg::Output(o) if self.known(o.req) && self.current(o.req, o.instance) => {
                self.outputs.insert(o.req.0, *o);
            }
            Msg::Output(_) => {}
            Msg::KvEvents(batch) => self.kv_events(&batch, ctx.now()),
            Msg::ActorLost(a) => {
                if let Some(i) = self.instances.iter().position(|&x| x == a) {
                    self.instance_lost(i, ctx);
                }
            }
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

    fn report(&mut self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
        if std::mem::replace(&mut self.reported, true) {
            // A second report would be silently empty: say so instead.
            report.violations.push(
                "router: asked for its report twice (its records went with the first)".into(),
            );
            return;
        }
        // Moved out, not copied (see `Actor::report`): a copy would be as many fresh pages.
        // The pending firsts and ends go with them, so that the router stays consistent.
        let mut records = std::mem::take(&mut self.records);
        write_pending(&mut records, &self.firsts, &self.ends);
        self.firsts.clear();
        self.ends.clear();
        // Network bytes: the prompts sent (once per dispatch, counted then) and the token ids
        // streamed back: the first token, and the others once the request finished (counted
        // here, so that those messages do not read the record).
        for r in &mut records {
            let first = r.first_token.is_some() as u64;
            let rest = match r.end {
                Some(_) => (r.output_tokens as u64).saturating_sub(1),
                None => 0,
            };
            r.network_bytes += TOKEN_ID_BYTES * (first + rest);
        }
        if let Some(r) = records
            .iter()
            .find(|r| r.end.is_none() && !r.rejected && r.failed.is_none())
        {
            report
                .violations
                .push(format!("request {} never finished", r.id));
        }
        // Moved, not copied again, when the report has no records yet (the usual case).
        if report.records.is_empty() {
            report.records = records;
        } else {
            report.records.extend(records);
        }
        report.failovers += self.failovers;
        for (id, o) in std::mem::take(&mut self.outputs) {
            report.outputs.push((id, o.tokens));
            if !o.first_logits.is_empty() {
                report.first_logits.push((id, o.first_logits));
            }
        }
    }
}

/// What the router's test seam kept ([`Router::with_event_loss`]).
#[derive(Debug, Default)]
pub struct EventSeam {
    every: u32,
    batches: u64,
    /// The batches dropped, with when they came, in order.
    pub dropped: Vec<(Nanos, super::msg::KvEvents)>,
    /// For each dispatch of `kv-aware`: the request, the instance and the GPU-hit blocks
    /// scored for it.
    pub scored: Vec<(ReqId, u32, u32)>,
}

/// The block hashes of `req`'s prompt, from the memo when there is one.
fn prompt_hashes(
    trace: &Trace,
    memo: &Option<Arc<PromptHashes>>,
    req: ReqId,
    block_size: u32,
) -> Vec<u64> {
    let mut hashes = Vec::new();
    match memo {
        Some(memo) => memo.block_hashes(req, block_size as usize, &mut hashes),
        None => trace.block_hashes(req, block_size as usize, &mut hashes),
    }
    hashes
}

/// Writes first tokens and ends of requests (in the order they came) into their records.
fn write_pending(
    records: &mut [RequestRecord],
    firsts: &[(ReqId, Nanos)],
    ends: &[(Nanos, Completion)],
) {
    // The two write different fields, so their order between them does not matter.
    for &(req, at) in firsts {
        records[req.0 as usize].first_token = Some(at);
    }
    for (at, c) in ends {
        let record = &mut records[c.req.0 as usize];
        record.end = Some(*at);
        record.admitted = Some(c.admitted_at);
        record.reused = c.reused;
        record.loaded_bytes = c.loaded_bytes;
        record.preemptions = c.preemptions;
    }
}

pub mod kv_index;
#[cfg(test)]
mod tests;
