//! Bad scenarios are rejected before anything runs: exit status 2, a message naming the file,
//! the key path and what was expected, and nothing written under the results folder.

mod common;

use std::path::Path;
use std::process::Command;

struct Outcome {
    status: i32,
    stderr: String,
}

/// Writes `text` as `bad.toml` in a fresh folder, runs `meshsim <cmd> bad.toml` there, and
/// checks that no `results` folder appeared.
fn meshsim(cmd: &str, text: &str) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.toml"), text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args([cmd, "bad.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        !dir.path().join("results").exists(),
        "a rejected scenario must not touch results/"
    );
    Outcome {
        status: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn small_text() -> String {
    std::fs::read_to_string(common::data("small.toml")).unwrap()
}

/// Replaces the first line of the small scenario that starts with `key =`.
fn with_line(key: &str, line: &str) -> String {
    let text = small_text();
    let mut found = false;
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if !found && l.starts_with(&format!("{key} =")) {
                found = true;
                line.to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(found, "{key} must occur in small.toml");
    out.join("\n")
}

/// The 1-based line of the first line that starts with `key =`.
fn line_of(key: &str) -> usize {
    1 + small_text()
        .lines()
        .position(|l| l.starts_with(&format!("{key} =")))
        .unwrap()
}

fn assert_rejected(text: &str, key_path: &str, expected: &str) {
    for cmd in ["run", "check"] {
        let o = meshsim(cmd, text);
        assert_eq!(o.status, 2, "{cmd}: exit status; stderr: {}", o.stderr);
        assert!(
            o.stderr.contains("bad.toml"),
            "{cmd}: names the file: {}",
            o.stderr
        );
        assert!(
            o.stderr.contains(key_path),
            "{cmd}: names {key_path}: {}",
            o.stderr
        );
        assert!(
            o.stderr.contains(expected),
            "{cmd}: says {expected:?}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
}

#[test]
fn the_small_scenario_itself_is_valid() {
    let o = meshsim("check", &small_text());
    assert_eq!(o.status, 0, "{}", o.stderr);
}

#[test]
fn a_syntax_error_is_reported_with_its_line() {
    let text = with_line("nodes", "nodes = = 2");
    let o = meshsim("run", &text);
    assert_eq!(o.status, 2);
    let at = format!("bad.toml:{}:", line_of("nodes"));
    assert!(o.stderr.contains(&at), "{}", o.stderr);
}

#[test]
fn an_unknown_key_is_rejected() {
    let text = with_line("memory_gib", "memory_gib = 40.0\ncolour = \"green\"");
    assert_rejected(&text, "hardware.gpu", "unknown field `colour`");
}

#[test]
fn a_key_with_the_wrong_unit_is_rejected() {
    let text = with_line("memory_gib", "memory_gb = 40.0");
    assert_rejected(
        &text,
        "hardware.gpu",
        "unknown field `memory_gb`, expected one of",
    );
}

#[test]
fn a_value_of_the_wrong_type_is_rejected() {
    let text = with_line("memory_gib", "memory_gib = \"40GB\"");
    assert_rejected(
        &text,
        "hardware.gpu.memory_gib",
        "invalid type: string \"40GB\", expected f64",
    );
}

#[test]
fn a_zero_capacity_is_rejected() {
    let text = with_line("capacity_gb_per_drive", "capacity_gb_per_drive = 0.0");
    assert_rejected(
        &text,
        "hardware.ssd.capacity_gb_per_drive",
        "expected a positive number",
    );
}

#[test]
fn a_negative_capacity_is_rejected() {
    let text = with_line("memory_gib", "memory_gib = -40.0");
    assert_rejected(
        &text,
        "hardware.gpu.memory_gib",
        "expected a positive number",
    );
    let text = with_line("drives", "drives = -2");
    assert_rejected(&text, "hardware.ssd.drives", "expected u32");
}

#[test]
fn a_zero_count_is_rejected() {
    let text = with_line("nodes", "nodes = 0");
    assert_rejected(&text, "hardware.nodes", "expected an integer from 1 to");
}

#[test]
fn a_model_that_does_not_fit_in_gpu_memory_is_rejected() {
    let text = with_line("memory_gib", "memory_gib = 16.0");
    assert_rejected(&text, "model.preset", "does not fit");
}

#[test]
fn an_unknown_policy_is_rejected() {
    let text = with_line("policies", "policies = [\"vanilla\", \"magic\"]");
    assert_rejected(&text, "policies", "unknown policy \"magic\"");
}

#[test]
fn a_missing_section_is_rejected() {
    let text = small_text().replace("[model]\npreset = \"mistral-7b-instruct-v0.2\"\n", "");
    assert_rejected(&text, "", "missing field `model`");
}

#[test]
fn a_missing_file_is_bad_input() {
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["run", "no/such/file.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/file.toml"));
}

#[test]
fn a_good_run_writes_the_three_files_and_out_redirects_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["run", common::data("small.toml").to_str().unwrap(), "--out"])
        .arg(dir.path().join("here"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["requests.csv", "summary.csv", "scenario.toml"] {
        assert!(Path::new(&dir.path().join("here").join(f)).exists(), "{f}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("events processed"), "{stdout}");
    assert!(stdout.contains("events/s"), "{stdout}");
    assert!(stdout.contains("wall time"), "{stdout}");
}

#[test]
fn absurd_latencies_and_block_counts_are_rejected_not_overflowed() {
    let text = with_line("nic_latency_ns", "nic_latency_ns = 6000000000000000000");
    assert_rejected(&text, "hardware.network.nic_latency_ns", "expected at most");
    let text = with_line("memory_gib", "memory_gib = 100000.0");
    assert_rejected(&text, "serving.block_size_tokens", "use larger blocks");
    let text = with_line(
        "router",
        "router = \"least-loaded\"\nmemory_reserve_gib = 1e10\ntensor_parallel = 2",
    );
    assert_rejected(&text, "model.preset", "does not fit");
}

#[test]
fn an_unknown_load_overlap_is_rejected_with_the_modes_it_takes() {
    let text = format!("{}\n[store]\nload_overlap = \"sideways\"\n", small_text());
    assert_rejected(
        &text,
        "store.load_overlap",
        "unknown variant `sideways`, expected `none` or `layerwise`",
    );
}

#[test]
fn a_layerwise_load_overlap_is_accepted() {
    let text = format!("{}\n[store]\nload_overlap = \"layerwise\"\n", small_text());
    let o = meshsim("check", &text);
    assert_eq!(o.status, 0, "{}", o.stderr);
}

#[test]
fn link_efficiencies_outside_zero_to_one_are_rejected_with_their_key() {
    for (table, key) in [
        ("[hardware.pcie]", "hardware.pcie.efficiency"),
        ("[hardware.nvlink]", "hardware.nvlink.efficiency"),
        ("[hardware.host]", "hardware.host.memory_efficiency"),
        ("[hardware.ssd]", "hardware.ssd.efficiency"),
        ("[hardware.network]", "hardware.network.nic_efficiency"),
    ] {
        let field = key.rsplit('.').next().unwrap();
        for v in ["nan", "0.0", "1.5", "-1.0", "inf"] {
            let text = small_text().replace(table, &format!("{table}\n{field} = {v}"));
            assert_rejected(&text, key, "expected a fraction in (0, 1]");
        }
    }
}

#[test]
fn a_read_lease_must_be_finite_non_negative_and_at_most_an_hour() {
    for (v, why) in [
        ("-5.0", "expected zero or a positive number"),
        ("nan", "expected zero or a positive number"),
        ("1e9", "expected at most an hour"),
    ] {
        let text = format!("{}\n[store]\nread_lease_ms = {v}\n", small_text());
        assert_rejected(&text, "store.read_lease_ms", why);
    }
}

#[test]
fn router_keys_out_of_range_and_unknown_routers_are_rejected_with_their_key() {
    let text = small_text().replace("router = \"least-loaded\"", "router = \"kv-events\"");
    let why = "unknown variant `kv-events`, expected one of `round-robin`, `least-loaded`, \
               `kv-aware`, `kv-approx`";
    assert_rejected(&text, "serving.router", why);
    let in_serving = |line: &str| small_text().replace("[serving]", &format!("[serving]\n{line}"));
    let (credit, ms) = ("from 0 to 1", "a number of milliseconds from 0 to 3600000");
    for (key, bad, why) in [
        (
            "kv_overlap_weight",
            ["-1.0", "nan", "inf", "1e7"],
            "from 0 to 1e6",
        ),
        ("kv_host_credit", ["-0.5", "nan", "inf", "1.5"], credit),
        ("kv_disk_credit", ["-0.5", "nan", "inf", "1.5"], credit),
        ("kv_event_interval_ms", ["-1.0", "nan", "inf", "1e9"], ms),
    ] {
        for v in bad {
            let text = in_serving(&format!("{key} = {v}"));
            assert_rejected(&text, &format!("serving.{key}"), why);
        }
    }
    for router in ["kv-aware", "kv-approx"] {
        let line = format!("router = \"{router}\"\nkv_host_credit = 0\nkv_event_interval_ms = 5");
        let text = small_text().replace("router = \"least-loaded\"", &line);
        assert_eq!(meshsim("check", &text).status, 0);
    }
}

/// `small.toml` with a `[workload.reuse]` table of `lines`.
fn with_reuse(lines: &str) -> String {
    format!("{}\n[workload.reuse]\n{lines}\n", small_text())
}

#[test]
fn reuse_knobs_out_of_range_are_rejected_with_their_key() {
    for (lines, key, why) in [
        (
            "popularity = \"zipf\"",
            "workload.reuse",
            "missing field `contexts`",
        ),
        (
            "contexts = 0",
            "workload.reuse.contexts",
            "expected an integer from 1 to",
        ),
        (
            "contexts = 2000000",
            "workload.reuse.contexts",
            "expected an integer from 1 to",
        ),
        (
            "contexts = 10\npopularity = \"zipf\"",
            "workload.reuse",
            "missing field `zipf_alpha`",
        ),
        (
            "contexts = 10\nzipf_alpha = 1.0",
            "workload.reuse.zipf_alpha",
            "only used with popularity = \"zipf\"",
        ),
        (
            "contexts = 10\npopularity = \"zipf\"\nzipf_alpha = nan",
            "workload.reuse.zipf_alpha",
            "expected zero or a positive number",
        ),
        (
            "contexts = 10\npopularity = \"zipf\"\nzipf_alpha = 11.0",
            "workload.reuse.zipf_alpha",
            "expected at most 10",
        ),
        (
            "contexts = 10\npopularity = \"pareto\"",
            "workload.reuse.popularity",
            "unknown variant",
        ),
        (
            "contexts = 10\nreuse_distance = -1.0",
            "workload.reuse.reuse_distance",
            "expected zero or a positive number",
        ),
        (
            "contexts = 10\nreuse_distance = inf",
            "workload.reuse.reuse_distance",
            "expected zero or a positive number",
        ),
        (
            "contexts = 10\nturns = 0",
            "workload.reuse.turns",
            "expected an integer from 1 to 256",
        ),
        (
            "contexts = 10\nturn_gap_s = 1e9",
            "workload.reuse.turn_gap_s",
            "expected at most 86400 s",
        ),
        (
            "contexts = 10\nquestions_per_context = 0",
            "workload.reuse.questions_per_context",
            "expected an integer from 1 to",
        ),
        (
            "contexts = 10\nhot = true",
            "workload.reuse",
            "unknown field `hot`",
        ),
    ] {
        assert_rejected(&with_reuse(lines), key, why);
    }
}

#[test]
fn reuse_decides_the_order_so_order_is_refused_with_it() {
    let text = with_reuse("contexts = 10").replace(
        "context = \"window\"",
        "context = \"window\"\norder = \"grouped\"",
    );
    assert_rejected(&text, "workload.order", "not used with [workload.reuse]");
}

#[test]
fn turns_whose_prompts_outgrow_the_model_context_are_refused() {
    // 2k-token windows plus 256 turns of questions and answers of up to 64 tokens each: more
    // than Mistral-7B's 32k context.
    assert_rejected(
        &with_reuse("contexts = 10\nturns = 256"),
        "workload.reuse.turns",
        "do not fit in the context of",
    );
    let o = meshsim(
        "check",
        &with_reuse(
            "contexts = 10\nturns = 4\npopularity = \"zipf\"\nzipf_alpha = 0.9\nreuse_distance = 3.0",
        ),
    );
    assert_eq!(o.status, 0, "{}", o.stderr);
}

#[test]
fn arrivals_beyond_the_time_limit_are_refused_before_anything_runs() {
    // 400 requests at 12 per second arrive over about 33 s.
    let text = format!("{}\n[limits]\nmax_sim_time_s = 20.0\n", small_text());
    assert_rejected(
        &text,
        "workload.arrival_rate_per_s",
        "beyond limits.max_sim_time_s = 20",
    );
    let text = format!("{}\n[limits]\nmax_sim_time_s = 60.0\n", small_text());
    assert_eq!(meshsim("check", &text).status, 0);
}

/// The small scenario with `mode = "live"` and the lines `extra` after `[serving]`.
fn live_text(extra: &str) -> String {
    format!("mode = \"live\"\n{}", small_text())
        .replace("[serving]\n", &format!("[serving]\n{extra}"))
}

#[test]
fn live_runs_refuse_what_candle_cannot_compute_before_any_work() {
    // The small scenario is Mistral-7B in bf16 on A100s: live runs compute in f32.
    assert_rejected(&live_text(""), "model.dtype", "f32");
    let f32 = live_text("").replace(
        "preset = \"mistral-7b-instruct-v0.2\"",
        "preset = \"mistral-7b-instruct-v0.2\"\ndtype = \"f32\"",
    );
    // f32 weights of Mistral-7B plus 32 A100s' K/V memory: far beyond what a live run holds.
    assert_rejected(
        &f32,
        "hardware.gpu.memory_gib",
        "live runs hold at most 16 GiB",
    );
    let unknown = small_text().replace(
        "preset = \"mistral-7b-instruct-v0.2\"",
        "preset = \"mistral-7b-instruct-v0.2\"\ndtype = \"f64\"",
    );
    assert_rejected(&unknown, "model.dtype", "unknown element type \"f64\"");
    let mode = format!("mode = \"turbo\"\n{}", small_text());
    assert_rejected(&mode, "mode", "turbo");
}

#[test]
fn serving_profiles_and_wall_limits_are_checked() {
    assert_rejected(
        &live_text("profile = \"nowhere.toml\"\n"),
        "serving.profile",
        "nowhere.toml",
    );
    let text = format!("{}\n[limits]\nmax_wall_s = 1e20\n", small_text());
    if small_text().contains("[limits]") {
        let t = small_text().replace("[limits]\n", "[limits]\nmax_wall_s = 1e20\n");
        assert_rejected(&t, "limits.max_wall_s", "more than a week");
    } else {
        assert_rejected(&text, "limits.max_wall_s", "more than a week");
    }
}

/// A live serving run of a trace whose token ids its model cannot embed: a Mooncake trace
/// (pseudo tokens of a 32,000-id vocabulary) on `tiny` (1,024 ids).
#[test]
fn a_live_run_refuses_token_ids_beyond_its_models_vocabulary_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        r#"{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}"#,
        r#"{"timestamp": 10, "input_length": 300, "output_length": 4, "hash_ids": [1]}"#,
    ];
    std::fs::write(dir.path().join("t.jsonl"), lines.join("\n") + "\n").unwrap();
    let serving = r#"[serving]
block_size_tokens = 16
max_num_seqs = 4
max_batched_tokens = 512
memory_reserve_gib = 0.1
[workload]
source = "mooncake-jsonl"
path = "t.jsonl"
[store]
tensor_tokens = 32
host_capacity_gib = 0.001
ssd_capacity_gb = 0.002
"#;
    let text = [
        "name = \"vocab\"\nseed = 1\npolicies = [\"vanilla\"]\nmode = \"live\"\n",
        &common::LIVE_TINY_2X2.replace("preset = \"tiny-32k\"", "preset = \"tiny\""),
        serving,
    ]
    .concat();
    std::fs::write(dir.path().join("v.toml"), &text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["run", "v.toml", "--out", "out"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("1024-id") && stderr.contains("tiny embeds ids below 1024"),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists(), "nothing written");
    // The same trace on tiny-32k is served.
    let ok = text.replace("preset = \"tiny\"", "preset = \"tiny-32k\"");
    std::fs::write(dir.path().join("v.toml"), ok).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["run", "v.toml", "--out", "out", "-q"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(dir.path().join("out/summary.csv").is_file());
}

/// A device given where meshsim reads a file (`/dev/zero` never ends) is refused at once,
/// with exit status 2, by every command that reads one: read whole, it would grow memory
/// until the system runs out. A symbolic link to one is a device too.
#[test]
fn a_device_given_as_an_input_file_is_refused_before_any_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = small_text();
    let at = text.find("[workload]").expect("a workload section");
    let scenario = format!(
        "{}[workload]\nsource = \"mooncake-jsonl\"\npath = \"/dev/zero\"\n",
        &text[..at]
    );
    std::fs::write(d.join("s.toml"), scenario).unwrap();
    let folder = d.join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::os::unix::fs::symlink("/dev/zero", folder.join("summary.csv")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", folder.join("requests.csv")).unwrap();
    let commands: [&[&str]; 6] = [
        &["check", "/dev/zero"],
        &["run", "/dev/zero", "--out", "out"],
        &["run", "s.toml", "--out", "out"],
        &["trace", "stats", "/dev/zero", "--format", "mooncake-jsonl"],
        &["plot", "folder"],
        &["compare", "folder", "folder"],
    ];
    for args in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
            .args(args)
            .current_dir(d)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("it is a device, not a file"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!d.join("out").exists(), "nothing written");
}

/// `--threads` takes 1 to 1,024 threads (each runs a whole simulation): 0 is refused rather
/// than quietly run as one thread, and a huge count rather than run as many simulations at
/// once as it names.
#[test]
fn a_thread_count_of_zero_or_past_the_bound_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.toml"), small_text()).unwrap();
    for n in ["0", "1025", "two"] {
        let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
            .args(["run", "s.toml", "--out", "out", "--threads", n])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{n}: {stderr}");
        assert!(stderr.contains("--threads"), "{n}: {stderr}");
        assert!(!dir.path().join("out").exists(), "{n}: nothing written");
    }
}

#[test]
fn a_missing_scenario_with_an_odd_name_is_named_with_exit_status_2() {
    let missing = "/nonexistent/été dir/scénario.toml";
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["check", missing])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("scénario.toml"), "{stderr}");
    assert!(!Path::new("/nonexistent").exists());
}

/// `meshsim <args>` from the project folder: exit status and stderr.
fn cli(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn vopr_refuses_to_check_no_seed_or_seeds_past_the_last() {
    for (args, says) in [
        (&["vopr", "--seeds", "0"][..], "--seeds 0"),
        (
            &["vopr", "--from", "18446744073709551615", "--seeds", "2"][..],
            "--from 18446744073709551615 --seeds 2",
        ),
    ] {
        let (code, err) = cli(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn a_serving_profile_refuses_shards_instead_of_ignoring_them() {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("p.toml");
    let (code, err) = cli(&[
        "profile",
        "--model",
        "tiny-32k",
        "--serving",
        "--shards",
        "2",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--shards 2"), "{err}");
    assert!(!file.exists());
}
