//! The paper-shape study (`scenarios/study_*.toml`): the statements of `results/README.md`,
//! "When does PTStore beat EvoStore and local prefix caching?", checked on the committed
//! summaries. `tests/committed_results.rs` checks that the code reproduces those summaries, so
//! together they fail when a change to the model changes an answer the README gives.

use std::collections::BTreeMap;
use std::path::Path;

/// `(point, policy) -> row` of `results/<name>/summary.csv`.
fn summary(name: &str) -> BTreeMap<(String, String), BTreeMap<String, f64>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("results/{name}/summary.csv"));
    let mut r = csv::Reader::from_path(&path).unwrap();
    let headers = r.headers().unwrap().clone();
    let mut out = BTreeMap::new();
    for rec in r.records() {
        let rec = rec.unwrap();
        let mut row = BTreeMap::new();
        for (h, v) in headers.iter().zip(rec.iter()) {
            if let Ok(x) = v.parse::<f64>() {
                row.insert(h.to_string(), x);
            }
        }
        out.insert((rec[0].to_string(), rec[1].to_string()), row);
    }
    out
}

struct Study(BTreeMap<(String, String), BTreeMap<String, f64>>);

impl Study {
    fn load(name: &str) -> Study {
        Study(summary(name))
    }

    fn get(&self, point: &str, policy: &str, column: &str) -> f64 {
        self.0
            .get(&(point.to_string(), policy.to_string()))
            .unwrap_or_else(|| panic!("no row for {point} / {policy}"))[column]
    }

    /// `a`'s TTFT statistic over `b`'s (above 1: `b` is faster).
    fn ratio(&self, point: &str, a: &str, b: &str, stat: &str) -> f64 {
        let col = format!("ttft_{stat}_ms");
        self.get(point, a, &col) / self.get(point, b, &col)
    }

    fn points(&self) -> Vec<String> {
        let mut p: Vec<String> = self.0.keys().map(|(p, _)| p.clone()).collect();
        p.dedup();
        p
    }
}

#[test]
fn both_published_claims_hold_at_8k_on_a_100_gbit_network() {
    let s = Study::load("study_network");
    let p = "nic_bandwidth_gbit_per_s=100.0 nics_per_node=1";
    assert!(s.ratio(p, "evostore", "ptstore", "p50") >= 1.2);
    assert!(s.ratio(p, "local-prefix", "ptstore", "p50") >= 2.0);
    assert!(s.ratio(p, "local-prefix", "ptstore", "mean") >= 2.0);
    let slow = "nic_bandwidth_gbit_per_s=25.0 nics_per_node=1";
    assert!(s.ratio(slow, "evostore", "ptstore", "p50") >= 1.2);
    assert!(s.ratio(slow, "evostore", "ptstore", "mean") >= 1.2);
}

#[test]
fn ptstore_equals_evostore_on_polaris_and_gains_as_the_nic_falls_below_the_pcie() {
    let s = Study::load("study_network");
    let polaris = "nic_bandwidth_gbit_per_s=200.0 nics_per_node=2";
    for stat in ["p50", "mean"] {
        let r = s.ratio(polaris, "evostore", "ptstore", stat);
        assert!((0.97..1.03).contains(&r), "{stat}: {r}");
    }
    // PTStore reads fewer tokens remotely, yet gains nothing there.
    assert!(
        s.get(polaris, "ptstore", "reused_remote_host_tokens")
            < s.get(polaris, "evostore", "reused_remote_host_tokens")
    );
    let gain = |nic: &str| s.ratio(nic, "evostore", "ptstore", "p50");
    let (one200, one100) = (
        gain("nic_bandwidth_gbit_per_s=200.0 nics_per_node=1"),
        gain("nic_bandwidth_gbit_per_s=100.0 nics_per_node=1"),
    );
    assert!(
        gain(polaris) < one200 && one200 < one100,
        "{one200} {one100}"
    );
    // Everywhere else on Polaris's network, within 6 %.
    for name in ["study_scale", "study_context"] {
        let t = Study::load(name);
        for p in t.points() {
            let r = t.ratio(&p, "evostore", "ptstore", "mean");
            assert!((0.97..1.03).contains(&r), "{name} {p}: {r}");
            let r = t.ratio(&p, "evostore", "ptstore", "p50");
            assert!((0.97..1.07).contains(&r), "{name} {p}: {r}");
        }
    }
}

