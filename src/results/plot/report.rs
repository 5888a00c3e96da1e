//! `report.md`: a results folder readable on its own.
//!
//! It holds the scenario in a few lines (from `scenario.toml`, tolerating missing keys), a
//! table of the summary per policy, which policy has the lowest TTFT p50 and p99 and by how
//! much (computed from the table's numbers), and the figures as relative PNG links. For
//! pipeline results it adds a sentence comparing per-request output tokens per second
//! (`output_tokens / (end - arrival)`, median per output length) of the fastest and the slowest
//! policy at the longest output length both have ([`tps_sentence`]).

use std::fmt::Write;

use super::data::{Results, SummaryRow, TpsPoint, TpsSeries};
use crate::hardware::network::{LinkKind, Purpose};

/// A string, integer, float or boolean found at `path` (dotted keys) in `v`, as text.
fn get(v: &toml::Value, path: &str) -> Option<String> {
    let mut cur = v;
    for key in path.split('.') {
        cur = cur.get(key)?;
    }
    match cur {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Array(a) => Some(
            a.iter()
                .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        _ => None,
    }
}

/// The scenario in a few bullet lines; lines whose keys are missing are left out.
fn scenario_lines(v: &toml::Value) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(seed) = get(v, "seed") {
        lines.push(format!("- seed: {seed}"));
    }
    lines.extend(hardware_line(v));
    if let Some(m) = get(v, "model.preset").or_else(|| get(v, "model.name")) {
        lines.push(format!("- model: {m}"));
    }
    lines.extend(pipeline_lines(v));
    lines.extend(serving_line(v));
    lines.extend(workload_line(v));
    if let Some(p) = get(v, "policies") {
        lines.push(format!("- policies: {p}"));
    }
    lines
}

/// The `- hardware:` line (nodes, GPUs, network), when the scenario names nodes or a GPU.
fn hardware_line(v: &toml::Value) -> Option<String> {
    let nodes = get(v, "hardware.nodes");
    let per_node = get(v, "hardware.gpus_per_node");
    let gpu = get(v, "hardware.gpu.name");
    if nodes.is_none() && gpu.is_none() {
        return None;
    }
    let mut s = String::from("- hardware:");
    let mut total = String::new();
    if let (Some(n), Some(g)) = (&nodes, &per_node) {
        let _ = write!(s, " {n} nodes x {g}");
        if let (Ok(a), Ok(b)) = (n.parse::<u64>(), g.parse::<u64>()) {
            total = format!(" ({} GPUs)", a * b);
        }
    }
    if let Some(gpu) = gpu {
        let _ = write!(s, " {gpu}");
    }
    s.push_str(&total);
    if let Some(bw) = get(v, "hardware.network.nic_bandwidth_gbit_per_s") {
        let nics = get(v, "hardware.network.nics_per_node").unwrap_or_else(|| "?".into());
        let _ = write!(s, "; network {nics} x {bw} Gbit/s NICs per node");
    }
    Some(s)
}

/// The lines of a pipeline scenario (route, host, route limits); none for other scenarios.
fn pipeline_lines(v: &toml::Value) -> Vec<String> {
    let mut lines = Vec::new();
    let Some(m) = get(v, "pipeline.model") else {
        return lines;
    };
    let split = get(v, "pipeline.shards")
        .map(|n| format!("{n} shards"))
        .or_else(|| get(v, "pipeline.layers").map(|l| format!("shards of layers {l}")))
        .unwrap_or_default();
    lines.push(format!("- pipeline route: {m}, {split}"));
    let live = get(v, "mode").is_some_and(|m| m == "live");
    let cost = match get(v, "pipeline.cost").as_deref() {
        Some("profile") => format!(
            "profile {}",
            get(v, "pipeline.profile").unwrap_or_else(|| "?".into())
        ),
        _ => "analytic roofline".into(),
    };
    lines.push(if live {
        "- host: live (candle tensors on ractor actors; measured wall-clock times)".into()
    } else {
        format!("- host: simulated, step times from the {cost}")
    });
    let mut p = Vec::new();
    if let Some(a) = get(v, "pipeline.max_active_sessions") {
        p.push(format!("{a} sessions at once"));
    }
    if let Some(c) = get(v, "pipeline.max_sessions") {
        p.push(format!("session caches of {c}"));
    }
    if get(v, "pipeline.shared_device").is_some_and(|d| d == "true") {
        p.push("shards share one device".into());
    }
    if !p.is_empty() {
        lines.push(format!("- route: {}", p.join(", ")));
    }
    lines
}

