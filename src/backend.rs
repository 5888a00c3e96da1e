//! The model backend boundary (DESIGN contract 3): the only place that knows tensors.
//!
//! A pipeline shard asks its [`ModelBackend`] to run layers `[start, end)` on an
//! [`Activation`] whose first new token sits at position `offset`, with an optional opaque
//! [`CacheState`] of those layers holding exactly `offset` tokens. It gets back a [`Step`]: the
//! new cache state and either the output activation (for the next shard) or, from the tail
//! shard, the greedily sampled token. Shards, routes and stores move activations and cache
//! states around by size only; they never look inside.
//!
//! Two backends:
//! - [`SimBackend`] knows no values. Activations are shapes, cache states are token counts, and
//!   each step carries the duration that [`CostModel`] charges for it on the shard's GPU: the
//!   shard's layers only, with the LM head's weights and FLOPs on the tail shard alone.
//!   Embedding lookups are ignored, as in the cost model. Its "sampled" token is always 0.
//!   [`SimBackend::profiled`] charges a measured [`ShardProfile`] of the real backend
//!   instead (see [`crate::profile`]).
//! - [`CandleBackend`] computes real tensors with [`ShardModel`] and reports no modelled
//!   duration (the caller measures wall time if it wants one).

use candle_core::{DType, Device, Tensor};
use std::fmt;
use std::ops::Range;

use crate::exec::model::argmax;
use crate::exec::weights::{self, WeightSource};
use crate::exec::{
    ExecError, KvCache, KvSlice, ShardInput, ShardModel, ShardOutput, TransformerConfig,
};
use crate::hardware::{GpuSpec, LinkSpec};
use crate::model::ModelConfig;
use crate::model::cost::{BatchShape, CostModel};
use crate::profile::ShardProfile;
use crate::units::Nanos;

/// Bytes of one token id on the wire.
pub const TOKEN_ID_BYTES: u64 = 4;

/// What flows between shards: the prompt's token ids into the head, a hidden activation
/// `[1, n, hidden]` between shards. Opaque but for its length and size.
#[derive(Clone)]
pub struct Activation(ActInner);

#[derive(Clone)]
enum ActInner {
    Tokens(Vec<u32>),
    Shape {
        positions: usize,
        hidden: usize,
        bytes_per_element: usize,
    },
    Tensor(Tensor),
}

impl Activation {
    /// Token ids for the head shard.
    pub fn tokens(ids: Vec<u32>) -> Activation {
        Activation(ActInner::Tokens(ids))
    }

    /// The token ids, if this is the head's input.
    pub fn token_ids(&self) -> Option<&[u32]> {
        match &self.0 {
            ActInner::Tokens(ids) => Some(ids),
            _ => None,
        }
    }

    /// Number of token positions it covers.
    pub fn positions(&self) -> usize {
        match &self.0 {
            ActInner::Tokens(ids) => ids.len(),
            ActInner::Shape { positions, .. } => *positions,
            ActInner::Tensor(t) => t.dims().get(1).copied().unwrap_or(0),
        }
    }

    /// Bytes on the wire.
    pub fn bytes(&self) -> u64 {
        match &self.0 {
            ActInner::Tokens(ids) => ids.len() as u64 * TOKEN_ID_BYTES,
            ActInner::Shape {
                positions,
                hidden,
                bytes_per_element,
            } => (positions * hidden * bytes_per_element) as u64,
            ActInner::Tensor(t) => (t.elem_count() * t.dtype().size_in_bytes()) as u64,
        }
    }
}

impl fmt::Debug for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            ActInner::Tokens(_) => "tokens",
            ActInner::Shape { .. } => "shape",
            ActInner::Tensor(_) => "tensor",
        };
        write!(
            f,
            "Activation({kind}, {} positions, {} B)",
            self.positions(),
            self.bytes()
        )
    }
}

/// The cache state of one shard's layers for one session (or an exported token range of it).
/// Opaque but for its token count and size: K/V tensors for candle, a count for the sim.
#[derive(Clone)]
pub struct CacheState(CacheInner);

#[derive(Clone)]
enum CacheInner {
    Sim {
        positions: Range<usize>,
        bytes_per_token: u64,
    },
    Candle(KvCache),
    CandleSlice(KvSlice),
}

