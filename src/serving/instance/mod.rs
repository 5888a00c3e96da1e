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
//! arrival order while fewer than `max_num_seqs` run (or are parked, see below), budget is
//! left, and their first chunk's blocks are free. A request whose prompt and output could
//! never fit in the whole KV memory, or that finds `max_waiting` requests already queued, is
//! rejected.
//!
//! **Prefix reuse.** If the policy looks in GPU memory, an admitted request first takes the
//! longest run of its prompt's leading full blocks that the pool holds (the block pool); those
//! tokens are not recomputed. At least the last prompt token is always computed, since it
//! produces the first output token's logits.
//! Free registered blocks are evicted in the policy's order
//! (`gpu_eviction`: LRU, LFU or S3-FIFO, see [`crate::serving::kv`]).
//!
//! **Tokens.** An iteration that computes the last known token of a sequence samples its next
//! token: the end of the prefill gives the first token (reported to the router at once), every
//! decode iteration one more. The sequence ends when it has `output_tokens` tokens; its KV
//! blocks are released (kept indexed if the policy keeps blocks). Only prompt blocks are hashed:
//! the model does not know the ids of generated tokens.
//!
//! **Store policies.** If the policy uses the distributed prefix store, a request first asks
//! the metadata service for its stored prefix (beyond what the GPU cache holds); the answer is
//! a load plan (see [`crate::serving::store`]). The request then joins the back of the queue
//! with its plan *not started*, like any other. Loads start only when the scheduler admits it
//! and allocates GPU blocks for the tokens it will load (the *reservation*), as vLLM's V1
//! scheduler allocates blocks for external KV before its KV connector loads into them: loads
//! need blocks to land in, and a request whose blocks are not free waits in the queue. If the
//! GPU cache now covers the plan (or lost the prefix the plan extends), the plan is dropped
//! and nothing is loaded. The loaded tokens count as computed. How loads overlap compute is
//! the scenario's `store.load_overlap`:
//!
//! * `none` (vLLM's `WAITING_FOR_REMOTE_KVS`): the request is admitted with blocks for its
//!   GPU hits and loaded tokens, starts its loads and is *parked*: it holds its blocks but is
//!   not in the running batch (it computes nothing and is never chosen for preemption). When
//!   its last group arrives it joins the running batch (at the back, as the most recently
//!   admitted), and the rest of its prompt is prefilled, in chunks, from the next iteration
//!   on. Parked and running sequences together are at most `max_num_seqs`. TTFT = lookup +
//!   queueing + loads + prefill of the rest.
//! * `layerwise` (LMCache's and Mooncake's layer-wise loading): the request is admitted with
//!   blocks for its hits, its loaded tokens and its first chunk, starts its loads and joins
//!   the running batch at once. Layer i of its KV arrives while layers before i compute. With
//!   the model's `L` layers, a load that starts at `s` and whose last byte arrives at `a`
//!   (`T = a - s`) delivers layer i at `s + (i+1)T/L` (uniform); the iteration that started at
//!   `t0` and whose compute takes `D` (as it ran: a slowed GPU stretches it) computes layer i
//!   in `D/L` once layer i-1 is done and layer i has arrived, so it ends at
//!   `max(t0 + D, s + T/L + D, a + D/L)` (the maximum over layers of a linear function is at
//!   the first or the last layer), taken over every member whose load started in it.
//!   Event-driven: when the compute work ends, the instance waits for members' loads still in
//!   flight, then runs `Work::Compute` for the time left, and only then applies the
//!   iteration's results; the GPU is held (busy) all that time. A load always starts in its
//!   request's first iteration, so the next iteration never waits.
//!
//! **Load or recompute.** Under `load = "always"` (the default) a request loads every tensor
//! its plan offers. Under `"when-faster"` it decides when the plan arrives how many of the
//! plan's leading tensors to load, `k`, and recomputes the rest, by the time to its first
//! token each choice is estimated to take from what the instance knows then: the load `L(k)`
//! of each group trimmed to the first `k` tensors, as the host would charge it started now
//! (its posting overheads, and the share of its path's bottleneck a new transfer gets now:
//! [`Context::estimate`]), the groups side by side; and the prefill `C(k)` of the prompt
//! from the end of those tensors, in chunks of `max_batched_tokens`, as the backend prices
//! them alone ([`BatchBackend::estimate`]). The first token comes after `L + C` without
//! overlap, and after about `max(L, C)` layer by layer; the least wins, ties to the larger
//! load. Within a run of tensors from one source `L` grows linearly and `C` shrinks
//! concavely, so `L + C` is least at an end of a run and `max(L, C)` where they cross: the
//! candidates are no load, the whole plan, the ends of each run and (layer-wise) each run's
//! crossing, found by bisection. What it does not see: loads and requests that start
//! between the decision and the admission (the queue), the batch the prefill will share,
//! and other groups of the same load on a shared link (each is priced alone). A trimmed
//! group's segments are its segments in proportion, rounded up. Where the host or the
//! backend cannot estimate (a live run), everything is loaded. Deployed connectors load every
//! hit they report (vLLM's `OffloadingConnector` and LMCache through vLLM's
//! `get_num_new_matched_tokens`); Cake (Jin et al., "Compute or Load KV Cache? Why Not
//! Both?", ICML 2025) splits a prefix between loading and computing by the same reasoning,
//! adjusting the split as it goes rather than once.
//!
//! No deadlock: a parked request waits only for its loads, which always end (or are abandoned
//! on a store loss, which releases its blocks); once loaded it runs, and a running sequence's
//! blocks are taken back by preemption whenever a sequence ahead of it needs a block. So the
//! head of the queue waits at most for loads in flight and for running sequences, never for a
//! request that holds blocks and will not run. A sequence preempted after its load recomputes
//! the loaded tokens that the GPU cache no longer holds.
//!
//! After its prefill, the prompt's full tensors beyond the stored prefix are written to the
//! node's store server. Reused tokens are attributed to the tier they came from; if the GPU
//! cache changed between the lookup and the admission so that loaded tokens end up
//! recomputed (rare), they are taken off the slowest tiers first.
//!
//! **Store losses.** When a store loses its tensors (node down, store restart), plans not
//! started that name it are dropped; parked requests loading from it release their blocks and
//! go back to the head of the queue; running (layer-wise) members whose load from it is still
//! in flight are preempted. Either way their loaded tokens are recomputed and no longer count
//! as reused, and the groups still in flight are ignored when they arrive.
//!
//! **Memory.** `num_blocks = floor((tp x GPU memory - weights - tp x reserve) / (block_size x
//! KV bytes per token))`, computed by the scenario when it is validated.

