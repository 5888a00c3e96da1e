//! The committed results of a bundled scenario are what the code produces now: re-running
//! `scenarios/polaris_8gpu.toml` gives its committed `summary.csv` byte for byte. When a
//! change to the model moves results on purpose, re-run the bundled scenarios
//! (`cargo run --release -- run scenarios/<name>.toml`) and commit `results/` with it.

use std::path::Path;
use std::sync::Arc;

use meshsim::Scenario;
use meshsim::serving::run::{simulate_all, trace, write_results};

#[test]
fn polaris_8gpu_reproduces_its_committed_summary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let s = Scenario::load(&root.join("scenarios/polaris_8gpu.toml")).unwrap();
    let runs = simulate_all(&s, Arc::new(trace(&s).unwrap()), 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("polaris_8gpu");
    write_results(&s, &runs, &out).unwrap();
    let now = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let committed = std::fs::read_to_string(root.join("results/polaris_8gpu/summary.csv"))
        .expect("results/polaris_8gpu/summary.csv is committed");
    assert!(
        now == committed,
        "summary.csv of polaris_8gpu changed; re-run the bundled scenarios and commit results/\n\
         now:\n{now}\ncommitted:\n{committed}"
    );
    let report = std::fs::read_to_string(root.join("results/polaris_8gpu/report.md")).unwrap();
    assert!(
        report.contains("ttft_cdf.png"),
        "the committed report embeds the plots"
    );
}

/// Every bundled pipeline scenario (simulated, with the committed profile where it uses one)
/// reproduces its committed `summary.csv` and `report.md`; the comparison with the committed
/// live run is made from those files.
#[test]
fn bundled_pipeline_scenarios_reproduce_their_committed_summaries() {
    use meshsim::pipeline::run::{simulate_all, write_results};
    use meshsim::pipeline::scenario::PipelineScenario;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in [
        "pipeline_small_2shard",
        "pipeline_small_2shard_concurrent",
        "pipeline_small_tps_sweep",
        "pipeline_mistral_4node",
    ] {
        let s = PipelineScenario::load(&root.join(format!("scenarios/{name}.toml"))).unwrap();
        let runs = simulate_all(&s, 2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(name);
        write_results(&s, &runs, &out).unwrap();
        for file in ["summary.csv", "report.md"] {
            let now = std::fs::read_to_string(out.join(file)).unwrap();
            let committed = std::fs::read_to_string(root.join(format!("results/{name}/{file}")))
                .unwrap_or_else(|e| panic!("results/{name}/{file}: {e}"));
            assert!(
                now == committed,
                "{file} of {name} changed; re-run the bundled scenarios and commit results/\n\
                 now:\n{now}\ncommitted:\n{committed}"
            );
        }
    }
}
