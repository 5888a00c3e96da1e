//! Reading a results folder back: `summary.csv`, `requests.csv` and `scenario.toml`.
//!
//! Plots and the report are made from these files alone, so `meshsim plot` can redo them
//! without the simulation. Columns are found by their header name, never by position, so
//! columns added later (such as a sweep's `point`) do not break older readers.
//!
//! For pipeline (generation-cache) results, those whose `scenario.toml` has a top-level
//! `[pipeline]` table, `requests.csv` also gives each completed request's output tokens per
//! second, `output_tokens / (end - arrival)` in seconds (`end - arrival` is the `e2e_ns`
//! column), grouped by policy and output length into medians ([`TpsSeries`]).

use std::path::Path;

use crate::hardware::network::{LinkKind, Purpose};
use crate::metrics::{RequestRecord, Tier};

use super::table::{NON_NEGATIVE, RATIO, Table};
use super::{Figure, PlotError};

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
    /// What the links carried, when the run modelled them (the link columns are present and
    /// filled).
    pub links: Option<LinkRow>,
    /// The GPU prefix cache's hit ratio, and the best any could have reached on the run's
    /// prompts, when the columns are there and filled.
    pub gpu_hit_ratio: Option<f64>,
    pub gpu_optimal_hit_ratio: Option<f64>,
}

/// The link columns of one row of `summary.csv` (see [`crate::metrics::write`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkRow {
    /// Per kind of link ([`LinkKind::ALL`] order): the bytes that crossed it (all purposes),
    /// the mean fraction of the run its links were busy, and its busiest link's.
    pub bytes: [u64; 7],
    pub busy: [f64; 7],
    pub busiest: [f64; 7],
    /// Bytes moved per purpose ([`Purpose::ALL`] order), once per transfer.
    pub moved: [u64; 5],
}

/// The columns of [`LinkRow`]'s figures, when `summary.csv` has all of them: per kind its
/// purposes' byte columns, busy and busiest; then the moved bytes' columns.
struct LinkColumns {
    bytes: Vec<[usize; 5]>,
    busy: Vec<[usize; 2]>,
    moved: [usize; 5],
}

impl LinkColumns {
    fn find(t: &Table) -> Option<LinkColumns> {
        let col = |name: String| t.optional_column(&name);
        let mut bytes = Vec::new();
        let mut busy = Vec::new();
        for k in LinkKind::ALL {
            let mut b = [0; 5];
            for (slot, p) in b.iter_mut().zip(Purpose::ALL) {
                *slot = col(format!("{}_{}_bytes", k.name(), p.name()))?;
            }
            bytes.push(b);
            busy.push([
                col(format!("{}_busy_ratio", k.name()))?,
                col(format!("{}_busiest_ratio", k.name()))?,
            ]);
        }
        let mut moved = [0; 5];
        for (slot, p) in moved.iter_mut().zip(Purpose::ALL) {
            *slot = col(format!("moved_{}_bytes", p.name()))?;
        }
        Some(LinkColumns { bytes, busy, moved })
    }

    /// The row's link figures; `None` when its link cells are empty (a live run).
    fn read(&self, t: &Table, rec: &csv::StringRecord) -> Result<Option<LinkRow>, PlotError> {
        if rec.get(self.moved[0]).is_none_or(str::is_empty) {
            return Ok(None);
        }
        let mut row = LinkRow::default();
        for k in 0..LinkKind::ALL.len() {
            for &col in &self.bytes[k] {
                let b: u64 = t.parse(rec, col, "a byte count")?;
                row.bytes[k] = row.bytes[k].saturating_add(b);
            }
            row.busy[k] = t.number(rec, self.busy[k][0], "a ratio", RATIO)?;
            row.busiest[k] = t.number(rec, self.busy[k][1], "a ratio", RATIO)?;
        }
        for (slot, &col) in row.moved.iter_mut().zip(&self.moved) {
            *slot = t.parse(rec, col, "a byte count")?;
        }
        Ok(Some(row))
    }
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

/// The median per-request output tokens per second of the completed requests of one output
/// length (or one range of lengths).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TpsPoint {
    /// The shortest output length in the group (equal to `to` unless lengths are binned).
    pub from: u32,
    /// The longest output length in the group: the point's x value.
    pub to: u32,
    /// The median of `output_tokens / (end - arrival)` (seconds) over the group's requests.
    pub median_tps: f64,
    /// How many completed requests the group holds.
    pub requests: usize,
}