mod running;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use running::Running;
#[cfg(test)]
use spare::MAX_SPARE;
use spare::Spare;

use super::kv::{Blocks, GpuPool};
use super::kv_events::KvPublisher;
use super::msg::{Completion, Lookup, Msg, Output};
use crate::actor::{Actor, ActorId, Context, Hot, Medium, Work, unexpected};
use crate::backend::{BatchBackend, LoadItem, Member, Sampled};
use crate::hardware::Place;
use crate::metrics::Tier;
use crate::metrics::{InstanceStats, Report};
use crate::model::cost::BatchShape;
use crate::serving::kv::prompt_hashes::{ChainHashes, PromptHashes};
use crate::serving::policy::Policy;
use crate::serving::store::directory::{LoadGroup, LoadPlan, Location};
use crate::serving::store::{LoadChoice, LoadOverlap};
use crate::units::Nanos;
use crate::workload::{ReqId, Trace};

/// Limits and sizes of one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceConfig {
    pub block_size: u32,
    pub num_blocks: u32,
    pub max_num_seqs: u32,
    pub max_batched_tokens: u32,
    pub max_waiting: u32,
}

/// How an instance reaches the distributed prefix store.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreLink {
    pub metadata: ActorId,
    /// Store server of every node, by node.
    pub servers: Vec<ActorId>,
    pub node: u32,
    pub tensor_tokens: u32,
    pub tensor_bytes: u64,
    /// How loads overlap compute (`store.load_overlap`).
    pub overlap: LoadOverlap,
    /// Whether a plan is loaded whole, or only where faster than recomputing.
    pub load: LoadChoice,
    /// How a load from another node's host memory reaches the GPU.
    pub staging: crate::hardware::RemoteKvPath,
    /// The model's layer count: a layer-wise load delivers `1/layers` of its bytes per layer.
    pub layers: u32,
    /// The store's scope as the ids of this instance's tensors carry it: `None` across the
    /// cluster (a tensor's id is its prefix's hash), otherwise a namespace (its node's, or its
    /// own) mixed into every id, so that the store finds only what was stored from within the
    /// scope.
    pub namespace: Option<u64>,
}

