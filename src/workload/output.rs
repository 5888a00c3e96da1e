//! Output lengths of generated requests, shared by every generator ([`super::qa`],
//! [`super::reuse`]): a fixed length, a uniform range, or a log-normal with a cap.

use crate::rng::Stream;

/// Output lengths in tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OutputDist {
    Fixed { tokens: u32 },
    Uniform { min: u32, max: u32 },
    LogNormal { median: f64, sigma: f64, max: u32 },
}

impl OutputDist {
    /// The longest output the distribution gives.
    pub fn max(&self) -> u32 {
        match *self {
            OutputDist::Fixed { tokens } => tokens,
            OutputDist::Uniform { max, .. } | OutputDist::LogNormal { max, .. } => max,
        }
    }

    pub fn sample(&self, rng: &mut Stream) -> u32 {
        match *self {
            OutputDist::Fixed { tokens } => tokens,
            OutputDist::Uniform { min, max } => rng.range_inclusive(min as u64, max as u64) as u32,
            OutputDist::LogNormal { median, sigma, max } => {
                (libm::round(rng.lognormal(median, sigma)) as u32).clamp(1, max)
            }
        }
    }
}
