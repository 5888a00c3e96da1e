//! The `kv-aware` router on the KV events of instances and store: what it decides with no
//! event, with late events, and with events it never received.

mod common;

use std::sync::{Arc, Mutex};

use meshsim::actor::{Actor, ActorId, Context};
use meshsim::hardware::network::Network;
use meshsim::metrics::{Report, RequestRecord, Tier};
use meshsim::serving::Msg;
use meshsim::serving::build::actors;
use meshsim::serving::msg::KvEvent;
use meshsim::serving::router::kv_index::{Credits, KvIndex};
use meshsim::serving::router::{Router, RouterStrategy};
use meshsim::serving::scenario::Scenario;
use meshsim::serving::sim::simulate;
use meshsim::sim::host::SimHost;
use meshsim::units::Nanos;
use meshsim::workload::{Request, TokenArena, Trace};

/// Prompt tokens of every request: 34 full 16-token blocks and a partial one.
const PROMPT: u32 = 552;

/// Requests `(arrival in ms, context, output tokens)`: each prompt is its context's tokens.
fn trace(requests: &[(u64, u32, u32)]) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let requests = requests
        .iter()
        .map(|&(at_ms, context, output_tokens)| {
            let first = 1_000 + context * 10_000;
            Request {
                arrival: Nanos(at_ms * 1_000_000),
                segments: vec![arena.push(first..first + PROMPT)],
                prompt_tokens: PROMPT,
                output_tokens,
                context,
            }
        })
        .collect();
    Arc::new(Trace {
        arena,
        requests,
        contexts: 8,
    })
}

fn instances(records: &[RequestRecord]) -> Vec<u32> {
    records.iter().map(|r| r.instance).collect()
}

#[test]
fn under_vanilla_the_event_router_routes_as_least_loaded_when_requests_are_alike() {
    // Vanilla keeps nothing, so no block is ever reported: every instance's cost is the
    // prefill of the whole prompt plus its active blocks, and with requests of one size the
    // fewest active blocks are the fewest requests. Arrivals every 15 ms pile up.
    let reqs: Vec<(u64, u32, u32)> = (0..60).map(|i| (i * 15, i as u32 % 5, 24)).collect();
    let t = trace(&reqs);
    let mut s = common::small();
    let vanilla = s.preset("vanilla").unwrap();
    s.serving.router = RouterStrategy::LeastLoaded;
    let ll = simulate(&s, t.clone(), &vanilla).unwrap();
    s.serving.router = RouterStrategy::KvAware;
    let kv = simulate(&s, t, &vanilla).unwrap();
    assert!(kv.report.records.iter().all(|r| r.completed()));
    let used: std::collections::BTreeSet<u32> = instances(&kv.report.records).into_iter().collect();
    assert!(used.len() > 2, "the load spreads: {used:?}");
    assert_eq!(
        format!("{:?}", ll.report.records),
        format!("{:?}", kv.report.records)
    );
}

/// Where four requests go with KV events published `interval_ms` after the first event of
/// a batch: request 0 (context 0) at 0 ms and request 1 (context 1) at 100 ms, both with
/// long outputs (busy for seconds), then context 0 again at 1,000 ms and 2,500 ms (short
/// outputs). Weight 4: a GPU hit of the whole prompt (136 blocks saved) outweighs the 97
/// active blocks of request 0 on its instance.
fn late_events(interval_ms: f64) -> Vec<u32> {
    let t = trace(&[(0, 0, 1_000), (100, 1, 1_000), (1_000, 0, 8), (2_500, 0, 8)]);
    let mut s = common::small();
    s.serving.router = RouterStrategy::KvAware;
    s.serving.kv_overlap_weight = 4.0;
    s.serving.kv_event_interval = Nanos((interval_ms * 1e6) as u64);
    let run = simulate(&s, t, &s.preset("local-prefix").unwrap()).unwrap();
    assert!(run.report.records.iter().all(|r| r.completed()));
    instances(&run.report.records)
}

#[test]
fn with_late_events_a_request_sees_a_hit_only_once_its_event_has_arrived() {
    // Published at every step, instance 0's blocks of context 0 are known within
    // milliseconds: the requests for it at 1 s and 2.5 s go there.
    assert_eq!(late_events(0.0), vec![0, 1, 0, 0]);
    // 2 s late (instance 0's batch opens with its registration, a few milliseconds in): at
    // 1 s the router does not know yet, and sends the request to the least loaded (instance
    // 2, idle); at 2.5 s it knows, and sends it to instance 0 (instance 2's own blocks of
    // context 0, registered near 1 s, are still on their way).
    assert_eq!(late_events(2_000.0), vec![0, 1, 2, 0]);
    // 3 s late: still unknown at 2.5 s (instance 2, the first of the idle ones, again).
    assert_eq!(late_events(3_000.0), vec![0, 1, 2, 2]);
}

/// The router, shared with the test while the host runs it.
struct Shared(Arc<Mutex<Router>>);