#[test]
fn ptstore_loses_to_evostore_when_store_memory_is_short() {
    let s = Study::load("study_skew_memory");
    for alpha in ["0.0", "0.6"] {
        let p = format!("host_capacity_gib=32.0 zipf_alpha={alpha}");
        assert!(s.ratio(&p, "evostore", "ptstore", "p50") < 0.97, "{p}");
        assert!(
            s.get(&p, "ptstore", "reused_remote_ssd_tokens")
                > s.get(&p, "evostore", "reused_remote_ssd_tokens"),
            "{p}"
        );
    }
}

#[test]
fn on_a_25_gbit_network_loading_loses_to_recomputing() {
    let s = Study::load("study_network");
    let p = "nic_bandwidth_gbit_per_s=25.0 nics_per_node=1";
    assert!(s.get(p, "evostore", "ttft_mean_ms") > s.get(p, "vanilla", "ttft_mean_ms"));
    assert!(s.get(p, "ptstore", "ttft_mean_ms") > s.get(p, "local-prefix", "ttft_mean_ms"));
}

#[test]
fn stores_beat_local_prefix_caching_twice_over_at_8k_and_less_at_1k() {
    let scale = Study::load("study_scale");
    for p in scale.points() {
        let mean = scale.ratio(&p, "local-prefix", "ptstore", "mean");
        // 3.0x with round-robin routing, 1.9-2.3x with KV-aware routing.
        let least = if p.contains("round-robin") { 2.9 } else { 1.85 };
        assert!(mean >= least, "{p}: {mean}");
        let p50 = scale.ratio(&p, "local-prefix", "ptstore", "p50");
        if p.contains("round-robin") {
            assert!(p50 > 9.0, "{p}: {p50}");
        } else {
            // KV-aware routing: the median request hits its own GPU cache.
            assert!(p50 < 1.5, "{p}: {p50}");
        }
    }
    let ctx = Study::load("study_context");
    let at = |router: &str, k: u32| {
        let min = k * 3 / 4;
        let p = format!("router={router} context_tokens={k} min_context_tokens={min}");
        ctx.ratio(&p, "local-prefix", "ptstore", "mean")
    };
    for router in ["round-robin", "kv-aware"] {
        let gains: Vec<f64> = [1024, 2048, 4096, 8192].map(|k| at(router, k)).to_vec();
        assert!(gains.windows(2).all(|w| w[0] < w[1]), "{router}: {gains:?}");
        assert!(gains[0] < 1.8 && gains[3] >= 2.0, "{router}: {gains:?}");
    }
}

#[test]
fn kv_aware_routing_makes_the_median_request_a_gpu_hit_and_hurts_vanilla() {
    let s = Study::load("study_scale");
    for (nodes, rate) in [(2, 8), (4, 16), (8, 32)] {
        let p = |router: &str| format!("nodes={nodes} arrival_rate_per_s={rate}.0 router={router}");
        let (rr, kv) = (p("round-robin"), p("kv-aware"));
        assert!(s.get(&kv, "local-prefix", "ttft_p50_ms") < 30.0);
        assert!(s.get(&rr, "local-prefix", "ttft_p50_ms") > 500.0);
        assert!(s.get(&kv, "vanilla", "ttft_mean_ms") > s.get(&rr, "vanilla", "ttft_mean_ms"));
    }
}