/// The store's id of the tensor whose chunk ends with the block of hash `last`, named within
/// `namespace` (see [`StoreLink::namespace`]).
pub fn tensor_id(namespace: Option<u64>, last: u64) -> crate::serving::store::directory::TensorId {
    namespace.map_or(last, |n| crate::hash::mix(last, n))
}

/// A request in the instance. `repr(C)` and 64-byte aligned, with what every iteration reads and
/// writes of every running sequence (its counters, its load, the pointer to its cold part and its
/// block count) in the first 64 bytes: an iteration over a batch of hundreds touches one cache line
/// per sequence (at cluster scale the instance is cold when its event comes), and a decoding
/// sequence's visit (a new block, or a token) reads no other unless its pool keeps block ids; its
/// blocks' pieces, in the second line, are read by admission, registration and release. With the
/// cold part's pointer in the second line, each visit would ask for both. The rest is boxed
/// ([`Cold`]), so that a sequence is two lines: a sequence moves whenever it changes queues, and
/// moving a whole record (seven lines) would read and write lines no iteration needs.
#[derive(Debug)]
#[repr(C, align(64))]
struct Seq {
    req: ReqId,
    prompt_len: u32,
    output_len: u32,
    generated: u32,
    /// Tokens whose KV is in this instance's cache.
    computed: u32,
    /// Tokens scheduled in the running iteration.
    scheduled: u32,
    /// Prompt blocks registration is done with: registered in the pool, or beyond its hashes
    /// (never registered), so that decoding never reads the hashes.
    registered: u32,
    /// Whether the prompt's tensors were written to the store.
    stored: bool,
    /// Whether it finished in the iteration being applied (it leaves `running` at the end).
    done: bool,
    /// Its store load, from the lookup reply until the load's results are applied.
    load: Option<Box<Load>>,
    /// What only admission, a store load, a preemption or the end reads: boxed, so that a
    /// sequence is two cache lines and moving it (between queues) copies those, not the
    /// whole record.
    cold: Box<Cold>,
    /// Its count first, in the first line; its pieces (read by registration, admission and
    /// release) in the second.
    blocks: Blocks,
}

/// The parts of a request in the instance that no iteration reads (see [`Seq::cold`]).
#[derive(Debug, Default)]
struct Cold {
    /// Hashes of the prompt's full blocks (empty unless the policy looks in GPU memory or
    /// uses the store), sharing the memo's arrays: read at admission and as the prompt's
    /// blocks fill.
    hashes: ChainHashes,
    admitted_at: Option<Nanos>,
    /// Reused prompt tokens by tier, fixed at the first admission.
    reused: [u32; Tier::ALL.len()],
    preemptions: u32,
    /// Bytes loaded from each tier.
    loaded_bytes: [u64; Tier::ALL.len()],
    /// Leading chunks the store held at the lookup.
    stored_chunks: u32,
    /// Tokens loaded from the store: `[load_start, load_end)`.
    load_start: u32,
    load_end: u32,
    /// Planned tokens per tier of the load.
    planned: [u32; Tier::ALL.len()],
    /// Tensor ids of the prompt's full chunks (store policies).
    chain: Vec<u64>,
    /// Remote tensors to copy into the local replica cache once loaded.
    replicate: Vec<u64>,
    /// Real backends only: the tokens it generated, the token its running iteration sampled
    /// (applied with the iteration's results), and its first token's logits.
    out: Vec<u32>,
    pending: Option<Sampled>,
    first_logits: Option<Vec<f32>>,
}

