//! Host-less tests of the instance: a scripted context, time set by each test.

use super::*;
use crate::actor::Then;
use crate::backend::BackendError;
use crate::rng::Stream;
use crate::serving::policy::{LocalPrefix, Vanilla};
use crate::serving::store::directory::LoadGroup;
use crate::workload::{Request, SegId, TokenArena};
use std::sync::Mutex;

/// A context that records what the instance does; time is set by the test, or by [`run`]
/// from the ends of the work the instance started.
struct Script {
    now: Nanos,
    batches: Vec<BatchShape>,
    sent: Vec<String>,
    rng: Stream,
    log: Arc<Mutex<Vec<BatchShape>>>,
    /// What every iteration's compute takes.
    iteration: Nanos,
    /// When the instance sent each first token, and what it reported of finished requests.
    first_at: Vec<Nanos>,
    done: Vec<Completion>,
    /// When each fetch started; store writes sent.
    fetch_at: Vec<Nanos>,
    writes: u32,
    /// Work ends to deliver: (time, order, message). A fetch of `b` bytes takes `b` ns.
    events: Vec<(Nanos, u64, Msg)>,
    order: u64,
    /// Fetches end with their `failed` message (their source lost its memory).
    fail_fetches: bool,
}

/// A batch backend that logs the shapes it is asked for; the script collects them when
/// the instance starts the iteration.
struct Recorder(Arc<Mutex<Vec<BatchShape>>>, Nanos);

impl BatchBackend for Recorder {
    fn iteration(
        &mut self,
        batch: &BatchShape,
        _members: &mut [crate::backend::Member<'_>],
    ) -> Result<Nanos, BackendError> {
        self.0.lock().unwrap().push(*batch);
        Ok(self.1)
    }
}

impl Context<Msg> for Script {
    fn now(&self) -> Nanos {
        self.now
    }
    fn me(&self) -> ActorId {
        ActorId(1)
    }
    fn send(&mut self, _: ActorId, msg: Msg, _: u64) {
        match &msg {
            // Tests answer lookups themselves, and count store writes.
            Msg::Lookup(_) => return,
            Msg::StoreWrite { .. } => {
                self.writes += 1;
                return;
            }
            Msg::FirstToken(..) => self.first_at.push(self.now),
            Msg::Finished(c) => self.done.push((**c).clone()),
            _ => {}
        }
        self.sent.push(match msg {
            Msg::FirstToken(r, _) => format!("first {}", r.0),
            Msg::Finished(c) => format!("finished {} preempted {}", c.req.0, c.preemptions),
            Msg::Rejected(r, _) => format!("rejected {}", r.0),
            other => format!("{other:?}"),
        });
    }
    fn timer(&mut self, _: Nanos, _: Msg) {}
    fn start_then(&mut self, work: Work, then: Then<Msg>) {
        let took = match work {
            Work::Compute(d) => {
                // An iteration's compute, or (none priced) the layers that waited for loads.
                let logged = std::mem::take(&mut *self.log.lock().unwrap());
                assert!(logged.len() <= 1, "one priced iteration per started one");
                self.batches.extend(logged);
                d
            }
            Work::Fetch { bytes, .. } => {
                self.fetch_at.push(self.now);
                Nanos(bytes)
            }
            other => panic!("unexpected work {other:?}"),
        };
        let Then::Notify(msg) = then else {
            panic!("the instance is notified of its work");
        };
        self.order += 1;
        self.events.push((self.now + took, self.order, msg));
    }
    fn start_fetch(&mut self, work: Work, done: Msg, failed: Msg) {
        let msg = if self.fail_fetches { failed } else { done };
        self.start(work, msg);
    }
    fn rng(&mut self) -> &mut Stream {
        &mut self.rng
    }
}

/// A trace over `arena` of requests given as their prompt's segments and output tokens, all
/// arriving at 0.
fn trace_of(arena: TokenArena, requests: Vec<(Vec<SegId>, u32)>) -> Arc<Trace> {
    let requests = (requests.into_iter())
        .map(|(segments, output_tokens)| Request {
            arrival: Nanos::ZERO,
            prompt_tokens: segments.iter().map(|&s| arena.len(s) as u32).sum(),
            segments,
            output_tokens,
            context: 0,
        })
        .collect();
    Arc::new(Trace {
        arena,
        requests,
        contexts: 1,
    })
}

/// Requests with prompts of `lens` distinct tokens each and `out` output tokens.
fn trace(lens: &[u32], out: u32) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let mut next = 0u32;
    let requests = lens
        .iter()
        .map(|&n| {
            let seg = arena.push(next..next + n);
            next += n;
            (vec![seg], out)
        })
        .collect();
    trace_of(arena, requests)
}

