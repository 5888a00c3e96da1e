//! `[sweep]`: a scenario file that varies up to [`super::MAX_SWEEP_AXES`] axes is expanded
//! into one text per combination of values (the first axis varies slowest), each validated as
//! a whole scenario by its system; errors inside a point name the swept key and value where
//! the file writes them. An axis is one key (`"workload.context_tokens" = [1024, 2048]`) or
//! several keys set together (`"hardware.nodes & workload.arrival_rate_per_s" = [[2, 8.0],
//! [4, 16.0]]`: weak scaling), each value then a list of one value per key.

use std::collections::BTreeMap;
use std::ops::Range;

use super::{MAX_SWEEP_AXES, MAX_SWEEP_POINTS, ScenarioError, line_col};

/// Most keys one axis may set together (`"a & b & c"`).
pub(crate) const MAX_TIED_KEYS: usize = 8;

/// One point of a `[sweep]`: its label, its scenario text and its swept values.
pub(crate) struct SweepText {
    /// `key=value` for each swept key (last path segment), space-separated.
    pub(crate) label: String,
    /// The scenario of the point, without the `[sweep]` table.
    pub(crate) text: String,
    /// The point's value of each swept key.
    values: Vec<SweptValue>,
}

/// A swept key's value at one point, as the scenario file writes it.
struct SweptValue {
    key: String,
    /// The value's text in the file (`2048`, `"round-robin"`).
    written: String,
    /// Its line and column in the file.
    at: Option<(usize, usize)>,
}

impl SweepText {
    /// `e`, an error in this point's scenario, placed in the scenario file `file`: at the
    /// swept value of the key it names (or the point's first value; the point's own text is
    /// in no file), and naming the point's keys and values as written.
    pub(crate) fn locate(&self, file: &str, e: ScenarioError) -> ScenarioError {
        let related = |k: &str| {
            !e.key.is_empty()
                && (e.key == k
                    || e.key.starts_with(&format!("{k}."))
                    || k.starts_with(&format!("{}.", e.key)))
        };
        let at = self
            .values
            .iter()
            .find(|v| related(&v.key))
            .or(self.values.first());
        let written: Vec<String> = self
            .values
            .iter()
            .map(|v| format!("\"{}\" = {}", v.key, v.written))
            .collect();
        ScenarioError {
            line_col: if e.file == file {
                at.and_then(|v| v.at)
            } else {
                e.line_col
            },
            message: format!(
                "{} (sweep point {}: {})",
                e.message,
                self.label,
                written.join(", ")
            ),
            ..e
        }
    }
}

/// The byte range in `text` of each value of each `[sweep]` list, by key; empty when the
/// table is not a table of lists.
fn sweep_spans(text: &str) -> BTreeMap<String, Vec<Range<usize>>> {
    #[derive(serde::Deserialize)]
    struct File {
        sweep: Option<BTreeMap<String, Vec<toml::Spanned<toml::Value>>>>,
    }
    toml::from_str::<File>(text)
        .ok()
        .and_then(|f| f.sweep)
        .map(|s| {
            s.into_iter()
                .map(|(k, v)| (k, v.iter().map(toml::Spanned::span).collect()))
                .collect()
        })
        .unwrap_or_default()
}

