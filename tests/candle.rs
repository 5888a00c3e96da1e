//! Real execution on candle (CPU, f32, the tiny config): a model split into pipeline shards
//! computes what the unsplit model computes, cached decode matches stateless decode, every
//! way of losing a shard's cache ends in a re-prefill with unchanged output, and exported K/V
//! serves a new prompt that shares the prefix.
//!
//! Tolerance: split and unsplit runs do the same arithmetic in the same order, layer by
//! layer, so their logits agree to `TOL` = 1e-4 (max abs diff; in practice they are equal).
//! Cached decode and re-prefill reorder floating-point sums (one query row against a cache vs
//! a full causal matmul), so their logits differ by rounding: also within `TOL`, and greedy
//! tokens are compared exactly.

use candle_core::{DType, Device};
use meshsim::backend::{Activation, CandleBackend, ModelBackend, StepOutput};
use meshsim::exec::model::max_abs_diff;
use meshsim::exec::weights::{save_seeded, seeded_tensors};
use meshsim::exec::{ShardModel, TransformerConfig, WeightSource};
use meshsim::pipeline::shard::{CacheLimits, DecodeMode, Generation, Route, SessionId, Shard};
use meshsim::units::Nanos;
use std::ops::Range;

const TOL: f32 = 1e-4;
const SEED: u64 = 42;

fn backend(cfg: &TransformerConfig, layers: Range<usize>) -> CandleBackend {
    CandleBackend::load(
        cfg,
        layers,
        &WeightSource::Seeded(SEED),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap()
}

/// A route whose shards end at `cuts` and at the last layer.
fn route(cfg: &TransformerConfig, cuts: &[usize], limits: CacheLimits) -> Route {
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(cfg.layers);
    let shards = bounds
        .windows(2)
        .map(|w| Shard::new(Box::new(backend(cfg, w[0]..w[1])), limits))
        .collect();
    Route::new(shards).unwrap()
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 5) % 1024)
        .collect()
}

/// Logits of the newest position after running `tokens` through an unsplit model at once.
fn unsplit_logits(cfg: &TransformerConfig, tokens: &[u32]) -> Vec<f32> {
    let mut b = backend(cfg, 0..cfg.layers);
    let step = b
        .run(0..cfg.layers, Activation::tokens(tokens.to_vec()), 0, None)
        .unwrap();
    match step.output {
        StepOutput::Token { logits, .. } => logits.unwrap(),
        other => panic!("the unsplit model returned {other:?}"),
    }
}

fn generate(r: &mut Route, prompt: Vec<u32>, n: usize, mode: DecodeMode) -> Generation {
    r.generate(Nanos::ZERO, SessionId(1), prompt, n, mode)
        .unwrap()
}

#[test]
fn split_into_one_two_and_three_shards_gives_the_unsplit_logits_and_tokens() {
    for cfg in [
        TransformerConfig::from_preset(&meshsim::model::catalogue::TINY),
        TransformerConfig::from_preset(&meshsim::model::catalogue::TINY_QWEN),
    ] {
        let p = prompt(24, 1);
        let reference = unsplit_logits(&cfg, &p);
        let mut tokens = Vec::new();
        for cuts in [&[][..], &[2][..], &[1, 3][..]] {
            let mut r = route(&cfg, cuts, CacheLimits::default());
            let g = generate(&mut r, p.clone(), 1, DecodeMode::Cached);
            let d = max_abs_diff(&reference, g.last_logits.as_ref().unwrap());
            assert!(d <= TOL, "{} cut at {cuts:?}: max abs diff {d}", cfg.name);
            let g = generate(&mut r, p.clone(), 12, DecodeMode::Cached);
            tokens.push(g.output().to_vec());
        }
        assert_eq!(tokens[0], tokens[1], "{}", cfg.name);
        assert_eq!(tokens[0], tokens[2], "{}", cfg.name);
        // The untied generation is not degenerate, so comparing tokens means something. (With
        // random weights a tied LM head mostly repeats the input token: the embedding of the
        // newest token is the largest single part of its hidden state.)
        if !cfg.tied_embeddings {
            let mut distinct = tokens[0].clone();
            distinct.sort();
            distinct.dedup();
            assert!(distinct.len() > 4, "{}: {:?}", cfg.name, tokens[0]);
        }
    }
}

#[test]
fn cached_decode_gives_the_tokens_and_logits_of_stateless_decode() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let mut r = route(&cfg, &[2], CacheLimits::default());
    let cached = generate(&mut r, prompt(16, 2), 20, DecodeMode::Cached);
    let stateless = generate(&mut r, prompt(16, 2), 20, DecodeMode::Stateless);
    assert_eq!(cached.tokens, stateless.tokens);
    let d = max_abs_diff(
        cached.last_logits.as_ref().unwrap(),
        stateless.last_logits.as_ref().unwrap(),
    );
    assert!(d <= TOL, "max abs diff {d}");
}

