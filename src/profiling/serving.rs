//! Measuring the serving batch backend: whole iterations of a paged K/V cache on a grid of
//! batch shapes, and the store's exports and loads, for the profile that `serving.profile`
//! takes.

use super::*;

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
/// loading whole store tensors. See [`crate::model::batch_profile`]. `on_round` hears of each
/// round done, as `(rounds done, rounds in all)` (the warm-up counts), for a progress display.
pub fn measure_serving(
    cfg: &TransformerConfig,
    weights: &WeightSource,
    device: &Device,
    grid: &ServingGrid,
    on_round: &mut dyn FnMut(u32, u32),
) -> Result<BatchProfile, ProfileError> {
    grid.check("grid")?;
    cfg.validate().map_err(|e| measure_failed(&e))?;
    let shapes = serving_shapes(grid);
    let most = grid.tensors.iter().copied().max().unwrap_or(1);
    let seqs = Sequences::new(&shapes, most * grid.tensor_tokens);
    let members = seqs.room.len();
    let trace = Arc::new(serving_trace(cfg, members, grid.tokens() as usize));
    let (tables, blocks) = block_tables(&seqs.room, grid.block_size);
    let vb = crate::exec::weights::var_builder(cfg, 0..cfg.layers, weights, DType::F32, device)
        .map_err(|e| measure_failed(&e))?;
    let model =
        crate::exec::ShardModel::new(cfg, 0..cfg.layers, vb).map_err(|e| measure_failed(&e))?;
    let held = Arc::new(Held::default());
    let backend = PagedCandleBackend::new(
        model,
        trace,
        grid.block_size,
        blocks,
        Some(held.clone() as Arc<dyn KvSource>),
    )
    .map_err(|e| measure_failed(&e))?;
    let mut bench = Bench {
        backend,
        device,
        tables,
        filled: vec![0u32; members],
    };
    let who = seqs.members(&shapes);
    // Untimed: every sequence's blocks hold the tokens its shapes read.
    for (&c, &(k, _)) in &seqs.groups {
        for i in seqs.first[&c]..seqs.first[&c] + k {
            bench.fill(i, c)?;
        }
    }
    let iterations = bench.time_shapes(&shapes, &who, grid.repeats, on_round)?;
    bench.fill(seqs.transfers, most * grid.tensor_tokens)?;
    let (export, load) = bench.time_transfers(grid, seqs.transfers, &held)?;
    Ok(BatchProfile {
        block_size: grid.block_size,
        tensor_tokens: grid.tensor_tokens,
        iterations,
        export,
        load,
    })
}

/// A failure of the backend during a measurement.
fn measure_failed(e: &dyn std::fmt::Display) -> ProfileError {
    ProfileError::Measure(e.to_string())
}

/// Every shape that [`measure_serving`] times, as `(members, new tokens, cached)`: the
/// prefills, the chunks after each cached context, then the decode batches.
fn serving_shapes(grid: &ServingGrid) -> Vec<(u32, u32, u32)> {
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
    shapes
}

/// The sequences that compute the shapes: one group per cached context, as many as the largest
/// batch after that context. A shape reads its group's first `c` tokens and writes from `c` on,
/// so every shape of a group can run at any time (the repeats of the interleaved rounds
/// interleave them): what one writes, no other reads. The last two sequences hold the store
/// tensors that the transfers export and load.
struct Sequences {
    /// Per cached context: the largest batch after it and the most new tokens after it.
    groups: BTreeMap<u32, (usize, u32)>,
    /// Per cached context: its group's first sequence.
    first: BTreeMap<u32, usize>,
    /// Per sequence, the tokens its blocks must hold room for.
    room: Vec<u32>,
    /// The first of the two sequences of the store tensors.
    transfers: usize,
}

impl Sequences {
    /// The sequences of `shapes`, then two of `tensors` tokens each for the transfers.
    fn new(shapes: &[(u32, u32, u32)], tensors: u32) -> Sequences {
        let mut groups: BTreeMap<u32, (usize, u32)> = Default::default();
        for &(b, n, c) in shapes {
            let g = groups.entry(c).or_default();
            g.0 = g.0.max(b as usize);
            g.1 = g.1.max(n);
        }
        let mut room: Vec<u32> = Vec::new();
        let mut first: BTreeMap<u32, usize> = Default::default();
        for (&c, &(k, n)) in &groups {
            first.insert(c, room.len());
            room.push(c + n);
            room.extend(std::iter::repeat_n(c + 1, k - 1));
        }
        let transfers = room.len();
        room.extend([tensors; 2]);
        Sequences {
            groups,
            first,
            room,
            transfers,
        }
    }

    /// Per shape, its members as `(sequence, cached, new tokens)`: the first sequences of the
    /// group of its cached context.
    fn members(&self, shapes: &[(u32, u32, u32)]) -> Vec<Vec<(usize, u32, u32)>> {
        shapes
            .iter()
            .map(|&(b, n, c)| {
                (self.first[&c]..self.first[&c] + b as usize)
                    .map(|i| (i, c, n))
                    .collect()
            })
            .collect()
    }
}

/// A trace of `members` requests of `len` seeded prompt tokens each, one context each.
fn serving_trace(cfg: &TransformerConfig, members: usize, len: usize) -> Trace {
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
    Trace {
        arena,
        requests,
        contexts: members as u32,
    }
}

/// Each sequence's block table (consecutive blocks of `block_size` tokens with room for its
/// `room` tokens), and the number of blocks in all.
fn block_tables(room: &[u32], block_size: u32) -> (Vec<Vec<u32>>, u32) {
    let mut tables: Vec<Vec<u32>> = Vec::with_capacity(room.len());
    let mut next = 0u32;
    for &r in room {
        let k = r.div_ceil(block_size);
        tables.push((next..next + k).collect());
        next += k;
    }
    (tables, next)
}