/// The `- serving:` line (tensor parallelism, routing), when the scenario sets either.
fn serving_line(v: &toml::Value) -> Option<String> {
    let mut serving = Vec::new();
    if let Some(tp) = get(v, "serving.tensor_parallel") {
        serving.push(format!("tensor parallel {tp}"));
    }
    if let Some(r) = get(v, "serving.router") {
        serving.push(format!("{r} routing"));
    }
    (!serving.is_empty()).then(|| format!("- serving: {}", serving.join(", ")))
}

/// The `- workload:` line (dataset, requests, rate, lengths), when the scenario sets any.
fn workload_line(v: &toml::Value) -> Option<String> {
    let mut w = Vec::new();
    if let Some(d) = get(v, "workload.dataset") {
        w.push(format!("{d}-style"));
    }
    if let Some(n) = get(v, "workload.requests") {
        w.push(format!("{n} requests"));
    }
    if let Some(r) = get(v, "workload.arrival_rate_per_s") {
        w.push(format!("at {r} requests/s"));
    }
    if get(v, "workload.closed_loop").is_some_and(|c| c == "true") {
        w.push("closed loop".into());
    }
    if let Some(n) = get(v, "workload.prompt_tokens") {
        w.push(format!("{n}-token prompts"));
    }
    if let Some(n) = get(v, "workload.output_tokens").filter(|n| n.parse::<u64>().is_ok()) {
        w.push(format!("{n} output tokens"));
    }
    if let Some(c) = get(v, "workload.context_tokens") {
        w.push(format!("{c}-token contexts"));
    }
    if let Some(o) = get(v, "workload.output_tokens.median") {
        w.push(format!("median output {o} tokens"));
    }
    (!w.is_empty()).then(|| format!("- workload: {}", w.join(", ")))
}

/// "X has the lowest <metric>: a ms, 1.25x faster than Y (b ms)", among rows that completed
/// requests; `None` when no row did.
pub(crate) fn winner_sentence(
    rows: &[&SummaryRow],
    metric: &str,
    pick: fn(&SummaryRow) -> f64,
) -> Option<String> {
    let done: Vec<&&SummaryRow> = rows.iter().filter(|r| r.completed > 0).collect();
    let best = done
        .iter()
        .copied()
        .min_by(|a, b| pick(a).total_cmp(&pick(b)))?;
    let b = pick(best);
    if done.len() == 1 {
        return Some(format!(
            "Only {} completed requests: {metric} {b:.1} ms.",
            best.label()
        ));
    }
    let others: Vec<String> = done
        .iter()
        .filter(|r| !std::ptr::eq(**r, best))
        .map(|r| {
            let o = pick(r);
            let how = if o == b {
                "as fast as".to_string()
            } else if b > 0.0 {
                format!("{:.2}x faster than", o / b)
            } else {
                format!("{:.1} ms faster than", o - b)
            };
            format!("{how} {} ({o:.1} ms)", r.label())
        })
        .collect();
    Some(format!(
        "**{}** has the lowest {metric}: {b:.1} ms, {}.",
        best.label(),
        others.join(", ")
    ))
}

