//! Seeded random streams with pinned sampling algorithms.
//!
//! Every random choice in meshsim comes from a [`Stream`]: a ChaCha8 generator (rand_chacha)
//! whose key is the scenario seed and whose 64-bit ChaCha *stream number* names the consumer
//! (the workload generator, actor 7, ...). Streams are therefore independent, and adding a
//! consumer never shifts another one's numbers.
//!
//! The sampling algorithms are written here rather than taken from `rand`'s distributions,
//! whose algorithms may change between releases; transcendental functions come from `libm`
//! (pure Rust), so results are bit-identical on every platform.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Stream numbers of the consumers that are not actors. Actor `i` uses `ACTOR_BASE + i`.
pub mod streams {
    pub const WORKLOAD_DATASET: u64 = 1;
    pub const WORKLOAD_ORDER: u64 = 2;
    pub const WORKLOAD_ARRIVALS: u64 = 3;
    pub const WORKLOAD_OUTPUTS: u64 = 4;
    pub const WORKLOAD_POPULARITY: u64 = 5;
    pub const WORKLOAD_TURNS: u64 = 6;
    pub const WORKLOAD_ANSWERS: u64 = 7;
    pub const ACTOR_BASE: u64 = 1 << 32;
}

/// One independent random stream.
#[derive(Clone, Debug)]
pub struct Stream {
    rng: ChaCha8Rng,
}

impl Stream {
    /// The stream `stream` of the generator keyed by `seed`.
    pub fn new(seed: u64, stream: u64) -> Stream {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Stream { rng }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n), by rejection (unbiased). `n` must be non-zero.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    /// Exponential with the given rate (mean 1/rate), by inversion.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        -libm::log(1.0 - self.uniform()) / rate
    }

    /// Standard normal, by the Box-Muller transform (one value per call).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        libm::sqrt(-2.0 * libm::log(u1)) * libm::cos(2.0 * std::f64::consts::PI * u2)
    }

    /// Log-normal with the given median and log-space standard deviation.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * libm::exp(sigma * self.normal())
    }

    /// Poisson with mean `lambda`, by Knuth's multiplication method (fine for small means).
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        let limit = libm::exp(-lambda);
        let mut k = 0u64;
        let mut p = self.uniform();
        // Bounded: the expected number of rounds is lambda + 1; 10_000 covers any mean we use.
        while p > limit && k < 10_000 {
            k += 1;
            p *= self.uniform();
        }
        k
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_and_stream_give_the_same_numbers() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, 3);
                move |_| s.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut s = Stream::new(7, 3);
                move |_| s.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        let mut other = Stream::new(7, 4);
        assert_ne!(a[0], other.next_u64());
    }

    #[test]
    fn samplers_have_the_right_means() {
        let mut s = Stream::new(1, 1);
        let n = 200_000;
        let exp: f64 = (0..n).map(|_| s.exponential(4.0)).sum::<f64>() / n as f64;
        assert!((exp - 0.25).abs() < 0.005, "{exp}");
        let poi: f64 = (0..n).map(|_| s.poisson(4.1) as f64).sum::<f64>() / n as f64;
        assert!((poi - 4.1).abs() < 0.03, "{poi}");
        let mut ln: Vec<f64> = (0..n).map(|_| s.lognormal(167.0, 0.45)).collect();
        ln.sort_by(f64::total_cmp);
        assert!((ln[n / 2] - 167.0).abs() < 3.0, "{}", ln[n / 2]);
        for _ in 0..1000 {
            assert!(s.below(3) < 3);
        }
    }
}
