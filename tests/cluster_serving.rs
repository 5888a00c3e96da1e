//! Live serving across processes (`meshsim node`, `meshsim::serving::cluster`), on 127.0.0.1
//! only: the router and the metadata service in this process, each scenario node's
//! instances and store server in a `meshsim node` process of its own. A store load from
//! another node really crosses the socket, and the K/V bytes it moves are the ones the
//! simulation's network carries for the same load. A node killed in the middle of a run loses
//! no request: its requests run again and end with an undisturbed run's tokens. Bounded in
//! wall-clock time; the nodes are killed at the end.

mod common;

use std::collections::BTreeMap;

use common::node::{Node, cookie, kill_when_started};
use meshsim::metrics::{RequestRecord, Tier};
use meshsim::serving::build::trace;
use meshsim::serving::live::live_all;
use meshsim::serving::outcome::PolicyRun;
use meshsim::serving::scenario::Scenario;
use meshsim::serving::sim::simulate;

/// 2 nodes x 2 instances of tiny-32k, 32 seeded prompts about 6 shared contexts, stores that
/// demote and replicate; in processes `nodes` when given.
fn scenario(live: Option<(&[&Node], &std::path::Path)>) -> Scenario {
    scenario_with(live, 4)
}

/// [`scenario`] with `output` tokens per request.
fn scenario_with(live: Option<(&[&Node], &std::path::Path)>, output: u32) -> Scenario {
    let mut text = [
        r#"
name = "cluster_serving"
seed = 3
policies = ["vanilla", "evostore", "ptstore"]
mode = "live"
"#,
        common::LIVE_TINY_2X2,
        r#"[serving]
block_size_tokens = 16
max_num_seqs = 8
max_batched_tokens = 512
memory_reserve_gib = 0.1
shared_device = true
[workload]
dataset = "squad"
requests = 32
arrival_rate_per_s = 10.0
context = "window"
context_tokens = 160
system_prompt_tokens = 16
[workload.reuse]
contexts = 6
questions_per_context = 6
[workload.output_tokens]
distribution = "fixed"
tokens = OUTPUT
[store]
tensor_tokens = 32
host_capacity_gib = 0.002
ssd_capacity_gb = 0.004
[store.ptstore]
replicate_after_reads = 1
[limits]
max_wall_s = 300.0
"#,
    ]
    .concat()
    .replace("OUTPUT", &output.to_string());
    if let Some((nodes, cookie)) = live {
        let list: Vec<String> = nodes.iter().map(|n| format!("\"{}\"", n.addr)).collect();
        text += &format!(
            "[live]\nnodes = [{}]\ncookie_file = \"{}\"\n",
            list.join(", "),
            cookie.display()
        );
    }
    Scenario::parse("cluster_serving.toml", "cluster_serving", &text).unwrap()
}

fn remote(r: &RequestRecord) -> u64 {
    r.loaded_bytes[Tier::RemoteHost as usize] + r.loaded_bytes[Tier::RemoteSsd as usize]
}

fn by_id(run: &PolicyRun) -> BTreeMap<u32, &RequestRecord> {
    run.report.records.iter().map(|r| (r.id, r)).collect()
}

