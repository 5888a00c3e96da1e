//! A serving instance: one model replica on one GPU (or one tensor-parallel group), with
//! iteration-level continuous batching as vLLM (V1) does it.
//!
//! **Scheduling.** The instance runs one forward pass (an *iteration*) at a time. Each
//! iteration has a budget of `max_batched_tokens` new tokens. Running sequences come first, in
//! admission order: a decoding sequence takes one token, a sequence still prefilling takes as
//! much of its remaining prompt as the budget leaves (chunked prefill). If a sequence needs a
//! new KV block and none is free, the most recently admitted running sequence is *preempted*:
//! its blocks are released and it goes back to the head of the queue, to be recomputed later
//! (vLLM's recompute preemption). If nobody was preempted, waiting requests are admitted in
//! arrival order while fewer than `max_num_seqs` run, budget is left, and their first chunk's
//! blocks are free. A request whose prompt and output could never fit in the whole KV memory,
//! or that finds `max_waiting` requests already queued, is rejected.
//!
//! **Prefix reuse.** If the policy looks in GPU memory, an admitted request first takes the
//! longest run of its prompt's leading full blocks that the pool holds ([`BlockPool`]); those
//! tokens are not recomputed. At least the last prompt token is always computed, since it
//! produces the first output token's logits.
//!
//! **Tokens.** An iteration that computes the last known token of a sequence samples its next
//! token: the end of the prefill gives the first token (reported to the router at once), every
//! decode iteration one more. The sequence ends when it has `output_tokens` tokens; its KV
//! blocks are released (kept indexed if the policy keeps blocks). Only prompt blocks are hashed:
//! the model does not know the ids of generated tokens.
//!
//! **Memory.** `num_blocks = floor((tp x GPU memory - weights - tp x reserve) / (block_size x
//! KV bytes per token))`, computed by the scenario when it is validated.

use std::collections::VecDeque;
use std::sync::Arc;

use super::block_pool::{BlockId, BlockPool, PoolStats};
use crate::actor::{Actor, Context, Msg, Work};
use crate::metrics::{Completion, Report};
use crate::model::cost::BatchShape;
use crate::policy::{Policy, Tier};
use crate::sim::kernel::ActorId;
use crate::units::Nanos;
use crate::workload::{ReqId, Trace};

/// Limits and sizes of one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceConfig {
    pub block_size: u32,
    pub num_blocks: u32,
    pub max_num_seqs: u32,
    pub max_batched_tokens: u32,
    pub max_waiting: u32,
}

/// Counters of one instance, for results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceStats {
    pub iterations: u64,
    pub busy: Nanos,
    pub preemptions: u64,
    pub rejected: u64,
    pub pool: PoolStats,
}

#[derive(Debug)]
struct Seq {
    req: ReqId,
    prompt_len: u32,
    output_len: u32,
    generated: u32,
    /// Tokens whose KV is in this instance's cache.
    computed: u32,
    /// Tokens scheduled in the running iteration.
    scheduled: u32,
    blocks: Vec<BlockId>,
    /// Hashes of the prompt's full blocks (empty unless the policy looks in GPU memory).
    hashes: Vec<u64>,
    /// Prompt blocks already registered in the pool.
    registered: u32,
    reused_gpu: u32,
    preemptions: u32,
    admitted_at: Option<Nanos>,
}

impl Seq {
    fn known_tokens(&self) -> u32 {
        self.prompt_len + self.generated
    }
}

/// The serving-instance actor.
pub struct Instance {
    index: u32,
    router: ActorId,
    trace: Arc<Trace>,
    policy: Arc<dyn Policy>,
    cfg: InstanceConfig,
    pool: BlockPool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    busy_since: Option<Nanos>,
    stats: InstanceStats,
    look_in_gpu: bool,
}

impl Instance {
    pub fn new(
        index: u32,
        router: ActorId,
        trace: Arc<Trace>,
        policy: Arc<dyn Policy>,
        cfg: InstanceConfig,
    ) -> Instance {
        let look_in_gpu = policy.lookup_tiers().contains(&Tier::Gpu);
        Instance {
            index,
            router,
            trace,
            pool: BlockPool::new(cfg.num_blocks, policy.keep_gpu_blocks()),
            policy,
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            busy_since: None,
            stats: InstanceStats::default(),
            look_in_gpu,
        }
    }

    pub fn stats(&self) -> InstanceStats {
        InstanceStats {
            pool: self.pool.stats,
            ..self.stats
        }
    }

