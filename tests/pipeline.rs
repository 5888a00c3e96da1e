//! Pipeline routes run live, end to end, and through the CLI: the live host generates exactly
//! the tokens of the in-process candle route (with several sessions at once and across a
//! restarted shard) and as many per request as the simulator; the CLI runs pipeline scenarios
//! live, rejects bad ones with status 2, naming the key, without writing anything, and
//! `meshsim compare` reads the sweep labels a run writes. The simulator is tested in
//! `tests/pipeline_sim.rs`.

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use common::pipeline::{
    Spec, assert_all_complete, assert_misses_consistent, max_concurrency, meshsim, path_str,
    preemptions, stderr, tempdir,
};
use meshsim::backend::CandleBackend;
use meshsim::exec::WeightSource;
use meshsim::pipeline::build::trace;
use meshsim::pipeline::live::live;
use meshsim::pipeline::outcome::PipelineRun;
use meshsim::pipeline::scenario::{PipelineScenario, mode_name};
use meshsim::pipeline::shard::{CacheLimits, DecodeMode, Route, SessionId, Shard};
use meshsim::pipeline::sim::simulate_all;
use meshsim::units::Nanos;

// ---------------------------------------------------------------------------------------------
// Live host
// ---------------------------------------------------------------------------------------------

/// The in-process candle route of `s` (CPU, f32, the scenario's seeded weights).
fn candle_route(s: &PipelineScenario) -> Route {
    let shards = s
        .layers
        .iter()
        .map(|l| {
            let b = CandleBackend::load(
                &s.model,
                l.clone(),
                &WeightSource::Seeded(s.seed),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
            Shard::new(Box::new(b), CacheLimits::default())
        })
        .collect();
    Route::new(shards).unwrap()
}

/// What the undisturbed route generates for every request of `s` in `mode`.
fn reference(s: &PipelineScenario, mode: DecodeMode) -> Vec<(u32, Vec<u32>)> {
    let mut route = candle_route(s);
    trace(s)
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let g = route
                .generate(
                    Nanos::ZERO,
                    SessionId(i as u64),
                    r.prompt,
                    r.output_tokens as usize,
                    mode,
                )
                .unwrap();
            assert_eq!(g.cache_misses, 0);
            (i as u32, g.output().to_vec())
        })
        .collect()
}

