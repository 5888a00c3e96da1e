//! `meshsim profile`: measure a model's shards and write the profile.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, refused};
use meshsim::results::output;

#[derive(Args)]
pub(crate) struct ProfileArgs {
    /// A preset of the model catalogue: tiny, tiny-qwen, small, mistral-7b-instruct-v0.2,
    /// qwen2.5-0.5b (the large ones need the memory of their weights).
    #[arg(long, default_value = "small")]
    pub(crate) model: String,
    /// Pipeline shards (contiguous layer ranges, split evenly).
    #[arg(long, default_value_t = 2)]
    pub(crate) shards: usize,
    /// Prefill grid: new tokens, comma-separated and increasing
    /// (default 1,8,16,32,64,128,256,512).
    #[arg(long, value_delimiter = ',')]
    pub(crate) prefill: Vec<u32>,
    /// Decode grid: cached context tokens, comma-separated and increasing
    /// (default 1,16,64,128,256,512,1024).
    #[arg(long, value_delimiter = ',')]
    pub(crate) decode: Vec<u32>,
    /// Runs per grid point; the median is kept.
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: u32,
    /// Seed of the weights.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The profile file to write.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

pub(crate) fn profile_run(a: &ProfileArgs) -> ExitCode {
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
