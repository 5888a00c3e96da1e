//! Traces and scenarios holding values no run can use are refused before anything runs:
//! exit status 2 and a message naming the file, the line as a person counts it and the field or
//! key (a trace without requests, impossible timestamps, a prompt beyond the model's context, a
//! value swept twice, a bad sweep point, a name too long for a file name, event limits beyond
//! what the kernel can count), and nothing written. A byte order mark is accepted. No input may
//! make a command hang, so every command here runs under a 20-second deadline. Results folders
//! are in `tests/bad_values.rs`.

mod common;

use std::path::Path;

use common::deadline::{Outcome, assert_refused, meshsim};

/// The small test scenario with its workload section replaced by `workload`.
fn scenario_with(workload: &str) -> String {
    let text = small_text();
    let head = &text[..text.find("[workload]").unwrap()];
    format!("{head}[workload]\n{workload}\n")
}

fn small_text() -> String {
    std::fs::read_to_string(common::data("small.toml")).unwrap()
}

/// Writes `files` into a fresh folder, runs `meshsim args` there and checks that no results
/// were written.
fn in_folder(files: &[(&str, &[u8])], args: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let o = meshsim(dir.path(), args);
    if o.status != 0 {
        assert!(
            !dir.path().join("results").exists(),
            "a refused input must not write results"
        );
    }
    o
}

const VIDUR_HEADER: &str = "arrived_at,num_prefill_tokens,num_decode_tokens\n";

fn mooncake_line(timestamp: &str, input_length: u32) -> String {
    let blocks: Vec<String> = (0..input_length.div_ceil(512))
        .map(|i| i.to_string())
        .collect();
    format!(
        "{{\"timestamp\": {timestamp}, \"input_length\": {input_length}, \"output_length\": 5, \
         \"hash_ids\": [{}]}}\n",
        blocks.join(", ")
    )
}

fn replaying(source: &str, path: &str) -> Vec<u8> {
    scenario_with(&format!("source = \"{source}\"\npath = \"{path}\"")).into_bytes()
}

#[test]
fn a_trace_without_requests_is_refused_before_anything_runs() {
    let canonical = "{\"format\": \"meshsim-trace\", \"version\": 1, \"block_size\": 16}\n";
    let bad_only = mooncake_line("0", 10).replace("[0]", "[0, 1]");
    let cases: [(&str, &str, &str, String); 3] = [
        ("vidur-csv", "t.csv", "", VIDUR_HEADER.to_string()),
        ("canonical", "t.jsonl", "", canonical.to_string()),
        (
            "mooncake-jsonl",
            "t.jsonl",
            "skip_bad_lines = true\n",
            bad_only,
        ),
    ];
    for (source, file, extra, trace) in cases {
        let scenario = scenario_with(&format!(
            "source = \"{source}\"\npath = \"{file}\"\n{extra}"
        ));
        let files: [(&str, &[u8]); 2] = [(file, trace.as_bytes()), ("s.toml", scenario.as_bytes())];
        let o = in_folder(&files, &["run", "s.toml"]);
        assert_refused(&o, &[file, "no requests"]);
        let mut stats = vec!["trace", "stats", file, "--format", source];
        if !extra.is_empty() {
            stats.push("--skip-bad-lines");
        }
        let o = in_folder(&files, &stats);
        assert_refused(&o, &[file, "no requests"]);
    }
}

