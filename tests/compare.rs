//! `meshsim compare` on two different, hand-written results folders, against errors computed
//! by hand (`src/results/compare.rs` defines them): percentiles are nearest-rank over each
//! run's completed requests, `p = sorted[ceil(p/100 x n) - 1]`; the signed error is
//! `(sim - live) / live`; the mean absolute TTFT error is `mean |sim_i - live_i| / live_i` over
//! requests matched by id, so it is not the error of the sorted values.

use std::path::Path;
use std::process::Command;

use meshsim::metrics::write::summary_header;

/// One row of `requests.csv`: policy, request id, status, TTFT and TPOT in ms (`None`: no
/// TPOT, a one-token output).
type Row = (&'static str, u32, &'static str, f64, Option<f64>);

/// The simulated run. Request 4 completes only here (the live run rejects it) and request 5
/// is missing from the live run: neither is compared. Request 2 of `cached` has no TPOT.
const SIM: [Row; 10] = [
    ("cached", 0, "ok", 10.0, Some(1.0)),
    ("cached", 1, "ok", 20.0, Some(1.5)),
    ("cached", 2, "ok", 30.0, None),
    ("cached", 3, "ok", 40.0, Some(2.5)),
    ("cached", 4, "ok", 1.0, Some(9.0)),
    ("cached", 5, "ok", 1.0, Some(9.0)),
    ("stateless", 0, "ok", 30.0, Some(3.0)),
    ("stateless", 1, "ok", 60.0, Some(3.0)),
    ("stateless", 2, "ok", 90.0, Some(3.0)),
    ("stateless", 3, "ok", 150.0, Some(3.0)),
];

/// The live run, its rows in another order than the simulated one's.
const LIVE: [Row; 9] = [
    ("stateless", 3, "ok", 96.0, Some(4.0)),
    ("stateless", 2, "ok", 100.0, Some(4.0)),
    ("stateless", 1, "ok", 50.0, Some(4.0)),
    ("stateless", 0, "ok", 24.0, Some(4.0)),
    ("cached", 4, "rejected", 0.0, None),
    ("cached", 3, "ok", 50.0, Some(1.2)),
    ("cached", 2, "ok", 30.0, Some(1.2)),
    ("cached", 1, "ok", 10.0, Some(1.2)),
    ("cached", 0, "ok", 20.0, Some(1.2)),
];

/// The rows expected, computed by hand.
///
/// `cached`, requests 0-3. TTFT sim 10, 20, 30, 40; live 20, 10, 30, 50 (sorted 10, 20, 30,
/// 50). p50 = 2nd of 4: 20 and 20, +0.0 %. p99 = 4th: 40 and 50, (40 - 50) / 50 = -20.0 %.
/// Mean absolute error by id: (10/20 + 10/10 + 0/30 + 10/50) / 4 = (0.5 + 1 + 0 + 0.2) / 4 =
/// 42.5 % (by sorted value it would be 5 %). TPOT sim 1.0, 1.5, 2.5 (p50 = 2nd of 3: 1.5), live
/// 1.2: (1.5 - 1.2) / 1.2 = +25.0 %.
///
/// `stateless`. TTFT sim 30, 60, 90, 150; live 24, 50, 100, 96 (sorted 24, 50, 96, 100).
/// p50: 60 and 50, +20.0 %. p99: 150 and 100, +50.0 %. Mean absolute error: (6/24 + 10/50 +
/// 10/100 + 54/96) / 4 = (0.25 + 0.2 + 0.1 + 0.5625) / 4 = 27.8 %. TPOT 3 and 4: -25.0 %.
const EXPECTED: [&str; 2] = [
    "| - | cached | 4 | 20.0 | 20.0 | +0.0% | 40.0 | 50.0 | -20.0% | 42.5% | 1.50 | 1.20 | +25.0% |",
    "| - | stateless | 4 | 60.0 | 50.0 | +20.0% | 150.0 | 100.0 | +50.0% | 27.8% | 3.00 | 4.00 | -25.0% |",
];

fn ns(ms: f64) -> String {
    format!("{:.0}", ms * 1e6)
}

/// Writes a results folder of `rows`: `requests.csv` with the columns `compare` and `plot`
/// read, and a `summary.csv` of zeros (compare checks the folder as `meshsim plot` does).
fn write_folder(dir: &Path, rows: &[Row]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut requests = String::from("policy,request,status,ttft_ns,tpot_ns\n");
    for (policy, id, status, ttft, tpot) in rows {
        let (ttft, tpot) = if *status == "ok" {
            (ns(*ttft), tpot.map(ns).unwrap_or_default())
        } else {
            (String::new(), String::new())
        };
        requests += &format!("{policy},{id},{status},{ttft},{tpot}\n");
    }
    std::fs::write(dir.join("requests.csv"), requests).unwrap();
    let header = summary_header();
    let mut summary = header.join(",") + "\n";
    for policy in ["cached", "stateless"] {
        let row: Vec<&str> = header
            .iter()
            .map(|c| if c == "policy" { policy } else { "0" })
            .collect();
        summary += &(row.join(",") + "\n");
    }
    std::fs::write(dir.join("summary.csv"), summary).unwrap();
}

fn table_rows(md: &str) -> Vec<&str> {
    md.lines().filter(|l| l.starts_with("| - |")).collect()
}

#[test]
fn compare_gives_hand_computed_errors_for_two_different_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, live) = (dir.path().join("sim"), dir.path().join("live"));
    write_folder(&sim, &SIM);
    write_folder(&live, &LIVE);
    let md = meshsim::results::compare::compare(&sim, &live).unwrap();
    assert_eq!(table_rows(&md), EXPECTED, "{md}");
    assert!(!md.contains("Warning"), "{md}");
}