/// Two requests with the same `tokens`-token prompt, both arriving at 0, 2 output tokens.
fn prompt_twice(tokens: u32) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let seg = arena.push(0..tokens);
    trace_of(arena, vec![(vec![seg], 2), (vec![seg], 2)])
}

fn instance(
    trace: Arc<Trace>,
    policy: Arc<dyn Policy>,
    blocks: u32,
    budget: u32,
    s: &Script,
) -> Instance {
    let cfg = InstanceConfig {
        block_size: 16,
        num_blocks: blocks,
        max_num_seqs: 8,
        max_batched_tokens: budget,
        max_waiting: 100,
    };
    let backend = Box::new(Recorder(s.log.clone(), s.iteration));
    Instance::new(0, ActorId(0), trace, policy, cfg, None, backend)
}

fn script() -> Script {
    Script {
        now: Nanos::ZERO,
        batches: Vec::new(),
        sent: Vec::new(),
        rng: Stream::new(1, 1),
        log: Arc::default(),
        iteration: Nanos(1_000),
        first_at: Vec::new(),
        done: Vec::new(),
        fetch_at: Vec::new(),
        writes: 0,
        events: Vec::new(),
        order: 0,
        fail_fetches: false,
    }
}

/// Completes iterations until the instance goes idle (bounded).
fn drain(i: &mut Instance, s: &mut Script) {
    for _ in 0..10_000 {
        if i.busy_since.is_none() {
            return;
        }
        s.now += Nanos(1_000);
        i.handle(Msg::WorkDone, s);
    }
    panic!("instance never went idle");
}

