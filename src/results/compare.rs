//! How far a simulation is from a live run of the same scenario.
//!
//! `meshsim compare SIM_DIR LIVE_DIR` reads the `requests.csv` of both results folders,
//! matches requests by (sweep point, policy, request id), and reports per point and policy:
//!
//! * TTFT and TPOT p50 and p99 (nearest rank) of each run and the signed error of the
//!   simulation, `(sim - live) / live`;
//! * the mean absolute per-request TTFT error, `mean |sim_i - live_i| / live_i`, which also
//!   catches errors that cancel out in the percentiles;
//! * when both files have `arrival_ns` and `e2e_ns`: the throughput of each run over the
//!   compared requests, `requests / (last end - first arrival)`, with the signed error;
//! * per sweep point, whether the policies rank the same way by TTFT p50 in both runs: every
//!   pair of policies that the simulation orders (their p50s differ by more than 1 %) must be
//!   in the same order live.
//!
//! Only requests completed in both runs are compared. Both folders must come from the same
//! scenario and seed (the same trace), for instance `meshsim run S.toml` and
//! `meshsim run S.toml --live`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::metrics::nearest_rank;
use crate::results::plot::PlotError;
use crate::text::record_line;

/// Why two results folders cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: line {line}: {msg}", path.display())]
    Bad {
        path: PathBuf,
        line: u64,
        msg: String,
    },
    /// A file of a results folder holds what `meshsim plot` refuses.
    #[error(transparent)]
    Results(#[from] PlotError),
    #[error("no request completed in both runs")]
    Nothing,
}

#[derive(Clone, Copy, Debug)]
struct Times {
    ttft: f64,
    tpot: Option<f64>,
    /// Arrival and end, in ms, when the file has them.
    span: Option<(f64, f64)>,
}

type Key = (String, String, u32);

/// Reads `dir/requests.csv` (completed requests' times), after checking the whole folder as
/// `meshsim plot` does: no infinite, negative or impossible value gets into a comparison.
fn load(dir: &Path) -> Result<Vec<(Key, Times)>, CompareError> {
    let path = dir.join("requests.csv");
    let mut bytes =
        crate::text::read_capped(&path, crate::text::MAX_DATA_BYTES).map_err(|source| {
            CompareError::Read {
                path: path.clone(),
                source,
            }
        })?;
    if bytes.starts_with(crate::text::UTF8_BOM) {
        bytes.drain(..crate::text::UTF8_BOM.len());
    }
    let bad = |line: u64, msg: String| CompareError::Bad {
        path: path.clone(),
        line,
        msg,
    };
    let line_of = |pos: Option<&csv::Position>| pos.map_or(1, |p| record_line(&bytes, p));
    // The writer quotes fields that hold commas (sweep labels such as `layers=[[0, 2], ...]`).
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(&bytes[..]);
    let header = rd
        .headers()
        .map_err(|e| bad(line_of(e.position()), format!("not CSV: {e}")))?
        .clone();
    let col = |name: &str| header.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or_else(|| bad(1, format!("no `{name}` column")));
    let (policy, request, status, ttft, tpot) = (
        need("policy")?,
        need("request")?,
        need("status")?,
        need("ttft_ns")?,
        need("tpot_ns")?,
    );
    let point = col("point");
    let (arrival, e2e) = (col("arrival_ns"), col("e2e_ns"));
    let mut out = Vec::new();
    let mut f = csv::StringRecord::new();
    while rd
        .read_record(&mut f)
        .map_err(|e| bad(line_of(e.position()), format!("not CSV: {e}")))?
    {
        let n = line_of(f.position());
        let field = |c: usize| f.get(c).unwrap_or("");
        if field(status) != "ok" {
            continue;
        }
        let num = |c: usize| -> Result<f64, CompareError> {
            field(c)
                .parse::<u64>()
                .map(|v| v as f64 / 1e6)
                .map_err(|_| {
                    bad(
                        n,
                        format!(
                            "column `{}`: expected a whole number of nanoseconds, found `{}`",
                            &header[c],
                            field(c)
                        ),
                    )
                })
        };
        let id: u32 = field(request).parse().map_err(|_| {
            bad(
                n,
                format!(
                    "column `request`: expected a request id, found `{}`",
                    field(request)
                ),
            )
        })?;
        let span = match (arrival, e2e) {
            (Some(a), Some(e)) => {
                let a = num(a)?;
                Some((a, a + num(e)?))
            }
            _ => None,
        };
        let t = Times {
            ttft: num(ttft)?,
            tpot: if field(tpot).is_empty() {
                None
            } else {
                Some(num(tpot)?)
            },
            span,
        };
        let p = point.map(|c| field(c).to_string()).unwrap_or_default();
        out.push(((p, field(policy).to_string(), id), t));
    }
    crate::results::plot::Results::load(dir)?;
    Ok(out)
}

