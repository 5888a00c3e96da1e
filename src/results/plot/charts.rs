//! The charts, drawn on any plotters backend (PNG bitmap and SVG share this code).
//!
//! Colours: each policy keeps one colour (Okabe-Ito palette, readable by colour-blind
//! readers) in every chart, by its order in `summary.csv`; tiers have their own colours.

use std::error::Error;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::data::{Latencies, Results, SummaryRow, TpsSeries};
use super::font::FAMILY;
use crate::metrics::Tier;

pub(crate) type DrawResult = Result<(), Box<dyn Error + Send + Sync>>;

/// Okabe-Ito colours, then black.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(240, 228, 66),
    RGBColor(0, 0, 0),
];

/// One colour per tier, in [`Tier::ALL`] order: GPU dark, local tiers green, remote orange.
const TIER_COLORS: [RGBColor; 5] = [
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(120, 200, 170),
    RGBColor(213, 94, 0),
    RGBColor(240, 170, 110),
];

const TITLE_SIZE: u32 = 28;
const PANEL_TITLE_SIZE: u32 = 22;
const LABEL_SIZE: u32 = 16;
const DESC_SIZE: u32 = 18;
/// Points drawn per CDF curve at most (quantiles of the sorted samples): keeps SVGs small.
const CDF_POINTS: usize = 800;

fn policy_color(r: &Results, policy: &str) -> RGBColor {
    let i = r
        .summary
        .iter()
        .position(|s| s.policy == policy)
        .or_else(|| r.latencies.iter().position(|l| l.policy == policy))
        .unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font())
}

/// A tick label on an axis whose largest value is `top`: the same decimals on the whole axis.
fn tick(v: f64, top: f64) -> String {
    let top = top.abs();
    if top >= 20.0 {
        format!("{v:.0}")
    } else if top >= 2.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A logarithmic axis from `lo` to `hi` (both > 0) with ticks at 1, 2 and 5 times powers of
/// ten (plotters' own log axis leaves decades unlabelled).
#[derive(Clone, Copy)]
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl Ranged for LogAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (a, b) = (self.lo.log10(), self.hi.log10());
        let frac = (v.max(f64::MIN_POSITIVE).log10() - a) / (b - a);
        limit
            .0
            .saturating_add(((limit.1 - limit.0) as f64 * frac).round() as i32)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        let mut steps: &[f64] = &[1.0, 2.0, 5.0];
        let decades = (self.hi / self.lo).log10();
        if decades * 3.0 > hint.max_num_points() as f64 {
            steps = &[1.0];
        }
        let mut out = Vec::new();
        let first = self.lo.log10().floor() as i32;
        let last = self.hi.log10().ceil() as i32;
        // Bounded: latencies span a few decades; 40 decades is far beyond any real range.
        for k in first..=last.min(first + 40) {
            for &m in steps {
                let v = m * 10f64.powi(k);
                if v >= self.lo && v <= self.hi {
                    out.push(v);
                }
            }
        }
        out
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// A tick label on a log axis: as many decimals as the value needs, up to 3.
fn log_tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

/// A log axis range around the positive finite `values`, with some room on both sides;
/// always finite, positive and non-empty (`1..10` when nothing else is).
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    let (a, b) = (lo * 0.8, (hi * 1.25).max(lo * 2.0));
    if hi <= 0.0 || !(a > 0.0 && b.is_finite() && a < b) {
        (1.0, 10.0)
    } else {
        (a, b)
    }
}

/// `top` as the end of a linear axis from 0 when it is finite and positive, else 1. plotters
/// looks for the ticks of an infinite axis forever, so no input may make one.
fn finite_top(top: f64) -> f64 {
    if top.is_finite() && top > 0.0 {
        top
    } else {
        1.0
    }
}

/// The series legend, in the charts' common style.
fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    pos: SeriesLabelPosition,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(pos)
        .label_font(text(LABEL_SIZE))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

/// Splits `root` under a figure title into `n` side-by-side panels.
fn panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    n: usize,
) -> Result<Vec<DrawingArea<DB, Shift>>, Box<dyn Error + Send + Sync>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let body = root.margin(8, 0, 0, 0).titled(title, text(TITLE_SIZE))?;
    Ok(if n == 1 {
        vec![body]
    } else {
        body.split_evenly((1, n))
    })
}

