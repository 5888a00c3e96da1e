//! CSV files of results: `requests.csv` (one row per request and policy) and `summary.csv`
//! (one row per policy). Columns are fixed and documented in docs/cli.md, "The results
//! folder"; numbers are written with fixed precision so that the same run always gives the
//! same bytes.

use std::io::Write;

use super::Tier;
use super::{RequestRecord, Summary};
use crate::hardware::network::{LinkKind, LinkLoad, Purpose};

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

/// The link columns of `summary.csv`, after every other: `<kind>_<purpose>_bytes` for each
/// kind of link and purpose, `moved_<purpose>_bytes`, then per kind `<kind>_busy_ratio` (mean
/// fraction of the run its links were busy), `<kind>_busiest_ratio` (its busiest link's) and
/// `<kind>_gbyte_per_s` (mean rate of one link, 10^9 bytes/s).
fn link_columns() -> Vec<String> {
    let mut h = Vec::new();
    for k in LinkKind::ALL {
        for p in Purpose::ALL {
            h.push(format!("{}_{}_bytes", k.name(), p.name()));
        }
    }
    for p in Purpose::ALL {
        h.push(format!("moved_{}_bytes", p.name()));
    }
    for k in LinkKind::ALL {
        for what in ["busy_ratio", "busiest_ratio", "gbyte_per_s"] {
            h.push(format!("{}_{what}", k.name()));
        }
    }
    h
}

/// The link columns' fields of one summary: empty when the run models no links.
fn link_fields(links: Option<&LinkLoad>) -> Vec<String> {
    let Some(l) = links else {
        return vec![String::new(); link_columns().len()];
    };
    let mut row: Vec<String> = l.bytes.iter().flatten().map(u64::to_string).collect();
    row.extend(l.moved.iter().map(u64::to_string));
    for k in LinkKind::ALL {
        row.extend([
            format!("{:.6}", l.busy[k as usize]),
            format!("{:.6}", l.busiest[k as usize]),
            format!("{:.6}", l.rate_per_link(k) / 1e9),
        ]);
    }
    row
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
    // Fields go to the writer one at a time, numbers formatted on the stack: no string per
    // field (a million rows of 25 fields each were 25 million allocations). The writer quotes
    // exactly as it does for whole records, so the bytes are the same.
    let mut n = Digits::default();
    for r in records {
        let status = r.status();
        if swept {
            w.write_field(point.unwrap_or(""))?;
        }
        w.write_field(policy)?;
        w.write_field(n.of(r.id as u64))?;
        w.write_field(n.of(r.arrival.0))?;
        if r.instance == u32::MAX {
            w.write_field("")?;
        } else {
            w.write_field(n.of(r.instance as u64))?;
        }
        w.write_field(status)?;
        w.write_field(n.of(r.prompt_tokens as u64))?;
        w.write_field(n.of(r.output_tokens as u64))?;
        w.write_field(n.of(r.reused_tokens()))?;
        for &t in &r.reused {
            w.write_field(n.of(t as u64))?;
        }
        for &b in &r.loaded_bytes[1..] {
            w.write_field(n.of(b))?;
        }
        for v in [r.queue(), r.ttft(), r.tpot(), r.e2e()] {
            match v {
                Some(v) => w.write_field(n.of(v.0))?,
                None => w.write_field("")?,
            }
        }
        w.write_field(n.of(r.preemptions as u64))?;
        w.write_field(n.of(r.network_bytes))?;
        w.write_record(None::<&[u8]>)?;
    }
    Ok(())
}

/// The decimal digits of a `u64`, written into a buffer of its own.
#[derive(Default)]
struct Digits([u8; 20]);

impl Digits {
    /// `v` in decimal, as `v.to_string()` writes it.
    fn of(&mut self, mut v: u64) -> &[u8] {
        let mut i = self.0.len();
        // Bounded: a u64 has at most 20 digits.
        loop {
            i -= 1;
            self.0[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        &self.0[i..]
    }
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
        "gpu_hit_ratio",
        "gpu_optimal_hit_ratio",
    ]));
    h.extend(link_columns());
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
            format!("{:.6}", s.gpu_hit_ratio()),
            s.gpu_optimal_hit_ratio
                .map_or_else(String::new, |r| format!("{r:.6}")),
        ]);
        row.extend(link_fields(s.links.as_ref()));
        w.write_record(&row)?;
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Nanos;

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

    #[test]
    fn digits_are_what_to_string_writes() {
        let mut d = Digits::default();
        let mut rng = crate::rng::Stream::new(5, 0);
        let mut values = vec![
            0,
            1,
            9,
            10,
            99,
            100,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ];
        values.extend((0..1_000).map(|i| rng.below(u64::MAX) >> (i % 64)));
        for v in values {
            assert_eq!(d.of(v), v.to_string().as_bytes(), "{v}");
        }
    }

    /// The rows as whole records of strings through csv's record writer: the reference that
    /// the field-at-a-time writer must match byte for byte.
    fn rows_as_records(
        swept: bool,
        point: Option<&str>,
        policy: &str,
        records: &[RequestRecord],
    ) -> Vec<u8> {
        let opt = |v: Option<Nanos>| v.map(|n| n.0.to_string()).unwrap_or_default();
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        for r in records {
            let status = r.status();
            let mut row = Vec::new();
            if swept {
                row.push(point.unwrap_or("").to_string());
            }
            let instance = if r.instance == u32::MAX {
                String::new()
            } else {
                r.instance.to_string()
            };
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
            row.extend([opt(r.queue()), opt(r.ttft()), opt(r.tpot()), opt(r.e2e())]);
            row.extend([r.preemptions.to_string(), r.network_bytes.to_string()]);
            w.write_record(&row).unwrap();
        }
        w.into_inner().unwrap()
    }

    #[test]
    fn rows_are_the_bytes_that_whole_records_of_strings_give() {
        let mut rng = crate::rng::Stream::new(11, 0);
        let mut records = Vec::new();
        for id in 0..500u32 {
            let mut r = RequestRecord::new(
                id,
                Nanos(rng.below(1 << 40)),
                1 + rng.below(9000) as u32,
                rng.below(300) as u32,
            );
            match rng.below(5) {
                0 => r.rejected = true,
                1 => r.failed = Some("node down".into()),
                2 => {}
                _ => {
                    r.instance = rng.below(2240) as u32;
                    r.admitted = Some(r.arrival + Nanos(rng.below(1 << 30)));
                    r.first_token = r.admitted.map(|a| a + Nanos(rng.below(1 << 30)));
                    if rng.below(4) > 0 {
                        r.end = r.first_token.map(|f| f + Nanos(rng.below(1 << 34)));
                    }
                }
            }
            for t in r.reused.iter_mut() {
                *t = rng.below(5000) as u32;
            }
            for b in r.loaded_bytes.iter_mut() {
                *b = rng.below(u64::MAX);
            }
            r.preemptions = rng.below(3) as u32;
            r.network_bytes = rng.below(1 << 50);
            records.push(r);
        }
        let cases = [
            (false, None, "local-prefix"),
            (true, Some("rate=7000"), "ptstore"),
            (true, Some("a,b \"quoted\""), "odd, \"name\""),
            (true, None, "evostore"),
        ];
        for (swept, point, policy) in cases {
            let mut w = csv::WriterBuilder::new()
                .has_headers(false)
                .from_writer(Vec::new());
            write_request_rows(&mut w, swept, point, policy, &records).unwrap();
            let got = w.into_inner().unwrap();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(rows_as_records(swept, point, policy, &records)).unwrap(),
                "{policy} at {point:?}"
            );
        }
    }
}