/// A store load: planned at the lookup reply, started at admission (see the module doc).
#[derive(Debug)]
struct Load {
    groups: Vec<LoadGroup>,
    /// Groups in flight.
    pending: u32,
    /// When the groups started (`None`: not started yet), and when the last one arrived.
    started: Option<Nanos>,
    arrived: Option<Nanos>,
}

impl Load {
    /// Whether a group comes from `node`.
    fn from(&self, node: u32) -> bool {
        self.groups.iter().any(|g| g.node == node)
    }

    fn in_flight(&self) -> bool {
        self.started.is_some() && self.pending > 0
    }
}

/// Where the iteration in flight stands: layer-wise loads can hold it past its compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Its compute work is running.
    Compute,
    /// Its compute ended at the given time; a member's load has not arrived yet.
    Loads(Nanos),
    /// Layers that waited for their KV are computing (`Work::Compute` of the time left).
    Tail,
}

impl Seq {
    fn known_tokens(&self) -> u32 {
        self.prompt_len + self.generated
    }
}

/// The serving-instance actor.
pub struct Instance {
    /// Faults: crashed with its node (it drops every message).
    crashed: bool,
    /// The backend computes real tensors (see [`BatchBackend::real`]): the generated tokens
    /// and first-token logits of finished requests.
    real: bool,
    /// Whether decoding sequences may be steady (see [`running`]): not with a real backend,
    /// whose every member samples a token of its own, nor in the tests that check the
    /// scheduler against itself visiting every sequence.
    lockstep: bool,
    look_in_gpu: bool,
    index: u32,
    router: ActorId,
    cfg: InstanceConfig,
    busy_since: Option<Nanos>,
    /// Where the iteration in flight stands (meaningful while `busy_since` is set).
    phase: Phase,
    policy: Arc<Policy>,
    /// Prices (or runs) each iteration.
    backend: Box<dyn BatchBackend>,
    stats: InstanceStats,
    trace: Arc<Trace>,
    /// The prompts' block hashes (a memo shared by the actors of a simulation).
    hashes: Arc<PromptHashes>,
    running: Running,
    /// Positions of the running sequences an iteration visits (at most `max_num_seqs`),
    /// kept between iterations so that its buffer is allocated once.
    visit: Vec<u32>,
    waiting: VecDeque<Seq>,
    /// Buffers of finished requests, for the next ones.
    spare: Spare,
    store: Option<StoreLink>,
    /// Requests waiting for their store lookup: a list, not a map. An instance has one or
    /// two at a time, and an ordered map would allocate a node with room for eleven sequences
    /// (1.5 KiB) whenever it goes from empty to one, and free it when it goes back: at most
    /// requests of a store policy.
    loading: Vec<Seq>,
    pool: GpuPool,
    /// Admitted under `load_overlap = "none"`, holding blocks while their loads are in flight.
    parked: Vec<Seq>,
    /// Broken invariants and unexpected messages (errors are values).
    violations: Vec<String>,
    /// Faults: store losses learned of, and load groups still to arrive for loads abandoned
    /// because their source was lost.
    losses: u32,
    stale_loads: BTreeMap<ReqId, u32>,
    /// Load groups that failed (their source lost its memory mid-read).
    failed_loads: u64,
    /// Publishes its GPU cache's KV events (`router = "kv-aware"` only; see [`events`]).
    kv_events: Option<KvPublisher>,
}

