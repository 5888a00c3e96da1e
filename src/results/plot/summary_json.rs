//! `summary.json`: the figures of `summary.csv` for tools that read JSON, with units named.
//!
//! Every results folder holds `summary.json` beside `summary.csv`, made from that file (and
//! `scenario.toml`) whenever the plots are made, so the two always hold the same figures: a
//! run, a merge of shares and `meshsim plot` all write it. The schema is
//! `docs/summary.schema.json`, described in docs/cli.md, "summary.json". In short:
//!
//! ```json
//! {
//!   "schema": "meshsim-summary/1",
//!   "meshsim_version": "0.1.0",
//!   "scenario": { "name": "polaris_32gpu", "seed": 42 },
//!   "runs": [
//!     { "point": null, "policy": "vanilla", "requests": 20000, "duration_s": 208.037329,
//!       "ttft_ms": { "mean": 670.559, "p50": 408.333, "p90": 1567.172, "p99": 3005.385 },
//!       "reused_tokens": { "gpu": 0, "local_host": 0, ... }, ... }
//!   ]
//! }
//! ```
//!
//! A run is a row of `summary.csv`, its keys in column order. The `<m>_<stat>_ms` columns of
//! one measure `m` become one object `"<m>_ms"` of `mean`, `p50`, `p90` and `p99`; the
//! `reused_<tier>_tokens` and `loaded_<tier>_bytes` columns become the objects
//! `reused_tokens` and `loaded_bytes` keyed by tier; every other column keeps its name, whose
//! suffix names its unit (`_s`, `_rps`, `_per_s`, `_bytes`, `_ratio`; counts have none). A
//! count is an integer, any other figure is the CSV's decimal, an empty cell is `null`, and
//! `point` is `null` outside a sweep.

use std::path::Path;

use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::Value;

use super::PlotError;
use super::table::Table;
use crate::metrics::Tier;

/// The `schema` value of the files this version writes.
pub const SCHEMA: &str = "meshsim-summary/1";

/// The statistics of a distribution's columns, in the order they appear as keys.
const STATS: [&str; 4] = ["mean", "p50", "p90", "p99"];

/// A JSON value whose objects keep their keys in the order they were added.
enum Node {
    Leaf(Value),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

impl Node {
    /// The object under `key` in this object, added at the end when `key` is new.
    fn object<'a>(fields: &'a mut Vec<(String, Node)>, key: &str) -> &'a mut Vec<(String, Node)> {
        let at = match fields.iter().position(|(k, _)| k == key) {
            Some(at) => at,
            None => {
                fields.push((key.to_string(), Node::Object(Vec::new())));
                fields.len() - 1
            }
        };
        match &mut fields[at].1 {
            Node::Object(inner) => inner,
            _ => unreachable!("a column name maps to an object's member or a key, never both"),
        }
    }
}

impl Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Leaf(v) => v.serialize(s),
            Node::Array(items) => items.serialize(s),
            Node::Object(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// Where a column of `summary.csv` goes in a run's object: (object, key) for a member of a
/// nested object, (None, name) for a key of its own.
fn place(column: &str) -> (Option<String>, String) {
    if let Some(stem) = column.strip_suffix("_ms")
        && let Some((measure, stat)) = stem.rsplit_once('_')
        && STATS.contains(&stat)
    {
        return (Some(format!("{measure}_ms")), stat.to_string());
    }
    for tier in Tier::ALL {
        let name = tier.name();
        if column == format!("reused_{name}_tokens") {
            return (Some("reused_tokens".into()), name.into());
        }
        if column == format!("loaded_{name}_bytes") {
            return (Some("loaded_bytes".into()), name.into());
        }
    }
    (None, column.to_string())
}

/// A cell as JSON: text for the names, `null` when empty, an integer when it is one, else
/// the decimal as written (the table was checked by [`super::Results::load`]: finite).
fn cell(t: &Table, rec: &csv::StringRecord, col: usize) -> Result<Value, PlotError> {
    let name = &t.header[col];
    let raw = rec.get(col).unwrap_or("").trim();
    if name == "policy" || name == "point" {
        return Ok(Value::String(raw.to_string()));
    }
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    if let Ok(n) = raw.parse::<u64>() {
        return Ok(Value::from(n));
    }
    let x: f64 = t.parse(rec, col, "a number")?;
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .ok_or_else(|| t.bad_value(rec, col, "a finite number"))
}

/// The text of `summary.json` for the folder `dir`: its `summary.csv` with the scenario's
/// name and seed from `scenario` (`null` when absent).
pub fn summary_json(dir: &Path, scenario: Option<&toml::Value>) -> Result<String, PlotError> {
    let t = Table::open(&dir.join("summary.csv"))?;
    let swept = t.optional_column("point").is_some();
    let mut runs = Vec::new();
    let mut rec = csv::StringRecord::new();
    let mut reader = t.rows();
    while reader.read_record(&mut rec).map_err(|e| t.csv_error(e))? {
        let mut run: Vec<(String, Node)> = Vec::new();
        if !swept {
            run.push(("point".into(), Node::Leaf(Value::Null)));
        }
        for col in 0..t.header.len() {
            let value = Node::Leaf(cell(&t, &rec, col)?);
            match place(&t.header[col]) {
                (Some(object), key) => Node::object(&mut run, &object).push((key, value)),
                (None, key) => run.push((key, value)),
            }
        }
        runs.push(Node::Object(run));
    }
    let from_scenario = |key: &str| {
        scenario
            .and_then(|s| s.get(key))
            .and_then(|v| serde_json::to_value(v).ok())
            .unwrap_or(Value::Null)
    };
    let doc = Node::Object(vec![
        ("schema".into(), Node::Leaf(SCHEMA.into())),
        (
            "meshsim_version".into(),
            Node::Leaf(env!("CARGO_PKG_VERSION").into()),
        ),
        (
            "scenario".into(),
            Node::Object(vec![
                ("name".into(), Node::Leaf(from_scenario("name"))),
                ("seed".into(), Node::Leaf(from_scenario("seed"))),
            ]),
        ),
        ("runs".into(), Node::Array(runs)),
    ]);
    let mut text = serde_json::to_string_pretty(&doc).map_err(|e| PlotError::Bad {
        path: dir.join("summary.csv"),
        line: None,
        msg: e.to_string(),
    })?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_find_their_place() {
        assert_eq!(place("ttft_p99_ms"), (Some("ttft_ms".into()), "p99".into()));
        assert_eq!(
            place("queue_mean_ms"),
            (Some("queue_ms".into()), "mean".into())
        );
        assert_eq!(
            place("reused_local_host_tokens"),
            (Some("reused_tokens".into()), "local_host".into())
        );
        assert_eq!(
            place("loaded_remote_ssd_bytes"),
            (Some("loaded_bytes".into()), "remote_ssd".into())
        );
        assert_eq!(place("duration_s"), (None, "duration_s".into()));
        assert_eq!(place("network_bytes"), (None, "network_bytes".into()));
        assert_eq!(place("x_ms"), (None, "x_ms".into()));
    }
}