#[test]
fn bytes_between_shards_per_decode_step_do_not_grow_with_the_sequence() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let mut r = route(&cfg, &[1, 3], CacheLimits::default());
    let cached = generate(&mut r, prompt(16, 3), 12, DecodeMode::Cached);
    // Two hops of one [1, 1, 256] f32 activation per decode step.
    let hidden_bytes = (cfg.hidden * 4) as u64;
    assert_eq!(cached.bytes_between_shards[0], 2 * 16 * hidden_bytes);
    assert!(
        cached.bytes_between_shards[1..]
            .iter()
            .all(|&b| b == 2 * hidden_bytes),
        "{:?}",
        cached.bytes_between_shards
    );
    // Stateless steps send the whole sequence: 16, 17, ... positions per hop.
    let stateless = generate(&mut r, prompt(16, 3), 12, DecodeMode::Stateless);
    for (i, &b) in stateless.bytes_between_shards.iter().enumerate() {
        assert_eq!(b, 2 * (16 + i as u64) * hidden_bytes);
    }
}

/// Generates 16 tokens, disturbing the route with `disturb` after the 6th; the output must
/// equal an undisturbed run's, with exactly one cache miss.
fn disturbed_run_matches_undisturbed(disturb: impl Fn(&mut Route) -> Nanos) {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let limits = CacheLimits {
        max_sessions: 2,
        ttl: Nanos::from_secs(600),
    };
    let mut calm = route(&cfg, &[1, 3], limits);
    let undisturbed = generate(&mut calm, prompt(12, 4), 16, DecodeMode::Cached);
    assert_eq!(undisturbed.cache_misses, 0);

    let mut r = route(&cfg, &[1, 3], limits);
    let s = SessionId(1);
    let mut g = r
        .start(Nanos::ZERO, s, prompt(12, 4), DecodeMode::Cached)
        .unwrap();
    let mut now = Nanos::ZERO;
    for i in 1..16 {
        if i == 6 {
            now = disturb(&mut r);
        }
        r.step(now, &mut g).unwrap();
    }
    assert_eq!(g.cache_misses, 1);
    assert_eq!(g.tokens, undisturbed.tokens);
}

#[test]
fn evicting_a_shards_cache_mid_generation_re_prefills_with_identical_output() {
    disturbed_run_matches_undisturbed(|r| {
        // Two other sessions pass through the middle shard, whose cache holds two.
        for other in [2, 3] {
            r.generate(
                Nanos::ZERO,
                SessionId(other),
                prompt(5, other as u32),
                1,
                DecodeMode::Cached,
            )
            .unwrap();
        }
        assert!(
            !r.shards()[1]
                .cache()
                .contains(Nanos::ZERO, &r.shards()[1].key(SessionId(1)))
        );
        Nanos::ZERO
    });
}

#[test]
fn a_cache_expired_by_ttl_mid_generation_re_prefills_with_identical_output() {
    disturbed_run_matches_undisturbed(|_| Nanos::from_secs(600));
}

#[test]
fn restarting_a_shard_mid_generation_re_prefills_with_identical_output() {
    disturbed_run_matches_undisturbed(|r| {
        r.shard_mut(2).restart();
        Nanos::ZERO
    });
}

#[test]
fn kv_exported_for_a_prefix_serves_a_new_prompt_that_shares_it() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let mut b = backend(&cfg, 0..cfg.layers);
    let layers = 0..cfg.layers;
    let first = prompt(20, 5);
    let step = b
        .run(layers.clone(), Activation::tokens(first.clone()), 0, None)
        .unwrap();
    // A store keeps the K/V of the first 12 tokens.
    let prefix = b.export(&step.cache, 0..12).unwrap();
    assert_eq!(prefix.tokens(), 12);
    assert_eq!(
        prefix.bytes(),
        (12 * cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * 4) as u64
    );

    // A new prompt shares those 12 tokens, then differs.
    let mut second = first[..12].to_vec();
    second.extend(prompt(9, 6));
    let reference = unsplit_logits(&cfg, &second);
    let cache = b.import(None, &prefix).unwrap();
    let step = b
        .run(
            layers,
            Activation::tokens(second[12..].to_vec()),
            12,
            Some(cache),
        )
        .unwrap();
    let StepOutput::Token { logits, .. } = step.output else {
        panic!("the unsplit model returns a token");
    };
    let d = max_abs_diff(&reference, &logits.unwrap());
    assert!(d <= TOL, "max abs diff {d}");
    assert_eq!(step.cache.tokens(), 21);
}