/// The quantile points of a sorted sample: (value, fraction of samples at or below it).
pub(crate) fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let m = n.min(CDF_POINTS);
    if m == 1 {
        return vec![(sorted[0], 1.0)];
    }
    (0..m)
        .map(|j| {
            let i = j * (n - 1) / (m - 1);
            (sorted[i], (i + 1) as f64 / n as f64)
        })
        .collect()
}

/// A CDF per policy on a logarithmic x axis (latencies span orders of magnitude).
pub(crate) fn cdf<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    r: &Results,
    title: &str,
    x_desc: &str,
    pick: fn(&Latencies) -> &[f64],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let area = panels(root, title, 1)?.remove(0);
    let positive = |l: &Latencies| {
        pick(l)
            .iter()
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect::<Vec<_>>()
    };
    let (lo, hi) = log_range(r.latencies.iter().flat_map(positive));
    let mut chart = ChartBuilder::on(&area)
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(70)
        .build_cartesian_2d(LogAxis { lo, hi }, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction of completed requests")
        .x_label_formatter(&|v| log_tick(*v))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .label_style(text(LABEL_SIZE))
        .axis_desc_style(text(DESC_SIZE))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .draw()?;
    for l in &r.latencies {
        let color = policy_color(r, &l.policy);
        let pts = cdf_points(&positive(l));
        let label = format!("{} (n = {})", l.policy, pick(l).len());
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(3)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
    }
    for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(lo, q), (hi, q)],
            BLACK.mix(0.35).stroke_width(1),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            name,
            (lo * 1.02, q),
            text(LABEL_SIZE).pos(Pos::new(HPos::Left, VPos::Bottom)),
        )))?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present()?;
    Ok(())
}

/// An x axis of `n` categories at 0, 1, ..., n - 1, each in a slot one unit wide.
#[derive(Clone, Copy)]
struct Categories(usize);

impl Ranged for Categories {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let frac = (v + 0.5) / self.0.max(1) as f64;
        limit
            .0
            .saturating_add(((limit.1 - limit.0) as f64 * frac).round() as i32)
    }

    fn key_points<H: KeyPointHint>(&self, _: H) -> Vec<f64> {
        (0..self.0).map(|i| i as f64).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        -0.5..self.0 as f64 - 0.5
    }
}

/// One bar per row, or a stack of segments per row. `stacks[k]` is (legend, colour, value per
/// row); with one stack the bars take the rows' policy colours and carry value labels.
struct Bars<'a> {
    title: &'a str,
    y_desc: &'a str,
    rows: &'a [SummaryRow],
    stacks: Vec<(String, RGBColor, Vec<f64>)>,
    value_label: &'a dyn Fn(usize, f64) -> String,
}

fn bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, r: &Results, b: Bars) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let n = b.rows.len();
    let totals: Vec<f64> = (0..n)
        .map(|i| b.stacks.iter().map(|s| s.2[i]).sum())
        .collect();
    let max = totals.iter().copied().fold(0.0, f64::max);
    let stacked = b.stacks.len() > 1;
    // Head room for value labels, or for the legend of stacked bars.
    let top = finite_top(if max > 0.0 { max } else { 1.0 } * if stacked { 1.5 } else { 1.15 });
    let labels: Vec<String> = b.rows.iter().map(SummaryRow::label).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(b.title, text(PANEL_TITLE_SIZE))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(Categories(n), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(b.y_desc)
        .x_label_formatter(&|v| {
            labels
                .get(v.round().max(0.0) as usize)
                .cloned()
                .unwrap_or_default()
        })
        .y_label_formatter(&|v| tick(*v, top))
        .label_style(text(LABEL_SIZE))
        .axis_desc_style(text(DESC_SIZE))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .draw()?;
    let half = 0.3;
    // What a bar can show of a value: only what fits on the axis (all of any value a results
    // file may hold; a value built in memory may be infinite).
    let fit = |v: f64| {
        if v.is_finite() {
            v.clamp(0.0, top)
        } else {
            0.0
        }
    };
    let mut base = vec![0.0; n];
    for (name, color, values) in &b.stacks {
        let rects: Vec<Rectangle<(f64, f64)>> = (0..n)
            .map(|i| {
                let fill = if stacked {
                    *color
                } else {
                    policy_color(r, &b.rows[i].policy)
                };
                let x = i as f64;
                Rectangle::new(
                    [(x - half, base[i]), (x + half, base[i] + fit(values[i]))],
                    fill.filled(),
                )
            })
            .collect();
        let color = *color;
        let series = chart.draw_series(rects)?;
        if stacked {
            series.label(name.as_str()).legend(move |(x, y)| {
                Rectangle::new([(x, y - 7), (x + 16, y + 7)], color.filled())
            });
        }
        for (b, v) in base.iter_mut().zip(values) {
            *b += fit(*v);
        }
    }
    let labels = (0..n).map(|i| {
        Text::new(
            (b.value_label)(i, totals[i]),
            (i as f64, fit(totals[i]) + top * 0.01),
            text(LABEL_SIZE).pos(Pos::new(HPos::Center, VPos::Bottom)),
        )
    });
    chart.draw_series(labels)?;
    if stacked {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(text(LABEL_SIZE))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .draw()?;
    }
    Ok(())
}

