//! meshsim's decoder (`src/exec/`) against implementations meshsim did not write:
//! candle-transformers' `llama`, `mistral` and `qwen2` models. Both sides load the same
//! safetensors file (seeded weights with Hugging Face names, written by meshsim); the
//! references read it with their own loaders and a Hugging Face style `config.json`, so a
//! wrong weight name, a transposed matrix, a wrong rotary form or base, grouped-query
//! attention, RMSNorm, SwiGLU, the causal mask (also at an offset, with a K/V cache) or
//! Qwen2's QKV bias and tied LM head would show as different logits.
//!
//! What the references share with meshsim: candle's tensor kernels (matmul, softmax, the
//! `rope` and `rms_norm` ops). The model wiring, the rotary tables, the masks, the K/V caches
//! and the weight loading are theirs.
//!
//! Tolerance: the largest absolute difference of the newest position's logits, relative to
//! the largest absolute logit of the reference, is at most `TOL` = 1e-5 (f32 on the CPU). The
//! two sides compute the rotary tables in different precision (meshsim in f64, the references
//! in f32) and order some sums differently; measured: about 4e-7 (Llama and Mistral, logits
//! up to about 2) and 2.4e-7 (Qwen2, whose tied LM head gives logits up to about 130). Every
//! comparison also checks that the logits of another prompt are more than `1000 x TOL` away,
//! and `the_comparison_catches_a_wrong_rotary_base_and_a_missing_qkv_bias` shows that two
//! plausible bugs move the logits far beyond `TOL`.

use std::ops::Range;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{llama, mistral, qwen2};
use meshsim::exec::weights::{save_seeded, var_builder};
use meshsim::exec::{ShardInput, ShardModel, ShardOutput, TransformerConfig, WeightSource};
use meshsim::model::catalogue::{TINY, TINY_QWEN};

const TOL: f32 = 1e-5;
const SEED: u64 = 17;
/// Rows of the references' rotary tables (they precompute them up to this position).
const MAX_POSITIONS: usize = 256;

/// Which implementation of candle-transformers to compare with.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Llama,
    Mistral,
    Qwen2,
}

/// The `config.json` that Hugging Face would ship with `cfg` (the keys the references read).
fn hf_config(cfg: &TransformerConfig, kind: Kind) -> serde_json::Value {
    let mut c = serde_json::json!({
        "hidden_act": "silu",
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "num_hidden_layers": cfg.layers,
        "vocab_size": cfg.vocab,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": cfg.tied_embeddings,
    });
    let extra = match kind {
        Kind::Llama => serde_json::json!({ "model_type": "llama" }),
        Kind::Mistral => serde_json::json!({
            "model_type": "mistral", "head_dim": cfg.head_dim, "sliding_window": null
        }),
        Kind::Qwen2 => serde_json::json!({
            "model_type": "qwen2", "sliding_window": 32768, "max_window_layers": cfg.layers,
            "use_sliding_window": false
        }),
    };
    c.as_object_mut()
        .unwrap() // built as an object above
        .extend(extra.as_object().unwrap().clone()); // likewise
    c
}

/// A candle-transformers model loaded from `weights`, with its own K/V cache.
enum Reference {
    Llama(llama::Llama, llama::Cache, llama::Config),
    Mistral(mistral::Model),
    Qwen2(qwen2::ModelForCausalLM),
}

