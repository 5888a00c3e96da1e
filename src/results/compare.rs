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

fn pct(sim: f64, live: f64) -> String {
    if live > 0.0 {
        format!("{:+.1}%", 100.0 * (sim - live) / live)
    } else {
        "-".into()
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

/// Writes the report's title, the folders compared and a warning when their scenarios differ.
fn write_heading(md: &mut String, sim: &Path, live: &Path) {
    let _ = writeln!(
        md,
        "# Simulation against live run\n\nsimulated: `{}`; live: `{}`. Times in ms; \
         error = (sim - live) / live.\n",
        sim.display(),
        live.display()
    );
    if !same_scenario(sim, live) {
        let _ = writeln!(
            md,
            "**Warning:** the two folders' `scenario.toml` differ (beyond the `mode` line that \
             `--live` adds), so their requests may not be the same ones.\n"
        );
    }
}

/// Writes the table of TTFT and TPOT percentiles and errors, a row per point and policy.
fn write_latency_table(md: &mut String, order: &[(String, String)], groups: &Groups) {
    let _ = writeln!(
        md,
        "| point | policy | requests | TTFT p50 sim | live | error | TTFT p99 sim | live | error \
         | mean abs. TTFT error | TPOT p50 sim | live | error |"
    );
    let _ = writeln!(
        md,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for key in order {
        let (point, policy) = key;
        write_latency_row(md, point, policy, &groups[key]);
    }
}

/// Writes the latency table's row of `policy` at `point`, from its matched times `pairs`.
fn write_latency_row(md: &mut String, point: &str, policy: &str, pairs: &[(Times, Times)]) {
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
    let _ = writeln!(
        md,
        "| {} | {policy} | {} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {:.1}% | {:.2} | {:.2} \
         | {} |",
        if point.is_empty() { "-" } else { point },
        pairs.len(),
        quantile(&st, 50.0),
        quantile(&lt, 50.0),
        pct(quantile(&st, 50.0), quantile(&lt, 50.0)),
        quantile(&st, 99.0),
        quantile(&lt, 99.0),
        pct(quantile(&st, 99.0), quantile(&lt, 99.0)),
        100.0 * mape,
        quantile(&sp, 50.0),
        quantile(&lp, 50.0),
        pct(quantile(&sp, 50.0), quantile(&lp, 50.0)),
    );
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

/// Writes the throughput table, when every group's simulated throughput is known.
fn write_throughput_table(md: &mut String, order: &[(String, String)], groups: &Groups) {
    if !order
        .iter()
        .all(|k| throughput(&groups[k], false).is_some())
    {
        return;
    }
    let _ = writeln!(
        md,
        "\nThroughput over the compared requests, requests/s:\n\n\
         | point | policy | sim | live | error |\n|---|---|---:|---:|---:|"
    );
    for key in order {
        let (sim, live) = (
            throughput(&groups[key], false).unwrap_or(0.0),
            throughput(&groups[key], true).unwrap_or(0.0),
        );
        let point = if key.0.is_empty() { "-" } else { &key.0 };
        let _ = writeln!(
            md,
            "| {point} | {} | {sim:.2} | {live:.2} | {} |",
            key.1,
            pct(sim, live)
        );
    }
}

/// A policy's name with its simulated and live TTFT p50 at one sweep point.
type Ranked<'a> = (&'a str, f64, f64);

/// The policies at `point`, in `order`, with their simulated and live TTFT p50.
fn ranking_rows<'a>(
    order: &'a [(String, String)],
    groups: &Groups,
    point: &str,
) -> Vec<Ranked<'a>> {
    order
        .iter()
        .filter(|k| k.0 == point)
        .map(|k| {
            let pairs = &groups[k];
            let p50 = |v: Vec<f64>| nearest_rank(&sorted(v), 50.0);
            (
                k.1.as_str(),
                p50(pairs.iter().map(|p| p.0.ttft).collect()),
                p50(pairs.iter().map(|p| p.1.ttft).collect()),
            )
        })
        .collect()
}

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

/// Writes, per sweep point, the policies ranked by TTFT p50 in both runs and whether the
/// rankings agree.
fn write_rankings(md: &mut String, order: &[(String, String)], groups: &Groups) {
    let _ = writeln!(
        md,
        "\nRanking by TTFT p50 (fastest first; policies within 1 % of each other in the \
         simulation are tied):\n"
    );
    let mut points: Vec<&String> = Vec::new();
    for (point, _) in order {
        if !points.contains(&point) {
            points.push(point);
        }
    }
    for point in points {
        let mut rows = ranking_rows(order, groups, point);
        rows.sort_by(|a, b| a.1.total_cmp(&b.1));
        let sim_order = ranked_names(&rows, false);
        let swapped = swapped_pairs(&rows);
        rows.sort_by(|a, b| a.2.total_cmp(&b.2));
        let live_order = ranked_names(&rows, true);
        let verdict = if swapped.is_empty() {
            "the same".to_string()
        } else {
            format!("not the same: {} swap", swapped.join(", "))
        };
        let _ = writeln!(
            md,
            "- {}: simulated {sim_order}; live {live_order}: {verdict}.",
            if point.is_empty() {
                "all requests"
            } else {
                point
            }
        );
    }
}

/// A markdown report comparing the simulated folder `sim` with the live folder `live`.
pub fn compare(sim: &Path, live: &Path) -> Result<String, CompareError> {
    let a = load(sim)?;
    let b: BTreeMap<Key, Times> = load(live)?.into_iter().collect();
    let (order, groups) = match_requests(&a, &b);
    if groups.is_empty() {
        return Err(CompareError::Nothing);
    }
    let mut md = String::new();
    write_heading(&mut md, sim, live);
    write_latency_table(&mut md, &order, &groups);
    write_throughput_table(&mut md, &order, &groups);
    write_rankings(&mut md, &order, &groups);
    Ok(md)
}
