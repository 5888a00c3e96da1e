//! The real batch backend of serving instances: a whole model on candle with a paged K/V
//! cache of the instance's blocks.
//!
//! **Paged K/V.** The backend holds one K/V slot per KV block of the instance
//! (`num_blocks`, the instance's KV capacity in blocks, so its memory is bounded exactly as
//! the simulation bounds the instance). Block `j` of a sequence's block table holds the K/V
//! of its positions `j x block_size ..` (all layers). The instance's scheduler, the same
//! code as in the simulation, decides which blocks a sequence holds; the backend only reads
//! and writes them:
//!
//! * an iteration gathers each member's K/V from its blocks (the `computed` tokens its
//!   scheduler says they hold), runs the model on its new tokens, and writes the new K/V
//!   back into its blocks;
//! * prefix reuse in GPU memory (local prefix) needs nothing more: a block that the pool
//!   keeps cached still holds the K/V it was written with, and a sequence that takes it
//!   reads it as its own;
//! * preemption frees blocks; their K/V stays until a new owner writes over it;
//! * a store load writes the K/V read from a store server's memory into the blocks the
//!   scheduler reserved for it, and a store write exports whole tensors from the blocks.
//!
//! A block that does not hold the positions a sequence expects (a bookkeeping error) is an
//! error naming the block, never a silent wrong answer.
//!
//! **The iteration** computes its members one after another (each one forward of its new
//! tokens over its gathered cache), not as one padded batch: on a CPU a batch of unequal
//! sequences gains nothing from padding, and each member's result is then exactly what the
//! model computes for it alone. The measured profile of the backend
//! ([`crate::model::batch_profile`]) prices an iteration the same way: a linear model of
//! sums over its members, with no cost of the iteration's own.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::BackendError;
use super::batch::{BatchBackend, BlockId, KvData, KvSource, LoadItem, Member, Sampled, TensorId};
use crate::exec::model::argmax;
use crate::exec::{ExecError, KvCache, KvSlice, ShardInput, ShardModel, ShardOutput};
use crate::model::cost::BatchShape;
use crate::units::Nanos;
use crate::workload::Trace;

/// A whole model on candle, with a paged K/V cache (see the module doc).
pub struct PagedCandleBackend {
    model: ShardModel,
    trace: Arc<Trace>,
    block_size: u32,
    blocks: Vec<Option<KvSlice>>,
    /// The live store's memory, for loads (store policies only).
    memory: Option<Arc<dyn KvSource>>,
    /// Scratch: the tokens of the member being computed.
    ids: Vec<u32>,
    /// Held while computing or moving K/V, when instances share one device.
    device: Option<Arc<DeviceLock>>,
    /// Where the time of its iterations goes (shared with whoever reads it).
    timing: Option<Arc<Mutex<Timing>>>,
}

/// One device shared by several backends: they work on it one at a time, in the order they
/// asked (a ticket lock: first come, first served, as a simulated device queues work).
#[derive(Debug, Default)]
pub struct DeviceLock {
    /// The next ticket to hand out, and the ticket whose holder may work.
    tickets: Mutex<(u64, u64)>,
    turn: std::sync::Condvar,
}

/// A turn on a [`DeviceLock`]; the next one starts when it is dropped.
pub struct Turn<'a>(&'a DeviceLock);

impl DeviceLock {
    /// Waits for this caller's turn (callers are served in the order they call).
    pub fn take(&self) -> Turn<'_> {
        let mut t = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let mine = t.0;
        t.0 += 1;
        while t.1 != mine {
            t = self.turn.wait(t).unwrap_or_else(|e| e.into_inner());
        }
        Turn(self)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut t = self.0.tickets.lock().unwrap_or_else(|e| e.into_inner());
        t.1 += 1;
        self.0.turn.notify_all();
    }
}

