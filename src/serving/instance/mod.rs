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
//! longest run of its prompt's leading full blocks that the pool holds (the block pool); those
//! tokens are not recomputed. At least the last prompt token is always computed, since it
//! produces the first output token's logits.
//!
//! **Tokens.** An iteration that computes the last known token of a sequence samples its next
//! token: the end of the prefill gives the first token (reported to the router at once), every
//! decode iteration one more. The sequence ends when it has `output_tokens` tokens; its KV
//! blocks are released (kept indexed if the policy keeps blocks). Only prompt blocks are hashed:
//! the model does not know the ids of generated tokens.
//!
//! **Store policies.** If the policy uses the distributed prefix store, a request first asks
//! the metadata service for its stored prefix (beyond what the GPU cache holds) and loads it
//! (see [`crate::serving::store`]); it joins the queue when the loads have arrived, and the loaded
//! tokens count as computed at admission. After its prefill, the prompt's full tensors beyond
//! the stored prefix are written to the node's store server. Reused tokens are attributed to
//! the tier they came from; if the GPU cache changed between the lookup and the admission so
//! that loaded tokens end up recomputed (rare), they are taken off the slowest tiers first.
//!
//! **Memory.** `num_blocks = floor((tp x GPU memory - weights - tp x reserve) / (block_size x
//! KV bytes per token))`, computed by the scenario when it is validated.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::block_pool::{BlockId, BlockPool};
use super::msg::{Completion, Lookup, Msg};
use crate::actor::{Actor, ActorId, Context, Medium, Work, unexpected};
use crate::backend::BatchBackend;
use crate::hardware::Place;
use crate::metrics::Tier;
use crate::metrics::{InstanceStats, Report};
use crate::model::cost::BatchShape;
use crate::serving::policy::Policy;
use crate::serving::store::directory::{LoadPlan, Location};
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

/// How an instance reaches the distributed prefix store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreLink {
    pub metadata: ActorId,
    /// Store server of every node, by node.
    pub servers: Vec<ActorId>,
    pub node: u32,
    pub tensor_tokens: u32,
    pub tensor_bytes: u64,
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
    /// Reused prompt tokens by tier, fixed at the first admission.
    reused: [u32; Tier::ALL.len()],
    /// Bytes loaded from each tier.
    loaded_bytes: [u64; Tier::ALL.len()],
    preemptions: u32,
    admitted_at: Option<Nanos>,
    /// Tensor ids of the prompt's full chunks (store policies).
    chain: Vec<u64>,
    /// Leading chunks the store held at the lookup.
    stored_chunks: u32,
    /// Tokens loaded from the store: `[load_start, load_end)`.
    load_start: u32,
    load_end: u32,
    /// Planned tokens per tier of the load.
    planned: [u32; Tier::ALL.len()],
    /// Remote tensors to copy into the local replica cache once loaded.
    replicate: Vec<u64>,
    /// Whether the prompt's tensors were written to the store.
    stored: bool,
}

/// A request waiting for its store lookup (`pending == None`) or loads.
#[derive(Debug)]
struct Loading {
    seq: Seq,
    pending: Option<u32>,
    /// The nodes its load groups come from.
    sources: Vec<u32>,
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
    store: Option<StoreLink>,
    loading: BTreeMap<ReqId, Loading>,
    /// Prices (or runs) each iteration.
    backend: Box<dyn BatchBackend>,
    /// Broken invariants and unexpected messages (errors are values).
    violations: Vec<String>,
    /// Faults: crashed with its node (it drops every message), store losses learned of, and
    /// load groups still to arrive for loads abandoned because their source was lost.
    crashed: bool,
    losses: u32,
    stale_loads: BTreeMap<ReqId, u32>,
}