#[test]
fn exported_kv_of_a_shard_can_be_imported_in_pieces() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let mut b = backend(&cfg, 1..3);
    let x = {
        let mut head = backend(&cfg, 0..1);
        let step = head
            .run(0..1, Activation::tokens(prompt(10, 7)), 0, None)
            .unwrap();
        let StepOutput::Activation(x) = step.output else {
            panic!("the head returns an activation");
        };
        x
    };
    let full = b.run(1..3, x, 0, None).unwrap().cache;
    let a = b.export(&full, 0..4).unwrap();
    let c = b.export(&full, 4..10).unwrap();
    let joined = b.import(Some(b.import(None, &a).unwrap()), &c).unwrap();
    assert_eq!(joined.tokens(), 10);
    assert_eq!(joined.bytes(), full.bytes());
    // A piece that does not start where the cache ends is refused.
    assert!(b.import(None, &c).is_err());
}

#[test]
fn weights_saved_to_safetensors_load_to_identical_logits() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY_QWEN);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.safetensors");
    save_seeded(&cfg, SEED, &path).unwrap();
    let p = prompt(9, 8);
    let reference = unsplit_logits(&cfg, &p);
    // Two shards from the file, run by hand.
    let source = WeightSource::Safetensors(path);
    let mut head = CandleBackend::load(&cfg, 0..2, &source, DType::F32, &Device::Cpu).unwrap();
    let mut tail = CandleBackend::load(&cfg, 2..4, &source, DType::F32, &Device::Cpu).unwrap();
    let StepOutput::Activation(x) = head
        .run(0..2, Activation::tokens(p), 0, None)
        .unwrap()
        .output
    else {
        panic!("the head returns an activation");
    };
    let StepOutput::Token { logits, .. } = tail.run(2..4, x, 0, None).unwrap().output else {
        panic!("the tail returns a token");
    };
    assert_eq!(logits.unwrap(), reference);
}

#[test]
fn seeded_weights_do_not_depend_on_the_shard_range() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let all = seeded_tensors(&cfg, 0..4, SEED, &Device::Cpu).unwrap();
    let part = seeded_tensors(&cfg, 2..3, SEED, &Device::Cpu).unwrap();
    let name = "model.layers.2.mlp.up_proj.weight";
    let a: Vec<f32> = all[name].flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = part[name].flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a, b);
    assert!(!part.contains_key("model.embed_tokens.weight"));
    assert!(!part.contains_key("lm_head.weight"));
}

#[test]
fn shard_models_reject_wrong_inputs_and_caches() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let vb = meshsim::exec::weights::var_builder(
        &cfg,
        1..2,
        &WeightSource::Seeded(SEED),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let m = ShardModel::new(&cfg, 1..2, vb).unwrap();
    assert!(!m.is_head() && !m.is_tail());
    let mut cache = m.new_cache();
    let ids = [1u32, 2];
    assert!(
        m.forward(meshsim::exec::ShardInput::Tokens(&ids), 0, &mut cache)
            .is_err()
    );
    let mut b = backend(&cfg, 0..1);
    assert!(b.run(0..2, Activation::tokens(vec![1]), 0, None).is_err());
    assert!(b.run(0..1, Activation::tokens(vec![1]), 3, None).is_err());
}

#[test]
fn a_bf16_route_runs_and_holds_half_the_cache_bytes_of_f32() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let shard = |layers: Range<usize>, dtype| {
        let b = CandleBackend::load(
            &cfg,
            layers,
            &WeightSource::Seeded(SEED),
            dtype,
            &Device::Cpu,
        )
        .unwrap();
        Shard::new(Box::new(b), CacheLimits::default())
    };
    let mut bytes = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let mut r = Route::new(vec![shard(0..2, dtype), shard(2..4, dtype)]).unwrap();
        let g = generate(&mut r, prompt(8, 9), 3, DecodeMode::Cached);
        assert_eq!(g.tokens.len(), 11);
        // Decode steps send one [1, 1, hidden] activation in the route's dtype.
        assert_eq!(
            g.bytes_between_shards[2],
            (cfg.hidden * dtype.size_in_bytes()) as u64
        );
        let key = r.shards()[1].key(SessionId(1));
        let state = r.shard_mut(1).cache_mut().get(Nanos::ZERO, &key).unwrap();
        assert_eq!(state.tokens(), 10);
        bytes.push(state.bytes());
    }
    assert_eq!(bytes[0], 2 * bytes[1]);
}