fn single(values: Vec<f64>) -> Vec<(String, RGBColor, Vec<f64>)> {
    vec![(String::new(), BLACK, values)]
}

/// TTFT p50 and p99 per policy, side by side.
pub(crate) fn ttft_percentiles<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    r: &Results,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    if r.summary.iter().any(|s| s.point.is_some()) {
        return ttft_against_points(root, r);
    }
    let p = panels(root, "Time to first token (TTFT) per policy", 2)?;
    let ms = |_: usize, v: f64| format!("{v:.1} ms");
    for (area, (title, pick)) in p.iter().zip(TTFT_PANELS) {
        let b = Bars {
            title,
            y_desc: "TTFT (ms)",
            rows: &r.summary,
            stacks: single(r.summary.iter().map(pick).collect()),
            value_label: &ms,
        };
        bars(area, r, b)?;
    }
    root.present()?;
    Ok(())
}

/// A summary value a panel shows.
type Pick = fn(&SummaryRow) -> f64;

/// The two TTFT panels: their titles and the summary value each shows.
const TTFT_PANELS: [(&str, Pick); 2] = [
    ("median (p50)", |s| s.ttft_p50_ms),
    ("99th percentile (p99)", |s| s.ttft_p99_ms),
];

/// For a sweep: TTFT p50 and p99 of each policy against the sweep points, on a log scale.
fn ttft_against_points<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &Results) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let mut points: Vec<&str> = Vec::new();
    let mut policies: Vec<&str> = Vec::new();
    for s in &r.summary {
        let p = s.point.as_deref().unwrap_or("");
        if !points.contains(&p) {
            points.push(p);
        }
        if !policies.contains(&s.policy.as_str()) {
            policies.push(&s.policy);
        }
    }
    // One swept key: name the axis after it and label ticks with its values alone.
    let key = points
        .first()
        .and_then(|p| p.split_once('='))
        .map(|(k, _)| k)
        .filter(|k| {
            points.iter().all(|p| {
                p.split_once('=')
                    .is_some_and(|(pk, v)| pk == *k && !v.contains('='))
            })
        });
    let ticks: Vec<String> = points
        .iter()
        .map(|p| match key {
            Some(_) => p.split_once('=').map_or(*p, |(_, v)| v).to_string(),
            None => p.to_string(),
        })
        .collect();
    let x_desc = key.unwrap_or("sweep point");
    let p = panels(root, "Time to first token (TTFT) across the sweep", 2)?;
    for (area, (title, pick)) in p.iter().zip(TTFT_PANELS) {
        let (lo, hi) = log_range(r.summary.iter().map(pick).filter(|v| *v > 0.0));
        let mut chart = ChartBuilder::on(area)
            .caption(title, text(PANEL_TITLE_SIZE))
            .margin(20)
            .x_label_area_size(55)
            .y_label_area_size(70)
            .build_cartesian_2d(Categories(points.len()), LogAxis { lo, hi })?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("TTFT (ms, log scale)")
            .x_label_formatter(&|v| {
                ticks
                    .get(v.round().max(0.0) as usize)
                    .cloned()
                    .unwrap_or_default()
            })
            .y_label_formatter(&|v| log_tick(*v))
            .label_style(text(LABEL_SIZE))
            .axis_desc_style(text(DESC_SIZE))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .draw()?;
        for policy in &policies {
            let color = policy_color(r, policy);
            let series: Vec<(f64, f64)> = points
                .iter()
                .enumerate()
                .filter_map(|(i, pt)| {
                    r.summary
                        .iter()
                        .find(|s| s.policy == *policy && s.point.as_deref() == Some(*pt))
                        .map(|s| (i as f64, pick(s)))
                        .filter(|(_, v)| v.is_finite() && *v > 0.0)
                })
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(3)))?
                .label(*policy)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                });
            chart.draw_series(
                series
                    .into_iter()
                    .map(|xy| Circle::new(xy, 5, color.filled())),
            )?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}

