//! `summary.json` holds the figures of `summary.csv`, read back here by a reader of its own
//! (serde_json's `Value`, not meshsim's writer), and has the shape its published schema,
//! `docs/summary.schema.json`, gives: the keys the schema requires are those the file has,
//! value types and ranges as the schema says.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Where a `summary.csv` column's figure is in a run of `summary.json`, by the documented
/// naming (docs/cli.md, "summary.json"), written out here rather than taken from meshsim.
fn json_path(column: &str) -> Vec<String> {
    for m in ["ttft", "tpot", "e2e", "queue"] {
        for s in ["mean", "p50", "p90", "p99"] {
            if column == format!("{m}_{s}_ms") {
                return vec![format!("{m}_ms"), s.into()];
            }
        }
    }
    for tier in [
        "gpu",
        "local_host",
        "local_ssd",
        "remote_host",
        "remote_ssd",
    ] {
        if column == format!("reused_{tier}_tokens") {
            return vec!["reused_tokens".into(), tier.into()];
        }
        if column == format!("loaded_{tier}_bytes") {
            return vec!["loaded_bytes".into(), tier.into()];
        }
    }
    vec![column.into()]
}

fn at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// Checks every cell of `dir/summary.csv` against `dir/summary.json`, and the JSON's shape
/// against the schema; returns the parsed JSON.
fn check_against_csv(dir: &Path) -> Value {
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["schema"], "meshsim-summary/1");
    assert_eq!(json["meshsim_version"], env!("CARGO_PKG_VERSION"));
    let mut csv = csv::Reader::from_path(dir.join("summary.csv")).unwrap();
    let header = csv.headers().unwrap().clone();
    let runs = json["runs"].as_array().expect("runs is an array");
    let rows: Vec<csv::StringRecord> = csv.records().map(Result::unwrap).collect();
    assert_eq!(runs.len(), rows.len(), "one run per row of summary.csv");
    for (run, row) in runs.iter().zip(&rows) {
        if !header.iter().any(|c| c == "point") {
            assert_eq!(run["point"], Value::Null, "no sweep: point is null");
        }
        for (column, cell) in header.iter().zip(row.iter()) {
            let path = json_path(column);
            let v = at(run, &path).unwrap_or_else(|| panic!("{column}: not at {path:?}"));
            match column {
                "policy" | "point" => assert_eq!(v.as_str(), Some(cell), "{column}"),
                _ if cell.is_empty() => assert!(v.is_null(), "{column}"),
                _ => match cell.parse::<u64>() {
                    Ok(n) => assert_eq!(v.as_u64(), Some(n), "{column}: a count"),
                    Err(_) => {
                        let x: f64 = cell.parse().unwrap();
                        assert_eq!(v.as_f64(), Some(x), "{column}: {cell} against {v}");
                        assert!(v.is_f64(), "{column}: a decimal stays a decimal");
                    }
                },
            }
        }
        check_schema(run, header.len());
    }
    json
}

/// The run's keys are exactly those the schema's `run` definition lists as required (and as
/// properties); nested objects hold what the schema allows; the figures count the CSV's
/// columns once each.
fn check_schema(run: &Value, columns: usize) {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/summary.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let def = &schema["$defs"]["run"];
    let required: Vec<&str> = def["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let keys: Vec<&str> = run
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted_required = required.clone();
    sorted_required.sort();
    let mut sorted_keys = keys.clone();
    sorted_keys.sort();
    assert_eq!(
        sorted_keys, sorted_required,
        "the schema's keys are the file's"
    );
    let mut leaves = 0;
    for key in keys {
        let prop = &def["properties"][key];
        assert!(prop.is_object(), "{key}: described by the schema");
        let reference = prop["$ref"].as_str().unwrap_or("");
        let v = &run[key];
        if v.is_null() {
            leaves += 1;
            continue;
        }
        match reference.rsplit('/').next().unwrap() {
            "count" => assert!(v.is_u64(), "{key}: a count"),
            "non_negative" => assert!(v.as_f64().is_some_and(|x| x >= 0.0), "{key}"),
            "ratio" => assert!(v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x))),
            "distribution_ms" => {
                let o = v.as_object().unwrap();
                let stats: Vec<&str> = o.keys().map(String::as_str).collect();
                assert_eq!(stats, ["mean", "p50", "p90", "p99"], "{key}");
                assert!(o.values().all(|x| x.as_f64().is_some_and(|x| x >= 0.0)));
                leaves += o.len();
                continue;
            }
            "per_tier" => {
                let tiers = &schema["$defs"]["per_tier"]["properties"];
                for (tier, n) in v.as_object().unwrap() {
                    assert!(tiers[tier].is_object(), "{key}.{tier}: a tier");
                    assert!(n.is_u64(), "{key}.{tier}: a count");
                    leaves += 1;
                }
                continue;
            }
            _ => match key {
                "point" => assert!(v.is_null() || v.is_string()),
                "policy" => assert!(v.as_str().is_some_and(|s| !s.is_empty())),
                _ => panic!("{key}: no type in the schema"),
            },
        }
        leaves += 1;
    }
    // `point` is a key even where summary.csv has no such column.
    let point_column = usize::from(run["point"].is_string());
    assert_eq!(leaves, columns + 1 - point_column, "one figure per column");
}

