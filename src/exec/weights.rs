//! Weights for the candle transformer: from a safetensors file with Hugging Face names, or
//! generated deterministically from a seed.
//!
//! Generated weights never touch candle's random generator (which cannot be seeded on the
//! CPU): each tensor is filled from its own [`Stream`] of the seed, whose stream number is the
//! [`block_hash`] of the tensor's name, so a tensor's values do not depend on which other
//! tensors are generated (a shard of layers 2..4 gets the same layer 2 as the whole model).
//! Matrices are uniform in `[-1, 1) / sqrt(fan_in)` (fan-in: the input width), which keeps
//! activations of order one through the layers; biases are uniform in `[-0.1, 0.1)`, norm
//! weights are one plus a uniform in `[-0.1, 0.1)`.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use super::ExecError;
use super::model::TransformerConfig;
use crate::hash::block_hash;
use crate::rng::Stream;

/// The name and shape (`[out, in]` for matrices) of every tensor that layers `layers` need,
/// including the embedding for the head and the final norm and LM head for the tail.
pub fn tensor_shapes(cfg: &TransformerConfig, layers: Range<usize>) -> Vec<(String, Vec<usize>)> {
    let (h, f, d) = (cfg.hidden, cfg.ffn, cfg.head_dim);
    let (q, kv) = (cfg.heads * d, cfg.kv_heads * d);
    let mut out = Vec::new();
    if layers.start == 0 || (cfg.tied_embeddings && layers.end == cfg.layers) {
        out.push(("model.embed_tokens.weight".to_string(), vec![cfg.vocab, h]));
    }
    for i in layers.clone() {
        let p = format!("model.layers.{i}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        if cfg.qkv_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![f, h]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![f, h]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, f]));
    }
    if layers.end == cfg.layers {
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !cfg.tied_embeddings {
            out.push(("lm_head.weight".to_string(), vec![cfg.vocab, h]));
        }
    }
    out
}

/// The values of tensor `name` of shape `shape` for `seed` (see the module doc).
fn generate(seed: u64, name: &str, shape: &[usize]) -> Vec<f32> {
    let bytes: Vec<u32> = name.bytes().map(u32::from).collect();
    let mut rng = Stream::new(seed, block_hash(0, &bytes));
    let n: usize = shape.iter().product();
    let mut uniform = move || (2.0 * rng.uniform() - 1.0) as f32;
    if name.ends_with("norm.weight") {
        (0..n).map(|_| 1.0 + 0.1 * uniform()).collect()
    } else if name.ends_with(".bias") {
        (0..n).map(|_| 0.1 * uniform()).collect()
    } else if name == "model.embed_tokens.weight" {
        (0..n).map(|_| uniform()).collect()
    } else {
        let scale = 1.0 / (shape[1] as f32).sqrt();
        (0..n).map(|_| scale * uniform()).collect()
    }
}

/// Deterministic weights of layers `layers` of `cfg` (f32 on `device`), by Hugging Face name.
pub fn seeded_tensors(
    cfg: &TransformerConfig,
    layers: Range<usize>,
    seed: u64,
    device: &Device,
) -> Result<HashMap<String, Tensor>, ExecError> {
    tensor_shapes(cfg, layers)
        .into_iter()
        .map(|(name, shape)| {
            let t = Tensor::from_vec(generate(seed, &name, &shape), shape, device)?;
            Ok((name, t))
        })
        .collect()
}

/// Where a shard's weights come from.
#[derive(Clone, Debug, PartialEq)]
pub enum WeightSource {
    /// Generated from this seed ([`seeded_tensors`]).
    Seeded(u64),
    /// Read from a safetensors file with Hugging Face tensor names.
    Safetensors(std::path::PathBuf),
}

/// A [`VarBuilder`] over the weights of layers `layers` from `source`, in `dtype`.
pub fn var_builder(
    cfg: &TransformerConfig,
    layers: Range<usize>,
    source: &WeightSource,
    dtype: DType,
    device: &Device,
) -> Result<VarBuilder<'static>, ExecError> {
    let tensors = match source {
        WeightSource::Seeded(seed) => seeded_tensors(cfg, layers, *seed, device)?,
        WeightSource::Safetensors(path) => candle_core::safetensors::load(path, device)?,
    };
    Ok(VarBuilder::from_tensors(tensors, dtype, device))
}

/// Writes the seeded weights of the whole model to a safetensors file (for tests and demos).
pub fn save_seeded(cfg: &TransformerConfig, seed: u64, path: &Path) -> Result<(), ExecError> {
    let tensors = seeded_tensors(cfg, 0..cfg.layers, seed, &Device::Cpu)?;
    candle_core::safetensors::save(&tensors, path)?;
    Ok(())
}
