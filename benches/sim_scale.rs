//! One policy's whole simulation, per event, on a small and on a full-size Polaris: the cost
//! of an event must not grow with the cluster. Run with `cargo bench --bench sim_scale`
//! (`SIM_POLICY=name` picks the policy, `local-prefix` by default; `SIM_ROUNDS=N` the rounds
//! per size, 3 by default, five times as many for the small cluster, whose rounds are short
//! and noisy; the three runs' rounds are interleaved, so that the machine's drift moves
//! them alike; `SIM_ONLY=k` runs only the `k`-th of the three runs below, 1 to 3, for a
//! profiler, and prints no ratio; `SIM_NODES=n` makes the full cluster `n` nodes instead of
//! 560, with the same load a GPU, to see how the cost of an event grows with the cluster's
//! size between the two); under `cargo test --benches` (no `--bench` argument) it runs a
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
//! requests pools barely fill once, and the 2,240-GPU rate overstates a full run's).
//!
//! **The same events on 32 GPUs.** The two scenarios load every GPU alike, but their events
//! are not alike: round-robin sends a context's questions to 32 GPUs on the small cluster and
//! to 2,240 on the full one, so a GPU's prefix cache finds the context far less often there
//! (local-prefix: about a quarter of the prompt tokens reused on 32 GPUs, 2 % on 2,240), every
//! prompt is prefilled, batches are large and iterations long, and an event does more work
//! (more sequences an iteration, more blocks to allocate and evict). A third run tells that
//! apart from the cost of the cluster's size: 32 GPUs given exactly the requests round-robin
//! gives the full cluster's first 32 GPUs (request `i` of the full trace when `i mod 2,240 <
//! 32`), so each GPU sees what its namesake sees in the full run and handles the same events
//! (the bench prints events per request and the reuse of each run to show it). What is
//! shared across GPUs is not the same: the memo of prompt hashes hashes each context once
//! for a whole run, which the full run shares among 70 times as many requests, and the store
//! policies' store holds what 32 GPUs, not 2,240, put in it. So which 32-GPU run has the full
//! run's events is told by those two figures: for vanilla and local-prefix the third run
//! (local-prefix: 7.7 events a request and 2 % reused in both, against 11.4 and 25 % as
//! committed), for the store policies the committed scenario (the store serves about 95 % of
//! prompt tokens on both clusters, 31 events a request; the third run's store, filled by 32
//! GPUs alone, serves 47 %).
//!
//! **Timed.** The simulation of the policy ([`simulate`]: building the actors, running every
//! event, collecting the report), not the trace's generation. The bench prints, per run, the
//! median events/s over the rounds (events handled by actors, as `meshsim run` counts them),
//! and two ratios: the small scenario's rate to the full one's (the headline measure, which
//! includes what an event does), and the same events' (how the cost of an event grows with
//! the cluster).
//!
//! **Memory.** The bench tunes the allocator as `meshsim run` does
//! ([`meshsim::cpu::alloc::tune_allocator`]: glibc's heap parameters).

use std::sync::Arc;
use std::time::Instant;

use meshsim::Scenario;
use meshsim::serving::build::trace;
use meshsim::serving::sim::simulate;
use meshsim::workload::Trace;

const SCENARIO: &str = include_str!("../scenarios/polaris_32gpu.toml");