impl TpsPoint {
    /// The output lengths of the point as text: `512`, or `257 to 512` for a bin.
    pub fn lengths(&self) -> String {
        if self.from == self.to {
            self.to.to_string()
        } else {
            format!("{} to {}", self.from, self.to)
        }
    }
}

/// Median per-request output tokens per second against output length, for one policy (and
/// one sweep point when something other than the output length is swept).
#[derive(Clone, Debug, PartialEq)]
pub struct TpsSeries {
    /// The `policy` column.
    pub policy: String,
    /// The sweep point without its `output_tokens=...` part; `None` when nothing else is
    /// swept.
    pub rest: Option<String>,
    /// One point per output length (or bin of lengths), by increasing length.
    pub points: Vec<TpsPoint>,
}

impl TpsSeries {
    /// The series' name on a chart or in the report: `policy`, or `policy @ rest`.
    pub fn label(&self) -> String {
        match &self.rest {
            Some(r) => format!("{} @ {r}", self.policy),
            None => self.policy.clone(),
        }
    }

    /// Completed requests over all points.
    pub fn requests(&self) -> usize {
        self.points.iter().map(|p| p.requests).sum()
    }
}

/// With more distinct output lengths than this in a results folder, lengths are grouped into
/// power-of-two bins (`(2^(k-1), 2^k]`), so each point still holds many requests.
pub const MAX_TPS_LENGTHS: usize = 16;

/// Groups per-request `(output tokens, tokens per second)` samples by output length and takes
/// the median of each group (the mean of the two middle values for an even count). With
/// `binned`, a length `n` falls in the bin `(n.next_power_of_two() / 2, n.next_power_of_two()]`.
/// Points come by increasing length.
pub fn median_tps_by_length(samples: &[(u32, f64)], binned: bool) -> Vec<TpsPoint> {
    let bin = |n: u32| {
        if binned {
            let to = n.checked_next_power_of_two().unwrap_or(u32::MAX);
            (if to <= 1 { to } else { to / 2 + 1 }, to)
        } else {
            (n, n)
        }
    };
    let mut sorted: Vec<(u32, u32, f64)> = samples
        .iter()
        .map(|&(n, tps)| {
            let (from, to) = bin(n);
            (from, to, tps)
        })
        .collect();
    sorted.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)));
    sorted
        .chunk_by(|a, b| a.1 == b.1)
        .map(|group| {
            let n = group.len();
            let median = if n % 2 == 1 {
                group[n / 2].2
            } else {
                (group[n / 2 - 1].2 + group[n / 2].2) / 2.0
            };
            TpsPoint {
                from: group[0].0,
                to: group[0].1,
                median_tps: median,
                requests: n,
            }
        })
        .collect()
}

/// Whether a scenario is a pipeline (generation-cache) scenario: it has a top-level
/// `[pipeline]` table.
pub fn is_pipeline(scenario: &toml::Value) -> bool {
    scenario.get("pipeline").is_some_and(toml::Value::is_table)
}

/// `dir/scenario.toml` parsed, when present and valid TOML.
pub(crate) fn read_scenario(dir: &Path) -> Option<toml::Value> {
    crate::text::read_capped_string(&dir.join("scenario.toml"), crate::text::MAX_CONFIG_BYTES)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .map(toml::Value::Table)
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
    /// For pipeline results ([`is_pipeline`]): median per-request output tokens per second
    /// against output length, one series per policy in order of first appearance in
    /// `requests.csv`. `None` for other results; the `tps_output` figure is drawn when `Some`.
    pub tps_output: Option<Vec<TpsSeries>>,
}

