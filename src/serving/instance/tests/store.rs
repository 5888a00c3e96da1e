//! Host-less tests of an instance's store path: layer-wise and whole loads, parked requests,
//! lost and failed loads.

use super::*;

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
        load: Default::default(),
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
    let setting = crate::serving::policy::Setting {
        store: &store,
        instances_per_node: 1,
        kv_pool_bytes: 1 << 30,
        host_memory_bytes: 1 << 36,
        block_size: 16,
    };
    let policy = Arc::new(crate::serving::policy::preset("evostore", &setting).unwrap());
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
        load: Default::default(),
        staging: Default::default(),
        layers: 32,
        namespace: None,
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
fn a_plan_made_before_a_store_loss_the_instance_knows_of_is_dropped_on_arrival() {
    let mut s = script();
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::None, 100, 1024, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    // The loss reaches the instance before the reply to its lookup, which the metadata
    // service planned knowing of no loss (0): what it names may be gone, so it is not read.
    i.handle(Msg::StoreLost(1), &mut s);
    i.handle(
        Msg::LookupReply(ReqId(0), remote_plan(8, 100_000), 0),
        &mut s,
    );
    assert!(i.parked.is_empty(), "no load is started for a stale plan");
    assert_eq!(
        s.batches.last().unwrap().new_tokens,
        272,
        "the whole prompt is computed"
    );
    run(&mut i, &mut s);
    assert_eq!(s.done[0].reused, [0; Tier::ALL.len()]);
    assert_eq!(s.done[0].loaded_bytes, [0; Tier::ALL.len()]);
    // A plan made knowing of the loss (1) is loaded as any other.
    let mut s = script();
    let mut i = store_instance(trace(&[272], 2), LoadOverlap::None, 100, 1024, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    i.handle(Msg::StoreLost(1), &mut s);
    i.handle(
        Msg::LookupReply(ReqId(0), remote_plan(8, 100_000), 1),
        &mut s,
    );
    assert_eq!(i.parked.len(), 1, "its load is in flight");
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
