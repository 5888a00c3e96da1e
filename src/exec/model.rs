//! A decoder-only transformer of the Llama/Mistral family (and Qwen2, with its QKV bias),
//! written for meshsim so that it can run any contiguous **layer range** of the model.
//!
//! Architecture: token embedding; per block `x + attn(rms_norm(x))` then
//! `x + mlp(rms_norm(x))`, where attention is grouped-query attention (each of `kv_heads` K/V
//! heads serves `heads / kv_heads` query heads) with rotary position embeddings (the
//! "rotate-half" form of Hugging Face's Llama, base `rope_theta`) and a causal mask, and the MLP
//! is SwiGLU (`down(silu(gate(x)) * up(x))`); a final RMSNorm and the LM head give the logits.
//!
//! A [`ShardModel`] holds the weights of layers `[start, end)`. The shard that starts at layer 0
//! (the *head*) also holds the embedding and takes token ids; the shard that ends at the last
//! layer (the *tail*) also holds the final norm and the LM head and returns the logits of the
//! newest position. Every other shard maps a hidden activation `[1, n, hidden]` to another.
//! One shard can be head and tail at once (the unsplit model).
//!
//! Each forward call takes the absolute position of its first token (the *offset*) and a
//! [`KvCache`] of the shard's own layers that holds exactly `offset` tokens; it appends the new
//! tokens' K and V. The cache can export the K/V of a token range and import such a range, so
//! that a prefix computed for one prompt can serve another that starts with it.
//!
//! Weight names are Hugging Face's (`model.embed_tokens.weight`,
//! `model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), so
//! a real checkpoint's safetensors load unchanged through a [`VarBuilder`].

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, Linear, RmsNorm, VarBuilder};
use serde::{Deserialize, Serialize};
use std::ops::Range;

use super::ExecError;
use super::kv::KvCache;
use crate::model::{ModelConfig, Preset};

/// What the candle transformer needs: the architecture numbers of [`ModelConfig`] plus the
/// rotary base and the RMSNorm epsilon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerConfig {
    pub name: String,
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// The input embedding doubles as the LM head.
    pub tied_embeddings: bool,
    /// Q, K and V projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    pub rope_theta: f64,
    pub rms_eps: f64,
}

impl TransformerConfig {
    /// The architecture of `m` with the given rotary base and RMSNorm epsilon.
    pub fn from_model(m: &ModelConfig, rope_theta: f64, rms_eps: f64) -> TransformerConfig {
        TransformerConfig {
            name: m.name.to_string(),
            layers: m.layers as usize,
            hidden: m.hidden as usize,
            ffn: m.ffn as usize,
            heads: m.heads as usize,
            kv_heads: m.kv_heads as usize,
            head_dim: m.head_dim as usize,
            vocab: m.vocab as usize,
            tied_embeddings: m.tied_embeddings,
            qkv_bias: m.qkv_bias,
            rope_theta,
            rms_eps,
        }
    }

    /// The candle configuration of a catalogue preset (see [`crate::model::catalogue`]).
    pub fn from_preset(p: &Preset) -> TransformerConfig {
        Self::from_model(&p.model, p.rope_theta, p.rms_eps)
    }

    /// The candle configuration of the preset called `name`.
    pub fn preset(name: &str) -> Option<TransformerConfig> {
        crate::model::preset(name).map(Self::from_preset)
    }

    /// Bytes of the f32 weights of `layers` of its layers, with the embedding, the final
    /// norm and the LM head (counted even when tied): an upper bound, to refuse a model too
    /// large for a node.
    pub fn f32_weight_bytes(&self, layers: usize) -> u64 {
        let (h, f, v) = (self.hidden as u64, self.ffn as u64, self.vocab as u64);
        let kv = (self.kv_heads * self.head_dim) as u64;
        let q = (self.heads * self.head_dim) as u64;
        let per_layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h;
        (per_layer * layers as u64 + 2 * v * h + h) * 4
    }

