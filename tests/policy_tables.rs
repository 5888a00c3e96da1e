//! Policies as compositions: `[policy.NAME]` tables, the presets they start from, what
//! `meshsim check` prints, what is refused, and what a store's scope means in a run.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::deadline::{assert_refused, meshsim};
use meshsim::Scenario;
use meshsim::metrics::Tier;
use meshsim::serving::build::trace;
use meshsim::serving::policy::{PRESETS, Scope};
use meshsim::serving::scenario::policy::table;
use meshsim::serving::sim::simulate;

/// The small test scenario with `policies` and extra tables appended.
fn with(policies: &str, tables: &str) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(common::data("small.toml")).unwrap();
    let text = text.replace(
        "policies = [\"vanilla\", \"local-prefix\", \"evostore\", \"ptstore\"]",
        &format!("policies = {policies}\n{tables}"),
    );
    Scenario::parse("s.toml", "s", &text).map_err(|e| e.to_string())
}

fn all_presets() -> String {
    format!("{PRESETS:?}")
}

#[test]
fn every_preset_resolves_and_its_printed_table_makes_it_again() {
    let s = with(&all_presets(), "").unwrap();
    assert_eq!(s.policies.len(), 9);
    for p in &s.policies {
        // The printed table, under another name, is the same composition.
        let printed = table(p);
        let copy = printed.replace(&format!("[policy.{}]", p.name), "[policy.copy]");
        let again = with(&format!("[{:?}, \"copy\"]", p.name), &copy)
            .unwrap_or_else(|e| panic!("{}: {e}\n{copy}", p.name));
        let mut q = again.policies[1].clone();
        q.name = p.name.clone();
        assert_eq!(&q, p, "{printed}");
    }
}

