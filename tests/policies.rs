//! What the policies must do relative to each other.

mod common;

use std::sync::Arc;

use meshsim::metrics::RequestRecord;
use meshsim::serving::build::trace;
use meshsim::serving::sim::simulate;
use meshsim::workload::qa::{ContextMode, Order};
use meshsim::workload::{Request, Trace, WorkloadSpec};

fn mean_ttft_ms(records: &[RequestRecord]) -> f64 {
    let v: Vec<f64> = records
        .iter()
        .map(|r| r.ttft().unwrap().as_ms_f64())
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn local_prefix_is_never_slower_than_vanilla_when_prefixes_are_shared() {
    let s = common::small();
    let t = Arc::new(trace(&s).unwrap());
    let vanilla = simulate(&s, t.clone(), &s.preset("vanilla").unwrap()).unwrap();
    let local = simulate(&s, t, &s.preset("local-prefix").unwrap()).unwrap();
    assert!(vanilla.report.records.iter().all(|r| r.completed()));
    assert!(local.report.records.iter().all(|r| r.completed()));
    let (v, l) = (
        mean_ttft_ms(&vanilla.report.records),
        mean_ttft_ms(&local.report.records),
    );
    assert!(l <= v, "local-prefix mean TTFT {l} ms > vanilla {v} ms");
    assert!(
        local.summary.prefix_hit_ratio > 0.5,
        "{}",
        local.summary.prefix_hit_ratio
    );
    assert_eq!(vanilla.summary.prefix_hit_ratio, 0.0);
}

/// Keeps only the first question of every context and drops the system prompt, so that no
/// two prompts share even their first token block.
fn without_shared_prefixes(mut t: Trace) -> Trace {
    let mut seen = std::collections::BTreeSet::new();
    let requests: Vec<Request> = t
        .requests
        .drain(..)
        .filter(|r| seen.insert(r.context))
        .map(|mut r| {
            let system = r.segments.remove(0);
            r.prompt_tokens -= t.arena.segment(system).len() as u32;
            r
        })
        .collect();
    t.requests = requests;
    t
}

#[test]
fn local_prefix_gives_vanillas_results_when_nothing_is_shared() {
    let mut s = common::small();
    let WorkloadSpec::Generated(w) = &mut s.workload else {
        panic!("small.toml uses the built-in generator")
    };
    w.context = ContextMode::Unit;
    w.order = Order::Shuffled;
    w.requests = 1_500;
    w.arrival_rate_per_s = 40.0;
    let t = Arc::new(without_shared_prefixes(trace(&s).unwrap()));
    assert!(t.requests.len() > 200, "{} requests", t.requests.len());
    let vanilla = simulate(&s, t.clone(), &s.preset("vanilla").unwrap()).unwrap();
    let local = simulate(&s, t, &s.preset("local-prefix").unwrap()).unwrap();
    assert_eq!(local.summary.prefix_hit_ratio, 0.0);
    assert_eq!(vanilla.report.records, local.report.records);
    let mut ls = local.summary.clone();
    ls.policy = vanilla.summary.policy.clone();
    assert_eq!(ls, vanilla.summary);
}

#[test]
fn local_prefix_hits_only_what_fits_in_free_kv_memory() {
    // The same workload on GPUs with almost no KV memory left: the cache must evict and the
    // hit ratio must fall, but every request still completes.
    let s = common::small();
    let mut tight = s.clone();
    tight.serving.instance.num_blocks = 600; // 9,600 tokens: about four 2k-token prompts
    let t = Arc::new(trace(&s).unwrap());
    let roomy = simulate(&s, t.clone(), &s.preset("local-prefix").unwrap()).unwrap();
    let cramped = simulate(&tight, t, &tight.preset("local-prefix").unwrap()).unwrap();
    assert!(cramped.report.records.iter().all(|r| r.completed()));
    assert!(cramped.summary.gpu_block_evictions > roomy.summary.gpu_block_evictions);
    assert!(
        cramped.summary.prefix_hit_ratio < roomy.summary.prefix_hit_ratio,
        "{} vs {}",
        cramped.summary.prefix_hit_ratio,
        roomy.summary.prefix_hit_ratio
    );
}

#[test]
fn ptstore_without_replication_or_consolidation_gives_evostores_results() {
    let mut s = common::small();
    s.store.ptstore.replicate_after_reads = None;
    s.store.ptstore.consolidate = false;
    s.store.ptstore.eviction = s.store.evostore.eviction;
    let t = Arc::new(trace(&s).unwrap());
    let evo = simulate(&s, t.clone(), &s.preset("evostore").unwrap()).unwrap();
    let pt = simulate(&s, t, &s.preset("ptstore").unwrap()).unwrap();
    assert!(evo.summary.prefix_hit_ratio > 0.5);
    assert_eq!(evo.report.records, pt.report.records);
    let mut ps = pt.summary.clone();
    ps.policy = evo.summary.policy.clone();
    assert_eq!(ps, evo.summary);
}

#[test]
fn store_policies_reuse_prefixes_across_instances_and_never_lose_to_local_prefix() {
    // Round-robin routing spreads the questions of a context over every instance: only a
    // shared store lets an instance reuse a context another instance prefilled.
    let mut s = common::small();
    s.serving.router = meshsim::serving::router::RouterStrategy::RoundRobin;
    let t = Arc::new(trace(&s).unwrap());
    let local = simulate(&s, t.clone(), &s.preset("local-prefix").unwrap()).unwrap();
    let evo = simulate(&s, t.clone(), &s.preset("evostore").unwrap()).unwrap();
    let pt = simulate(&s, t, &s.preset("ptstore").unwrap()).unwrap();
    for run in [&evo, &pt] {
        assert!(run.report.records.iter().all(|r| r.completed()));
        assert!(run.summary.prefix_hit_ratio > local.summary.prefix_hit_ratio);
        assert!(run.summary.ttft.mean <= local.summary.ttft.mean);
        let from_store: u64 = run.summary.reused_tokens[1..].iter().sum();
        assert!(
            from_store > 0,
            "{} loaded nothing from the store",
            run.summary.policy
        );
    }
}

#[test]
fn a_store_under_memory_pressure_demotes_to_ssd_and_serves_from_it() {
    let mut s = common::small();
    s.serving.router = meshsim::serving::router::RouterStrategy::RoundRobin;
    let WorkloadSpec::Generated(w) = &mut s.workload else {
        unreachable!("small.toml generates its workload")
    };
    w.dataset = meshsim::workload::qa::Dataset::Wikiqa;
    w.requests = 600;
    s.serving.instance.num_blocks = 700; // 11k tokens: about five 2k-token contexts
    let tensor = s.store.tensor_tokens as u64 * s.model.kv_bytes_per_token();
    s.store.host_capacity_bytes = 40 * tensor;
    s.store.ssd_capacity_bytes = 120 * tensor;
    let t = Arc::new(trace(&s).unwrap());
    for policy in ["evostore", "ptstore"] {
        let run = simulate(&s, t.clone(), &s.preset(policy).unwrap()).unwrap();
        let st = run.summary.store.unwrap();
        assert!(run.report.records.iter().all(|r| r.completed()));
        assert!(st.stats.demoted > 0, "{policy:?}: {st:?}");
        assert!(st.stats.dropped > 0, "{policy:?}: {st:?}");
        let ssd = run.summary.loaded_bytes[meshsim::Tier::LocalSsd as usize]
            + run.summary.loaded_bytes[meshsim::Tier::RemoteSsd as usize];
        assert!(
            ssd > 0,
            "{policy:?} never read from SSD: {:?}",
            run.summary.loaded_bytes
        );
    }
}

#[test]
fn layerwise_loading_shortens_the_mean_ttft_of_store_policies() {
    // On the small scenario: 21.77 ms without overlap, 21.14 ms layer by layer.
    use meshsim::serving::store::LoadOverlap;
    let mut s = common::small();
    let t = Arc::new(trace(&s).unwrap());
    for policy in ["evostore", "ptstore"] {
        let mut ttft = Vec::new();
        for overlap in [LoadOverlap::None, LoadOverlap::Layerwise] {
            s.store.load_overlap = overlap;
            let run = simulate(&s, t.clone(), &s.preset(policy).unwrap()).unwrap();
            assert!(run.report.records.iter().all(|r| r.completed()));
            let loaded: u64 = run.summary.loaded_bytes.iter().sum();
            assert!(loaded > 0, "{policy:?} under {overlap:?} loaded nothing");
            ttft.push(mean_ttft_ms(&run.report.records));
        }
        assert!(
            ttft[1] < ttft[0],
            "{policy:?}: mean TTFT layerwise {} ms, none {} ms",
            ttft[1],
            ttft[0]
        );
    }
}

#[test]
fn kv_aware_routing_sends_shared_prefixes_back_where_they_are_cached() {
    // Round-robin spreads the questions of a context over every instance, so each instance
    // prefills every context, and with GPU caches that hold a few contexts each, evicts them
    // before they come back; a KV-aware router sends them where the context already is.
    // (With caches that hold every context, as in the plain small scenario, both routers hit
    // alike: measured 0.909 against 0.903, and the mean TTFT is then a matter of balance.)
    // Measured here: hit ratio 0.855 against 0.662, mean TTFT 38.4 ms against 62.4 ms.
    let mut s = common::small();
    s.serving.instance.num_blocks = 700; // 11k tokens: about five 2k-token contexts
    s.serving.router = meshsim::serving::router::RouterStrategy::RoundRobin;
    let t = Arc::new(trace(&s).unwrap());
    let rr = simulate(&s, t.clone(), &s.preset("local-prefix").unwrap()).unwrap();
    s.serving.router = meshsim::serving::router::RouterStrategy::KvAware;
    let kv = simulate(&s, t.clone(), &s.preset("local-prefix").unwrap()).unwrap();
    assert!(kv.report.records.iter().all(|r| r.completed()));
    assert!(
        kv.summary.prefix_hit_ratio > rr.summary.prefix_hit_ratio,
        "hit ratio: kv-aware {} round-robin {}",
        kv.summary.prefix_hit_ratio,
        rr.summary.prefix_hit_ratio
    );
    assert!(kv.summary.ttft.mean < rr.summary.ttft.mean);
    // It still spreads the load: every instance serves requests.
    let mut used = std::collections::BTreeSet::new();
    for r in &kv.report.records {
        used.insert(r.instance);
    }
    assert_eq!(used.len(), 4, "{used:?}");
    // It works with every policy.
    for policy in ["vanilla", "evostore", "ptstore"] {
        let run = simulate(&s, t.clone(), &s.preset(policy).unwrap()).unwrap();
        assert!(
            run.report.records.iter().all(|r| r.completed()),
            "{policy:?}"
        );
    }
}