impl CacheState {
    /// Tokens held.
    pub fn tokens(&self) -> usize {
        self.positions().len()
    }

    /// The positions held: `0..tokens` for a session's cache, any range for an exported one.
    pub fn positions(&self) -> Range<usize> {
        match &self.0 {
            CacheInner::Sim { positions, .. } => positions.clone(),
            CacheInner::Candle(kv) => 0..kv.tokens(),
            CacheInner::CandleSlice(s) => s.positions(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        match &self.0 {
            CacheInner::Sim {
                positions,
                bytes_per_token,
            } => positions.len() as u64 * bytes_per_token,
            CacheInner::Candle(kv) => kv.bytes(),
            CacheInner::CandleSlice(s) => s.bytes(),
        }
    }
}

impl fmt::Debug for CacheState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheState({:?}, {} B)", self.positions(), self.bytes())
    }
}

/// What a shard's step produces besides its cache: an activation or the tail's token.
#[derive(Clone, Debug)]
pub enum StepOutput {
    Activation(Activation),
    Token {
        token: u32,
        /// The newest position's logits (real backends only).
        logits: Option<Vec<f32>>,
    },
}

/// The result of running one layer range.
#[derive(Clone, Debug)]
pub struct Step {
    pub output: StepOutput,
    pub cache: CacheState,
    /// The modelled duration (sim backend only).
    pub duration: Option<Nanos>,
}

/// What can go wrong in a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend for layers {have:?} asked to run layers {asked:?}")]
    WrongLayers {
        have: Range<usize>,
        asked: Range<usize>,
    },
    #[error("cache of {cached} tokens given for a step at offset {offset}")]
    CacheMismatch { cached: usize, offset: usize },
    #[error("a cache state from another backend")]
    ForeignCache,
    #[error("an activation from another backend or for another shard")]
    ForeignActivation,
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// Runs one contiguous layer range of a model. See the module doc.
pub trait ModelBackend: Send {
    /// The layers this backend holds.
    fn layers(&self) -> Range<usize>;
    /// Layers of the whole model.
    fn total_layers(&self) -> usize;
    /// Runs `layers` on `input` (new tokens from position `offset`) with `cache` (which must
    /// hold `offset` tokens; `None` means none, and then `offset` must be 0).
    fn run(
        &mut self,
        layers: Range<usize>,
        input: Activation,
        offset: usize,
        cache: Option<CacheState>,
    ) -> Result<Step, BackendError>;
    /// The cache state of positions `positions` of `cache` (for a prefix store).
    fn export(
        &self,
        cache: &CacheState,
        positions: Range<usize>,
    ) -> Result<CacheState, BackendError>;
    /// `base` (or an empty cache) extended by an exported `part` that starts where it ends.
    fn import(
        &self,
        base: Option<CacheState>,
        part: &CacheState,
    ) -> Result<CacheState, BackendError>;

    fn is_head(&self) -> bool {
        self.layers().start == 0
    }
    fn is_tail(&self) -> bool {
        self.layers().end == self.total_layers()
    }
}

fn check_layers(have: &Range<usize>, asked: &Range<usize>) -> Result<(), BackendError> {
    if have != asked {
        return Err(BackendError::WrongLayers {
            have: have.clone(),
            asked: asked.clone(),
        });
    }
    Ok(())
}

/// The analytic backend: shapes, sizes and modelled durations, no values.
#[derive(Clone, Debug)]
pub struct SimBackend {
    model: ModelConfig,
    layers: Range<usize>,
    timing: Timing,
}

/// Where a [`SimBackend`]'s durations come from.
#[derive(Clone, Debug)]
enum Timing {
    /// The roofline cost model of the shard's part of the model.
    Analytic(CostModel),
    /// A measured profile of the shard.
    Profiled(ShardProfile),
}

impl Timing {
    /// The duration of `n` new tokens at `offset` (on the tail if `tail`).
    fn duration(&self, n: usize, offset: usize, tail: bool) -> Nanos {
        match self {
            Timing::Analytic(cost) => {
                let mut shape = BatchShape::default();
                shape.add(n as u64, offset as u64, tail);
                cost.iteration(&shape)
            }
            Timing::Profiled(p) if offset == 0 => p.prefill(n),
            Timing::Profiled(p) if n == 1 => p.decode(offset),
            // An approximation: `n` tokens after `offset` cost what a prefill of `offset + n`
            // costs beyond a prefill of `offset`. It ignores that the cached tokens' K/V are
            // read rather than computed, so it overstates attention work slightly.
            Timing::Profiled(p) => p.prefill(offset + n).saturating_sub(p.prefill(offset)),
        }
    }
}

