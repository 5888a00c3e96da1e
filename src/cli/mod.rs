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

/// Bad input: print it, exit with status 2.
pub(crate) fn bad(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EXIT_BAD_INPUT)
}
