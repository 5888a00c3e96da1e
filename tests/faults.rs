//! Faults in the serving system (`[[fault]]`): every request ends finished, rejected or failed
//! with a reason, none is lost or counted twice, a crashed node's tensors are never read
//! again, and the hardware faults cost what they say.

use std::sync::Arc;

use meshsim::Scenario;
use meshsim::serving::build::trace;
use meshsim::serving::outcome::PolicyRun;
use meshsim::serving::sim::simulate;

/// A VOPR scenario without its random faults.
fn base() -> String {
    let text = meshsim::vopr::scenario_text(3);
    match text.find("[[fault]]") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Two nodes of two GPUs, the tiny model, a store that holds everything, 400 requests over
/// about 0.2 s, round-robin; `faults` are appended as written.
fn scenario(faults: &str) -> Scenario {
    let base = base();
    let mut text: String = base
        .lines()
        .map(|l| match l.split(" = ").next() {
            Some("nodes") => "nodes = 2".to_string(),
            Some("gpus_per_node") => "gpus_per_node = 2".to_string(),
            Some("tensor_parallel") => "tensor_parallel = 1".to_string(),
            Some("memory_gib") if l.contains("0.0") => "memory_gib = 0.05".to_string(),
            Some("requests") => "requests = 400".to_string(),
            Some("arrival_rate_per_s") => "arrival_rate_per_s = 2000.0".to_string(),
            Some("router") => "router = \"round-robin\"".to_string(),
            Some("max_waiting_requests") => "max_waiting_requests = 1000".to_string(),
            Some("host_capacity_gib") => "host_capacity_gib = 1.0".to_string(),
            Some("ssd_capacity_gb") => "ssd_capacity_gb = 1.0".to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    text.push('\n');
    text.push_str(faults);
    Scenario::parse("faults.toml", "faults", &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn run_all(s: &Scenario) -> Vec<PolicyRun> {
    let t = Arc::new(trace(s).unwrap());
    s.policies
        .iter()
        .map(|p| simulate(s, t.clone(), p).unwrap_or_else(|e| panic!("{}: {e}", p.name())))
        .collect()
}

fn ended(r: &PolicyRun) -> (usize, usize, usize) {
    let recs = &r.report.records;
    let ok = recs.iter().filter(|x| x.completed()).count();
    let rejected = recs.iter().filter(|x| x.rejected).count();
    let failed = recs.iter().filter(|x| x.failed.is_some()).count();
    (ok, rejected, failed)
}

#[test]
fn a_node_crash_fails_requests_over_and_every_request_ends_once() {
    // Node 1's GPUs are slowed first, so that requests queue there (not yet prefilled: they
    // fail over) besides those decoding (already streaming: they fail).
    let mut faults = String::new();
    for gpu in 0..2 {
        faults += &format!(
            "[[fault]]\nkind = \"gpu-slow\"\nnode = 1\ngpu = {gpu}\nat_s = 0.0\nfor_s = 1.0\nfactor = 0.02\n"
        );
    }
    faults += "[[fault]]\nkind = \"node-crash\"\nnode = 1\nat_s = 0.1\n";
    let s = scenario(&faults);
    for r in run_all(&s) {
        let name = r.policy.name();
        let (ok, rejected, failed) = ended(&r);
        // Every request ends exactly one way (the router also checks this as an invariant).
        assert_eq!(ok + rejected + failed, 400, "{name}");
        for x in &r.report.records {
            let ways = [x.completed(), x.rejected, x.failed.is_some()];
            assert_eq!(
                ways.iter().filter(|&&w| w).count(),
                1,
                "{name}: request {}",
                x.id
            );
            if let Some(why) = &x.failed {
                assert!(why.contains("node 1"), "{name}: {why}");
            }
            // Nothing is sent to node 1's instances (2 and 3) after the crash.
            if x.arrival.as_secs_f64() > 0.101 && x.instance != u32::MAX {
                assert!(x.instance < 2, "{name}: request {} on {}", x.id, x.instance);
            }
        }
        assert!(r.report.failovers > 0, "{name}: no request failed over");
        assert!(failed > 0, "{name}: no streaming request failed");
        if let Some(st) = &r.report.store {
            assert!(st.stats.lost > 0, "{name}: node 1 lost no tensor");
        }
    }
}

#[test]
fn a_store_restart_loses_the_tensors_but_no_request() {
    let s = scenario("[[fault]]\nkind = \"store-restart\"\nnode = 0\nat_s = 0.1\n");
    for r in run_all(&s) {
        let (ok, rejected, failed) = ended(&r);
        assert_eq!((ok + rejected, failed), (400, 0), "{}", r.policy.name());
        if let Some(st) = &r.report.store {
            assert!(st.stats.lost > 0, "{}", r.policy.name());
        }
    }
}

/// TTFT p99 (ms) of `policy` with and without `fault`.
fn p99_with(fault: &str, policy: &str) -> (f64, f64) {
    let pick = |s: &Scenario| {
        let t = Arc::new(trace(s).unwrap());
        simulate(s, t, &s.preset(policy).unwrap())
            .unwrap()
            .summary
            .ttft
            .p99
    };
    (pick(&scenario(fault)), pick(&scenario("")))
}

#[test]
fn a_cut_link_holds_transfers_until_it_is_back() {
    // Node 1's NICs carry nothing for 50 ms: its requests (and its store's readers) wait.
    let fault =
        "[[fault]]\nkind = \"link-slow\"\nnode = 1\nat_s = 0.05\nfor_s = 0.05\nfactor = 0.0\n";
    let (with, without) = p99_with(fault, "vanilla");
    assert!(
        with > without + 20.0,
        "p99 {with} ms with the cut, {without} ms without"
    );
}

#[test]
fn a_slow_gpu_slows_its_instance() {
    let fault = "[[fault]]\nkind = \"gpu-slow\"\nnode = 0\ngpu = 0\nat_s = 0.0\nfor_s = 100.0\nfactor = 0.05\n";
    let (with, without) = p99_with(fault, "vanilla");
    assert!(
        with > 2.0 * without,
        "p99 {with} ms slowed, {without} ms not"
    );
}

#[test]
fn faulted_runs_are_deterministic() {
    let faults = "[[fault]]\nkind = \"node-crash\"\nnode = 1\nat_s = 0.15\n\
                  [[fault]]\nkind = \"store-restart\"\nnode = 0\nat_s = 0.1\n\
                  [[fault]]\nkind = \"link-slow\"\nnode = 0\nat_s = 0.05\nfor_s = 0.1\nfactor = 0.3\n";
    let s = scenario(faults);
    let a = run_all(&s);
    let b = run_all(&s);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.report.records, y.report.records, "{}", x.policy.name());
        assert_eq!(x.summary, y.summary);
    }
}

#[test]
fn bad_fault_tables_are_refused_naming_the_key() {
    let base = base();
    for (fault, key, what) in [
        (
            "kind = \"node-crash\"\nnode = 9\nat_s = 1.0",
            "fault[0].node",
            "below",
        ),
        (
            "kind = \"node-crash\"\nnode = 0\nat_s = -1.0",
            "fault[0].at_s",
            "seconds",
        ),
        (
            "kind = \"link-slow\"\nnode = 0\nat_s = 1.0\nfor_s = 0.0\nfactor = 0.5",
            "fault[0].for_s",
            "positive",
        ),
        (
            "kind = \"gpu-slow\"\nnode = 0\ngpu = 0\nat_s = 1.0\nfor_s = 1.0\nfactor = 0.0",
            "fault[0].factor",
            "(0, 1]",
        ),
        (
            "kind = \"shard-restart\"\nshard = 0\nrequest = 0\nafter_tokens = 1",
            "fault[0].kind",
            "not supported by serving",
        ),
        ("kind = \"meteor\"\nnode = 0", "fault", "unknown variant"),
    ] {
        let text = format!("{base}\n[[fault]]\n{fault}\n");
        let e = Scenario::parse("f.toml", "f", &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains(what), "{fault}: {e}");
    }
}

#[test]
fn a_pipeline_shard_restart_is_a_fault_like_any_other() {
    use meshsim::PipelineScenario;
    use meshsim::pipeline::sim::simulate_all;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let text = std::fs::read_to_string(dir.join("pipeline_mistral_4node.toml")).unwrap();
    let old = "[[pipeline.restart]]\nshard = 2\nrequest = 10\nafter_tokens = 64\n";
    assert!(text.contains(old));
    let new = "[[fault]]\nkind = \"shard-restart\"\nshard = 2\nrequest = 10\nafter_tokens = 64\n";
    let summaries = |t: &str| {
        let s = PipelineScenario::parse("p.toml", "p", &dir, t).unwrap();
        let runs = simulate_all(&s, 2).unwrap();
        runs.into_iter().map(|r| r.summary).collect::<Vec<_>>()
    };
    let as_fault = text.replace(old, "") + new;
    assert_eq!(summaries(&text), summaries(&as_fault));
    // Without the restart, no re-prefill.
    assert!(
        summaries(&text.replace(old, ""))
            .iter()
            .all(|s| s.preemptions == 0)
    );
    // The serving system's faults are refused in a pipeline scenario.
    let crash = text.replace(old, "") + "[[fault]]\nkind = \"node-crash\"\nnode = 0\nat_s = 1.0\n";
    let e = PipelineScenario::parse("p.toml", "p", &dir, &crash).unwrap_err();
    assert!(e.to_string().contains("not supported by pipeline"), "{e}");
    let far = text.replace(old, "") + &new.replace("shard = 2", "shard = 7");
    let e = PipelineScenario::parse("p.toml", "p", &dir, &far).unwrap_err();
    assert!(e.to_string().contains("fault[0].shard"), "{e}");
}
