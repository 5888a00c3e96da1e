//! Transformer model configurations and their sizes.
//!
//! A [`ModelConfig`] holds what the cost model and the memory plan need: layer count, widths,
//! heads, vocabulary and bytes per element. From it follow the weight bytes and the KV bytes
//! per token (`2 x layers x kv_heads x head_dim x bytes_per_element`: one K and one V vector
//! per layer and KV head). Named models are defined once, in [`catalogue`]; the analytic
//! cost of a step is [`cost`], a measured one [`profile`].

pub mod batch_profile;
pub mod catalogue;
pub mod cost;
pub mod profile;

pub use catalogue::{Preset, preset};

use std::ops::Range;

/// The architecture numbers of a decoder-only transformer (Llama/Mistral/Qwen2 family).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub name: &'static str,
    pub layers: u64,
    pub hidden: u64,
    pub ffn: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub bytes_per_element: u64,
    /// Input embedding and LM head share one matrix.
    pub tied_embeddings: bool,
    /// Q, K and V projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// The longest sequence the model takes, in tokens (`max_position_embeddings`): a longer
    /// prompt is refused, as a serving engine refuses it.
    pub max_context: u64,
}

impl ModelConfig {
    /// The context of models without a limit of their own (test models: rotary positions
    /// extend to any length).
    pub const UNBOUNDED_CONTEXT: u64 = u64::MAX;

    /// Parameters of one transformer block: attention projections (Q, K, V, O, and the QKV
    /// bias if any), the SwiGLU MLP (gate, up, down) and two RMSNorm weight vectors.
    pub fn params_per_layer(&self) -> u64 {
        let q = self.hidden * self.heads * self.head_dim;
        let kv = 2 * self.hidden * self.kv_heads * self.head_dim;
        let o = self.heads * self.head_dim * self.hidden;
        let bias = if self.qkv_bias {
            (self.heads + 2 * self.kv_heads) * self.head_dim
        } else {
            0
        };
        let mlp = 3 * self.hidden * self.ffn;
        q + kv + o + bias + mlp + 2 * self.hidden
    }

    /// Parameters of the LM head (hidden x vocab).
    pub fn lm_head_params(&self) -> u64 {
        self.hidden * self.vocab
    }

    /// All parameters: blocks, final norm, embedding, and the LM head unless tied.
    pub fn total_params(&self) -> u64 {
        let embed = self.vocab * self.hidden;
        let head = if self.tied_embeddings {
            0
        } else {
            self.lm_head_params()
        };
        self.layers * self.params_per_layer() + self.hidden + embed + head
    }

    pub fn weight_bytes(&self) -> u64 {
        self.total_params() * self.bytes_per_element
    }

    /// KV-cache bytes of one token over all layers.
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element
    }
}

/// Splits `layers` into `shards` contiguous ranges, the first ones one layer longer when the
/// split is uneven.
pub fn split_layers(layers: usize, shards: usize) -> Result<Vec<Range<usize>>, String> {
    if shards == 0 || shards > layers {
        return Err(format!("cannot split {layers} layers into {shards} shards"));
    }
    let mut out = Vec::with_capacity(shards);
    let mut start = 0;
    for i in 0..shards {
        let len = layers / shards + usize::from(i < layers % shards);
        out.push(start..start + len);
        start += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_split_evenly_with_the_rest_in_front() {
        assert_eq!(split_layers(8, 2).unwrap(), vec![0..4, 4..8]);
        assert_eq!(split_layers(8, 3).unwrap(), vec![0..3, 3..6, 6..8]);
        assert!(split_layers(4, 0).is_err());
        assert!(split_layers(4, 5).is_err());
    }

    #[test]
    fn mistral_7b_has_128_kib_of_kv_per_token_and_7_24_b_parameters() {
        let m = crate::model::catalogue::MISTRAL_7B_V0_2.model;
        assert_eq!(m.kv_bytes_per_token(), 128 * 1024);
        // 32 x 218,112,000 + 4096 + 2 x 131,072,000 = 7,241,732,096 (the published 7.24 B).
        assert_eq!(m.params_per_layer(), 218_112_000);
        assert_eq!(m.total_params(), 7_241_732_096);
    }

    #[test]
    fn qwen2_5_0_5b_has_0_49_b_parameters_and_12_kib_of_kv_per_token() {
        let m = crate::model::catalogue::QWEN2_5_0_5B.model;
        assert_eq!(m.kv_bytes_per_token(), 12 * 1024);
        // Hugging Face reports 494,032,768 parameters.
        assert_eq!(m.total_params(), 494_032_768);
    }
}