impl SimBackend {
    /// Layers `layers` of `model` on one `gpu`, with `overhead` per step.
    pub fn new(
        model: ModelConfig,
        layers: Range<usize>,
        gpu: GpuSpec,
        overhead: Nanos,
    ) -> SimBackend {
        let tail = layers.end as u64 == model.layers;
        let part = ModelConfig {
            layers: layers.len() as u64,
            // The LM head's weights and FLOPs belong to the tail shard alone.
            vocab: if tail { model.vocab } else { 0 },
            ..model.clone()
        };
        let unused = LinkSpec {
            bandwidth: 1.0,
            latency: Nanos::ZERO,
        };
        SimBackend {
            timing: Timing::Analytic(CostModel::new(part, gpu, unused, 1, overhead)),
            model,
            layers,
        }
    }

    /// Layers `layers` of `model`, timed by the measured `profile` of that shard (see
    /// [`crate::profile`]) instead of the cost model:
    /// - offset 0 (prefill or a stateless pass of `n` tokens): `profile.prefill(n)`;
    /// - offset > 0 and one new token (decode): `profile.decode(offset)`;
    /// - offset > 0 and `n > 1` new tokens (a prefill after an imported prefix):
    ///   `profile.prefill(offset + n) - profile.prefill(offset)`, saturating at zero. This is
    ///   an approximation: the prefix's K/V are read from the cache rather than computed, which
    ///   the difference of two full prefills only estimates.
    ///
    /// The caller picks the profile of the same layer range ([`crate::profile::Profile::shard`]);
    /// `model` gives the shapes and sizes of activations and caches, as in [`SimBackend::new`].
    pub fn profiled(model: ModelConfig, layers: Range<usize>, profile: ShardProfile) -> SimBackend {
        SimBackend {
            model,
            layers,
            timing: Timing::Profiled(profile),
        }
    }

    fn bytes_per_token(&self) -> u64 {
        let m = &self.model;
        2 * self.layers.len() as u64 * m.kv_heads * m.head_dim * m.bytes_per_element
    }
}

impl ModelBackend for SimBackend {
    fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    fn total_layers(&self) -> usize {
        self.model.layers as usize
    }

    fn run(
        &mut self,
        layers: Range<usize>,
        input: Activation,
        offset: usize,
        cache: Option<CacheState>,
    ) -> Result<Step, BackendError> {
        check_layers(&self.layers, &layers)?;
        let cached = match &cache {
            None => 0,
            Some(CacheState(CacheInner::Sim { positions, .. })) => positions.end,
            Some(_) => return Err(BackendError::ForeignCache),
        };
        if cached != offset {
            return Err(BackendError::CacheMismatch { cached, offset });
        }
        match (&input.0, self.is_head()) {
            (ActInner::Tokens(_), true) | (ActInner::Shape { .. }, false) => {}
            _ => return Err(BackendError::ForeignActivation),
        }
        let n = input.positions();
        let output = if self.is_tail() {
            StepOutput::Token {
                token: 0,
                logits: None,
            }
        } else {
            StepOutput::Activation(Activation(ActInner::Shape {
                positions: n,
                hidden: self.model.hidden as usize,
                bytes_per_element: self.model.bytes_per_element as usize,
            }))
        };
        Ok(Step {
            output,
            cache: CacheState(CacheInner::Sim {
                positions: 0..offset + n,
                bytes_per_token: self.bytes_per_token(),
            }),
            duration: Some(self.timing.duration(n, offset, self.is_tail())),
        })
    }

    fn export(
        &self,
        cache: &CacheState,
        positions: Range<usize>,
    ) -> Result<CacheState, BackendError> {
        let CacheInner::Sim {
            positions: held,
            bytes_per_token,
        } = &cache.0
        else {
            return Err(BackendError::ForeignCache);
        };
        if positions.start < held.start || positions.end > held.end {
            return Err(
                ExecError::Cache(format!("cannot export {positions:?} of {held:?}")).into(),
            );
        }
        Ok(CacheState(CacheInner::Sim {
            positions,
            bytes_per_token: *bytes_per_token,
        }))
    }