impl Latencies {
    /// The latencies of one run's completed requests, exactly as [`Results::load`] reads them
    /// from that run's rows of `requests.csv` (rows `ok`; TPOT where defined), sorted. `name`
    /// is what that reading names them ([`run_name`]). Logs, as reading does, how many
    /// completed requests have no TPOT.
    pub fn of_run(name: String, records: &[RequestRecord]) -> Latencies {
        let mut l = Latencies {
            policy: name,
            ..Latencies::default()
        };
        let mut no_tpot = 0u64;
        for r in records {
            if r.status() != "ok" {
                continue;
            }
            let Some(ttft) = r.ttft() else { continue };
            l.ttft_ms.push(ttft.0 as f64 / 1e6);
            match r.tpot() {
                Some(t) => l.tpot_ms.push(t.0 as f64 / 1e6),
                None => no_tpot += 1,
            }
        }
        if no_tpot > 0 {
            tracing::info!(
                run = %l.policy,
                requests = no_tpot,
                "completed requests without a TPOT (one output token) are left out of tpot_cdf"
            );
        }
        l.ttft_ms.sort_by(f64::total_cmp);
        l.tpot_ms.sort_by(f64::total_cmp);
        l
    }
}

/// What [`Results::load`] names the latencies of a run's rows: its policy, and ` @ point`
/// when the rows have a `point` column (`swept`).
pub fn run_name(swept: bool, point: Option<&str>, policy: &str) -> String {
    if swept {
        format!("{policy} @ {}", point.unwrap_or(""))
    } else {
        policy.to_string()
    }
}

impl Results {
    /// [`Results::load`] for a folder whose `requests.csv` was just written from runs still
    /// in memory: their latencies are given (each run's [`Latencies::of_run`], in the order of
    /// its rows) instead of read back from the rows, which gives the same results in a
    /// fraction of the time (at a million requests per policy, reading the rows back costs
    /// more than drawing). Pipeline results, whose TPS series come from the rows too, are
    /// read from the files.
    pub fn load_with(dir: &Path, runs: Vec<Latencies>) -> Result<Results, PlotError> {
        let scenario = read_scenario(dir);
        if scenario.as_ref().is_some_and(is_pipeline) {
            return Results::load(dir);
        }
        let summary = read_summary(&dir.join("summary.csv"))?;
        // As reading does: rows of one name go together, in order of first appearance.
        let mut latencies: Vec<Latencies> = Vec::new();
        for run in runs {
            match latencies.iter_mut().rev().find(|l| l.policy == run.policy) {
                Some(l) => {
                    l.ttft_ms.extend(run.ttft_ms);
                    l.tpot_ms.extend(run.tpot_ms);
                    l.ttft_ms.sort_by(f64::total_cmp);
                    l.tpot_ms.sort_by(f64::total_cmp);
                }
                None => latencies.push(run),
            }
        }
        Ok(Results {
            summary,
            latencies,
            scenario,
            tps_output: None,
        })
    }

    /// Reads `summary.csv`, `requests.csv` and (optionally) `scenario.toml` from `dir`.
    pub fn load(dir: &Path) -> Result<Results, PlotError> {
        if !dir.is_dir() {
            return Err(PlotError::Read {
                path: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such results folder"),
            });
        }
        let summary = read_summary(&dir.join("summary.csv"))?;
        let scenario = read_scenario(dir);
        let pipeline = scenario.as_ref().is_some_and(is_pipeline);
        let (latencies, tps_output) = read_requests(&dir.join("requests.csv"), pipeline)?;
        Ok(Results {
            summary,
            latencies,
            scenario,
            tps_output,
        })
    }

    /// The figures drawn for these results: [`Figure::ALL`], then [`Figure::TpsOutput`] for
    /// pipeline results.
    pub fn figures(&self) -> Vec<Figure> {
        figures(self.tps_output.is_some())
    }
}

/// The figures drawn for pipeline or other results. Pipeline routes have no prefix store, so
/// their results get no `prefix_hits` figure.
pub(crate) fn figures(pipeline: bool) -> Vec<Figure> {
    let mut v = Figure::ALL.to_vec();
    if pipeline {
        v.retain(|f| *f != Figure::PrefixHits);
        v.push(Figure::TpsOutput);
    }
    v
}

