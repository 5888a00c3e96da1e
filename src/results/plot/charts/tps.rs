//! Output tokens per second against output length (pipeline results).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::super::data::{Results, TpsSeries};
use super::axes::*;
use super::{DESC_SIZE, DrawResult, LABEL_SIZE, PALETTE, legend, panels, policy_color, text};

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
