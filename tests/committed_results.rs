//! The committed results of every bundled scenario are what the code produces now: re-running
//! each `scenarios/<name>.toml` (simulated; pipeline scenarios with their committed profile)
//! gives its committed `results/<name>/summary.csv`, `summary.json` and `report.md` byte for byte, and the
//! `comparison.md` of a committed live run `results/<name>_live/` is what `meshsim compare`
//! makes of the two. When a change to the model moves results on purpose, re-run the bundled
//! scenarios (`cargo run --release -- run scenarios/<name>.toml`), regenerate the comparisons
//! (README, "Pipeline scenarios") and commit `results/` with it.
//!
//! The scenarios run on a pool of threads, one scenario per thread at a time, so the whole set
//! costs about the wall time of the slowest ones on a 2-core machine.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use meshsim::Experiment;

/// Bundled scenarios too large to simulate in a test build within CI's time: all of Polaris
/// (2,240 GPUs, 1,000,000 requests, 74 M events) takes minutes even in a release build. They
/// are reproduced by [`heavy_scenarios_reproduce_their_committed_results`], an ignored test
/// to run in release: `cargo test --release --test committed_results -- --ignored`.
const HEAVY: &[&str] = &["polaris_full"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `scenarios/*.toml`, by name (the file stem), sorted.
fn bundled_scenarios() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs `scenarios/<name>.toml` (its policies on `threads` threads) into a temporary `results/<name>/` and compares its
/// `summary.csv` and `report.md` with the committed ones; where a live run of the scenario is
/// committed, also regenerates its `comparison.md` by the command the README gives. `Err`
/// says what differs.
fn reproduce(name: &str, threads: usize) -> Result<(), String> {
    let file: PathBuf = root().join(format!("scenarios/{name}.toml"));
    let e = Experiment::load(&file).map_err(|e| format!("{name}: {e}"))?;
    assert_eq!(e.name(), name, "a bundled scenario is named after its file");
    assert!(!e.is_live(), "{name}: bundled scenarios are simulated");
    // Reproduction, not checking: every actor checks its invariants every 65,536 events rather
    // than every 1,024 (checks are read-only; other tests check them often).
    let opts = meshsim::serving::sim::RunOptions {
        check_every: Some(1 << 16),
        ..Default::default()
    };
    let runs = e
        .run_watched(threads, &opts)
        .map_err(|e| format!("{name}: {e}"))?;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("results")).unwrap();
    e.write(&runs, &tmp.path().join("results").join(name))
        .map_err(|e| format!("{name}: {e}"))?;
    let mut files = vec![
        format!("{name}/summary.csv"),
        format!("{name}/summary.json"),
        format!("{name}/report.md"),
    ];
    let live = format!("{name}_live");
    if root().join("results").join(&live).is_dir() {
        regenerate_comparison(tmp.path(), name)?;
        files.push(format!("{live}/comparison.md"));
    }
    for file in files {
        let now = std::fs::read_to_string(tmp.path().join("results").join(&file)).unwrap();
        let committed = std::fs::read_to_string(root().join("results").join(&file))
            .map_err(|e| format!("results/{file}: {e}"))?;
        if now != committed {
            return Err(format!(
                "results/{file} changed; re-run the bundled scenarios (and `meshsim compare` \
                 for live runs, see the README) and commit results/\n\
                 now:\n{now}\ncommitted:\n{committed}"
            ));
        }
    }
    Ok(())
}