#[test]
fn impossible_timestamps_are_refused_naming_their_line() {
    // Beyond the simulator's u64 nanosecond clock.
    for ts in ["1e300", "18446744073709551615"] {
        let trace = mooncake_line("0", 10) + &mooncake_line(ts, 10);
        for args in [&["run", "s.toml"][..], &["trace", "stats", "t.jsonl"][..]] {
            let o = in_folder(
                &[
                    ("t.jsonl", trace.as_bytes()),
                    ("s.toml", &replaying("mooncake-jsonl", "t.jsonl")),
                ],
                args,
            );
            assert_refused(&o, &["t.jsonl:2: timestamp", "expected milliseconds"]);
        }
    }
    for t in ["inf", "NaN", "-1", "1e300"] {
        let trace = format!("{VIDUR_HEADER}0.0,10,5\n{t},10,5\n");
        let o = in_folder(
            &[
                ("t.csv", trace.as_bytes()),
                ("s.toml", &replaying("vidur-csv", "t.csv")),
            ],
            &["run", "s.toml"],
        );
        assert_refused(&o, &["t.csv:3: arrived_at", t]);
    }
    // Within the clock but after the scenario's time limit (a week by default): refused
    // before the simulation, at the line, rather than as a broken limit (exit 1).
    let canonical = "{\"format\": \"meshsim-trace\", \"version\": 1, \"block_size\": 16}\n\
                     {\"segment\": 0, \"pseudo_key\": 1, \"len\": 10}\n\
                     {\"arrival_ns\": 0, \"prompt\": [0], \"output_tokens\": 5}\n\
                     {\"arrival_ns\": 18446744073709551615, \"prompt\": [0], \"output_tokens\": 5}\n";
    let o = in_folder(
        &[
            ("t.jsonl", canonical.as_bytes()),
            ("s.toml", &replaying("canonical", "t.jsonl")),
        ],
        &["run", "s.toml"],
    );
    assert_refused(
        &o,
        &["t.jsonl:4: arrival_ns", "limits.max_sim_time_s = 604800"],
    );
    let trace = mooncake_line("0", 10) + &mooncake_line("1e12", 10);
    let o = in_folder(
        &[
            ("t.jsonl", trace.as_bytes()),
            ("s.toml", &replaying("mooncake-jsonl", "t.jsonl")),
        ],
        &["run", "s.toml"],
    );
    assert_refused(&o, &["t.jsonl:2: timestamp", "time limit"]);
}