/// Whether both folders hold the same `scenario.toml`, but for a first line that sets `mode`
/// (as `meshsim run --live` writes). Missing files count as the same (nothing to compare).
fn same_scenario(a: &Path, b: &Path) -> bool {
    let read = |d: &Path| {
        crate::text::read_capped_string(&d.join("scenario.toml"), crate::text::MAX_CONFIG_BYTES)
            .ok()
    };
    let strip = |t: String| match t.split_once('\n') {
        Some((first, rest)) if first.trim_start().starts_with("mode") => rest.to_string(),
        _ => t,
    };
    match (read(a), read(b)) {
        (Some(x), Some(y)) => strip(x) == strip(y),
        _ => true,
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Matched requests of one (sweep point, policy): the simulated times, then the live ones.
type Pairs = Vec<(Times, Times)>;

/// The matched requests of each (sweep point, policy).
type Groups = BTreeMap<(String, String), Pairs>;

/// The (sweep point, policy) groups of requests completed in both runs, in the order of the
/// simulated file (sweep points as run, then policies), and each group's matched times.
fn match_requests(a: &[(Key, Times)], b: &BTreeMap<Key, Times>) -> (Vec<(String, String)>, Groups) {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut groups: Groups = BTreeMap::new();
    for (k, s) in a {
        if let Some(l) = b.get(k) {
            let g = (k.0.clone(), k.1.clone());
            if !groups.contains_key(&g) {
                order.push(g.clone());
            }
            groups.entry(g).or_default().push((*s, *l));
        }
    }
    (order, groups)
}

/// The nearest-rank percentile `q` of sorted `v`, or 0 when `v` is empty.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        nearest_rank(v, q)
    }
}

/// A figure of the simulation and of the live run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimLive {
    pub sim: f64,
    pub live: f64,
    /// The simulation's signed error, `(sim - live) / live`; `None` when `live` is 0.
    pub error: Option<f64>,
}

impl SimLive {
    fn new(sim: f64, live: f64) -> SimLive {
        SimLive {
            sim,
            live,
            error: (live > 0.0).then(|| (sim - live) / live),
        }
    }

    /// The error in percent with one decimal and its sign, or `-`.
    fn pct(&self) -> String {
        if self.live > 0.0 {
            format!("{:+.1}%", 100.0 * (self.sim - self.live) / self.live)
        } else {
            "-".into()
        }
    }
}

/// The comparison of one (sweep point, policy) over the requests completed in both runs.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    /// The sweep point; `None` outside a sweep.
    pub point: Option<String>,
    pub policy: String,
    /// Requests completed in both runs.
    pub requests: usize,
    pub ttft_p50_ms: SimLive,
    pub ttft_p99_ms: SimLive,
    pub tpot_p50_ms: SimLive,
    /// `mean |sim_i - live_i| / live_i` of the per-request TTFTs, as a ratio.
    pub mean_abs_ttft_error: f64,
    /// Requests per second from the first arrival to the last end, when both files have
    /// arrival and end times.
    pub throughput_rps: Option<SimLive>,
}

impl Group {
    fn new(point: &str, policy: &str, pairs: &[(Times, Times)]) -> Group {
        let st = sorted(pairs.iter().map(|p| p.0.ttft).collect());
        let lt = sorted(pairs.iter().map(|p| p.1.ttft).collect());
        let sp = sorted(pairs.iter().filter_map(|p| p.0.tpot).collect());
        let lp = sorted(pairs.iter().filter_map(|p| p.1.tpot).collect());
        let mape = pairs
            .iter()
            .filter(|p| p.1.ttft > 0.0)
            .map(|p| (p.0.ttft - p.1.ttft).abs() / p.1.ttft)
            .sum::<f64>()
            / pairs.len() as f64;
        let at = |s: &[f64], l: &[f64], q| SimLive::new(quantile(s, q), quantile(l, q));
        Group {
            point: (!point.is_empty()).then(|| point.to_string()),
            policy: policy.to_string(),
            requests: pairs.len(),
            ttft_p50_ms: at(&st, &lt, 50.0),
            ttft_p99_ms: at(&st, &lt, 99.0),
            tpot_p50_ms: at(&sp, &lp, 50.0),
            mean_abs_ttft_error: mape,
            throughput_rps: throughput(pairs, false)
                .map(|sim| SimLive::new(sim, throughput(pairs, true).unwrap_or(0.0))),
        }
    }