#[test]
fn a_prompt_longer_than_the_budget_is_prefilled_in_chunks_before_its_first_token() {
    let mut s = script();
    let mut i = instance(trace(&[150], 3), Arc::new(Vanilla), 100, 64, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    assert_eq!(s.batches.len(), 1);
    assert_eq!(s.batches[0].new_tokens, 64);
    i.handle(Msg::WorkDone, &mut s);
    i.handle(Msg::WorkDone, &mut s);
    assert!(s.sent.is_empty(), "no token before the prompt is done");
    assert_eq!(s.batches[2].new_tokens, 22);
    assert_eq!(s.batches[2].sampling_seqs, 1);
    i.handle(Msg::WorkDone, &mut s);
    assert_eq!(s.sent, ["first 0"]);
    drain(&mut i, &mut s);
    // 3 prefill chunks, then 2 decode steps of one token each.
    assert_eq!(s.batches.len(), 5);
    assert_eq!(s.batches[3].new_tokens, 1);
    assert_eq!(s.batches[3].kv_read_tokens, 151);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    assert_eq!(i.pool.free_blocks(), 100, "every block is back");
}

#[test]
fn when_blocks_run_out_the_newest_sequence_is_preempted_and_still_finishes() {
    // Two 32-token prompts (2 blocks each) generating 40 tokens each need 5 blocks apiece
    // at the end; 8 blocks cannot hold both, so the second is preempted and recomputed.
    let mut s = script();
    let mut i = instance(trace(&[32, 32], 40), Arc::new(Vanilla), 8, 1024, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    i.handle(Msg::Submit(ReqId(1)), &mut s);
    drain(&mut i, &mut s);
    assert!(
        s.sent.contains(&"finished 0 preempted 0".to_string()),
        "{:?}",
        s.sent
    );
    assert!(
        s.sent.contains(&"finished 1 preempted 1".to_string()),
        "{:?}",
        s.sent
    );
    assert_eq!(i.stats().preemptions, 1);
    assert_eq!(i.pool.free_blocks(), 8);
    i.pool.check().unwrap();
}

#[test]
fn a_repeated_prompt_reuses_its_blocks_but_recomputes_its_last_token() {
    // The same 64-token prompt twice: the second reuses 3 of its 4 blocks (48 tokens);
    // the last block holds the last prompt token, which must be recomputed.
    let t = prompt_twice(64);
    let mut s = script();
    let mut i = instance(t, Arc::new(LocalPrefix), 100, 1024, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    drain(&mut i, &mut s);
    i.handle(Msg::Submit(ReqId(1)), &mut s);
    let last = s.batches.last().unwrap();
    assert_eq!((last.new_tokens, last.kv_read_tokens), (16, 64));
    drain(&mut i, &mut s);
    assert_eq!(i.stats().pool.hit_blocks, 3);
}

#[test]
fn unexpected_messages_are_violations_not_panics() {
    let mut s = script();
    let mut i = instance(trace(&[32], 2), Arc::new(Vanilla), 100, 1024, &s);
    // A work-done notice while idle, a load and a lookup reply for a request that is not
    // loading, and a message meant for the router.
    i.handle(Msg::WorkDone, &mut s);
    i.handle(Msg::Loaded(ReqId(7)), &mut s);
    i.handle(Msg::Arrival(ReqId(0)), &mut s);
    assert!(s.batches.is_empty() && s.sent.is_empty());
    let mut report = Report::default();
    i.report(&mut report);
    assert_eq!(report.violations.len(), 3, "{:?}", report.violations);
    assert!(report.violations[0].contains("instance 0 cannot handle"));
    // The instance still serves requests.
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    drain(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
}

/// An `evostore` instance without the GPU prefix cache: 16-token blocks, 32-token tensors,
/// a 32-layer model, `blocks` KV blocks, at most 8 sequences.
fn store_instance(
    trace: Arc<Trace>,
    overlap: LoadOverlap,
    blocks: u32,
    budget: u32,
    s: &Script,
) -> Instance {
    store_instance_with(trace, overlap, blocks, budget, false, s)
}

fn store_instance_with(
    trace: Arc<Trace>,
    overlap: LoadOverlap,
    blocks: u32,
    budget: u32,
    gpu_prefix_cache: bool,
    s: &Script,
) -> Instance {
    use crate::serving::policy::PolicyKind;
    use crate::serving::store::eviction::Eviction;
    use crate::serving::store::{EvoStoreConfig, PtStoreConfig, StoreConfig};
    let store = StoreConfig {
        tensor_tokens: 32,
        host_capacity_bytes: 1 << 30,
        ssd_capacity_bytes: 0,
        metadata_service: Nanos::ZERO,
        fetch_request_overhead: Nanos::ZERO,
        fetch_segment_overhead: Nanos::ZERO,
        gpu_prefix_cache,
        load_overlap: overlap,
        read_lease: Nanos::ZERO,
        evostore: EvoStoreConfig {
            eviction: Eviction::Lru,
        },
        ptstore: PtStoreConfig {
            eviction: Eviction::Lru,
            replica_fraction: 0.0,
            replicate_after_reads: None,
            consolidate: false,
        },
    };
    let policy: Arc<dyn Policy> = Arc::from(PolicyKind::EvoStore.build(&store));
    let cfg = InstanceConfig {
        block_size: 16,
        num_blocks: blocks,
        max_num_seqs: 8,
        max_batched_tokens: budget,
        max_waiting: 100,
    };
    let link = StoreLink {
        metadata: ActorId(9),
        servers: vec![ActorId(10), ActorId(11)],
        node: 0,
        tensor_tokens: 32,
        tensor_bytes: 1,
        overlap,
        layers: 32,
    };
    let backend = Box::new(Recorder(s.log.clone(), s.iteration));
    Instance::new(0, ActorId(0), trace, policy, cfg, Some(link), backend)
}

/// A plan that loads the first `chunks` tensors (32 tokens each) from node 1's host memory
/// in `ns` ns (the script's fetches take one ns per byte).
fn remote_plan(chunks: u32, ns: u64) -> Box<LoadPlan> {
    Box::new(LoadPlan {
        stored_chunks: chunks,
        groups: vec![LoadGroup {
            node: 1,
            location: Location::Host,
            tier: Tier::RemoteHost,
            tensors: chunks,
            bytes: ns,
            segments: 1,
            indices: (0..chunks).collect(),
            epoch: 0,
        }],
        replicate: Vec::new(),
    })
}

/// Submits request `req` now and answers its lookup with `plan` at once.
fn submit_with(i: &mut Instance, s: &mut Script, req: u32, plan: Box<LoadPlan>) {
    i.handle(Msg::Submit(ReqId(req)), s);
    i.handle(Msg::LookupReply(ReqId(req), plan, 0), s);
}

/// Delivers the ends of the work the instance started, in time order, up to `until`
/// (bounded), checking the instance's invariants after each.
fn run_until(i: &mut Instance, s: &mut Script, until: Nanos) {
    for _ in 0..100_000 {
        i.invariants().unwrap();
        let next = (0..s.events.len())
            .filter(|&k| s.events[k].0 <= until)
            .min_by_key(|&k| (s.events[k].0, s.events[k].1));
        let Some(k) = next else {
            return;
        };
        let (t, _, msg) = s.events.swap_remove(k);
        s.now = t;
        i.handle(msg, s);
    }
    panic!("the instance never ran out of work");
}

fn run(i: &mut Instance, s: &mut Script) {
    run_until(i, s, Nanos(u64::MAX));
    let mut report = Report::default();
    i.report(&mut report);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(
        i.pool.free_blocks(),
        i.pool.num_blocks(),
        "every block is back"
    );
}

/// The TTFT of one 272-token prompt whose first 256 tokens load in `load_ns`, iterations
/// taking `iteration_ns`.
fn ttft(overlap: LoadOverlap, load_ns: u64, iteration_ns: u64) -> Nanos {
    let mut s = script();
    s.iteration = Nanos(iteration_ns);
    let mut i = store_instance(trace(&[272], 2), overlap, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, load_ns));
    run(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    assert_eq!(s.done[0].reused[Tier::RemoteHost as usize], 256);
    assert_eq!(s.fetch_at, [Nanos::ZERO]);
    s.first_at[0]
}

#[test]
fn a_layerwise_load_much_longer_than_compute_costs_the_load_plus_one_layer_of_compute() {
    // A 100 ms load and a 1 ms iteration (the 16 tokens beyond the load) over 32 layers.
    let none = ttft(LoadOverlap::None, 100_000_000, 1_000_000);
    let layerwise = ttft(LoadOverlap::Layerwise, 100_000_000, 1_000_000);
    assert_eq!(none, Nanos(101_000_000), "the load, then the iteration");
    assert_eq!(layerwise, Nanos(100_000_000 + 1_000_000 / 32));
}

#[test]
fn a_layerwise_load_shorter_than_compute_delays_it_by_one_layer_of_the_load() {
    // A 1 ms load under a 10 ms iteration: layer 0's KV arrives after 1/32 ms.
    let none = ttft(LoadOverlap::None, 1_000_000, 10_000_000);
    let layerwise = ttft(LoadOverlap::Layerwise, 1_000_000, 10_000_000);
    assert_eq!(none, Nanos(11_000_000));
    assert_eq!(layerwise, Nanos(10_000_000 + 1_000_000 / 32));
    for (load, iteration) in [(0, 1_000), (5_000, 5_000), (320, 3_200), (7, 1_000_000)] {
        let l = ttft(LoadOverlap::Layerwise, load, iteration);
        let n = ttft(LoadOverlap::None, load, iteration);
        assert!(
            l <= n,
            "load {load} ns, iteration {iteration} ns: {l} > {n}"
        );
    }
}

#[test]
fn a_layerwise_iteration_holds_the_gpu_until_its_last_layer() {
    let mut s = script();
    s.iteration = Nanos(1_000_000);
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::Layerwise, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 100_000_000));
    // The compute ended at 1 ms; the iteration waits for the load.
    run_until(&mut i, &mut s, Nanos(50_000_000));
    assert!(i.busy_since.is_some() && s.first_at.is_empty());
    run(&mut i, &mut s);
    // The prefill iteration (load + one layer), then one decode iteration.
    assert_eq!(
        i.stats().busy,
        Nanos(100_000_000 + 1_000_000 / 32 + 1_000_000)
    );
    assert_eq!(i.stats().iterations, 2);
}

#[test]
fn a_load_starts_only_when_its_blocks_are_reserved_and_holds_them_until_it_runs() {
    // 20 blocks: request 0 (no stored prefix) computes its 17-block prompt and grows to 20
    // blocks; request 1's load needs 16 blocks, so it waits in the queue, not loading.
    let mut s = script();
    let mut i = store_instance(trace(&[272, 272], 40), LoadOverlap::None, 20, 1024, &s);
    submit_with(&mut i, &mut s, 0, Box::default());
    submit_with(&mut i, &mut s, 1, remote_plan(8, 50_000));
    run_until(&mut i, &mut s, Nanos(10_000));
    assert!(s.fetch_at.is_empty(), "no load without blocks");
    assert_eq!(i.waiting.len(), 1);
    run_until(&mut i, &mut s, Nanos(41_000));
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    let fetch = s.fetch_at[0];
    run_until(&mut i, &mut s, fetch + Nanos(49_999));
    // Parked: its 16 blocks are in use, it computes nothing.
    assert_eq!((i.parked.len(), i.running.len()), (1, 0));
    assert_eq!(i.pool.free_blocks(), 4);
    assert!(i.busy_since.is_none());
    run(&mut i, &mut s);
    assert_eq!(s.first_at[1], fetch + Nanos(50_000 + 1_000));
    assert_eq!(s.done[1].admitted_at, fetch);
}

#[test]
fn loaded_requests_give_their_blocks_back_by_preemption_so_the_queue_never_deadlocks() {
    // 33 blocks: both loads reserve 16 blocks each; when they have arrived, the two requests
    // need 40 blocks to finish. The newest is preempted when the oldest needs a block (it
    // recomputes what it had loaded, once the oldest has finished).
    let mut s = script();
    let mut i = store_instance(trace(&[272, 272], 40), LoadOverlap::None, 33, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 50_000));
    submit_with(&mut i, &mut s, 1, remote_plan(8, 50_000));
    assert_eq!((i.parked.len(), i.pool.free_blocks()), (2, 1));
    run(&mut i, &mut s);
    assert_eq!(
        s.sent,
        [
            "first 0",
            "finished 0 preempted 0",
            "first 1",
            "finished 1 preempted 1"
        ]
    );
}

#[test]
fn a_store_loss_sends_a_parked_request_back_to_the_queue_without_its_blocks() {
    let mut s = script();
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::None, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 100_000));
    assert_eq!(i.pool.free_blocks(), 84);
    s.now = Nanos(10_000);
    i.handle(Msg::StoreLost(1), &mut s);
    // Re-admitted at once without a load: the whole prompt is computed.
    assert!(i.parked.is_empty());
    assert_eq!(s.batches.last().unwrap().new_tokens, 272);
    // Its abandoned load still arrives, and is ignored.
    run(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    assert_eq!(s.done[0].reused, [0; Tier::ALL.len()]);
    assert_eq!(s.done[0].loaded_bytes, [0; Tier::ALL.len()]);
    assert_eq!(s.writes, 1, "its prompt is stored again");
    assert!(i.stale_loads.is_empty());
}

