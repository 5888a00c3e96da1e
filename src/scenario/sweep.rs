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
    let sw = Sweep {
        file,
        text,
        spans: sweep_spans(text),
    };
    if sweep.is_empty() || sweep.len() > MAX_SWEEP_AXES {
        return Err(sw.err(
            "",
            format!(
                "expected 1 to {MAX_SWEEP_AXES} keys to sweep, found {}",
                sweep.len()
            ),
        ));
    }
    let axes = sweep
        .iter()
        .map(|(key, values)| sw.axis(key, values))
        .collect::<Result<Vec<Axis<'_>>, ScenarioError>>()?;
    for axis in &axes {
        sw.check_repeats(axis)?;
    }
    let total: usize = axes.iter().map(|a| a.values.len()).product();
    if total > MAX_SWEEP_POINTS {
        return Err(sw.err(
            "",
            format!("{total} points; at most {MAX_SWEEP_POINTS} are allowed"),
        ));
    }
    let mut base: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| sw.err("", e.message().to_string()))?;
    base.remove("sweep");
    (0..total).map(|i| sw.point(&base, &axes, i)).collect()
}

/// One axis of a sweep: a key `"a.b & c.d"` sets several keys together, each value then a
/// list of one value per key.
struct Axis<'a> {
    /// The axis's key as written.
    key: &'a str,
    /// The keys it sets.
    keys: Vec<&'a str>,
    values: &'a [toml::Value],
}

/// A scenario file with a `[sweep]` table, and where its swept values are written.
struct Sweep<'a> {
    file: &'a str,
    text: &'a str,
    spans: BTreeMap<String, Vec<Range<usize>>>,
}

impl Sweep<'_> {
    /// An error at `[sweep]` key `key` (the table itself when empty).
    fn err(&self, key: &str, message: String) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            key: if key.is_empty() {
                "sweep".to_string()
            } else {
                format!("sweep.\"{key}\"")
            },
            message,
            line_col: None,
        }
    }

    /// The value `i` of `key` as written in the file, and its line and column.
    fn written(&self, key: &str, i: usize, v: &toml::Value) -> (String, Option<(usize, usize)>) {
        match self.spans.get(key).and_then(|s| s.get(i)) {
            Some(r) => (
                self.text[r.clone()].trim().to_string(),
                Some(line_col(self.text, r.start)),
            ),
            None => (v.to_string(), None),
        }
    }

    /// The axis of `[sweep]` key `key` with its `values`: keys joined by `&`, at most
    /// [`MAX_TIED_KEYS`] of them, and a non-empty list of values (each a list of one value per
    /// key when there are several keys).
    fn axis<'v>(&self, key: &'v str, values: &'v toml::Value) -> Result<Axis<'v>, ScenarioError> {
        let keys: Vec<&str> = key.split('&').map(str::trim).collect();
        if keys.iter().any(|k| k.is_empty()) {
            return Err(self.err(
                key,
                "expected keys joined by `&`, found an empty one".into(),
            ));
        }
        if keys.len() > MAX_TIED_KEYS {
            return Err(self.err(
                key,
                format!(
                    "expected at most {MAX_TIED_KEYS} keys swept together, found {}",
                    keys.len()
                ),
            ));
        }
        let toml::Value::Array(v) = values else {
            return Err(self.err(key, "expected a non-empty list of values".into()));
        };
        if v.is_empty() {
            return Err(self.err(key, "expected a non-empty list of values".into()));
        }
        if keys.len() > 1 {
            for (i, value) in v.iter().enumerate() {
                let fits = matches!(value, toml::Value::Array(a) if a.len() == keys.len());
                if !fits {
                    let (w, at) = self.written(key, i, value);
                    return Err(ScenarioError {
                        line_col: at,
                        ..self.err(
                            key,
                            format!(
                                "expected a list of {} values (one for each of {}), found {w}",
                                keys.len(),
                                keys.join(", ")
                            ),
                        )
                    });
                }
            }
        }
        Ok(Axis {
            key,
            keys,
            values: v,
        })
    }

    /// Refuses a value that `axis` lists twice (as shown in labels): two points would have
    /// one label.
    fn check_repeats(&self, axis: &Axis<'_>) -> Result<(), ScenarioError> {
        let (key, values) = (axis.key, axis.values);
        for (i, v) in values.iter().enumerate() {
            if let Some(first) = values[..i].iter().position(|u| shown(u) == shown(v)) {
                let (again, at) = self.written(key, i, v);
                let (before, _) = self.written(key, first, &values[first]);
                let before = if before == again {
                    String::new()
                } else {
                    format!(" (as {before} before it)")
                };
                return Err(ScenarioError {
                    line_col: at,
                    ..self.err(
                        key,
                        format!(
                            "{again} is listed twice{before}: the label `{}` would name two \
                             points",
                            label_of(&axis.keys, v)
                        ),
                    )
                });
            }
        }
        Ok(())
    }

    /// Point `i` of the sweep over `axes` (the last axis varies fastest): `base` with the
    /// point's values set.
    fn point(
        &self,
        base: &toml::Table,
        axes: &[Axis<'_>],
        i: usize,
    ) -> Result<SweepText, ScenarioError> {
        let mut t = base.clone();
        let mut label = Vec::new();
        let mut values = Vec::new();
        let mut rest = i;
        for Axis {
            key,
            keys,
            values: list,
        } in axes.iter().rev()
        {
            let j = rest % list.len();
            let v = &list[j];
            rest /= list.len();
            let (written, at) = self.written(key, j, v);
            // Pushed in reverse, so that the reversal below puts a tied axis's keys in order.
            for (k, value) in pairs(keys, v).into_iter().rev() {
                set_path(&mut t, &k, value).map_err(|m| self.err(key, m))?;
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
        let point_text = toml::to_string(&t).map_err(|e| self.err("", e.to_string()))?;
        Ok(SweepText {
            label: label.join(" "),
            text: point_text,
            values,
        })
    }
}

/// A swept value as a label shows it: a string without its quotes, anything else as TOML.
fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The keys a point sets and their values: one for a plain axis, several for a tied one.
fn pairs(keys: &[&str], v: &toml::Value) -> Vec<(String, toml::Value)> {
    match (keys.len(), v) {
        (1, _) => vec![(keys[0].to_string(), v.clone())],
        (_, toml::Value::Array(a)) => keys
            .iter()
            .zip(a)
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        _ => unreachable!("tied values were checked to be lists"),
    }
}

/// The label part of value `v` of an axis setting `keys`: `key=value` for each key (last path
/// segment), space-separated.
fn label_of(keys: &[&str], v: &toml::Value) -> String {
    pairs(keys, v)
        .iter()
        .map(|(k, v)| format!("{}={}", k.rsplit('.').next().unwrap_or(k), shown(v)))
        .collect::<Vec<_>>()
        .join(" ")
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
