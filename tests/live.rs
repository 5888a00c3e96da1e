//! The live host runs the pipeline actors (the same `Head` and `ShardNode` code as the
//! simulator) on ractor with candle shards, and generates exactly what the in-process
//! candle `Route` generates: for 1 and 3 shards, Llama- and Qwen-style models, seeded prompts
//! and prompts given as text through the real Mistral tokenizer. (Two shards, concurrency,
//! restarts and the CLI are in `tests/pipeline.rs`.)
//!
//! Tests wait on explicit completion only: the live host ends a run when every actor says it
//! is done; nothing polls the wall clock.

mod common;

use std::ops::Range;
use std::path::Path;

use candle_core::{DType, Device};
use meshsim::backend::CandleBackend;
use meshsim::exec::{TransformerConfig, WeightSource};
use meshsim::model::split_layers;
use meshsim::pipeline::build::trace;
use meshsim::pipeline::live::live;
use meshsim::pipeline::scenario::PipelineScenario;
use meshsim::pipeline::shard::{CacheLimits, DecodeMode, Route, SessionId, Shard};
use meshsim::units::Nanos;

fn route(cfg: &TransformerConfig, layers: &[Range<usize>], seed: u64) -> Route {
    let shards = layers
        .iter()
        .map(|l| {
            let b = CandleBackend::load(
                cfg,
                l.clone(),
                &WeightSource::Seeded(seed),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
            Shard::new(Box::new(b), CacheLimits::default())
        })
        .collect();
    Route::new(shards).unwrap()
}

fn scenario(model: &str, shards: usize, workload: &str) -> PipelineScenario {
    let text = format!(
        r#"
name = "live_test"
seed = 5
policies = ["cached", "stateless"]
mode = "live"
[pipeline]
model = "{model}"
shards = {shards}
max_active_sessions = 2
cost = "analytic"
[pipeline.gpu]
name = "cpu"
memory_gib = 1.0
memory_bandwidth_gb_per_s = 10.0
peak_tflops = 0.1
compute_efficiency = 1.0
memory_efficiency = 1.0
[pipeline.link]
bandwidth_gb_per_s = 100.0
latency_us = 0.0
[workload]
requests = 3
output_tokens = 9
arrival_rate_per_s = 200.0
{workload}
"#
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    PipelineScenario::parse("live_test.toml", "live_test", &dir, &text).unwrap()
}

/// Runs `s` live in both modes and checks every request against the in-process route.
async fn live_equals_route(s: &PipelineScenario) {
    assert!(s.live);
    let cfg = s.model.clone();
    let mut r = route(&cfg, &s.layers, s.seed);
    let requests = trace(s);
    for mode in [DecodeMode::Cached, DecodeMode::Stateless] {
        let run = live(s, mode).await.unwrap();
        assert_eq!(run.report.outputs.len(), requests.len(), "{mode:?}");
        for (id, got) in &run.report.outputs {
            let req = &requests[*id as usize];
            let want = r
                .generate(
                    Nanos::ZERO,
                    SessionId(1000 + *id as u64),
                    req.prompt.clone(),
                    9,
                    mode,
                )
                .unwrap();
            assert_eq!(got.as_slice(), want.output(), "request {id}, {mode:?}");
        }
        for rec in &run.report.records {
            assert!(rec.completed(), "{rec:?}");
            assert_eq!(rec.output_tokens, 9);
            assert_eq!(
                rec.prompt_tokens as usize,
                requests[rec.id as usize].prompt.len()
            );
        }
        assert_eq!(run.summary.preemptions, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tokens_equal_the_route_on_one_and_three_shards() {
    for shards in [1, 3] {
        let s = scenario("tiny", shards, "prompt_tokens = 14");
        assert_eq!(s.layers, split_layers(4, shards).unwrap());
        live_equals_route(&s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tokens_equal_the_route_for_a_qwen_style_model() {
    live_equals_route(&scenario("tiny-qwen", 2, "prompt_tokens = 10")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_go_through_the_tokenizer() {
    // Fails, saying what to do, when ../shared/datasets is missing.
    let tokenizer = common::shared_datasets().join("tokenizers/mistral-v1.json");
    let w = format!(
        "prompts = [\"What does a KV cache hold?\", \"Pipeline parallelism splits layers.\"]\ntokenizer = {:?}",
        tokenizer.display().to_string()
    );
    let s = scenario("tiny", 2, &w);
    let prompts = s.workload.prompts.clone().unwrap();
    // The real tokenizer: a start-of-text-free encoding of 8 or so pieces, ids below the
    // tiny model's vocabulary after the modulo.
    assert_eq!(prompts.len(), 2);
    assert!(
        prompts.iter().all(|p| p.len() >= 6 && p.len() <= 16),
        "{prompts:?}"
    );
    assert!(
        prompts
            .iter()
            .flatten()
            .all(|&t| (t as usize) < s.model.vocab)
    );
    assert_ne!(prompts[0], prompts[1]);
    // Request i uses text i mod 2.
    let t = trace(&s);
    assert_eq!(t[2].prompt, prompts[0]);
    live_equals_route(&s).await;
}