#[test]
fn the_gpu_eviction_order_is_lru_in_every_preset_and_its_printed_table_makes_it_again() {
    use meshsim::serving::kv::GpuEviction;
    let s = with(&all_presets(), "").unwrap();
    assert!(
        s.policies
            .iter()
            .all(|p| p.gpu_eviction == GpuEviction::Lru)
    );
    let tables = "[policy.lfu]\nbase = \"local-prefix\"\ngpu_eviction = \"lfu\"\n\
                  [policy.s3]\nbase = \"lmcache\"\ngpu_eviction = \"s3-fifo\"\n\
                  [policy.lru]\nbase = \"evostore\"\ngpu_eviction = \"lru\"\n";
    let s = with("[\"lfu\", \"s3\", \"lru\"]", tables).unwrap();
    let orders: Vec<GpuEviction> = s.policies.iter().map(|p| p.gpu_eviction).collect();
    assert_eq!(
        orders,
        [GpuEviction::Lfu, GpuEviction::S3Fifo, GpuEviction::Lru]
    );
    for p in &s.policies {
        let printed = table(p);
        let copy = printed.replace(&format!("[policy.{}]", p.name), "[policy.copy]");
        let again = with("[\"copy\"]", &copy).unwrap_or_else(|e| panic!("{e}\n{copy}"));
        let mut q = again.policies[0].clone();
        q.name = p.name.clone();
        assert_eq!(&q, p, "{printed}");
    }
    // `meshsim check` prints the key.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(common::data("small.toml"))
        .unwrap()
        .replace(
            "policies = [\"vanilla\", \"local-prefix\", \"evostore\", \"ptstore\"]",
            &format!("policies = [\"lfu\", \"s3\", \"lru\"]\n{tables}"),
        );
    std::fs::write(dir.path().join("s.toml"), text).unwrap();
    let o = meshsim(dir.path(), &["check", "s.toml"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
    for key in [
        "gpu_eviction = \"lfu\"",
        "gpu_eviction = \"s3-fifo\"",
        "gpu_eviction = \"lru\"",
    ] {
        assert!(o.stdout.contains(key), "{key}:\n{}", o.stdout);
    }
}

#[test]
fn every_gpu_eviction_order_serves_every_request_and_lru_restated_changes_nothing() {
    let tables = "[policy.lru]\nbase = \"local-prefix\"\ngpu_eviction = \"lru\"\n\
                  [policy.lfu]\nbase = \"local-prefix\"\ngpu_eviction = \"lfu\"\n\
                  [policy.s3]\nbase = \"local-prefix\"\ngpu_eviction = \"s3-fifo\"\n";
    let s = with("[\"local-prefix\", \"lru\", \"lfu\", \"s3\"]", tables).unwrap();
    let runs = common::run(&s, 2);
    for r in &runs {
        assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
        assert!(
            r.report.records.iter().all(|q| q.completed()),
            "{}",
            r.summary.policy
        );
        assert!(r.summary.prefix_hit_ratio > 0.0, "{}", r.summary.policy);
    }
    let (a, b) = (&runs[0].summary, &runs[1].summary);
    assert_eq!((a.ttft, a.prefix_hit_ratio), (b.ttft, b.prefix_hit_ratio));
}

#[test]
fn meshsim_check_prints_the_table_of_each_of_the_eight_presets() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::fs::read_to_string(common::data("small.toml"))
        .unwrap()
        .replace(
            "policies = [\"vanilla\", \"local-prefix\", \"evostore\", \"ptstore\"]",
            &format!("policies = {}", all_presets()),
        );
    std::fs::write(dir.path().join("s.toml"), s).unwrap();
    let o = meshsim(dir.path(), &["check", "s.toml"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
    for p in PRESETS {
        assert!(
            o.stdout.contains(&format!("[policy.{p}]")),
            "{p}:\n{}",
            o.stdout
        );
        assert!(o.stdout.contains(&format!("base = \"{p}\"")), "{p}");
    }
    for key in [
        "scope = \"instance\"",
        "scope = \"cluster\"",
        "tensor_tokens = 256",
    ] {
        assert!(o.stdout.contains(key), "{key}");
    }
}

#[test]
fn a_table_changes_only_the_keys_it_gives() {
    let s = with(
        "[\"lmcache\", \"node-shared\"]",
        "[policy.node-shared]\nbase = \"lmcache\"\nscope = \"node\"\n",
    )
    .unwrap();
    let (a, b) = (&s.policies[0], &s.policies[1]);
    assert_eq!(b.base, "lmcache");
    let (ra, rb) = (a.store.as_ref().unwrap(), b.store.as_ref().unwrap());
    assert_eq!(rb.scope, Scope::Node);
    let mut same = rb.clone();
    same.scope = ra.scope;
    assert_eq!(&same, ra);
    // A preset's own table changes the preset under its name.
    let s = with(
        "[\"ptstore\"]",
        "[policy.ptstore]\nreplicate_after_reads = 4\n",
    )
    .unwrap();
    let r = s.policies[0].store.as_ref().unwrap();
    assert_eq!(r.replicate_after_reads, Some(4));
    // Tiers given to a policy that had none start from the [store] table's figures.
    let s = with(
        "[\"evostore\", \"mine\"]",
        "[policy.mine]\nbase = \"local-prefix\"\ntiers = [\"host\", \"ssd\"]\n",
    )
    .unwrap();
    assert_eq!(s.policies[1].store, s.policies[0].store);
    // And `tiers = []` takes them away.
    let s = with(
        "[\"local-prefix\", \"mine\"]",
        "[policy.mine]\nbase = \"ptstore\"\ntiers = []\n",
    )
    .unwrap();
    assert_eq!(s.policies[1].store, None);
    assert!(s.policies[1].gpu_prefix_cache);
}

#[test]
fn a_composition_that_cannot_work_is_refused_naming_the_key() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"vanilla\"\nscope = \"node\"\n",
            &["policy.mine.scope", "no tier beyond the GPU"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"ptstore\"\nscope = \"node\"\n",
            &["policy.mine.replicate_after_reads", "cluster"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nreplicate_after_reads = 2\n",
            &["policy.mine.replica_fraction", "replica cache"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nhost_capacity_gib = 100000.0\n",
            &[
                "policy.mine.host_capacity_gib",
                "at most hardware.host.memory_gib",
            ],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nssd_capacity_gb = 1e9\n",
            &["policy.mine.ssd_capacity_gb", "drives"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nhost_capacity_gib = nan\n",
            &["policy.mine.host_capacity_gib", "positive"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nhost_capacity_gib = inf\n",
            &["policy.mine.host_capacity_gib", "positive"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nssd_capacity_gb = -1.0\n",
            &["policy.mine.ssd_capacity_gb", "zero or a positive"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nreplica_fraction = 1.0\n",
            &["policy.mine.replica_fraction", "[0, 1)"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\ntensor_tokens = 24\n",
            &[
                "policy.mine.tensor_tokens",
                "multiple of serving.block_size_tokens",
            ],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\ntiers = [\"ssd\"]\n",
            &["policy.mine.tiers", "host memory first"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\ntiers = [\"host\"]\nssd_capacity_gb = 10.0\n",
            &["policy.mine.ssd_capacity_gb", "no SSD"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"mine\"\n",
            &["policy.mine.base", "presets"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nscope = \"node\"\n",
            &["policy.mine.base", "preset to start from"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\nscope = \"rack\"\n",
            &["policy", "rack"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\ncapacity = 3\n",
            &["policy", "capacity"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"vanilla\"\ngpu_eviction = \"lfu\"\n",
            &["policy.mine.gpu_eviction", "no GPU prefix cache", "\"lfu\""],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"evostore\"\ngpu_prefix_cache = false\n\
             gpu_eviction = \"s3-fifo\"\n",
            &["policy.mine.gpu_eviction", "gpu_prefix_cache = false"],
        ),
        (
            "[\"mine\"]",
            "[policy.mine]\nbase = \"local-prefix\"\ngpu_eviction = \"arc\"\n",
            &["policy", "gpu_eviction", "arc"],
        ),
        ("[\"mine\"]", "", &["policies", "unknown policy \"mine\""]),
        (
            "[\"vanilla\", \"vanilla\"]",
            "",
            &["policies", "listed twice"],
        ),
        ("[\"../x\"]", "", &["policies", "letters, digits"]),
        ("[]", "", &["policies", "at least one"]),
        (
            "[\"vanilla\"]",
            "[policy.other]\nbase = \"evostore\"\n",
            &["policy.other", "does not list"],
        ),
    ];
    for (policies, tables, words) in cases {
        let e = with(policies, tables)
            .err()
            .unwrap_or_else(|| panic!("accepted {policies} {tables}"));
        for w in *words {
            assert!(e.contains(w), "{policies} {tables}: {e:?} lacks {w:?}");
        }
    }
    // The CLI: exit 2, naming the file and the key.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(common::data("small.toml"))
        .unwrap()
        .replace(
            "policies = [\"vanilla\", \"local-prefix\", \"evostore\", \"ptstore\"]",
            "policies = [\"mine\"]\n[policy.mine]\nbase = \"ptstore\"\nscope = \"instance\"\n",
        );
    std::fs::write(dir.path().join("s.toml"), text).unwrap();
    let o = meshsim(dir.path(), &["check", "s.toml"]);
    assert_refused(&o, &["s.toml", "policy.mine.replicate_after_reads"]);
}

/// Bytes loaded per tier over a run.
fn loaded(s: &Scenario, name: &str) -> BTreeMap<&'static str, u64> {
    let t = Arc::new(trace(s).unwrap());
    let p = s.policies.iter().find(|p| p.name == name).unwrap();
    let run = simulate(s, t, p).unwrap();
    assert!(run.report.records.iter().all(|r| r.completed()), "{name}");
    let b = &run.summary.loaded_bytes;
    BTreeMap::from([
        (
            "local",
            b[Tier::LocalHost as usize] + b[Tier::LocalSsd as usize],
        ),
        (
            "remote",
            b[Tier::RemoteHost as usize] + b[Tier::RemoteSsd as usize],
        ),
    ])
}

#[test]
fn a_store_of_node_or_instance_scope_never_serves_another_node_and_a_cluster_store_does() {
    // No GPU cache, so that every reuse goes through the store; two nodes of two instances.
    let tables = "[policy.cluster]\nbase = \"evostore\"\ngpu_prefix_cache = false\n\
                  [policy.node]\nbase = \"evostore\"\ngpu_prefix_cache = false\nscope = \"node\"\n\
                  [policy.instance]\nbase = \"evostore\"\ngpu_prefix_cache = false\nscope = \"instance\"\n";
    let s = with("[\"cluster\", \"node\", \"instance\"]", tables).unwrap();
    let cluster = loaded(&s, "cluster");
    let node = loaded(&s, "node");
    let instance = loaded(&s, "instance");
    assert!(cluster["remote"] > 0, "{cluster:?}");
    assert_eq!(node["remote"], 0, "{node:?}");
    assert_eq!(instance["remote"], 0, "{instance:?}");
    // The wider the scope, the more a store serves.
    let total = |m: &BTreeMap<&str, u64>| m.values().sum::<u64>();
    assert!(total(&cluster) > total(&node), "{cluster:?} {node:?}");
    assert!(total(&node) > total(&instance), "{node:?} {instance:?}");
    assert!(total(&instance) > 0, "{instance:?}");
}

#[test]
fn a_table_that_restates_a_preset_gives_the_presets_results_byte_for_byte() {
    let s = with(&all_presets(), "").unwrap();
    let ptstore = s.policies.iter().find(|p| p.name == "ptstore").unwrap();
    let restated = table(ptstore).replace("[policy.ptstore]", "[policy.mine]");
    let both = with(
        "[\"ptstore\", \"mine\"]",
        &restated.replace("base = \"ptstore\"", "base = \"vanilla\""),
    )
    .unwrap();
    let runs = common::run(&both, 2);
    let (a, b) = (&runs[0].summary, &runs[1].summary);
    assert_eq!(a.ttft, b.ttft);
    assert_eq!(a.loaded_bytes, b.loaded_bytes);
    assert_eq!(a.prefix_hit_ratio, b.prefix_hit_ratio);
}

/// What results/README.md ("Does the eviction order matter?") says of the committed
/// results of `study_eviction` (which tests/committed_results.rs reproduces byte for byte).
#[test]
fn on_a_store_too_small_for_its_working_set_frequency_aware_orders_serve_more_than_lru() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/study_eviction/summary.csv");
    let mut rows = csv::Reader::from_path(path).unwrap();
    let head = rows.headers().unwrap().clone();
    let col = |name: &str| head.iter().position(|h| h == name).unwrap();
    let (p, hit, mean, dropped) = (
        col("policy"),
        col("prefix_hit_ratio"),
        col("ttft_mean_ms"),
        col("store_tensors_dropped"),
    );
    let mut by: BTreeMap<String, (f64, f64, u64)> = BTreeMap::new();
    for r in rows.records() {
        let r = r.unwrap();
        by.insert(
            r[p].to_string(),
            (
                r[hit].parse().unwrap(),
                r[mean].parse().unwrap(),
                r[dropped].parse().unwrap(),
            ),
        );
    }
    let lru = by["lru"];
    for order in ["gdsf", "lfu", "s3-fifo", "arc"] {
        let o = by[order];
        assert!(o.0 > 1.08 * lru.0, "{order}: {o:?} against lru {lru:?}");
        assert!(o.1 < 0.91 * lru.1, "{order}: {o:?} against lru {lru:?}");
    }
    let tiny = by["lru-tinylfu"];
    assert!(
        tiny.0 > 1.05 * lru.0 && tiny.2 * 5 < lru.2,
        "{tiny:?} {lru:?}"
    );
    let second = by["lru-second-hit"];
    assert!(second.0 > lru.0 && second.0 < tiny.0, "{second:?}");
}