/// For pipeline results: "At 512 output tokens, `cached` generates 98.3 tokens/s per request
/// against 7.6 for `stateless` (12.9x)." Among `series` (those of one sweep point), it takes
/// the longest output length that at least two series have, and there compares the series
/// with the highest median TPS to the one with the lowest. `None` with fewer than two series
/// sharing a length.
pub fn tps_sentence(series: &[&TpsSeries]) -> Option<String> {
    let mut lengths: Vec<u32> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.to))
        .collect();
    lengths.sort_unstable_by(|a, b| b.cmp(a));
    lengths.dedup();
    let at = lengths.into_iter().find_map(|length| {
        let at: Vec<(&TpsSeries, &TpsPoint)> = series
            .iter()
            .filter_map(|s| s.points.iter().find(|p| p.to == length).map(|p| (*s, p)))
            .collect();
        (at.len() >= 2).then_some(at)
    })?;
    let fast = at
        .iter()
        .max_by(|a, b| a.1.median_tps.total_cmp(&b.1.median_tps))?;
    let slow = at
        .iter()
        .filter(|x| !std::ptr::eq(x.0, fast.0))
        .min_by(|a, b| a.1.median_tps.total_cmp(&b.1.median_tps))?;
    let (f, sl) = (fast.1.median_tps, slow.1.median_tps);
    let ratio = if sl > 0.0 {
        format!(" ({:.1}x)", f / sl)
    } else {
        String::new()
    };
    Some(format!(
        "At {} output tokens, `{}` generates {f:.1} tokens/s per request against {sl:.1} for \
         `{}`{ratio}.",
        fast.1.lengths(),
        fast.0.policy,
        slow.0.policy
    ))
}

/// The text of `report.md`.
pub fn report_markdown(r: &Results) -> String {
    let name = r
        .scenario
        .as_ref()
        .and_then(|v| get(v, "name"))
        .unwrap_or_else(|| "meshsim results".into());
    let mut s = format!("# {name}\n\n");
    push_scenario(&mut s, r);
    push_summary_table(&mut s, r);
    push_winners(&mut s, r);
    push_links(&mut s, r);
    if let Some(series) = &r.tps_output {
        push_tps_sentences(&mut s, series);
    }
    push_plots(&mut s, r);
    s
}

/// Appends the scenario's bullet lines, or a sentence saying `scenario.toml` is unusable.
fn push_scenario(s: &mut String, r: &Results) {
    match &r.scenario {
        Some(v) => {
            s.push_str("Scenario (from `scenario.toml`):\n\n");
            for line in scenario_lines(v) {
                s.push_str(&line);
                s.push('\n');
            }
        }
        None => s.push_str("`scenario.toml` is missing or not valid TOML.\n"),
    }
}

/// Appends the `## Summary` heading and the table of the summary, a row per policy and point.
fn push_summary_table(s: &mut String, r: &Results) {
    s.push_str("\n## Summary\n\n");
    s.push_str(
        "| policy | completed | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | E2E p50 (ms) \
         | output tokens/s | requests/s | prefix hit | GPU hit (best possible) |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &r.summary {
        let gpu = match (row.gpu_hit_ratio, row.gpu_optimal_hit_ratio) {
            (Some(h), Some(o)) => format!("{:.1} % ({:.1} %)", 100.0 * h, 100.0 * o),
            (Some(h), None) => format!("{:.1} %", 100.0 * h),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {}/{} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.2} | {:.1} % | {gpu} |",
            row.label(),
            row.completed,
            row.requests,
            row.ttft_p50_ms,
            row.ttft_p99_ms,
            row.tpot_p50_ms,
            row.e2e_p50_ms,
            row.output_tokens_per_s,
            row.throughput_rps,
            100.0 * row.prefix_hit_ratio
        );
    }
    if r.summary
        .iter()
        .any(|row| row.gpu_optimal_hit_ratio.is_some())
    {
        s.push_str(
            "\nGPU hit: prompt tokens reused from the instance's own GPU prefix cache; in \
             parentheses, the best any eviction order could have reached with the instances' \
             whole KV memory on the same prompts in the same order (Belady's rule, an upper \
             bound: `src/serving/optimal.rs`).\n",
        );
    }
    s.push('\n');
}

