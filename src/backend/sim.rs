//! The analytic backend of pipeline shards: shapes, sizes and modelled durations, no values.

use std::ops::Range;

use super::{
    ActInner, Activation, BackendError, CacheInner, CacheState, ModelBackend, Step, StepOutput,
    check_layers,
};
use crate::exec::ExecError;
use crate::hardware::GpuSpec;
use crate::model::ModelConfig;
use crate::model::cost::{BatchShape, CostModel};
use crate::model::profile::ShardProfile;
use crate::units::Nanos;

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
        SimBackend {
            timing: Timing::Analytic(CostModel::single_gpu(part, gpu, overhead)),
            model,
            layers,
        }
    }

    /// Layers `layers` of `model`, timed by the measured `profile` of that shard (see
    /// [`crate::model::profile`]) instead of the cost model:
    /// - offset 0 (prefill or a stateless pass of `n` tokens): `profile.prefill(n)`;
    /// - offset > 0 and one new token (decode): `profile.decode(offset)`;
    /// - offset > 0 and `n > 1` new tokens (a prefill after an imported prefix):
    ///   `profile.prefill(offset + n) - profile.prefill(offset)`, saturating at zero. This is
    ///   an approximation: the prefix's K/V are read from the cache rather than computed, which
    ///   the difference of two full prefills only estimates.
    ///
    /// The caller picks the profile of the same layer range ([`crate::model::profile::Profile::shard`]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Activation;

    fn a100() -> GpuSpec {
        GpuSpec::a100_40gb(1.0, 1.0)
    }

    #[test]
    fn sim_shards_split_the_cost_and_the_kv_of_the_whole_model() {
        let m = crate::model::catalogue::MISTRAL_7B_V0_2.model;
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
        let m = crate::model::catalogue::TINY.model;
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
        let m = crate::model::catalogue::TINY.model;
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