/// `(bytes, median time)` of transfers of each number of whole tensors.
type Transfers = Vec<(u64, Nanos)>;

/// The serving backend under measurement, with its sequences' block tables.
struct Bench<'a> {
    backend: PagedCandleBackend,
    device: &'a Device,
    tables: Vec<Vec<u32>>,
    /// Tokens whose K/V each member's blocks hold.
    filled: Vec<u32>,
}

impl Bench<'_> {
    /// The wall time of one iteration of the members `who`, as `(sequence, cached, new
    /// tokens)`, until the device is synchronized.
    fn iteration(&mut self, who: &[(usize, u32, u32)]) -> Result<u64, ProfileError> {
        let mut shape = BatchShape::default();
        let mut ms: Vec<Member<'_>> = who
            .iter()
            .map(|&(i, computed, n)| {
                shape.add(n as u64, computed as u64, false);
                Member {
                    req: ReqId(i as u32),
                    blocks: &self.tables[i],
                    computed,
                    n,
                    generated: &[],
                    sampled: None,
                }
            })
            .collect();
        let started = Instant::now();
        let r = self.backend.iteration(&shape, &mut ms);
        let synced = self.device.synchronize();
        let t = started.elapsed();
        r.map_err(|e| measure_failed(&e))?;
        synced.map_err(|e| measure_failed(&e))?;
        Ok(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Untimed: makes member `i`'s blocks hold its first `c` tokens.
    fn fill(&mut self, i: usize, c: u32) -> Result<(), ProfileError> {
        while self.filled[i] < c {
            let done = self.filled[i];
            let n = (c - done).min(512);
            self.iteration(&[(i, done, n)])?;
            self.filled[i] += n;
        }
        Ok(())
    }

    /// The median time of each of `shapes`, run by its members `who`, over `repeats` rounds.
    ///
    /// Interleaved rounds: each round times every shape once, in an order of its own (a
    /// seeded shuffle), so that a slow spell of the machine (another process, a frequency
    /// change) spreads over all shapes instead of biasing the few measured during it, and a
    /// shape follows a different one each round, as an iteration of a serving instance
    /// follows whatever the instances computed before it. The first round warms up and is
    /// not kept.
    fn time_shapes(
        &mut self,
        shapes: &[(u32, u32, u32)],
        who: &[Vec<(usize, u32, u32)>],
        repeats: u32,
        on_round: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<IterationPoint>, ProfileError> {
        let mut times: Vec<Vec<u64>> = vec![Vec::with_capacity(repeats as usize); shapes.len()];
        let mut order: Vec<usize> = (0..shapes.len()).collect();
        let mut rng = crate::rng::Stream::new(PROMPT_SEED, 1);
        for round in 0..=repeats as usize {
            rng.shuffle(&mut order);
            for &s in &order {
                let t = self.iteration(&who[s])?;
                if round > 0 {
                    times[s].push(t);
                }
            }
            on_round(round as u32 + 1, repeats + 1);
        }
        Ok(shapes
            .iter()
            .zip(&mut times)
            .map(|(&(members, new_tokens, cached), t)| IterationPoint {
                members,
                new_tokens,
                cached,
                time: median(t),
            })
            .collect())
    }

    /// The bytes and median time of exporting, then of loading, each number of whole tensors
    /// of `grid`: exported from sequence `transfers` into `held`, loaded into the next one.
    fn time_transfers(
        &mut self,
        grid: &ServingGrid,
        transfers: usize,
        held: &Held,
    ) -> Result<(Transfers, Transfers), ProfileError> {
        let mut export = Vec::new();
        let mut load = Vec::new();
        for &k in &grid.tensors {
            let (bytes, time) = self.time_export(grid, transfers, k, held)?;
            export.push((bytes, time));
            load.push((bytes, self.time_load(grid, transfers + 1, k)?));
        }
        Ok((export, load))
    }

    /// The bytes and median time of exporting the first `k` tensors of sequence `seq`, which
    /// are then kept in `held`.
    fn time_export(
        &mut self,
        grid: &ServingGrid,
        seq: usize,
        k: u32,
        held: &Held,
    ) -> Result<(u64, Nanos), ProfileError> {
        let tt = grid.tensor_tokens;
        let tensors: Vec<(u64, u32)> = (0..k).map(|j| (j as u64, j * tt)).collect();
        let mut times = Vec::new();
        let mut data = Vec::new();
        for _ in 0..=grid.repeats {
            let started = Instant::now();
            data = self
                .backend
                .export(&self.tables[seq], &tensors, tt)
                .map_err(|e| measure_failed(&e))?;
            times.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        times.remove(0);
        let bytes: u64 = data.iter().map(|(_, kv)| kv.bytes()).sum();
        let time = median(&mut times);
        if let Ok(mut h) = held.0.lock() {
            h.extend(data);
        }
        Ok((bytes, time))
    }

    /// The median time of loading the `k` held tensors into sequence `seq`.
    fn time_load(&mut self, grid: &ServingGrid, seq: usize, k: u32) -> Result<Nanos, ProfileError> {
        let tt = grid.tensor_tokens;
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
            self.backend
                .load(&self.tables[seq], &items, tt, 0..k * tt)
                .map_err(|e| measure_failed(&e))?;
            let synced = self.device.synchronize();
            times.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
            synced.map_err(|e| measure_failed(&e))?;
        }
        times.remove(0);
        Ok(median(&mut times))
    }
}