/// One size of the cluster.
struct Size {
    label: String,
    nodes: u32,
    requests: u32,
    rate_per_s: f64,
    /// Rounds per round asked for: a round of the small cluster is short (a twentieth of a
    /// second to a quarter on a shared 2-core VM, 2026-12), and its rate is noisy.
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

/// The requests of `full` that round-robin over `of` GPUs sends to the first `keep`, in
/// order: given to `keep` GPUs, round-robin sends each to its namesake.
fn slice(full: Trace, of: usize, keep: usize) -> Trace {
    let requests = (full.requests.into_iter().enumerate())
        .filter(|(i, _)| i % of < keep)
        .map(|(_, r)| r)
        .collect();
    Trace { requests, ..full }
}

/// One run's rounds: events/s of each, and the run's events per request and prefix reuse.
struct Rates {
    rates: Vec<f64>,
    events_per_request: f64,
    reuse: f64,
}

/// The rounds of `policy` on `s` and trace `t`.
fn rates(s: &Scenario, t: Arc<Trace>, rounds: usize) -> Rates {
    assert_eq!(
        s.instances(),
        s.hardware.nodes * 4,
        "4 GPUs per node, one instance each"
    );
    let kind = &s.policies[0];
    let mut out = Rates {
        rates: Vec::new(),
        events_per_request: 0.0,
        reuse: 0.0,
    };
    for _ in 0..rounds {
        let started = Instant::now();
        let run = simulate(s, t.clone(), kind).expect("the simulation runs");
        let secs = started.elapsed().as_secs_f64();
        let sum = &run.summary;
        assert_eq!(sum.requests, t.requests.len() as u64);
        assert_eq!(
            sum.completed + sum.rejected,
            sum.requests,
            "every request finished or was rejected"
        );
        assert!(sum.completed > 0 && sum.events > sum.requests);
        out.rates.push(sum.events as f64 / secs);
        out.events_per_request = sum.events as f64 / sum.requests as f64;
        out.reuse = sum.prefix_hit_ratio;
    }
    out
}

/// `n` with a comma between thousands, as the labels write it.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The two cluster sizes timed: 32 GPUs, and the full cluster (560 nodes, or `SIM_NODES` at
/// the same load a GPU); short ones for `cargo test --benches`.
fn sizes(quick: bool) -> [Size; 2] {
    let mut sizes = [
        Size {
            label: "32 GPUs".into(),
            nodes: 8,
            requests: if quick { 300 } else { 20_000 },
            rate_per_s: 100.0,
            rounds_per_round: 5,
        },
        Size {
            label: "2,240 GPUs".into(),
            nodes: 560,
            requests: if quick { 600 } else { 300_000 },
            rate_per_s: 7_000.0,
            rounds_per_round: 1,
        },
    ];
    if let Ok(n) = std::env::var("SIM_NODES") {
        // The full cluster's load a GPU: requests and rate in proportion to the nodes.
        let n: u32 = n.parse().expect("SIM_NODES is a number of nodes");
        assert!(
            (8..=100_000).contains(&n),
            "SIM_NODES is 8 (the small cluster) to 100,000 nodes"
        );
        let full = &mut sizes[1];
        full.requests = (u64::from(full.requests) * u64::from(n) / 560) as u32;
        full.rate_per_s *= f64::from(n) / 560.0;
        full.nodes = n;
        full.label = format!("{} GPUs", thousands(4 * u64::from(n)));
    }
    sizes
}

/// Prints each run's median rate (with its range, events a request and reuse) and returns
/// the medians, in run order.
fn report(runs: &[(&Size, &str, &Scenario, Arc<Trace>)], got: Vec<Rates>) -> Vec<f64> {
    let mut medians = Vec::new();
    for ((size, what, _, t), r) in runs.iter().zip(got) {
        let n = r.rates.len();
        let (lo, hi) = (
            r.rates.iter().copied().fold(f64::INFINITY, f64::min),
            r.rates.iter().copied().fold(0.0, f64::max),
        );
        let m = median(r.rates);
        println!(
            "  {:>10} ({:>3} nodes, {:>6} requests{}{what}): {:>6.3} M events/s (median of {n}, \
             {:.3}-{:.3}); {:.2} events a request, {:.1} % of prompt tokens reused",
            size.label,
            size.nodes,
            t.requests.len(),
            if what.is_empty() { "" } else { ", " },
            m / 1e6,
            lo / 1e6,
            hi / 1e6,
            r.events_per_request,
            100.0 * r.reuse,
        );
        medians.push(m);
    }
    medians
}

fn main() {
    // As `meshsim run` has it: first, before any thread starts.
    meshsim::cpu::alloc::tune_allocator();
    // `cargo test --benches` passes `--bench`-less arguments; run a short round then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let policy = std::env::var("SIM_POLICY").unwrap_or_else(|_| "local-prefix".into());
    let rounds = match std::env::var("SIM_ROUNDS") {
        Ok(n) => n.parse().expect("SIM_ROUNDS is a number"),
        Err(_) if quick => 1,
        Err(_) => 3,
    };
    assert!(rounds > 0, "SIM_ROUNDS is at least 1");
    let sizes = sizes(quick);
    println!("simulation per event, policy {policy} (medians)");
    let small = scenario(&sizes[0], &policy);
    let full = scenario(&sizes[1], &policy);
    let full_trace = trace(&full).expect("a generated trace");
    let same = Arc::new(slice(
        full_trace.clone(),
        full.instances() as usize,
        small.instances() as usize,
    ));
    let runs = [
        (
            &sizes[0],
            "as committed",
            &small,
            Arc::new(trace(&small).expect("a trace")),
        ),
        (&sizes[1], "", &full, Arc::new(full_trace)),
        (
            &sizes[0],
            "the full cluster's per-GPU requests",
            &small,
            same,
        ),
    ];
    let only: Option<usize> = std::env::var("SIM_ONLY")
        .ok()
        .map(|k| k.parse().expect("SIM_ONLY is 1, 2 or 3"));
    assert!(
        only.is_none_or(|k| (1..=3).contains(&k)),
        "SIM_ONLY is 1, 2 or 3"
    );
    // The runs' rounds interleaved: each pass runs every run's share of rounds in turn, so
    // that the host's drift in speed (tens of percent within minutes on a shared 2-core VM,
    // 2026-12) moves every run's rates alike and not their ratios, which with the runs one
    // after the other differ widely between two runs of one build.
    let runs: Vec<_> = (runs.into_iter().enumerate())
        .filter(|(k, _)| only.is_none_or(|o| o == k + 1))
        .map(|(_, r)| r)
        .collect();
    let mut got: Vec<Rates> = runs
        .iter()
        .map(|_| Rates {
            rates: Vec::new(),
            events_per_request: 0.0,
            reuse: 0.0,
        })
        .collect();
    for _ in 0..rounds {
        for ((size, _, s, t), into) in runs.iter().zip(&mut got) {
            let r = rates(s, t.clone(), size.rounds_per_round);
            into.rates.extend(r.rates);
            (into.events_per_request, into.reuse) = (r.events_per_request, r.reuse);
        }
    }
    let medians = report(&runs, got);
    if only.is_some() {
        return;
    }
    let full_label = &sizes[1].label;
    println!(
        "  32 GPUs as committed / {full_label}: {:.2}x (the headline measure; the same events for \
         the store policies, whose shared store serves alike at both sizes)",
        medians[0] / medians[1]
    );
    println!(
        "  32 GPUs with the same requests a GPU / {full_label}: {:.2}x (the same events for \
         vanilla and local-prefix, not for the store policies: see events a request and reuse)",
        medians[2] / medians[1]
    );
}
