//! `meshsim profile`: measure a model's shards and write the profile.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, refused};
use meshsim::model::profile::{Profile, ProfileError};
use meshsim::profiling::{MAX_PROFILE_REPEATS, MAX_PROFILE_TOKENS, ServingGrid};
use meshsim::results::output;

#[derive(Args)]
pub(crate) struct ProfileArgs {
    /// A preset of the model catalogue: tiny, tiny-qwen, small, mistral-7b-instruct-v0.2,
    /// qwen2.5-0.5b (the large ones need the memory of their weights).
    #[arg(long, default_value = "small")]
    pub(crate) model: String,
    /// Pipeline shards (contiguous layer ranges, split evenly; 1 to the model's layers;
    /// default 2). Not with --serving, which measures whole iterations of one model.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) shards: Option<usize>,
    /// Prefill grid: new tokens, comma-separated and increasing, 1 to 8192 (default
    /// 1,8,16,32,64,128,256,512; with --serving 16,64,128,256,384,512).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub(crate) prefill: Vec<u32>,
    /// Decode grid: cached context tokens, comma-separated and increasing, 1 to 8192
    /// (default 1,16,64,128,256,512,1024). Not with --serving.
    #[arg(
        long,
        value_delimiter = ',',
        allow_hyphen_values = true,
        conflicts_with = "serving"
    )]
    pub(crate) decode: Vec<u32>,
    /// Runs per grid point, 1 to 1000; the median is kept.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
    pub(crate) repeats: u32,
    /// Seed of the weights.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub(crate) seed: u64,
    /// Profile the serving batch backend (whole iterations of a paged K/V cache, store
    /// exports and loads) instead of pipeline shards: the profile that `serving.profile`
    /// takes.
    #[arg(long)]
    pub(crate) serving: bool,
    /// With --serving: the KV block size in tokens.
    #[arg(
        long,
        default_value_t = 16,
        allow_negative_numbers = true,
        requires = "serving"
    )]
    pub(crate) block_size: u32,
    /// With --serving: tokens per store tensor, whole blocks; the largest store transfer (8
    /// tensors) holds at most 8192 tokens.
    #[arg(
        long,
        default_value_t = 64,
        allow_negative_numbers = true,
        requires = "serving"
    )]
    pub(crate) tensor_tokens: u32,
    /// The profile file to write.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

/// `points` as the command line writes them (`1,8,16`).
fn listed(points: &[u32]) -> String {
    let points: Vec<String> = points.iter().map(u32::to_string).collect();
    points.join(",")
}

/// Refuses, naming the flag, a grid `flag` (`--prefill`, `--decode`) that holds a point of no
/// token or past [`MAX_PROFILE_TOKENS`], or points that do not strictly increase.
fn check_points(flag: &str, points: &[u32]) -> Result<(), String> {
    let key = flag.trim_start_matches('-');
    for (i, &x) in points.iter().enumerate() {
        let why = if x == 0 {
            "expected a positive token count".to_string()
        } else if x > MAX_PROFILE_TOKENS {
            format!(
                "at most {MAX_PROFILE_TOKENS} tokens (the attention of a longer sequence needs \
                 more memory than a profile run should take)"
            )
        } else if i > 0 && x <= points[i - 1] {
            format!(
                "expected points strictly above the one before, {}",
                points[i - 1]
            )
        } else {
            continue;
        };
        return Err(format!(
            "{flag} {}: {key}[{i}] = {x}; {why}",
            listed(points)
        ));
    }
    Ok(())
}

/// Refuses, naming the flag, a value that measures nothing or more than a profile run may
/// take: no repeat or more than [`MAX_PROFILE_REPEATS`], a bad grid (see [`check_points`]),
/// and, for a serving profile, a block or a store tensor of no token, a tensor that is not
/// whole blocks, or a store transfer of more than [`MAX_PROFILE_TOKENS`]. Measures nothing;
/// the library's check of the whole grid runs after it.
fn check_flags(a: &ProfileArgs) -> Result<(), String> {
    if !(1..=MAX_PROFILE_REPEATS).contains(&a.repeats) {
        return Err(format!(
            "--repeats {}: expected 1 to {MAX_PROFILE_REPEATS} runs per grid point",
            a.repeats
        ));
    }
    check_points("--prefill", &a.prefill)?;
    check_points("--decode", &a.decode)?;
    if !a.serving {
        return Ok(());
    }
    let (block, tensor) = (a.block_size, a.tensor_tokens);
    for (flag, v) in [("--block-size", block), ("--tensor-tokens", tensor)] {
        if v == 0 {
            return Err(format!("{flag} 0: expected a positive number of tokens"));
        }
    }
    if !tensor.is_multiple_of(block) {
        return Err(format!(
            "--tensor-tokens {tensor}: not a whole number of blocks of --block-size {block}"
        ));
    }
    let tensors = ServingGrid::default()
        .tensors
        .into_iter()
        .max()
        .unwrap_or(1);
    let most = u64::from(tensors) * u64::from(tensor);
    if most > u64::from(MAX_PROFILE_TOKENS) {
        return Err(format!(
            "--tensor-tokens {tensor}: the largest store transfer ({tensors} tensors) would \
             hold {most} tokens, at most {MAX_PROFILE_TOKENS}"
        ));
    }
    Ok(())
}

