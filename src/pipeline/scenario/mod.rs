//! Pipeline scenarios: one TOML file with a top-level `[pipeline]` table (see docs/live.md,
//! "Pipeline scenarios: simulated and live").
//!
//! ```toml
//! name = "pipeline_small_2shard"
//! seed = 1
//! policies = ["cached", "stateless"]   # decode modes, compared like policies
//! mode = "sim"                         # or "live": real candle tensors on ractor actors
//!
//! [pipeline]
//! model = "small"                      # tiny, tiny-qwen, small, mistral-7b-instruct-v0.2, qwen2.5-0.5b
//! shards = 2                           # or layers = [[0, 4], [4, 8]]
//! max_sessions = 16                    # per shard session cache
//! session_ttl_s = 600.0
//! max_active_sessions = 1              # sessions the head runs at once
//! cost = "analytic"                    # or "profile" with profile = "path.toml"
//!
//! [pipeline.gpu]                       # analytic cost only: the device of every shard
//! ...
//! [pipeline.link]                      # head <-> shards and shard -> shard
//! bandwidth_gb_per_s = 10.0
//! latency_us = 10.0
//!
//! [workload]
//! requests = 16
//! prompt_tokens = 64
//! output_tokens = 64
//! arrival_rate_per_s = 1.0             # Poisson arrivals, or closed_loop = true: each of
//!                                      # max_active_sessions clients sends its next request
//!                                      # when the previous one ends
//! ```
//!
//! Errors name the file, the dotted key and what was expected, like those of serving
//! scenarios; a `[sweep]` table works the same way.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod raw;
mod tables;

use raw::*;

use super::RestartAt;
use crate::exec::TransformerConfig;
use crate::hardware::{GpuSpec, LinkSpec};
use crate::model::ModelConfig;
use crate::model::profile::Profile;
use crate::pipeline::shard::{CacheLimits, DecodeMode};
use crate::scenario::sweep::sweep_texts;
use crate::scenario::{Check, Document, ScenarioError};
use crate::sim::kernel::Limits;
use crate::units::Nanos;

/// Largest prompt or output of a pipeline request.
pub const MAX_PIPELINE_TOKENS: u32 = 1 << 16;
/// Most sessions a shard cache or the head may hold.
pub const MAX_SESSIONS: usize = 1 << 16;
/// Most shards of a route.
pub const MAX_SHARDS: usize = 256;
/// Most prompt tokens a trace may hold in all: the head keeps every prompt (256 MiB of ids),
/// and each simulation running in parallel has its own head.
pub const MAX_TRACE_TOKENS: u64 = 1 << 26;
/// Longest sequence (prompt and output) of a live run: a stateless pass attends over all of
/// it, and its causal mask alone takes `4 n^2` bytes (256 MiB at this length).
pub const MAX_LIVE_TOKENS: u32 = 8192;
/// Largest model a live run loads: its f32 weights, in bytes (16 GiB).
pub const MAX_LIVE_WEIGHT_BYTES: u64 = 16 << 30;
pub use crate::scenario::MAX_WALL_S;

/// Where the shards' step durations come from in a simulation.
#[derive(Clone, Debug, PartialEq)]
pub enum CostSource {
    /// The roofline cost model on `gpu`, plus `overhead` per step.
    Analytic { gpu: GpuSpec, overhead: Nanos },
    /// Times measured on the real backend by `meshsim profile` (one [`crate::model::profile::ShardProfile`]
    /// per layer range of the scenario), read from `path`.
    Profile { path: PathBuf, profile: Profile },
}

/// The workload of a pipeline scenario: requests with seeded prompts of `prompt_tokens`
/// tokens, or with the given texts, tokenized.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineWorkload {
    pub requests: u32,
    /// The length of seeded prompts (the longest given prompt when `prompts` is set).
    pub prompt_tokens: u32,
    /// Tokenized prompt texts, request `i` taking text `i mod len`; ids are taken modulo the
    /// model's vocabulary (seeded weights belong to no tokenizer).
    pub prompts: Option<Vec<Vec<u32>>>,
    pub output_tokens: u32,
    pub arrivals: Arrivals,
}

/// When requests arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// A Poisson process at this rate (requests/s).
    Poisson(f64),
    /// `max_active_sessions` clients, each sending its next request as soon as its previous
    /// one ends (a benchmark's "max concurrency"); arrival times are when that happens.
    ClosedLoop,
}

