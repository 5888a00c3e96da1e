//! The real backend of pipeline shards: a [`ShardModel`] computing real tensors on a candle
//! device. It reports no modelled duration (the caller measures wall time if it wants one).

use candle_core::{DType, Device};
use std::ops::Range;

use super::{
    ActInner, Activation, BackendError, CacheInner, CacheState, ModelBackend, Step, StepOutput,
    check_layers,
};
use crate::exec::model::argmax;
use crate::exec::weights::{self, WeightSource};
use crate::exec::{ExecError, ShardInput, ShardModel, ShardOutput, TransformerConfig};

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