/// What the iterations of paged backends took, against their shapes, by kind of iteration
/// (all of them: [`Timing::all`]); a profile's fitted model prices `terms` at
/// `coef . terms`, to compare with `compute` (see [`crate::model::batch_profile`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    /// Wall time waiting for the shared device before computing.
    pub waiting: std::time::Duration,
    /// Wall time of store loads and exports (copies of K/V).
    pub copies: std::time::Duration,
    /// The iterations by kind ([`IterationKind`]): how many, their terms and wall time.
    pub by_kind: [KindTiming; 3],
}

/// What some iterations took against their shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KindTiming {
    pub iterations: u64,
    /// Sums over the iterations of the fitted model's terms.
    pub terms: [f64; crate::model::batch_profile::TERMS],
    /// Wall time computing.
    pub compute: std::time::Duration,
}

impl KindTiming {
    fn add(&mut self, other: &KindTiming) {
        self.iterations += other.iterations;
        for (s, x) in self.terms.iter_mut().zip(other.terms) {
            *s += x;
        }
        self.compute += other.compute;
    }
}

impl Timing {
    /// Every iteration, whatever its kind.
    pub fn all(&self) -> KindTiming {
        let mut all = KindTiming::default();
        for k in &self.by_kind {
            all.add(k);
        }
        all
    }
}

/// Iterations by what their members compute: a profile may price one kind well and another
/// badly, which the sums over all iterations hide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IterationKind {
    /// Every member computes one token (decode steps, and the last token of a prompt whose
    /// prefix was all cached).
    Decode,
    /// Every member computes a chunk of several tokens.
    Prefill,
    /// Both.
    Mixed,
}

impl IterationKind {
    pub const ALL: [IterationKind; 3] = [
        IterationKind::Decode,
        IterationKind::Prefill,
        IterationKind::Mixed,
    ];

    pub fn of(b: &crate::model::cost::BatchShape) -> IterationKind {
        match b.chunk_seqs {
            0 => IterationKind::Decode,
            c if c == b.seqs => IterationKind::Prefill,
            _ => IterationKind::Mixed,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            IterationKind::Decode => "decode",
            IterationKind::Prefill => "prefill",
            IterationKind::Mixed => "mixed",
        }
    }
}

impl PagedCandleBackend {
    /// `model` must hold every layer; `num_blocks` blocks of `block_size` tokens.
    pub fn new(
        model: ShardModel,
        trace: Arc<Trace>,
        block_size: u32,
        num_blocks: u32,
        memory: Option<Arc<dyn KvSource>>,
    ) -> Result<PagedCandleBackend, BackendError> {
        if !(model.is_head() && model.is_tail()) {
            return Err(BackendError::Exec(ExecError::Config(format!(
                "a serving instance runs the whole model, not layers {:?}",
                model.layers()
            ))));
        }
        if block_size == 0 {
            return Err(BackendError::Exec(ExecError::Config(
                "a block of 0 tokens".into(),
            )));
        }
        Ok(PagedCandleBackend {
            model,
            trace,
            block_size,
            blocks: vec![None; num_blocks as usize],
            memory,
            ids: Vec::new(),
            device: None,
            timing: None,
        })
    }

    /// Adds the wall time of every iteration and copy, and the shapes of the iterations, to
    /// `timing`.
    pub fn with_timing(mut self, timing: Arc<Mutex<Timing>>) -> PagedCandleBackend {
        self.timing = Some(timing);
        self
    }