impl Reference {
    fn load(cfg: &TransformerConfig, kind: Kind, weights: &Path) -> Reference {
        let dev = Device::Cpu;
        let bytes = std::fs::read(weights).unwrap();
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &dev).unwrap();
        let json = hf_config(cfg, kind);
        match kind {
            Kind::Llama => {
                assert_eq!(
                    cfg.heads * cfg.head_dim,
                    cfg.hidden,
                    "llama derives head_dim"
                );
                let c: llama::LlamaConfig = serde_json::from_value(json).unwrap();
                let c = c.into_config(false);
                let cache = llama::Cache::new(true, DType::F32, &c, &dev).unwrap();
                Reference::Llama(llama::Llama::load(vb, &c).unwrap(), cache, c)
            }
            Kind::Mistral => {
                let c: mistral::Config = serde_json::from_value(json).unwrap();
                Reference::Mistral(mistral::Model::new(&c, vb).unwrap())
            }
            Kind::Qwen2 => {
                let c: qwen2::Config = serde_json::from_value(json).unwrap();
                Reference::Qwen2(qwen2::ModelForCausalLM::new(&c, vb).unwrap())
            }
        }
    }

    /// Forgets every cached token.
    fn reset(&mut self) {
        match self {
            Reference::Llama(_, cache, c) => {
                *cache = llama::Cache::new(true, DType::F32, c, &Device::Cpu).unwrap();
            }
            Reference::Mistral(m) => m.clear_kv_cache(),
            Reference::Qwen2(m) => m.clear_kv_cache(),
        }
    }

    /// The logits of the newest position after `tokens` at positions `offset..`.
    fn step(&mut self, tokens: &[u32], offset: usize) -> Vec<f32> {
        let ids = Tensor::new(tokens, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = match self {
            Reference::Llama(m, cache, _) => m.forward(&ids, offset, cache),
            Reference::Mistral(m) => m.forward(&ids, offset),
            Reference::Qwen2(m) => m.forward(&ids, offset),
        };
        logits.unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}

/// meshsim's decoder as a route of shards ending at `cuts` and at the last layer, loaded from
/// `weights`, each shard with its K/V cache.
struct Route {
    shards: Vec<(ShardModel, meshsim::exec::KvCache)>,
}

impl Route {
    fn load(cfg: &TransformerConfig, cuts: &[usize], weights: &Path) -> Route {
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(cfg.layers);
        let source = WeightSource::Safetensors(weights.to_path_buf());
        let shards = bounds
            .windows(2)
            .map(|w| {
                let layers: Range<usize> = w[0]..w[1];
                let vb =
                    var_builder(cfg, layers.clone(), &source, DType::F32, &Device::Cpu).unwrap();
                let m = ShardModel::new(cfg, layers, vb).unwrap();
                let cache = m.new_cache();
                (m, cache)
            })
            .collect();
        Route { shards }
    }

    fn step(&mut self, tokens: &[u32], offset: usize) -> Vec<f32> {
        let mut hidden: Option<Tensor> = None;
        for (m, cache) in &mut self.shards {
            let input = match &hidden {
                None => ShardInput::Tokens(tokens),
                Some(h) => ShardInput::Hidden(h),
            };
            match m.forward(input, offset, cache).unwrap() {
                ShardOutput::Hidden(h) => hidden = Some(h),
                ShardOutput::Logits(l) => return l.to_vec1().unwrap(),
            }
        }
        panic!("the last shard returns logits");
    }
}

/// The largest absolute difference of `ours` and `theirs`, relative to the largest absolute
/// value of `theirs`.
fn rel_diff(ours: &[f32], theirs: &[f32]) -> f32 {
    let scale = theirs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "the reference's logits are all zero");
    meshsim::exec::model::max_abs_diff(ours, theirs) / scale
}

/// Token ids in `0..vocab`, different for each `salt`.
fn prompt(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 389 + salt * 97 + 13) % vocab as u32)
        .collect()
}

/// How a prompt is fed: chunks of these lengths, each after the previous ones (a prefill; a
/// prefill, a chunk at an offset, then single-token decode steps with the K/V cache).
const SCHEDULES: [&[usize]; 3] = [&[1], &[23], &[9, 6, 1, 1, 1, 1]];

