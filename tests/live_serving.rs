//! Live serving: the serving actors on the live host with real K/V.
//! Prefix reuse never changes the output: under every policy each request generates
//! vanilla's greedy tokens, with first-token logits within the stated tolerance; and a wrong
//! load (corrupted K/V) is caught by that check.

mod common;

use std::sync::Arc;

use meshsim::serving::build::trace;
use meshsim::serving::live::{LOGIT_TOLERANCE, check_outputs, live_all, live_with};
use meshsim::serving::scenario::Scenario;

/// A small live scenario: 2 nodes x 2 instances, seeded prompts of a few hundred tokens about
/// a few shared contexts, and stores so small that they demote to SSD and drop.
fn scenario() -> Scenario {
    let text = [
        r#"
name = "live_serving_test"
seed = 3
policies = ["vanilla", "local-prefix", "evostore", "ptstore"]
mode = "live"
"#,
        common::LIVE_TINY_2X2,
        r#"[serving]
block_size_tokens = 16
max_num_seqs = 8
max_batched_tokens = 512
memory_reserve_gib = 0.1
[workload]
dataset = "squad"
requests = 32
arrival_rate_per_s = 100.0
context = "window"
context_tokens = 160
system_prompt_tokens = 16
[workload.reuse]
contexts = 6
questions_per_context = 6
[workload.output_tokens]
distribution = "fixed"
tokens = 4
[store]
tensor_tokens = 32
host_capacity_gib = 0.001
ssd_capacity_gb = 0.002
# No read leases: every node's owned cache (8 tensors; 6 under ptstore) must then demote,
# since 6 contexts of 5 tensors each outgrow both nodes, and a prefix being extended (5
# tensors) never fills it. A load may then find a tensor gone: it fails and recomputes.
read_lease_ms = 0.0
[store.ptstore]
replicate_after_reads = 1
[limits]
max_wall_s = 300.0
"#,
    ]
    .concat();
    Scenario::parse("live_serving_test.toml", "live_serving_test", &text).unwrap()
}

/// The tests of this file time real work: they run one at a time, so that one's measurements
/// are not another's contention.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn every_policy_generates_vanillas_tokens_on_real_kv() {
    let _one = serial();
    let s = scenario();
    check_tokens(&s);
}

#[test]
fn every_deployed_systems_preset_generates_vanillas_tokens_on_real_kv() {
    let _one = serial();
    // The presets' chunks and tiers scaled down to the test's prompts and memory, without
    // the GPU cache: it would serve every reuse of an instance's own prefixes, and the
    // test is of the store's real loads.
    let small = "tensor_tokens = 32\nhost_capacity_gib = 0.004\ngpu_prefix_cache = false\n";
    let tables: String = [
        "vllm-offload",
        "lmcache",
        "sglang-hicache",
        "mooncake-store",
    ]
    .iter()
    .map(|p| format!("[policy.{p}]\n{small}"))
    .collect();
    let text = scenario().text.replace(
        "policies = [\"vanilla\", \"local-prefix\", \"evostore\", \"ptstore\"]",
        "policies = [\"vanilla\", \"vllm-offload\", \"lmcache\", \"sglang-hicache\", \"mooncake-store\"]",
    )
    // Arrivals slow enough for prompts to be stored before their next use on one instance
    // (live iterations on this CPU take tens of ms), and leases that keep planned loads.
    .replace("arrival_rate_per_s = 100.0", "arrival_rate_per_s = 8.0")
    .replace("read_lease_ms = 0.0", "read_lease_ms = 5000.0")
        + &tables;
    let s = Scenario::parse("live_presets_test.toml", "live_presets_test", &text).unwrap();
    check_tokens(&s);
}

/// Runs every policy of `s` live: each completes every request with vanilla's tokens, reuses
/// something (vanilla nothing), and a store policy loads real K/V.
fn check_tokens(s: &Scenario) {
    let runs = common::runtime().block_on(live_all(s)).unwrap();
    assert_eq!(runs.len(), s.policies.len());
    for r in &runs {
        assert_eq!(r.report.outputs.len(), 32, "{}", r.policy.name());
        assert!(r.report.outputs.iter().all(|(_, t)| t.len() == 4));
        let reused: u64 = r.report.records.iter().map(|q| q.reused_tokens()).sum();
        if r.policy.name() == "vanilla" {
            assert_eq!(reused, 0);
        } else {
            assert!(reused > 0, "{} reused nothing", r.policy.name());
        }
    }
    // The store policies really loaded K/V, from host memory and from the SSD tier.
    for r in runs.iter().filter(|r| r.policy.uses_store()) {
        let st = r.report.store.as_ref().unwrap();
        let ssd = r
            .policy
            .store
            .as_ref()
            .is_some_and(|t| t.ssd_capacity_bytes > 0);
        assert!(st.lookups > 0 && (st.stats.demoted > 0 || !ssd), "{:?}", st);
        let loaded: u64 = r.report.records.iter().flat_map(|q| q.loaded_bytes).sum();
        assert!(loaded > 0, "{} loaded nothing", r.policy.name());
    }
    // live_all checked the outputs (it fails otherwise) and says how.
    let checks: Vec<_> = runs.iter().filter_map(|r| r.output_check.clone()).collect();
    assert_eq!(checks.len(), s.policies.len() - 1);
    for c in &checks {
        assert!(c.problem.is_none(), "{c:?}");
        assert!(c.max_logit_diff <= LOGIT_TOLERANCE, "{c:?}");
        assert_eq!(c.requests, 32);
    }
}

