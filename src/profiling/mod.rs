//! Measuring profiles of the real backend (`meshsim profile`); the profile data, its file
//! format and interpolation are in [`crate::model::profile`].
//!
//! [`measure`] makes a [`Profile`] with a [`CandleBackend`] per shard (f32): after one untimed
//! warm-up pass, it times each shard's `run` separately ([`Instant`] around just that call,
//! after which the device is synchronized) while passing the real activations from shard to
//! shard, and keeps the median over `repeats` runs. A decode point prefills its context untimed
//! once and then times `repeats` single-token steps on copies of that cache. Prompts are fixed
//! (seeded) token ids, so two profiles of one machine differ only by timing noise.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, DeviceLocation};

use crate::backend::{
    Activation, BatchBackend, CacheState, CandleBackend, KvSource, LoadItem, Member, ModelBackend,
    PagedCandleBackend, StepOutput,
};
use crate::exec::{TransformerConfig, WeightSource};
use crate::model::batch_profile::{BatchProfile, IterationPoint};
use crate::model::cost::BatchShape;
use crate::model::profile::{Profile, ProfileError, ShardProfile, check_grid, check_layers};
use crate::results::output;
use crate::units::Nanos;
use crate::workload::{ReqId, Request, TokenArena, Trace};

/// The shapes that [`measure`] times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// New tokens of the prefill points, strictly increasing.
    pub prefill: Vec<u32>,
    /// Cached context tokens of the decode points, strictly increasing.
    pub decode: Vec<u32>,
    /// Runs per point (the median is kept).
    pub repeats: u32,
}

impl Default for Grid {
    fn default() -> Grid {
        Grid {
            prefill: vec![1, 8, 16, 32, 64, 128, 256, 512],
            decode: vec![1, 16, 64, 128, 256, 512, 1024],
            repeats: 5,
        }
    }
}

impl Grid {
    /// Checks that both grids are non-empty, positive and strictly increasing and that
    /// `repeats` is positive; `origin` names the grid in errors (a file, or "arguments").
    pub fn check(&self, origin: &str) -> Result<(), ProfileError> {
        let wide = |v: &[u32]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        check_grid(origin, "prefill", &wide(&self.prefill))?;
        check_grid(origin, "decode", &wide(&self.decode))?;
        for (key, v) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if let Some(&x) = v.iter().find(|&&x| x > MAX_PROFILE_TOKENS) {
                return Err(ProfileError::Grid {
                    file: origin.into(),
                    key: key.into(),
                    message: format!(
                        "{x} tokens: at most {MAX_PROFILE_TOKENS} (the attention of a longer \
                         sequence needs more memory than a profile run should take)"
                    ),
                });
            }
        }
        if self.repeats > MAX_PROFILE_REPEATS {
            return Err(ProfileError::Grid {
                file: origin.into(),
                key: "repeats".into(),
                message: format!("at most {MAX_PROFILE_REPEATS} repeats"),
            });
        }
        if self.repeats == 0 {
            return Err(ProfileError::NonPositive {
                file: origin.into(),
                key: "repeats".into(),
                what: "number of runs",
                value: 0,
            });
        }
        Ok(())
    }
}

/// How a device is named in a profile: `cpu`, `cuda:0`, `metal:0`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        DeviceLocation::Cpu => "cpu".into(),
        DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// Longest prefill or decode context a measurement grid may hold.
pub const MAX_PROFILE_TOKENS: u32 = 8192;
/// Most repeats of each measurement.
pub const MAX_PROFILE_REPEATS: u32 = 1000;

/// Seed of the fixed prompt that [`measure`] runs.
const PROMPT_SEED: u64 = 0x9e0f_11e5;

/// The median of `times` (the mean of the middle two, rounded up, for an even count), at
/// least 1 ns.
fn median(times: &mut [u64]) -> Nanos {
    times.sort_unstable();
    let n = times.len();
    let m = match n {
        0 => 0,
        _ if n % 2 == 1 => times[n / 2],
        _ => (times[n / 2 - 1] as u128 + times[n / 2] as u128).div_ceil(2) as u64,
    };
    Nanos(m.max(1))
}

struct Timed {
    /// Wall time of each shard's run, head first.
    times: Vec<u64>,
    /// Each shard's cache after the pass.
    caches: Vec<CacheState>,
    /// The tail's greedy token.
    token: u32,
}

/// One pass of `tokens` at `offset` through every shard, timing each shard's run alone.
fn pass(
    shards: &mut [CandleBackend],
    device: &Device,
    tokens: Vec<u32>,
    offset: usize,
    caches: Option<&[CacheState]>,
) -> Result<Timed, ProfileError> {
    let fail = |e: &dyn std::fmt::Display| ProfileError::Measure(e.to_string());
    let mut input = Activation::tokens(tokens);
    let mut times = Vec::with_capacity(shards.len());
    let mut out_caches = Vec::with_capacity(shards.len());
    let mut token = 0;
    for (i, b) in shards.iter_mut().enumerate() {
        let cache = caches.map(|c| c[i].clone());
        let layers = b.layers();
        let started = Instant::now();
        let step = b.run(layers, input.clone(), offset, cache);
        let synced = device.synchronize();
        let elapsed = started.elapsed();
        let step = step.map_err(|e| fail(&e))?;
        synced.map_err(|e| fail(&e))?;
        times.push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
        out_caches.push(step.cache);
        match step.output {
            StepOutput::Activation(a) => input = a,
            StepOutput::Token { token: t, .. } => token = t,
        }
    }
    Ok(Timed {
        times,
        caches: out_caches,
        token,
    })
}