/// Copies the committed live run `results/<name>_live/` next to the fresh simulated results
/// in `tmp/results/`, and runs there the README's command
/// `meshsim compare results/<name> results/<name>_live --out results/<name>_live/comparison.md`.
fn regenerate_comparison(tmp: &Path, name: &str) -> Result<(), String> {
    let live = format!("results/{name}_live");
    std::fs::create_dir(tmp.join(&live)).unwrap();
    for f in [
        ".meshsim-results",
        "requests.csv",
        "summary.csv",
        "scenario.toml",
        "comparison.md",
    ] {
        std::fs::copy(root().join(&live).join(f), tmp.join(&live).join(f))
            .map_err(|e| format!("{live}/{f}: {e}"))?;
    }
    let out = format!("{live}/comparison.md");
    let sim = format!("results/{name}");
    let o = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["compare", &sim, &live, "--out", &out])
        .current_dir(tmp)
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(format!(
            "meshsim compare {sim} {live}: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    // The comparison says which runs it compares.
    let md = std::fs::read_to_string(tmp.join(&out)).unwrap();
    let names = format!("simulated: `{sim}`; live: `{live}`.");
    if !md.contains(&names) {
        return Err(format!("{out} does not say `{names}`:\n{md}"));
    }
    Ok(())
}

#[test]
fn every_bundled_scenario_reproduces_its_committed_summary_report_and_comparison() {
    let names = bundled_scenarios();
    assert!(
        names.len() >= 18 && names.iter().any(|n| n == "polaris_8gpu"),
        "bundled scenarios not found: {names:?}"
    );
    // One scenario replays the SQuAD dev set with the Mistral tokenizer from ../shared.
    common::shared_datasets();
    let light: Vec<String> = names
        .iter()
        .filter(|n| !HEAVY.contains(&n.as_str()))
        .cloned()
        .collect();
    reproduce_all(light);
}

/// The scenarios of [`HEAVY`], in release: `cargo test --release --test committed_results --
/// --ignored` (about 4 minutes on 2 cores).
#[test]
#[ignore = "minutes of simulation: run in release with --ignored"]
fn heavy_scenarios_reproduce_their_committed_results() {
    let names = bundled_scenarios();
    for heavy in HEAVY {
        assert!(names.iter().any(|n| n == heavy), "{heavy} is bundled");
    }
    reproduce_all(HEAVY.iter().map(|s| s.to_string()).collect());
}

/// Reproduces `names` on a pool of threads (one scenario per thread at a time); panics with
/// every difference.
fn reproduce_all(names: Vec<String>) {
    let started = Instant::now();
    let queue = Mutex::new(names.clone());
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Fewer scenarios than threads: each one spreads its policies over the rest.
    let per = (threads / names.len().max(1)).max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads.min(names.len()) {
            scope.spawn(|| {
                while let Some(name) = queue.lock().unwrap().pop() {
                    let t = Instant::now();
                    let result = reproduce(&name, per);
                    eprintln!("{name}: {:.1} s", t.elapsed().as_secs_f64());
                    if let Err(e) = result {
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    eprintln!(
        "{} scenarios in {:.1} s on {threads} threads",
        names.len(),
        started.elapsed().as_secs_f64()
    );
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The report of a committed run embeds its plots, every bundled scenario has committed
/// results, and every committed live run belongs to a bundled scenario and has its comparison
/// (so none escapes the test above).
#[test]
fn every_bundled_scenario_has_committed_results_that_embed_the_plots() {
    let names = bundled_scenarios();
    for entry in std::fs::read_dir(root().join("results")).unwrap() {
        let dir = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(name) = dir.strip_suffix("_live") {
            assert!(names.iter().any(|n| n == name), "{dir} has no scenario");
            assert!(
                root()
                    .join("results")
                    .join(&dir)
                    .join("comparison.md")
                    .is_file(),
                "results/{dir}/comparison.md is committed"
            );
        }
    }
    for name in bundled_scenarios() {
        let report = std::fs::read_to_string(root().join(format!("results/{name}/report.md")))
            .unwrap_or_else(|e| panic!("results/{name}/report.md is committed: {e}"));
        assert!(report.contains("ttft_cdf.png"), "{name}: {report}");
        assert!(
            root().join(format!("results/{name}/summary.csv")).is_file(),
            "results/{name}/summary.csv is committed"
        );
    }
}
