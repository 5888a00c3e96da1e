//! Values no run can produce and inputs in the wrong place are refused before anything runs:
//! exit status 2 and a message naming the file, the line as a person counts it (the header is
//! line 1) and the column or key. No input may make a command hang, so every command here runs
//! under a 20-second deadline.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meshsim::Tier;
use meshsim::metrics::write::{request_header, summary_header};
use meshsim::results::plot::{Figure, Latencies, Results, SummaryRow, TpsPoint, TpsSeries};

/// How long a command may run before the test calls it hung.
const DEADLINE: Duration = Duration::from_secs(20);

struct Outcome {
    status: i32,
    stdout: String,
    stderr: String,
}

/// Runs `meshsim args` in `dir`; kills it and fails the test when it is still running after
/// [`DEADLINE`]. (The one place where these tests look at the wall clock: a hang has no other
/// symptom.)
fn meshsim(dir: &Path, args: &[&str]) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("meshsim {args:?} still runs after {DEADLINE:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Outcome {
        status: status.code().unwrap_or(-1),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn assert_refused(o: &Outcome, expected: &[&str]) {
    assert_eq!(o.status, 2, "exit status; stderr: {}", o.stderr);
    for e in expected {
        assert!(o.stderr.contains(e), "`{e}` not in: {}", o.stderr);
    }
}

// ---------------------------------------------------------------------------------------------
// `meshsim plot` and `meshsim compare` on bad CSV values.

/// Columns of `summary.csv` that the plots and the report show, and what they hold.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// A whole number (requests, tokens, bytes).
    Count,
    /// A duration or a rate: a finite number >= 0.
    Number,
    /// A ratio of two counts, in [0, 1].
    Ratio,
}

fn plotted_summary_columns() -> Vec<(String, Kind)> {
    let mut v: Vec<(String, Kind)> = [
        ("requests", Kind::Count),
        ("completed", Kind::Count),
        ("throughput_rps", Kind::Number),
        ("output_tokens_per_s", Kind::Number),
        ("ttft_p50_ms", Kind::Number),
        ("ttft_p99_ms", Kind::Number),
        ("tpot_p50_ms", Kind::Number),
        ("e2e_p50_ms", Kind::Number),
        ("prefix_hit_ratio", Kind::Ratio),
    ]
    .into_iter()
    .map(|(c, k)| (c.to_string(), k))
    .collect();
    for t in Tier::ALL {
        v.push((format!("reused_{}_tokens", t.name()), Kind::Count));
    }
    for t in &Tier::ALL[1..] {
        v.push((format!("loaded_{}_bytes", t.name()), Kind::Count));
    }
    v
}

/// Columns of `requests.csv` that the plots use (`output_tokens` and `e2e_ns` for pipeline
/// results, which these are) and that `compare` matches.
const PLOTTED_REQUEST_COLUMNS: [&str; 4] = ["ttft_ns", "tpot_ns", "output_tokens", "e2e_ns"];

fn bad_values(kind: Kind) -> Vec<&'static str> {
    let mut v = vec!["inf", "-inf", "NaN", "-5"];
    match kind {
        Kind::Count => v.push("1.5"),
        Kind::Number => v.push("1e999"),
        // A hit ratio below zero, above one, or written as a percentage (500 %).
        Kind::Ratio => v.extend(["-0.1", "1.5", "5"]),
    }
    v
}

fn summary_value(column: &str) -> &'static str {
    match column {
        "requests" | "completed" => "4",
        "prefix_hit_ratio" => "0.500",
        c if c.ends_with("_ms") || c.contains("throughput") || c.ends_with("_per_s") => "5.000",
        _ => "0",
    }
}

fn summary_csv(policies: &[&str]) -> String {
    let header = summary_header();
    let mut s = header.join(",") + "\n";
    for p in policies {
        let row: Vec<&str> = header
            .iter()
            .map(|c| if c == "policy" { p } else { summary_value(c) })
            .collect();
        s += &(row.join(",") + "\n");
    }
    s
}

/// `requests.csv` rows: `n` completed requests per policy.
fn request_rows(policies: &[&str], n: usize) -> Vec<String> {
    let header = request_header();
    let mut rows = vec![header.join(",")];
    for p in policies {
        for i in 0..n {
            let row: Vec<String> = header
                .iter()
                .map(|c| match c.as_str() {
                    "policy" => p.to_string(),
                    "request" => i.to_string(),
                    "status" => "ok".into(),
                    "prompt_tokens" => "64".into(),
                    "output_tokens" => "8".into(),
                    "ttft_ns" => (1_000_000 + 1000 * i).to_string(),
                    "tpot_ns" => "100000".into(),
                    "e2e_ns" => (2_000_000 + 1000 * i).to_string(),
                    _ => "0".into(),
                })
                .collect();
            rows.push(row.join(","));
        }
    }
    rows
}

