//! Tokens per second of real execution on candle (CPU f32, or CUDA with `--features cuda`):
//! a 2-shard route of the `small` config (8 layers, hidden 512), greedy generation of
//! 16..512 tokens after a 64-token prompt, cached decode against stateless decode (which
//! recomputes the whole sequence for every token), plus prefill and decode rates.
//!
//! `cargo bench --bench candle_tps` (set `CANDLE_TPS_MAX=128` for a quicker run, and
//! `CANDLE_TPS_STATELESS_MAX` to cap the quadratic stateless runs, 256 by default).
//! Wall-clock figures go to the console only.

use candle_core::DType;
use meshsim::backend::CandleBackend;
use meshsim::exec::{TransformerConfig, WeightSource, default_device};
use meshsim::pipeline::shard::{CacheLimits, DecodeMode, Route, SessionId, Shard};
use meshsim::units::Nanos;
use std::time::Instant;

const PROMPT: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn route(cfg: &TransformerConfig) -> Route {
    let device = default_device();
    let half = cfg.layers / 2;
    let shards = [0..half, half..cfg.layers]
        .into_iter()
        .map(|layers| {
            let b = CandleBackend::load(cfg, layers, &WeightSource::Seeded(1), DType::F32, &device)
                .expect("seeded weights load");
            Shard::new(Box::new(b), CacheLimits::default())
        })
        .collect();
    Route::new(shards).expect("two shards cover the model")
}

/// Seconds for the prefill and for the remaining `n - 1` tokens.
fn run(r: &mut Route, session: u64, n: usize, mode: DecodeMode) -> (f64, f64) {
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| (i * 31 + 7) % 4096).collect();
    let t0 = Instant::now();
    let mut g = r
        .start(Nanos::ZERO, SessionId(session), prompt, mode)
        .expect("prefill");
    let prefill = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 1..n {
        r.step(Nanos::ZERO, &mut g).expect("decode step");
    }
    (prefill, t1.elapsed().as_secs_f64())
}

fn main() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::SMALL);
    let max = env_usize("CANDLE_TPS_MAX", 512);
    let stateless_max = env_usize("CANDLE_TPS_STATELESS_MAX", 256);
    let device = default_device();
    println!(
        "candle_tps: {} ({} layers, hidden {}), 2 shards, {:?}, f32, prompt {PROMPT} tokens",
        cfg.name, cfg.layers, cfg.hidden, device
    );
    let mut r = route(&cfg);
    // Warm-up (allocator, thread pool).
    run(&mut r, 0, 4, DecodeMode::Cached);
    println!(
        "{:>7} {:>12} {:>12} {:>9} {:>14} {:>14}",
        "output", "cached TPS", "stateless", "speed-up", "prefill tok/s", "decode tok/s"
    );
    let mut session = 1;
    for n in [16, 64, 128, 256, 512].into_iter().filter(|&n| n <= max) {
        session += 1;
        let (prefill, decode) = run(&mut r, session, n, DecodeMode::Cached);
        let cached_tps = n as f64 / (prefill + decode);
        let stateless_tps = if n <= stateless_max {
            session += 1;
            let (p, d) = run(&mut r, session, n, DecodeMode::Stateless);
            Some(n as f64 / (p + d))
        } else {
            None
        };
        let (stateless, speedup) = match stateless_tps {
            Some(s) => (format!("{s:.1}"), format!("{:.2}x", cached_tps / s)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{n:>7} {cached_tps:>12.1} {stateless:>12} {speedup:>9} {:>14.0} {:>14.1}",
            PROMPT as f64 / prefill,
            (n - 1) as f64 / decode.max(1e-9),
        );
    }
}
