//! The subcommands of the `meshsim` binary: thin drivers over the library, which owns every
//! rule (validation, running, writing). Exit status: 0 on success, [`EXIT_BAD_INPUT`] for bad
//! input (nothing written), [`EXIT_FAILED`] when a run or a write fails.

pub(crate) mod node;
pub(crate) mod profile;
pub(crate) mod run;
pub(crate) mod tools;
pub(crate) mod trace;
pub(crate) mod vopr;

use std::process::ExitCode;

use meshsim::results::output;

/// Exit status for bad input (scenario files, arguments).
pub(crate) const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for a simulation that broke a limit or an invariant, or for I/O failures.
pub(crate) const EXIT_FAILED: u8 = 1;

/// An output path that must not be written (see `meshsim::results::output`), found before any work.
pub(crate) fn refused(e: output::OutputError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Live serving runs, and the serving profile that prices them, leave one of the host's
/// cores to the actors: candle computes an iteration on the others (`RAYON_NUM_THREADS`,
/// unless the user set it or `CANDLE_NUM_THREADS`). With every core in candle's matrix
/// products, the router, the timers and the mailboxes wait for a time slice, and each
/// request's first token reaches the router about one iteration late, which puts the live
/// TTFT far from the simulation's; with a core left free they agree closely (see
/// docs/live.md, "Live serving: the four policies on real tensors"). Returns the threads
/// candle uses.
pub(crate) fn leave_a_core_for_the_actors() -> usize {
    let set = |v: &str| {
        std::env::var(v)
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(n) = set("CANDLE_NUM_THREADS").or_else(|| set("RAYON_NUM_THREADS")) {
        return n;
    }
    if cores < 2 {
        return cores;
    }
    // SAFETY: called before this process starts a thread (tokio, rayon and candle start
    // later), so nothing reads the environment while it changes.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", (cores - 1).to_string()) };
    cores - 1
}

/// Bad input: print it, exit with status 2.
pub(crate) fn bad(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EXIT_BAD_INPUT)
}
