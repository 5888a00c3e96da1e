//! The live host (ractor shard actors, candle tensors, wall clock) generates exactly what the
//! in-process route generates, survives a shard actor being stopped and replaced mid-generation
//! (cache miss, re-prefill, same tokens), and its CLI writes one CSV row per request.
//!
//! Tests wait on explicit completion only: every shard call returns through a reply port, and
//! a restart waits until the old actor has stopped. Nothing polls the wall clock.

use std::ops::Range;
use std::process::Command;

use candle_core::{DType, Device};
use meshsim::backend::CandleBackend;
use meshsim::exec::{TransformerConfig, WeightSource};
use meshsim::live::{LiveHost, seeded_prompt, split_layers};
use meshsim::shard::{CacheLimits, DecodeMode, Route, SessionId, Shard};
use meshsim::units::Nanos;

const SEED: u64 = 42;

fn route(cfg: &TransformerConfig, layers: &[Range<usize>]) -> Route {
    let shards = layers
        .iter()
        .map(|l| {
            let b = CandleBackend::load(
                cfg,
                l.clone(),
                &WeightSource::Seeded(SEED),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
            Shard::new(Box::new(b), CacheLimits::default())
        })
        .collect();
    Route::new(shards).unwrap()
}

async fn host(cfg: &TransformerConfig, layers: &[Range<usize>]) -> LiveHost {
    LiveHost::spawn(
        cfg,
        layers,
        WeightSource::Seeded(SEED),
        CacheLimits::default(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tokens_equal_the_in_process_route_on_one_and_two_shards() {
    let cfg = TransformerConfig::tiny();
    let prompt = seeded_prompt(SEED, 0, 20, cfg.vocab);
    for shards in [1, 2] {
        let layers = split_layers(cfg.layers, shards).unwrap();
        let mut r = route(&cfg, &layers);
        let h = host(&cfg, &layers).await;
        for mode in [DecodeMode::Cached, DecodeMode::Stateless] {
            let want = r
                .generate(Nanos::ZERO, SessionId(1), prompt.clone(), 12, mode)
                .unwrap();
            let got = h
                .generate(SessionId(1), prompt.clone(), 12, mode)
                .await
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "{shards} shards, {mode:?}");
            assert_eq!(got.bytes_between_shards, want.bytes_between_shards);
            assert_eq!(got.cache_misses, 0);
        }
        h.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_shard_actor_causes_a_re_prefill_and_the_same_tokens() {
    let cfg = TransformerConfig::tiny();
    let layers = split_layers(cfg.layers, 2).unwrap();
    let prompt = seeded_prompt(SEED, 1, 16, cfg.vocab);
    let mut r = route(&cfg, &layers);
    let want = r
        .generate(
            Nanos::ZERO,
            SessionId(9),
            prompt.clone(),
            14,
            DecodeMode::Cached,
        )
        .unwrap();

    for victim in [0, 1] {
        let mut h = host(&cfg, &layers).await;
        let s = SessionId(9);
        let mut g = h
            .start(s, prompt.clone(), DecodeMode::Cached)
            .await
            .unwrap();
        for _ in 0..5 {
            h.step(&mut g).await.unwrap();
        }
        // Kill the actor and spawn a fresh one with empty caches.
        h.restart_shard(victim).await.unwrap();
        assert_eq!(h.shards()[victim].stats().await.unwrap().prefills, 0);
        for _ in 0..8 {
            h.step(&mut g).await.unwrap();
        }
        assert_eq!(g.tokens, want.tokens, "shard {victim} restarted");
        assert_eq!(g.cache_misses, 1, "shard {victim} restarted");
        let stats = h.shards()[victim].stats().await.unwrap();
        // The new actor answered one miss, took the re-prefill, then decoded the rest.
        assert_eq!(stats.prefills, 1);
        assert_eq!(stats.cache_misses, 1);
        h.shutdown().await.unwrap();
    }
}

#[test]
fn the_cli_writes_one_row_per_request_in_both_csvs() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args([
            "live",
            "--model",
            "tiny",
            "--shards",
            "2",
            "--requests",
            "3",
            "--prompt-tokens",
            "12",
            "--output-tokens",
            "4",
            "--seed",
            "7",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = std::fs::read_to_string(dir.path().join("requests.csv")).unwrap();
    let lines: Vec<&str> = requests.lines().collect();
    assert_eq!(lines.len(), 4, "{requests}");
    assert!(lines[0].starts_with("policy,request,arrival_ns"));
    for l in &lines[1..] {
        assert!(l.starts_with("live-cached,"), "{l}");
        assert!(l.contains(",ok,12,4,"), "{l}");
    }
    let summary = std::fs::read_to_string(dir.path().join("summary.csv")).unwrap();
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines.len(), 2, "{summary}");
    assert!(lines[1].starts_with("live-cached,3,3,"), "{summary}");
}
