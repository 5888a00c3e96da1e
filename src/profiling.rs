//! Measuring profiles of the real backend (`meshsim profile`); the profile data, its file
//! format and interpolation are in [`crate::model::profile`].
//!
//! [`measure`] makes a [`Profile`] with a [`CandleBackend`] per shard (f32): after one untimed
//! warm-up pass, it times each shard's `run` separately ([`Instant`] around just that call,
//! after which the device is synchronized) while passing the real activations from shard to
//! shard, and keeps the median over `repeats` runs. A decode point prefills its context untimed
//! once and then times `repeats` single-token steps on copies of that cache. Prompts are fixed
//! (seeded) token ids, so two profiles of one machine differ only by timing noise.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, DeviceLocation};

use crate::backend::{Activation, CacheState, CandleBackend, ModelBackend, StepOutput};
use crate::exec::{TransformerConfig, WeightSource};
use crate::model::batch_profile::BatchProfile;
use crate::model::profile::{Profile, ProfileError, ShardProfile, check_grid, check_layers};
use crate::results::output;
use crate::units::Nanos;

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

/// The iterations and transfers that [`measure_serving`] times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingGrid {
    /// Prefill chunks from an empty cache: new tokens.
    pub prefill: Vec<u32>,
    /// A chunk of each of these numbers of new tokens after each of these cached contexts.
    pub chunks: Vec<u32>,
    pub chunk_contexts: Vec<u32>,
    /// Decode steps: members of the batch, and the context each has cached.
    pub batches: Vec<u32>,
    pub contexts: Vec<u32>,
    /// Store transfers: whole tensors exported and loaded at once.
    pub tensors: Vec<u32>,
    pub block_size: u32,
    pub tensor_tokens: u32,
    pub repeats: u32,
}

impl Default for ServingGrid {
    fn default() -> ServingGrid {
        ServingGrid {
            // 384: prompts of a few hundred tokens (a SQuAD window) sit between 256 and 512,
            // where the cost of a prefill bends most.
            prefill: vec![16, 64, 128, 256, 384, 512],
            // A store hit leaves a short chunk after a long cache (a question after its
            // paragraph): 16 and 32 new tokens after 256-512 cached are where the store
            // policies' requests sit.
            chunks: vec![16, 32, 64, 256],
            chunk_contexts: vec![128, 256, 384, 512, 1024],
            batches: vec![1, 4, 8, 16],
            contexts: vec![128, 512, 1024],
            tensors: vec![1, 4, 8],
            block_size: 16,
            tensor_tokens: 64,
            repeats: 5,
        }
    }
}

impl ServingGrid {
    /// Checks every list (positive, increasing) and the sizes.
    pub fn check(&self, origin: &str) -> Result<(), ProfileError> {
        let list = |key: &str, v: &[u32]| {
            let xs: Vec<i64> = v.iter().map(|&x| x as i64).collect();
            check_grid(origin, key, &xs)
        };
        list("prefill", &self.prefill)?;
        list("chunks", &self.chunks)?;
        list("chunk_contexts", &self.chunk_contexts)?;
        list("batches", &self.batches)?;
        list("contexts", &self.contexts)?;
        list("tensors", &self.tensors)?;
        let too_big = |key: &str, v: u64| -> Result<(), ProfileError> {
            if v > MAX_PROFILE_TOKENS as u64 {
                return Err(ProfileError::Grid {
                    file: origin.into(),
                    key: key.into(),
                    message: format!("{v} tokens: at most {MAX_PROFILE_TOKENS}"),
                });
            }
            Ok(())
        };
        for (key, v) in [
            ("block_size", self.block_size as u64),
            ("tensor_tokens", self.tensor_tokens as u64),
            ("repeats", self.repeats as u64),
        ] {
            if v == 0 {
                return Err(ProfileError::NonPositive {
                    file: origin.into(),
                    key: key.into(),
                    what: "number",
                    value: 0,
                });
            }
        }
        if !self.tensor_tokens.is_multiple_of(self.block_size) {
            return Err(ProfileError::Grid {
                file: origin.into(),
                key: "tensor_tokens".into(),
                message: format!(
                    "{} is not a multiple of the block size {}",
                    self.tensor_tokens, self.block_size
                ),
            });
        }
        too_big("tokens", self.tokens())?;
        if self.repeats > MAX_PROFILE_REPEATS || self.batches.iter().any(|&b| b > 256) {
            return Err(ProfileError::Grid {
                file: origin.into(),
                key: "batches".into(),
                message: format!("at most 256 members and {MAX_PROFILE_REPEATS} repeats"),
            });
        }
        Ok(())
    }