#[test]
fn a_store_loss_preempts_a_layerwise_request_and_frees_the_iteration_waiting_for_it() {
    let mut s = script();
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::Layerwise, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 100_000));
    run_until(&mut i, &mut s, Nanos(10_000));
    assert_eq!(i.phase, Phase::Loads(Nanos(1_000)));
    i.handle(Msg::StoreLost(1), &mut s);
    // The iteration ends without it; it is admitted again and computes its whole prompt.
    assert_eq!(s.batches.last().unwrap().new_tokens, 272);
    run(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 1"]);
    assert_eq!(s.done[0].reused, [0; Tier::ALL.len()]);
    assert_eq!(s.writes, 1, "its prompt is stored again");
    assert!(i.stale_loads.is_empty());
}

#[test]
fn parked_and_running_sequences_together_are_at_most_max_num_seqs() {
    let mut s = script();
    let mut i = store_instance(trace(&[272; 10], 2), LoadOverlap::None, 1_000, 1024, &s);
    for r in 0..10 {
        submit_with(&mut i, &mut s, r, remote_plan(8, 50_000));
    }
    assert_eq!((i.parked.len(), i.waiting.len()), (8, 2));
    assert_eq!(s.fetch_at.len(), 8);
    run(&mut i, &mut s);
    assert_eq!(s.done.len(), 10);
}