/// A validated pipeline scenario.
#[derive(Clone, Debug)]
pub struct PipelineScenario {
    pub name: String,
    /// The file's exact text, copied into the results.
    pub text: String,
    /// The folder of the scenario file (relative paths in it are resolved against it).
    pub dir: PathBuf,
    pub seed: u64,
    pub modes: Vec<DecodeMode>,
    /// Run on the live host instead of the simulator.
    pub live: bool,
    pub model: TransformerConfig,
    /// Bytes per element of weights, activations and KV: 4 (`dtype = "f32"`, the default and
    /// what candle runs) or 2 (`"bf16"`, analytic simulations only).
    pub bytes_per_element: u64,
    pub layers: Vec<Range<usize>>,
    pub cache: CacheLimits,
    pub max_active: usize,
    pub max_waiting: usize,
    pub cost: CostSource,
    /// All shards share one device (a live run's CPU): their steps run one at a time. Otherwise
    /// each shard has its own device on its own node.
    pub shared_device: bool,
    pub link: LinkSpec,
    pub workload: PipelineWorkload,
    pub restarts: Vec<RestartAt>,
    pub limits: Limits,
    pub max_wall: Duration,
    /// The points of the scenario's `[sweep]`; empty when nothing is swept.
    pub points: Vec<PipelinePoint>,
    /// `[live] nodes`: the `meshsim node` processes (`HOST:PORT`) a live run places its
    /// shards on (`crate::pipeline::cluster`); empty: one process.
    pub nodes: Vec<String>,
    /// `[live] cookie_file`, resolved against the scenario's folder.
    pub cookie_file: Option<PathBuf>,
}

/// One point of a sweep.
#[derive(Clone, Debug)]
pub struct PipelinePoint {
    pub label: String,
    pub scenario: PipelineScenario,
}

/// The policy name of a decode mode in results.
pub fn mode_name(m: DecodeMode) -> &'static str {
    match m {
        DecodeMode::Cached => "cached",
        DecodeMode::Stateless => "stateless",
    }
}