fn read_summary(path: &Path) -> Result<Vec<SummaryRow>, PlotError> {
    let t = Table::open(path)?;
    let mut reader = t.rows();
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
    let link_columns = LinkColumns::find(&t);
    let gpu_hit = t.optional_column("gpu_hit_ratio");
    let gpu_optimal = t.optional_column("gpu_optimal_hit_ratio");
    let mut rows = Vec::new();
    let mut rec = csv::StringRecord::new();
    while reader.read_record(&mut rec).map_err(|e| t.csv_error(e))? {
        let links = match &link_columns {
            Some(c) => c.read(&t, &rec)?,
            None => None,
        };
        let ratio = |col: Option<usize>| -> Result<Option<f64>, PlotError> {
            match col {
                Some(col) if rec.get(col).is_some_and(|c| !c.is_empty()) => {
                    Ok(Some(t.number(&rec, col, "a ratio", RATIO)?))
                }
                _ => Ok(None),
            }
        };
        let (gpu_hit_ratio, gpu_optimal_hit_ratio) = (ratio(gpu_hit)?, ratio(gpu_optimal)?);
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
        // Columns no chart reads are still numbers a run writes: finite and not negative,
        // ratios at most 1. An empty cell is a value that does not exist (none is plotted).
        for (col, name) in t.header.iter().enumerate() {
            if name == "policy" || name == "point" || rec.get(col).is_none_or(str::is_empty) {
                continue;
            }
            let range = if name.ends_with("_ratio") {
                RATIO
            } else {
                NON_NEGATIVE
            };
            t.number(&rec, col, "a number a run writes", range)?;
        }
        let ms = |col| t.number(&rec, col, "milliseconds", NON_NEGATIVE);
        let requests: u64 = t.parse(&rec, requests, "a request count")?;
        let done: u64 = t.parse(&rec, completed, "a request count")?;
        if done > requests {
            let what = format!("at most the `requests` column ({requests})");
            return Err(t.bad_value(&rec, completed, &what));
        }
        rows.push(SummaryRow {
            policy: rec.get(policy).unwrap_or("").to_string(),
            point: point.map(|col| rec.get(col).unwrap_or("").to_string()),
            requests,
            completed: done,
            throughput_rps: t.number(&rec, rps, "requests per second", NON_NEGATIVE)?,
            output_tokens_per_s: t.number(&rec, tps, "tokens per second", NON_NEGATIVE)?,
            ttft_p50_ms: ms(ttft_p50)?,
            ttft_p99_ms: ms(ttft_p99)?,
            tpot_p50_ms: ms(tpot_p50)?,
            e2e_p50_ms: ms(e2e_p50)?,
            prefix_hit_ratio: t.number(&rec, hit, "a ratio", RATIO)?,
            reused_tokens,
            loaded_bytes,
            links,
            gpu_hit_ratio,
            gpu_optimal_hit_ratio,
        });
        if rows.last().is_some_and(|r| r.policy.is_empty()) {
            return Err(t.bad(t.line(&rec), "empty policy name".into()));
        }
    }
    if rows.is_empty() {
        return Err(t.bad(None, "no rows: expected one row per policy".into()));
    }
    Ok(rows)
}

/// The sweep point `point` without its `output_tokens=...` part (points are `key=value`
/// parts joined by spaces); `None` when nothing is left.
fn point_rest(point: &str) -> Option<String> {
    let rest: Vec<&str> = point
        .split(' ')
        .filter(|part| {
            !part.is_empty() && part.split_once('=').map(|(k, _)| k) != Some("output_tokens")
        })
        .collect();
    (!rest.is_empty()).then(|| rest.join(" "))
}

/// Per-request `(output tokens, tokens per second)` samples of one policy (and point rest).
type TpsSamples = ((String, Option<String>), Vec<(u32, f64)>);

