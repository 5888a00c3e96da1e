//! `meshsim vopr`: many small random scenarios, invariants checked after every event, each
//! simulated twice (see `meshsim::vopr`).

use std::process::ExitCode;
use std::time::Instant;

use super::EXIT_FAILED;
use meshsim::vopr;

/// Most `--seeds` of one run: a seed takes about a second, so a billion of them run for
/// decades; a larger count is a slip, not a plan.
const MAX_SEEDS: u64 = 1_000_000_000;

/// Runs `count` seeds from `from` (or the one `seed`), or prints a seed's scenario.
pub(crate) fn vopr(from: u64, count: u64, seed: Option<u64>, print: bool) -> ExitCode {
    if let (Some(s), true) = (seed, print) {
        print!("{}", vopr::scenario_text(s));
        return ExitCode::SUCCESS;
    }
    if seed.is_none() {
        if count == 0 {
            eprintln!("error: --seeds 0: expected at least one seed to run");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
        if count > MAX_SEEDS {
            eprintln!("error: --seeds {count}: at most {MAX_SEEDS} seeds in one run");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
        if from.checked_add(count - 1).is_none() {
            eprintln!(
                "error: --from {from} --seeds {count}: the last seed would be past {}; give \
                 fewer seeds or an earlier --from",
                u64::MAX
            );
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    }
    // One seed, or `count` seeds from `from` (no overflow: checked above).
    let seeds = match seed {
        Some(s) => s..=s,
        None => from..=from + (count - 1),
    };
    let ran = if seed.is_some() { 1 } else { count };
    let started = Instant::now();
    let (mut events, mut simulations, mut failed) = (0u64, 0usize, 0usize);
    for s in seeds {
        match vopr::run_seed(s) {
            Ok(o) => {
                events += o.events;
                simulations += o.simulations;
                println!(
                    "seed {s}: ok ({} simulations, {} events, {} faults; requests: {} finished, \
                     {} rejected, {} failed, {} failed over, {} preemptions, {} failed loads; \
                     tensors: {} demoted, {} dropped, {} replicated)",
                    o.simulations,
                    o.events,
                    o.faults,
                    o.finished,
                    o.rejected,
                    o.failed,
                    o.failovers,
                    o.preemptions,
                    o.failed_loads,
                    o.demoted,
                    o.dropped,
                    o.replicated
                );
            }
            Err(e) => {
                failed += 1;
                println!("FAILED {e}");
            }
        }
    }
    println!(
        "{} seeds, {failed} failed; {simulations} simulations, {events} events, invariants checked \
         after every event, in {:.1} s",
        ran,
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}