/// Output tokens per second of the whole system, per policy.
pub(crate) fn throughput<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    r: &Results,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let p = panels(root, "Output throughput per policy", 1)?;
    let label = |i: usize, v: f64| {
        format!(
            "{v:.0} tokens/s ({:.1} requests/s)",
            r.summary[i].throughput_rps
        )
    };
    let b = Bars {
        title: "",
        y_desc: "output tokens/s",
        rows: &r.summary,
        stacks: single(r.summary.iter().map(|s| s.output_tokens_per_s).collect()),
        value_label: &label,
    };
    bars(&p[0], r, b)?;
    root.present()?;
    Ok(())
}

/// Prefix-hit ratio per policy, and reused prompt tokens per tier.
pub(crate) fn prefix_hits<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    r: &Results,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let p = panels(root, "Prefix reuse per policy", 3)?;
    let pct = |_: usize, v: f64| format!("{v:.1} %");
    bars(
        &p[0],
        r,
        Bars {
            title: "prefix-hit ratio",
            y_desc: "reused / prompt tokens (%)",
            rows: &r.summary,
            stacks: single(
                r.summary
                    .iter()
                    .map(|s| 100.0 * s.prefix_hit_ratio)
                    .collect(),
            ),
            value_label: &pct,
        },
    )?;
    let max = r
        .summary
        .iter()
        .map(|s| s.reused_tokens.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let (div, unit) = if max >= 10_000_000 {
        (1e6, "millions of tokens")
    } else if max >= 10_000 {
        (1e3, "thousands of tokens")
    } else {
        (1.0, "tokens")
    };
    let stacks = Tier::ALL
        .iter()
        .zip(TIER_COLORS)
        .enumerate()
        .map(|(k, (tier, color))| {
            let values = r
                .summary
                .iter()
                .map(|s| s.reused_tokens[k] as f64 / div)
                .collect();
            (tier.name().to_string(), color, values)
        })
        .collect();
    let top_total = r
        .summary
        .iter()
        .map(|s| s.reused_tokens.iter().sum::<u64>() as f64 / div)
        .fold(0.0, f64::max);
    let total = |_: usize, v: f64| tick(v, top_total);
    let y_desc = format!("reused prompt tokens ({unit})");
    bars(
        &p[1],
        r,
        Bars {
            title: "reused tokens by tier",
            y_desc: &y_desc,
            rows: &r.summary,
            stacks,
            value_label: &total,
        },
    )?;
    let gb = |row: &SummaryRow| row.loaded_bytes.iter().sum::<u64>() as f64 / 1e9;
    let top_gb = r.summary.iter().map(gb).fold(0.0, f64::max);
    let stacks = Tier::ALL[1..]
        .iter()
        .zip(&TIER_COLORS[1..])
        .enumerate()
        .map(|(k, (tier, &color))| {
            let values = r
                .summary
                .iter()
                .map(|s| s.loaded_bytes[k] as f64 / 1e9)
                .collect();
            (tier.name().to_string(), color, values)
        })
        .collect();
    let total_gb = |_: usize, v: f64| tick(v, top_gb);
    bars(
        &p[2],
        r,
        Bars {
            title: "KV bytes moved by tier",
            y_desc: "KV loaded from the store (GB)",
            rows: &r.summary,
            stacks,
            value_label: &total_gb,
        },
    )?;
    root.present()?;
    Ok(())
}

