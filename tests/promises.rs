//! The README's promises about limits and failures, checked on the command line:
//!
//! - a simulation that breaks a limit exits with status 1, naming the seed and a command that
//!   reproduces the failure (and that command does);
//! - a sweep has at most 256 points;
//! - a pipeline trace holds at most 2^26 prompt tokens;
//! - a live run loads at most 16 GiB of weights;
//! - a profile measured for another split of the model into shards is refused.
//!
//! Refusals exit with status 2 before anything is written. Each limit is also tried at its
//! bound, which is accepted, so that a test cannot pass by refusing everything.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn meshsim(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts exit status 2 with every one of `expected` in the message.
fn assert_refused(o: &Output, expected: &[&str]) {
    assert_eq!(
        o.status.code(),
        Some(2),
        "exit status; stderr: {}",
        stderr(o)
    );
    for e in expected {
        assert!(stderr(o).contains(e), "`{e}` not in: {}", stderr(o));
    }
}

fn assert_accepted(o: &Output) {
    assert!(o.status.success(), "refused: {}", stderr(o));
}

/// `text` with the line that starts with `key` replaced by `line` (which must exist).
fn edit(text: &str, key: &str, line: &str) -> String {
    assert!(
        text.lines().any(|l| l.starts_with(key)),
        "no line starts with `{key}`"
    );
    text.lines()
        .map(|l| if l.starts_with(key) { line } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// A bundled scenario's text, with a profile path made absolute so that the file can be
/// written anywhere.
fn bundled(name: &str) -> String {
    let text = std::fs::read_to_string(root().join(format!("scenarios/{name}.toml"))).unwrap();
    let profile = root().join("profiles/small_2shard_cpu.toml");
    text.replace(
        "\"../profiles/small_2shard_cpu.toml\"",
        &format!("{:?}", profile.display().to_string()),
    )
}

/// Writes `text` to `dir/name` and returns the file name.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    std::fs::write(dir.join(name), text).unwrap();
    PathBuf::from(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Exit status 1, the seed and the command that reproduces a failure.

/// Runs `file` (in `dir`) with seed 123, expects status 1 with `limit` in the message, the
/// seed and the command that reproduces it, no results; then runs that command and expects
/// the same failure.
fn fails_reproducibly(dir: &Path, file: &Path, limit: &str) {
    let o = meshsim(
        dir,
        &["run", s(file), "--seed", "123", "-q", "--out", "out"],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "exit status; stderr: {}",
        stderr(&o)
    );
    let err = stderr(&o);
    assert!(err.contains(limit), "{err}");
    assert!(err.contains("(seed 123)"), "{err}");
    let command = format!("meshsim run {} --seed 123", s(file));
    let line = err
        .lines()
        .find(|l| l.starts_with("reproduce with: "))
        .unwrap_or_else(|| panic!("no reproducing command in: {err}"));
    assert_eq!(line, format!("reproduce with: {command}"));
    assert!(!dir.join("out").exists(), "results were written");
    // The printed command fails again, in the same way.
    let args: Vec<&str> = command.split(' ').skip(1).collect();
    let again = meshsim(dir, &args);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    let first_line = |e: &str| {
        e.lines()
            .find(|l| l.starts_with("error:"))
            .map(str::to_string)
    };
    assert_eq!(first_line(&stderr(&again)), first_line(&err));
    assert!(first_line(&err).is_some(), "{err}");
}

#[test]
fn a_simulation_that_breaks_its_event_limit_exits_1_with_the_seed_and_a_reproducing_command() {
    let dir = tempfile::tempdir().unwrap();
    let small = std::fs::read_to_string(common::data("small.toml")).unwrap();
    let file = write(
        dir.path(),
        "small.toml",
        &format!("{small}\n[limits]\nmax_events = 1000\n"),
    );
    fails_reproducibly(dir.path(), &file, "event limit of 1000 events reached");
    // With room for the run, the same file succeeds.
    let file = write(
        dir.path(),
        "roomy.toml",
        &format!("{small}\n[limits]\nmax_events = 100000000\n"),
    );
    assert_accepted(&meshsim(
        dir.path(),
        &["run", s(&file), "-q", "--out", "ok"],
    ));
}

#[test]
fn a_pipeline_simulation_that_breaks_its_time_limit_exits_1_with_the_seed_and_a_reproducing_command()
 {
    let dir = tempfile::tempdir().unwrap();
    let text =
        bundled("pipeline_small_2shard").replace("max_wall_s = 600.0", "max_sim_time_s = 0.5");
    let file = write(dir.path(), "p.toml", &text);
    fails_reproducibly(dir.path(), &file, "simulated time limit");
}

// ---------------------------------------------------------------------------------------------
// At most 256 sweep points.

/// `tests/data/small.toml` sweeping `workload.requests` over `n` values.
fn sweep_of(n: usize) -> String {
    let base = std::fs::read_to_string(common::data("small.toml")).unwrap();
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    format!(
        "{base}\n[sweep]\n\"workload.requests\" = [{}]\n",
        values.join(", ")
    )
}

#[test]
fn a_sweep_of_257_points_is_refused_and_one_of_256_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "ok.toml", &sweep_of(256));
    let o = meshsim(dir.path(), &["check", s(&file)]);
    assert_accepted(&o);
    let file = write(dir.path(), "big.toml", &sweep_of(257));
    assert_refused(
        &meshsim(dir.path(), &["check", s(&file)]),
        &["big.toml", "257 points; at most 256 are allowed"],
    );
    assert_refused(
        &meshsim(dir.path(), &["run", s(&file), "-q", "--out", "out"]),
        &["257 points; at most 256 are allowed"],
    );
    assert!(!dir.path().join("out").exists());
}

// ---------------------------------------------------------------------------------------------
// At most 2^26 prompt tokens in a pipeline trace.

/// A pipeline scenario of the tiny model (4 shards of one layer) with `requests` prompts of
/// 65,536 tokens.
fn long_trace(requests: u32) -> String {
    let text = edit(
        &bundled("pipeline_mistral_4node"),
        "model =",
        "model = \"tiny\"",
    );
    let text = edit(&text, "requests =", &format!("requests = {requests}"));
    let text = edit(&text, "prompt_tokens =", "prompt_tokens = 65536");
    // The restart is injected into request 10, which must exist.
    edit(&text, "request =", "request = 0")
}

#[test]
fn a_pipeline_trace_of_more_than_2_to_the_26_prompt_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // 1,024 x 65,536 = 2^26 tokens: accepted.
    let file = write(dir.path(), "ok.toml", &long_trace(1024));
    assert_accepted(&meshsim(dir.path(), &["check", s(&file)]));
    let file = write(dir.path(), "big.toml", &long_trace(1025));
    for args in [
        vec!["check", s(&file)],
        vec!["run", s(&file), "-q", "--out", "out"],
    ] {
        assert_refused(
            &meshsim(dir.path(), &args),
            &[
                "big.toml",
                "workload.requests",
                "1025 requests of 65536 prompt tokens exceed the 67108864 prompt tokens",
            ],
        );
    }
    assert!(!dir.path().join("out").exists());
}