#[test]
fn a_plan_the_gpu_cache_covers_by_admission_time_is_not_loaded() {
    // Two requests with one 272-token prompt: the second's lookup finds the store's copy,
    // but by its admission the first has computed the prompt into the GPU cache.
    let t = prompt_twice(272);
    let mut s = script();
    let mut i = store_instance_with(t, LoadOverlap::None, 100, 1024, true, &s);
    submit_with(&mut i, &mut s, 0, Box::default());
    submit_with(&mut i, &mut s, 1, remote_plan(8, 50_000));
    run(&mut i, &mut s);
    assert!(s.fetch_at.is_empty());
    assert_eq!(s.done[1].reused[Tier::Gpu as usize], 256);
    assert_eq!(s.done[1].reused.iter().sum::<u32>(), 256);
    assert_eq!(s.done[1].loaded_bytes, [0; Tier::ALL.len()]);
}

#[test]
fn a_failed_load_sends_a_parked_request_back_to_compute_its_prompt() {
    // Its source crashed mid-read, before any notice came: the read ends with an error.
    let mut s = script();
    s.fail_fetches = true;
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::None, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 100_000));
    assert_eq!(i.parked.len(), 1);
    run(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    assert_eq!(
        s.done[0].reused,
        [0; Tier::ALL.len()],
        "nothing counts as loaded"
    );
    assert_eq!(s.done[0].loaded_bytes, [0; Tier::ALL.len()]);
    // The whole prompt was computed, after the failure.
    assert!(s.batches.iter().any(|b| b.new_tokens == 272));
    assert_eq!(i.failed_loads, 1);
    assert!(i.stale_loads.is_empty() && i.parked.is_empty());
    assert!(i.violations.is_empty(), "{:?}", i.violations);
}