/// Most sequences an instance makes room for in its batch when it is built (`max_num_seqs` if
/// smaller): 8 KiB, more than a batch's usual size under load. Growing the batch's list from empty
/// would take about seven reallocations an instance, each an aligned allocation past the small
/// sizes, which glibc's allocator serves only after merging every small free chunk it holds
/// (`malloc_consolidate`): at cluster scale, with thousands of instances, those merges are a
/// visible part of a run.
const RUNNING_RESERVE: u32 = 64;

impl Instance {
    pub fn new(
        index: u32,
        router: ActorId,
        trace: Arc<Trace>,
        policy: Arc<Policy>,
        cfg: InstanceConfig,
        store: Option<StoreLink>,
        backend: Box<dyn BatchBackend>,
    ) -> Instance {
        let look_in_gpu = policy.lookup_tiers().contains(&Tier::Gpu);
        debug_assert_eq!(store.is_some(), policy.uses_store());
        Instance {
            index,
            router,
            hashes: Arc::new(PromptHashes::new(trace.clone())),
            trace,
            // A backend that keeps KV by block needs the ids; a simulated one only counts.
            pool: GpuPool::new(
                cfg.num_blocks,
                policy.keep_gpu_blocks(),
                backend.real(),
                policy.gpu_eviction,
            ),
            policy,
            cfg,
            waiting: VecDeque::new(),
            running: Running::with_capacity(cfg.max_num_seqs.min(RUNNING_RESERVE) as usize),
            visit: Vec::new(),
            lockstep: !backend.real(),
            parked: Vec::new(),
            busy_since: None,
            phase: Phase::Compute,
            stats: InstanceStats::default(),
            look_in_gpu,
            store,
            loading: Vec::new(),
            violations: Vec::new(),
            crashed: false,
            losses: 0,
            failed_loads: 0,
            stale_loads: BTreeMap::new(),
            real: backend.real(),
            spare: Spare::default(),
            kv_events: None,
            backend,
        }
    }

    /// Takes the prompts' block hashes from `hashes` (shared with the other actors).
    pub fn with_prompt_hashes(mut self, hashes: Arc<PromptHashes>) -> Instance {
        self.hashes = hashes;
        self
    }

    pub fn stats(&self) -> InstanceStats {
        InstanceStats {
            pool: self.pool.stats(),
            ..self.stats
        }
    }

