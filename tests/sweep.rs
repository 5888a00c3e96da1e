//! Sweeps: every point runs every policy, results do not depend on the thread count, and a
//! bad swept value is bad input naming the point.

mod common;

use meshsim::Scenario;
use meshsim::serving::outcome::write_results;
use meshsim::serving::sim::simulate_experiment;

fn swept(sweep: &str) -> Result<Scenario, meshsim::ScenarioError> {
    let text = std::fs::read_to_string(common::data("small.toml")).unwrap();
    Scenario::parse(
        "sweep.toml",
        "sweep",
        &format!("{text}\n[sweep]\n{sweep}\n"),
    )
}

fn summary_bytes(s: &Scenario, threads: usize) -> Vec<u8> {
    let runs = simulate_experiment(s, threads).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_results(s, &runs, &dir.path().join("out")).unwrap();
    std::fs::read(dir.path().join("out/summary.csv")).unwrap()
}

#[test]
fn a_two_key_sweep_runs_every_point_under_every_policy() {
    let s = swept(
        "\"workload.context_tokens\" = [1024, 2048]\n\"serving.router\" = [\"round-robin\", \"least-loaded\"]",
    )
    .unwrap();
    assert_eq!(s.points.len(), 4);
    // Keys are taken in sorted order; the first varies slowest.
    assert_eq!(s.points[0].label, "router=round-robin context_tokens=1024");
    assert_eq!(s.points[3].label, "router=least-loaded context_tokens=2048");
    let runs = simulate_experiment(&s, 2).unwrap();
    assert_eq!(runs.len(), 4 * s.policies.len());
    assert_eq!(
        runs[0].summary.point.as_deref(),
        Some(s.points[0].label.as_str())
    );
    // Longer contexts mean longer prompts.
    let prompt = |i: usize| runs[i * s.policies.len()].summary.prompt_tokens;
    assert!(prompt(1) > prompt(0));
}

#[test]
fn sweep_results_do_not_depend_on_the_thread_count() {
    let s = swept("\"workload.arrival_rate_per_s\" = [6.0, 12.0, 24.0]").unwrap();
    let one = summary_bytes(&s, 1);
    let three = summary_bytes(&s, 3);
    assert!(one == three, "summary.csv differs between 1 and 3 threads");
    let text = String::from_utf8(one).unwrap();
    assert!(text.starts_with("point,policy,"), "{text}");
    assert_eq!(text.lines().count(), 1 + 3 * s.policies.len());
}

#[test]
fn a_bad_swept_value_names_its_point_and_key() {
    let e = swept("\"hardware.nodes\" = [2, 0]").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("sweep point nodes=0"), "{msg}");
    assert!(msg.contains("hardware.nodes"), "{msg}");
    let e = swept("\"workload.context_tokens\" = 4096").unwrap_err();
    assert!(e.to_string().contains("expected a non-empty list"), "{e}");
    let e = swept("a = [1]\nb = [2]\nc = [3]").unwrap_err();
    assert!(e.to_string().contains("expected 1 to 2 keys"), "{e}");
}

#[test]
fn keys_joined_by_an_ampersand_are_swept_together() {
    let s = swept(
        "\"hardware.nodes & workload.arrival_rate_per_s\" = [[1, 6.0], [2, 12.0]]\n\"serving.router\" = [\"round-robin\", \"kv-aware\"]",
    )
    .unwrap();
    assert_eq!(s.points.len(), 4);
    assert_eq!(
        s.points[0].label,
        "nodes=1 arrival_rate_per_s=6.0 router=round-robin"
    );
    let p = &s.points[3];
    assert_eq!(p.label, "nodes=2 arrival_rate_per_s=12.0 router=kv-aware");
    assert_eq!(p.scenario.hardware.nodes, 2);
    match &p.scenario.workload {
        meshsim::workload::WorkloadSpec::Generated(w) => assert_eq!(w.arrival_rate_per_s, 12.0),
        other => panic!("{other:?}"),
    }
    // A value that is not one value per key names the axis and its line.
    let e = swept("\"hardware.nodes & workload.arrival_rate_per_s\" = [[1, 6.0], 2]").unwrap_err();
    assert!(e.to_string().contains("expected a list of 2 values"), "{e}");
    assert!(e.line_col.is_some(), "{e:?}");
    let e = swept("\"hardware.nodes & \" = [[1]]").unwrap_err();
    assert!(e.to_string().contains("found an empty one"), "{e}");
    // A bad value inside a tied axis names its own key and the point.
    let e = swept("\"hardware.nodes & workload.arrival_rate_per_s\" = [[1, 6.0], [2, -1.0]]")
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("workload.arrival_rate_per_s"), "{msg}");
    assert!(msg.contains("nodes=2 arrival_rate_per_s=-1.0"), "{msg}");
    // Repeating a pair repeats a label.
    let e = swept("\"hardware.nodes & workload.arrival_rate_per_s\" = [[1, 6.0], [1, 6.0]]")
        .unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
}