#[test]
fn compare_on_the_command_line_prints_the_same_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, live) = (dir.path().join("sim"), dir.path().join("live"));
    write_folder(&sim, &SIM);
    write_folder(&live, &LIVE);
    let o = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["compare", "sim", "live"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(table_rows(&stdout), EXPECTED, "{stdout}");
    assert!(
        stdout.contains("simulated: `sim`; live: `live`."),
        "{stdout}"
    );
}

#[test]
fn swapping_the_runs_flips_the_sign_of_the_percentile_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, live) = (dir.path().join("sim"), dir.path().join("live"));
    write_folder(&sim, &SIM);
    write_folder(&live, &LIVE);
    let md = meshsim::results::compare::compare(&live, &sim).unwrap();
    // `stateless` with the live run as the simulation: p50 (50 - 60) / 60 = -16.7 %, p99
    // (100 - 150) / 150 = -33.3 %, mean absolute error (6/30 + 10/60 + 10/90 + 54/150) / 4 =
    // (0.2 + 0.1667 + 0.1111 + 0.36) / 4 = 20.9 %, TPOT (4 - 3) / 3 = +33.3 %. The live file
    // lists `stateless` first, so its row comes first.
    assert_eq!(
        table_rows(&md)[0],
        "| - | stateless | 4 | 50.0 | 60.0 | -16.7% | 100.0 | 150.0 | -33.3% | 20.9% | 4.00 | 3.00 | +33.3% |",
        "{md}"
    );
}

#[test]
fn policies_that_the_simulation_orders_must_rank_the_same_live() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, live) = (dir.path().join("sim"), dir.path().join("live"));
    let sim_rows: [Row; 4] = [
        ("cached", 0, "ok", 10.0, Some(1.0)),
        ("cached", 1, "ok", 10.0, Some(1.0)),
        ("stateless", 0, "ok", 20.0, Some(1.0)),
        ("stateless", 1, "ok", 20.0, Some(1.0)),
    ];
    // Live, stateless is the faster one: the ranking is not the same.
    let live_rows: [Row; 4] = [
        ("cached", 0, "ok", 30.0, Some(1.0)),
        ("cached", 1, "ok", 30.0, Some(1.0)),
        ("stateless", 0, "ok", 15.0, Some(1.0)),
        ("stateless", 1, "ok", 15.0, Some(1.0)),
    ];
    write_folder(&sim, &sim_rows);
    write_folder(&live, &live_rows);
    let md = meshsim::results::compare::compare(&sim, &live).unwrap();
    assert!(
        md.contains(
            "- all requests: simulated cached < stateless; live stateless < cached: not the \
             same: cached and stateless swap."
        ),
        "{md}"
    );
    // Within 1 % in the simulation they are tied, and any live order agrees.
    let tied: Vec<Row> = sim_rows
        .iter()
        .map(|&(p, i, s, _, t)| (p, i, s, 10.0, t))
        .collect();
    write_folder(&sim, &tied);
    let md = meshsim::results::compare::compare(&sim, &live).unwrap();
    assert!(
        md.contains("simulated cached = stateless; live stateless < cached: the same."),
        "{md}"
    );
    // These folders have no arrival times: no throughput table.
    assert!(!md.contains("Throughput"), "{md}");
}

#[test]
fn compare_json_holds_the_hand_computed_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, live) = (dir.path().join("sim"), dir.path().join("live"));
    write_folder(&sim, &SIM);
    write_folder(&live, &LIVE);
    let o = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["compare", "sim", "live", "--json", "--out", "c.json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(dir.path().join("c.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], "meshsim-comparison/1");
    assert_eq!(
        (v["simulated"].as_str(), v["live"].as_str()),
        (Some("sim"), Some("live"))
    );
    assert_eq!(v["same_scenario"], true);
    let close = |x: &serde_json::Value, want: f64| {
        let got = x.as_f64().unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-9, "{x} against {want}");
    };
    // The figures of EXPECTED (see there for the arithmetic), as numbers.
    let cached = &v["runs"][0];
    assert_eq!(
        (cached["point"].clone(), cached["policy"].as_str()),
        (serde_json::Value::Null, Some("cached"))
    );
    assert_eq!(cached["requests"], 4);
    close(&cached["ttft_p50_ms"]["sim"], 20.0);
    close(&cached["ttft_p50_ms"]["error"], 0.0);
    close(&cached["ttft_p99_ms"]["live"], 50.0);
    close(&cached["ttft_p99_ms"]["error"], -0.2);
    close(&cached["mean_abs_ttft_error"], 0.425);
    close(&cached["tpot_p50_ms"]["error"], 0.25);
    let stateless = &v["runs"][1];
    close(&stateless["ttft_p99_ms"]["error"], 0.5);
    close(
        &stateless["mean_abs_ttft_error"],
        (0.25 + 0.2 + 0.1 + 0.5625) / 4.0,
    );
    close(&stateless["tpot_p50_ms"]["error"], -0.25);
    // No arrival times: no throughput.
    assert_eq!(stateless["throughput_rps"], serde_json::Value::Null);
    assert_eq!(v["rankings"][0]["simulated"], "cached < stateless");
    assert_eq!(v["rankings"][0]["swapped"], serde_json::json!([]));
    // Markdown and JSON each replace only their own kind of file.
    let o = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["compare", "sim", "live", "--out", "c.json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "markdown over a JSON comparison");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("c.json")).unwrap(),
        text
    );
}
