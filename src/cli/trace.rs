//! `meshsim trace stats` and `meshsim trace convert`: datasets and traces without a scenario.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Subcommand};

use super::{EXIT_BAD_INPUT, EXIT_FAILED, refused};
use meshsim::results::output;
use meshsim::workload::output::OutputDist;
use meshsim::workload::qa::{ContextMode, Order};
use meshsim::workload::replay::mooncake::MAX_LENGTH;
use meshsim::workload::replay::{self, Loaded, ReplaySpec, Source};
use meshsim::workload::stats::TraceStats;

#[derive(Subcommand)]
pub(crate) enum TraceCommand {
    /// Print requests, length distributions, arrival rate and prefix-reuse potential.
    Stats {
        #[command(flatten)]
        load: LoadArgs,
        /// LRU cache capacities in tokens, comma-separated, each at least 1 (e.g.
        /// 3000000,10000000).
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        lru: Vec<u64>,
        /// Belady bound capacities in tokens, comma-separated, each at least 1: the hit ratio
        /// of Belady's rule (furthest next use goes first) on the blocks taken one by one, an
        /// upper bound on the prefix-hit ratio of any eviction with that capacity.
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        optimal: Vec<u64>,
        /// Block size of the reuse analysis, 1 to 16777216 tokens (default: the format's, 512
        /// for Mooncake, else 16).
        #[arg(long, allow_negative_numbers = true)]
        block_size: Option<u32>,
    },
    /// Convert any supported file to meshsim's canonical trace (JSONL).
    Convert {
        #[command(flatten)]
        load: LoadArgs,
        /// The canonical trace to write.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
pub(crate) struct LoadArgs {
    /// The dataset or trace file.
    file: PathBuf,
    /// squad-json, wikiqa-tsv, mooncake-jsonl, vidur-csv or canonical (default: from the
    /// file's extension; a .jsonl file is canonical if its header says so).
    #[arg(long, value_parser = parse_source)]
    format: Option<Source>,
    /// A Hugging Face tokenizer.json for exact token ids (datasets; default: the estimate).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Keep at most this many requests (at least 1).
    #[arg(long, allow_negative_numbers = true)]
    requests: Option<u32>,
    /// Skip (and count) malformed lines instead of failing.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Datasets: context = window of at most this many tokens, at least 1 (default: the
    /// paragraph).
    #[arg(long, allow_negative_numbers = true)]
    context_tokens: Option<u32>,
    /// Datasets: shuffle questions with the seed (default: grouped by document).
    #[arg(long)]
    shuffle: bool,
    /// Datasets: Poisson arrival rate (requests/s), 0.001 to 1e9.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    rate: f64,
    /// Datasets: fixed output length (tokens), 1 to 16777216.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    output_tokens: u32,
    /// Datasets: seed for order, arrivals and outputs.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
}

fn parse_source(s: &str) -> Result<Source, String> {
    Source::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Source::ALL.iter().map(|s| s.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// Slowest `--rate`, requests/s (one request per 1,000 s on average): ten million requests
/// then arrive within about 10^10 s, inside the 1.8 x 10^10 s that the nanosecond clock holds;
/// at much slower rates the arrivals pile up at the clock's end.
const MIN_RATE_PER_S: f64 = 1e-3;
/// Fastest `--rate`, requests/s: one request per nanosecond, the clock's tick; faster arrivals
/// would all fall on the same few instants.
const MAX_RATE_PER_S: f64 = 1e9;
/// Longest `--output-tokens`, and largest `trace stats --block-size`: the most tokens of an
/// output or a prompt that a trace line may hold, so that what `trace convert` writes reads
/// back (a block longer than any prompt is never full).
const MAX_TRACE_TOKENS: u32 = MAX_LENGTH as u32;

impl LoadArgs {
    /// Refuses, naming the flag, a value that makes no trace: no request kept, a rate that is
    /// not a number from [`MIN_RATE_PER_S`] to [`MAX_RATE_PER_S`], an empty context window, an
    /// output of no token or of more than [`MAX_TRACE_TOKENS`]. Reads nothing.
    fn check(&self) -> Result<(), String> {
        if self.requests == Some(0) {
            return Err("--requests 0: keeps no request; expected at least 1".into());
        }
        if !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&self.rate) {
            return Err(format!(
                "--rate {:?}: expected a Poisson arrival rate from {MIN_RATE_PER_S:e} to \
                 {MAX_RATE_PER_S:e} requests/s",
                self.rate
            ));
        }
        if self.context_tokens == Some(0) {
            return Err("--context-tokens 0: a window of no token; expected at least 1".into());
        }
        if !(1..=MAX_TRACE_TOKENS).contains(&self.output_tokens) {
            return Err(format!(
                "--output-tokens {}: expected 1 to {MAX_TRACE_TOKENS} tokens",
                self.output_tokens
            ));
        }
        Ok(())
    }

    fn load(&self) -> Result<Loaded, String> {
        let source = match self.format {
            Some(f) => f,
            None => Source::guess(&self.file).ok_or_else(|| {
                format!(
                    "{}: cannot tell the format from the name; give --format",
                    self.file.display()
                )
            })?,
        };
        let mut spec = ReplaySpec::new(source, &self.file);
        spec.tokenizer = self.tokenizer.clone();
        spec.max_requests = self.requests;
        spec.skip_bad_lines = self.skip_bad_lines;
        spec.qa.arrival_rate_per_s = self.rate;
        spec.qa.order = if self.shuffle {
            Order::Shuffled
        } else {
            Order::Grouped
        };
        spec.qa.context = match self.context_tokens {
            Some(tokens) => ContextMode::Window { tokens },
            None => ContextMode::Unit,
        };
        spec.qa.output = OutputDist::Fixed {
            tokens: self.output_tokens,
        };
        replay::load(&spec, self.seed).map_err(|e| e.to_string())
    }
}

fn opt(v: Option<u32>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// Refuses, naming the flag, a `trace stats` analysis that measures nothing: a block of no
/// token or longer than [`MAX_TRACE_TOKENS`], an LRU cache or a Belady bound of no token.
fn check_stats(lru: &[u64], optimal: &[u64], block_size: Option<u32>) -> Result<(), String> {
    if let Some(b) = block_size.filter(|b| !(1..=MAX_TRACE_TOKENS).contains(b)) {
        return Err(format!(
            "--block-size {b}: expected 1 to {MAX_TRACE_TOKENS} tokens"
        ));
    }
    if lru.contains(&0) {
        return Err("--lru 0: a cache of no token holds nothing; expected at least 1 token".into());
    }
    if optimal.contains(&0) {
        return Err(
            "--optimal 0: a cache of no token holds nothing; expected at least 1 token".into(),
        );
    }
    Ok(())
}

fn trace_stats(load: &LoadArgs, lru: &[u64], optimal: &[u64], block_size: Option<u32>) -> ExitCode {
    let started = Instant::now();
    let l = match load.load() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let loaded_s = started.elapsed().as_secs_f64();
    let bs = block_size.unwrap_or(l.block_size);
    let st = TraceStats::with_bounds(&l.trace, bs, lru, optimal);
    println!("trace {} ({})", load.file.display(), l.source.name());
    let contexts = if l.source.is_dataset() {
        format!("; contexts {}", st.contexts)
    } else {
        String::new()
    };
    println!(
        "  requests {}; documents {}, units {}, questions {}{contexts}; skipped lines {}",
        st.requests,
        opt(l.documents),
        opt(l.units),
        opt(l.questions),
        l.skipped_lines
    );
    for (name, d) in [("prompt", st.prompt), ("output", st.output)] {
        println!(
            "  {name} tokens: mean {:.1}, p50 {}, p90 {}, p99 {}, max {}",
            d.mean, d.p50, d.p90, d.p99, d.max
        );
    }
    println!(
        "  arrivals: {} requests over {:.1} s = {:.3} requests/s",
        st.requests, st.duration_s, st.arrival_rate_per_s
    );
    println!(
        "  prefix-hit ratio (blocks of {} tokens): unbounded cache {:.2}%",
        st.block_size,
        100.0 * st.unbounded_hit_ratio
    );
    for (cap, hit) in &st.lru_hit_ratio {
        println!("    LRU cache of {cap} tokens: {:.2}%", 100.0 * hit);
    }
    for (cap, hit) in &st.optimal_hit_ratio {
        println!(
            "    Belady bound (any eviction, upper bound) of {cap} tokens: {:.2}%",
            100.0 * hit
        );
    }
    println!("  {}", st.reuse_line());
    eprintln!(
        "  (loaded in {loaded_s:.2} s, analysed in {:.2} s)",
        started.elapsed().as_secs_f64() - loaded_s
    );
    ExitCode::SUCCESS
}

fn trace_convert(load: &LoadArgs, out: &Path) -> ExitCode {
    let replaces = output::Replaces::Header(output::TRACE_HEADER);
    if let Err(e) = output::check_out_file(out, replaces).and_then(|()| output::probe_beside(out)) {
        return refused(e);
    }
    let l = match load.load() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let written = output::write_file_atomically(out, replaces, |w| replay::canonical::write(&l, w));
    if let Err(e) = written {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_FAILED);
    }
    println!(
        "wrote {} requests and {} segments to {}",
        l.trace.requests.len(),
        l.trace.arena.segments(),
        out.display()
    );
    ExitCode::SUCCESS
}

/// Runs a `meshsim trace` subcommand, once its flags are checked.
pub(crate) fn trace(command: &TraceCommand) -> ExitCode {
    let checked = match command {
        TraceCommand::Stats {
            load,
            lru,
            optimal,
            block_size,
        } => load
            .check()
            .and_then(|()| check_stats(lru, optimal, *block_size)),
        TraceCommand::Convert { load, .. } => load.check(),
    };
    if let Err(e) = checked {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    match command {
        TraceCommand::Stats {
            load,
            lru,
            optimal,
            block_size,
        } => trace_stats(load, lru, optimal, *block_size),
        TraceCommand::Convert { load, out } => trace_convert(load, out),
    }
}