    fn point_cell(&self) -> &str {
        self.point.as_deref().unwrap_or("-")
    }
}

/// Requests per second of the live (or simulated) run over `pairs`, from the first arrival to
/// the last end; `None` without arrival and end times or over an empty span.
fn throughput(pairs: &[(Times, Times)], live: bool) -> Option<f64> {
    let spans: Vec<(f64, f64)> = pairs
        .iter()
        .map(|p| if live { p.1.span } else { p.0.span })
        .collect::<Option<_>>()?;
    let first = spans.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    let last = spans.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
    (last > first).then(|| spans.len() as f64 / ((last - first) / 1e3))
}

/// How the policies of one sweep point rank by TTFT p50 in both runs.
#[derive(Clone, Debug, Serialize)]
pub struct Ranking {
    /// The sweep point; `None` outside a sweep.
    pub point: Option<String>,
    /// The policies, fastest first, `=` between neighbours within 1 % of each other, `<`
    /// between the others.
    pub simulated: String,
    pub live: String,
    /// The pairs the simulation orders (p50s more than 1 % apart) that the live run orders
    /// the other way, as "a and b"; the rankings agree when there is none.
    pub swapped: Vec<String>,
}

/// A policy's name with its simulated and live TTFT p50 at one sweep point.
type Ranked<'a> = (&'a str, f64, f64);

/// The names of `rows` as ordered, with `=` between neighbours within 1 % of each other by
/// the live (or simulated) p50 and `<` between the others.
fn ranked_names(rows: &[Ranked<'_>], live: bool) -> String {
    let v = |r: &Ranked<'_>| if live { r.2 } else { r.1 };
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out += if v(r) > v(&rows[i - 1]) * 1.01 {
                " < "
            } else {
                " = "
            };
        }
        out += r.0;
    }
    out
}

/// The pairs of `rows` (sorted by simulated p50) that the simulation orders and the live run
/// orders the other way, as "a and b".
fn swapped_pairs(rows: &[Ranked<'_>]) -> Vec<String> {
    let mut swapped = Vec::new();
    for i in 0..rows.len() {
        for j in i + 1..rows.len() {
            let (a, b) = (rows[i], rows[j]);
            let ordered = b.1 > a.1 * 1.01;
            if ordered && b.2 < a.2 {
                swapped.push(format!("{} and {}", a.0, b.0));
            }
        }
    }
    swapped
}

/// The ranking of each sweep point, in the order the points first appear in `groups`.
fn rankings(groups: &[Group]) -> Vec<Ranking> {
    let mut points: Vec<&Option<String>> = Vec::new();
    for g in groups {
        if !points.contains(&&g.point) {
            points.push(&g.point);
        }
    }
    points
        .into_iter()
        .map(|point| {
            let mut rows: Vec<Ranked<'_>> = groups
                .iter()
                .filter(|g| &g.point == point)
                .map(|g| (g.policy.as_str(), g.ttft_p50_ms.sim, g.ttft_p50_ms.live))
                .collect();
            rows.sort_by(|a, b| a.1.total_cmp(&b.1));
            let simulated = ranked_names(&rows, false);
            let swapped = swapped_pairs(&rows);
            rows.sort_by(|a, b| a.2.total_cmp(&b.2));
            Ranking {
                point: point.clone(),
                simulated,
                live: ranked_names(&rows, true),
                swapped,
            }
        })
        .collect()
}

/// The comparison of a simulated results folder with a live one.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// `meshsim-comparison/1` (the JSON form's schema, described in docs/cli.md).
    pub schema: &'static str,
    pub meshsim_version: &'static str,
    /// The folders compared, as given.
    pub simulated: String,
    pub live: String,
    /// Whether both folders hold the same `scenario.toml` (but for `mode`): when not, their
    /// requests may not be the same ones.
    pub same_scenario: bool,
    /// One entry per (sweep point, policy), in the simulated file's order.
    pub runs: Vec<Group>,
    /// One entry per sweep point.
    pub rankings: Vec<Ranking>,
}

