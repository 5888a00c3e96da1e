//! The `meshsim` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use meshsim::Scenario;
use meshsim::pipeline::run as pipeline_run;
use meshsim::pipeline::scenario::{Arrivals, CostSource, PipelineScenario, mode_name};
use meshsim::results::output;
use meshsim::units::GIB;
use meshsim::workload::WorkloadSpec;
use meshsim::workload::qa::{ContextMode, Order, OutputDist};
use meshsim::workload::replay::{self, Loaded, ReplaySpec, Source};
use meshsim::workload::stats::TraceStats;

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
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Write results into this folder instead of results/<name>/.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Threads for running policies in parallel (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Print only errors.
        #[arg(long, short)]
        quiet: bool,
        /// Pipeline scenarios: run on the live host (candle tensors, ractor actors, wall
        /// clock) instead of the simulator; results go to results/<name>_live/ by default.
        #[arg(long)]
        live: bool,
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
    /// errors of the simulation); prints markdown, or writes it to --out.
    Compare {
        /// The simulated results folder.
        sim: PathBuf,
        /// The live results folder.
        live: PathBuf,
        /// Write the markdown here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
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
}

#[derive(Args)]
struct ProfileArgs {
    /// The model: tiny, tiny-qwen or small.
    #[arg(long, default_value = "small")]
    model: String,
    /// Pipeline shards (contiguous layer ranges, split evenly).
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// Prefill grid: new tokens, comma-separated and increasing
    /// (default 1,8,16,32,64,128,256,512).
    #[arg(long, value_delimiter = ',')]
    prefill: Vec<u32>,
    /// Decode grid: cached context tokens, comma-separated and increasing
    /// (default 1,16,64,128,256,512,1024).
    #[arg(long, value_delimiter = ',')]
    decode: Vec<u32>,
    /// Runs per grid point; the median is kept.
    #[arg(long, default_value_t = 5)]
    repeats: u32,
    /// Seed of the weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The profile file to write.
    #[arg(long)]
    out: PathBuf,
}

fn profile_run(a: &ProfileArgs) -> ExitCode {
    use meshsim::profiling::{self as profile, Grid};
    let bad = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(EXIT_BAD_INPUT)
    };
    let Some(config) = meshsim::exec::TransformerConfig::preset(&a.model) else {
        return bad(format!(
            "unknown model {:?} ({})",
            a.model,
            meshsim::model::catalogue::names()
        ));
    };
    let layers = match meshsim::model::split_layers(config.layers, a.shards) {
        Ok(l) => l,
        Err(e) => return bad(format!("--shards: {e}")),
    };
    let default = Grid::default();
    let grid = Grid {
        prefill: if a.prefill.is_empty() {
            default.prefill
        } else {
            a.prefill.clone()
        },
        decode: if a.decode.is_empty() {
            default.decode
        } else {
            a.decode.clone()
        },
        repeats: a.repeats,
    };
    if let Err(e) = grid.check("arguments") {
        return bad(e.to_string());
    }
    let replaces = output::Replaces::Header(output::PROFILE_HEADER);
    if let Err(e) = output::check_out_file(&a.out, replaces) {
        return refused(e);
    }
    let device = meshsim::exec::default_device();
    let started = Instant::now();
    let p = match profile::measure(
        &config,
        &layers,
        &meshsim::exec::WeightSource::Seeded(a.seed),
        &device,
        &grid,
    ) {
        Ok(p) => p,
        Err(e) if e.is_bad_input() => return bad(e.to_string()),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    if let Err(e) = profile::write(&p, &a.out) {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_FAILED);
    }
    let (n, c) = (grid.prefill[grid.prefill.len() - 1], grid.decode[0]);
    println!(
        "profile of {} on {} ({} shards, {} repeats) in {:.1} s -> {}",
        p.model,
        p.device,
        p.shards.len(),
        p.repeats,
        started.elapsed().as_secs_f64(),
        a.out.display()
    );
    println!(
        "  {:>5}  {:>8}  {:>22}  {:>22}",
        "shard",
        "layers",
        format!("prefill {n} tokens/s"),
        format!("decode ms at {c} ctx")
    );
    for (i, s) in p.shards.iter().enumerate() {
        println!(
            "  {:>5}  {:>8}  {:>22.0}  {:>22.3}",
            i,
            format!("{}..{}", s.layers.start, s.layers.end),
            n as f64 / s.prefill(n as usize).as_secs_f64(),
            s.decode(c as usize).as_ms_f64()
        );
    }
    ExitCode::SUCCESS
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Print requests, length distributions, arrival rate and prefix-reuse potential.
    Stats {
        #[command(flatten)]
        load: LoadArgs,
        /// LRU cache capacities in tokens, comma-separated (e.g. 3000000,10000000).
        #[arg(long, value_delimiter = ',')]
        lru: Vec<u64>,
        /// Block size of the reuse analysis (default: the format's, 512 for Mooncake, else 16).
        #[arg(long)]
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
struct LoadArgs {
    /// The dataset or trace file.
    file: PathBuf,
    /// squad-json, wikiqa-tsv, mooncake-jsonl, vidur-csv or canonical (default: from the
    /// file's extension; a .jsonl file is canonical if its header says so).
    #[arg(long, value_parser = parse_source)]
    format: Option<Source>,
    /// A Hugging Face tokenizer.json for exact token ids (datasets; default: the estimate).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Keep at most this many requests.
    #[arg(long)]
    requests: Option<u32>,
    /// Skip (and count) malformed lines instead of failing.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Datasets: context = window of at most this many tokens (default: the paragraph).
    #[arg(long)]
    context_tokens: Option<u32>,
    /// Datasets: shuffle questions with the seed (default: grouped by document).
    #[arg(long)]
    shuffle: bool,
    /// Datasets: Poisson arrival rate (requests/s).
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Datasets: fixed output length (tokens).
    #[arg(long, default_value_t = 64)]
    output_tokens: u32,
    /// Datasets: seed for order, arrivals and outputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_source(s: &str) -> Result<Source, String> {
    Source::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Source::ALL.iter().map(|s| s.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

impl LoadArgs {
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
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(format!(
                "--rate: expected a positive number, found {}",
                self.rate
            ));
        }
        if self.output_tokens == 0 || self.context_tokens == Some(0) {
            return Err("--output-tokens and --context-tokens must be positive".into());
        }
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

fn trace_stats(load: &LoadArgs, lru: &[u64], block_size: Option<u32>) -> ExitCode {
    let started = Instant::now();
    let l = match load.load() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let loaded_s = started.elapsed().as_secs_f64();
    let bs = match block_size {
        Some(0) => {
            eprintln!("error: --block-size: expected a positive number");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Some(b) => b,
        None => l.block_size,
    };
    let st = TraceStats::of(&l.trace, bs, lru);
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
    eprintln!(
        "  (loaded in {loaded_s:.2} s, analysed in {:.2} s)",
        started.elapsed().as_secs_f64() - loaded_s
    );
    ExitCode::SUCCESS
}

fn trace_convert(load: &LoadArgs, out: &Path) -> ExitCode {
    let replaces = output::Replaces::Header(output::TRACE_HEADER);
    if let Err(e) = output::check_out_file(out, replaces) {
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

/// Exit status for bad input (scenario files, arguments).
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for a simulation that broke a limit or an invariant, or for I/O failures.
const EXIT_FAILED: u8 = 1;

/// An output path that must not be written (see `meshsim::results::output`), found before any work.
fn refused(e: output::OutputError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EXIT_BAD_INPUT)
}

fn describe(s: &Scenario) {
    let inst = s.serving.instance;
    let kv_tok = s.model.kv_bytes_per_token();
    println!("scenario {} (seed {})", s.name, s.seed);
    println!(
        "  hardware: {} nodes x {} {} = {} GPUs; {} serving instances (tensor parallel {})",
        s.hardware.nodes,
        s.hardware.gpus_per_node,
        s.hardware.gpu.name,
        s.hardware.total_gpus(),
        s.instances(),
        s.serving.tensor_parallel
    );
    println!(
        "  model: {} ({:.2} GiB of weights, {} KiB of KV per token)",
        s.model.name,
        s.model.weight_bytes() as f64 / GIB as f64,
        kv_tok / 1024
    );
    println!(
        "  KV memory per instance: {} blocks of {} tokens = {} tokens ({:.2} GiB)",
        inst.num_blocks,
        inst.block_size,
        inst.num_blocks as u64 * inst.block_size as u64,
        (inst.num_blocks as u64 * inst.block_size as u64 * kv_tok) as f64 / GIB as f64
    );
    let workload = match &s.workload {
        WorkloadSpec::Generated(w) => {
            format!("{} requests at {} /s", w.requests, w.arrival_rate_per_s)
        }
        WorkloadSpec::Replay(r) => format!(
            "{} from {}{}",
            r.source.name(),
            r.path.display(),
            r.max_requests
                .map_or(String::new(), |n| format!(" (at most {n} requests)"))
        ),
    };
    println!(
        "  workload: {workload}; policies: {}",
        s.policies
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn run(
    scenario: &Path,
    seed: Option<u64>,
    out: Option<PathBuf>,
    threads: Option<usize>,
    quiet: bool,
) -> ExitCode {
    let mut s = match Scenario::load(scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    if let Some(seed) = seed {
        s.set_seed(seed);
    }
    let dir = out.unwrap_or_else(|| Path::new("results").join(&s.name));
    if let Err(e) = output::check_out_dir(&dir) {
        return refused(e);
    }
    if !quiet {
        describe(&s);
        if !s.points.is_empty() {
            let labels: Vec<&str> = s.points.iter().map(|p| p.label.as_str()).collect();
            println!("  sweep: {} points: {}", labels.len(), labels.join(", "));
        }
    }
    let started = Instant::now();
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let simulations = s.policies.len() * s.points.len().max(1);
    let spinner = Spinner::start(!quiet, format!("simulating {simulations} runs"));
    let runs = meshsim::serving::run::simulate_experiment(&s, threads);
    spinner.stop();
    let runs = match runs {
        Ok(r) => r,
        Err(meshsim::serving::run::RunError::Trace(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!(
                "reproduce with: meshsim run {} --seed {}",
                scenario.display(),
                s.seed
            );
            return ExitCode::from(EXIT_FAILED);
        }
    };
    for r in &runs {
        tracing::info!(
            policy = r.policy.name(),
            events = r.summary.events,
            wall_s = r.wall.as_secs_f64(),
            "policy simulated"
        );
    }
    let written = match meshsim::serving::run::write_results(&s, &runs, &dir) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: cannot write results to {}: {e}", dir.display());
            return ExitCode::from(EXIT_FAILED);
        }
    };
    tracing::info!(
        files = written.plot_files.len(),
        plot_s = written.plot_time.as_secs_f64(),
        "plots and report written"
    );
    if !quiet {
        let mut events = 0;
        for r in &runs {
            let sm = &r.summary;
            events += sm.events;
            if let Some(point) = &sm.point {
                print!("  [{point}]");
            }
            println!(
                "  {:<13} TTFT p50 {:>9.1} ms  p99 {:>9.1} ms | TPOT p50 {:>6.1} ms | hit {:>5.1}% | {:>9} events in {:.2} s ({:.2} M events/s)",
                sm.policy,
                sm.ttft.p50,
                sm.ttft.p99,
                sm.tpot.p50,
                100.0 * sm.prefix_hit_ratio,
                sm.events,
                r.wall.as_secs_f64(),
                sm.events as f64 / r.wall.as_secs_f64().max(1e-9) / 1e6
            );
        }
        let wall = started.elapsed().as_secs_f64();
        println!(
            "  {events} events processed, {:.2} M events/s overall, wall time {wall:.2} s; results in {}",
            events as f64 / wall / 1e6,
            dir.display()
        );
        println!(
            "  plots ({} files) and report.md drawn in {:.3} s",
            written.plot_files.len() - 1,
            written.plot_time.as_secs_f64()
        );
    }
    ExitCode::SUCCESS
}

fn compare(sim: &Path, live: &Path, out: Option<&Path>) -> ExitCode {
    let replaces = output::Replaces::Header(output::COMPARISON_HEADER);
    if let Some(path) = out
        && let Err(e) = output::check_out_file(path, replaces)
    {
        return refused(e);
    }
    let md = match meshsim::results::compare::compare(sim, live) {
        Ok(md) => md,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match out {
        Some(path) => {
            if let Err(e) =
                output::write_file_atomically(path, replaces, |w| w.write_all(md.as_bytes()))
            {
                eprintln!("error: {e}");
                return ExitCode::from(EXIT_FAILED);
            }
        }
        None => print!("{md}"),
    }
    ExitCode::SUCCESS
}

fn describe_pipeline(s: &PipelineScenario) {
    println!("pipeline scenario {} (seed {})", s.name, s.seed);
    let ranges: Vec<String> = s
        .layers
        .iter()
        .map(|l| format!("{}..{}", l.start, l.end))
        .collect();
    println!(
        "  model: {} ({} layers, hidden {}) in {} shards: {}",
        s.model.name,
        s.model.layers,
        s.model.hidden,
        s.layers.len(),
        ranges.join(", ")
    );
    let cost = match &s.cost {
        CostSource::Analytic { gpu, .. } => format!("analytic roofline on {}", gpu.name),
        CostSource::Profile { path, profile } => format!(
            "measured profile {} ({} on {})",
            path.display(),
            profile.dtype,
            profile.device
        ),
    };
    println!(
        "  host: {}; step cost: {cost}; link {:.1} GB/s, {:.1} us one way",
        if s.live {
            "live (candle, ractor)"
        } else {
            "simulated"
        },
        s.link.bandwidth / 1e9,
        s.link.latency.0 as f64 / 1e3
    );
    println!(
        "  session caches: {} sessions, TTL {:.0} s; head: {} sessions at once",
        s.cache.max_sessions,
        s.cache.ttl.as_secs_f64(),
        s.max_active
    );
    let w = &s.workload;
    println!(
        "  workload: {} requests {}, {} prompt tokens, {} output tokens; modes: {}",
        w.requests,
        match w.arrivals {
            Arrivals::Poisson(r) => format!("at {r} /s (Poisson)"),
            Arrivals::ClosedLoop => {
                format!("in a closed loop of {} clients", s.max_active)
            }
        },
        w.prompt_tokens,
        w.output_tokens,
        s.modes
            .iter()
            .map(|m| mode_name(*m))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !s.points.is_empty() {
        let labels: Vec<&str> = s.points.iter().map(|p| p.label.as_str()).collect();
        println!("  sweep: {} points: {}", labels.len(), labels.join(", "));
    }
}

fn run_pipeline(
    scenario: &Path,
    seed: Option<u64>,
    out: Option<PathBuf>,
    threads: Option<usize>,
    quiet: bool,
    live_flag: bool,
) -> ExitCode {
    let mut s = match PipelineScenario::load(scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    if let Some(seed) = seed {
        s.set_seed(seed);
    }
    let live = s.live || live_flag;
    s.live = live;
    if live && let Err(e) = s.check_live(&scenario.display().to_string()) {
        eprintln!("error: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    if live_flag {
        s.text = meshsim::pipeline::scenario::with_live_mode(&s.text);
    }
    let default_name = if live_flag {
        format!("{}_live", s.name)
    } else {
        s.name.clone()
    };
    let dir = out.unwrap_or_else(|| Path::new("results").join(default_name));
    if let Err(e) = output::check_out_dir(&dir) {
        return refused(e);
    }
    if !quiet {
        describe_pipeline(&s);
    }
    let started = Instant::now();
    let runs = if live {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: cannot start the tokio runtime: {e}");
                return ExitCode::from(EXIT_FAILED);
            }
        };
        let spinner = Spinner::start(!quiet, "serving on the live host".into());
        let runs = rt.block_on(pipeline_run::live_all(&s));
        spinner.stop();
        runs.map_err(|e| e.to_string())
    } else {
        let threads =
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        pipeline_run::simulate_all(&s, threads).map_err(|e| e.to_string())
    };
    let runs = match runs {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!(
                "reproduce with: meshsim run {}{} --seed {}",
                scenario.display(),
                if live_flag { " --live" } else { "" },
                s.seed
            );
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let written = match pipeline_run::write_results(&s, &runs, &dir) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: cannot write results to {}: {e}", dir.display());
            return ExitCode::from(EXIT_FAILED);
        }
    };
    if !quiet {
        for r in &runs {
            let sm = &r.summary;
            if let Some(point) = &sm.point {
                print!("  [{point}]");
            }
            println!(
                "  {:<10} TTFT p50 {:>9.1} ms  p99 {:>9.1} ms | TPOT p50 {:>7.2} ms | {:>8.1} output tokens/s | {} re-prefills | {:.2} s",
                sm.policy,
                sm.ttft.p50,
                sm.ttft.p99,
                sm.tpot.p50,
                sm.output_tokens_per_s,
                sm.preemptions,
                r.wall.as_secs_f64()
            );
        }
        println!(
            "  wall time {:.2} s; results in {}; plots and report.md drawn in {:.3} s",
            started.elapsed().as_secs_f64(),
            dir.display(),
            written.plot_time.as_secs_f64()
        );
    }
    ExitCode::SUCCESS
}

/// A spinner on stdout while policies are simulated, shown only when stdout is a terminal and
/// the simulation lasts more than a second. Console only: nothing of it reaches result files.
struct Spinner {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start(enabled: bool, msg: String) -> Spinner {
        if !enabled || !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            return Spinner {
                done: None,
                thread: None,
            };
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            use std::sync::mpsc::RecvTimeoutError;
            // Finished (or the sender dropped) within a second: never shown.
            if rx.recv_timeout(Duration::from_secs(1)) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let bar = indicatif::ProgressBar::with_draw_target(
                None,
                indicatif::ProgressDrawTarget::stdout(),
            );
            // The template is a valid literal, so building the style cannot fail.
            let style = indicatif::ProgressStyle::with_template("  {spinner} {msg} ({elapsed})")
                .expect("valid spinner template");
            bar.set_style(style);
            bar.set_message(msg);
            bar.enable_steady_tick(Duration::from_millis(100));
            let _ = rx.recv();
            bar.finish_and_clear();
        });
        Spinner {
            done: Some(tx),
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn plot(dir: &Path, quiet: bool) -> ExitCode {
    let started = Instant::now();
    match meshsim::results::plot::render(dir) {
        Ok(files) => {
            if !quiet {
                println!(
                    "wrote {} files into {} in {:.3} s: {}",
                    files.len(),
                    dir.display(),
                    started.elapsed().as_secs_f64(),
                    files
                        .iter()
                        .filter_map(|f| f.file_name())
                        .map(|f| f.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_bad_input() {
                EXIT_BAD_INPUT
            } else {
                EXIT_FAILED
            })
        }
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
        Command::Run { quiet, .. } | Command::Plot { quiet, .. } => *quiet,
        Command::Check { .. }
        | Command::Trace { .. }
        | Command::Profile(_)
        | Command::Compare { .. } => false,
    };
    init_logging(cli.verbose, quiet);
    match cli.command {
        Command::Plot { dir, quiet } => plot(&dir, quiet),
        Command::Compare { sim, live, out } => compare(&sim, &live, out.as_deref()),
        Command::Profile(args) => profile_run(&args),
        Command::Run {
            scenario,
            seed,
            out,
            threads,
            quiet,
            live,
        } => {
            if meshsim::pipeline::scenario::is_pipeline_file(&scenario) {
                run_pipeline(&scenario, seed, out, threads, quiet, live)
            } else if live {
                eprintln!(
                    "error: {}: --live needs a pipeline scenario (one with a [pipeline] table)",
                    scenario.display()
                );
                ExitCode::from(EXIT_BAD_INPUT)
            } else {
                run(&scenario, seed, out, threads, quiet)
            }
        }
        Command::Trace {
            command:
                TraceCommand::Stats {
                    load,
                    lru,
                    block_size,
                },
        } => trace_stats(&load, &lru, block_size),
        Command::Trace {
            command: TraceCommand::Convert { load, out },
        } => trace_convert(&load, &out),
        Command::Check { scenario } if meshsim::pipeline::scenario::is_pipeline_file(&scenario) => {
            match PipelineScenario::load(&scenario) {
                Ok(s) => {
                    describe_pipeline(&s);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(EXIT_BAD_INPUT)
                }
            }
        }
        Command::Check { scenario } => match Scenario::load(&scenario) {
            Ok(s) => {
                describe(&s);
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(EXIT_BAD_INPUT)
            }
        },
    }
}