async fn live_run(s: &PipelineScenario, mode: DecodeMode) -> PipelineRun {
    let r = live(s, mode)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", mode_name(mode)));
    assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tokens_equal_the_in_process_route_with_three_sessions_at_once() {
    let spec = Spec {
        restarts: vec![],
        rate: 1e5,
        ..Spec::tiny()
    };
    let s = spec.scenario();
    for mode in [DecodeMode::Cached, DecodeMode::Stateless] {
        let want = reference(&s, mode);
        let r = live_run(&s, mode).await;
        assert_all_complete(&r, spec.requests, spec.output);
        assert_eq!(r.report.outputs, want, "{}", mode_name(mode));
        assert_eq!(r.summary.preemptions, 0, "{}", mode_name(mode));
        let c = max_concurrency(&r.report.records);
        assert!(
            (2..=3).contains(&c),
            "{}: {c} sessions at once: {:?}",
            mode_name(mode),
            r.report.records
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_restart_re_prefills_and_leaves_the_tokens_unchanged() {
    let spec = Spec::tiny();
    let s = spec.scenario();
    let want = reference(&s, DecodeMode::Cached);
    let r = live_run(&s, DecodeMode::Cached).await;
    assert_all_complete(&r, spec.requests, spec.output);
    assert_eq!(r.report.outputs, want);
    assert!(r.summary.preemptions >= 1, "{:?}", r.summary);
    assert!(
        r.report.records[0].preemptions >= 1,
        "{:?}",
        r.report.records[0]
    );
    assert!(r.report.instances[1].preemptions >= 1);
    assert_misses_consistent(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_decode_steps_that_all_miss_still_give_the_route_tokens() {
    // A TTL far below a step: every decode step of every session misses at a shard, and the
    // head re-prefills; the tokens must not change.
    let spec = Spec {
        restarts: vec![],
        ttl_s: 1e-6,
        requests: 3,
        output: 8,
        rate: 1e3,
        policies: r#"["cached"]"#,
        ..Spec::tiny()
    };
    let s = spec.scenario();
    let want = reference(&s, DecodeMode::Cached);
    let r = live_run(&s, DecodeMode::Cached).await;
    assert_all_complete(&r, spec.requests, spec.output);
    assert_eq!(r.report.outputs, want);
    assert_eq!(preemptions(&r.report.records), [spec.output - 1; 3]);
    assert_misses_consistent(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_and_live_hosts_generate_as_many_tokens_per_request() {
    let spec = Spec::tiny();
    let s = spec.scenario();
    let sims = simulate_all(&s, 1).unwrap();
    let lives = meshsim::pipeline::live::live_all(&s).await.unwrap();
    assert_eq!(sims.len(), 2);
    assert_eq!(lives.len(), 2);
    for (a, b) in sims.iter().zip(&lives) {
        let m = mode_name(a.mode);
        assert_eq!(a.mode, b.mode);
        assert_eq!(a.summary.policy, b.summary.policy);
        assert_eq!(a.report.records.len(), b.report.records.len(), "{m}");
        assert_eq!(a.summary.completed, b.summary.completed, "{m}");
        let lens = |r: &PipelineRun| -> Vec<(u32, usize)> {
            r.report
                .outputs
                .iter()
                .map(|(i, t)| (*i, t.len()))
                .collect()
        };
        assert_eq!(lens(a), lens(b), "{m}");
        for (x, y) in a.report.records.iter().zip(&b.report.records) {
            assert_eq!(
                (x.id, x.prompt_tokens, x.output_tokens, x.rejected),
                (y.id, y.prompt_tokens, y.output_tokens, y.rejected),
                "{m}"
            );
        }
        assert!(
            a.report
                .outputs
                .iter()
                .all(|(_, t)| t.iter().all(|&x| x == 0))
        );
    }
}

// ---------------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------------

/// Replaces the one line that starts with `from` (after trimming) by `to`.
fn edit(text: &str, from: &str, to: &str) -> String {
    let n = text
        .lines()
        .filter(|l| l.trim_start().starts_with(from))
        .count();
    assert_eq!(n, 1, "{from:?} must occur once in\n{text}");
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with(from) {
                to
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Runs `args` with FILE replaced by `file`, and checks the bad-input contract.
fn assert_rejected(args: &[&str], file: &Path, out: &Path, needles: &[&str]) {
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "FILE" { path_str(file) } else { a })
        .collect();
    let o = meshsim(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(err.contains(name), "{args:?}: names the file: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: names {n:?}: {err}");
    }
    assert!(!out.exists(), "{args:?}: wrote {}", out.display());
    let parent = out.parent().unwrap();
    let leftovers: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "toml"))
        .collect();
    assert!(leftovers.is_empty(), "{args:?}: left {leftovers:?}");
}

#[test]
fn bad_pipeline_scenarios_exit_2_naming_the_key_and_write_nothing() {
    let good = Spec::tiny().text();
    let without_gpu = {
        let start = good.find("[pipeline.gpu]").unwrap();
        let end = good.find("[pipeline.link]").unwrap();
        format!("{}{}", &good[..start], &good[end..])
    };
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "model",
            edit(&good, "model =", "model = \"gpt-5\""),
            vec!["pipeline.model", "gpt-5"],
        ),
        (
            "zero_shards",
            edit(&good, "shards =", "shards = 0"),
            vec!["pipeline.shards", "found 0"],
        ),
        (
            "too_many_shards",
            edit(&good, "shards =", "shards = 5"),
            vec!["pipeline.shards", "found 5"],
        ),
        (
            "shards_and_layers",
            edit(&good, "shards =", "shards = 2\nlayers = [[0, 2], [2, 4]]"),
            vec!["pipeline", "`shards`", "`layers`"],
        ),
        (
            "gap",
            edit(&good, "shards =", "layers = [[0, 2], [3, 4]]"),
            vec!["pipeline.layers[1]", "[3, 4]"],
        ),
        (
            "short",
            edit(&good, "shards =", "layers = [[0, 2], [2, 3]]"),
            vec!["pipeline.layers", "0..4"],
        ),
        ("no_gpu", without_gpu, vec!["pipeline.gpu"]),
        (
            "restart_shard",
            edit(&good, "shard = 1", "shard = 2"),
            vec!["pipeline.restart[0].shard", "found 2"],
        ),
        (
            "restart_after",
            edit(&good, "after_tokens", "after_tokens = 16"),
            vec!["pipeline.restart[0].after_tokens", "found 16"],
        ),
        (
            "output",
            edit(&good, "output_tokens", "output_tokens = 0"),
            vec!["workload.output_tokens", "found 0"],
        ),
        (
            "unknown_key",
            edit(&good, "max_sessions", "max_sessions = 16\nmax_sesions = 4"),
            vec!["pipeline", "max_sesions"],
        ),
        (
            "zero_sessions",
            edit(&good, "max_active_sessions", "max_active_sessions = 0"),
            vec!["pipeline.max_active_sessions"],
        ),
    ];
    // The unedited scenario is valid, so the rejections below come from the edits.
    let dir = tempdir();
    let file = dir.path().join("good.toml");
    std::fs::write(&file, &good).unwrap();
    let o = meshsim(&["check", path_str(&file)]);
    assert!(o.status.success(), "{}", stderr(&o));

    for (name, text, needles) in &cases {
        let dir = tempdir();
        let file = dir.path().join(format!("bad_{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = dir.path().join("out");
        let o = path_str(&out);
        for args in [
            vec!["run", "FILE", "--out", o],
            vec!["run", "FILE", "--live", "--out", o],
            vec!["check", "FILE"],
        ] {
            assert_rejected(&args, &file, &out, needles);
        }
    }

    // Limits that only a live run has: f32, and sequences short enough to attend over.
    let live_only: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "bf16",
            edit(&good, "cost =", "cost = \"analytic\"\ndtype = \"bf16\""),
            vec!["pipeline.dtype", "f32"],
        ),
        (
            "long",
            edit(&good, "prompt_tokens", "prompt_tokens = 8190"),
            vec!["workload.output_tokens", "8192"],
        ),
    ];
    for (name, text, needles) in &live_only {
        let dir = tempdir();
        let file = dir.path().join(format!("live_{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let o = meshsim(&["check", path_str(&file)]);
        assert!(
            o.status.success(),
            "{name}: a simulation may: {}",
            stderr(&o)
        );
        let out = dir.path().join("out");
        let args = ["run", "FILE", "--live", "--out", path_str(&out)];
        assert_rejected(&args, &file, &out, needles);
        // The same file with mode = "live" is refused by `check` too.
        let live = format!("mode = \"live\"\n{text}");
        std::fs::write(&file, live).unwrap();
        assert_rejected(&["check", "FILE"], &file, &out, needles);
    }

    // A wall-clock limit beyond a week is a unit mistake, not a panic.
    let dir = tempdir();
    let file = dir.path().join("bad_wall.toml");
    std::fs::write(&file, format!("{good}\n[limits]\nmax_wall_s = 1e20\n")).unwrap();
    let out = dir.path().join("out");
    assert_rejected(&["check", "FILE"], &file, &out, &["limits.max_wall_s"]);

    // --live runs serving scenarios too, but only what candle computes: f32.
    let polaris = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/polaris_8gpu.toml");
    let dir = tempdir();
    let out = dir.path().join("out");
    assert_rejected(
        &["run", "FILE", "--live", "--out", path_str(&out)],
        &polaris,
        &out,
        &["model.dtype", "f32"],
    );
}

/// `meshsim compare` reads what `meshsim run` writes, quoted sweep labels with commas included;
/// a run compared with itself has no error.
#[test]
fn compare_reads_sweep_labels_with_commas() {
    let spec = Spec::tiny();
    let text = edit(&spec.text(), "shards =", "layers = [[0, 2], [2, 4]]")
        + "\n[sweep]\n\"pipeline.layers\" = [[[0, 2], [2, 4]], [[0, 1], [1, 4]]]\n";
    let dir = tempdir();
    let file = dir.path().join("sweep.toml");
    std::fs::write(&file, text).unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for out in [&a, &b] {
        let o = meshsim(&["run", path_str(&file), "-q", "--out", path_str(out)]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = meshsim(&["compare", path_str(&a), path_str(&b)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let md = String::from_utf8(o.stdout).unwrap();
    assert!(md.contains("| layers=[[0, 2], [2, 4]] | cached |"), "{md}");
    assert!(
        md.contains("| layers=[[0, 1], [1, 4]] | stateless |"),
        "{md}"
    );
    // The first table (the throughput table below it has rows per point too).
    let md = md.split("Throughput").next().unwrap().to_string();
    let rows = md.lines().filter(|l| l.starts_with("| layers=")).count();
    assert_eq!(rows, 4, "{md}");
    for l in md.lines().filter(|l| l.starts_with("| layers=")) {
        assert_eq!(
            l.matches("+0.0%").count(),
            3,
            "no error against itself: {l}"
        );
    }
    assert!(!md.contains("Warning"), "{md}");
    // Folders of different scenarios are compared with a warning.
    let other = dir.path().join("other.toml");
    std::fs::write(
        &other,
        edit(
            &std::fs::read_to_string(&file).unwrap(),
            "seed =",
            "seed = 4",
        ),
    )
    .unwrap();
    let c = dir.path().join("c");
    let o = meshsim(&["run", path_str(&other), "-q", "--out", path_str(&c)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = meshsim(&["compare", path_str(&a), path_str(&c)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8(o.stdout).unwrap().contains("Warning"));
    // A folder without requests.csv is bad input.
    let o = meshsim(&["compare", path_str(&a), path_str(dir.path())]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("requests.csv"), "{}", stderr(&o));
}

#[test]
fn the_cli_runs_a_pipeline_scenario_live_into_its_out_folder() {
    let spec = Spec::tiny();
    let dir = tempdir();
    let file = dir.path().join("tiny.toml");
    std::fs::write(&file, spec.text()).unwrap();
    let out = dir.path().join("live");
    let o = meshsim(&[
        "run",
        path_str(&file),
        "--live",
        "--quiet",
        "--out",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 12, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |n: &str| header.iter().position(|h| *h == n).unwrap();
    let (policy, status, output) = (col("policy"), col("status"), col("output_tokens"));
    let mut per_mode = std::collections::BTreeMap::new();
    for l in &lines[1..] {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f[status], "ok", "{l}");
        assert_eq!(f[output], "16", "{l}");
        *per_mode.entry(f[policy].to_string()).or_insert(0) += 1;
    }
    assert_eq!(
        per_mode.into_iter().collect::<Vec<_>>(),
        [("cached".to_string(), 6), ("stateless".to_string(), 6)]
    );
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 3, "{summary}");
    // The input, marked as run live, so that the folder says how it was made.
    let copy = std::fs::read_to_string(out.join("scenario.toml")).unwrap();
    let (first, rest) = copy.split_once('\n').unwrap();
    assert!(first.starts_with("mode = \"live\""), "{copy}");
    assert_eq!(rest, spec.text());
}