    /// Requests queued or running.
    pub fn load(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.cfg.block_size)
    }

    fn submit(&mut self, req: ReqId, ctx: &mut dyn Context) {
        let r = self.trace.request(req);
        // The most KV a request holds is prompt + output - 1 tokens: the last sampled token
        // is never fed back.
        let most = r.prompt_tokens + r.output_tokens - 1;
        let never_fits = self.blocks_for(most) > self.cfg.num_blocks;
        if never_fits || self.waiting.len() >= self.cfg.max_waiting as usize {
            self.stats.rejected += 1;
            ctx.send(self.router, Msg::Rejected(req), 8);
            return;
        }
        let mut hashes = Vec::new();
        if self.look_in_gpu {
            self.trace
                .block_hashes(req, self.cfg.block_size as usize, &mut hashes);
        }
        self.waiting.push_back(Seq {
            req,
            prompt_len: r.prompt_tokens,
            output_len: r.output_tokens,
            generated: 0,
            computed: 0,
            scheduled: 0,
            blocks: Vec::new(),
            hashes,
            registered: 0,
            reused_gpu: 0,
            preemptions: 0,
            admitted_at: None,
        });
        if self.busy_since.is_none() {
            self.step(ctx);
        }
    }

    fn preempt(&mut self, mut seq: Seq) {
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        seq.computed = 0;
        seq.scheduled = 0;
        seq.registered = 0;
        seq.preemptions += 1;
        self.stats.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Plans and starts the next iteration, if there is anything to compute.
    fn step(&mut self, ctx: &mut dyn Context) {
        debug_assert!(self.busy_since.is_none());
        let mut budget = self.cfg.max_batched_tokens;
        let mut shape = BatchShape::default();
        let mut preempted = false;
        let mut i = 0;
        // Bounded by the number of running sequences, which only shrinks inside the loop.
        'running: while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let n = (seq.known_tokens() - seq.computed).min(budget);
            let need = self
                .blocks_for(seq.computed + n)
                .saturating_sub(seq.blocks.len() as u32);
            while self.pool.free_blocks() < need {
                // Preempt the most recently admitted sequence; possibly this one.
                let victim = self.running.pop().expect("running is not empty");
                preempted = true;
                let was_self = self.running.len() == i;
                self.preempt(victim);
                if was_self {
                    break 'running;
                }
            }
            let seq = &mut self.running[i];
            let ok = self.pool.allocate(need, &mut seq.blocks);
            debug_assert!(ok);
            seq.scheduled = n;
            shape.add(
                n as u64,
                seq.computed as u64,
                seq.computed + n == seq.known_tokens(),
            );
            budget -= n;
            i += 1;
        }
        if !preempted {
            self.admit(&mut budget, &mut shape, ctx.now());
        }
        if shape.is_empty() {
            return;
        }
        self.stats.iterations += 1;
        self.busy_since = Some(ctx.now());
        ctx.start(Work::Batch(shape), Msg::WorkDone);
    }

    fn admit(&mut self, budget: &mut u32, shape: &mut BatchShape, now: Nanos) {
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs as usize {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            // Reuse at most up to the last prompt token, which must be computed.
            let reusable = ((seq.known_tokens() - 1) / self.cfg.block_size) as usize;
            let (hits, hits_free) = if self.look_in_gpu {
                let upto = reusable.min(seq.hashes.len());
                self.pool.longest_cached_prefix(&seq.hashes[..upto])
            } else {
                (0, 0)
            };
            let cached = hits * self.cfg.block_size;
            let n = (seq.known_tokens() - cached).min(*budget);
            let need = self.blocks_for(cached + n) - hits;
            if need > self.pool.free_blocks() - hits_free {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            self.pool
                .take_cached(&seq.hashes[..hits as usize], &mut seq.blocks);
            let ok = self.pool.allocate(need, &mut seq.blocks);
            debug_assert!(ok);
            if seq.admitted_at.is_none() {
                seq.admitted_at = Some(now);
                seq.reused_gpu = cached;
            }
            seq.computed = cached;
            seq.registered = hits;
            seq.scheduled = n;
            shape.add(n as u64, cached as u64, cached + n == seq.known_tokens());
            *budget -= n;
            self.running.push(seq);
        }
    }

    /// Applies the results of the iteration that just ended.
    fn work_done(&mut self, ctx: &mut dyn Context) {
        let started = self.busy_since.take().expect("work done while idle");
        self.stats.busy += ctx.now() - started;
        let keep = self.policy.keep_gpu_blocks();
        let block_size = self.cfg.block_size;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled == 0 {
                i += 1;
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            if keep {
                let full = seq.computed.min(seq.prompt_len) / block_size;
                let full = full.min(seq.hashes.len() as u32);
                for b in seq.registered..full {
                    self.pool
                        .register(seq.blocks[b as usize], seq.hashes[b as usize]);
                }
                seq.registered = seq.registered.max(full);
            }
            if seq.computed < seq.known_tokens() {
                i += 1;
                continue;
            }
            seq.generated += 1;
            if seq.generated == 1 {
                ctx.send(self.router, Msg::FirstToken(seq.req), 4);
            }
            if seq.generated < seq.output_len {
                i += 1;
                continue;
            }
            let seq = self.running.remove(i);
            self.pool.release(&seq.blocks);
            let mut reused = [0u32; Tier::ALL.len()];
            reused[Tier::Gpu as usize] = seq.reused_gpu;
            ctx.send(
                self.router,
                Msg::Finished(Box::new(Completion {
                    req: seq.req,
                    instance: self.index,
                    admitted_at: seq.admitted_at.unwrap_or(started),
                    reused,
                    preemptions: seq.preemptions,
                })),
                4 * (seq.output_len as u64 - 1),
            );
        }
        self.step(ctx);
    }
}

impl Actor for Instance {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
        match msg {
            Msg::Start => {}
            Msg::Submit(req) => self.submit(req, ctx),
            Msg::WorkDone => self.work_done(ctx),
            other => panic!("instance {} cannot handle {other:?}", self.index),
        }
    }

    fn report(&self, report: &mut Report) {
        let idle = self.busy_since.is_none() && self.load() == 0;
        let pool_ok = self.pool.check().and_then(|()| {
            if idle && self.pool.free_blocks() != self.pool.num_blocks() {
                Err(format!(
                    "{} of {} blocks still held after the last request",
                    self.pool.num_blocks() - self.pool.free_blocks(),
                    self.pool.num_blocks()
                ))
            } else {
                Ok(())
            }
        });
        if let Err(e) = pool_ok {
            report
                .violations
                .push(format!("instance {}: {e}", self.index));
        }
        if !idle {
            report.violations.push(format!(
                "instance {} ended with {} requests queued or running",
                self.index,
                self.load()
            ));
        }
        report.instances.push(self.stats());
    }
}
