//! Transformer model configurations and their sizes.
//!
//! A [`ModelConfig`] holds what the cost model and the memory plan need: layer count, widths,
//! heads, vocabulary and bytes per element. From it follow the weight bytes and the KV bytes
//! per token (`2 x layers x kv_heads x head_dim x bytes_per_element`: one K and one V vector
//! per layer and KV head).

pub mod cost;

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
    /// Mistral-7B-Instruct-v0.2, from its Hugging Face `config.json`: 32 layers, hidden 4096,
    /// intermediate 14336, 32 attention heads, 8 KV heads, head dim 128, vocab 32000, bf16/fp16,
    /// untied LM head, `max_position_embeddings` 32768. 7.24 B parameters; 128 KiB of KV per
    /// token.
    pub fn mistral_7b_instruct_v0_2() -> ModelConfig {
        ModelConfig {
            name: "mistral-7b-instruct-v0.2",
            layers: 32,
            hidden: 4096,
            ffn: 14336,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            vocab: 32000,
            bytes_per_element: 2,
            tied_embeddings: false,
            qkv_bias: false,
            max_context: 32768,
        }
    }

    /// Qwen2.5-0.5B(-Instruct), from its Hugging Face `config.json`: 24 layers, hidden 896,
    /// intermediate 4864, 14 heads, 2 KV heads, head dim 64, vocab 151936, bf16, tied
    /// embeddings, QKV bias, `max_position_embeddings` 32768. 0.49 B parameters; 12 KiB of KV
    /// per token.
    pub fn qwen2_5_0_5b() -> ModelConfig {
        ModelConfig {
            name: "qwen2.5-0.5b",
            layers: 24,
            hidden: 896,
            ffn: 4864,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            vocab: 151936,
            bytes_per_element: 2,
            tied_embeddings: true,
            qkv_bias: true,
            max_context: 32768,
        }
    }

    /// The context of models without a limit of their own (test models: rotary positions
    /// extend to any length).
    pub const UNBOUNDED_CONTEXT: u64 = u64::MAX;

    /// A tiny model for tests: 4 layers, hidden 256, 4 heads, 2 KV heads, vocab 1024, no
    /// context limit.
    pub fn tiny() -> ModelConfig {
        ModelConfig {
            name: "tiny",
            layers: 4,
            hidden: 256,
            ffn: 512,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            vocab: 1024,
            bytes_per_element: 2,
            tied_embeddings: false,
            qkv_bias: false,
            max_context: Self::UNBOUNDED_CONTEXT,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistral_7b_has_128_kib_of_kv_per_token_and_7_24_b_parameters() {
        let m = ModelConfig::mistral_7b_instruct_v0_2();
        assert_eq!(m.kv_bytes_per_token(), 128 * 1024);
        // 32 x 218,112,000 + 4096 + 2 x 131,072,000 = 7,241,732,096 (the published 7.24 B).
        assert_eq!(m.params_per_layer(), 218_112_000);
        assert_eq!(m.total_params(), 7_241_732_096);
    }

    #[test]
    fn qwen2_5_0_5b_has_0_49_b_parameters_and_12_kib_of_kv_per_token() {
        let m = ModelConfig::qwen2_5_0_5b();
        assert_eq!(m.kv_bytes_per_token(), 12 * 1024);
        // Hugging Face reports 494,032,768 parameters.
        assert_eq!(m.total_params(), 494_032_768);
    }
}
