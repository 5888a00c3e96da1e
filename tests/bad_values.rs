//! Values no run can produce in a results folder are refused by `meshsim plot` and
//! `meshsim compare`: exit status 2 and a message naming the file, the line as a person counts
//! it (the header is line 1) and the column. An empty TPOT is skipped, a byte order mark is
//! read, and figures drawn straight from infinite or NaN values still end. No input may make a
//! command hang, so every command here runs under a 20-second deadline. Traces and scenarios
//! are in `tests/bad_values_traces.rs`.

mod common;

use std::path::{Path, PathBuf};

use common::deadline::{DEADLINE, assert_refused, meshsim};
use meshsim::Tier;
use meshsim::metrics::write::{request_header, summary_header};
use meshsim::results::plot::{Figure, Latencies, Results, SummaryRow, TpsPoint, TpsSeries};

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
        links: None,
        gpu_hit_ratio: None,
        gpu_optimal_hit_ratio: None,
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
