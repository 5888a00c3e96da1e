//! One pipeline shard as an actor (see the module doc of [`crate::pipeline`]).

use std::collections::VecDeque;

use super::shard::{Shard, ShardReply, ShardRequest};
use super::{MISS_REPLY_BYTES, Msg};
use crate::actor::{Actor, ActorId, Context, Work};
use crate::metrics::{InstanceStats, PoolStats, Report};
use crate::units::Nanos;

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
    /// The answer of the step in progress and its pass (attempt), sent when its work ends.
    busy: Option<(ShardReply, u32)>,
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

    fn process(&mut self, req: ShardRequest, ctx: &mut dyn Context<Msg>) {
        let now = ctx.now();
        let session = req.session;
        let attempt = req.attempt;
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
        self.busy = Some((reply, attempt));
        self.busy_since = now;
        self.busy_for = duration;
        ctx.start(
            Work::Compute(duration.unwrap_or(Nanos::ZERO)),
            Msg::WorkDone,
        );
    }

    fn finish(&mut self, ctx: &mut dyn Context<Msg>) {
        let Some((reply, attempt)) = self.busy.take() else {
            self.violations
                .push(format!("shard {}: work ended while idle", self.index));
            return;
        };
        // Busy for the step's own duration: not the time it waited for a shared device.
        // Live steps ran inside `process`, so their wall time since then is the measure.
        self.busy_total += self.busy_for.unwrap_or(ctx.now() - self.busy_since);
        let reply_msg = |r: ShardReply| Msg::Reply {
            reply: Box::new(r),
            attempt,
        };
        match (reply, self.next) {
            (ShardReply::Forward(req), Some(next)) => {
                let bytes = req.input.bytes();
                ctx.send(next, Msg::Step(Box::new(req)), bytes);
            }
            // The head keeps the token only: the logits stay here (across processes they
            // would cost the vocabulary x 4 bytes per token on the wire).
            (ShardReply::Token { session, token, .. }, _) => {
                let r = ShardReply::Token {
                    session,
                    token,
                    logits: None,
                };
                ctx.send(self.head, reply_msg(r), 4)
            }
            (r @ ShardReply::CacheMiss { .. }, _) => {
                ctx.send(self.head, reply_msg(r), MISS_REPLY_BYTES)
            }
            (r, _) => {
                let bytes = match &r {
                    ShardReply::Failed { error, .. } => error.len() as u64,
                    _ => 0,
                };
                ctx.send(self.head, reply_msg(r), bytes)
            }
        }
        if let Some(req) = self.queue.pop_front() {
            self.process(req, ctx);
        }
    }
}

impl Actor<Msg> for ShardNode {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        match msg {
            Msg::Step(req) => {
                if self.busy.is_none() {
                    self.process(*req, ctx);
                } else if self.queue.len() < self.max_queue {
                    self.queue.push_back(*req);
                } else {
                    let (session, attempt) = (req.session, req.attempt);
                    self.violations.push(format!(
                        "shard {}: more than {} steps waiting",
                        self.index, self.max_queue
                    ));
                    let error = format!("shard {}: queue full", self.index);
                    let reply = Box::new(ShardReply::Failed { session, error });
                    ctx.send(self.head, Msg::Reply { reply, attempt }, 0);
                }
            }
            Msg::WorkDone => self.finish(ctx),
            Msg::Restart => self.shard.restart(),
            // Another actor's loss: what this shard holds of the sessions stays valid (a
            // re-prefill replaces it; a stale decode misses).
            Msg::Lost(_) => {}
            other => self
                .violations
                .push(format!("shard {} got {other:?}", self.index)),
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.queue.len() > self.max_queue {
            return Err(format!(
                "shard {}: {} steps waiting, at most {}",
                self.index,
                self.queue.len(),
                self.max_queue
            ));
        }
        if !self.queue.is_empty() && self.busy.is_none() {
            return Err(format!("shard {}: steps wait while it is idle", self.index));
        }
        Ok(())
    }

    fn report(&mut self, report: &mut Report) {
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