#[test]
fn a_run_writes_summary_json_with_the_figures_of_summary_csv() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let s = common::small();
    meshsim::serving::outcome::write_results(&s, &common::run(&s, 2), &out).unwrap();
    let json = check_against_csv(&out);
    assert_eq!(json["scenario"]["name"], "small");
    assert_eq!(json["scenario"]["seed"], 7);
    let policies: Vec<&str> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["vanilla", "local-prefix", "evostore", "ptstore"]);
}

#[test]
fn meshsim_plot_writes_summary_json_for_a_sweep_with_empty_cells() {
    let dir = tempfile::tempdir().unwrap();
    let header = meshsim::metrics::write::summary_header();
    let mut summary = format!("point,{}\n", header.join(","));
    for (point, policy) in [
        ("context_tokens=1024", "vanilla"),
        ("context_tokens=2048", "ptstore"),
    ] {
        let cells: Vec<String> = header
            .iter()
            .enumerate()
            .map(|(i, c)| match c.as_str() {
                "policy" => policy.into(),
                "requests" | "completed" => "2".into(),
                c if c.ends_with("_ratio") => "0.250000".into(),
                "store_lookups" => String::new(),
                c if c.ends_with("_ms") => format!("{}.125", i),
                _ => i.to_string(),
            })
            .collect();
        summary += &format!("\"{point}\",{}\n", cells.join(","));
    }
    std::fs::write(dir.path().join("summary.csv"), summary).unwrap();
    std::fs::write(
        dir.path().join("requests.csv"),
        "point,policy,request,status,ttft_ns,tpot_ns\n\
         context_tokens=1024,vanilla,0,ok,1000000,200000\n\
         context_tokens=2048,ptstore,0,ok,2000000,\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("scenario.toml"),
        "name = \"swept\"\nseed = 3\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["plot", "-q"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json = check_against_csv(dir.path());
    assert_eq!(json["scenario"]["name"], "swept");
    assert_eq!(json["runs"][1]["point"], "context_tokens=2048");
    assert_eq!(json["runs"][0]["store_lookups"], Value::Null);
}

#[test]
fn plot_refuses_to_replace_a_summary_json_that_meshsim_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let s = common::small();
    meshsim::serving::outcome::write_results(&s, &common::run(&s, 2), &out).unwrap();
    let plot = || {
        Command::new(env!("CARGO_BIN_EXE_meshsim"))
            .args(["plot", "-q"])
            .arg(&out)
            .output()
            .unwrap()
    };
    // Its own summary.json is replaced.
    assert!(plot().status.success());
    // Someone else's is not, and nothing is drawn.
    std::fs::write(out.join("summary.json"), "{\"mine\": true}\n").unwrap();
    std::fs::remove_file(out.join("report.md")).unwrap();
    let o = plot();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("summary.json"));
    let kept = std::fs::read_to_string(out.join("summary.json")).unwrap();
    assert_eq!(kept, "{\"mine\": true}\n");
    assert!(!out.join("report.md").exists());
}