/// A logarithmic axis from `lo` to `hi` (both > 0) with ticks at given values only (the
/// output lengths present), thinned evenly when there are more than the axis has room for.
#[derive(Clone)]
struct TickedLogAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ranged for TickedLogAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        LogAxis {
            lo: self.lo,
            hi: self.hi,
        }
        .map(v, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        let step = self
            .ticks
            .len()
            .div_ceil(hint.max_num_points().max(1))
            .max(1);
        self.ticks.iter().copied().step_by(step).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// For pipeline results: the median per-request output tokens per second (output tokens /
/// (end - arrival)) of each policy against output length, on a logarithmic length axis.
pub(crate) fn tps_output<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    r: &Results,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let area = panels(
        root,
        "Per-request output tokens per second against output length",
        1,
    )?
    .remove(0);
    let series: &[TpsSeries] = r.tps_output.as_deref().unwrap_or(&[]);
    let points = || series.iter().flat_map(|s| &s.points);
    let mut ticks: Vec<f64> = points().map(|p| f64::from(p.to)).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    let (lo, hi) = match (ticks.first(), ticks.last()) {
        (Some(&a), Some(&b)) => (a / std::f64::consts::SQRT_2, b * std::f64::consts::SQRT_2),
        _ => (1.0, 1024.0),
    };
    let x_desc = if points().any(|p| p.from != p.to) {
        "output tokens (power-of-two bins, shown at their longest length)"
    } else {
        "output tokens"
    };
    let max = points().map(|p| p.median_tps).fold(0.0, f64::max);
    // Head room for the legend above the lines.
    let top = finite_top(if max > 0.0 { max * 1.3 } else { 1.0 });
    let mut chart = ChartBuilder::on(&area)
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(TickedLogAxis { lo, hi, ticks }, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("output tokens/s per request (median)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| tick(*v, top))
        .label_style(text(LABEL_SIZE))
        .axis_desc_style(text(DESC_SIZE))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .draw()?;
    // Policy colours, unless a policy has several series (other swept keys).
    let one_per_policy = series
        .iter()
        .enumerate()
        .all(|(i, s)| series[..i].iter().all(|o| o.policy != s.policy));
    for (i, s) in series.iter().enumerate() {
        let color = if one_per_policy {
            policy_color(r, &s.policy)
        } else {
            PALETTE[i % PALETTE.len()]
        };
        let xy: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (f64::from(p.to), p.median_tps))
            .filter(|(_, tps)| tps.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(xy.clone(), color.stroke_width(3)))?
            .label(format!("{} (n = {})", s.label(), s.requests()))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart.draw_series(xy.into_iter().map(|xy| Circle::new(xy, 5, color.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_points_keep_the_extremes_and_end_at_one() {
        let v: Vec<f64> = (1..=5000).map(f64::from).collect();
        let p = cdf_points(&v);
        assert_eq!(p.len(), CDF_POINTS);
        assert_eq!(p[0], (1.0, 1.0 / 5000.0));
        assert_eq!(*p.last().unwrap(), (5000.0, 1.0));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(cdf_points(&[3.0]), vec![(3.0, 1.0)]);
        assert!(cdf_points(&[]).is_empty());
    }

    #[test]
    fn ticks_drop_decimals_as_the_axis_grows() {
        assert_eq!(tick(1234.5, 2000.0), "1234");
        assert_eq!(tick(0.0, 2000.0), "0");
        assert_eq!(tick(12.34, 15.0), "12.3");
        assert_eq!(tick(0.126, 1.0), "0.13");
        assert_eq!(log_tick(0.5), "0.5");
        assert_eq!(log_tick(200.0), "200");
    }

    #[test]
    fn log_axis_ticks_are_one_two_five_per_decade() {
        let a = LogAxis {
            lo: 13.0,
            hi: 600.0,
        };
        assert_eq!(a.key_points(30), vec![20.0, 50.0, 100.0, 200.0, 500.0]);
        let wide = LogAxis { lo: 0.5, hi: 2e6 };
        assert_eq!(
            wide.key_points(12),
            vec![1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
        );
    }

    #[test]
    fn axis_ranges_are_finite_and_non_empty_whatever_the_values() {
        assert_eq!(log_range([10.0, 100.0].into_iter()), (8.0, 125.0));
        for bad in [f64::INFINITY, f64::NAN, -1.0, 0.0] {
            assert_eq!(log_range([bad].into_iter()), (1.0, 10.0), "{bad}");
            assert_eq!(finite_top(bad), 1.0, "{bad}");
        }
        assert_eq!(log_range([f64::INFINITY, 10.0].into_iter()), (8.0, 20.0));
        assert_eq!(log_range([f64::MAX].into_iter()), (1.0, 10.0));
        assert_eq!(finite_top(2.5), 2.5);
    }

    #[test]
    fn ticked_log_axis_keeps_its_ticks_and_thins_them() {
        let a = TickedLogAxis {
            lo: 40.0,
            hi: 800.0,
            ticks: vec![64.0, 128.0, 512.0],
        };
        assert_eq!(a.key_points(10), vec![64.0, 128.0, 512.0]);
        assert_eq!(a.key_points(2), vec![64.0, 512.0]);
        assert!(a.map(&64.0, (0, 100)) < a.map(&128.0, (0, 100)));
    }
}