    /// Requests looking up, queued, parked or running.
    pub fn load(&self) -> usize {
        self.loading.len() + self.waiting.len() + self.parked.len() + self.running.len()
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.cfg.block_size)
    }

    /// Blocks that `tokens` need beyond `held`: `blocks_for(tokens) - held`, or none; without
    /// a division when they fit (a decoding sequence needs a block every `block_size` steps).
    #[inline]
    fn blocks_past(&self, tokens: u32, held: u32) -> u32 {
        if u64::from(tokens) <= u64::from(held) * u64::from(self.cfg.block_size) {
            0
        } else {
            self.blocks_for(tokens) - held
        }
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
        let hashes = if self.look_in_gpu || self.store.is_some() {
            self.hashes.chain_hashes(req, self.cfg.block_size as usize)
        } else {
            ChainHashes::default()
        };
        let mut seq = Seq {
            req,
            prompt_len: r.prompt_tokens,
            output_len: r.output_tokens,
            generated: 0,
            computed: 0,
            scheduled: 0,
            blocks: self.spare.blocks.pop().unwrap_or_default(),
            registered: 0,
            done: false,
            stored: false,
            load: None,
            cold: self.spare.cold(),
        };
        seq.cold.hashes = hashes;
        if let Some(st) = &self.store {
            // A tensor's id is the hash of the last block of its chunk (hashes are chained).
            let per = (st.tensor_tokens / self.cfg.block_size) as usize;
            let hashes = &seq.cold.hashes;
            let id = |h: u64| tensor_id(st.namespace, h);
            (seq.cold.chain).extend((1..=hashes.len() / per).map(|c| id(hashes.get(c * per - 1))));
            let gpu_blocks = if self.look_in_gpu {
                self.pool
                    .longest_cached_prefix(&seq.cold.hashes, seq.cold.hashes.len())
                    .0
            } else {
                0
            };
            let skip = gpu_blocks / (per as u32);
            if (skip as usize) < seq.cold.chain.len() {
                seq.cold.load_start = skip * st.tensor_tokens;
                let lookup = Lookup {
                    req,
                    from: ctx.me(),
                    node: st.node,
                    chain: seq.cold.chain.clone(),
                    skip,
                };
                let bytes = 16 + 8 * lookup.chain.len() as u64;
                ctx.send(st.metadata, Msg::Lookup(Box::new(lookup)), bytes);
                // A request is submitted to an instance once (a failover goes to another).
                debug_assert!(self.loading.iter().all(|s| s.req != req));
                self.loading.push(seq);
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

    /// Gives `seq`'s KV blocks back to the pool: what they held must be computed again.
    fn release_blocks(&mut self, seq: &mut Seq) {
        self.pool.release(&mut seq.blocks);
        seq.computed = 0;
        seq.scheduled = 0;
        seq.registered = 0;
        seq.cold.pending = None;
    }

    fn preempt(&mut self, mut seq: Seq) {
        self.abandon_load(&mut seq);
        self.release_blocks(&mut seq);
        // The loaded prefix went with the blocks: what the GPU cache no longer holds is
        // recomputed on re-admission.
        seq.cold.load_start = 0;
        seq.cold.load_end = 0;
        seq.cold.preemptions += 1;
        self.stats.preemptions += 1;
        self.waiting.push_front(seq);
    }
}

impl Actor<Msg> for Instance {
    fn start(&mut self, ctx: &mut dyn Context<Msg>) {
        self.kv_cleared(ctx);
    }

    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        if self.crashed {
            return;
        }
        match msg {
            Msg::Submit(req) => self.submit(req, ctx),
            Msg::WorkDone => self.work_done(ctx),
            Msg::LookupReply(req, plan, losses) => self.lookup_reply(req, *plan, losses, ctx),
            Msg::Crash => self.crashed = true,
            Msg::PublishKv => self.kv_timer(ctx),
            Msg::NodeDown(node) | Msg::StoreLost(node) => self.store_lost(node, ctx),
            Msg::Loaded(req) => self.loaded(req, ctx),
            Msg::LoadFailed(req) => self.load_failed(req, ctx),
            // Another actor's process was lost: a load from it fails as its read does (a
            // plan naming it reads from the empty store that replaced it, and recomputes).
            Msg::ActorLost(_) => {}
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

    /// Its next event (most often an iteration's end) reads the running batch's `due` words
    /// (which sequences to visit: the steady ones are not read), then asks its backend for the
    /// next iteration's cost and its pool for blocks.
    fn hot(&self) -> Hot {
        let (base, bytes) = self.running.due_bytes();
        let h = Hot {
            base,
            stride: 64,
            count: bytes.div_ceil(64).min(u16::MAX as usize) as u16,
            ..Hot::default()
        };
        self.pool.hint(h.with(0, &*self.backend))
    }

    fn report(&mut self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
        report.failed_loads += self.failed_loads;
        if self.crashed {
            // Its state stopped at the crash; the router accounted for its requests.
            report.instances.push(self.stats());
            return;
        }
        let idle = self.busy_since.is_none() && self.load() == 0;
        // The pool's full check (`Actor::check`) walks all of its blocks and index slots: the
        // host runs it at the end where checks are on; what is always checked is the count.
        if idle && self.pool.free_blocks() != self.pool.num_blocks() {
            report.violations.push(format!(
                "instance {}: {} of {} blocks still held after the last request",
                self.index,
                self.pool.num_blocks() - self.pool.free_blocks(),
                self.pool.num_blocks()
            ));
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
mod events;
mod schedule;
mod spare;
mod store;
#[cfg(test)]
mod tests;