    /// Bytes of f32 K/V one token holds over all layers.
    pub fn f32_kv_bytes_per_token(&self) -> u64 {
        (self.layers * 2 * self.kv_heads * self.head_dim * 4) as u64
    }

    /// Checks the numbers that the model relies on.
    pub fn validate(&self) -> Result<(), ExecError> {
        let bad = |why: &str| Err(ExecError::Config(format!("{}: {why}", self.name)));
        if self.layers == 0 || self.hidden == 0 || self.heads == 0 || self.vocab == 0 {
            return bad("layers, hidden, heads and vocab must be non-zero");
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad("heads must be a multiple of kv_heads");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head_dim must be even and non-zero (rotary pairs)");
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.rope_theta) || !positive(self.rms_eps) {
            return bad("rope_theta and rms_eps must be positive");
        }
        Ok(())
    }

    /// The architecture as a [`ModelConfig`] with `bytes_per_element` (4 for f32), so that a
    /// simulated backend can stand in for this configuration. `ModelConfig::name` is static:
    /// the known presets keep their names (and context limits), anything else is called
    /// `"custom"`.
    pub fn model_config(&self, bytes_per_element: u64) -> ModelConfig {
        let (name, max_context) = crate::model::preset(&self.name)
            .map_or(("custom", ModelConfig::UNBOUNDED_CONTEXT), |p| {
                (p.name(), p.model.max_context)
            });
        ModelConfig {
            name,
            layers: self.layers as u64,
            hidden: self.hidden as u64,
            ffn: self.ffn as u64,
            heads: self.heads as u64,
            kv_heads: self.kv_heads as u64,
            head_dim: self.head_dim as u64,
            vocab: self.vocab as u64,
            bytes_per_element,
            tied_embeddings: self.tied_embeddings,
            qkv_bias: self.qkv_bias,
            max_context,
        }
    }

    /// K/V values (elements) of one token in one layer.
    pub fn kv_elements_per_token_layer(&self) -> usize {
        2 * self.kv_heads * self.head_dim
    }
}

/// What a shard's forward pass takes: token ids (the head) or a hidden activation.
#[derive(Clone, Debug)]
pub enum ShardInput<'a> {
    Tokens(&'a [u32]),
    Hidden(&'a Tensor),
}

/// What a shard's forward pass gives: the hidden activation `[1, n, hidden]` (not the tail),
/// or the logits of the newest position, `[vocab]` in f32 (the tail).
#[derive(Clone, Debug)]
pub enum ShardOutput {
    Hidden(Tensor),
    Logits(Tensor),
}

/// Rotary tables for positions `[offset, offset + n)`: cos and sin of shape `[n, head_dim/2]`.
fn rotary(
    cfg: &TransformerConfig,
    offset: usize,
    n: usize,
    dtype: DType,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in offset..offset + n {
        for i in 0..half {
            let inv_freq = 1.0 / libm::pow(cfg.rope_theta, (2 * i) as f64 / cfg.head_dim as f64);
            let angle = p as f64 * inv_freq;
            cos.push(libm::cos(angle) as f32);
            sin.push(libm::sin(angle) as f32);
        }
    }
    let cos = Tensor::from_vec(cos, (n, half), dev)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (n, half), dev)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

/// The causal mask of `n` new tokens after `offset` cached ones: `[n, offset + n]`, 0 where a
/// query may attend and -inf where it may not.
fn causal_mask(offset: usize, n: usize, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
    let total = offset + n;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j > offset + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (n, total), dev)?.to_dtype(dtype)
}

