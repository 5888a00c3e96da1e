//! The event kernel alone: events per second with 1k, 100k and 1M events pending.
//!
//! Each step pops the earliest event and schedules one new event a pseudo-random delay later,
//! so the number of pending events stays constant. Run with `cargo bench --bench kernel`.
//! Reports the median of five rounds.

use std::hint::black_box;
use std::time::Instant;

use meshsim::Nanos;
use meshsim::actor::ActorId;
use meshsim::rng::Stream;
use meshsim::sim::kernel::{Kernel, Limits};

fn rate(pending: usize, steps: u64, seed: u64) -> f64 {
    let limits = Limits {
        max_events: u64::MAX,
        max_time: Nanos::MAX,
        max_pending: usize::MAX,
    };
    let mut kernel: Kernel<u64> = Kernel::new(limits, seed);
    let mut rng = Stream::new(seed, 0);
    for i in 0..pending {
        kernel.schedule(
            Nanos(rng.below(1_000_000)),
            ActorId(i as u32 % 64),
            i as u64,
        );
    }
    let started = Instant::now();
    for _ in 0..steps {
        let e = kernel.pop().unwrap().unwrap();
        let delay = Nanos(1 + rng.below(1_000_000));
        kernel.schedule(e.time + delay, e.target, black_box(e.msg));
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(kernel.pending(), pending);
    steps as f64 / secs
}

fn main() {
    // `cargo test --benches` passes `--bench`-less arguments; run a short round then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let steps = if quick { 10_000 } else { 2_000_000 };
    println!("event kernel: pop + schedule, constant number of pending events");
    for pending in [1_000usize, 100_000, 1_000_000] {
        let mut rates: Vec<f64> = (0..if quick { 1 } else { 5 })
            .map(|round| rate(pending, steps, round))
            .collect();
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        println!(
            "  {pending:>9} pending: {:>7.2} M events/s (median of {} rounds of {steps} events)",
            median / 1e6,
            rates.len()
        );
    }
}