#[test]
fn strong_skew_lets_the_gpu_caches_hold_the_popular_windows() {
    let s = Study::load("study_skew_memory");
    let p = "host_capacity_gib=256.0 zipf_alpha=1.4";
    assert!(s.ratio(p, "local-prefix", "ptstore", "p50") < 1.3);
    assert!(s.ratio(p, "local-prefix", "ptstore", "mean") > 2.0);
    let uniform = "host_capacity_gib=256.0 zipf_alpha=0.0";
    assert!(s.ratio(uniform, "local-prefix", "ptstore", "p50") > 9.0);
}

#[test]
fn conversations_raise_store_hits_everywhere_but_local_hits_only_with_kv_aware_routing() {
    let s = Study::load("study_multiturn");
    let hit = |router: &str, turns: u32, policy: &str| {
        s.get(
            &format!("router={router} turns={turns}"),
            policy,
            "prefix_hit_ratio",
        )
    };
    let mean = |router: &str, turns: u32, policy: &str| {
        s.get(
            &format!("router={router} turns={turns}"),
            policy,
            "ttft_mean_ms",
        )
    };
    for router in ["round-robin", "kv-aware"] {
        assert!(hit(router, 8, "ptstore") > hit(router, 1, "ptstore") + 0.05);
        assert!(mean(router, 8, "ptstore") < 0.85 * mean(router, 1, "ptstore"));
    }
    // Round-robin: the next turn lands elsewhere, so local hits stay flat.
    assert!(
        (hit("round-robin", 8, "local-prefix") - hit("round-robin", 1, "local-prefix")).abs()
            < 0.05
    );
    assert!(hit("kv-aware", 8, "local-prefix") > hit("kv-aware", 1, "local-prefix") + 0.08);
    assert!(mean("kv-aware", 8, "local-prefix") < 0.85 * mean("kv-aware", 1, "local-prefix"));
}

/// "Load or recompute": behind one 25 Gb/s NIC an always-loading store is slower than no
/// store on the mean, deciding per request makes both stores about 2x faster than vanilla
/// and shrinks PTStore's lead, and from one 100 Gb/s NIC on both choices give the same rows.
#[test]
fn deciding_to_recompute_rescues_the_slow_network_and_changes_nothing_on_a_fast_one() {
    let s = Study::load("study_network");
    let slow = "nic_bandwidth_gbit_per_s=25.0 nics_per_node=1";
    let mean = |policy: &str| s.get(slow, policy, "ttft_mean_ms");
    assert!(mean("evostore") > mean("vanilla"));
    for store in ["evostore", "ptstore"] {
        let decided = format!("{store}-when-faster");
        assert!(s.ratio(slow, "vanilla", &decided, "mean") > 1.8, "{store}");
        assert!(
            s.get(slow, &decided, "reused_remote_host_tokens")
                < s.get(slow, store, "reused_remote_host_tokens")
        );
    }
    assert!(s.ratio(slow, "evostore", "ptstore", "mean") > 1.6);
    assert!(s.ratio(slow, "evostore-when-faster", "ptstore-when-faster", "mean") < 1.1);
    for point in s.points() {
        if point.starts_with("nic_bandwidth_gbit_per_s=25.0") {
            continue;
        }
        for store in ["evostore", "ptstore"] {
            let decided = format!("{store}-when-faster");
            for col in [
                "ttft_mean_ms",
                "ttft_p50_ms",
                "ttft_p99_ms",
                "prefix_hit_ratio",
            ] {
                assert_eq!(
                    s.get(&point, store, col),
                    s.get(&point, &decided, col),
                    "{point} {col}"
                );
            }
        }
    }
}