#[derive(Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    fn new(cfg: &TransformerConfig, vb: VarBuilder) -> candle_core::Result<Attention> {
        let proj = |out: usize, name: &str| {
            if cfg.qkv_bias {
                candle_nn::linear(cfg.hidden, out, vb.pp(name))
            } else {
                candle_nn::linear_no_bias(cfg.hidden, out, vb.pp(name))
            }
        };
        Ok(Attention {
            q: proj(cfg.heads * cfg.head_dim, "q_proj")?,
            k: proj(cfg.kv_heads * cfg.head_dim, "k_proj")?,
            v: proj(cfg.kv_heads * cfg.head_dim, "v_proj")?,
            o: candle_nn::linear_no_bias(cfg.heads * cfg.head_dim, cfg.hidden, vb.pp("o_proj"))?,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
        })
    }

    /// `x`: `[1, n, hidden]`; `cache`: this layer's K/V of the `offset` earlier tokens.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> candle_core::Result<Tensor> {
        let (b, n, _) = x.dims3()?;
        let split = |t: Tensor, heads: usize| {
            t.reshape((b, n, heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.q.forward(x)?, self.heads)?;
        let k = split(self.k.forward(x)?, self.kv_heads)?;
        let v = split(self.v.forward(x)?, self.kv_heads)?;
        let q = candle_nn::rotary_emb::rope(&q, cos, sin)?;
        let k = candle_nn::rotary_emb::rope(&k, cos, sin)?;
        let (k, v) = match cache.take() {
            None => (k, v),
            Some((k0, v0)) => (Tensor::cat(&[&k0, &k], 2)?, Tensor::cat(&[&v0, &v], 2)?),
        };
        *cache = Some((k.clone(), v.clone()));
        let rep = self.heads / self.kv_heads;
        let repeat = |t: &Tensor| -> candle_core::Result<Tensor> {
            if rep == 1 {
                return Ok(t.clone());
            }
            let (b, kvh, s, d) = t.dims4()?;
            t.unsqueeze(2)?
                .expand((b, kvh, rep, s, d))?
                .reshape((b, kvh * rep, s, d))
        };
        let k = repeat(&k)?;
        let v = repeat(&v)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&v.contiguous()?)?;
        let out = out
            .transpose(1, 2)?
            .reshape((b, n, self.heads * self.head_dim))?;
        self.o.forward(&out)
    }
}