    /// The longest sequence a measurement holds.
    fn tokens(&self) -> u64 {
        let last = |v: &[u32]| v.iter().copied().max().unwrap_or(0) as u64;
        last(&self.prefill)
            .max(last(&self.chunk_contexts) + last(&self.chunks))
            .max(last(&self.contexts) + 1)
            .max(last(&self.tensors) * self.tensor_tokens as u64)
    }
}

/// Tensors exported by a serving measurement, read back by its loads.
#[derive(Default)]
struct Held(std::sync::Mutex<std::collections::BTreeMap<u64, std::sync::Arc<crate::exec::HostKv>>>);

impl crate::backend::KvSource for Held {
    fn read(&self, _node: u32, _ssd: bool, id: u64) -> Option<std::sync::Arc<crate::exec::HostKv>> {
        self.0.lock().ok()?.get(&id).cloned()
    }
}

/// Measures the serving batch backend ([`crate::backend::PagedCandleBackend`]) of `cfg`
/// (all layers, f32, weights from `weights`) on `device`: the median wall time of whole
/// iterations of the shapes of `grid`, measured in `repeats` interleaved rounds after one
/// warm-up round (every shape once a round, in a seeded random order), and of exporting and
/// loading whole store tensors. See [`crate::model::batch_profile`].
pub fn measure_serving(
    cfg: &TransformerConfig,
    weights: &WeightSource,
    device: &Device,
    grid: &ServingGrid,
) -> Result<BatchProfile, ProfileError> {
    use crate::backend::{BatchBackend, KvSource, LoadItem, Member, PagedCandleBackend};
    use crate::model::batch_profile::IterationPoint;
    use crate::model::cost::BatchShape;
    use crate::workload::{ReqId, Request, TokenArena, Trace};
    use std::sync::Arc;

    grid.check("grid")?;
    let fail = |e: &dyn std::fmt::Display| ProfileError::Measure(e.to_string());
    cfg.validate().map_err(|e| fail(&e))?;
    // Every shape, as `(members, new tokens, cached)`.
    let mut shapes: Vec<(u32, u32, u32)> = Vec::new();
    for &n in &grid.prefill {
        shapes.push((1, n, 0));
    }
    for &n in &grid.chunks {
        for &c in &grid.chunk_contexts {
            shapes.push((1, n, c));
        }
    }
    for &c in &grid.contexts {
        for &b in &grid.batches {
            shapes.push((b, 1, c));
        }
    }
    // The sequences that compute them: one group per cached context, as many as the largest
    // batch after that context. A shape reads its group's first `c` tokens and writes from
    // `c` on, so every shape of a group can run at any time (the repeats of the rounds below
    // interleave them): what one writes, no other reads. The last two sequences hold the
    // store tensors that the transfers export and load.
    let tt = grid.tensor_tokens;
    let most = grid.tensors.iter().copied().max().unwrap_or(1);
    let mut groups: std::collections::BTreeMap<u32, (usize, u32)> = Default::default();
    for &(b, n, c) in &shapes {
        let g = groups.entry(c).or_default();
        g.0 = g.0.max(b as usize);
        g.1 = g.1.max(n);
    }
    // Per sequence, the tokens its blocks must hold room for; per group, its first sequence.
    let mut room: Vec<u32> = Vec::new();
    let mut first: std::collections::BTreeMap<u32, usize> = Default::default();
    for (&c, &(k, n)) in &groups {
        first.insert(c, room.len());
        room.push(c + n);
        room.extend(std::iter::repeat_n(c + 1, k - 1));
    }
    let transfers = room.len();
    room.extend([most * tt; 2]);
    let members = room.len();
    let len = grid.tokens() as usize;
    let mut arena = TokenArena::default();
    let mut requests = Vec::with_capacity(members);
    for i in 0..members {
        let seg = arena.push(crate::workload::seeded_prompt(
            PROMPT_SEED,
            i as u32,
            len,
            cfg.vocab,
        ));
        requests.push(Request {
            arrival: Nanos::ZERO,
            segments: vec![seg],
            prompt_tokens: len as u32,
            output_tokens: 1,
            context: i as u32,
        });
    }
    let trace = Arc::new(Trace {
        arena,
        requests,
        contexts: members as u32,
    });
    let bs = grid.block_size;
    let mut tables: Vec<Vec<u32>> = Vec::with_capacity(members);
    let mut next = 0u32;
    for &r in &room {
        let k = r.div_ceil(bs);
        tables.push((next..next + k).collect());
        next += k;
    }
    let vb = crate::exec::weights::var_builder(cfg, 0..cfg.layers, weights, DType::F32, device)
        .map_err(|e| fail(&e))?;
    let model = crate::exec::ShardModel::new(cfg, 0..cfg.layers, vb).map_err(|e| fail(&e))?;
    let held = Arc::new(Held::default());
    let mut backend = PagedCandleBackend::new(
        model,
        trace,
        grid.block_size,
        next,
        Some(held.clone() as Arc<dyn KvSource>),
    )
    .map_err(|e| fail(&e))?;
    // Tokens whose K/V each member's blocks hold.
    let mut filled = vec![0u32; members];
    let run = |backend: &mut PagedCandleBackend,
               who: &[(usize, u32, u32)]|
     -> Result<u64, ProfileError> {
        let mut shape = BatchShape::default();
        let mut ms: Vec<Member<'_>> = who
            .iter()
            .map(|&(i, computed, n)| {
                shape.add(n as u64, computed as u64, false);
                Member {
                    req: ReqId(i as u32),
                    blocks: &tables[i],
                    computed,
                    n,
                    generated: &[],
                    sampled: None,
                }
            })
            .collect();
        let started = Instant::now();
        let r = backend.iteration(&shape, &mut ms);
        let synced = device.synchronize();
        let t = started.elapsed();
        r.map_err(|e| fail(&e))?;
        synced.map_err(|e| fail(&e))?;
        Ok(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
    };
    // Untimed: member `i`'s blocks hold its first `c` tokens.
    let fill = |backend: &mut PagedCandleBackend, filled: &mut [u32], i: usize, c: u32| {
        while filled[i] < c {
            let n = (c - filled[i]).min(512);
            run(backend, &[(i, filled[i], n)])?;
            filled[i] += n;
        }
        Ok::<(), ProfileError>(())
    };
    let who: Vec<Vec<(usize, u32, u32)>> = shapes
        .iter()
        .map(|&(b, n, c)| {
            (first[&c]..first[&c] + b as usize)
                .map(|i| (i, c, n))
                .collect()
        })
        .collect();
    // Untimed: every sequence's blocks hold the tokens its shapes read.
    for (&c, &(k, _)) in &groups {
        for i in first[&c]..first[&c] + k {
            fill(&mut backend, &mut filled, i, c)?;
        }
    }
    // Interleaved rounds: each round times every shape once, in an order of its own (a
    // seeded shuffle), so that a slow spell of the machine (another process, a frequency
    // change) spreads over all shapes instead of biasing the few measured during it, and a
    // shape follows a different one each round, as an iteration of a serving instance follows
    // whatever the instances computed before it. The first round warms up and is not kept.
    let mut times: Vec<Vec<u64>> = vec![Vec::with_capacity(grid.repeats as usize); shapes.len()];
    let mut order: Vec<usize> = (0..shapes.len()).collect();
    let mut rng = crate::rng::Stream::new(PROMPT_SEED, 1);
    for round in 0..=grid.repeats as usize {
        rng.shuffle(&mut order);
        for &s in &order {
            let t = run(&mut backend, &who[s])?;
            if round > 0 {
                times[s].push(t);
            }
        }
    }
    let iterations: Vec<IterationPoint> = shapes
        .iter()
        .zip(&mut times)
        .map(|(&(members, new_tokens, cached), t)| IterationPoint {
            members,
            new_tokens,
            cached,
            time: median(t),
        })
        .collect();
    fill(&mut backend, &mut filled, transfers, most * tt)?;
    let mut export = Vec::new();
    let mut load = Vec::new();
    for &k in &grid.tensors {
        let tensors: Vec<(u64, u32)> = (0..k).map(|j| (j as u64, j * tt)).collect();
        let mut times = Vec::new();
        let mut data = Vec::new();
        for _ in 0..=grid.repeats {
            let started = Instant::now();
            data = backend
                .export(&tables[transfers], &tensors, tt)
                .map_err(|e| fail(&e))?;
            times.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        times.remove(0);
        let bytes: u64 = data.iter().map(|(_, kv)| kv.bytes()).sum();
        export.push((bytes, median(&mut times)));
        if let Ok(mut h) = held.0.lock() {
            h.extend(data);
        }
        let items: Vec<LoadItem> = (0..k)
            .map(|j| LoadItem {
                node: 0,
                ssd: false,
                id: j as u64,
                start: j * tt,
            })
            .collect();
        let mut times = Vec::new();
        for _ in 0..=grid.repeats {
            let started = Instant::now();
            backend
                .load(&tables[transfers + 1], &items, tt, 0..k * tt)
                .map_err(|e| fail(&e))?;
            let synced = device.synchronize();
            times.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
            synced.map_err(|e| fail(&e))?;
        }
        times.remove(0);
        load.push((bytes, median(&mut times)));
    }
    Ok(BatchProfile {
        block_size: grid.block_size,
        tensor_tokens: tt,
        iterations,
        export,
        load,
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
