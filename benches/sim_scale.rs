//! One policy's whole simulation, per event, on a small and on a full-size Polaris: the cost
//! of an event must not grow with the cluster. Run with `cargo bench --bench sim_scale`
//! (`SIM_POLICY=name` picks the policy, `local-prefix` by default; `SIM_ROUNDS=N` the rounds
//! per size, 3 by default, five times as many for the small cluster, whose rounds are short
//! and noisy); under `cargo test --benches` (no `--bench` argument) it runs a
//! few hundred requests per size and checks that every request finished. The rates of that
//! short round mean nothing: building 2,240 instances outweighs 600 requests, and test builds
//! check every actor's invariants every 1,024 events.
//!
//! **Scenarios.** `scenarios/polaris_32gpu.toml` as committed (8 nodes, 32 GPUs, 20,000
//! requests at 100/s), and the same file scaled to all of Polaris: 560 nodes (2,240 GPUs),
//! the arrival rate scaled with the GPUs (7,000/s, so every GPU sees the same load) and
//! 300,000 requests (a 43 s trace, about 134 requests per GPU). A GPU's pool holds about
//! 11,600 blocks and a SQuAD prompt takes 258, so every pool fills about three times over:
//! the bench times the steady state, with evictions, as `polaris_full` has it (with 100,000
//! requests pools barely fill once, and the 2,240-GPU rate looked better than a full run's).
//!
//! **Timed.** The simulation of the policy ([`simulate`]: building the actors, running every
//! event, collecting the report), not the trace's generation. The bench prints, per size, the
//! median events/s over the rounds (events handled by actors, as `meshsim run` counts them)
//! and the ratio of the small cluster's rate to the full one's.

use std::sync::Arc;
use std::time::Instant;

use meshsim::Scenario;
use meshsim::serving::run::{simulate, trace};

const SCENARIO: &str = include_str!("../scenarios/polaris_32gpu.toml");

/// One size of the cluster.
struct Size {
    label: &'static str,
    nodes: u32,
    requests: u32,
    rate_per_s: f64,
    /// Rounds per round asked for: a round of the small cluster takes a twentieth of a
    /// second to a quarter, and its rate moves by tens of percent from one to the next.
    rounds_per_round: usize,
}

/// `polaris_32gpu` with `size`'s nodes, requests and rate, and only `policy`.
fn scenario(size: &Size, policy: &str) -> Scenario {
    let mut text = String::new();
    for line in SCENARIO.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        let line = match key {
            "name" => format!("name = \"sim_scale_{}\"", size.nodes),
            "policies" => format!("policies = [\"{policy}\"]"),
            "nodes" => format!("nodes = {}", size.nodes),
            "requests" => format!("requests = {}", size.requests),
            "arrival_rate_per_s" => format!("arrival_rate_per_s = {:.1}", size.rate_per_s),
            _ => line.to_string(),
        };
        text.push_str(&line);
        text.push('\n');
    }
    Scenario::parse("sim_scale.toml", "sim_scale", &text)
        .unwrap_or_else(|e| panic!("the scaled scenario is valid: {e}"))
}

/// Events/s of each round of `policy` at `size`.
fn rates(size: &Size, policy: &str, rounds: usize) -> Vec<f64> {
    let s = scenario(size, policy);
    assert_eq!(
        s.instances(),
        size.nodes * 4,
        "4 GPUs per node, one instance each"
    );
    let kind = s.policies[0];
    let t = Arc::new(trace(&s).expect("a generated trace"));
    (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let run = simulate(&s, t.clone(), kind).expect("the simulation runs");
            let secs = started.elapsed().as_secs_f64();
            let sum = &run.summary;
            assert_eq!(sum.requests, size.requests as u64);
            assert_eq!(
                sum.completed + sum.rejected,
                sum.requests,
                "every request finished or was rejected"
            );
            assert!(sum.completed > 0 && sum.events > sum.requests);
            sum.events as f64 / secs
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` passes `--bench`-less arguments; run a short round then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let policy = std::env::var("SIM_POLICY").unwrap_or_else(|_| "local-prefix".into());
    let rounds = match std::env::var("SIM_ROUNDS") {
        Ok(n) => n.parse().expect("SIM_ROUNDS is a number"),
        Err(_) if quick => 1,
        Err(_) => 3,
    };
    assert!(rounds > 0, "SIM_ROUNDS is at least 1");
    let sizes = [
        Size {
            label: "32 GPUs",
            nodes: 8,
            requests: if quick { 300 } else { 20_000 },
            rate_per_s: 100.0,
            rounds_per_round: 5,
        },
        Size {
            label: "2,240 GPUs",
            nodes: 560,
            requests: if quick { 600 } else { 300_000 },
            rate_per_s: 7_000.0,
            rounds_per_round: 1,
        },
    ];
    println!("simulation per event, policy {policy} (medians)");
    let mut medians = Vec::new();
    for size in &sizes {
        let n = rounds * size.rounds_per_round;
        let r = rates(size, &policy, n);
        let (lo, hi) = (
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(0.0, f64::max),
        );
        let m = median(r);
        println!(
            "  {:>10} ({:>3} nodes, {:>6} requests): {:>6.3} M events/s (median of {n}, {:.3}-{:.3})",
            size.label,
            size.nodes,
            size.requests,
            m / 1e6,
            lo / 1e6,
            hi / 1e6
        );
        medians.push(m);
    }
    println!(
        "  32 GPUs / 2,240 GPUs: {:.2}x (the cost of an event grows with the cluster by this)",
        medians[0] / medians[1]
    );
}