/// Checks the grid (`checked`) and that `out` may be written, before any measurement.
fn ready(checked: Result<(), ProfileError>, out: &Path) -> Result<(), ExitCode> {
    if let Err(e) = checked {
        eprintln!("error: {e}");
        return Err(ExitCode::from(EXIT_BAD_INPUT));
    }
    output::check_out_file(out, output::Replaces::Header(output::PROFILE_HEADER))
        .and_then(|()| output::probe_beside(out))
        .map_err(refused)
}

/// A measurement's result, or the exit status of its error (2 for bad input).
fn measured<T>(r: Result<T, ProfileError>) -> Result<T, ExitCode> {
    r.map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(if e.is_bad_input() {
            EXIT_BAD_INPUT
        } else {
            EXIT_FAILED
        })
    })
}

/// Writes `p` to `out`.
fn written(p: &Profile, out: &Path) -> Result<(), ExitCode> {
    meshsim::profiling::write(p, out).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(EXIT_FAILED)
    })
}

/// `meshsim profile --serving`.
fn profile_serving(a: &ProfileArgs, config: &meshsim::exec::TransformerConfig) -> ExitCode {
    use meshsim::profiling::{self as profile, ServingGrid};
    let default = ServingGrid::default();
    let grid = ServingGrid {
        repeats: a.repeats,
        block_size: a.block_size,
        tensor_tokens: a.tensor_tokens,
        prefill: if a.prefill.is_empty() {
            default.prefill.clone()
        } else {
            a.prefill.clone()
        },
        ..default
    };
    if let Err(code) = ready(grid.check("arguments"), &a.out) {
        return code;
    }
    let device = meshsim::exec::default_device();
    let started = Instant::now();
    let weights = meshsim::exec::WeightSource::Seeded(a.seed);
    // Minutes for the larger models: a bar on a terminal, a log line per round with -v.
    let bar = indicatif::ProgressBar::new(u64::from(grid.repeats) + 1).with_style(
        indicatif::ProgressStyle::with_template(
            "  measuring iterations: round {pos} of {len} (the first warms up), {elapsed}",
        )
        .expect("a valid template"),
    );
    let mut on_round = |done: u32, all: u32| {
        bar.set_position(u64::from(done));
        tracing::info!("serving profile: round {done} of {all} measured");
    };
    bar.tick();
    let measuring = profile::measure_serving(config, &weights, &device, &grid, &mut on_round);
    bar.finish_and_clear();
    let b = match measured(measuring) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let p = Profile {
        model: config.name.clone(),
        device: profile::device_name(&device),
        dtype: "f32".into(),
        repeats: a.repeats,
        shards: Vec::new(),
        serving: Some(b.clone()),
    };
    if let Err(code) = written(&p, &a.out) {
        return code;
    }
    println!(
        "serving profile of {} on {} ({} iterations, {} repeats) in {:.1} s -> {}",
        p.model,
        p.device,
        b.iterations.len(),
        p.repeats,
        started.elapsed().as_secs_f64(),
        a.out.display()
    );
    let fit = b.fit();
    println!("  iteration {fit}");
    let mut worst: f64 = 0.0;
    for it in &b.iterations {
        let model = fit.iteration(&it.shape()).0 as f64;
        let err = (model - it.time.0 as f64) / it.time.0 as f64;
        worst = worst.max(err.abs());
        println!(
            "  {:>3} x {:>4} new after {:>5}: measured {:>9.3} ms, fitted {:>9.3} ms ({:+.1}%)",
            it.members,
            it.new_tokens,
            it.cached,
            it.time.as_ms_f64(),
            model / 1e6,
            100.0 * err
        );
    }
    println!("  largest fit error {:.1}%", 100.0 * worst);
    for (what, points, (a0, per_byte)) in [
        ("export", &b.export, b.export_line()),
        ("load", &b.load, b.load_line()),
    ] {
        let last = points.last().map_or(0, |p| p.0);
        println!(
            "  store {what}: {:.2} GB/s ({:.0} us + {:.3} ns/byte; {} bytes at most)",
            if per_byte > 0.0 {
                1.0 / per_byte
            } else {
                f64::INFINITY
            },
            a0 / 1e3,
            per_byte,
            last
        );
    }
    ExitCode::SUCCESS
}

pub(crate) fn profile_run(a: &ProfileArgs) -> ExitCode {
    use meshsim::profiling::{self as profile, Grid};
    let bad = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(EXIT_BAD_INPUT)
    };
    if let Err(e) = check_flags(a) {
        return bad(e);
    }
    let Some(config) = meshsim::exec::TransformerConfig::preset(&a.model) else {
        return bad(format!(
            "unknown model {:?} ({})",
            a.model,
            meshsim::model::catalogue::names()
        ));
    };
    if a.serving {
        if let Some(n) = a.shards {
            return bad(format!(
                "--shards {n}: a serving profile measures whole iterations of one model; \
                 --shards splits pipeline profiles only"
            ));
        }
        // Measured as the live serving runs it prices compute (see the function's doc).
        let n = super::leave_a_core_for_the_actors();
        tracing::info!("serving profile: candle computes on {n} thread(s)");
        return profile_serving(a, &config);
    }
    let layers = match meshsim::model::split_layers(config.layers, a.shards.unwrap_or(2)) {
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
    if let Err(code) = ready(grid.check("arguments"), &a.out) {
        return code;
    }
    let device = meshsim::exec::default_device();
    let started = Instant::now();
    let p = match measured(profile::measure(
        &config,
        &layers,
        &meshsim::exec::WeightSource::Seeded(a.seed),
        &device,
        &grid,
    )) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Err(code) = written(&p, &a.out) {
        return code;
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