/// Appends the `## Links` tables, when rows of the summary have link figures: per kind of
/// link, what it carried and how busy it was; per purpose, the bytes moved.
fn push_links(s: &mut String, r: &Results) {
    let rows: Vec<(&SummaryRow, &super::LinkRow)> = r
        .summary
        .iter()
        .filter_map(|row| Some((row, row.links.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let gb = |b: u64| format!("{:.2}", b as f64 / 1e9);
    // Kinds no row used (no SSD, no NVLink traffic) are left out.
    let kinds: Vec<usize> = (0..LinkKind::ALL.len())
        .filter(|&k| rows.iter().any(|(_, l)| l.bytes[k] > 0))
        .collect();
    s.push_str(
        "\n## Links\n\nWhat each kind of link carried over the run, in GB, and how busy it was: \
         the mean over its links of the fraction of the run they had a transfer on them, and \
         the busiest link's.\n\n| policy |",
    );
    for &k in &kinds {
        let _ = write!(s, " {} |", LinkKind::ALL[k].label());
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(kinds.len()));
    s.push('\n');
    for (row, l) in &rows {
        let _ = write!(s, "| {} |", row.label());
        for &k in &kinds {
            let _ = write!(
                s,
                " {} GB, {:.1} % (max {:.1} %) |",
                gb(l.bytes[k]),
                100.0 * l.busy[k],
                100.0 * l.busiest[k]
            );
        }
        s.push('\n');
    }
    s.push_str(
        "\nBytes moved per purpose, in GB (each transfer once, whatever links it crossed):\n\n\
         | policy |",
    );
    for p in Purpose::ALL {
        let _ = write!(s, " {} |", p.name());
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(Purpose::ALL.len()));
    s.push('\n');
    for (row, l) in &rows {
        let _ = write!(s, "| {} |", row.label());
        for &b in &l.moved {
            let _ = write!(s, " {} |", gb(b));
        }
        s.push('\n');
    }
}

/// Appends, per sweep point (a single group without sweeps), which policy has the lowest TTFT
/// p50 and p99.
fn push_winners(s: &mut String, r: &Results) {
    let mut points: Vec<Option<&str>> = Vec::new();
    for row in &r.summary {
        if !points.contains(&row.point.as_deref()) {
            points.push(row.point.as_deref());
        }
    }
    for point in points {
        let rows: Vec<&SummaryRow> = r
            .summary
            .iter()
            .filter(|row| row.point.as_deref() == point)
            .collect();
        let sentences: Vec<String> = [
            winner_sentence(&rows, "TTFT p50", |r| r.ttft_p50_ms),
            winner_sentence(&rows, "TTFT p99", |r| r.ttft_p99_ms),
        ]
        .into_iter()
        .flatten()
        .collect();
        if sentences.is_empty() {
            s.push_str("No policy completed any request.\n");
        } else {
            s.push_str(&sentences.join(" "));
            s.push('\n');
        }
    }
}

/// Appends the [`tps_sentence`] of each group of pipeline series (by their other swept
/// values), when any group has one.
fn push_tps_sentences(s: &mut String, series: &[TpsSeries]) {
    let mut rests: Vec<Option<&str>> = Vec::new();
    for t in series {
        if !rests.contains(&t.rest.as_deref()) {
            rests.push(t.rest.as_deref());
        }
    }
    let sentences: Vec<String> = rests
        .into_iter()
        .filter_map(|rest| {
            let group: Vec<&TpsSeries> = series
                .iter()
                .filter(|t| t.rest.as_deref() == rest)
                .collect();
            let sentence = tps_sentence(&group)?;
            Some(match rest {
                Some(rest) => format!("{rest}: {sentence}"),
                None => sentence,
            })
        })
        .collect();
    if !sentences.is_empty() {
        s.push('\n');
        s.push_str(&sentences.join(" "));
        s.push_str(
            " (Per-request output tokens per second: output tokens / (end - arrival), \
             median over completed requests.)\n",
        );
    }
}

/// Appends the `## Plots` section: each figure's caption and a link to its PNG.
fn push_plots(s: &mut String, r: &Results) {
    s.push_str("\n## Plots\n\nEach plot is also written as SVG next to the PNG.\n");
    for f in r.figures() {
        let _ = write!(
            s,
            "\n### {}\n\n![{}]({}.png)\n",
            f.caption(),
            f.caption(),
            f.stem()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, p50: f64, p99: f64) -> SummaryRow {
        SummaryRow {
            policy: policy.into(),
            point: None,
            requests: 10,
            completed: 10,
            throughput_rps: 1.0,
            output_tokens_per_s: 10.0,
            ttft_p50_ms: p50,
            ttft_p99_ms: p99,
            tpot_p50_ms: 1.0,
            e2e_p50_ms: 2.0,
            prefix_hit_ratio: 0.0,
            reused_tokens: [0; 5],
            loaded_bytes: [0; 4],
            links: None,
            gpu_hit_ratio: None,
            gpu_optimal_hit_ratio: None,
        }
    }

    #[test]
    fn the_winner_sentence_names_the_fastest_policy_and_the_ratio() {
        let a = row("vanilla", 408.33, 3005.4);
        let b = row("local-prefix", 326.543, 513.4);
        let s = winner_sentence(&[&a, &b], "TTFT p50", |r| r.ttft_p50_ms).unwrap();
        assert_eq!(
            s,
            "**local-prefix** has the lowest TTFT p50: 326.5 ms, 1.25x faster than vanilla (408.3 ms)."
        );
    }

    #[test]
    fn policies_without_completed_requests_are_not_winners() {
        let a = row("vanilla", 408.0, 3005.0);
        let mut b = row("broken", 0.0, 0.0);
        b.completed = 0;
        let s = winner_sentence(&[&a, &b], "TTFT p50", |r| r.ttft_p50_ms).unwrap();
        assert_eq!(s, "Only vanilla completed requests: TTFT p50 408.0 ms.");
        b.policy = "also-broken".into();
        let c = row("x", 0.0, 0.0);
        let mut c = c;
        c.completed = 0;
        assert!(winner_sentence(&[&b, &c], "TTFT p50", |r| r.ttft_p50_ms).is_none());
    }

    #[test]
    fn the_links_tables_show_the_kinds_a_run_used_and_the_bytes_per_purpose() {
        let mut r = Results {
            summary: vec![row("vanilla", 1.0, 2.0), row("ptstore", 1.0, 2.0)],
            latencies: Vec::new(),
            scenario: None,
            tps_output: None,
        };
        let mut s = String::new();
        push_links(&mut s, &r);
        assert_eq!(s, "", "no link figures, no section");
        let mut l = super::super::LinkRow::default();
        l.bytes[LinkKind::Nic as usize] = 2_500_000_000;
        l.busy[LinkKind::Nic as usize] = 0.125;
        l.busiest[LinkKind::Nic as usize] = 0.5;
        l.bytes[LinkKind::Dram as usize] = 10_000_000;
        l.moved = [2_000_000_000, 0, 500_000_000, 0, 1_000];
        r.summary[1].links = Some(l);
        push_links(&mut s, &r);
        assert!(
            s.contains("| policy | NIC | host DRAM |\n|---|---:|---:|\n"),
            "{s}"
        );
        assert!(
            s.contains("| ptstore | 2.50 GB, 12.5 % (max 50.0 %) | 0.01 GB, 0.0 % (max 0.0 %) |"),
            "{s}"
        );
        assert!(
            s.contains("| ptstore | 2.00 | 0.00 | 0.50 | 0.00 | 0.00 |"),
            "{s}"
        );
        assert!(
            !s.contains("| vanilla"),
            "a row without link figures is left out: {s}"
        );
    }

    #[test]
    fn missing_scenario_keys_are_left_out() {
        let t: toml::Table = "name = \"x\"\n[model]\npreset = \"tiny\"\n"
            .parse()
            .unwrap();
        let v = toml::Value::Table(t);
        assert_eq!(scenario_lines(&v), vec!["- model: tiny".to_string()]);
    }
}
