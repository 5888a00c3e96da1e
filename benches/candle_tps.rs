//! Tokens per second of real execution on candle (CPU f32, or CUDA with `--features cuda`):
//! a 2-shard route of the `small` config (8 layers, hidden 512), greedy generation of
//! 16..512 tokens after a 64-token prompt, cached decode against stateless decode (which
//! recomputes the whole sequence for every token), plus prefill and decode rates of the
//! cached mode. Both modes are warmed up (allocator, thread pool, kernels) before any timing.
//!
//! `cargo bench --bench candle_tps` (set `CANDLE_TPS_MAX=128` for a quicker run, and
//! `CANDLE_TPS_STATELESS_MAX` to cap the quadratic stateless runs, 256 by default).
//! Wall-clock figures go to the console only. Under `cargo test --benches` (no `--bench`
//! argument) it runs the `tiny` config for 8 tokens and checks that both modes give the same
//! tokens at a finite, positive rate.

use candle_core::DType;
use meshsim::backend::CandleBackend;
use meshsim::exec::{TransformerConfig, WeightSource, default_device};
use meshsim::pipeline::shard::{CacheLimits, DecodeMode, Route, SessionId, Shard};
use meshsim::units::Nanos;
use std::time::Instant;

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

/// One timed generation.
struct Timed {
    /// Seconds for the prefill (first token) and for the remaining `n - 1` tokens.
    prefill: f64,
    decode: f64,
    output: Vec<u32>,
}

impl Timed {
    fn tps(&self) -> f64 {
        self.output.len() as f64 / (self.prefill + self.decode)
    }
}

struct Bench {
    route: Route,
    prompt: Vec<u32>,
    session: u64,
}

impl Bench {
    fn run(&mut self, n: usize, mode: DecodeMode) -> Timed {
        self.session += 1;
        let t0 = Instant::now();
        let mut g = self
            .route
            .start(
                Nanos::ZERO,
                SessionId(self.session),
                self.prompt.clone(),
                mode,
            )
            .expect("prefill");
        let prefill = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for _ in 1..n {
            self.route.step(Nanos::ZERO, &mut g).expect("decode step");
        }
        let decode = t1.elapsed().as_secs_f64();
        Timed {
            prefill,
            decode,
            output: g.output().to_vec(),
        }
    }
}

fn main() {
    // `cargo test --benches` runs benches without `--bench`: a tiny, checked run then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let preset = if quick {
        &meshsim::model::catalogue::TINY
    } else {
        &meshsim::model::catalogue::SMALL
    };
    let cfg = TransformerConfig::from_preset(preset);
    let prompt_len = if quick { 16 } else { 64 };
    let sizes: Vec<usize> = if quick {
        vec![8]
    } else {
        let max = env_usize("CANDLE_TPS_MAX", 512);
        [16, 64, 128, 256, 512]
            .into_iter()
            .filter(|&n| n <= max)
            .collect()
    };
    let stateless_max = env_usize("CANDLE_TPS_STATELESS_MAX", 256);
    let device = default_device();
    println!(
        "candle_tps: {} ({} layers, hidden {}), 2 shards, {:?}, f32, prompt {prompt_len} tokens",
        cfg.name, cfg.layers, cfg.hidden, device
    );
    let mut b = Bench {
        route: route(&cfg),
        prompt: (0..prompt_len as u32)
            .map(|i| (i * 31 + 7) % cfg.vocab as u32)
            .collect(),
        session: 0,
    };
    // Warm-up of both modes before any timing: first calls pay for allocations, the thread
    // pool and (on a GPU) kernel loading, which the first timed mode would otherwise carry.
    for mode in [DecodeMode::Cached, DecodeMode::Stateless] {
        for _ in 0..2 {
            b.run(8, mode);
        }
    }
    println!(
        "{:>7} {:>12} {:>12} {:>9} {:>14} {:>14} {:>12}",
        "output",
        "cached TPS",
        "stateless",
        "speed-up",
        "prefill tok/s",
        "decode tok/s",
        "same tokens"
    );
    for n in sizes {
        let cached = b.run(n, DecodeMode::Cached);
        let stateless = (n <= stateless_max).then(|| b.run(n, DecodeMode::Stateless));
        let (s_tps, speedup, same) = match &stateless {
            Some(s) => (
                format!("{:.1}", s.tps()),
                format!("{:.2}x", cached.tps() / s.tps()),
                if s.output == cached.output {
                    "yes".to_string()
                } else {
                    let k = (s.output.iter().zip(&cached.output))
                        .take_while(|(a, b)| a == b)
                        .count();
                    format!("first {k}")
                },
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{n:>7} {:>12.1} {s_tps:>12} {speedup:>9} {:>14.0} {:>14.1} {same:>12}",
            cached.tps(),
            prompt_len as f64 / cached.prefill,
            (n - 1) as f64 / cached.decode.max(1e-9),
        );
        assert_eq!(cached.output.len(), n);
        if quick {
            let s = stateless.expect("quick mode runs both modes");
            assert_eq!(
                s.output, cached.output,
                "cached and stateless decode differ"
            );
            for tps in [cached.tps(), s.tps()] {
                assert!(tps.is_finite() && tps > 0.0, "tokens/s {tps}");
            }
        }
    }
}
