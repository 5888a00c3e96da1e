//! Load or recompute (`load = "when-faster"`): a request offered a stored prefix loads only
//! what is faster to load than to recompute.
//!
//! Two nodes of one A100 each, Mistral-7B (128 KiB of KV per token), round-robin routing.
//! A request prefills an 8,192-token prompt on node 0, whose store keeps it (32 tensors of
//! 256 tokens, 1 GiB); ten seconds later the same prompt arrives on node 1 and its lookup
//! offers the whole prefix from node 0's host memory, across one NIC. Behind a 10 Gb/s NIC
//! (1.1 GB/s achievable) that load takes about a second, longer than prefilling the 8k
//! tokens again; behind two 200 Gb/s NICs it takes a few tens of milliseconds. The second
//! request's TTFT is compared under `always` (load what is stored), `when-faster` and
//! vanilla (recompute everything).

use std::sync::Arc;

use meshsim::Tier;
use meshsim::serving::policy::Policy;
use meshsim::serving::scenario::Scenario;
use meshsim::serving::sim::simulate;
use meshsim::serving::store::LoadChoice;
use meshsim::units::Nanos;
use meshsim::workload::{Request, TokenArena, Trace};

const PROMPT: u32 = 8193;

/// The test cluster with `nics` NICs of `gbit` Gb/s per node.
fn scenario(nics: u32, gbit: f64) -> Scenario {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/small.toml"),
    )
    .unwrap()
    .replace("gpus_per_node = 2", "gpus_per_node = 1")
    .replace("nics_per_node = 2", &format!("nics_per_node = {nics}"))
    .replace(
        "nic_bandwidth_gbit_per_s = 200.0",
        &format!("nic_bandwidth_gbit_per_s = {gbit}"),
    )
    .replace("router = \"least-loaded\"", "router = \"round-robin\"");
    Scenario::parse("load_or_recompute.toml", "load_or_recompute", &text).unwrap()
}

/// Two requests with the same prompt, ten seconds apart, 8 output tokens each.
fn trace() -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let requests = (0..2)
        .map(|i| Request {
            arrival: Nanos::from_secs_f64(10.0 * i as f64),
            segments: vec![arena.push(1000..1000 + PROMPT)],
            prompt_tokens: PROMPT,
            output_tokens: 8,
            context: 0,
        })
        .collect();
    Arc::new(Trace {
        arena,
        requests,
        contexts: 1,
    })
}

fn evostore(s: &Scenario, load: LoadChoice) -> Policy {
    let mut p = s.preset("evostore").unwrap();
    p.store.as_mut().unwrap().load = load;
    p
}

/// The second request's TTFT (ms) and its tokens loaded from remote host memory.
fn second(s: &Scenario, p: &Policy) -> (f64, u32) {
    let run = simulate(s, trace(), p).unwrap();
    let r = &run.report.records[1];
    assert_eq!(
        r.instance, 1,
        "round-robin sends the second request to node 1"
    );
    let ttft = (r.first_token.unwrap() - r.arrival).as_secs_f64() * 1e3;
    (ttft, r.reused[Tier::RemoteHost as usize])
}

#[test]
fn behind_a_slow_nic_the_prefix_is_recomputed_and_behind_a_fast_one_it_is_loaded() {
    let slow = scenario(1, 10.0);
    let (always, loaded) = second(&slow, &evostore(&slow, LoadChoice::Always));
    let (faster, faster_loaded) = second(&slow, &evostore(&slow, LoadChoice::WhenFaster));
    let (recompute, _) = second(&slow, &slow.preset("vanilla").unwrap());
    eprintln!(
        "10 Gb/s: always {always:.1} ms, when-faster {faster:.1} ms, vanilla {recompute:.1} ms"
    );
    assert_eq!(loaded, 8192, "always loads the whole stored prefix");
    assert!(
        always > 1.1 * recompute,
        "the slow load is the worse choice here"
    );
    assert!(
        faster <= 1.05 * recompute,
        "when-faster within 5 % of recomputing: {faster:.1} ms against {recompute:.1} ms"
    );
    assert!(faster_loaded < 8192);

    let fast = scenario(2, 200.0);
    let (always, loaded) = second(&fast, &evostore(&fast, LoadChoice::Always));
    let (faster, faster_loaded) = second(&fast, &evostore(&fast, LoadChoice::WhenFaster));
    let (recompute, _) = second(&fast, &fast.preset("vanilla").unwrap());
    eprintln!(
        "2 x 200 Gb/s: always {always:.1} ms, when-faster {faster:.1} ms, vanilla {recompute:.1} ms"
    );
    assert_eq!(loaded, 8192);
    assert_eq!(
        faster_loaded, 8192,
        "behind fast NICs the whole prefix is loaded"
    );
    assert_eq!(faster, always);
    assert!(always < 0.5 * recompute);
}

