//! Pins each policy's behaviour on a small scenario: any change in results shows up here.
//! The summary is transposed (one line per column) so that a change reads as a small diff.

mod common;

/// A summary CSV with one line per column, so that a change reads as a small diff.
fn transposed(csv: &str) -> String {
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    let mut out = String::new();
    for (i, column) in rows[0].iter().enumerate() {
        let values: Vec<&str> = rows[1..].iter().map(|r| r[i]).collect();
        out += &format!("{column:<26} {}\n", values.join("  "));
    }
    out
}

#[test]
fn small_scenario_summary_under_every_policy() {
    let s = common::small();
    let (_, summary) = common::run_to_files(&s, 2);
    let text = String::from_utf8(summary).unwrap();
    insta::assert_snapshot!(transposed(&text));
}

/// Pins both decode modes of a pipeline route: 4 Mistral-7B shards, 6 sessions at once against
/// session caches of 4 (LRU re-prefills), a shard restart, Poisson arrivals.
#[test]
fn pipeline_summary_under_both_decode_modes() {
    use meshsim::metrics::write::write_summary;
    use meshsim::pipeline::scenario::PipelineScenario;
    use meshsim::pipeline::sim::simulate_all;
    let text = r#"
name = "pipeline_snapshot"
seed = 9
policies = ["cached", "stateless"]
[pipeline]
model = "mistral-7b-instruct-v0.2"
shards = 4
max_sessions = 4
max_active_sessions = 6
cost = "analytic"
dtype = "bf16"
step_overhead_us = 100.0
[pipeline.gpu]
name = "A100-SXM4-40GB"
memory_gib = 40.0
memory_bandwidth_gb_per_s = 1555.0
peak_tflops = 312.0
compute_efficiency = 0.6
memory_efficiency = 0.8
[pipeline.link]
bandwidth_gb_per_s = 25.0
latency_us = 2.5
[[pipeline.restart]]
shard = 1
request = 3
after_tokens = 10
[workload]
requests = 40
prompt_tokens = 512
output_tokens = 48
arrival_rate_per_s = 4.0
"#;
    let s = PipelineScenario::parse("snapshot.toml", "snapshot", std::path::Path::new("."), text)
        .unwrap();
    let runs = simulate_all(&s, 2).unwrap();
    let summaries: Vec<_> = runs.iter().map(|r| r.summary.clone()).collect();
    let mut csv = Vec::new();
    write_summary(&mut csv, &summaries).unwrap();
    let text = String::from_utf8(csv).unwrap();
    insta::assert_snapshot!(transposed(&text));
}

/// Every file in `tests/snapshots/` is an accepted snapshot (`<test file>__<test>.snap`, not a
/// pending `.snap.new`) of a test that exists, and its header names that test file: a snapshot
/// left behind by a renamed or removed test is an error.
#[test]
fn every_snapshot_file_belongs_to_an_existing_test() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut seen = 0;
    for entry in std::fs::read_dir(tests.join("snapshots")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let stem = name
            .strip_suffix(".snap")
            .unwrap_or_else(|| panic!("tests/snapshots/{name} is not an accepted snapshot"));
        let (file, test) = stem
            .split_once("__")
            .unwrap_or_else(|| panic!("tests/snapshots/{name}: not <test file>__<test>.snap"));
        let source = std::fs::read_to_string(tests.join(format!("{file}.rs")))
            .unwrap_or_else(|e| panic!("tests/snapshots/{name}: tests/{file}.rs: {e}"));
        assert!(
            source.contains(&format!("fn {test}()")),
            "tests/snapshots/{name}: no test `{test}` in tests/{file}.rs"
        );
        let snap = std::fs::read_to_string(tests.join("snapshots").join(&name)).unwrap();
        assert!(
            snap.starts_with(&format!("---\nsource: tests/{file}.rs\n")),
            "tests/snapshots/{name}: header does not name tests/{file}.rs"
        );
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} snapshots found");
}