/// Measures a profile of `cfg` split into `layers` (contiguous from 0, covering the model),
/// with weights from `weights` on `device` in f32, on `grid`. See the module doc.
pub fn measure(
    cfg: &TransformerConfig,
    layers: &[Range<usize>],
    weights: &WeightSource,
    device: &Device,
    grid: &Grid,
) -> Result<Profile, ProfileError> {
    grid.check("grid")?;
    cfg.validate()
        .map_err(|e| ProfileError::Measure(e.to_string()))?;
    if TransformerConfig::preset(&cfg.name).as_ref() != Some(cfg) {
        return Err(ProfileError::UnknownModel {
            file: "measure".into(),
            name: cfg.name.clone(),
        });
    }
    check_layers("measure", layers, cfg.layers, |i| format!("layers[{i}]"))?;
    let mut shards = layers
        .iter()
        .map(|l| CandleBackend::load(cfg, l.clone(), weights, DType::F32, device))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ProfileError::Measure(e.to_string()))?;
    let max_prefill = grid.prefill.iter().copied().max().unwrap_or(1) as usize;
    let max_context = grid.decode.iter().copied().max().unwrap_or(1) as usize;
    let prompt =
        crate::workload::seeded_prompt(PROMPT_SEED, 0, max_prefill.max(max_context), cfg.vocab);

    // Warm-up: one untimed prefill of the largest prefill point and one decode step after it.
    let warm = pass(&mut shards, device, prompt[..max_prefill].to_vec(), 0, None)?;
    pass(
        &mut shards,
        device,
        vec![warm.token],
        max_prefill,
        Some(&warm.caches),
    )?;

    let n_shards = shards.len();
    let repeats = grid.repeats as usize;
    let mut prefill = vec![Vec::with_capacity(grid.prefill.len()); n_shards];
    for &n in &grid.prefill {
        let mut runs = vec![Vec::with_capacity(repeats); n_shards];
        for _ in 0..repeats {
            let t = pass(&mut shards, device, prompt[..n as usize].to_vec(), 0, None)?;
            for (r, t) in runs.iter_mut().zip(t.times) {
                r.push(t);
            }
        }
        for (p, r) in prefill.iter_mut().zip(runs.iter_mut()) {
            p.push((n, median(r)));
        }
    }
    let mut decode = vec![Vec::with_capacity(grid.decode.len()); n_shards];
    for &c in &grid.decode {
        let ctx = pass(&mut shards, device, prompt[..c as usize].to_vec(), 0, None)?;
        let mut runs = vec![Vec::with_capacity(repeats); n_shards];
        for _ in 0..repeats {
            let t = pass(
                &mut shards,
                device,
                vec![ctx.token],
                c as usize,
                Some(&ctx.caches),
            )?;
            for (r, t) in runs.iter_mut().zip(t.times) {
                r.push(t);
            }
        }
        for (d, r) in decode.iter_mut().zip(runs.iter_mut()) {
            d.push((c, median(r)));
        }
    }
    Ok(Profile {
        model: cfg.name.clone(),
        device: device_name(device),
        dtype: "f32".into(),
        repeats: grid.repeats,
        shards: layers
            .iter()
            .zip(prefill.into_iter().zip(decode))
            .map(|(l, (prefill, decode))| ShardProfile {
                layers: l.clone(),
                prefill,
                decode,
            })
            .collect(),
        serving: None,
    })
}

/// Writes [`Profile::to_toml`] to `path` atomically (a temporary file in the same folder, then
/// a swap: [`output::write_file_atomically`]); an existing `path` must be a profile meshsim
/// wrote.
pub fn write(profile: &Profile, path: &Path) -> Result<(), ProfileError> {
    let replaces = output::Replaces::Header(output::PROFILE_HEADER);
    output::write_file_atomically(path, replaces, |w| {
        w.write_all(profile.to_toml().as_bytes())
    })
    .map_err(|e| ProfileError::Write {
        file: path.display().to_string(),
        message: e.to_string(),
    })
}

mod serving;
pub use serving::{ServingGrid, measure_serving};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_take_the_middle_and_are_never_zero() {
        assert_eq!(median(&mut [5, 1, 3]), Nanos(3));
        assert_eq!(median(&mut [4, 1, 3, 10]), Nanos(4));
        assert_eq!(median(&mut [3, 4]), Nanos(4));
        assert_eq!(median(&mut [0]), Nanos(1));
    }

    #[test]
    fn grids_must_be_increasing_and_positive() {
        assert!(Grid::default().check("g").is_ok());
        let g = Grid {
            prefill: vec![1, 8, 8],
            ..Grid::default()
        };
        let e = g.check("arguments").unwrap_err();
        assert_eq!(
            e.to_string(),
            "arguments: prefill[2]: duplicate grid point: 8 after 8"
        );
        let g = Grid {
            decode: vec![],
            ..Grid::default()
        };
        assert!(matches!(g.check("a"), Err(ProfileError::EmptyGrid { .. })));
        let g = Grid {
            repeats: 0,
            ..Grid::default()
        };
        assert!(matches!(
            g.check("a"),
            Err(ProfileError::NonPositive { .. })
        ));
    }
}
