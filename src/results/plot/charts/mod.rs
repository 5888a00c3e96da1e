//! The charts, drawn on any plotters backend (PNG bitmap and SVG share this code).
//!
//! Colours: each policy keeps one colour (Okabe-Ito palette, readable by colour-blind
//! readers) in every chart, by its order in `summary.csv`; tiers have their own colours.

use std::error::Error;

use plotters::coord::Shift;
use plotters::coord::ranged1d::Ranged;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::data::{Latencies, Results, SummaryRow};
use super::font::FAMILY;
use crate::metrics::Tier;

mod axes;
mod tps;

pub(crate) use tps::tps_output;

use axes::*;

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

#[cfg(test)]
mod tests;
