//! A measured profile of the batch backend of serving instances (the `[serving]` table of a
//! profile file, written by `meshsim profile --serving`).
//!
//! The real batch backend ([`crate::backend::PagedCandleBackend`]) computes an iteration
//! member by member, each one forward of its new tokens over the K/V it gathers from its
//! blocks. `meshsim profile --serving` times whole iterations of chosen shapes:
//!
//! - **prefill** chunks: one member, `n` new tokens, `c` cached tokens, for a grid of `n`
//!   (from an empty cache), and chunks of a few sizes after each of a grid of cached
//!   contexts `c`;
//! - **decode** steps: `b` members each computing one token after `c` cached tokens, for a
//!   grid of batch sizes and contexts;
//!
//! and the store's data path: **export** of `k` whole tensors from the blocks to host memory
//! and **load** of `k` tensors from host memory into the blocks, by bytes.
//!
//! A simulation sees an iteration only as a [`BatchShape`] (sums over its members), so the
//! profile prices an iteration with a linear model of those sums, fitted to the measured
//! iterations by least squares with non-negative coefficients:
//!
//! `ns = c0 x members + c1 x chunk members + c2 x new tokens + c3 x attention pairs
//!       + c4 x K/V tokens read + c5 x cached tokens of chunk members`
//!
//! (a member's fixed cost, its embedding and LM head among them; what a member of more than
//! one new token pays on top, once (its causal mask, matrix-matrix products where a one-token
//! member has vector-matrix ones); the per-token work of the layers; attention; gathering the
//! K/V from the blocks; and what a chunk member pays per cached token on top of a decode
//! step). The backend computes member by member, so an iteration has no cost of its own: the
//! fit has no constant term (`serving.iteration_overhead_us` is the scheduler's). Each point
//! weighs by the inverse of its time (least squares of relative errors). In the bundled
//! profile of a 2-core CPU (`profiles/tiny-32k_serving_cpu.toml`), a one-token step costs
//! mostly its members' fixed cost (the LM head of a 32,000-id vocabulary), a chunk member
//! costs a little more, and the measured points sit close to the fit. The extra cost is per
//! chunk member, not per iteration: a constant per iteration over-prices the decode steps of
//! a live run (logged with `-vv`). The fit is made when the file is read, from the points it
//! holds, so the file holds only measurements. Loads and exports are priced by a least-squares
//! line in bytes; `meshsim profile` prints their throughput, which a scenario's links should
//! give (see docs/live.md, "Calibration: serving profiles").

use crate::model::cost::BatchShape;
use crate::units::Nanos;

/// One measured iteration: `members` sequences, each computing `new_tokens` after `cached`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IterationPoint {
    pub members: u32,
    pub new_tokens: u32,
    pub cached: u32,
    pub time: Nanos,
}

impl IterationPoint {
    /// The iteration as a simulation sees it.
    pub fn shape(&self) -> BatchShape {
        let mut b = BatchShape::default();
        for _ in 0..self.members {
            b.add(self.new_tokens as u64, self.cached as u64, true);
        }
        b
    }
}

/// Number of terms of the fitted model.
pub const TERMS: usize = 6;

/// The terms of the fitted model for `b`: members, chunk members (more than one new token),
/// new tokens, attention pairs, K/V tokens read, cached tokens of chunk members.
pub fn terms(b: &BatchShape) -> [f64; TERMS] {
    [
        b.seqs as f64,
        b.chunk_seqs as f64,
        b.new_tokens as f64,
        b.attention_pairs as f64,
        b.kv_read_tokens as f64,
        b.chunk_cached_tokens as f64,
    ]
}

/// The measured profile of a batch backend. See the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchProfile {
    pub block_size: u32,
    pub tensor_tokens: u32,
    pub iterations: Vec<IterationPoint>,
    /// `(bytes, ns)` of exporting, and of loading, whole tensors.
    pub export: Vec<(u64, Nanos)>,
    pub load: Vec<(u64, Nanos)>,
}

/// The fitted iteration model of a [`BatchProfile`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchFit {
    /// Nanoseconds per unit of each term (see [`terms`]), all >= 0.
    pub coef: [f64; TERMS],
}

impl std::fmt::Display for BatchFit {
    /// The model with its coefficients: `ns = ... x members + ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.coef;
        write!(
            f,
            "ns = {:.0} x members + {:.0} x chunk members + {:.1} x new tokens + {:.4} x \
             attention pairs + {:.2} x K/V tokens read + {:.2} x cached tokens of chunk members",
            c[0], c[1], c[2], c[3], c[4], c[5]
        )
    }
}

impl BatchFit {
    /// The modelled nanoseconds of iterations whose terms ([`terms`]) sum to `sums`.
    pub fn price(&self, sums: &[f64; TERMS]) -> f64 {
        sums.iter().zip(&self.coef).map(|(x, c)| x * c).sum()
    }

    /// The modelled time of iteration `b` (zero for an empty one).
    pub fn iteration(&self, b: &BatchShape) -> Nanos {
        if b.is_empty() {
            return Nanos::ZERO;
        }
        Nanos::from_secs_f64(self.price(&terms(b)).max(0.0) / 1e9)
    }
}

impl BatchProfile {
    /// The least-squares fit of the iteration model (see the module doc), of relative errors:
    /// each point weighs by the inverse of its time, so that a 5 ms decode step counts as
    /// much as a 100 ms prefill.
    pub fn fit(&self) -> BatchFit {
        let rows: Vec<([f64; TERMS], f64)> = self
            .iterations
            .iter()
            .map(|p| {
                let y = (p.time.0 as f64).max(1.0);
                (terms(&p.shape()).map(|x| x / y), 1.0)
            })
            .collect();
        BatchFit {
            coef: nonnegative_least_squares(&rows),
        }
    }

