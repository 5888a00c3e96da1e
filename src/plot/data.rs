//! Reading a results folder back: `summary.csv`, `requests.csv` and `scenario.toml`.
//!
//! Plots and the report are made from these files alone, so `meshsim plot` can redo them
//! without the simulation. Columns are found by their header name, never by position, so
//! columns added later (such as a sweep's `point`) do not break older readers.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::policy::Tier;

use super::PlotError;

/// One row of `summary.csv`: the figures the charts and the report use.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub policy: String,
    /// The sweep point of this row (the optional `point` column); `None` for a single run.
    /// Charts label a row `policy @ point` when it is present.
    pub point: Option<String>,
    pub requests: u64,
    pub completed: u64,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub tpot_p50_ms: f64,
    pub e2e_p50_ms: f64,
    pub prefix_hit_ratio: f64,
    /// Reused prompt tokens per tier, in [`Tier::ALL`] order.
    pub reused_tokens: [u64; Tier::ALL.len()],
    /// KV bytes loaded from each store tier (`loaded_<tier>_bytes`, zero when absent), in
    /// [`Tier::ALL`] order without the GPU.
    pub loaded_bytes: [u64; Tier::ALL.len() - 1],
}

impl SummaryRow {
    /// The label of this row on a chart's axis or in a table.
    pub fn label(&self) -> String {
        match &self.point {
            Some(p) => format!("{} @ {p}", self.policy),
            None => self.policy.clone(),
        }
    }
}

/// Latencies of one policy's completed requests, in milliseconds, sorted ascending.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Latencies {
    pub policy: String,
    pub ttft_ms: Vec<f64>,
    pub tpot_ms: Vec<f64>,
}

/// Everything a results folder holds that plots and the report need.
#[derive(Clone, Debug)]
pub struct Results {
    /// Rows of `summary.csv` in file order.
    pub summary: Vec<SummaryRow>,
    /// One entry per policy of `requests.csv`, in order of first appearance.
    pub latencies: Vec<Latencies>,
    /// `scenario.toml`, when present and valid TOML (the report tolerates its absence).
    pub scenario: Option<toml::Value>,
}

impl Results {
    /// Reads `summary.csv`, `requests.csv` and (optionally) `scenario.toml` from `dir`.
    pub fn load(dir: &Path) -> Result<Results, PlotError> {
        if !dir.is_dir() {
            return Err(PlotError::Read {
                path: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such results folder"),
            });
        }
        let summary = read_summary(&dir.join("summary.csv"))?;
        let latencies = read_requests(&dir.join("requests.csv"))?;
        let scenario = std::fs::read_to_string(dir.join("scenario.toml"))
            .ok()
            .and_then(|t| t.parse::<toml::Table>().ok())
            .map(toml::Value::Table);
        Ok(Results {
            summary,
            latencies,
            scenario,
        })
    }
}

/// A CSV file being read: its path and its header, to find columns and name errors.
struct Table {
    path: PathBuf,
    header: csv::StringRecord,
}

impl Table {
    fn open(path: &Path) -> Result<(Table, csv::Reader<std::fs::File>), PlotError> {
        let file = std::fs::File::open(path).map_err(|source| PlotError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = csv::Reader::from_reader(file);
        let header = reader.headers().map_err(|e| csv_error(path, e))?.clone();
        Ok((
            Table {
                path: path.to_path_buf(),
                header,
            },
            reader,
        ))
    }

    fn bad(&self, line: Option<u64>, msg: String) -> PlotError {
        PlotError::Bad {
            path: self.path.clone(),
            line,
            msg,
        }
    }

    fn column(&self, name: &str) -> Result<usize, PlotError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| self.bad(Some(1), format!("missing column `{name}`")))
    }

    fn optional_column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    fn parse<T: FromStr>(
        &self,
        rec: &csv::StringRecord,
        col: usize,
        what: &str,
    ) -> Result<T, PlotError> {
        let raw = rec.get(col).unwrap_or("");
        raw.trim().parse().map_err(|_| {
            self.bad(
                rec.position().map(|p| p.line()),
                format!(
                    "column `{}`: expected {what}, found `{raw}`",
                    &self.header[col]
                ),
            )
        })
    }
}

fn csv_error(path: &Path, e: csv::Error) -> PlotError {
    let line = e.position().map(|p| p.line());
    let msg = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("expected {expected_len} fields, found {len}"),
        csv::ErrorKind::Utf8 { .. } => "invalid UTF-8".to_string(),
        _ => e.to_string(),
    };
    PlotError::Bad {
        path: path.to_path_buf(),
        line,
        msg,
    }
}