/// A results folder of a pipeline run (so that every column above is plotted).
fn write_results(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let policies = ["cached", "stateless"];
    std::fs::write(dir.join("summary.csv"), summary_csv(&policies)).unwrap();
    let rows = request_rows(&policies, 4);
    std::fs::write(dir.join("requests.csv"), rows.join("\n") + "\n").unwrap();
    std::fs::write(
        dir.join("scenario.toml"),
        "name = \"bad-values\"\n[pipeline]\nmodel = \"tiny\"\n",
    )
    .unwrap();
}

/// `text` (a CSV file) with `column` of its line `line` (1-based) set to `value`.
fn with_value(text: &str, line: usize, column: &str, value: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let col = lines[0]
        .split(',')
        .position(|c| c == column)
        .unwrap_or_else(|| panic!("no column {column}"));
    let mut fields: Vec<&str> = lines[line - 1].split(',').collect();
    fields[col] = value;
    lines[line - 1] = fields.join(",");
    lines.join("\n") + "\n"
}

/// Writes `file` of `bad` with `column` of line `line` set to `value`, and checks that
/// `meshsim plot bad` and `meshsim compare good bad` refuse it, naming the file, the line and
/// the column.
fn assert_both_refuse(root: &Path, file: &str, line: usize, column: &str, value: &str) {
    let (good, bad) = (root.join("good"), root.join("bad"));
    let text = std::fs::read_to_string(good.join(file)).unwrap();
    std::fs::write(bad.join(file), with_value(&text, line, column, value)).unwrap();
    let expected = [
        format!("{file}: line {line}"),
        format!("`{column}`"),
        format!("`{value}`"),
    ];
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    for args in [vec!["plot", "bad"], vec!["compare", "good", "bad"]] {
        let o = meshsim(root, &args);
        assert_eq!(
            o.status, 2,
            "{args:?} with {column} = {value}: exit status; stderr: {}",
            o.stderr
        );
        for e in &expected {
            assert!(
                o.stderr.contains(e),
                "{args:?} with {column} = {value}: `{e}` not in: {}",
                o.stderr
            );
        }
    }
    std::fs::copy(good.join(file), bad.join(file)).unwrap();
}

fn good_and_bad() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    write_results(&root.join("good"));
    write_results(&root.join("bad"));
    for args in [vec!["plot", "good"], vec!["compare", "good", "bad"]] {
        let o = meshsim(&root, &args);
        assert_eq!(o.status, 0, "{args:?} on good results: {}", o.stderr);
    }
    (tmp, root)
}

#[test]
fn every_plotted_summary_column_refuses_infinite_negative_and_impossible_values() {
    let (_tmp, root) = good_and_bad();
    for (column, kind) in plotted_summary_columns() {
        for value in bad_values(kind) {
            assert_both_refuse(&root, "summary.csv", 3, &column, value);
        }
    }
    // More completed requests than requests.
    assert_both_refuse(&root, "summary.csv", 2, "completed", "99");
}

#[test]
fn every_other_summary_column_refuses_infinite_and_negative_values_too() {
    let (_tmp, root) = good_and_bad();
    let plotted: Vec<String> = plotted_summary_columns().into_iter().map(|c| c.0).collect();
    let others: Vec<String> = summary_header()
        .into_iter()
        .filter(|c| c != "policy" && !plotted.contains(c))
        .collect();
    assert!(others.iter().any(|c| c == "rejected"), "{others:?}");
    for column in &others {
        for value in ["inf", "NaN", "-5"] {
            assert_both_refuse(&root, "summary.csv", 2, column, value);
        }
    }
}

#[test]
fn every_plotted_requests_column_refuses_infinite_negative_and_impossible_values() {
    let (_tmp, root) = good_and_bad();
    for column in PLOTTED_REQUEST_COLUMNS {
        for value in bad_values(Kind::Count) {
            assert_both_refuse(&root, "requests.csv", 7, column, value);
        }
    }
}