    /// `(fixed ns, ns per byte)` of exports, and of loads: least-squares lines.
    pub fn export_line(&self) -> (f64, f64) {
        line(&self.export)
    }
    pub fn load_line(&self) -> (f64, f64) {
        line(&self.load)
    }
}

/// The least-squares line `ns = a + b x bytes` through `points` (`a, b >= 0`).
fn line(points: &[(u64, Nanos)]) -> (f64, f64) {
    let rows: Vec<([f64; TERMS], f64)> = points
        .iter()
        .map(|&(x, t)| ([1.0, x as f64, 0.0, 0.0, 0.0, 0.0], t.0 as f64))
        .collect();
    let c = nonnegative_least_squares(&rows);
    (c[0], c[1])
}

/// Least squares with every coefficient >= 0 (an active set: a term whose unconstrained
/// coefficient is negative is dropped and the rest refitted; at most [`TERMS`] rounds). Terms
/// that no row uses get 0.
pub fn nonnegative_least_squares(rows: &[([f64; TERMS], f64)]) -> [f64; TERMS] {
    let mut active = [true; TERMS];
    for (k, a) in active.iter_mut().enumerate() {
        *a = rows.iter().any(|(x, _)| x[k] != 0.0);
    }
    for _ in 0..TERMS {
        let idx: Vec<usize> = (0..TERMS).filter(|&k| active[k]).collect();
        let n = idx.len();
        if n == 0 {
            return [0.0; TERMS];
        }
        // Normal equations on the active terms, scaled for conditioning.
        let scale: Vec<f64> = idx
            .iter()
            .map(|&k| {
                rows.iter()
                    .map(|(x, _)| x[k] * x[k])
                    .sum::<f64>()
                    .sqrt()
                    .max(1e-300)
            })
            .collect();
        let mut a = vec![vec![0.0; n + 1]; n];
        for (x, y) in rows {
            for i in 0..n {
                let xi = x[idx[i]] / scale[i];
                for j in 0..n {
                    a[i][j] += xi * x[idx[j]] / scale[j];
                }
                a[i][n] += xi * y;
            }
        }
        let Some(sol) = solve(a) else {
            // Singular: drop the last active term and refit.
            if let Some(&k) = idx.last() {
                active[k] = false;
            }
            continue;
        };
        let coef: Vec<f64> = sol.iter().zip(&scale).map(|(s, d)| s / d).collect();
        if let Some(worst) = (0..n).filter(|&i| coef[i] < 0.0).min_by(|&i, &j| {
            coef[i]
                .partial_cmp(&coef[j])
                .unwrap_or(std::cmp::Ordering::Equal)
        }) {
            active[idx[worst]] = false;
            continue;
        }
        let mut out = [0.0; TERMS];
        for (i, &k) in idx.iter().enumerate() {
            out[k] = coef[i];
        }
        return out;
    }
    [0.0; TERMS]
}

/// Gaussian elimination with partial pivoting of the augmented `n x (n + 1)` system.
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| {
            a[i][col]
                .abs()
                .partial_cmp(&a[j][col].abs())
                .unwrap_or(std::cmp::Ordering::Equal)
        })?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        let pivot = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(members: u32, new_tokens: u32, cached: u32, coef: [f64; TERMS]) -> IterationPoint {
        let mut p = IterationPoint {
            members,
            new_tokens,
            cached,
            time: Nanos(0),
        };
        let t: f64 = terms(&p.shape()).iter().zip(coef).map(|(x, c)| x * c).sum();
        p.time = Nanos(t.round() as u64);
        p
    }

    #[test]
    fn the_fit_recovers_a_linear_model_and_never_goes_negative() {
        let truth = [900_000.0, 1_500_000.0, 50_000.0, 3.0, 400.0, 9_000.0];
        let mut iterations = Vec::new();
        for n in [16, 64, 256, 512] {
            iterations.push(point(1, n, 0, truth));
        }
        for n in [16, 64, 256] {
            for c in [256, 512, 1024] {
                iterations.push(point(1, n, c, truth));
            }
        }
        for b in [1, 4, 16] {
            for c in [128, 512] {
                iterations.push(point(b, 1, c, truth));
            }
        }
        let p = BatchProfile {
            block_size: 16,
            tensor_tokens: 64,
            iterations,
            export: vec![(1 << 20, Nanos(1_000_000)), (4 << 20, Nanos(3_500_000))],
            load: vec![(1 << 20, Nanos(500_000))],
        };
        let fit = p.fit();
        for (got, want) in fit.coef.iter().zip(truth) {
            assert!((got - want).abs() <= want * 1e-6 + 1e-6, "{fit:?}");
        }
        let mut b = BatchShape::default();
        b.add(32, 100, false);
        let want: f64 = terms(&b).iter().zip(truth).map(|(x, c)| x * c).sum();
        assert!((fit.iteration(&b).0 as f64 - want).abs() <= 2.0);
        let (a, per_byte) = p.export_line();
        assert!(a >= 0.0 && per_byte > 0.0);
        // A model that would need a negative term gets 0 for it instead.
        let rows = vec![
            ([1.0, 1.0, 0.0, 0.0, 0.0, 0.0], 10.0),
            ([1.0, 2.0, 0.0, 0.0, 0.0, 0.0], 5.0),
            ([1.0, 3.0, 0.0, 0.0, 0.0, 0.0], 0.0),
        ];
        let c = nonnegative_least_squares(&rows);
        assert!(c.iter().all(|&x| x >= 0.0), "{c:?}");
        assert_eq!(c[1], 0.0);
        assert!((c[0] - 5.0).abs() < 1e-9);
    }
}
