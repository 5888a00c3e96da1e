//! How far a simulation is from a live run of the same scenario.
//!
//! `meshsim compare SIM_DIR LIVE_DIR` reads the `requests.csv` of both results folders,
//! matches requests by (sweep point, policy, request id), and reports per point and policy:
//!
//! * TTFT and TPOT p50 and p99 (nearest rank) of each run and the signed error of the
//!   simulation, `(sim - live) / live`;
//! * the mean absolute per-request TTFT error, `mean |sim_i - live_i| / live_i`, which also
//!   catches errors that cancel out in the percentiles.
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
}

type Key = (String, String, u32);

/// Reads `dir/requests.csv` (completed requests' times), after checking the whole folder as
/// `meshsim plot` does: no infinite, negative or impossible value gets into a comparison.
fn load(dir: &Path) -> Result<Vec<(Key, Times)>, CompareError> {
    let path = dir.join("requests.csv");
    let mut bytes = std::fs::read(&path).map_err(|source| CompareError::Read {
        path: path.clone(),
        source,
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
        let t = Times {
            ttft: num(ttft)?,
            tpot: if field(tpot).is_empty() {
                None
            } else {
                Some(num(tpot)?)
            },
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
    let read = |d: &Path| std::fs::read_to_string(d.join("scenario.toml")).ok();
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

/// A markdown report comparing the simulated folder `sim` with the live folder `live`.
pub fn compare(sim: &Path, live: &Path) -> Result<String, CompareError> {
    let a = load(sim)?;
    let b: BTreeMap<Key, Times> = load(live)?.into_iter().collect();
    // Groups in the order of the simulated file (sweep points as run, then policies).
    let mut order: Vec<(String, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<(Times, Times)>> = BTreeMap::new();
    for (k, s) in &a {
        if let Some(l) = b.get(k) {
            let g = (k.0.clone(), k.1.clone());
            if !groups.contains_key(&g) {
                order.push(g.clone());
            }
            groups.entry(g).or_default().push((*s, *l));
        }
    }
    if groups.is_empty() {
        return Err(CompareError::Nothing);
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Simulation against live run\n\nsimulated: `{}`; live: `{}`. Times in ms; error = (sim - live) / live.\n",
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
    let _ = writeln!(
        md,
        "| point | policy | requests | TTFT p50 sim | live | error | TTFT p99 sim | live | error | mean abs. TTFT error | TPOT p50 sim | live | error |"
    );
    let _ = writeln!(
        md,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for key in &order {
        let (point, policy) = key;
        let pairs = &groups[key];
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
        let q = |v: &[f64], q: f64| {
            if v.is_empty() {
                0.0
            } else {
                nearest_rank(v, q)
            }
        };
        let _ = writeln!(
            md,
            "| {} | {policy} | {} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {:.1}% | {:.2} | {:.2} | {} |",
            if point.is_empty() { "-" } else { point },
            pairs.len(),
            q(&st, 50.0),
            q(&lt, 50.0),
            pct(q(&st, 50.0), q(&lt, 50.0)),
            q(&st, 99.0),
            q(&lt, 99.0),
            pct(q(&st, 99.0), q(&lt, 99.0)),
            100.0 * mape,
            q(&sp, 50.0),
            q(&lp, 50.0),
            pct(q(&sp, 50.0), q(&lp, 50.0)),
        );
    }
    Ok(md)
}
