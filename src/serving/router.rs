//! The router: the clients' side of the system. It releases the trace's requests at their
//! arrival times, assigns each to a serving instance, and records what happens to it.
//!
//! Assignment strategies: `round-robin` cycles through the instances; `least-loaded` picks the
//! instance with the fewest requests the router has sent it that are not yet finished (ties go
//! to the lowest index). The router only knows what it has been told by messages, as a real
//! router would. Arrivals are chained timers (one pending at a time), so the event queue
//! holds the requests in flight, not the whole trace.

use std::sync::Arc;

use super::Msg;
use crate::actor::{Actor, ActorId, Context, unexpected};
use crate::metrics::{Report, RequestRecord};
use crate::workload::{ReqId, Trace};

/// How the router picks an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterStrategy {
    RoundRobin,
    LeastLoaded,
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
}

impl Router {
    pub fn new(trace: Arc<Trace>, instances: Vec<ActorId>, strategy: RouterStrategy) -> Router {
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
        }
    }

    fn schedule_arrival(&self, next: u32, ctx: &mut dyn Context<Msg>) {
        if let Some(r) = self.trace.requests.get(next as usize) {
            ctx.timer(r.arrival - ctx.now(), Msg::Arrival(ReqId(next)));
        }
    }

    fn pick(&mut self) -> usize {
        match self.strategy {
            RouterStrategy::RoundRobin => {
                let i = self.next_rr;
                self.next_rr = (i + 1) % self.instances.len();
                i
            }
            RouterStrategy::LeastLoaded => {
                let (i, _) = self
                    .outstanding
                    .iter()
                    .enumerate()
                    .min_by_key(|&(i, &n)| (n, i))
                    .expect("at least one instance");
                i
            }
        }
    }

    fn done(&mut self, req: ReqId) {
        let instance = self.records[req.0 as usize].instance as usize;
        match self.outstanding.get_mut(instance) {
            Some(n) if *n > 0 && self.in_flight > 0 => {
                *n -= 1;
                self.in_flight -= 1;
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
            Msg::Arrival(req) | Msg::FirstToken(req) | Msg::Rejected(req) if !self.known(req) => {}
            Msg::Finished(c) if !self.known(c.req) => {}
            Msg::Arrival(req) => {
                let i = self.pick();
                self.outstanding[i] += 1;
                self.in_flight += 1;
                let record = &mut self.records[req.0 as usize];
                record.instance = i as u32;
                let bytes = TOKEN_ID_BYTES * record.prompt_tokens as u64;
                record.network_bytes += bytes;
                ctx.send(self.instances[i], Msg::Submit(req), bytes);
                self.schedule_arrival(req.0 + 1, ctx);
            }
            Msg::FirstToken(req) => {
                let record = &mut self.records[req.0 as usize];
                record.first_token = Some(ctx.now());
                record.network_bytes += TOKEN_ID_BYTES;
            }
            Msg::Finished(c) => {
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
            Msg::Rejected(req) => {
                self.records[req.0 as usize].rejected = true;
                self.done(req);
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

    fn report(&self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
        for r in &self.records {
            if r.end.is_none() && !r.rejected {
                report
                    .violations
                    .push(format!("request {} never finished", r.id));
                break;
            }
        }
        report.records.extend(self.records.iter().cloned());
    }
}