/// Feeds three prompts by every schedule through meshsim's unsplit model and split routes and
/// through the reference, and checks that the logits of every step agree within `TOL`.
/// Returns the largest relative difference seen.
fn compare(cfg: &TransformerConfig, kind: Kind) -> f32 {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    save_seeded(cfg, SEED, &weights).unwrap();
    let mut reference = Reference::load(cfg, kind, &weights);
    let mut worst = 0.0f32;
    for schedule in SCHEDULES {
        let total: usize = schedule.iter().sum();
        // The logits depend on the prompt far beyond the tolerance: agreement is no accident
        // of flat logits.
        reference.reset();
        let a = reference.step(&prompt(total, 0, cfg.vocab), 0);
        reference.reset();
        let b = reference.step(&prompt(total, 99, cfg.vocab), 0);
        assert!(
            rel_diff(&a, &b) > 1000.0 * TOL,
            "the logits of two prompts of {total} tokens are too close to tell a difference"
        );
        for cuts in [&[][..], &[2][..], &[1, 3][..]] {
            for salt in 0..3 {
                let p = prompt(total, salt, cfg.vocab);
                let mut route = Route::load(cfg, cuts, &weights);
                reference.reset();
                let mut offset = 0;
                for &n in schedule {
                    let chunk = &p[offset..offset + n];
                    let diff = rel_diff(&route.step(chunk, offset), &reference.step(chunk, offset));
                    assert!(
                        diff <= TOL,
                        "{} against candle-transformers' {kind:?}: logits differ by {diff} \
                         (relative; > {TOL}) with shards cut at {cuts:?}, schedule {schedule:?}, \
                         tokens {offset}..{}",
                        cfg.name,
                        offset + n
                    );
                    worst = worst.max(diff);
                    offset += n;
                }
            }
        }
    }
    worst
}

#[test]
fn the_llama_style_decoder_gives_the_logits_of_candle_transformers_llama_and_mistral() {
    let tiny = TransformerConfig::from_preset(&TINY);
    // Multi-query attention too: one K/V head serving all four query heads.
    let mqa = TransformerConfig {
        name: "tiny-mqa".into(),
        kv_heads: 1,
        ..tiny.clone()
    };
    for cfg in [&tiny, &mqa] {
        for kind in [Kind::Llama, Kind::Mistral] {
            let worst = compare(cfg, kind);
            eprintln!(
                "{} against {kind:?}: largest relative difference {worst:e}",
                cfg.name
            );
        }
    }
}

#[test]
fn the_qwen2_style_decoder_gives_the_logits_of_candle_transformers_qwen2() {
    let cfg = TransformerConfig::from_preset(&TINY_QWEN);
    assert!(cfg.qkv_bias && cfg.tied_embeddings);
    let worst = compare(&cfg, Kind::Qwen2);
    eprintln!(
        "{} against Qwen2: largest relative difference {worst:e}",
        cfg.name
    );
}

#[test]
fn the_comparison_catches_a_wrong_rotary_base_and_a_missing_qkv_bias() {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt(12, 5, TINY.model.vocab as usize);
    let cases = [
        (TINY, Kind::Mistral, "rope_theta 1e6 instead of 1e4"),
        (TINY_QWEN, Kind::Qwen2, "no QKV bias"),
    ];
    for (preset, kind, bug) in cases {
        let cfg = TransformerConfig::from_preset(&preset);
        let weights = dir.path().join(format!("{}.safetensors", cfg.name));
        save_seeded(&cfg, SEED, &weights).unwrap();
        let wrong = match kind {
            Kind::Qwen2 => TransformerConfig {
                qkv_bias: false,
                ..cfg.clone()
            },
            _ => TransformerConfig {
                rope_theta: 1e6,
                ..cfg.clone()
            },
        };
        let theirs = Reference::load(&cfg, kind, &weights).step(&p, 0);
        let right = Route::load(&cfg, &[], &weights).step(&p, 0);
        let ours = Route::load(&wrong, &[], &weights).step(&p, 0);
        assert!(rel_diff(&right, &theirs) <= TOL);
        let diff = rel_diff(&ours, &theirs);
        assert!(
            diff > 100.0 * TOL,
            "{bug}: logits moved by only {diff} (relative)"
        );
    }
}