    fn import(
        &self,
        base: Option<CacheState>,
        part: &CacheState,
    ) -> Result<CacheState, BackendError> {
        let CacheInner::Sim { positions, .. } = &part.0 else {
            return Err(BackendError::ForeignCache);
        };
        let held = base.map(|b| b.positions().end).unwrap_or(0);
        if positions.start != held {
            return Err(BackendError::CacheMismatch {
                cached: held,
                offset: positions.start,
            });
        }
        Ok(CacheState(CacheInner::Sim {
            positions: 0..positions.end,
            bytes_per_token: self.bytes_per_token(),
        }))
    }
}

/// The real backend: a [`ShardModel`] on a candle device.
pub struct CandleBackend {
    model: ShardModel,
}

impl CandleBackend {
    pub fn new(model: ShardModel) -> CandleBackend {
        CandleBackend { model }
    }

    /// Loads layers `layers` of `cfg` from `source` onto `device`.
    pub fn load(
        cfg: &TransformerConfig,
        layers: Range<usize>,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
    ) -> Result<CandleBackend, ExecError> {
        let vb = weights::var_builder(cfg, layers.clone(), source, dtype, device)?;
        Ok(CandleBackend::new(ShardModel::new(cfg, layers, vb)?))
    }

    pub fn model(&self) -> &ShardModel {
        &self.model
    }
}

impl ModelBackend for CandleBackend {
    fn layers(&self) -> Range<usize> {
        self.model.layers()
    }

    fn total_layers(&self) -> usize {
        self.model.config().layers
    }

    fn run(
        &mut self,
        layers: Range<usize>,
        input: Activation,
        offset: usize,
        cache: Option<CacheState>,
    ) -> Result<Step, BackendError> {
        check_layers(&self.model.layers(), &layers)?;
        let mut kv = match cache {
            None => self.model.new_cache(),
            Some(CacheState(CacheInner::Candle(kv))) => kv,
            Some(_) => return Err(BackendError::ForeignCache),
        };
        if kv.tokens() != offset {
            return Err(BackendError::CacheMismatch {
                cached: kv.tokens(),
                offset,
            });
        }
        let input = match &input.0 {
            ActInner::Tokens(ids) => ShardInput::Tokens(ids),
            ActInner::Tensor(t) => ShardInput::Hidden(t),
            ActInner::Shape { .. } => return Err(BackendError::ForeignActivation),
        };
        let output = match self.model.forward(input, offset, &mut kv)? {
            ShardOutput::Hidden(h) => StepOutput::Activation(Activation(ActInner::Tensor(h))),
            ShardOutput::Logits(l) => {
                let logits = l.to_vec1::<f32>().map_err(ExecError::from)?;
                StepOutput::Token {
                    token: argmax(&logits),
                    logits: Some(logits),
                }
            }
        };
        Ok(Step {
            output,
            cache: CacheState(CacheInner::Candle(kv)),
            duration: None,
        })
    }

    fn export(
        &self,
        cache: &CacheState,
        positions: Range<usize>,
    ) -> Result<CacheState, BackendError> {
        let CacheInner::Candle(kv) = &cache.0 else {
            return Err(BackendError::ForeignCache);
        };
        Ok(CacheState(CacheInner::CandleSlice(kv.export(positions)?)))
    }