#[derive(Clone)]
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn new(cfg: &TransformerConfig, vb: VarBuilder) -> candle_core::Result<Mlp> {
        Ok(Mlp {
            gate: candle_nn::linear_no_bias(cfg.hidden, cfg.ffn, vb.pp("gate_proj"))?,
            up: candle_nn::linear_no_bias(cfg.hidden, cfg.ffn, vb.pp("up_proj"))?,
            down: candle_nn::linear_no_bias(cfg.ffn, cfg.hidden, vb.pp("down_proj"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        self.down.forward(&(gate * self.up.forward(x)?)?)
    }
}

#[derive(Clone)]
struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    fn new(cfg: &TransformerConfig, vb: VarBuilder) -> candle_core::Result<Block> {
        Ok(Block {
            input_norm: candle_nn::rms_norm(cfg.hidden, cfg.rms_eps, vb.pp("input_layernorm"))?,
            attn: Attention::new(cfg, vb.pp("self_attn"))?,
            post_norm: candle_nn::rms_norm(
                cfg.hidden,
                cfg.rms_eps,
                vb.pp("post_attention_layernorm"),
            )?,
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
        })
    }
}

/// The weights of layers `[start, end)` of a transformer, plus the embedding if the range
/// starts at layer 0 and the final norm and LM head if it ends at the last layer.
#[derive(Clone)]
pub struct ShardModel {
    cfg: TransformerConfig,
    layers: Range<usize>,
    embed: Option<Embedding>,
    blocks: Vec<Block>,
    tail: Option<(RmsNorm, Linear)>,
    dtype: DType,
    device: Device,
}

impl ShardModel {
    /// Loads layers `layers` of `cfg` from `vb` (rooted at the checkpoint's top level).
    pub fn new(
        cfg: &TransformerConfig,
        layers: Range<usize>,
        vb: VarBuilder,
    ) -> Result<ShardModel, ExecError> {
        cfg.validate()?;
        if layers.start >= layers.end || layers.end > cfg.layers {
            return Err(ExecError::Config(format!(
                "layer range {layers:?} is empty or outside 0..{}",
                cfg.layers
            )));
        }
        let is_head = layers.start == 0;
        let is_tail = layers.end == cfg.layers;
        let embed_vb = vb.pp("model.embed_tokens");
        let embed = if is_head {
            Some(candle_nn::embedding(
                cfg.vocab,
                cfg.hidden,
                embed_vb.clone(),
            )?)
        } else {
            None
        };
        let blocks = layers
            .clone()
            .map(|i| Block::new(cfg, vb.pp(format!("model.layers.{i}"))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let tail = if is_tail {
            let norm = candle_nn::rms_norm(cfg.hidden, cfg.rms_eps, vb.pp("model.norm"))?;
            let head = if cfg.tied_embeddings {
                Linear::new(embed_vb.get((cfg.vocab, cfg.hidden), "weight")?, None)
            } else {
                candle_nn::linear_no_bias(cfg.hidden, cfg.vocab, vb.pp("lm_head"))?
            };
            Some((norm, head))
        } else {
            None
        };
        Ok(ShardModel {
            cfg: cfg.clone(),
            layers,
            embed,
            blocks,
            tail,
            dtype: vb.dtype(),
            device: vb.device().clone(),
        })
    }

    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn is_head(&self) -> bool {
        self.embed.is_some()
    }

    pub fn is_tail(&self) -> bool {
        self.tail.is_some()
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty cache for this shard's layers.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.clone())
    }

    /// Runs the shard's layers on `input` (new tokens at positions `offset..offset + n`),
    /// appending their K/V to `cache`, which must hold exactly `offset` tokens of these layers.
    pub fn forward(
        &self,
        input: ShardInput<'_>,
        offset: usize,
        cache: &mut KvCache,
    ) -> Result<ShardOutput, ExecError> {
        if cache.layers() != self.layers || cache.tokens != offset {
            return Err(ExecError::Cache(format!(
                "shard {:?} at offset {offset} got a cache of layers {:?} holding {} tokens",
                self.layers,
                cache.layers(),
                cache.tokens
            )));
        }
        let mut x = match (input, &self.embed) {
            (ShardInput::Tokens(ids), Some(embed)) => {
                let ids = Tensor::new(ids, &self.device)?.unsqueeze(0)?;
                embed.forward(&ids)?
            }
            // From another device (the previous shard's GPU) if need be; free on the same one.
            (ShardInput::Hidden(h), None) => h.to_device(&self.device)?.to_dtype(self.dtype)?,
            (ShardInput::Tokens(_), None) => {
                return Err(ExecError::Input(
                    "token ids given to a non-head shard".into(),
                ));
            }
            (ShardInput::Hidden(_), Some(_)) => {
                return Err(ExecError::Input(
                    "an activation given to the head shard".into(),
                ));
            }
        };
        let (b, n, hidden) = x.dims3()?;
        if b != 1 || n == 0 || hidden != self.cfg.hidden {
            return Err(ExecError::Input(format!(
                "expected an activation [1, n > 0, {}], got {:?}",
                self.cfg.hidden,
                x.shape()
            )));
        }
        let (cos, sin) = rotary(&self.cfg, offset, n, self.dtype, &self.device)?;
        let mask = if n > 1 {
            Some(causal_mask(offset, n, self.dtype, &self.device)?)
        } else {
            None
        };
        for (block, kv) in self.blocks.iter().zip(cache.kv.iter_mut()) {
            let h = block.input_norm.forward(&x)?;
            let h = block.attn.forward(&h, &cos, &sin, mask.as_ref(), kv)?;
            x = (x + h)?;
            let h = block.mlp.forward(&block.post_norm.forward(&x)?)?;
            x = (x + h)?;
        }
        cache.tokens = offset + n;
        match &self.tail {
            None => Ok(ShardOutput::Hidden(x)),
            Some((norm, head)) => {
                let last = x.narrow(1, n - 1, 1)?;
                let logits = head.forward(&norm.forward(&last)?)?;
                Ok(ShardOutput::Logits(
                    logits.flatten_all()?.to_dtype(DType::F32)?,
                ))
            }
        }
    }
}

/// The greedy choice: the index of the largest logit (the lowest index among equals).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest absolute difference between two equally long vectors.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vectors of different lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_carry_the_analytic_architecture_and_pass_validation() {
        let m = TransformerConfig::from_preset(&crate::model::catalogue::MISTRAL_7B_V0_2);
        assert_eq!(
            (m.layers, m.hidden, m.kv_heads, m.vocab),
            (32, 4096, 8, 32000)
        );
        assert_eq!(m.rope_theta, 1e6);
        let q = TransformerConfig::from_preset(&crate::model::catalogue::QWEN2_5_0_5B);
        assert!(q.qkv_bias && q.tied_embeddings);
        for c in [
            m,
            q,
            TransformerConfig::from_preset(&crate::model::catalogue::TINY),
            TransformerConfig::from_preset(&crate::model::catalogue::TINY_QWEN),
        ] {
            c.validate().unwrap();
        }
        let bad = TransformerConfig {
            kv_heads: 3,
            ..TransformerConfig::from_preset(&crate::model::catalogue::TINY)
        };
        assert!(matches!(bad.validate(), Err(ExecError::Config(_))));
    }

    #[test]
    fn model_configs_mirror_the_transformer_and_name_presets() {
        let m = TransformerConfig::from_preset(&crate::model::catalogue::MISTRAL_7B_V0_2)
            .model_config(2);
        assert_eq!(m, crate::model::catalogue::MISTRAL_7B_V0_2.model);
        assert_eq!(
            TransformerConfig::from_preset(&crate::model::catalogue::QWEN2_5_0_5B).model_config(2),
            crate::model::catalogue::QWEN2_5_0_5B.model
        );
        let t = TransformerConfig::from_preset(&crate::model::catalogue::TINY).model_config(4);
        assert_eq!(
            t,
            ModelConfig {
                bytes_per_element: 4,
                ..crate::model::catalogue::TINY.model
            }
        );
        let s = TransformerConfig::from_preset(&crate::model::catalogue::SMALL).model_config(4);
        assert_eq!(
            (s.name, s.layers, s.hidden, s.kv_heads),
            ("small", 8, 512, 2)
        );
        // f32 K/V: 2 x 8 layers x 2 KV heads x 64 x 4 bytes per token.
        assert_eq!(s.kv_bytes_per_token(), 8192);
        assert_eq!(
            TransformerConfig::from_preset(&crate::model::catalogue::TINY_QWEN)
                .model_config(4)
                .name,
            "tiny-qwen"
        );
        let custom = TransformerConfig {
            name: "mine".into(),
            ..TransformerConfig::from_preset(&crate::model::catalogue::TINY)
        };
        assert_eq!(custom.model_config(4).name, "custom");
    }

    #[test]
    fn configs_round_trip_through_toml_and_reject_unknown_keys() {
        let c = TransformerConfig::from_preset(&crate::model::catalogue::TINY_QWEN);
        let text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<TransformerConfig>(&text).unwrap(), c);
        let extra = format!("{text}\nsliding_window = 4096\n");
        assert!(toml::from_str::<TransformerConfig>(&extra).is_err());
    }

    #[test]
    fn rotary_tables_at_an_offset_are_rows_of_the_tables_from_zero() {
        let c = TransformerConfig::from_preset(&crate::model::catalogue::TINY);
        let dev = Device::Cpu;
        let (cos, sin) = rotary(&c, 0, 10, DType::F32, &dev).unwrap();
        let (cos7, sin7) = rotary(&c, 7, 3, DType::F32, &dev).unwrap();
        let rows = |t: &Tensor| t.narrow(0, 7, 3).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(rows(&cos), cos7.to_vec2::<f32>().unwrap());
        assert_eq!(rows(&sin), sin7.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn the_causal_mask_lets_new_tokens_see_the_cache_and_earlier_new_tokens() {
        let m = causal_mask(2, 2, DType::F32, &Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(m, vec![vec![0.0, 0.0, 0.0, inf], vec![0.0, 0.0, 0.0, 0.0]]);
    }

    #[test]
    fn argmax_takes_the_lowest_index_among_equals() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 1.0]), 1.0);
    }
}