/// Reads `requests.csv`: latencies per policy, and with `pipeline`, the TPS series.
fn read_requests(
    path: &Path,
    pipeline: bool,
) -> Result<(Vec<Latencies>, Option<Vec<TpsSeries>>), PlotError> {
    let t = Table::open(path)?;
    let mut reader = t.rows();
    let policy = t.column("policy")?;
    let point = t.optional_column("point");
    let status = t.column("status")?;
    let ttft = t.column("ttft_ns")?;
    let tpot = t.column("tpot_ns")?;
    let tps_columns = if pipeline {
        Some((t.column("output_tokens")?, t.column("e2e_ns")?))
    } else {
        None
    };
    let mut tps: Vec<TpsSamples> = Vec::new();
    let mut out: Vec<Latencies> = Vec::new();
    // Completed requests without a TPOT (one output token: undefined), left out of `tpot_cdf`.
    let mut no_tpot = 0u64;
    let mut rec = csv::StringRecord::new();
    while reader.read_record(&mut rec).map_err(|e| t.csv_error(e))? {
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
        let ttft_ns: u64 = t.parse(&rec, ttft, "a whole number of nanoseconds")?;
        out[i].ttft_ms.push(ttft_ns as f64 / 1e6);
        // TPOT is empty for one-token outputs (undefined).
        if rec.get(tpot).is_some_and(|s| !s.is_empty()) {
            let tpot_ns: u64 = t.parse(&rec, tpot, "a whole number of nanoseconds")?;
            out[i].tpot_ms.push(tpot_ns as f64 / 1e6);
        } else {
            no_tpot += 1;
        }
        if let Some((tokens, e2e)) = tps_columns {
            let key = (
                rec.get(policy).unwrap_or("").to_string(),
                point.and_then(|col| point_rest(rec.get(col).unwrap_or(""))),
            );
            let tokens: u32 = t.parse(&rec, tokens, "a token count")?;
            let e2e_ns: u64 = t.parse(&rec, e2e, "a whole number of nanoseconds")?;
            // A request without output or without duration has no rate.
            if tokens > 0 && e2e_ns > 0 {
                let sample = (tokens, tokens as f64 / (e2e_ns as f64 / 1e9));
                match tps.iter().rposition(|(k, _)| *k == key) {
                    Some(j) => tps[j].1.push(sample),
                    None => tps.push((key, vec![sample])),
                }
            }
        }
    }
    if no_tpot > 0 {
        tracing::info!(
            file = %path.display(),
            requests = no_tpot,
            "completed requests without a TPOT (an empty `tpot_ns`: one output token) are left \
             out of tpot_cdf"
        );
    }
    for l in &mut out {
        l.ttft_ms.sort_by(f64::total_cmp);
        l.tpot_ms.sort_by(f64::total_cmp);
    }
    let tps_output = tps_columns.map(|_| {
        let mut lengths: Vec<u32> = tps
            .iter()
            .flat_map(|(_, s)| s.iter().map(|x| x.0))
            .collect();
        lengths.sort_unstable();
        lengths.dedup();
        let binned = lengths.len() > MAX_TPS_LENGTHS;
        tps.into_iter()
            .map(|((policy, rest), samples)| TpsSeries {
                policy,
                rest,
                points: median_tps_by_length(&samples, binned),
            })
            .collect()
    });
    Ok((out, tps_output))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tps_is_grouped_by_output_length_with_medians() {
        let samples = [
            (64, 10.0),
            (512, 3.0),
            (64, 30.0),
            (128, 7.0),
            (64, 20.0),
            (512, 1.0),
        ];
        let p = median_tps_by_length(&samples, false);
        let point = |n, median_tps, requests| TpsPoint {
            from: n,
            to: n,
            median_tps,
            requests,
        };
        assert_eq!(
            p,
            vec![point(64, 20.0, 3), point(128, 7.0, 1), point(512, 2.0, 2)]
        );
        assert!(median_tps_by_length(&[], false).is_empty());
        // Binned: 100 and 128 share (64, 128]; 1 is alone in [1, 1].
        let b = median_tps_by_length(&[(100, 4.0), (128, 8.0), (1, 5.0)], true);
        assert_eq!(
            b,
            vec![
                point(1, 5.0, 1),
                TpsPoint {
                    from: 65,
                    to: 128,
                    median_tps: 6.0,
                    requests: 2
                }
            ]
        );
        assert_eq!(b[1].lengths(), "65 to 128");
        assert_eq!(b[0].lengths(), "1");
    }

    #[test]
    fn the_output_length_is_taken_out_of_sweep_points() {
        assert_eq!(point_rest("output_tokens=64"), None);
        assert_eq!(
            point_rest("stages=2 output_tokens=64"),
            Some("stages=2".to_string())
        );
        assert_eq!(point_rest(""), None);
        assert_eq!(point_rest("rate=3"), Some("rate=3".to_string()));
    }
}
