//! The K/V cache of one shard's layers for one sequence, and exported token ranges of it.
//!
//! Per layer, K and V have shape `[1, kv_heads, tokens, head_dim]` (after the rotary
//! embedding, as attention reads them). Exporting positions `a..b` narrows every layer's K and
//! V to those positions; importing appends such a slice to a cache that holds exactly `a`
//! tokens of the same layers, so a prefix computed once can serve every prompt that starts
//! with it. Nothing outside the model looks inside.

use candle_core::{DType, Device, Tensor};
use ndarray::{Array5, Axis, s};
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
        Ok(KvSlice {
            layers: self.layers.clone(),
            kv: narrow_layers(&self.kv, range.start, range.len())?,
            positions: range,
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

impl KvCache {
    /// A cache holding exactly `slice`, which must start at position 0.
    pub fn from_slice(slice: KvSlice) -> Result<KvCache, ExecError> {
        if slice.positions.start != 0 {
            return Err(ExecError::Cache(format!(
                "a cache cannot start at position {}",
                slice.positions.start
            )));
        }
        Ok(KvCache {
            tokens: slice.positions.end,
            layers: slice.layers,
            kv: slice.kv,
        })
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

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// `slices` laid end to end (a paged cache's blocks): each must start where the one
    /// before ends, all of layers `layers`. One concatenation per layer, whatever their
    /// number. No slices give an empty one at position `0`.
    pub fn join(layers: Range<usize>, slices: &[KvSlice]) -> Result<KvSlice, ExecError> {
        let start = slices.first().map_or(0, |s| s.positions.start);
        let mut end = start;
        for sl in slices {
            if sl.layers != layers || sl.positions.start != end {
                return Err(ExecError::Cache(format!(
                    "cannot join layers {:?} tokens {:?} after tokens {start}..{end} of layers \
                     {layers:?}",
                    sl.layers, sl.positions
                )));
            }
            end = sl.positions.end;
        }
        let mut kv = vec![None; layers.len()];
        let parts: Vec<&KvSlice> = slices.iter().filter(|s| !s.positions.is_empty()).collect();
        if !parts.is_empty() {
            for (l, mine) in kv.iter_mut().enumerate() {
                let mut ks = Vec::with_capacity(parts.len());
                let mut vs = Vec::with_capacity(parts.len());
                for sl in &parts {
                    let Some((k, v)) = &sl.kv[l] else {
                        return Err(ExecError::Cache("a joined slice has an empty layer".into()));
                    };
                    ks.push(k);
                    vs.push(v);
                }
                *mine = Some(if ks.len() == 1 {
                    (ks[0].clone(), vs[0].clone())
                } else {
                    (Tensor::cat(&ks, 2)?, Tensor::cat(&vs, 2)?)
                });
            }
        }
        Ok(KvSlice {
            layers,
            positions: start..end,
            kv,
        })
    }

    /// The K/V of positions `range` (within this slice's positions) as a slice of its own.
    pub fn narrow(&self, range: Range<usize>) -> Result<KvSlice, ExecError> {
        if range.start < self.positions.start
            || range.end > self.positions.end
            || range.start > range.end
        {
            return Err(ExecError::Cache(format!(
                "cannot narrow tokens {:?} to {range:?}",
                self.positions
            )));
        }
        Ok(KvSlice {
            layers: self.layers.clone(),
            kv: narrow_layers(&self.kv, range.start - self.positions.start, range.len())?,
            positions: range,
        })
    }

    /// A host-side copy of this K/V in f32 (what a prefix store holds; see [`HostKv`]).
    pub fn to_host(&self) -> Result<HostKv, ExecError> {
        let n = self.positions.len();
        let mut dims = None;
        let mut data = Vec::new();
        for layer in &self.kv {
            let Some((k, v)) = layer else {
                return Err(ExecError::Cache("a slice with an empty layer".into()));
            };
            for t in [k, v] {
                let (_, heads, tokens, head_dim) = t.dims4()?;
                dims = Some((heads, tokens, head_dim));
                data.extend(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        let (heads, tokens, head_dim) = dims.unwrap_or((0, n, 0));
        if tokens != n {
            return Err(ExecError::Cache(format!(
                "a slice of {n} positions holds {tokens} tokens"
            )));
        }
        let shape = (self.layers.len(), 2, heads, tokens, head_dim);
        let data = Array5::from_shape_vec(shape, data)
            .map_err(|e| ExecError::Cache(format!("host copy: {e}")))?;
        Ok(HostKv {
            layers: self.layers.clone(),
            positions: self.positions.clone(),
            data,
        })
    }

    /// The K/V of a host-side copy, on `device` in `dtype` (a load into a GPU).
    pub fn from_host(h: &HostKv, device: &Device, dtype: DType) -> Result<KvSlice, ExecError> {
        let (_, _, heads, tokens, head_dim) = h.data.dim();
        let mut kv = Vec::with_capacity(h.layers.len());
        for l in 0..h.layers.len() {
            let layer = h.data.index_axis(Axis(0), l);
            let mut pair = Vec::with_capacity(2);
            for which in 0..2 {
                let t = layer.slice(s![which, .., .., ..]);
                let flat: Vec<f32> = t.iter().copied().collect();
                pair.push(
                    Tensor::from_vec(flat, (1, heads, tokens, head_dim), device)?
                        .to_dtype(dtype)?,
                );
            }
            let v = pair.pop().expect("two");
            let k = pair.pop().expect("two");
            kv.push(Some((k, v)));
        }
        Ok(KvSlice {
            layers: h.layers.clone(),
            positions: h.positions.clone(),
            kv,
        })
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

/// Every layer's K and V narrowed to `len` positions from index `from` (contiguous copies).
type Layers = Vec<Option<(Tensor, Tensor)>>;

fn narrow_layers(kv: &Layers, from: usize, len: usize) -> Result<Layers, ExecError> {
    Ok(kv
        .iter()
        .map(|layer| match layer {
            Some((k, v)) => Ok(Some((
                k.narrow(2, from, len)?.contiguous()?,
                v.narrow(2, from, len)?.contiguous()?,
            ))),
            None => Ok(None),
        })
        .collect::<Result<Vec<_>, candle_core::Error>>()?)
}

/// A host-side copy of the K/V of a token range (a prefix store's tensor): f32, shaped
/// `[layers, 2 (K, V), kv_heads, tokens, head_dim]`, little-endian when it crosses a wire.
#[derive(Clone, Debug, PartialEq)]
pub struct HostKv {
    pub layers: Range<usize>,
    pub positions: Range<usize>,
    pub data: Array5<f32>,
}

impl HostKv {
    /// Bytes of K/V held.
    pub fn bytes(&self) -> u64 {
        (self.data.len() * std::mem::size_of::<f32>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(positions: Range<usize>) -> KvSlice {
        let n = positions.len();
        let layer = |l: usize| {
            let vals: Vec<f32> = (0..2 * n * 3)
                .map(|i| (l * 1000 + positions.start * 6 + i) as f32)
                .collect();
            let t = Tensor::from_vec(vals, (1, 2, n, 3), &Device::Cpu).unwrap();
            Some((t.clone(), (t * 2.0).unwrap()))
        };
        KvSlice {
            layers: 0..2,
            positions: positions.clone(),
            kv: (0..2).map(layer).collect(),
        }
    }

    fn values(s: &KvSlice) -> Vec<f32> {
        s.kv.iter()
            .flatten()
            .flat_map(|(k, v)| {
                let mut x = k.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                x.extend(v.flatten_all().unwrap().to_vec1::<f32>().unwrap());
                x
            })
            .collect()
    }

    #[test]
    fn slices_narrow_join_and_go_through_host_memory_unchanged() {
        let whole = slice(0..10);
        let parts = [
            whole.narrow(0..4).unwrap(),
            whole.narrow(4..9).unwrap(),
            whole.narrow(9..10).unwrap(),
        ];
        let joined = KvSlice::join(0..2, &parts).unwrap();
        assert_eq!(joined.positions(), 0..10);
        assert_eq!(values(&joined), values(&whole));
        let host = whole.to_host().unwrap();
        assert_eq!(host.data.dim(), (2, 2, 2, 10, 3));
        assert_eq!(host.bytes(), whole.bytes());
        let back = KvSlice::from_host(&host, &Device::Cpu, DType::F32).unwrap();
        assert_eq!(values(&back), values(&whole));
        let cache = KvCache::from_slice(joined).unwrap();
        assert_eq!(cache.tokens(), 10);
        // Gaps, overlaps and foreign layers are refused.
        assert!(KvSlice::join(0..2, &[parts[0].clone(), parts[2].clone()]).is_err());
        assert!(KvSlice::join(0..3, &parts).is_err());
        assert!(whole.narrow(5..12).is_err());
        assert!(KvCache::from_slice(parts[1].clone()).is_err());
    }

    #[test]
    fn an_empty_cache_refuses_exports_past_its_end() {
        let kv = KvCache::new(0..2);
        assert_eq!((kv.tokens(), kv.bytes()), (0, 0));
        assert!(kv.export(0..1).is_err());
    }
}
