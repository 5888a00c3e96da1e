//! Units used across meshsim: simulated time in integer nanoseconds and sizes in bytes.
//!
//! Time is an integer so that event order never depends on floating-point rounding
//! (DESIGN contract 2). Rates (bandwidths, FLOP/s) are `f64`; a duration computed from a
//! rate is rounded *up* to the next nanosecond, so that no non-empty piece of work is free.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// `x` rounded up to a whole number, for `x` from 0 up (a negative `x` gives 0); `None` when
/// it does not fit a `u64` or is NaN. Exactly `libm::ceil(x) as u64` (tested), without the
/// library call: the baseline x86-64 target has no rounding instruction, and every simulated
/// transfer and iteration rounds its duration.
#[inline]
pub fn ceil_u64(x: f64) -> Option<u64> {
    // `x as u64` truncates (a negative `x` saturates to 0), and is exact wherever `x` has a
    // fraction (below 2^53); at and above 2^53 every `f64` is whole, and the cast is exact.
    if x.is_nan() || x >= u64::MAX as f64 {
        return None;
    }
    let t = x as u64;
    Some(if (t as f64) < x { t + 1 } else { t })
}

/// A point in simulated time or a duration, in nanoseconds.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Nanos(pub u64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);
    pub const MAX: Nanos = Nanos(u64::MAX);

    pub const fn from_us(us: u64) -> Nanos {
        Nanos(us * 1_000)
    }
    pub const fn from_ms(ms: u64) -> Nanos {
        Nanos(ms * 1_000_000)
    }
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s * 1_000_000_000)
    }
    /// Seconds (f64) to nanoseconds, rounded up; negative or NaN inputs give zero.
    pub fn from_secs_f64(s: f64) -> Nanos {
        if s.is_nan() || s <= 0.0 {
            return Nanos::ZERO;
        }
        ceil_u64(s * 1e9).map_or(Nanos::MAX, Nanos)
    }
    /// Time to move `bytes` at `bytes_per_s`, rounded up to the next nanosecond.
    pub fn for_bytes(bytes: u64, bytes_per_s: f64) -> Nanos {
        if bytes == 0 {
            return Nanos::ZERO;
        }
        Nanos::from_secs_f64(bytes as f64 / bytes_per_s)
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    pub fn as_ms_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }
    pub fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }
}

impl Add for Nanos {
    type Output = Nanos;
    fn add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Nanos {
    fn add_assign(&mut self, rhs: Nanos) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl Sub for Nanos {
    type Output = Nanos;
    fn sub(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(rhs.0))
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6} s", self.as_secs_f64())
    }
}

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// Decimal gigabyte, as used by vendors for link and disk figures.
pub const GB: f64 = 1e9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_the_next_nanosecond() {
        assert_eq!(Nanos::for_bytes(1, 1e9), Nanos(1));
        assert_eq!(Nanos::for_bytes(3, 2e9), Nanos(2));
        assert_eq!(Nanos::for_bytes(0, 1.0), Nanos::ZERO);
        assert_eq!(Nanos::from_secs_f64(1.5), Nanos(1_500_000_000));
        assert_eq!(Nanos::from_secs_f64(-1.0), Nanos::ZERO);
    }

    /// The library's ceil: the reference that `ceil_u64` must match.
    fn by_libm(x: f64) -> Option<u64> {
        let c = libm::ceil(x);
        (!c.is_nan() && c < u64::MAX as f64).then_some(c as u64)
    }

    #[test]
    fn ceil_u64_is_the_library_ceil() {
        let edges = [
            0.0,
            -0.0,
            -0.5,
            -3.0,
            1e-300,
            0.5,
            1.0,
            1.0 + f64::EPSILON,
            2.0f64.powi(52) - 0.5,
            2.0f64.powi(52) + 1.0,
            2.0f64.powi(53) - 1.0,
            2.0f64.powi(53),
            2.0f64.powi(63),
            2.0f64.powi(64) - 2048.0,
            2.0f64.powi(64),
            1e30,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for x in edges {
            assert_eq!(ceil_u64(x), by_libm(x), "{x}");
        }
        let mut rng = crate::rng::Stream::new(3, 0);
        for _ in 0..200_000 {
            // Any magnitude from 2^-20 to 2^70, and durations as simulations make them.
            let x = libm::exp2(rng.uniform() * 90.0 - 20.0);
            let d = rng.below(1 << 40) as f64 / (1.0 + rng.uniform() * 1e3) * 1e9;
            for v in [x, d, x.next_up(), x.next_down()] {
                assert_eq!(ceil_u64(v), by_libm(v), "{v}");
            }
        }
    }
}