impl Actor<Msg> for Shared {
    fn start(&mut self, ctx: &mut dyn Context<Msg>) {
        self.0.lock().unwrap().start(ctx);
    }
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        self.0.lock().unwrap().handle(msg, ctx);
    }
    fn check(&self) -> Result<(), String> {
        self.0.lock().unwrap().check()
    }
    fn report(&mut self, report: &mut Report) {
        self.0.lock().unwrap().report(report);
    }
}

/// Runs `trace` under local-prefix with a `kv-aware` router that drops every `k`-th batch
/// of KV events: the router (after the run) and its report.
fn missing(s: &Scenario, trace: Arc<Trace>, k: u32) -> (Arc<Mutex<Router>>, Report) {
    let policy = s.preset("local-prefix").unwrap();
    let backend = s.batch_backend();
    let (list, _) = actors(
        s,
        trace.clone(),
        &policy,
        &mut |_| Box::new(backend.clone()),
        None,
    );
    let n = s.instances();
    let cfg = &s.serving.instance;
    let credits = Credits {
        overlap_weight: s.serving.kv_overlap_weight,
        host: s.serving.kv_host_credit,
        disk: s.serving.kv_disk_credit,
    };
    let index = KvIndex::new(n as usize, cfg.num_blocks, cfg.block_size, credits, None);
    let nodes = (0..n)
        .map(|i| s.instance_place(i).node().unwrap_or(0))
        .collect();
    let router = Router::new(
        trace,
        (1..=n).map(ActorId).collect(),
        nodes,
        RouterStrategy::KvAware,
    )
    .with_kv_index(index)
    .with_event_loss(k);
    let router = Arc::new(Mutex::new(router));
    let mut host = SimHost::new(Network::new(&s.hardware), s.limits, s.seed);
    for (i, (actor, place)) in list.into_iter().enumerate() {
        let actor: Box<dyn Actor<Msg>> = match i {
            0 => Box::new(Shared(router.clone())),
            _ => actor,
        };
        host.add(actor, place);
    }
    let report = host.run().unwrap().report;
    (router, report)
}

/// For each request: the GPU-hit blocks the router scored, the blocks its instance reused
/// from GPU memory, and the blocks of the events about that instance the router had
/// dropped by then.
fn scored_against_reused(k: u32) -> Vec<(u32, u32, u64)> {
    // Requests far enough apart that each ends, and its events arrive, before the next:
    // what the router scores is then what it was told of the instance's cache at that time.
    // Small GPU caches (120 blocks, three prompts) make instances evict.
    // Four contexts in a scrambled order: hits, misses and evictions.
    let mut x: u64 = 12_345;
    let reqs: Vec<(u64, u32, u32)> = (0..40)
        .map(|i| {
            x = (x * 1_103_515_245 + 12_345) % (1 << 31);
            (i * 400, ((x >> 16) % 4) as u32, 8)
        })
        .collect();
    let t = trace(&reqs);
    let mut s = common::small();
    s.serving.router = RouterStrategy::KvAware;
    s.serving.instance.num_blocks = 120;
    let (router, report) = missing(&s, t.clone(), k);
    assert!(report.records.iter().all(|r| r.completed()));
    let router = router.lock().unwrap();
    let seam = router.event_seam().unwrap();
    let block = s.serving.instance.block_size;
    let gpu = Tier::ALL.iter().position(|&x| x == Tier::Gpu).unwrap();
    seam.scored
        .iter()
        .map(|&(req, i, scored)| {
            let r = &report.records[req.0 as usize];
            assert_eq!(r.instance, i);
            let reused = r.reused[gpu] / block;
            // Blocks in the batches about instance `i` dropped before the request arrived.
            let arrival = t.requests[req.0 as usize].arrival;
            let missed = seam
                .dropped
                .iter()
                .filter(|(at, b)| *at <= arrival && b.instance == Some(i))
                .flat_map(|(_, b)| &b.events)
                .filter(|e| matches!(e, KvEvent::Stored(_) | KvEvent::Removed(_)))
                .count() as u64;
            (scored, reused, missed)
        })
        .collect()
}

#[test]
fn a_router_that_misses_events_is_wrong_about_gpu_hits_by_at_most_the_blocks_it_missed() {
    // Every event delivered: the router scores exactly what the instance reuses.
    let all = scored_against_reused(u32::MAX);
    assert!(all.iter().all(|&(_, _, m)| m == 0));
    assert!(all.iter().any(|&(s, _, _)| s > 0), "some hits: {all:?}");
    assert!(
        all.iter().all(|&(s, r, _)| s == r),
        "scored against reused: {all:?}"
    );
    // Every third batch dropped: wrong, but never by more than what it missed.
    let lossy = scored_against_reused(3);
    assert!(lossy.iter().any(|&(_, _, m)| m > 0));
    assert!(
        lossy.iter().any(|&(s, r, _)| s != r),
        "missing events misleads it: {lossy:?}"
    );
    for &(scored, reused, missed) in &lossy {
        let off = (i64::from(scored) - i64::from(reused)).unsigned_abs();
        assert!(
            off <= missed,
            "scored {scored}, reused {reused}, missed {missed}: {lossy:?}"
        );
    }
}
