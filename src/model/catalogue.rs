//! The model catalogue: every named model meshsim knows, defined once with the source of its
//! numbers. Simulation configs ([`ModelConfig`]) are the presets themselves; candle configs
//! (`exec::TransformerConfig::from_preset`) derive from them. Scenario files, profile files
//! and `meshsim profile --model` all look names up with [`preset`].

use super::ModelConfig;

/// One named model: its architecture (in bf16, as served) and what the candle transformer
/// needs beyond it.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    /// The architecture numbers, with 2 bytes per element (bf16/fp16).
    pub model: ModelConfig,
    /// Rotary embedding base (`rope_theta` of the Hugging Face config).
    pub rope_theta: f64,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub rms_eps: f64,
    /// Where the numbers come from.
    pub source: &'static str,
}

impl Preset {
    pub fn name(&self) -> &'static str {
        self.model.name
    }
}

/// Mistral-7B-Instruct-v0.2: 7.24 B parameters; 128 KiB of KV per token.
pub const MISTRAL_7B_V0_2: Preset = Preset {
    model: ModelConfig {
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
    },
    rope_theta: 1e6,
    rms_eps: 1e-5,
    source: "Hugging Face mistralai/Mistral-7B-Instruct-v0.2 config.json (max_position_embeddings \
             32768; v0.2 has no sliding window, so full causal attention is right)",
};

/// Qwen2.5-0.5B(-Instruct): 0.49 B parameters; 12 KiB of KV per token.
pub const QWEN2_5_0_5B: Preset = Preset {
    model: ModelConfig {
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
    },
    rope_theta: 1e6,
    rms_eps: 1e-6,
    source: "Hugging Face Qwen/Qwen2.5-0.5B-Instruct config.json (max_position_embeddings 32768)",
};

/// A tiny model for tests: 4 layers, hidden 256, 4 heads, 2 KV heads, vocab 1024.
pub const TINY: Preset = Preset {
    model: ModelConfig {
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
        max_context: ModelConfig::UNBOUNDED_CONTEXT,
    },
    rope_theta: 10_000.0,
    rms_eps: 1e-5,
    source: "meshsim's own test model, with Llama's defaults for rope_theta and rms_norm_eps",
};

/// A tiny Qwen2-style model for tests: [`TINY`] with QKV bias and tied embeddings.
pub const TINY_QWEN: Preset = Preset {
    model: ModelConfig {
        name: "tiny-qwen",
        tied_embeddings: true,
        qkv_bias: true,
        ..TINY.model
    },
    rope_theta: 1e6,
    rms_eps: 1e-6,
    source: "meshsim's own test model, with Qwen2's rope_theta and rms_norm_eps",
};

/// A small model for benchmarks on a CPU: 8 layers, hidden 512, 8 heads, 2 KV heads,
/// intermediate 1536, vocab 4096 (about 35 M parameters).
pub const SMALL: Preset = Preset {
    model: ModelConfig {
        name: "small",
        layers: 8,
        hidden: 512,
        ffn: 1536,
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        vocab: 4096,
        bytes_per_element: 2,
        tied_embeddings: false,
        qkv_bias: false,
        max_context: ModelConfig::UNBOUNDED_CONTEXT,
    },
    rope_theta: 10_000.0,
    rms_eps: 1e-5,
    source: "meshsim's own CPU benchmark model, with Llama's defaults",
};

/// [`TINY`] with Mistral's vocabulary (32,000 ids) and a 2,048-token context: the model of
/// live serving runs on real text through the Mistral tokenizer, small enough for a CPU.
pub const TINY_32K: Preset = Preset {
    model: ModelConfig {
        name: "tiny-32k",
        vocab: 32000,
        max_context: 2048,
        ..TINY.model
    },
    rope_theta: 10_000.0,
    rms_eps: 1e-5,
    source: "meshsim's own test model with Mistral-7B's vocabulary size (its tokenizer's ids)",
};

/// Every preset, in the order error messages list them.
pub const PRESETS: [&Preset; 6] = [
    &TINY,
    &TINY_QWEN,
    &TINY_32K,
    &SMALL,
    &MISTRAL_7B_V0_2,
    &QWEN2_5_0_5B,
];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.into_iter().find(|p| p.name() == name)
}

/// The names of all presets, comma-separated (for error messages).
pub fn names() -> String {
    PRESETS.map(Preset::name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_found_by_its_name_and_names_are_unique() {
        for p in PRESETS {
            assert_eq!(preset(p.name()), Some(p));
        }
        assert_eq!(preset("gpt-5"), None);
        assert_eq!(
            names(),
            "tiny, tiny-qwen, tiny-32k, small, mistral-7b-instruct-v0.2, qwen2.5-0.5b"
        );
    }
}