/// Layer by layer, a load overlaps the prefill of what is not loaded: behind the slow NIC the
/// best choice loads the prefix's first part while the rest is computed, and beats both
/// loading everything and recomputing everything.
#[test]
fn layer_by_layer_the_slow_nic_loads_a_first_part_and_recomputes_the_rest() {
    let slow = scenario(1, 10.0);
    let layerwise = |load| {
        let mut p = evostore(&slow, load);
        p.store.as_mut().unwrap().load_overlap = meshsim::serving::store::LoadOverlap::Layerwise;
        p
    };
    let (always, _) = second(&slow, &layerwise(LoadChoice::Always));
    let (faster, loaded) = second(&slow, &layerwise(LoadChoice::WhenFaster));
    let (recompute, _) = second(&slow, &slow.preset("vanilla").unwrap());
    eprintln!(
        "layer-wise, 10 Gb/s: always {always:.1} ms, when-faster {faster:.1} ms ({loaded} tokens \
         loaded), vanilla {recompute:.1} ms"
    );
    assert!(0 < loaded && loaded < 8192, "{loaded} tokens loaded");
    assert!(faster < always.min(recompute));
}

/// The remote data path (`hardware.network.remote_kv_path`): the second request loads 1 GiB
/// from node 0's host memory. GPUDirect crosses the owner's DRAM, one NIC each side and the
/// reader's PCIe as one transfer, at the slowest link's rate (PCIe: 25 GB/s x 0.8); staged hop
/// after hop it first crosses the NICs into the reader's DRAM (one 200 Gb/s NIC x 0.9 =
/// 22.5 GB/s) and then the same PCIe, so it takes longer by exactly the first hop; pipelined,
/// the reader's DRAM (204.8 GB/s x 0.75, crossed twice) never binds, and it costs what
/// GPUDirect costs.
#[test]
fn a_remote_load_staged_hop_after_hop_pays_the_nic_then_the_pcie() {
    let s = scenario(2, 200.0);
    let with_path = |path: &str| {
        let mut p = evostore(&s, LoadChoice::Always);
        p.store.as_mut().unwrap().remote_kv_path = Some(serde_json::from_str(path).unwrap());
        second(&s, &p)
    };
    let (direct, loaded) = with_path("\"gpudirect\"");
    let (staged, _) = with_path("\"host-staged\"");
    let (pipelined, _) = with_path("\"host-pipelined\"");
    eprintln!(
        "1 GiB remote: gpudirect {direct:.2} ms, host-staged {staged:.2} ms, host-pipelined {pipelined:.2} ms"
    );
    assert_eq!(loaded, 8192);
    let bytes = 8192.0 * s.model.kv_bytes_per_token() as f64;
    let nic = &s.hardware.network.nic;
    let first_hop_ms = bytes / (nic.bandwidth * nic.efficiency) * 1e3;
    let hop_latency_ms = s.hardware.inter_node_latency().as_secs_f64() * 1e3;
    let extra = staged - direct;
    assert!(
        (extra - first_hop_ms - hop_latency_ms).abs() < 0.01 * first_hop_ms,
        "staged costs {extra:.2} ms more; the first hop alone takes {first_hop_ms:.2} ms"
    );
    assert!(
        (pipelined - direct).abs() < 0.01,
        "{pipelined} against {direct}"
    );
}
