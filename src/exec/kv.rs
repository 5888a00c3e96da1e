//! The K/V cache of one shard's layers for one sequence, and exported token ranges of it.
//!
//! Per layer, K and V have shape `[1, kv_heads, tokens, head_dim]` (after the rotary
//! embedding, as attention reads them). Exporting positions `a..b` narrows every layer's K and
//! V to those positions; importing appends such a slice to a cache that holds exactly `a`
//! tokens of the same layers, so a prefix computed once can serve every prompt that starts
//! with it. Nothing outside the model looks inside.

use candle_core::{DType, Device, Tensor};
use std::ops::Range;

use super::ExecError;

/// The K/V cache of one shard's layers for one sequence: per layer, K and V of shape
/// `[1, kv_heads, tokens, head_dim]`. Opaque to everything but the model.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Range<usize>,
    pub(super) kv: Vec<Option<(Tensor, Tensor)>>,
    pub(super) tokens: usize,
}

impl KvCache {
    /// An empty cache for layers `layers`.
    pub fn new(layers: Range<usize>) -> KvCache {
        KvCache {
            kv: vec![None; layers.len()],
            layers,
            tokens: 0,
        }
    }

    /// The layer range whose K/V this cache holds.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Tokens held (the position the next token will take).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Bytes of all K and V tensors.
    pub fn bytes(&self) -> u64 {
        self.kv
            .iter()
            .flatten()
            .map(|(k, v)| ((k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// The K/V of positions `range`, as a cache of its own (which knows that it starts at
    /// `range.start`; see [`KvCache::import`]).
    pub fn export(&self, range: Range<usize>) -> Result<KvSlice, ExecError> {
        if range.start > range.end || range.end > self.tokens {
            return Err(ExecError::Cache(format!(
                "cannot export tokens {range:?} of a cache holding {}",
                self.tokens
            )));
        }
        let kv = self
            .kv
            .iter()
            .map(|layer| match layer {
                Some((k, v)) => Ok(Some((
                    k.narrow(2, range.start, range.len())?.contiguous()?,
                    v.narrow(2, range.start, range.len())?.contiguous()?,
                ))),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, candle_core::Error>>()?;
        Ok(KvSlice {
            layers: self.layers.clone(),
            positions: range,
            kv,
        })
    }

    /// Appends `slice`, which must cover the same layers and start at this cache's length.
    pub fn import(&mut self, slice: &KvSlice) -> Result<(), ExecError> {
        if slice.layers != self.layers || slice.positions.start != self.tokens {
            return Err(ExecError::Cache(format!(
                "cannot import layers {:?} tokens {:?} into a cache of layers {:?} holding {}",
                slice.layers, slice.positions, self.layers, self.tokens
            )));
        }
        if slice.positions.is_empty() {
            return Ok(());
        }
        for (mine, theirs) in self.kv.iter_mut().zip(&slice.kv) {
            let Some((k, v)) = theirs else {
                return Err(ExecError::Cache("imported slice has an empty layer".into()));
            };
            *mine = Some(match mine.take() {
                None => (k.clone(), v.clone()),
                Some((k0, v0)) => (Tensor::cat(&[&k0, k], 2)?, Tensor::cat(&[&v0, v], 2)?),
            });
        }
        self.tokens = slice.positions.end;
        Ok(())
    }
}

/// The K/V of a token range of one shard's layers, exported from a [`KvCache`].
#[derive(Clone, Debug)]
pub struct KvSlice {
    layers: Range<usize>,
    positions: Range<usize>,
    kv: Vec<Option<(Tensor, Tensor)>>,
}

impl KvSlice {
    pub fn positions(&self) -> Range<usize> {
        self.positions.clone()
    }
    pub fn bytes(&self) -> u64 {
        self.kv
            .iter()
            .flatten()
            .map(|(k, v)| ((k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// The same K/V on `device` in `dtype` (a prefix fetched from host memory into a GPU).
    pub fn to(&self, device: &Device, dtype: DType) -> Result<KvSlice, ExecError> {
        let kv = self
            .kv
            .iter()
            .map(|layer| match layer {
                Some((k, v)) => Ok(Some((
                    k.to_device(device)?.to_dtype(dtype)?,
                    v.to_device(device)?.to_dtype(dtype)?,
                ))),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, candle_core::Error>>()?;
        Ok(KvSlice {
            layers: self.layers.clone(),
            positions: self.positions.clone(),
            kv,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_cache_refuses_exports_past_its_end() {
        let kv = KvCache::new(0..2);
        assert_eq!((kv.tokens(), kv.bytes()), (0, 0));
        assert!(kv.export(0..1).is_err());
    }
}
