//! The axes of the charts: tick labels, logarithmic axes (plain and with given ticks), and
//! category axes for bars. Every range handed to plotters is finite and non-empty.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

/// A tick label on an axis whose largest value is `top`: the same decimals on the whole axis.
pub(super) fn tick(v: f64, top: f64) -> String {
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
pub(super) struct LogAxis {
    pub(super) lo: f64,
    pub(super) hi: f64,
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
pub(super) fn log_tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

/// A log axis range around the positive finite `values`, with some room on both sides;
/// always finite, positive and non-empty (`1..10` when nothing else is).
pub(super) fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
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
pub(super) fn finite_top(top: f64) -> f64 {
    if top.is_finite() && top > 0.0 {
        top
    } else {
        1.0
    }
}

/// An x axis of `n` categories at 0, 1, ..., n - 1, each in a slot one unit wide.
#[derive(Clone, Copy)]
pub(super) struct Categories(pub(super) usize);

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

/// A logarithmic axis from `lo` to `hi` (both > 0) with ticks at given values only (the
/// output lengths present), thinned evenly when there are more than the axis has room for.
#[derive(Clone)]
pub(super) struct TickedLogAxis {
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) ticks: Vec<f64>,
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