#[test]
fn a_failed_load_preempts_a_layerwise_request_and_frees_its_iteration() {
    let mut s = script();
    s.fail_fetches = true;
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::Layerwise, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 100_000));
    run(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 1"]);
    assert_eq!(s.done[0].reused, [0; Tier::ALL.len()]);
    assert!(s.batches.iter().any(|b| b.new_tokens == 272));
    assert_eq!(i.failed_loads, 1);
    assert!(i.stale_loads.is_empty());
    assert!(i.violations.is_empty(), "{:?}", i.violations);
}

#[test]
fn a_failed_load_already_abandoned_after_a_notice_is_ignored() {
    let mut s = script();
    s.fail_fetches = true;
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::None, 100, 1024, &s);
    submit_with(&mut i, &mut s, 0, remote_plan(8, 100_000));
    s.now = Nanos(10_000);
    i.handle(Msg::NodeDown(1), &mut s);
    run(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    assert_eq!(
        i.failed_loads, 0,
        "the notice came first: the failure is a stale group's"
    );
    assert!(i.stale_loads.is_empty());
    assert!(i.violations.is_empty(), "{:?}", i.violations);
}

#[test]
fn what_an_iteration_reads_of_a_sequence_fits_its_first_cache_line() {
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!(align_of::<Seq>(), 64);
    // The block count (the blocks' first word) and the cold part's pointer too.
    assert!(offset_of!(Seq, blocks) + size_of::<u32>() <= 64);
    assert!(offset_of!(Seq, load) < 64 && offset_of!(Seq, done) < 64);
    assert!(offset_of!(Seq, cold) < 64);
    // What only admission, loads and the end read is boxed: a sequence moves as two lines.
    assert_eq!(size_of::<Seq>(), 128);
    // The batch's slots hold `Option<Seq>`: the box gives `None` a place, no room.
    assert_eq!(size_of::<Option<Seq>>(), 128);
}