/// "How loaded the links are": the NICs idle at Polaris, saturated behind one 25 Gb/s NIC
/// until the store decides per request, and PTStore's replicas against the NIC bytes they save.
#[test]
fn the_links_idle_at_polaris_and_saturate_behind_one_25_gbit_nic() {
    let s = Study::load("study_network");
    let p =
        |nics: u32, gbit: f64| format!("nic_bandwidth_gbit_per_s={gbit:.1} nics_per_node={nics}");
    let (polaris, slow) = (p(2, 200.0), p(1, 25.0));
    let evo = |point: &str, column: &str| s.get(point, "evostore", column);
    assert!(evo(&polaris, "nic_gbyte_per_s") < 0.04 * 22.5);
    assert!(evo(&polaris, "nic_busy_ratio") < 0.04);
    assert!(evo(&polaris, "nic_busiest_ratio") < 0.05);
    assert!(evo(&polaris, "dram_busy_ratio") > 3.0 * evo(&polaris, "nic_busy_ratio"));
    assert!(evo(&slow, "nic_busy_ratio") > 0.75 && evo(&slow, "nic_busiest_ratio") > 0.85);
    let faster = |column: &str| s.get(&slow, "evostore-when-faster", column);
    assert!(faster("network_bytes") < 0.5 * evo(&slow, "network_bytes"));
    assert!(faster("nic_busy_ratio") < 0.3);
    for point in s.points() {
        let replicas = s.get(&point, "ptstore", "moved_replication_bytes");
        let saved = evo(&point, "nic_load_bytes") - s.get(&point, "ptstore", "nic_load_bytes");
        assert!((1.5e11..2.1e11).contains(&replicas), "{point}: {replicas}");
        assert!(saved > 1.0e11 && saved < replicas, "{point}: {saved}");
        assert_eq!(
            s.get(&point, "ptstore", "nic_replication_bytes"),
            0.0,
            "{point}"
        );
    }
}

/// "Load": the GPUs saturate before the NICs; PTStore's lead over EvoStore stays small with
/// GPUDirect loads and grows when remote loads are staged through host memory, until the
/// GPUs' queues dominate; deciding per request changes nothing at Polaris's NICs.
#[test]
fn under_load_the_gpus_saturate_first_and_staging_widens_ptstores_lead() {
    let s = Study::load("study_load");
    let p = |path: &str, rate: u32| format!("remote_kv_path={path} arrival_rate_per_s={rate}.0");
    for path in ["gpudirect", "host-staged"] {
        for rate in [16, 32, 64, 96, 128] {
            let at = p(path, rate);
            for store in ["evostore", "ptstore"] {
                assert!(s.get(&at, store, "nic_busy_ratio") < 0.2, "{at} {store}");
                assert!(
                    s.get(&at, store, "nic_busiest_ratio") < 0.45,
                    "{at} {store}"
                );
            }
            let (p50, mean) = (
                s.ratio(&at, "evostore", "ptstore", "p50"),
                s.ratio(&at, "evostore", "ptstore", "mean"),
            );
            match (path, rate) {
                ("gpudirect", _) => assert!((0.99..1.07).contains(&p50) && mean < 1.02, "{at}"),
                (_, 128) => assert!(p50 < 1.05, "{at}: {p50}"),
                _ => assert!(p50 > 1.10, "{at}: {p50}"),
            }
            let replicas = s.get(&at, "ptstore", "moved_replication_bytes");
            let saved =
                s.get(&at, "evostore", "nic_load_bytes") - s.get(&at, "ptstore", "nic_load_bytes");
            assert!((1.8e11..2.0e11).contains(&replicas), "{at}: {replicas}");
            assert!((1.2e11..1.7e11).contains(&saved), "{at}: {saved}");
            if rate < 128 {
                for (store, faster) in [
                    ("evostore", "evostore-when-faster"),
                    ("ptstore", "ptstore-when-faster"),
                ] {
                    for stat in ["ttft_p50_ms", "ttft_mean_ms"] {
                        assert_eq!(s.get(&at, store, stat), s.get(&at, faster, stat), "{at}");
                    }
                }
            }
        }
        let busy = p(path, 64);
        assert!(s.get(&busy, "vanilla", "gpu_busy_ratio") > 0.9);
        assert!(
            s.get(&busy, "vanilla", "ttft_p50_ms") > 30.0 * s.get(&busy, "evostore", "ttft_p50_ms")
        );
    }
}