#[test]
fn an_empty_tpot_is_skipped_as_undefined_not_refused() {
    let (_tmp, root) = good_and_bad();
    let text = std::fs::read_to_string(root.join("good/requests.csv")).unwrap();
    std::fs::write(
        root.join("bad/requests.csv"),
        with_value(&text, 4, "tpot_ns", ""),
    )
    .unwrap();
    let o = meshsim(&root, &["plot", "bad"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
    let o = meshsim(&root, &["-v", "plot", "bad"]);
    assert!(o.stderr.contains("without a TPOT"), "{}", o.stderr);
    let o = meshsim(&root, &["compare", "good", "bad"]);
    assert_eq!(o.status, 0, "{}", o.stderr);
}

/// Figures drawn straight from values no CSV file may hold any more still end: every axis
/// range is made finite and non-empty before plotters computes its ticks.
#[test]
fn figures_end_even_on_infinite_and_nan_values() {
    let row = |policy: &str, v: f64| SummaryRow {
        policy: policy.into(),
        point: None,
        requests: 4,
        completed: 4,
        throughput_rps: v,
        output_tokens_per_s: v,
        ttft_p50_ms: v,
        ttft_p99_ms: -v,
        tpot_p50_ms: v,
        e2e_p50_ms: v,
        prefix_hit_ratio: v,
        reused_tokens: [1; 5],
        loaded_bytes: [1; 4],
    };
    let latencies = |policy: &str, v: f64| Latencies {
        policy: policy.into(),
        ttft_ms: vec![1.0, v],
        tpot_ms: vec![v],
    };
    for v in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, f64::MAX, 0.0] {
        let mut swept = row("b", v);
        swept.point = Some("rate=1".into());
        let results = [
            Results {
                summary: vec![row("a", v), row("b", 1.0)],
                latencies: vec![latencies("a", v), latencies("b", 2.0)],
                scenario: None,
                tps_output: Some(vec![TpsSeries {
                    policy: "a".into(),
                    rest: None,
                    points: vec![TpsPoint {
                        from: 8,
                        to: 8,
                        median_tps: v,
                        requests: 1,
                    }],
                }]),
            },
            Results {
                summary: vec![swept],
                latencies: vec![latencies("b", v)],
                scenario: None,
                tps_output: None,
            },
        ];
        for r in results {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut figures = Figure::ALL.to_vec();
                figures.push(Figure::TpsOutput);
                for f in figures {
                    if let Err(e) = f.svg(&r) {
                        panic!("{}: {e}", f.stem());
                    }
                }
                let _ = meshsim::results::plot::report_markdown(&r);
                let _ = tx.send(());
            });
            assert!(
                rx.recv_timeout(DEADLINE).is_ok(),
                "drawing with the value {v} hangs or panics"
            );
        }
    }
}

#[test]
fn a_bad_value_deep_in_a_file_is_reported_at_the_line_an_editor_shows() {
    let (_tmp, root) = good_and_bad();
    let policies = ["cached", "stateless"];
    // 600 rows, Windows line ends and a blank line at line 100: the bad value sits on the
    // 501st line of the file.
    let mut rows = request_rows(&policies, 300);
    rows.insert(99, String::new());
    let col = rows[0].split(',').position(|c| c == "ttft_ns").unwrap();
    let mut fields: Vec<String> = rows[500].split(',').map(str::to_string).collect();
    fields[col] = "inf".into();
    rows[500] = fields.join(",");
    std::fs::write(root.join("bad/requests.csv"), rows.join("\r\n") + "\r\n").unwrap();
    std::fs::write(root.join("good/requests.csv"), {
        let mut good = request_rows(&policies, 300);
        good.insert(99, String::new());
        good.join("\r\n") + "\r\n"
    })
    .unwrap();
    for args in [vec!["plot", "bad"], vec!["compare", "good", "bad"]] {
        let o = meshsim(&root, &args);
        assert_refused(&o, &["requests.csv: line 501", "`ttft_ns`", "`inf`"]);
    }
    // summary.csv with Windows line ends: the third line is line 3.
    let summary = summary_csv(&policies).replace('\n', "\r\n");
    let bad = with_value(&summary, 3, "ttft_p99_ms", "NaN").replace('\n', "\r\n");
    std::fs::write(root.join("bad/summary.csv"), bad.replace("\r\r\n", "\r\n")).unwrap();
    let o = meshsim(&root, &["plot", "bad"]);
    assert_refused(&o, &["summary.csv: line 3", "`ttft_p99_ms`", "`NaN`"]);
}

#[test]
fn csv_files_with_a_byte_order_mark_are_read() {
    let (_tmp, root) = good_and_bad();
    for file in ["summary.csv", "requests.csv"] {
        let text = std::fs::read(root.join("good").join(file)).unwrap();
        std::fs::write(
            root.join("bad").join(file),
            [b"\xEF\xBB\xBF", &text[..]].concat(),
        )
        .unwrap();
    }
    for args in [vec!["plot", "bad"], vec!["compare", "good", "bad"]] {
        let o = meshsim(&root, &args);
        assert_eq!(o.status, 0, "{args:?}: {}", o.stderr);
    }
}

// ---------------------------------------------------------------------------------------------
// Traces and scenarios.

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