impl Instance {
    pub fn new(
        index: u32,
        router: ActorId,
        trace: Arc<Trace>,
        policy: Arc<dyn Policy>,
        cfg: InstanceConfig,
        store: Option<StoreLink>,
        backend: Box<dyn BatchBackend>,
    ) -> Instance {
        let look_in_gpu = policy.lookup_tiers().contains(&Tier::Gpu);
        debug_assert_eq!(store.is_some(), policy.store_rules().is_some());
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
            store,
            loading: BTreeMap::new(),
            backend,
            violations: Vec::new(),
            crashed: false,
            losses: 0,
            stale_loads: BTreeMap::new(),
        }
    }

    pub fn stats(&self) -> InstanceStats {
        InstanceStats {
            pool: self.pool.stats,
            ..self.stats
        }
    }

    /// Requests loading, queued or running.
    pub fn load(&self) -> usize {
        self.loading.len() + self.waiting.len() + self.running.len()
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.cfg.block_size)
    }

    fn submit(&mut self, req: ReqId, ctx: &mut dyn Context<Msg>) {
        let r = self.trace.request(req);
        // The most KV a request holds is prompt + output - 1 tokens: the last sampled token
        // is never fed back.
        let most = r.prompt_tokens + r.output_tokens - 1;
        let never_fits = self.blocks_for(most) > self.cfg.num_blocks;
        let queued = self.waiting.len() + self.loading.len();
        if never_fits || queued >= self.cfg.max_waiting as usize {
            self.stats.rejected += 1;
            ctx.send(self.router, Msg::Rejected(req, self.index), 8);
            return;
        }
        let mut hashes = Vec::new();
        if self.look_in_gpu || self.store.is_some() {
            self.trace
                .block_hashes(req, self.cfg.block_size as usize, &mut hashes);
        }
        let mut seq = Seq {
            req,
            prompt_len: r.prompt_tokens,
            output_len: r.output_tokens,
            generated: 0,
            computed: 0,
            scheduled: 0,
            blocks: Vec::new(),
            hashes,
            registered: 0,
            reused: [0; Tier::ALL.len()],
            loaded_bytes: [0; Tier::ALL.len()],
            preemptions: 0,
            admitted_at: None,
            chain: Vec::new(),
            stored_chunks: 0,
            load_start: 0,
            load_end: 0,
            planned: [0; Tier::ALL.len()],
            replicate: Vec::new(),
            stored: false,
        };
        if let Some(st) = &self.store {
            // A tensor's id is the hash of the last block of its chunk (hashes are chained).
            let per = (st.tensor_tokens / self.cfg.block_size) as usize;
            seq.chain = seq.hashes.chunks_exact(per).map(|c| c[per - 1]).collect();
            let gpu_blocks = if self.look_in_gpu {
                self.pool.longest_cached_prefix(&seq.hashes).0
            } else {
                0
            };
            let skip = gpu_blocks / (per as u32);
            if (skip as usize) < seq.chain.len() {
                seq.load_start = skip * st.tensor_tokens;
                let lookup = Lookup {
                    req,
                    from: ctx.me(),
                    node: st.node,
                    chain: seq.chain.clone(),
                    skip,
                };
                let bytes = 16 + 8 * lookup.chain.len() as u64;
                ctx.send(st.metadata, Msg::Lookup(Box::new(lookup)), bytes);
                self.loading.insert(
                    req,
                    Loading {
                        seq,
                        pending: None,
                        sources: Vec::new(),
                    },
                );
                return;
            }
        }
        self.enqueue(seq, ctx);
    }

    fn enqueue(&mut self, seq: Seq, ctx: &mut dyn Context<Msg>) {
        self.waiting.push_back(seq);
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
        // The loaded prefix went with the blocks: what the GPU cache no longer holds is
        // recomputed on re-admission.
        seq.load_start = 0;
        seq.load_end = 0;
        seq.preemptions += 1;
        self.stats.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Plans and starts the next iteration, if there is anything to compute.
    fn step(&mut self, ctx: &mut dyn Context<Msg>) {
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
        let duration = match self.backend.iteration(&shape) {
            Ok(d) => d,
            Err(e) => {
                // The iteration still ends (at once), so the instance never stalls; the run
                // ends with this violation.
                self.violations
                    .push(format!("instance {}: iteration failed: {e}", self.index));
                Nanos::ZERO
            }
        };
        ctx.start(Work::Compute(duration), Msg::WorkDone);
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
            let gpu_tokens = hits * self.cfg.block_size;
            let aligned_max = reusable as u32 * self.cfg.block_size;
            let store_usable = seq.load_end > gpu_tokens && gpu_tokens >= seq.load_start;
            let cached = if store_usable {
                seq.load_end.min(aligned_max).max(gpu_tokens)
            } else {
                gpu_tokens
            };
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
                seq.reused = seq.planned;
                seq.reused[Tier::Gpu as usize] = gpu_tokens;
                let from_store = if store_usable { cached - gpu_tokens } else { 0 };
                let mut excess = seq.planned.iter().sum::<u32>() - from_store;
                for tier in Tier::ALL[1..].iter().rev() {
                    let take = excess.min(seq.reused[*tier as usize]);
                    seq.reused[*tier as usize] -= take;
                    excess -= take;
                }
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
    fn work_done(&mut self, ctx: &mut dyn Context<Msg>) {
        let Some(started) = self.busy_since.take() else {
            let me = format!("instance {}", self.index);
            unexpected(&mut self.violations, &me, &"a work-done notice while idle");
            return;
        };
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
            if !seq.stored
                && seq.computed >= seq.prompt_len
                && let Some(st) = &self.store
            {
                seq.stored = true;
                let new =
                    seq.chain.len() as u64 - (seq.stored_chunks as u64).min(seq.chain.len() as u64);
                if new > 0 {
                    ctx.send(
                        st.servers[st.node as usize],
                        Msg::StoreWrite {
                            chain: Box::new(seq.chain.clone()),
                            replica: false,
                        },
                        new * st.tensor_bytes,
                    );
                }
            }
            if seq.computed < seq.known_tokens() {
                i += 1;
                continue;
            }
            seq.generated += 1;
            if seq.generated == 1 {
                ctx.send(self.router, Msg::FirstToken(seq.req, self.index), 4);
            }
            if seq.generated < seq.output_len {
                i += 1;
                continue;
            }
            let seq = self.running.remove(i);
            self.pool.release(&seq.blocks);
            ctx.send(
                self.router,
                Msg::Finished(Box::new(Completion {
                    req: seq.req,
                    instance: self.index,
                    admitted_at: seq.admitted_at.unwrap_or(started),
                    reused: seq.reused,
                    loaded_bytes: seq.loaded_bytes,
                    preemptions: seq.preemptions,
                })),
                4 * (seq.output_len as u64 - 1),
            );
        }
        self.step(ctx);
    }
}

impl Actor<Msg> for Instance {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        if self.crashed {
            return;
        }
        match msg {
            Msg::Submit(req) => self.submit(req, ctx),
            Msg::WorkDone => self.work_done(ctx),
            Msg::LookupReply(req, plan, losses) => self.lookup_reply(req, *plan, losses, ctx),
            Msg::Crash => self.crashed = true,
            Msg::NodeDown(node) | Msg::StoreLost(node) => self.store_lost(node, ctx),
            Msg::Loaded(req) => self.loaded(req, ctx),
            other => {
                let me = format!("instance {}", self.index);
                unexpected(&mut self.violations, &me, &other)
            }
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.crashed {
            return Ok(());
        }
        self.invariants()
    }

    fn report(&self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
        if self.crashed {
            // Its state stopped at the crash; the router accounted for its requests.
            report.instances.push(self.stats());
            return;
        }
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

mod check;
mod store;
#[cfg(test)]
mod tests;