/// The points of a `[sweep]` table: every combination of the listed values (the first key
/// varies slowest) applied to the file's other keys, with the `[sweep]` table removed. Any
/// kind of scenario validates the texts itself. A value listed twice for one key is an error
/// (two points would have one label).
pub(crate) fn sweep_texts(
    file: &str,
    text: &str,
    sweep: &toml::Table,
) -> Result<Vec<SweepText>, ScenarioError> {
    let spans = sweep_spans(text);
    // The value `i` of `key` as written in the file, and its line and column.
    let written = |key: &str, i: usize, v: &toml::Value| match spans.get(key).and_then(|s| s.get(i))
    {
        Some(r) => (
            text[r.clone()].trim().to_string(),
            Some(line_col(text, r.start)),
        ),
        None => (v.to_string(), None),
    };
    let err = |key: &str, message: String| ScenarioError {
        file: file.to_string(),
        key: if key.is_empty() {
            "sweep".to_string()
        } else {
            format!("sweep.\"{key}\"")
        },
        message,
        line_col: None,
    };
    if sweep.is_empty() || sweep.len() > MAX_SWEEP_AXES {
        return Err(err(
            "",
            format!(
                "expected 1 to {MAX_SWEEP_AXES} keys to sweep, found {}",
                sweep.len()
            ),
        ));
    }
    let shown = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    // (axis key as written, its keys, its values): a key `"a.b & c.d"` sets several keys
    // together, each value a list of one value per key.
    let mut axes: Vec<(&str, Vec<&str>, &Vec<toml::Value>)> = Vec::new();
    for (key, values) in sweep {
        let keys: Vec<&str> = key.split('&').map(str::trim).collect();
        if keys.iter().any(|k| k.is_empty()) {
            return Err(err(
                key,
                "expected keys joined by `&`, found an empty one".into(),
            ));
        }
        if keys.len() > MAX_TIED_KEYS {
            return Err(err(
                key,
                format!(
                    "expected at most {MAX_TIED_KEYS} keys swept together, found {}",
                    keys.len()
                ),
            ));
        }
        match values {
            toml::Value::Array(v) if !v.is_empty() => {
                if keys.len() > 1 {
                    for (i, value) in v.iter().enumerate() {
                        let fits = matches!(value, toml::Value::Array(a) if a.len() == keys.len());
                        if !fits {
                            let (w, at) = written(key, i, value);
                            return Err(ScenarioError {
                                line_col: at,
                                ..err(
                                    key,
                                    format!(
                                        "expected a list of {} values (one for each of {}), found \
                                         {w}",
                                        keys.len(),
                                        keys.join(", ")
                                    ),
                                )
                            });
                        }
                    }
                }
                axes.push((key, keys, v));
            }
            _ => {
                return Err(err(key, "expected a non-empty list of values".into()));
            }
        }
    }
    // The keys a point sets and their values: one for a plain axis, several for a tied one.
    let pairs = |keys: &[&str], v: &toml::Value| -> Vec<(String, toml::Value)> {
        match (keys.len(), v) {
            (1, _) => vec![(keys[0].to_string(), v.clone())],
            (_, toml::Value::Array(a)) => keys
                .iter()
                .zip(a)
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            _ => unreachable!("tied values were checked to be lists"),
        }
    };
    let label_of = |keys: &[&str], v: &toml::Value| -> String {
        pairs(keys, v)
            .iter()
            .map(|(k, v)| format!("{}={}", k.rsplit('.').next().unwrap_or(k), shown(v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (key, keys, values) in &axes {
        for (i, v) in values.iter().enumerate() {
            if let Some(first) = values[..i].iter().position(|u| shown(u) == shown(v)) {
                let (again, at) = written(key, i, v);
                let (before, _) = written(key, first, &values[first]);
                let before = if before == again {
                    String::new()
                } else {
                    format!(" (as {before} before it)")
                };
                return Err(ScenarioError {
                    line_col: at,
                    ..err(
                        key,
                        format!(
                            "{again} is listed twice{before}: the label `{}` would name two \
                             points",
                            label_of(keys, v)
                        ),
                    )
                });
            }
        }
    }
    let total: usize = axes.iter().map(|(_, _, v)| v.len()).product();
    if total > MAX_SWEEP_POINTS {
        return Err(err(
            "",
            format!("{total} points; at most {MAX_SWEEP_POINTS} are allowed"),
        ));
    }
    let mut base: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| err("", e.message().to_string()))?;
    base.remove("sweep");
    let mut points = Vec::with_capacity(total);
    for i in 0..total {
        let mut t = base.clone();
        let mut label = Vec::new();
        let mut values = Vec::new();
        let mut rest = i;
        for (key, keys, list) in axes.iter().rev() {
            let j = rest % list.len();
            let v = &list[j];
            rest /= list.len();
            let (written, at) = written(key, j, v);
            // Pushed in reverse, so that the reversal below puts a tied axis's keys in order.
            for (k, value) in pairs(keys, v).into_iter().rev() {
                set_path(&mut t, &k, value).map_err(|m| err(key, m))?;
                values.push(SweptValue {
                    key: k,
                    written: written.clone(),
                    at,
                });
            }
            label.push(label_of(keys, v));
        }
        label.reverse();
        values.reverse();
        let point_text = toml::to_string(&t).map_err(|e| err("", e.to_string()))?;
        points.push(SweepText {
            label: label.join(" "),
            text: point_text,
            values,
        });
    }
    Ok(points)
}

/// Sets the dotted `path` in `t` to `v`, creating missing tables.
fn set_path(t: &mut toml::Table, path: &str, v: toml::Value) -> Result<(), String> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().filter(|l| !l.is_empty()).ok_or("empty key")?;
    let mut cur = t;
    for p in parts {
        let next = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match next {
            toml::Value::Table(t) => t,
            _ => return Err(format!("`{p}` is not a table")),
        };
    }
    cur.insert(last.to_string(), v);
    Ok(())
}