    fn record(&self, f: impl FnOnce(&mut Timing)) {
        if let Some(t) = &self.timing {
            f(&mut t.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// Computes only while holding `lock`, shared by the backends of instances that share one
    /// device: one of them computes at a time, as on one GPU. K/V copies to and from a store
    /// do not take the device (on a GPU they are DMA transfers; the simulation charges them
    /// to the links, not to the device).
    pub fn with_device_lock(mut self, lock: Arc<DeviceLock>) -> PagedCandleBackend {
        self.device = Some(lock);
        self
    }

    /// The slot of block `j` of a block table.
    fn slot(&self, table: &[BlockId], j: usize) -> Result<usize, BackendError> {
        let b = *table.get(j).ok_or_else(|| {
            BackendError::Store(format!(
                "position {} is beyond the sequence's {} blocks",
                j * self.block_size as usize,
                table.len()
            ))
        })? as usize;
        if b >= self.blocks.len() {
            return Err(BackendError::Store(format!(
                "block {b} of {}",
                self.blocks.len()
            )));
        }
        Ok(b)
    }

    /// The K/V of positions `range` of the sequence with block table `table`.
    fn read(&self, table: &[BlockId], range: Range<usize>) -> Result<KvSlice, BackendError> {
        let bs = self.block_size as usize;
        let mut parts = Vec::with_capacity(range.len().div_ceil(bs) + 1);
        let mut at = range.start;
        while at < range.end {
            let j = at / bs;
            let want = at..range.end.min((j + 1) * bs);
            let b = self.slot(table, j)?;
            let held = self.blocks[b].as_ref().ok_or_else(|| {
                BackendError::Store(format!("block {b} (positions {want:?}) holds nothing"))
            })?;
            let have = held.positions();
            if have.start != j * bs || have.end < want.end {
                return Err(BackendError::Store(format!(
                    "block {b} holds positions {have:?}, not {want:?}"
                )));
            }
            parts.push(if have == want {
                held.clone()
            } else {
                held.narrow(want.clone())?
            });
            at = want.end;
        }
        Ok(KvSlice::join(self.model.layers(), &parts)?)
    }

    /// Writes positions `range` of `kv` into the blocks of `table` (a block's K/V then runs
    /// from its first position to the end of what was written into it).
    fn write(
        &mut self,
        table: &[BlockId],
        kv: &KvSlice,
        range: Range<usize>,
    ) -> Result<(), BackendError> {
        let bs = self.block_size as usize;
        let mut at = range.start;
        while at < range.end {
            let j = at / bs;
            let block = j * bs..range.end.min((j + 1) * bs);
            let b = self.slot(table, j)?;
            let new = kv.narrow(at..block.end)?;
            let whole = if block.start < at {
                // The block already holds its first positions (a partial block extended).
                let old = self.read(table, block.start..at)?;
                KvSlice::join(self.model.layers(), &[old, new])?
            } else {
                new
            };
            self.blocks[b] = Some(whole);
            at = block.end;
        }
        Ok(())
    }

    fn compute(&mut self, m: &mut Member<'_>) -> Result<(), BackendError> {
        let (computed, n) = (m.computed as usize, m.n as usize);
        let prompt_len = self.trace.request(m.req).prompt_tokens as usize;
        self.ids.clear();
        self.ids.extend(self.trace.prompt(m.req));
        self.ids.extend_from_slice(m.generated);
        let known = self.ids.len();
        if computed + n > known || n == 0 || known != prompt_len + m.generated.len() {
            return Err(BackendError::Store(format!(
                "request {}: {n} tokens from position {computed} of {known}",
                m.req.0
            )));
        }
        let mut cache = KvCache::from_slice(self.read(m.blocks, 0..computed)?)?;
        let ids = self.ids[computed..computed + n].to_vec();
        let out = self
            .model
            .forward(ShardInput::Tokens(&ids), computed, &mut cache)?;
        let fresh = cache.export(computed..computed + n)?;
        self.write(m.blocks, &fresh, computed..computed + n)?;
        if computed + n == known {
            let ShardOutput::Logits(l) = out else {
                return Err(BackendError::ForeignActivation);
            };
            let logits = l.to_vec1::<f32>().map_err(ExecError::from)?;
            m.sampled = Some(Sampled {
                token: argmax(&logits),
                logits: m.generated.is_empty().then_some(logits),
            });
        }
        Ok(())
    }
}

impl BatchBackend for PagedCandleBackend {
    fn iteration(
        &mut self,
        batch: &BatchShape,
        members: &mut [Member<'_>],
    ) -> Result<Nanos, BackendError> {
        let asked = std::time::Instant::now();
        let device = self.device.clone();
        let _held = device.as_deref().map(DeviceLock::take);
        let started = std::time::Instant::now();
        for m in members.iter_mut() {
            self.compute(m).map_err(|e| match e {
                BackendError::Store(s) => BackendError::Store(format!("request {}: {s}", m.req.0)),
                other => other,
            })?;
        }
        let (waiting, compute) = (started - asked, started.elapsed());
        // `-vv`: every iteration's shape and wall time, to set against the profile's points.
        tracing::debug!(
            members = batch.seqs,
            new_tokens = batch.new_tokens,
            cached = batch.kv_read_tokens - batch.new_tokens,
            chunk_cached = batch.chunk_cached_tokens,
            compute_us = compute.as_micros() as u64,
            waiting_us = waiting.as_micros() as u64,
            "live iteration"
        );
        self.record(|t| {
            t.waiting += waiting;
            t.by_kind[IterationKind::of(batch) as usize].add(&KindTiming {
                iterations: 1,
                terms: crate::model::batch_profile::terms(batch),
                compute,
            });
        });
        Ok(Nanos::ZERO)
    }

    fn real(&self) -> bool {
        true
    }

    fn export(
        &mut self,
        blocks: &[BlockId],
        tensors: &[(TensorId, u32)],
        tensor_tokens: u32,
    ) -> Result<KvData, BackendError> {
        let tt = tensor_tokens as usize;
        let started = std::time::Instant::now();
        let out = tensors
            .iter()
            .map(|&(id, start)| {
                let s = start as usize;
                let host = self.read(blocks, s..s + tt)?.to_host()?;
                Ok((id, Arc::new(host)))
            })
            .collect();
        self.record(|t| t.copies += started.elapsed());
        out
    }

    fn load(
        &mut self,
        blocks: &[BlockId],
        items: &[LoadItem],
        tensor_tokens: u32,
        within: Range<u32>,
    ) -> Result<(), BackendError> {
        let Some(memory) = self.memory.clone() else {
            return Err(BackendError::Store("a load without a store".into()));
        };
        let (device, dtype) = (self.model.device().clone(), self.model.dtype());
        let started = std::time::Instant::now();
        let r = self.load_items(
            &memory,
            items,
            blocks,
            tensor_tokens,
            within,
            &device,
            dtype,
        );
        self.record(|t| t.copies += started.elapsed());
        r
    }
}

impl PagedCandleBackend {
    #[allow(clippy::too_many_arguments)]
    fn load_items(
        &mut self,
        memory: &Arc<dyn KvSource>,
        items: &[LoadItem],
        blocks: &[BlockId],
        tensor_tokens: u32,
        within: Range<u32>,
        device: &candle_core::Device,
        dtype: candle_core::DType,
    ) -> Result<(), BackendError> {
        for it in items {
            let s = it.start as usize;
            let range =
                s.max(within.start as usize)..(s + tensor_tokens as usize).min(within.end as usize);
            if range.is_empty() {
                continue;
            }
            let host = memory.read(it.node, it.ssd, it.id).ok_or_else(|| {
                let tier = if it.ssd { "SSD" } else { "host memory" };
                BackendError::Store(format!(
                    "tensor {:016x} is not in node {}'s {tier}",
                    it.id, it.node
                ))
            })?;
            let want = s..s + tensor_tokens as usize;
            if host.positions != want || host.layers != self.model.layers() {
                return Err(BackendError::Store(format!(
                    "tensor {:016x} holds layers {:?} positions {:?}, not {:?} {want:?}",
                    it.id,
                    host.layers,
                    host.positions,
                    self.model.layers()
                )));
            }
            let kv = KvSlice::from_host(&host, device, dtype)?;
            self.write(blocks, &kv, range)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::model::max_abs_diff;
    use crate::exec::{TransformerConfig, WeightSource, weights};
    use crate::workload::{ReqId, Request, TokenArena};
    use candle_core::{DType, Device};

    fn model() -> ShardModel {
        let cfg = TransformerConfig::preset("tiny").unwrap();
        let vb = weights::var_builder(
            &cfg,
            0..cfg.layers,
            &WeightSource::Seeded(5),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        ShardModel::new(&cfg, 0..cfg.layers, vb).unwrap()
    }

    fn trace(prompt: &[u32]) -> Arc<Trace> {
        let mut arena = TokenArena::default();
        let seg = arena.push(prompt.iter().copied());
        Arc::new(Trace {
            arena,
            requests: vec![Request {
                arrival: Nanos::ZERO,
                segments: vec![seg],
                prompt_tokens: prompt.len() as u32,
                output_tokens: 2,
                context: 0,
            }],
            contexts: 1,
        })
    }

    fn step(
        b: &mut PagedCandleBackend,
        blocks: &[BlockId],
        computed: u32,
        n: u32,
        generated: &[u32],
    ) -> Result<Option<Sampled>, BackendError> {
        let mut m = [Member {
            req: ReqId(0),
            blocks,
            computed,
            n,
            generated,
            sampled: None,
        }];
        b.iteration(&BatchShape::default(), &mut m)?;
        Ok(m[0].sampled.take())
    }

    #[test]
    fn chunks_over_scattered_blocks_give_the_unpaged_models_logits() {
        let prompt = crate::workload::seeded_prompt(9, 0, 50, 1024);
        let reference = model();
        let mut kv = reference.new_cache();
        let ShardOutput::Logits(l) = reference
            .forward(ShardInput::Tokens(&prompt), 0, &mut kv)
            .unwrap()
        else {
            panic!("the whole model ends with logits");
        };
        let want = l.to_vec1::<f32>().unwrap();
        let mut b = PagedCandleBackend::new(model(), trace(&prompt), 16, 8, None).unwrap();
        // Blocks out of order, chunks that cut blocks in the middle.
        let blocks = [5, 2, 7, 0];
        assert!(step(&mut b, &blocks, 0, 7, &[]).unwrap().is_none());
        assert!(step(&mut b, &blocks, 7, 23, &[]).unwrap().is_none());
        let first = step(&mut b, &blocks, 30, 20, &[]).unwrap().unwrap();
        let got = first.logits.clone().unwrap();
        assert!(
            max_abs_diff(&got, &want) < 1e-4,
            "{}",
            max_abs_diff(&got, &want)
        );
        assert_eq!(first.token, argmax(&want));
        // A decode step after it equals the unpaged model's.
        let ShardOutput::Logits(l) = reference
            .forward(ShardInput::Tokens(&[first.token]), 50, &mut kv)
            .unwrap()
        else {
            panic!("logits");
        };
        let want = l.to_vec1::<f32>().unwrap();
        let second = step(&mut b, &blocks, 50, 1, &[first.token])
            .unwrap()
            .unwrap();
        assert_eq!(second.token, argmax(&want));
        assert!(
            second.logits.is_none(),
            "only the first token's logits are kept"
        );
        // Another sequence that takes the first three full blocks (a cached prefix) reads
        // them as its own and computes only the rest.
        let shared = [5, 2, 7, 1];
        let again = step(&mut b, &shared, 48, 2, &[]).unwrap().unwrap();
        assert!(max_abs_diff(again.logits.as_ref().unwrap(), &got) < 1e-4);
        // Exported tensors load back into other blocks with the same K/V.
        let data = b.export(&blocks, &[(1, 0), (2, 16)], 16).unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[1].1.positions, 16..32);
    }

    #[test]
    fn a_block_that_does_not_hold_the_expected_positions_is_an_error() {
        let prompt = crate::workload::seeded_prompt(9, 0, 40, 1024);
        let mut b = PagedCandleBackend::new(model(), trace(&prompt), 16, 4, None).unwrap();
        step(&mut b, &[0, 1, 2], 0, 20, &[]).unwrap();
        // Block 3 was never written: a sequence that claims 20 tokens in [0, 3] is wrong.
        let e = step(&mut b, &[0, 3, 2], 20, 5, &[]).unwrap_err();
        assert!(e.to_string().contains("block 3"), "{e}");
        // A block table too short for the tokens is an error too, not a panic.
        let e = step(&mut b, &[0], 16, 10, &[]).unwrap_err();
        assert!(e.to_string().contains("beyond"), "{e}");
        // A load without a store is refused.
        let e = b.load(&[0], &[], 16, 0..16).unwrap_err();
        assert!(e.to_string().contains("without a store"), "{e}");
    }
}