#[test]
fn store_loads_cross_the_socket_with_the_simulations_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let key = cookie(dir.path(), "cookie", "the-serving-cluster-cookie-42");
    let rt = common::runtime();
    let n1 = Node::start(&key);
    let n2 = Node::start(&key);

    let s = scenario(Some((&[&n1, &n2], &key)));
    // live_all fails unless every policy's tokens equal vanilla's and its first-token
    // logits agree within the tolerance.
    let runs = rt
        .block_on(live_all(&s))
        .unwrap_or_else(|e| panic!("{e}\nnode 1:\n{}\nnode 2:\n{}", n1.log(), n2.log()));
    assert_eq!(runs.len(), 3);
    for r in &runs {
        assert_eq!(r.report.outputs.len(), 32, "{}", r.policy.name());
        assert!(r.report.records.iter().all(|q| q.completed()));
    }
    let checks: Vec<_> = runs.iter().filter_map(|r| r.output_check.clone()).collect();
    assert_eq!(checks.len(), 2);
    assert!(
        checks
            .iter()
            .all(|c| c.problem.is_none() && c.requests == 32)
    );

    // The same greedy tokens as every actor in one process (same seeded weights).
    let mut one = scenario(None);
    one.policies = vec![one.preset("vanilla").unwrap()];
    let alone = rt.block_on(live_all(&one)).unwrap();
    assert_eq!(alone[0].report.outputs, runs[0].report.outputs);

    // Every byte a remote load accounts for crossed a socket, and only those: the K/V that
    // the instances read from the other process equals the remote loads of their records.
    let mut sim = s.clone();
    sim.live = false;
    let t = std::sync::Arc::new(trace(&sim).unwrap());
    let mut compared = 0;
    for r in runs.iter().filter(|r| r.policy.uses_store()) {
        let across = r.across.expect("a run across processes says what crossed");
        let accounted: u64 = r.report.records.iter().map(remote).sum();
        let loaded: u64 = r.report.records.iter().flat_map(|q| q.loaded_bytes).sum();
        assert!(accounted > 0, "{}: no remote load", r.policy.name());
        assert_eq!(across.remote_read, accounted, "{}", r.policy.name());
        assert_eq!(across.fetched, loaded, "{}", r.policy.name());
        assert!(across.frames > 0 && across.frame_bytes > 0);

        // The simulation of the same scenario: wherever it planned a request's loads as
        // the live run did (the same reused tokens from each tier), its network carried the
        // same bytes for them.
        let simulated = simulate(&sim, t.clone(), &r.policy).unwrap();
        let (live, model) = (by_id(r), by_id(&simulated));
        let mut same = 0;
        for (id, q) in &live {
            let m = model[id];
            if m.reused == q.reused {
                assert_eq!(m.loaded_bytes, q.loaded_bytes, "request {id}");
                same += 1;
                if remote(q) > 0 {
                    compared += 1;
                }
            }
        }
        eprintln!(
            "{}: {same} of 32 requests planned alike in the simulation; {} remote K/V bytes \
             across the socket",
            r.policy.name(),
            across.remote_read
        );
        assert!(
            same >= 16,
            "{}: only {same} requests planned alike",
            r.policy.name()
        );
    }
    assert!(compared > 0, "no remote load planned alike to compare");
}

#[test]
fn a_node_killed_in_the_middle_of_a_run_loses_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let key = cookie(dir.path(), "cookie", "the-serving-failover-cookie-7");
    let rt = common::runtime();
    // The undisturbed tokens: vanilla, every actor in this process.
    let mut one = scenario_with(None, 24);
    one.policies = vec![one.preset("vanilla").unwrap()];
    let alone = rt.block_on(live_all(&one)).unwrap();
    let expected: BTreeMap<u32, &Vec<u32>> = alone[0]
        .report
        .outputs
        .iter()
        .map(|(q, t)| (*q, t))
        .collect();
    assert_eq!(expected.len(), 32);

    // Scenario node 1 (its instances and store server) is in n2; n3 is a spare. n2 is
    // killed while requests are in flight on it: the coordinator places its actors on n3,
    // the router runs their requests again and the metadata service forgets n2's store.
    let (n1, mut n2, n3) = (Node::start(&key), Node::start(&key), Node::start(&key));
    let mut s = scenario_with(Some((&[&n1, &n2, &n3], &key)), 24);
    s.policies = vec![s.preset("evostore").unwrap()];
    let killer = kill_when_started(&n2, std::time::Duration::from_millis(1500));
    let runs = rt
        .block_on(live_all(&s))
        .unwrap_or_else(|e| panic!("{e}\nnode 1:\n{}\nnode 3:\n{}", n1.log(), n3.log()));
    killer.join().unwrap();
    assert!(!n2.alive(), "n2 was killed");
    n2.kill();
    let r = &runs[0];
    eprintln!(
        "failovers {}, failed loads {}",
        r.report.failovers, r.report.failed_loads
    );
    assert!(
        r.report.failovers > 0,
        "the kill landed while no request was on n2: nothing was run again"
    );
    // Every request ends exactly once, with the undisturbed run's tokens.
    assert_eq!(r.report.records.len(), 32);
    for q in &r.report.records {
        assert!(q.completed(), "request {} did not complete: {q:?}", q.id);
        assert_eq!(q.output_tokens, 24, "request {}", q.id);
    }
    let got: BTreeMap<u32, &Vec<u32>> = r.report.outputs.iter().map(|(q, t)| (*q, t)).collect();
    assert_eq!(r.report.outputs.len(), 32, "one output per request");
    assert_eq!(got, expected);
}