/// The `schema` of [`Comparison`]'s JSON form.
pub const COMPARISON_SCHEMA: &str = "meshsim-comparison/1";

impl Comparison {
    /// The comparison as Markdown: the latency table, the throughput table when every run's
    /// throughput is known, and the rankings.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        self.write_heading(&mut md);
        self.write_latency_table(&mut md);
        self.write_throughput_table(&mut md);
        self.write_rankings(&mut md);
        md
    }

    /// The comparison as pretty-printed JSON, ending with a newline.
    pub fn json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self)
            .expect("a comparison holds only finite numbers, text and paths");
        text.push('\n');
        text
    }

    /// Writes the report's title, the folders compared and a warning when their scenarios
    /// differ.
    fn write_heading(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "# Simulation against live run\n\nsimulated: `{}`; live: `{}`. Times in ms; \
             error = (sim - live) / live.\n",
            self.simulated, self.live
        );
        if !self.same_scenario {
            let _ = writeln!(
                md,
                "**Warning:** the two folders' `scenario.toml` differ (beyond the `mode` line \
                 that `--live` adds), so their requests may not be the same ones.\n"
            );
        }
    }

    /// Writes the table of TTFT and TPOT percentiles and errors, a row per point and policy.
    fn write_latency_table(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "| point | policy | requests | TTFT p50 sim | live | error | TTFT p99 sim | live \
             | error | mean abs. TTFT error | TPOT p50 sim | live | error |"
        );
        let _ = writeln!(
            md,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for g in &self.runs {
            let (p50, p99, tpot) = (g.ttft_p50_ms, g.ttft_p99_ms, g.tpot_p50_ms);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {:.1}% | {:.2} \
                 | {:.2} | {} |",
                g.point_cell(),
                g.policy,
                g.requests,
                p50.sim,
                p50.live,
                p50.pct(),
                p99.sim,
                p99.live,
                p99.pct(),
                100.0 * g.mean_abs_ttft_error,
                tpot.sim,
                tpot.live,
                tpot.pct(),
            );
        }
    }

    /// Writes the throughput table, when every group's simulated throughput is known.
    fn write_throughput_table(&self, md: &mut String) {
        let Some(rows) = self
            .runs
            .iter()
            .map(|g| g.throughput_rps.map(|t| (g, t)))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let _ = writeln!(
            md,
            "\nThroughput over the compared requests, requests/s:\n\n\
             | point | policy | sim | live | error |\n|---|---|---:|---:|---:|"
        );
        for (g, t) in rows {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {:.2} | {} |",
                g.point_cell(),
                g.policy,
                t.sim,
                t.live,
                t.pct()
            );
        }
    }

    /// Writes, per sweep point, the policies ranked by TTFT p50 in both runs and whether the
    /// rankings agree.
    fn write_rankings(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "\nRanking by TTFT p50 (fastest first; policies within 1 % of each other in the \
             simulation are tied):\n"
        );
        for r in &self.rankings {
            let verdict = if r.swapped.is_empty() {
                "the same".to_string()
            } else {
                format!("not the same: {} swap", r.swapped.join(", "))
            };
            let _ = writeln!(
                md,
                "- {}: simulated {}; live {}: {verdict}.",
                r.point.as_deref().unwrap_or("all requests"),
                r.simulated,
                r.live
            );
        }
    }
}

/// Compares the simulated folder `sim` with the live folder `live`.
pub fn comparison(sim: &Path, live: &Path) -> Result<Comparison, CompareError> {
    let a = load(sim)?;
    let b: BTreeMap<Key, Times> = load(live)?.into_iter().collect();
    let (order, groups) = match_requests(&a, &b);
    if groups.is_empty() {
        return Err(CompareError::Nothing);
    }
    let runs: Vec<Group> = order
        .iter()
        .map(|key| Group::new(&key.0, &key.1, &groups[key]))
        .collect();
    Ok(Comparison {
        schema: COMPARISON_SCHEMA,
        meshsim_version: env!("CARGO_PKG_VERSION"),
        simulated: sim.display().to_string(),
        live: live.display().to_string(),
        same_scenario: same_scenario(sim, live),
        rankings: rankings(&runs),
        runs,
    })
}

/// A markdown report comparing the simulated folder `sim` with the live folder `live`.
pub fn compare(sim: &Path, live: &Path) -> Result<String, CompareError> {
    Ok(comparison(sim, live)?.markdown())
}