/// Scenario `text` with `mode = "live"`, for the results of `meshsim run --live`: the copy in
/// the results folder then says how the run was made, and re-running it runs live again.
/// An existing top-level `mode` line is replaced; otherwise the key goes first.
pub fn with_live_mode(text: &str) -> String {
    const LINE: &str = "mode = \"live\"                          # set by `meshsim run --live`";
    let has_mode = text
        .parse::<toml::Table>()
        .map(|t| t.contains_key("mode"))
        .unwrap_or(false);
    if !has_mode {
        return format!("{LINE}\n{text}");
    }
    let mut out = String::with_capacity(text.len() + LINE.len());
    let mut in_table = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        in_table |= t.starts_with('[');
        let key = t.split('=').next().unwrap_or("").trim();
        if !in_table && key == "mode" {
            out.push_str(LINE);
            out.push('\n');
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Whether scenario `text` is a pipeline scenario (it has a top-level `pipeline` table).
pub fn is_pipeline(text: &str) -> bool {
    text.parse::<toml::Table>()
        .map(|t| matches!(t.get("pipeline"), Some(toml::Value::Table(_))))
        .unwrap_or(false)
}

impl PipelineScenario {
    /// Reads and validates a pipeline scenario file.
    pub fn load(path: &Path) -> Result<PipelineScenario, ScenarioError> {
        let (file, text, stem) = crate::scenario::read_file(path, "pipeline")?;
        let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        PipelineScenario::parse(&file, &stem, &dir, &text)
    }

    /// Parses and validates `text`; `dir` resolves relative paths.
    pub fn parse(
        file: &str,
        default_name: &str,
        dir: &Path,
        text: &str,
    ) -> Result<PipelineScenario, ScenarioError> {
        PipelineScenario::parse_document(file, default_name, dir, Document::parse(file, text)?)
    }

    /// [`PipelineScenario::parse`] of a document already parsed as TOML.
    pub(crate) fn parse_document(
        file: &str,
        default_name: &str,
        dir: &Path,
        doc: Document<'_>,
    ) -> Result<PipelineScenario, ScenarioError> {
        let text = doc.text();
        let raw: Raw = doc.deserialize(file)?;
        let sweep = raw.sweep.clone();
        let mut s = validate(file, default_name, dir, text, raw)?;
        if s.live {
            s.check_live(file)?;
        }
        if let Some(sweep) = sweep {
            for p in sweep_texts(file, text, &sweep)? {
                let mut scenario = PipelineScenario::parse(file, &s.name, dir, &p.text)
                    .map_err(|e| p.locate(file, e))?;
                scenario.name = s.name.clone();
                s.points.push(PipelinePoint {
                    label: p.label,
                    scenario,
                });
            }
            if s.points.iter().any(|p| p.scenario.live != s.live) {
                return Err(Check { file }.err("sweep", "a sweep cannot change `mode`"));
            }
        }
        Ok(s)
    }

    /// Sets the seed of the scenario and of every sweep point.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
        for p in &mut self.points {
            p.scenario.seed = seed;
        }
    }

    /// The points to run: the sweep's, or the scenario itself.
    pub fn runs(&self) -> Vec<(Option<&str>, &PipelineScenario)> {
        if self.points.is_empty() {
            vec![(None, self)]
        } else {
            self.points
                .iter()
                .map(|p| (Some(p.label.as_str()), &p.scenario))
                .collect()
        }
    }

    /// Checks what a live run needs beyond a simulation: f32, a model whose weights fit
    /// [`MAX_LIVE_WEIGHT_BYTES`], sequences within [`MAX_LIVE_TOKENS`]. Called for `mode =
    /// "live"` files and for `meshsim run --live`.
    pub fn check_live(&self, file: &str) -> Result<(), ScenarioError> {
        let c = Check { file };
        if self.bytes_per_element != 4 {
            return Err(c.err(
                "pipeline.dtype",
                "the candle backend of live runs computes in f32",
            ));
        }
        let weights = self.model.model_config(4).weight_bytes();
        if weights > MAX_LIVE_WEIGHT_BYTES {
            return Err(c.err(
                "pipeline.model",
                format!(
                    "{} has {:.1} GiB of f32 weights; live runs load at most {} GiB",
                    self.model.name,
                    weights as f64 / (1u64 << 30) as f64,
                    MAX_LIVE_WEIGHT_BYTES >> 30
                ),
            ));
        }
        let w = &self.workload;
        if w.prompt_tokens + w.output_tokens > MAX_LIVE_TOKENS {
            return Err(c.err(
                "workload.output_tokens",
                format!(
                    "prompts of up to {} tokens plus {} output tokens exceed the {MAX_LIVE_TOKENS} \
                     tokens of a live sequence",
                    w.prompt_tokens, w.output_tokens
                ),
            ));
        }
        crate::scenario::check_cookie(&c, &self.nodes, self.cookie_file.as_deref())?;
        for p in &self.points {
            p.scenario.check_live(file)?;
        }
        Ok(())
    }

    /// The model numbers the sim backend needs, at this scenario's element size.
    pub fn model_config(&self) -> ModelConfig {
        self.model.model_config(self.bytes_per_element)
    }
}

fn validate(
    file: &str,
    default_name: &str,
    dir: &Path,
    text: &str,
    r: Raw,
) -> Result<PipelineScenario, ScenarioError> {
    let c = Check { file };
    let name = c.name(r.name, default_name)?;
    let modes = tables::modes(&c, &r.policies)?;
    let p = &r.pipeline;
    let model = tables::model(&c, &p.model)?;
    let layers = tables::layers(&c, p, &model)?;
    let (cache, max_active) = tables::sessions(&c, p)?;
    let live = r.mode == RawHostMode::Live;
    let bytes_per_element = match p.dtype {
        RawDtype::F32 => 4,
        RawDtype::Bf16 => 2,
    };
    if p.dtype != RawDtype::F32 && p.cost == RawCost::Profile {
        return Err(c.err(
            "pipeline.dtype",
            "profiles measure the candle backend, which computes in f32; bf16 is for \
             analytic simulations",
        ));
    }
    let cost = tables::cost(&c, p, dir, &layers)?;
    let link = tables::link(&c, &p.link)?;
    let workload = tables::workload(&c, &r.workload, dir, &model)?;
    let faults = crate::scenario::fault::faults(&c, &r.fault, None)?;
    let serving_only = ["node-crash", "store-restart", "link-slow", "gpu-slow"];
    crate::scenario::fault::refuse(&c, &faults, "pipeline", &serving_only)?;
    let restarts = tables::restarts(&c, p, &r.workload, layers.len(), &faults)?;
    let (limits, max_wall) = tables::limits(&c, &r.limits)?;
    let nodes = live_nodes(&c, &r.live.nodes)?;
    let cookie_file = r.live.cookie_file.as_ref().map(|f| dir.join(f));
    Ok(PipelineScenario {
        name,
        text: text.to_string(),
        dir: dir.to_path_buf(),
        seed: r.seed,
        modes,
        live,
        model,
        bytes_per_element,
        layers,
        cache,
        max_active,
        max_waiting: p.max_waiting_requests,
        cost,
        shared_device: p.shared_device,
        link,
        workload,
        restarts,
        limits,
        max_wall,
        points: Vec::new(),
        nodes,
        cookie_file,
    })
}

pub use crate::scenario::MAX_NODES;
pub(crate) use crate::scenario::live_nodes;