#[test]
fn a_byte_order_mark_is_accepted_in_traces_and_scenarios() {
    let bom = "\u{feff}";
    let vidur = format!("{bom}{VIDUR_HEADER}0.0,10,5\n0.5,20,5\n");
    let mooncake = format!("{bom}{}", mooncake_line("0", 10) + &mooncake_line("5", 600));
    for (file, text) in [("t.csv", &vidur), ("t.jsonl", &mooncake)] {
        let o = in_folder(&[(file, text.as_bytes())], &["trace", "stats", file]);
        assert_eq!(o.status, 0, "{file}: {}", o.stderr);
        assert!(o.stdout.contains("requests 2;"), "{}", o.stdout);
    }
    // A converted trace with a mark still reads as canonical.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), &vidur).unwrap();
    let o = meshsim(
        dir.path(),
        &["trace", "convert", "t.csv", "--out", "c.jsonl"],
    );
    assert_eq!(o.status, 0, "{}", o.stderr);
    let c = std::fs::read_to_string(dir.path().join("c.jsonl")).unwrap();
    std::fs::write(dir.path().join("c.jsonl"), format!("{bom}{c}")).unwrap();
    let o = meshsim(dir.path(), &["trace", "stats", "c.jsonl"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
    assert!(o.stdout.contains("(canonical)"), "{}", o.stdout);

    let scenario = format!("{bom}{}", small_text());
    let o = in_folder(&[("s.toml", scenario.as_bytes())], &["check", "s.toml"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pipeline = std::fs::read_to_string(root.join("scenarios/pipeline_small_2shard.toml"))
        .unwrap()
        .replace("\"../profiles/", &format!("\"{}/profiles/", root.display()));
    let pipeline = format!("{bom}{pipeline}");
    let o = in_folder(&[("p.toml", pipeline.as_bytes())], &["check", "p.toml"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
}

#[test]
fn a_prompt_longer_than_the_models_context_is_refused_with_both_numbers() {
    let trace = format!("{VIDUR_HEADER}0.0,100,5\n0.5,100000,5\n");
    let o = in_folder(
        &[
            ("t.csv", trace.as_bytes()),
            ("s.toml", &replaying("vidur-csv", "t.csv")),
        ],
        &["run", "s.toml"],
    );
    assert_refused(
        &o,
        &[
            "t.csv:3: num_prefill_tokens",
            "100000 tokens",
            "mistral-7b-instruct-v0.2 (32768 tokens)",
        ],
    );
    let trace = mooncake_line("0", 40_000);
    let o = in_folder(
        &[
            ("t.jsonl", trace.as_bytes()),
            ("s.toml", &replaying("mooncake-jsonl", "t.jsonl")),
        ],
        &["run", "s.toml"],
    );
    assert_refused(&o, &["t.jsonl:1: input_length", "40000", "32768"]);
    // Generated prompts: refused by the scenario check itself.
    let text = small_text().replace("context_tokens = 2048", "context_tokens = 40000");
    for cmd in ["check", "run"] {
        let o = in_folder(&[("s.toml", text.as_bytes())], &[cmd, "s.toml"]);
        assert_refused(&o, &["s.toml", "workload.context_tokens", "32768"]);
    }
}

/// The 1-based line of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    1 + text.lines().position(|l| l.starts_with(prefix)).unwrap()
}

#[test]
fn a_value_swept_twice_is_refused_naming_the_key_and_the_value() {
    for values in ["[1024, 2048, 1024]", "[1024, \"1024\"]"] {
        let text = format!(
            "{}\n[sweep]\n\"workload.context_tokens\" = {values}\n",
            small_text()
        );
        let line = line_of(&text, "\"workload.context_tokens\"");
        for cmd in ["check", "run"] {
            let o = in_folder(&[("s.toml", text.as_bytes())], &[cmd, "s.toml"]);
            assert_refused(
                &o,
                &[
                    &format!("s.toml:{line}:"),
                    "sweep.\"workload.context_tokens\"",
                    "1024",
                    "listed twice",
                ],
            );
        }
    }
}

#[test]
fn an_error_in_a_sweep_point_names_the_key_and_value_as_written_at_a_real_line() {
    for (values, written, expected) in [
        ("[2, 0]", "\"hardware.nodes\" = 0", "expected an integer"),
        (
            "[2, \"two\"]",
            "\"hardware.nodes\" = \"two\"",
            "invalid type",
        ),
    ] {
        let text = format!("{}\n[sweep]\n\"hardware.nodes\" = {values}\n", small_text());
        let line = line_of(&text, "\"hardware.nodes\"");
        let o = in_folder(&[("s.toml", text.as_bytes())], &["check", "s.toml"]);
        assert_refused(
            &o,
            &[
                &format!("s.toml:{line}:"),
                "hardware.nodes",
                written,
                expected,
            ],
        );
        let lines = text.lines().count();
        assert!(line <= lines);
    }
}

#[test]
fn a_scenario_name_too_long_for_a_file_name_is_refused_before_running() {
    let long = "n".repeat(220);
    let text = small_text().replace("name = \"small\"", &format!("name = \"{long}\""));
    for cmd in ["check", "run"] {
        let o = in_folder(&[("s.toml", text.as_bytes())], &[cmd, "s.toml"]);
        assert_refused(&o, &["s.toml", "name", "at most 200"]);
    }
    let ok = small_text().replace("name = \"small\"", &format!("name = \"{}\"", &long[..200]));
    assert!(meshsim::Scenario::parse("s.toml", "s", &ok).is_ok());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let pipeline = std::fs::read_to_string(root.join("pipeline_small_2shard.toml"))
        .unwrap()
        .replace(
            "name = \"pipeline_small_2shard\"",
            &format!("name = \"{long}\""),
        );
    let e = meshsim::pipeline::scenario::PipelineScenario::parse("p.toml", "p", &root, &pipeline)
        .unwrap_err();
    assert_eq!(e.key, "name", "{e}");
    // A file name without a `name` key names the results folder too.
    let text = small_text().replace("name = \"small\"\n", "");
    let file = format!("{long}.toml");
    let dir = tempfile::tempdir().unwrap();
    if std::fs::write(dir.path().join(&file), &text).is_ok() {
        let o = meshsim(dir.path(), &["check", &file]);
        assert_refused(&o, &["name", "at most 200"]);
    }
}

#[test]
fn event_limits_beyond_what_the_kernel_can_count_are_refused_naming_the_key() {
    let cases = [
        ("max_events = 1000000000000", "limits.max_events"),
        ("max_pending_events = 20000000", "limits.max_pending_events"),
    ];
    for (line, key) in cases {
        let text = format!("{}\n[limits]\n{line}\n", small_text());
        let o = in_folder(&[("s.toml", text.as_bytes())], &["check", "s.toml"]);
        assert_refused(&o, &["s.toml", key, "at most"]);
    }
    // The largest that can be counted are accepted.
    let text = format!(
        "{}\n[limits]\nmax_events = {}\nmax_pending_events = {}\n",
        small_text(),
        meshsim::sim::kernel::MAX_EVENTS,
        meshsim::sim::kernel::MAX_PENDING
    );
    assert!(meshsim::Scenario::parse("s.toml", "s", &text).is_ok());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let pipeline = std::fs::read_to_string(root.join("pipeline_small_2shard.toml"))
        .unwrap()
        .replace("[limits]\n", "[limits]\nmax_events = 1000000000000\n");
    let e = meshsim::pipeline::scenario::PipelineScenario::parse("p.toml", "p", &root, &pipeline)
        .unwrap_err();
    assert_eq!(e.key, "limits.max_events", "{e}");
}