#[test]
fn a_wrong_load_is_caught_by_the_output_check() {
    let _one = serial();
    let s = scenario();
    let trace = Arc::new(trace(&s).unwrap());
    let rt = common::runtime();
    let vanilla = rt
        .block_on(live_with(
            &s,
            trace.clone(),
            &s.preset("vanilla").unwrap(),
            None,
        ))
        .unwrap();
    let good = rt
        .block_on(live_with(
            &s,
            trace.clone(),
            &s.preset("evostore").unwrap(),
            None,
        ))
        .unwrap();
    let bad = rt
        .block_on(live_with(
            &s,
            trace,
            &s.preset("evostore").unwrap(),
            Some(0.5),
        ))
        .unwrap();
    // One vanilla run serves both checks: one per other run, in order.
    let checks = check_outputs(&[vanilla, good, bad]);
    let (ok, caught) = (&checks[..1], &checks[1..]);
    assert!(ok[0].problem.is_none(), "{:?}", ok[0]);
    let problem = caught[0]
        .problem
        .as_deref()
        .expect("a corrupted load changes the output");
    assert!(
        problem.contains("evostore changed the output of request"),
        "{problem}"
    );
    assert!(caught[0].max_logit_diff > LOGIT_TOLERANCE);
}

/// Calibration: a measured profile prices what the live instances computed, and the
/// simulation calibrated with it ranks the policies as the live run does where they differ
/// clearly (reuse against none). Bounds are wide: timings on a shared 2-core machine are
/// noisy; a profile that prices the wrong thing (a missing term, a unit slip) is off by far
/// more.
#[test]
fn a_measured_profile_prices_the_live_iterations_and_calibrates_the_simulation() {
    let _one = serial();
    use meshsim::model::profile::Profile;
    use meshsim::profiling::{ServingGrid, measure_serving, write};

    let grid = ServingGrid {
        prefill: vec![16, 64, 128, 192],
        chunks: vec![32],
        chunk_contexts: vec![64, 160],
        batches: vec![1, 4, 8],
        contexts: vec![64, 192],
        tensors: vec![1, 2],
        block_size: 16,
        tensor_tokens: 32,
        repeats: 3,
    };
    let cfg = meshsim::exec::TransformerConfig::preset("tiny-32k").unwrap();
    let mut rounds = Vec::new();
    let b = measure_serving(
        &cfg,
        &meshsim::exec::WeightSource::Seeded(3),
        &candle_core::Device::Cpu,
        &grid,
        &mut |done, all| rounds.push((done, all)),
    )
    .unwrap();
    assert_eq!(
        rounds,
        [(1, 4), (2, 4), (3, 4), (4, 4)],
        "a warm-up and 3 rounds"
    );
    assert_eq!(b.iterations.len(), 4 + 2 + 3 * 2);
    assert!(b.export.len() == 2 && b.load.len() == 2);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("profile.toml");
    let profile = Profile {
        model: "tiny-32k".into(),
        device: "cpu".into(),
        dtype: "f32".into(),
        repeats: 3,
        shards: Vec::new(),
        serving: Some(b),
    };
    write(&profile, &file).unwrap();
    // The file reads back as written.
    assert_eq!(Profile::load(&file).unwrap(), profile);

    // A load the one shared device can serve (about a third of its capacity), so that TTFT
    // is the policies' work rather than a queue.
    let mut s = scenario();
    let text = s
        .text
        .replace("arrival_rate_per_s = 100.0", "arrival_rate_per_s = 10.0");
    let text = text.replace(
        "[serving]\n",
        &format!(
            "[serving]\nprofile = {:?}\nshared_device = true\niteration_overhead_us = 50.0\n",
            file.display().to_string()
        ),
    );
    s = Scenario::parse("live_serving_test.toml", "live_serving_test", &text).unwrap();
    let fit = s.serving.profile.as_ref().unwrap().1;
    let live = common::runtime().block_on(live_all(&s)).unwrap();
    for r in &live {
        let t = r.timing.unwrap();
        let all = t.all();
        let priced = fit.price(&all.terms) / 1e9;
        let measured = all.compute.as_secs_f64();
        assert!(
            (0.5..2.0).contains(&(measured / priced)),
            "{}: the profile prices {priced:.3} s of iterations that took {measured:.3} s \
             (fit {:?}, terms {:?})",
            r.policy.name(),
            fit.coef,
            all.terms,
        );
        // And each kind of iteration on its own: decode steps and prefill chunks.
        for kind in meshsim::backend::IterationKind::ALL {
            let k = &t.by_kind[kind as usize];
            if k.iterations < 5 {
                continue;
            }
            let priced = fit.price(&k.terms) / 1e9;
            let measured = k.compute.as_secs_f64();
            assert!(
                (0.5..2.0).contains(&(measured / priced)),
                "{} {}: the profile prices {priced:.3} s of {} iterations that took \
                 {measured:.3} s",
                r.policy.name(),
                kind.name(),
                k.iterations,
            );
        }
    }
    let sim = meshsim::serving::sim::simulate_all(&s, Arc::new(trace(&s).unwrap()), 1).unwrap();
    let p50 = |runs: &[meshsim::serving::outcome::PolicyRun], p: &str| {
        runs.iter()
            .find(|r| r.policy.name() == p)
            .unwrap()
            .summary
            .ttft
            .p50
    };
    for (what, runs) in [("simulated", &sim[..]), ("live", &live[..])] {
        for p in ["local-prefix", "evostore", "ptstore"] {
            assert!(
                p50(runs, p) < p50(runs, "vanilla"),
                "{what}: {} is not faster than vanilla: {:?}",
                p,
                runs.iter()
                    .map(|r| (r.policy.name(), r.summary.ttft.p50))
                    .collect::<Vec<_>>()
            );
        }
    }
}