#[test]
fn its_cache_hint_names_the_running_batch_and_the_backend_as_the_batch_changes() {
    // Three 32-token prompts: the first runs alone, the others join it at the next iteration
    // and all leave as they finish. The hint follows the running batch (whose array moves
    // when it grows) and always names the backend.
    let mut s = script();
    let mut i = instance(trace(&[32, 32, 32], 4), Arc::new(Vanilla), 100, 1024, &s);
    let backend = (&*i.backend as *const dyn BatchBackend).cast::<u8>().addr();
    let expect = |i: &Instance| {
        let h = i.hot();
        let (due, bytes) = i.running.due_bytes();
        assert_eq!(bytes, 8 * i.running.len());
        assert_eq!(h.count as usize, bytes.div_ceil(64));
        assert_eq!(h.base, due);
        assert_eq!(h.stride, 64);
        assert_eq!(h.values[0], backend);
        assert!(h.value_bytes[0] > 0);
    };
    expect(&i);
    for r in 0..3 {
        i.handle(Msg::Submit(ReqId(r)), &mut s);
        expect(&i);
    }
    assert_eq!(i.running.len(), 1, "the others wait for the next iteration");
    let mut most = 0;
    for _ in 0..100 {
        if i.busy_since.is_none() {
            break;
        }
        s.now += Nanos(1_000);
        i.handle(Msg::WorkDone, &mut s);
        most = most.max(i.running.len());
        expect(&i);
    }
    assert_eq!(most, 3, "all three ran together");
    assert!(i.running.is_empty() && i.violations.is_empty());
}

#[test]
fn finished_requests_leave_at_most_max_spare_buffers_and_the_next_request_reuses_one() {
    // Six 64-token prompts finish together; a seventh comes after them.
    let t = trace(&[64; 7], 2);
    let mut s = script();
    let mut i = instance(t.clone(), Arc::new(LocalPrefix), 100, 1024, &s);
    for r in 0..6 {
        i.handle(Msg::Submit(ReqId(r)), &mut s);
    }
    drain(&mut i, &mut s);
    assert_eq!(s.done.len(), 6);
    assert_eq!(i.spare.blocks.len(), MAX_SPARE);
    assert!(i.spare.blocks.iter().all(|b| b.is_empty()));
    assert_eq!(i.spare.n_colds, MAX_SPARE);
    assert!(
        (i.spare.colds.iter()).all(|c| c.as_ref().is_some_and(|c| c.hashes.is_empty())),
        "a kept record lets go of its request's hashes"
    );
    i.handle(Msg::Submit(ReqId(6)), &mut s);
    assert_eq!(
        i.spare.blocks.len(),
        MAX_SPARE - 1,
        "a spare block list is reused, not a new one"
    );
    assert_eq!(i.spare.n_colds, MAX_SPARE - 1, "and a spare record");
    assert!(i.spare.colds[MAX_SPARE - 1].is_none(), "the one taken");
    let seq = &i.running[0];
    let mut want = Vec::new();
    t.block_hashes(ReqId(6), 16, &mut want);
    assert_eq!(
        seq.cold.hashes.to_vec(),
        want,
        "and the request holds exactly its prompt's hashes"
    );
    drain(&mut i, &mut s);
    assert_eq!(s.done.len(), 7);
    assert_eq!(i.spare.blocks.len(), MAX_SPARE);
    assert_eq!(i.spare.n_colds, MAX_SPARE);
    assert!(i.spare.colds.iter().all(Option::is_some));
    i.pool.check().unwrap();
}

/// `n` requests whose prompts share one of three prefixes (0, 30 or 60 tokens) before a tail of
/// their own (1 to 70 tokens), with 1 to 40 output tokens.
fn shared_prefix_trace(n: usize, rng: &mut Stream) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let prefixes: Vec<_> = (1..=3u32)
        .map(|p| {
            (
                arena.push(100_000 * p..100_000 * p + 30 * (p - 1)),
                30 * (p - 1),
            )
        })
        .collect();
    let mut next = 0u32;
    let requests = (0..n)
        .map(|_| {
            let p = rng.below(3) as usize;
            let tail = 1 + rng.below(70) as u32;
            let seg = arena.push(next..next + tail);
            next += tail;
            let (prefix, len) = prefixes[p];
            let segments = if len > 0 {
                vec![prefix, seg]
            } else {
                vec![seg]
            };
            (segments, 1 + rng.below(40) as u32)
        })
        .collect();
    trace_of(arena, requests)
}

