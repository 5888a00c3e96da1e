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
//! left, and their first chunk's blocks are free. A request whose prompt and output could never fit in the whole KV memory,
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

use super::block_pool::{BlockPool, Blocks};
use super::msg::{Completion, Lookup, Msg};
use crate::actor::{Actor, ActorId, Context, Hot, Medium, Work, unexpected};
use crate::backend::{BatchBackend, LoadItem, Member, Sampled};
use crate::hardware::Place;
use crate::metrics::Tier;
use crate::metrics::{InstanceStats, Report};
use crate::model::cost::BatchShape;
use crate::serving::policy::Policy;
use crate::serving::prompt_hashes::{ChainHashes, PromptHashes};
use crate::serving::store::LoadOverlap;
use crate::serving::store::directory::{LoadGroup, LoadPlan, Location};
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
    /// The model's layer count: a layer-wise load delivers `1/layers` of its bytes per layer.
    pub layers: u32,
}

thread_local! {
    /// Positions of the running sequences an iteration visits: one buffer a thread, which its
    /// instances take in turn, so that it stays in the first-level cache (a buffer of each
    /// instance's own was a cold line, read and written, at every iteration's end at 2,240
    /// GPUs). At most `max_num_seqs` long.
    static VISIT: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The thread's visit buffer (empty if it is out: nobody takes it twice).
fn take_visit() -> Vec<u32> {
    VISIT.with(std::cell::Cell::take)
}

/// Gives the visit buffer back.
fn put_visit(visit: Vec<u32>) {
    VISIT.with(|v| v.set(visit));
}

/// A request in the instance. `repr(C)` and 64-byte aligned, with what every iteration reads
/// and writes of every running sequence (its counters, its load, the pointer to its cold part
/// and its block count) in the first 64 bytes: an iteration over a batch of hundreds touches
/// one cache line per sequence (at cluster scale the instance is cold when its event comes),
/// and a decoding sequence's visit (a new block, or a token) reads no other unless its pool
/// keeps block ids; its blocks' pieces, in the second line, are read by admission, registration
/// and release. With the cold part's pointer in the second line, each visit asked for both
/// (`sim_scale` at 2,240 GPUs, three-round pairs, this against it: local-prefix 1.016 (six),
/// vanilla 1.009, evostore 1.011 (four each); local-prefix at 32 GPUs 1.013 (three)). The rest
/// is boxed ([`Cold`]), so that a sequence is two lines: a sequence moves whenever it changes
/// queues (and, before the batch kept its sequences in slots, see [`running`], whenever one
/// before it in the batch finished), and moving a whole record (seven lines) read and wrote
/// lines no iteration needs (`perf`: a twentieth of vanilla's time at 2,240 GPUs was those
/// copies).
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
///
/// `repr(C)`, what an iteration reads first: the prompt's hashes (which a caching policy
/// reads as the prompt's blocks fill), then what the request's record takes when it finishes,
/// in the first [`Cold::READ`] bytes; the store policies' plans and a live run's tokens after
/// them. The iteration that visits a sequence asks for exactly those bytes, two lines or
/// three. In the compiler's order it asked for the record's first line and for the line where
/// the hashes began, and the part of them that registration reads lay in the next line half
/// the time (a record is 16-byte aligned): `perf` put 11-12 % of the iteration's samples at
/// 2,240 GPUs on that read. Not aligned to a line: an aligned record is allocated apart from
/// glibc's usual chunks, and the allocator's misses grew by more than the record's fell
/// (`cachegrind`: 1.2 M more in `sim_scale`'s local-prefix round at 2,240 GPUs). This order,
/// the kept records in place ([`Spare`]) and the lookup's hint ([`Instance::hint_lookup`])
/// were timed together: see "Twenty-ninth session" in `docs/performance.md`.
#[derive(Debug, Default)]
#[repr(C)]
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

impl Cold {
    /// The leading bytes an iteration reads: the hashes and a finished request's record.
    const READ: usize =
        std::mem::offset_of!(Cold, loaded_bytes) + std::mem::size_of::<[u64; Tier::ALL.len()]>();
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
///
/// **Hot first.** The host asks for the first `ACTOR_BYTES` (`crate::sim::host`) of an actor
/// ahead of its event (at cluster scale an instance is cold at every event), so the fields
/// that every event reads come first, in the order written (`repr(C)`), then the pool, then
/// what faults, real backends and reports read. In the compiler's own order (by alignment),
/// the flags and small fields that each event reads first (`crashed`, `cfg`, `router`,
/// `real`) and the policy, backend and stats sat past byte 688 of 840, beyond the lines
/// asked for, and rarely read lists before them (`sim_scale`'s local-prefix round at 2,240
/// GPUs: `handle`'s first read of `crashed` was 15 % of its samples). A test holds the hot
/// fields within the bytes asked for. `sim_scale` at 2,240 GPUs, three-round pairs against
/// the compiler's order: local-prefix medians 1.032 and 1.011, evostore 1.026 (a noisy hour:
/// single pairs from 0.81 to 1.39).
#[repr(C)]
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
    /// The first hash of the waiting request that admission looks up next, where it was at
    /// hand (see [`Instance::hint_lookup`]).
    lookup_hint: Option<u64>,
    policy: Arc<dyn Policy>,
    /// Prices (or runs) each iteration.
    backend: Box<dyn BatchBackend>,
    stats: InstanceStats,
    trace: Arc<Trace>,
    /// The prompts' block hashes (a memo shared by the actors of a simulation).
    hashes: Arc<PromptHashes>,
    running: Running,
    waiting: VecDeque<Seq>,
    /// Buffers of finished requests, for the next ones.
    spare: Spare,
    store: Option<StoreLink>,
    /// Requests waiting for their store lookup: a list, not a map. An instance has one or
    /// two at a time, and an ordered map allocated a node with room for eleven sequences
    /// (1.5 KiB) whenever it went from empty to one, and freed it when it went back: at most
    /// requests of a store policy.
    loading: Vec<Seq>,
    pool: BlockPool,
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
    outputs: Vec<(u32, Vec<u32>)>,
    first_logits: Vec<(u32, Vec<f32>)>,
}

/// Most sequences an instance makes room for in its batch when it is built (`max_num_seqs`
/// if smaller): 8 KiB, more than a batch's usual size under load. Growing the batch's list
/// from empty took about seven reallocations an instance, each an aligned allocation past
/// the small sizes, which glibc's allocator serves only after merging every small free chunk
/// it holds (`malloc_consolidate`): vanilla on 2,240 GPUs (`sim_scale`'s 300,000 requests)
/// made 10,033 such merges with an empty list and 3,414 with this room; they were 1.9 % of
/// its samples.
const RUNNING_RESERVE: u32 = 64;

/// Most buffers an instance keeps for reuse. An instance admits a few requests between two
/// that finish, so a few cover them; the bound keeps what waits small.
const MAX_SPARE: usize = 4;

/// Buffers that finished requests leave for the next ones: a new request's block list and
/// cold record reuse one instead of allocating, and the memory they land in is likely still
/// in the cache (at cluster scale, a fresh allocation is a cold one, and its free at the end
/// of the request another miss). (A request's hashes are shared arrays, see
/// [`crate::serving::prompt_hashes`]: nothing to reuse.)
#[derive(Debug, Default)]
struct Spare {
    blocks: Vec<Blocks>,
    /// Kept records, `colds[..n_colds]`, boxed as the sequences hold them: a kept record goes
    /// back to a sequence as it is. In place, not in a list of their own: [`Spare::hint`]
    /// reads the pointer of the one it asks for, and in a list's buffer that read was a cache
    /// miss of its own at every submission at 2,240 GPUs (`perf`: 1 % of `sim_scale`'s
    /// local-prefix samples on the instruction after it), where the instance's own lines are
    /// asked for before its event.
    colds: [Option<Box<Cold>>; MAX_SPARE],
    n_colds: usize,
}

impl Spare {
    /// Keeps the buffers of `seq`, which finished and released its blocks. A real backend's
    /// block list keeps its capacity for the request's most blocks and is not kept.
    fn keep(&mut self, mut seq: Seq, real: bool) {
        if !real && self.blocks.len() < MAX_SPARE && seq.blocks.is_empty() {
            self.blocks.push(std::mem::take(&mut seq.blocks));
        }
        if self.n_colds < MAX_SPARE {
            // Its hashes go now, as they did with the request (the arrays are shared).
            seq.cold.hashes = ChainHashes::default();
            self.colds[self.n_colds] = Some(seq.cold);
            self.n_colds += 1;
        }
    }

    /// Asks for the records the next request takes (a cache hint, see
    /// [`crate::sim::prefetch`]): at 2,240 GPUs they were kept many events ago, and reading
    /// them as the request's sequence is built was a third of the time of a submission.
    fn hint(&self) {
        if let Some(b) = self.blocks.last() {
            crate::sim::prefetch::bytes((&raw const *b).cast(), std::mem::size_of::<Blocks>());
        }
        if let Some(Some(c)) = self.n_colds.checked_sub(1).map(|i| &self.colds[i]) {
            crate::sim::prefetch::bytes((&raw const **c).cast(), std::mem::size_of::<Cold>());
        }
    }

    /// A cold record as new (`Cold::default()`), reusing a kept one's lists.
    fn cold(&mut self) -> Box<Cold> {
        let Some(mut c) = self.n_colds.checked_sub(1).and_then(|i| {
            self.n_colds = i;
            self.colds[i].take()
        }) else {
            return Box::default();
        };
        let (mut chain, mut replicate, mut out) = (
            std::mem::take(&mut c.chain),
            std::mem::take(&mut c.replicate),
            std::mem::take(&mut c.out),
        );
        chain.clear();
        replicate.clear();
        out.clear();
        *c = Cold {
            chain,
            replicate,
            out,
            ..Cold::default()
        };
        c
    }
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
            hashes: Arc::new(PromptHashes::new(trace.clone())),
            trace,
            // A backend that keeps KV by block needs the ids; a simulated one only counts.
            pool: BlockPool::new(cfg.num_blocks, policy.keep_gpu_blocks(), backend.real()),
            policy,
            cfg,
            waiting: VecDeque::new(),
            running: Running::with_capacity(cfg.max_num_seqs.min(RUNNING_RESERVE) as usize),
            lockstep: !backend.real(),
            parked: Vec::new(),
            busy_since: None,
            lookup_hint: None,
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
            outputs: Vec::new(),
            first_logits: Vec::new(),
            spare: Spare::default(),
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
            pool: self.pool.stats,
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
        self.spare.hint();
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
            (seq.cold.chain).extend((1..=hashes.len() / per).map(|c| hashes.get(c * per - 1)));
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
        if self.waiting.is_empty() {
            self.lookup_hint = self.first_hash(&seq);
        }
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
        self.lookup_hint = self.first_hash(&seq);
        self.waiting.push_front(seq);
    }

    /// The first hash of `seq`'s prompt, if admission looks it up in the pool.
    fn first_hash(&self, seq: &Seq) -> Option<u64> {
        let hashes = &seq.cold.hashes;
        (self.look_in_gpu && !hashes.is_empty()).then(|| hashes.get(0))
    }

    /// Asks for the pool's index slot that the next admission's lookup reads first (a cache
    /// hint, see [`crate::sim::prefetch`]): the waiting request at the head of the queue
    /// is looked up at the end of the iteration, after its sequences are visited, and at
    /// 2,240 GPUs that slot was the most waited-for load of `sim_scale`'s local-prefix round
    /// (`perf`: 3.5-4.5 % of its samples on the instruction after it; a quarter to a half
    /// fewer with this hint).
    fn hint_lookup(&self) {
        if let Some(h) = self.lookup_hint {
            self.pool.hint_lookup(h);
        }
    }

    /// Plans and starts the next iteration, if there is anything to compute.
    fn step(&mut self, ctx: &mut dyn Context<Msg>) {
        debug_assert!(self.busy_since.is_none());
        let mut budget = self.cfg.max_batched_tokens;
        let mut shape = BatchShape::default();
        let preempted = if self.lockstep_step(&mut budget, &mut shape) {
            false
        } else {
            self.running.materialize_all();
            self.schedule_each(&mut budget, &mut shape)
        };
        if !preempted {
            self.admit(&mut budget, &mut shape, ctx);
        }
        if shape.is_empty() {
            return;
        }
        self.stats.iterations += 1;
        self.busy_since = Some(ctx.now());
        self.phase = Phase::Compute;
        let ran = if self.real {
            self.run_members(&shape)
        } else {
            self.backend.iteration(&shape, &mut [])
        };
        let duration = match ran {
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

    /// Schedules the running sequences one by one, in admission order, as the module doc
    /// says: each takes what it has left to compute within the budget left, and needs its
    /// blocks, for which the most recently admitted are preempted. Every sequence must be
    /// active. Returns whether one was preempted.
    fn schedule_each(&mut self, budget: &mut u32, shape: &mut BatchShape) -> bool {
        let mut preempted = false;
        let mut i = 0;
        // Bounded by the number of running sequences, which only shrinks inside the loop.
        'running: while i < self.running.len() && *budget > 0 {
            let seq = &self.running[i];
            let n = (seq.known_tokens() - seq.computed).min(*budget);
            let need = self.blocks_past(seq.computed + n, seq.blocks.len() as u32);
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
            // A decoding sequence needs a block once every `block_size` iterations: the pool
            // is called only then (a call for none changes nothing; such calls were 7 % of
            // local-prefix's instructions at 560 nodes).
            if need > 0 {
                let ok = self.pool.allocate(need, &mut seq.blocks);
                debug_assert!(ok);
            }
            seq.scheduled = n;
            shape.add(
                n as u64,
                seq.computed as u64,
                seq.computed + n == seq.known_tokens(),
            );
            *budget -= n;
            i += 1;
        }
        preempted
    }

    /// Schedules the running sequences as [`Self::schedule_each`] would, visiting only the
    /// active ones and the steady ones that are due, if the budget holds what every sequence
    /// has left to compute and the free blocks what they need (then each takes all it has
    /// left, in admission order, nobody is preempted, and the steady ones each take their one
    /// token and need no block). Returns false, having changed nothing but made the due
    /// sequences active, where that does not hold.
    fn lockstep_step(&mut self, budget: &mut u32, shape: &mut BatchShape) -> bool {
        let mut visit = take_visit();
        self.running.due_now(&mut visit);
        for &i in &visit {
            self.running.materialize(i as usize);
        }
        let (steady, steady_computed) = self.running.steady();
        let mut demand = steady;
        let mut need_all = 0u64;
        for &i in &visit {
            let seq = &self.running[i as usize];
            let n = seq.known_tokens() - seq.computed;
            demand += u64::from(n);
            need_all += u64::from(self.blocks_past(seq.known_tokens(), seq.blocks.len() as u32));
        }
        let fits = demand <= u64::from(*budget) && need_all <= u64::from(self.pool.free_blocks());
        if fits {
            for &i in &visit {
                let seq = &self.running[i as usize];
                let n = seq.known_tokens() - seq.computed;
                let need = self.blocks_past(seq.known_tokens(), seq.blocks.len() as u32);
                let seq = &mut self.running[i as usize];
                if need > 0 {
                    let ok = self.pool.allocate(need, &mut seq.blocks);
                    debug_assert!(ok);
                }
                seq.scheduled = n;
                shape.add(n as u64, seq.computed as u64, true);
            }
            shape.add_decoding(steady, steady_computed);
            *budget -= demand as u32;
        }
        put_visit(visit);
        fits
    }

    /// Runs the iteration on a real backend: its members are the running sequences with
    /// tokens scheduled; each one's sampled token waits in it until the iteration's results
    /// are applied.
    fn run_members(&mut self, shape: &BatchShape) -> Result<Nanos, crate::backend::BackendError> {
        let mut members: Vec<Member<'_>> = self
            .running
            .iter()
            .filter(|s| s.scheduled > 0)
            .map(|s| Member {
                req: s.req,
                blocks: s.blocks.ids(),
                computed: s.computed,
                n: s.scheduled,
                generated: &s.cold.out,
                sampled: None,
            })
            .collect();
        let r = self.backend.iteration(shape, &mut members);
        let sampled: Vec<Option<Sampled>> = members.into_iter().map(|m| m.sampled).collect();
        let mut sampled = sampled.into_iter();
        for i in 0..self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled > 0 {
                let Some(got) = sampled.next() else {
                    break;
                };
                seq.cold.pending = got;
            }
        }
        r
    }

    /// Admits waiting requests in arrival order while `max_num_seqs` allows, budget is left
    /// and their blocks are free; starts the loads of those with a store plan.
    fn admit(&mut self, budget: &mut u32, shape: &mut BatchShape, ctx: &mut dyn Context<Msg>) {
        let overlap = self.store.as_ref().map(|st| st.overlap);
        // Bounded: every pass admits one request or stops.
        while *budget > 0 && self.running.len() + self.parked.len() < self.cfg.max_num_seqs as usize
        {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            // Reuse at most up to the last prompt token, which must be computed.
            let reusable = ((seq.known_tokens() - 1) / self.cfg.block_size) as usize;
            let (hits, hits_free) = if self.look_in_gpu {
                self.pool.longest_cached_prefix(&seq.cold.hashes, reusable)
            } else {
                (0, 0)
            };
            let gpu_tokens = hits * self.cfg.block_size;
            let aligned_max = reusable as u32 * self.cfg.block_size;
            // The plan is usable if it extends the GPU hits: it starts within them and brings
            // tokens beyond them.
            let store_usable = seq.load.is_some()
                && seq.cold.load_end.min(aligned_max) > gpu_tokens
                && gpu_tokens >= seq.cold.load_start;
            let cached = if store_usable {
                seq.cold.load_end.min(aligned_max)
            } else {
                gpu_tokens
            };
            let park = store_usable && overlap == Some(LoadOverlap::None);
            let n = if park {
                0
            } else {
                (seq.known_tokens() - cached).min(*budget)
            };
            let need = self.blocks_for(cached + n) - hits;
            if need > self.pool.free_blocks() - hits_free {
                self.lookup_hint = self.first_hash(seq);
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            // The next one's hashes are not at hand (they are read if it is looked up now).
            self.lookup_hint = None;
            if self.real && seq.blocks.capacity() == 0 {
                // Once, for the most blocks it can hold (a preemption keeps the capacity): no
                // growth of the list as decoding fills blocks.
                let most = seq.prompt_len + seq.output_len - 1;
                seq.blocks.reserve_exact(self.blocks_for(most) as usize);
            }
            self.pool
                .take_cached(&seq.cold.hashes, hits as usize, &mut seq.blocks);
            let ok = self.pool.allocate(need, &mut seq.blocks);
            debug_assert!(ok);
            if seq.cold.admitted_at.is_none() {
                seq.cold.admitted_at = Some(ctx.now());
                seq.cold.reused = seq.cold.planned;
                seq.cold.reused[Tier::Gpu as usize] = gpu_tokens;
                let from_store = if store_usable { cached - gpu_tokens } else { 0 };
                let mut excess = seq.cold.planned.iter().sum::<u32>() - from_store;
                for tier in Tier::ALL[1..].iter().rev() {
                    let take = excess.min(seq.cold.reused[*tier as usize]);
                    seq.cold.reused[*tier as usize] -= take;
                    excess -= take;
                }
            }
            if store_usable {
                self.start_load(&mut seq, gpu_tokens..cached, ctx);
            } else if seq.load.is_some() {
                // Nothing to load beyond the GPU hits: the plan is not started.
                Self::without_load(&mut seq);
            }
            seq.computed = cached;
            seq.registered = hits;
            seq.scheduled = n;
            if park {
                self.parked.push(seq);
                continue;
            }
            shape.add(n as u64, cached as u64, cached + n == seq.known_tokens());
            *budget -= n;
            self.running.push(seq);
        }
    }

    /// Handles the end of a piece of compute work: the iteration's compute, or the layers
    /// that waited for layer-wise loads.
    fn work_done(&mut self, ctx: &mut dyn Context<Msg>) {
        match (self.busy_since, self.phase) {
            (Some(_), Phase::Compute) => self.compute_done(ctx.now(), ctx),
            (Some(_), Phase::Tail) => self.finish_iteration(ctx),
            _ => {
                let me = format!("instance {}", self.index);
                unexpected(
                    &mut self.violations,
                    &me,
                    &"a work-done notice with no work in flight",
                );
            }
        }
    }

    /// Applies the results of the iteration that just ended.
    pub(super) fn finish_iteration(&mut self, ctx: &mut dyn Context<Msg>) {
        let Some(started) = self.busy_since.take() else {
            return;
        };
        self.phase = Phase::Compute;
        self.stats.busy += ctx.now() - started;
        let keep = self.policy.keep_gpu_blocks();
        let block_size = self.cfg.block_size;
        let mut finished = false;
        // The steady sequences (see [`running`]) each computed one token and sampled the
        // next; none of them finished or filled a prompt block: the tick below applies that.
        // The others are visited, in admission order; finished ones are marked and leave
        // `running` at the end (keeping the admission order of the others).
        self.running.hint_visits();
        self.hint_lookup();
        let mut visit = take_visit();
        self.running.due_now(&mut visit);
        for (k, &i) in visit.iter().enumerate() {
            // The cold part of the sequence two visits on (its prompt's hashes as its blocks
            // fill, its record as it finishes: the bytes `Cold::READ` counts): its pointer is
            // in a line already asked for.
            if let Some(&j) = visit.get(k + 2) {
                let cold: &Cold = &self.running[j as usize].cold;
                crate::sim::prefetch::bytes((&raw const *cold).cast(), Cold::READ);
            }
            let seq = &mut self.running[i as usize];
            if seq.scheduled == 0 {
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            // A layer-wise load has been applied with the iteration it started in.
            if seq.load.is_some() {
                seq.load = None;
            }
            // Blocks the prompt filled beyond those registration is done with (a block filled
            // when its last token is computed: no division, and no read of the hashes, unless
            // one did); those past the hashes are never registered, and done with too.
            let prompt_done = seq.computed.min(seq.prompt_len);
            if keep
                && u64::from(seq.registered + 1) * u64::from(block_size) <= u64::from(prompt_done)
            {
                let filled = prompt_done / block_size;
                let full = filled.min(seq.cold.hashes.len() as u32);
                if seq.registered < full {
                    self.pool.register_all(
                        &mut seq.blocks,
                        &seq.cold.hashes,
                        full as usize,
                        seq.registered as usize,
                    );
                }
                seq.registered = filled;
            }
            if !seq.stored
                && seq.computed >= seq.prompt_len
                && let Some(st) = &self.store
            {
                seq.stored = true;
                let new = seq.cold.chain.len() as u64
                    - (seq.cold.stored_chunks as u64).min(seq.cold.chain.len() as u64);
                if new > 0 {
                    let data = if self.real {
                        let first = seq.cold.stored_chunks as usize;
                        let tensors: Vec<(u64, u32)> = (first..seq.cold.chain.len())
                            .map(|k| (seq.cold.chain[k], k as u32 * st.tensor_tokens))
                            .collect();
                        match self
                            .backend
                            .export(seq.blocks.ids(), &tensors, st.tensor_tokens)
                        {
                            Ok(d) => Some(Box::new(d)),
                            Err(e) => {
                                self.violations.push(format!(
                                    "instance {}: request {}: store write: {e}",
                                    self.index, seq.req.0
                                ));
                                None
                            }
                        }
                    } else {
                        None
                    };
                    ctx.send(
                        st.servers[st.node as usize],
                        Msg::StoreWrite {
                            chain: Box::new(seq.cold.chain.clone()),
                            replica: false,
                            data,
                        },
                        new * st.tensor_bytes,
                    );
                }
            }
            if seq.computed < seq.known_tokens() {
                continue;
            }
            // Only a real backend samples tokens.
            if self.real
                && let Some(got) = seq.cold.pending.take()
            {
                seq.cold.out.push(got.token);
                if got.logits.is_some() {
                    seq.cold.first_logits = got.logits;
                }
            }
            seq.generated += 1;
            if seq.generated == 1 {
                ctx.send(self.router, Msg::FirstToken(seq.req, self.index), 4);
            }
            if seq.generated < seq.output_len {
                continue;
            }
            seq.done = true;
            finished = true;
            self.pool.release(&mut seq.blocks);
            if self.real {
                if seq.cold.out.len() != seq.output_len as usize {
                    self.violations.push(format!(
                        "instance {}: request {} generated {} of {} tokens",
                        self.index,
                        seq.req.0,
                        seq.cold.out.len(),
                        seq.output_len
                    ));
                }
                self.outputs
                    .push((seq.req.0, std::mem::take(&mut seq.cold.out)));
                if let Some(l) = seq.cold.first_logits.take() {
                    self.first_logits.push((seq.req.0, l));
                }
            }
            ctx.send(
                self.router,
                Msg::Finished(Box::new(Completion {
                    req: seq.req,
                    instance: self.index,
                    admitted_at: seq.cold.admitted_at.unwrap_or(started),
                    reused: seq.cold.reused,
                    loaded_bytes: seq.cold.loaded_bytes,
                    preemptions: seq.cold.preemptions,
                })),
                4 * (seq.output_len as u64 - 1),
            );
        }
        self.running.advance();
        if self.lockstep {
            for &i in &visit {
                if let Some(due) = self.steady_until(&self.running[i as usize]) {
                    self.running.make_steady(i as usize, due);
                }
            }
        }
        if finished {
            let real = self.real;
            visit.retain(|&i| self.running[i as usize].done);
            let spare = &mut self.spare;
            self.running
                .remove_each(&visit, |seq| spare.keep(seq, real));
        }
        put_visit(visit);
        self.step(ctx);
    }

    /// If `seq` (active, just applied) only decodes from now on until a tick, that tick
    /// (later than now): the first at which it needs a new block or samples its last token.
    /// It decodes if its next iteration computes its one known token, which ends the prompt
    /// (so it has nothing to register or store) and loads nothing, as every iteration after
    /// it until then.
    fn steady_until(&self, seq: &Seq) -> Option<u64> {
        let bs = u64::from(self.cfg.block_size);
        let decodes = !seq.done
            && seq.scheduled == 0
            && seq.load.is_none()
            && seq.computed >= seq.prompt_len
            && seq.known_tokens() - seq.computed == 1
            && (seq.stored || self.store.is_none())
            && !(self.policy.keep_gpu_blocks()
                && (u64::from(seq.registered) + 1) * bs <= u64::from(seq.prompt_len));
        if !decodes {
            return None;
        }
        let now = self.running.tick();
        let room = seq.blocks.len() as u64 * bs - u64::from(seq.computed);
        let left = u64::from(seq.output_len - 1 - seq.generated);
        let due = now + room.min(left);
        (due > now).then_some(due)
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
            Msg::LoadFailed(req) => self.load_failed(req, ctx),
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
        report.outputs.extend(self.outputs.iter().cloned());
        report
            .first_logits
            .extend(self.first_logits.iter().cloned());
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
mod store;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod layout {
    use super::Instance;
    use std::mem::offset_of;

    /// An iteration asks for the first [`super::Cold::READ`] bytes of a visited sequence's
    /// cold part: its hashes, and what a finished request's record takes.
    #[test]
    fn an_iteration_reads_of_a_cold_record_only_the_bytes_it_asks_for() {
        use super::Cold;
        use std::mem::size_of_val;
        let c = Cold::default();
        for (at, bytes) in [
            (offset_of!(Cold, hashes), size_of_val(&c.hashes)),
            (offset_of!(Cold, admitted_at), size_of_val(&c.admitted_at)),
            (offset_of!(Cold, reused), size_of_val(&c.reused)),
            (offset_of!(Cold, preemptions), size_of_val(&c.preemptions)),
            (offset_of!(Cold, loaded_bytes), size_of_val(&c.loaded_bytes)),
        ] {
            assert!(at + bytes <= Cold::READ, "a field at byte {at}");
        }
        // Two lines' worth, or three where the record starts late in a line.
        const { assert!(Cold::READ <= 2 * crate::sim::prefetch::LINE) };
    }

    #[test]
    fn what_every_event_reads_is_in_the_bytes_the_host_asks_for() {
        // The last of the hot fields ends before the pool, and the pool starts within the
        // bytes asked for (its first lines are read by every iteration of a caching policy).
        let hot_end = offset_of!(Instance, loading) + std::mem::size_of::<Vec<super::Seq>>();
        assert!(hot_end <= offset_of!(Instance, pool));
        assert!(offset_of!(Instance, pool) < crate::sim::host::ACTOR_BYTES);
        for at in [
            offset_of!(Instance, crashed),
            offset_of!(Instance, real),
            offset_of!(Instance, cfg),
            offset_of!(Instance, router),
            offset_of!(Instance, policy),
            offset_of!(Instance, backend),
            offset_of!(Instance, stats),
            offset_of!(Instance, running),
        ] {
            assert!(
                at < crate::sim::host::ACTOR_BYTES,
                "a hot field at byte {at}"
            );
        }
    }
}