    fn import(
        &self,
        base: Option<CacheState>,
        part: &CacheState,
    ) -> Result<CacheState, BackendError> {
        let CacheInner::CandleSlice(slice) = &part.0 else {
            return Err(BackendError::ForeignCache);
        };
        let mut kv = match base {
            None => self.model.new_cache(),
            Some(CacheState(CacheInner::Candle(kv))) => kv,
            Some(_) => return Err(BackendError::ForeignCache),
        };
        kv.import(&slice.to(self.model.device(), self.model.dtype())?)?;
        Ok(CacheState(CacheInner::Candle(kv)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100() -> GpuSpec {
        GpuSpec::a100_40gb(1.0, 1.0)
    }

    #[test]
    fn sim_shards_split_the_cost_and_the_kv_of_the_whole_model() {
        let m = ModelConfig::mistral_7b_instruct_v0_2();
        let mut whole = SimBackend::new(m.clone(), 0..32, a100(), Nanos::ZERO);
        let mut head = SimBackend::new(m.clone(), 0..16, a100(), Nanos::ZERO);
        let mut tail = SimBackend::new(m.clone(), 16..32, a100(), Nanos::ZERO);
        let w = whole
            .run(0..32, Activation::tokens(vec![7]), 0, None)
            .unwrap();
        let h = head
            .run(0..16, Activation::tokens(vec![7]), 0, None)
            .unwrap();
        let StepOutput::Activation(x) = h.output else {
            panic!("the head returns an activation");
        };
        // One token's hidden state in bf16.
        assert_eq!(x.bytes(), 4096 * 2);
        let t = tail.run(16..32, x, 0, None).unwrap();
        assert!(matches!(t.output, StepOutput::Token { token: 0, .. }));
        // Memory-bound decode: the halves read the same bytes as the whole (to rounding).
        let sum = h.duration.unwrap() + t.duration.unwrap();
        assert!(
            sum.0.abs_diff(w.duration.unwrap().0) <= 2,
            "{sum:?} vs {w:?}"
        );
        // Each half holds half of the 128 KiB of KV per token.
        assert_eq!(h.cache.bytes(), 64 * 1024);
        assert_eq!(w.cache.bytes(), m.kv_bytes_per_token());
    }

    #[test]
    fn profiled_sim_backends_charge_the_profile() {
        let t = |v: &[(u32, u64)]| v.iter().map(|&(x, y)| (x, Nanos(y))).collect::<Vec<_>>();
        let profile = ShardProfile {
            layers: 0..2,
            prefill: t(&[(1, 1_000), (8, 4_500), (16, 8_500)]),
            decode: t(&[(1, 700), (16, 1_000)]),
        };
        let m = ModelConfig::tiny();
        let mut b = SimBackend::profiled(m.clone(), 0..2, profile.clone());
        let p = b
            .run(0..2, Activation::tokens(vec![3; 8]), 0, None)
            .unwrap();
        assert_eq!(p.duration, Some(Nanos(4_500)));
        let StepOutput::Activation(x) = &p.output else {
            panic!("the head of 4 layers returns an activation");
        };
        assert_eq!(x.bytes(), 8 * m.hidden * m.bytes_per_element);
        let d = b
            .run(0..2, Activation::tokens(vec![3]), 8, Some(p.cache.clone()))
            .unwrap();
        assert_eq!(d.duration, Some(profile.decode(8)));
        assert_eq!(d.duration, Some(Nanos(840)));
        // Eight more tokens after eight cached: prefill(16) - prefill(8).
        let e = b
            .run(0..2, Activation::tokens(vec![3; 8]), 8, Some(p.cache))
            .unwrap();
        assert_eq!(e.duration, Some(Nanos(4_000)));
        assert_eq!(e.cache.tokens(), 16);
        // The analytic constructor still charges the cost model.
        let mut a = SimBackend::new(m, 0..2, a100(), Nanos::ZERO);
        let r = a
            .run(0..2, Activation::tokens(vec![3; 8]), 0, None)
            .unwrap();
        assert_ne!(r.duration, Some(Nanos(4_500)));
    }

    #[test]
    fn sim_caches_must_match_the_offset_and_export_import_by_count() {
        let m = ModelConfig::tiny();
        let mut b = SimBackend::new(m, 0..4, a100(), Nanos::ZERO);
        let s = b
            .run(0..4, Activation::tokens(vec![1; 10]), 0, None)
            .unwrap();
        assert!(matches!(
            b.run(0..4, Activation::tokens(vec![1]), 9, Some(s.cache.clone())),
            Err(BackendError::CacheMismatch {
                cached: 10,
                offset: 9
            })
        ));
        let part = b.export(&s.cache, 0..6).unwrap();
        let rest = b.export(&s.cache, 6..10).unwrap();
        let joined = b
            .import(Some(b.import(None, &part).unwrap()), &rest)
            .unwrap();
        assert_eq!(joined.tokens(), 10);
        assert_eq!(joined.bytes(), s.cache.bytes());
        assert!(b.import(None, &rest).is_err());
    }
}