#[test]
fn steady_decoders_schedule_and_finish_as_visiting_every_sequence_does() {
    // Two instances in lockstep on the same messages: one keeps decoding sequences steady,
    // the other visits every sequence at every iteration (the scheduler as the module doc
    // writes it). Every batch shape, message and pool count must agree, under budgets that
    // cut batches short and pools small enough to preempt.
    let mut checked = 0;
    for seed in 0..40u64 {
        let mut rng = Stream::new(seed, 7);
        let t = shared_prefix_trace(60, &mut rng);
        let policy: Arc<dyn Policy> = if seed % 2 == 0 {
            Arc::new(Vanilla)
        } else {
            Arc::new(LocalPrefix)
        };
        let blocks = 12 + rng.below(40) as u32;
        let budget = [24, 64, 200, 4096][rng.below(4) as usize];
        let (mut sa, mut sb) = (script(), script());
        let mut a = instance(t.clone(), policy.clone(), blocks, budget, &sa);
        let mut b = instance(t.clone(), policy, blocks, budget, &sb);
        b.lockstep = false;
        let mut next = 0u32;
        for _ in 0..5_000 {
            let submit = next < 60 && (a.busy_since.is_none() || rng.below(3) == 0);
            if submit {
                a.handle(Msg::Submit(ReqId(next)), &mut sa);
                b.handle(Msg::Submit(ReqId(next)), &mut sb);
                next += 1;
            } else if a.busy_since.is_some() {
                sa.now += Nanos(1_000);
                sb.now += Nanos(1_000);
                a.handle(Msg::WorkDone, &mut sa);
                b.handle(Msg::WorkDone, &mut sb);
            } else {
                break;
            }
            a.invariants().unwrap();
            assert_eq!(sa.batches, sb.batches, "seed {seed}");
            assert_eq!(sa.sent, sb.sent, "seed {seed}");
            assert_eq!(a.pool.free_blocks(), b.pool.free_blocks(), "seed {seed}");
            assert_eq!(a.running.len(), b.running.len(), "seed {seed}");
            checked += 1;
        }
        assert_eq!(
            sa.done.len() + a.stats.rejected as usize,
            60,
            "seed {seed}: all ended"
        );
        assert!(a.violations.is_empty() && b.violations.is_empty());
    }
    assert!(checked > 10_000, "{checked} steps checked");
}

/// The lookup's hint names the first hash of the request that admission looks up next, where
/// it is at hand: a request that finds the queue empty and the instance busy.
#[test]
fn the_lookup_hint_names_the_first_hash_of_the_next_admission() {
    let t = trace(&[64, 64, 64], 2);
    let first = |r: u32| {
        let mut h = Vec::new();
        t.block_hashes(ReqId(r), 16, &mut h);
        h[0]
    };
    let mut s = script();
    let mut i = instance(t.clone(), Arc::new(LocalPrefix), 100, 64, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    assert!(i.busy_since.is_some());
    assert_eq!(i.lookup_hint, None, "admitted at once: nobody waits");
    i.handle(Msg::Submit(ReqId(1)), &mut s);
    i.handle(Msg::Submit(ReqId(2)), &mut s);
    assert_eq!(i.lookup_hint, Some(first(1)), "the head of the queue");
    drain(&mut i, &mut s);
    assert_eq!(s.done.len(), 3);
    assert_eq!(i.lookup_hint, None, "nobody waits");
    // Without a policy that looks in GPU memory, nothing is looked up.
    let mut v = instance(t.clone(), Arc::new(Vanilla), 100, 64, &s);
    v.handle(Msg::Submit(ReqId(0)), &mut s);
    v.handle(Msg::Submit(ReqId(1)), &mut s);
    assert_eq!(v.waiting.len(), 1);
    assert_eq!(v.lookup_hint, None);
}