// ---------------------------------------------------------------------------------------------
// At most 16 GiB of weights in a live run.

#[test]
fn a_live_run_of_a_model_with_more_than_16_gib_of_weights_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Mistral-7B in f32: 7.2 G parameters, 27 GiB.
    let text = edit(
        &bundled("pipeline_mistral_4node"),
        "dtype =",
        "dtype = \"f32\"",
    );
    let file = write(dir.path(), "mistral.toml", &text);
    let expected = [
        "mistral.toml",
        "pipeline.model",
        "mistral-7b-instruct-v0.2 has 27.0 GiB of f32 weights; live runs load at most 16 GiB",
    ];
    assert_refused(
        &meshsim(
            dir.path(),
            &["run", s(&file), "--live", "-q", "--out", "out"],
        ),
        &expected,
    );
    // The same file simulated is fine: the limit is the live host's.
    assert_accepted(&meshsim(dir.path(), &["check", s(&file)]));
    // `mode = "live"` in the file is refused alike.
    let file = write(dir.path(), "live.toml", &format!("mode = \"live\"\n{text}"));
    assert_refused(
        &meshsim(dir.path(), &["run", s(&file), "-q", "--out", "out"]),
        &["pipeline.model", "live runs load at most 16 GiB"],
    );
    assert!(!dir.path().join("out").exists());
}

// ---------------------------------------------------------------------------------------------
// A profile belongs to one model and one split into shards.

#[test]
fn a_profile_measured_for_another_shard_split_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = bundled("pipeline_small_2shard");
    // The split the profile was measured for.
    let file = write(dir.path(), "two.toml", &text);
    assert_accepted(&meshsim(dir.path(), &["check", s(&file)]));
    for (name, split) in [
        ("four.toml", "shards = 4"),
        ("uneven.toml", "layers = [[0, 3], [3, 8]]"),
    ] {
        let file = write(dir.path(), name, &edit(&text, "shards =", split));
        for args in [
            vec!["check", s(&file)],
            vec!["run", s(&file), "-q", "--out", "out"],
        ] {
            assert_refused(
                &meshsim(dir.path(), &args),
                &[
                    name,
                    "pipeline.profile",
                    "measures shards [0..4, 4..8], but the scenario splits the model into",
                    "meshsim profile --shards N",
                ],
            );
        }
    }
    // A profile of another model is refused too.
    let file = write(
        dir.path(),
        "tiny.toml",
        &edit(&text, "model =", "model = \"tiny\""),
    );
    assert_refused(
        &meshsim(dir.path(), &["check", s(&file)]),
        &["pipeline.profile", "measures model"],
    );
    assert!(!dir.path().join("out").exists());
}
