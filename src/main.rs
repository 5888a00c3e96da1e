//! The `meshsim` command line.

#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::EXIT_BAD_INPUT;
use cli::profile::ProfileArgs;
use cli::trace::TraceCommand;

#[derive(Parser)]
#[command(
    name = "meshsim",
    version,
    about = "Simulates KV-cache prefix reuse on GPU clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate every policy of a scenario and write results/<name>/.
    Run {
        /// The scenario file (TOML).
        scenario: PathBuf,
        /// Override the scenario's seed (any u64).
        #[arg(long, allow_negative_numbers = true)]
        seed: Option<u64>,
        /// Write results into this folder instead of results/<name>/.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Threads for running policies in parallel, 1 to 1024 (default: available cores).
        #[arg(long, value_parser = thread_count, allow_negative_numbers = true)]
        threads: Option<usize>,
        /// Print only errors.
        #[arg(long, short)]
        quiet: bool,
        /// Pipeline scenarios: run on the live host (candle tensors, ractor actors, wall
        /// clock) instead of the simulator; results go to results/<name>_live/ by default.
        #[arg(long)]
        live: bool,
        /// Run only the K-th of N shares of the simulations (points x policies, dealt round
        /// robin) and write a partial results folder (default results/<name>.share-K-of-N/);
        /// `meshsim merge` assembles the shares.
        #[arg(long, value_name = "K/N")]
        points: Option<String>,
        /// Live pipeline runs: place the shards on these `meshsim node`s (HOST:PORT,
        /// comma-separated) instead of `[live] nodes`.
        #[arg(long, value_name = "ADDRS")]
        nodes: Option<String>,
        /// The cluster's cookie file (instead of `[live] cookie_file`).
        #[arg(long, value_name = "FILE")]
        cookie_file: Option<PathBuf>,
    },
    /// Join a cluster and host the actors that live runs place here (pipeline shards),
    /// until killed.
    Node {
        /// Address to listen at; loopback unless told otherwise.
        #[arg(long, default_value = "127.0.0.1:7001")]
        listen: String,
        /// File whose first line is the cluster's cookie (never passed on the command line).
        #[arg(long, value_name = "FILE")]
        cookie_file: PathBuf,
        /// Largest frame accepted from a peer, MiB, 1 to 4096 (a run whose largest message is
        /// larger is refused by its coordinator before it starts).
        #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
        max_frame_mib: u64,
        /// Model weights the actors placed here may hold, GiB, 1 to 1048576.
        #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
        max_memory_gib: u64,
    },
    /// Assemble the partial results folders of `meshsim run --points K/N` (every share of one
    /// run) into the results folder one run would have written.
    Merge {
        /// The shares' folders, in any order.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Write the results here instead of results/<name>/.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print only errors.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Redraw the plots and report.md of a results folder from its CSV files.
    Plot {
        /// The results folder (holding summary.csv, requests.csv and scenario.toml).
        dir: PathBuf,
        /// Print only errors.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Compare a simulated pipeline run with a live run of the same scenario (TTFT and TPOT
    /// errors of the simulation); prints markdown (or JSON), or writes it to --out.
    Compare {
        /// The simulated results folder.
        sim: PathBuf,
        /// The live results folder.
        live: PathBuf,
        /// Write the comparison here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write the comparison as JSON (schema `meshsim-comparison/1`, docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Validate a scenario and print what it derives, without running it.
    Check {
        /// The scenario file (TOML).
        scenario: PathBuf,
    },
    /// Measure each pipeline shard of a real (candle, seeded weights) model on a grid of
    /// prefill and decode shapes and write the profile (TOML) that a profiled sim backend uses.
    Profile(ProfileArgs),
    /// Inspect and convert datasets and traces.
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
    /// Run many small random scenarios (one per seed) under every policy, with invariants
    /// checked after every event and each simulated twice for determinism.
    Vopr {
        /// Seeds to run, from --from: 1 to 1000000000.
        #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        from: u64,
        /// Run only this seed (instead of --seeds from --from).
        #[arg(long, allow_negative_numbers = true, conflicts_with_all = ["seeds", "from"])]
        seed: Option<u64>,
        /// With --seed: print the seed's scenario file instead of running it.
        #[arg(long, requires = "seed")]
        print: bool,
    },
}

/// Most `--threads`: each thread runs a whole simulation, with its memory.
const MAX_THREADS: usize = 1024;

/// A `--threads` value: 1 to [`MAX_THREADS`] (0 ran one thread without saying so).
fn thread_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of threads from 1 to {MAX_THREADS}"
        )),
    }
}

/// Logs go to stderr through `tracing`; `RUST_LOG` (env-filter syntax) wins over -v/--quiet.
fn init_logging(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("warn,meshsim={level}")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    // First, before any thread starts.
    meshsim::cpu::alloc::tune_allocator();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_BAD_INPUT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let quiet = match &cli.command {
        Command::Run { quiet, .. } | Command::Plot { quiet, .. } | Command::Merge { quiet, .. } => {
            *quiet
        }
        Command::Check { .. }
        | Command::Trace { .. }
        | Command::Profile(_)
        | Command::Compare { .. }
        | Command::Node { .. }
        | Command::Vopr { .. } => false,
    };
    init_logging(cli.verbose, quiet);
    match cli.command {
        Command::Plot { dir, quiet } => cli::tools::plot(&dir, quiet),
        Command::Compare {
            sim,
            live,
            out,
            json,
        } => cli::tools::compare(&sim, &live, out.as_deref(), json),
        Command::Profile(args) => cli::profile::profile_run(&args),
        Command::Run {
            scenario,
            seed,
            out,
            threads,
            quiet,
            live,
            points,
            nodes,
            cookie_file,
        } => cli::run::run(
            &scenario,
            seed,
            out,
            threads,
            quiet,
            live,
            points.as_deref(),
            cli::run::Cluster { nodes, cookie_file },
        ),
        Command::Node {
            listen,
            cookie_file,
            max_frame_mib,
            max_memory_gib,
        } => cli::node::node(&listen, &cookie_file, max_frame_mib, max_memory_gib),
        Command::Merge { dirs, out, quiet } => cli::run::merge(&dirs, out, quiet),
        Command::Trace { command } => cli::trace::trace(&command),
        Command::Check { scenario } => cli::run::check(&scenario),
        Command::Vopr {
            seeds,
            from,
            seed,
            print,
        } => cli::vopr::vopr(from, seeds, seed, print),
    }
}
