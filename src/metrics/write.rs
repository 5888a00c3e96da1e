//! CSV files of results: `requests.csv` (one row per request and policy) and `summary.csv`
//! (one row per policy). Columns are fixed and documented in the README; numbers are written
//! with fixed precision so that the same run always gives the same bytes.

use std::io::Write;

use super::Tier;
use super::{RequestRecord, Summary};
use crate::units::Nanos;

fn opt(v: Option<Nanos>) -> String {
    v.map(|n| n.0.to_string()).unwrap_or_default()
}

fn f3(x: f64) -> String {
    format!("{x:.3}")
}

fn names(list: &[&str]) -> impl Iterator<Item = String> {
    list.iter().map(|s| s.to_string())
}

/// `reused_<tier>_tokens` for every tier, then `loaded_<tier>_bytes` for the store's tiers.
fn tier_columns() -> impl Iterator<Item = String> {
    let reused = Tier::ALL
        .iter()
        .map(|t| format!("reused_{}_tokens", t.name()));
    let loaded = Tier::ALL[1..]
        .iter()
        .map(|t| format!("loaded_{}_bytes", t.name()));
    reused.chain(loaded)
}

/// The header of `requests.csv`.
pub fn request_header() -> Vec<String> {
    names(&[
        "policy",
        "request",
        "arrival_ns",
        "instance",
        "status",
        "prompt_tokens",
        "output_tokens",
        "reused_tokens",
    ])
    .chain(tier_columns())
    .chain(names(&[
        "queue_ns",
        "ttft_ns",
        "tpot_ns",
        "e2e_ns",
        "preemptions",
        "network_bytes",
    ]))
    .collect()
}

/// Writes `requests.csv` rows for the runs' records (sweep point, policy, records), in the
/// given order. A `point` column comes first when any run belongs to a sweep point.
pub fn write_requests<W: Write>(
    out: W,
    runs: &[(Option<&str>, &str, &[RequestRecord])],
) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(out);
    let swept = runs.iter().any(|r| r.0.is_some());
    w.write_record(requests_header(swept))?;
    for (point, policy, records) in runs {
        write_request_rows(&mut w, swept, *point, policy, records)?;
    }
    w.flush()?;
    Ok(())
}

/// The header of `requests.csv`, with a leading `point` column when `swept`.
pub fn requests_header(swept: bool) -> Vec<String> {
    let mut header = request_header();
    if swept {
        header.insert(0, "point".into());
    }
    header
}

/// Writes the `requests.csv` rows of one run (no header), as [`write_requests`] does.
pub fn write_request_rows<W: Write>(
    w: &mut csv::Writer<W>,
    swept: bool,
    point: Option<&str>,
    policy: &str,
    records: &[RequestRecord],
) -> Result<(), csv::Error> {
    let mut row = Vec::with_capacity(32);
    for r in records {
        let status = if r.failed.is_some() {
            "failed"
        } else if r.rejected {
            "rejected"
        } else if r.completed() {
            "ok"
        } else {
            "unfinished"
        };
        let instance = if r.instance == u32::MAX {
            String::new()
        } else {
            r.instance.to_string()
        };
        row.clear();
        if swept {
            row.push(point.unwrap_or("").to_string());
        }
        row.extend([
            policy.to_string(),
            r.id.to_string(),
            r.arrival.0.to_string(),
            instance,
            status.to_string(),
            r.prompt_tokens.to_string(),
            r.output_tokens.to_string(),
            r.reused_tokens().to_string(),
        ]);
        row.extend(r.reused.iter().map(|t| t.to_string()));
        row.extend(r.loaded_bytes[1..].iter().map(|b| b.to_string()));
        row.extend([
            opt(r.queue()),
            opt(r.ttft()),
            opt(r.tpot()),
            opt(r.e2e()),
            r.preemptions.to_string(),
            r.network_bytes.to_string(),
        ]);
        w.write_record(&row)?;
    }
    Ok(())
}

/// The header of `summary.csv`.
pub fn summary_header() -> Vec<String> {
    let mut h: Vec<String> = names(&[
        "policy",
        "requests",
        "completed",
        "rejected",
        "duration_s",
        "throughput_rps",
        "output_tokens_per_s",
    ])
    .collect();
    for m in ["ttft", "tpot", "e2e", "queue"] {
        for s in ["mean", "p50", "p90", "p99"] {
            h.push(format!("{m}_{s}_ms"));
        }
    }
    h.extend(names(&["prefix_hit_ratio", "prompt_tokens"]));
    h.extend(tier_columns());
    h.extend(names(&[
        "preemptions",
        "gpu_block_evictions",
        "gpu_busy_ratio",
        "network_bytes",
        "store_lookups",
        "store_tensors_stored",
        "store_tensors_demoted",
        "store_tensors_dropped",
        "store_tensors_replicated",
        "store_replicas_evicted",
        "replication_bytes",
        "events",
    ]));
    h
}

/// Writes `summary.csv` with one row per summary (a `point` column first when sweeping).
pub fn write_summary<W: Write>(out: W, summaries: &[Summary]) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(out);
    let swept = summaries.iter().any(|s| s.point.is_some());
    let mut header = summary_header();
    if swept {
        header.insert(0, "point".into());
    }
    w.write_record(header)?;
    for s in summaries {
        let mut row = Vec::with_capacity(64);
        if swept {
            row.push(s.point.clone().unwrap_or_default());
        }
        row.extend([
            s.policy.clone(),
            s.requests.to_string(),
            s.completed.to_string(),
            s.rejected.to_string(),
            format!("{:.6}", s.duration.as_secs_f64()),
            f3(s.throughput_rps),
            f3(s.output_tokens_per_s),
        ]);
        for d in [s.ttft, s.tpot, s.e2e, s.queue] {
            row.extend([f3(d.mean), f3(d.p50), f3(d.p90), f3(d.p99)]);
        }
        row.push(format!("{:.6}", s.prefix_hit_ratio));
        row.push(s.prompt_tokens.to_string());
        row.extend(s.reused_tokens.iter().map(|t| t.to_string()));
        row.extend(s.loaded_bytes[1..].iter().map(|t| t.to_string()));
        let st = s.store.unwrap_or_default();
        row.extend([
            s.preemptions.to_string(),
            s.gpu_block_evictions.to_string(),
            format!("{:.6}", s.gpu_busy_ratio),
            s.network_bytes.to_string(),
            st.lookups.to_string(),
            st.stats.stored.to_string(),
            st.stats.demoted.to_string(),
            st.stats.dropped.to_string(),
            st.stats.replicated.to_string(),
            st.stats.replicas_evicted.to_string(),
            st.replication_bytes.to_string(),
            s.events.to_string(),
        ]);
        w.write_record(&row)?;
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_have_one_column_per_value() {
        let r = RequestRecord::new(0, Nanos(1), 3, 2);
        let mut buf = Vec::new();
        write_requests(&mut buf, &[(None, "p", std::slice::from_ref(&r))]).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split(',').count(),
            lines[1].split(',').count(),
            "{text}"
        );
    }
}