fn read_summary(path: &Path) -> Result<Vec<SummaryRow>, PlotError> {
    let (t, mut reader) = Table::open(path)?;
    let c = |name: &str| t.column(name);
    let policy = c("policy")?;
    let point = t.optional_column("point");
    let requests = c("requests")?;
    let completed = c("completed")?;
    let rps = c("throughput_rps")?;
    let tps = c("output_tokens_per_s")?;
    let ttft_p50 = c("ttft_p50_ms")?;
    let ttft_p99 = c("ttft_p99_ms")?;
    let tpot_p50 = c("tpot_p50_ms")?;
    let e2e_p50 = c("e2e_p50_ms")?;
    let hit = c("prefix_hit_ratio")?;
    let tiers = Tier::ALL
        .iter()
        .map(|tier| c(&format!("reused_{}_tokens", tier.name())))
        .collect::<Result<Vec<usize>, PlotError>>()?;
    let loaded: Vec<Option<usize>> = Tier::ALL[1..]
        .iter()
        .map(|tier| t.optional_column(&format!("loaded_{}_bytes", tier.name())))
        .collect();
    let mut rows = Vec::new();
    let mut rec = csv::StringRecord::new();
    while reader
        .read_record(&mut rec)
        .map_err(|e| csv_error(path, e))?
    {
        let mut reused_tokens = [0u64; Tier::ALL.len()];
        for (slot, &col) in reused_tokens.iter_mut().zip(&tiers) {
            *slot = t.parse(&rec, col, "a token count")?;
        }
        let mut loaded_bytes = [0u64; Tier::ALL.len() - 1];
        for (slot, col) in loaded_bytes.iter_mut().zip(&loaded) {
            if let Some(col) = *col {
                *slot = t.parse(&rec, col, "a byte count")?;
            }
        }
        let ms = |col| t.parse::<f64>(&rec, col, "milliseconds");
        rows.push(SummaryRow {
            policy: rec.get(policy).unwrap_or("").to_string(),
            point: point.map(|col| rec.get(col).unwrap_or("").to_string()),
            requests: t.parse(&rec, requests, "a request count")?,
            completed: t.parse(&rec, completed, "a request count")?,
            throughput_rps: t.parse(&rec, rps, "requests per second")?,
            output_tokens_per_s: t.parse(&rec, tps, "tokens per second")?,
            ttft_p50_ms: ms(ttft_p50)?,
            ttft_p99_ms: ms(ttft_p99)?,
            tpot_p50_ms: ms(tpot_p50)?,
            e2e_p50_ms: ms(e2e_p50)?,
            prefix_hit_ratio: t.parse(&rec, hit, "a ratio")?,
            reused_tokens,
            loaded_bytes,
        });
        if rows.last().is_some_and(|r| r.policy.is_empty()) {
            return Err(t.bad(rec.position().map(|p| p.line()), "empty policy name".into()));
        }
    }
    if rows.is_empty() {
        return Err(t.bad(None, "no rows: expected one row per policy".into()));
    }
    Ok(rows)
}

fn read_requests(path: &Path) -> Result<Vec<Latencies>, PlotError> {
    let (t, mut reader) = Table::open(path)?;
    let policy = t.column("policy")?;
    let point = t.optional_column("point");
    let status = t.column("status")?;
    let ttft = t.column("ttft_ns")?;
    let tpot = t.column("tpot_ns")?;
    let mut out: Vec<Latencies> = Vec::new();
    let mut rec = csv::StringRecord::new();
    while reader
        .read_record(&mut rec)
        .map_err(|e| csv_error(path, e))?
    {
        let name = match point {
            Some(col) => format!(
                "{} @ {}",
                rec.get(policy).unwrap_or(""),
                rec.get(col).unwrap_or("")
            ),
            None => rec.get(policy).unwrap_or("").to_string(),
        };
        // Consecutive rows almost always share a policy: look at the last entry first.
        let i = match out.iter().rposition(|l| l.policy == name) {
            Some(i) => i,
            None => {
                out.push(Latencies {
                    policy: name.to_string(),
                    ..Latencies::default()
                });
                out.len() - 1
            }
        };
        if rec.get(status) != Some("ok") {
            continue;
        }
        let ttft_ns: u64 = t.parse(&rec, ttft, "nanoseconds")?;
        out[i].ttft_ms.push(ttft_ns as f64 / 1e6);
        // TPOT is empty for one-token outputs (undefined).
        if rec.get(tpot).is_some_and(|s| !s.is_empty()) {
            let tpot_ns: u64 = t.parse(&rec, tpot, "nanoseconds")?;
            out[i].tpot_ms.push(tpot_ns as f64 / 1e6);
        }
    }
    for l in &mut out {
        l.ttft_ms.sort_by(f64::total_cmp);
        l.tpot_ms.sort_by(f64::total_cmp);
    }
    Ok(out)
}
