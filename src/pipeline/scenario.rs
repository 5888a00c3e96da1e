//! Pipeline scenarios: one TOML file with a top-level `[pipeline]` table (see the README,
//! "Pipeline scenarios").
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

use serde::Deserialize;

use super::RestartAt;
use crate::exec::TransformerConfig;
use crate::hardware::{GpuSpec, LinkSpec};
use crate::model::ModelConfig;
use crate::model::profile::Profile;
use crate::pipeline::shard::{CacheLimits, DecodeMode};
use crate::scenario::hardware::{RawGpu, gpu_spec};
use crate::scenario::sweep::sweep_texts;
use crate::scenario::{Check, MAX_REQUESTS, ScenarioError, deserialize};
use crate::sim::kernel::Limits;
use crate::units::{GB, Nanos};

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
/// Longest wall-clock limit of a live run (a week).
pub const MAX_WALL_S: f64 = 7.0 * 86_400.0;

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

fn default_seed() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: Option<String>,
    #[serde(default = "default_seed")]
    seed: u64,
    policies: Vec<RawMode>,
    #[serde(default)]
    mode: RawHostMode,
    pipeline: RawPipeline,
    workload: RawWorkload,
    #[serde(default)]
    limits: RawLimits,
    sweep: Option<toml::Table>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
enum RawMode {
    Cached,
    Stateless,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum RawHostMode {
    #[default]
    Sim,
    Live,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum RawDtype {
    #[default]
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum RawCost {
    #[default]
    Analytic,
    Profile,
}

fn default_max_sessions() -> usize {
    16
}
fn default_ttl() -> f64 {
    600.0
}
fn default_active() -> usize {
    1
}
fn default_waiting() -> usize {
    10_000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    model: String,
    shards: Option<usize>,
    layers: Option<Vec<[usize; 2]>>,
    #[serde(default = "default_max_sessions")]
    max_sessions: usize,
    #[serde(default = "default_ttl")]
    session_ttl_s: f64,
    #[serde(default = "default_active")]
    max_active_sessions: usize,
    #[serde(default = "default_waiting")]
    max_waiting_requests: usize,
    #[serde(default)]
    cost: RawCost,
    #[serde(default)]
    dtype: RawDtype,
    #[serde(default)]
    shared_device: bool,
    profile: Option<String>,
    gpu: Option<RawGpu>,
    #[serde(default)]
    step_overhead_us: f64,
    link: RawPipeLink,
    #[serde(default)]
    restart: Vec<RawRestart>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeLink {
    bandwidth_gb_per_s: f64,
    latency_us: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRestart {
    shard: usize,
    request: u32,
    after_tokens: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    requests: u32,
    prompt_tokens: Option<u32>,
    prompts: Option<Vec<String>>,
    tokenizer: Option<String>,
    output_tokens: u32,
    arrival_rate_per_s: Option<f64>,
    #[serde(default)]
    closed_loop: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default = "default_max_events")]
    max_events: u64,
    #[serde(default = "default_max_sim_time")]
    max_sim_time_s: f64,
    #[serde(default = "default_max_wall")]
    max_wall_s: f64,
}

fn default_max_events() -> u64 {
    50_000_000
}
fn default_max_sim_time() -> f64 {
    86_400.0
}
fn default_max_wall() -> f64 {
    3_600.0
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            max_events: default_max_events(),
            max_sim_time_s: default_max_sim_time(),
            max_wall_s: default_max_wall(),
        }
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

/// Whether the file at `path` is a pipeline scenario (an unreadable file is not; loading it
/// then reports why).
pub fn is_pipeline_file(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| is_pipeline(&t))
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
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: file.clone(),
            key: String::new(),
            message: format!("cannot read: {e}"),
            line_col: None,
        })?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "pipeline".into());
        let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        PipelineScenario::parse(&file, &stem, &dir, text)
    }

    /// Parses and validates `text`; `dir` resolves relative paths.
    pub fn parse(
        file: &str,
        default_name: &str,
        dir: &Path,
        text: &str,
    ) -> Result<PipelineScenario, ScenarioError> {
        let raw: Raw = deserialize(file, text)?;
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
    if r.policies.is_empty() {
        return Err(c.err("policies", "expected \"cached\" and/or \"stateless\""));
    }
    let mut sorted = r.policies.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != r.policies.len() {
        return Err(c.err("policies", "a decode mode is listed twice"));
    }
    let modes = r
        .policies
        .iter()
        .map(|m| match m {
            RawMode::Cached => DecodeMode::Cached,
            RawMode::Stateless => DecodeMode::Stateless,
        })
        .collect();

    let p = &r.pipeline;
    let model = crate::exec::TransformerConfig::preset(&p.model).ok_or_else(|| {
        c.err(
            "pipeline.model",
            format!(
                "unknown model {:?}; expected one of {}",
                p.model,
                crate::model::catalogue::names()
            ),
        )
    })?;
    let layers = match (p.shards, &p.layers) {
        (Some(n), None) => {
            if n == 0 || n > model.layers || n > MAX_SHARDS {
                return Err(c.err(
                    "pipeline.shards",
                    format!(
                        "expected 1 to {} shards for {} layers, found {n}",
                        model.layers.min(MAX_SHARDS),
                        model.layers
                    ),
                ));
            }
            crate::model::split_layers(model.layers, n)
                .map_err(|e| c.err("pipeline.shards", e.to_string()))?
        }
        (None, Some(l)) => {
            let mut next = 0;
            for (i, [a, b]) in l.iter().enumerate() {
                if *a != next || b <= a {
                    return Err(c.err(
                        &format!("pipeline.layers[{i}]"),
                        format!("expected [{next}, end] with end > {next}, found [{a}, {b}]"),
                    ));
                }
                next = *b;
            }
            if next != model.layers || l.len() > MAX_SHARDS {
                return Err(c.err(
                    "pipeline.layers",
                    format!(
                        "the ranges must cover layers 0..{} in at most {MAX_SHARDS} shards",
                        model.layers
                    ),
                ));
            }
            l.iter().map(|[a, b]| *a..*b).collect()
        }
        _ => {
            return Err(c.err(
                "pipeline",
                "expected exactly one of `shards` (a count) and `layers` (ranges)",
            ));
        }
    };
    let sessions = |key: &str, v: usize| {
        if (1..=MAX_SESSIONS).contains(&v) {
            Ok(v)
        } else {
            Err(c.err(
                key,
                format!("expected an integer from 1 to {MAX_SESSIONS}, found {v}"),
            ))
        }
    };
    let cache = CacheLimits {
        max_sessions: sessions("pipeline.max_sessions", p.max_sessions)?,
        ttl: Nanos::from_secs_f64(c.positive("pipeline.session_ttl_s", p.session_ttl_s)?),
    };
    let max_active = sessions("pipeline.max_active_sessions", p.max_active_sessions)?;
    if p.max_waiting_requests > MAX_REQUESTS as usize {
        return Err(c.err(
            "pipeline.max_waiting_requests",
            format!("expected at most {MAX_REQUESTS}"),
        ));
    }
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
    let overhead_us = p.step_overhead_us;
    if !(overhead_us.is_finite() && overhead_us >= 0.0) {
        return Err(c.err(
            "pipeline.step_overhead_us",
            format!("expected a non-negative number, found {overhead_us}"),
        ));
    }
    let cost = match p.cost {
        RawCost::Analytic => {
            if p.profile.is_some() {
                return Err(c.err(
                    "pipeline.profile",
                    "a profile is only used with cost = \"profile\"",
                ));
            }
            let g = p.gpu.as_ref().ok_or_else(|| {
                c.err(
                    "pipeline.gpu",
                    "cost = \"analytic\" needs the shards' device as a [pipeline.gpu] table",
                )
            })?;
            CostSource::Analytic {
                gpu: gpu_spec(&c, "pipeline.gpu", g)?,
                overhead: Nanos::from_secs_f64(overhead_us * 1e-6),
            }
        }
        RawCost::Profile => {
            if p.gpu.is_some() || overhead_us != 0.0 {
                return Err(c.err(
                    "pipeline.gpu",
                    "[pipeline.gpu] and step_overhead_us belong to cost = \"analytic\"; \
                     a profile holds measured times",
                ));
            }
            let rel = p.profile.as_ref().ok_or_else(|| {
                c.err(
                    "pipeline.profile",
                    "cost = \"profile\" needs the path of a file written by `meshsim profile`",
                )
            })?;
            let path = dir.join(rel);
            let profile =
                Profile::load(&path).map_err(|e| c.err("pipeline.profile", e.to_string()))?;
            if profile.model != p.model {
                return Err(c.err(
                    "pipeline.profile",
                    format!(
                        "{} measures model {:?}, not {:?}",
                        path.display(),
                        profile.model,
                        p.model
                    ),
                ));
            }
            if profile.layer_ranges() != layers {
                return Err(c.err(
                    "pipeline.profile",
                    format!(
                        "{} measures shards {:?}, but the scenario splits the model into {:?}; \
                         measure this split with `meshsim profile --shards N`",
                        path.display(),
                        profile.layer_ranges(),
                        layers
                    ),
                ));
            }
            CostSource::Profile { path, profile }
        }
    };
    let link = LinkSpec {
        bandwidth: c.positive(
            "pipeline.link.bandwidth_gb_per_s",
            p.link.bandwidth_gb_per_s,
        )? * GB,
        latency: {
            let us = p.link.latency_us;
            if !(us.is_finite() && (0.0..=1e6).contains(&us)) {
                return Err(c.err(
                    "pipeline.link.latency_us",
                    format!("expected 0 to 1e6 microseconds, found {us}"),
                ));
            }
            Nanos::from_secs_f64(us * 1e-6)
        },
    };
    let w = &r.workload;
    c.count("workload.requests", w.requests, MAX_REQUESTS)?;
    let (prompt_tokens, prompts) = match (w.prompt_tokens, &w.prompts) {
        (Some(n), None) => {
            if w.tokenizer.is_some() {
                return Err(c.err("workload.tokenizer", "a tokenizer needs `prompts` (texts)"));
            }
            (
                c.count("workload.prompt_tokens", n, MAX_PIPELINE_TOKENS)?,
                None,
            )
        }
        (None, Some(texts)) if !texts.is_empty() => {
            let tok = crate::workload::tokenize::Tokenizer::load(
                w.tokenizer.as_ref().map(|t| dir.join(t)).as_deref(),
            )
            .map_err(|e| c.err("workload.tokenizer", e.to_string()))?;
            let mut ids = Vec::with_capacity(texts.len());
            for (i, t) in texts.iter().enumerate() {
                let p: Vec<u32> = tok
                    .encode(t)
                    .into_iter()
                    .map(|id| id % model.vocab as u32)
                    .collect();
                if p.is_empty() || p.len() > MAX_PIPELINE_TOKENS as usize {
                    return Err(c.err(
                        &format!("workload.prompts[{i}]"),
                        format!(
                            "expected 1 to {MAX_PIPELINE_TOKENS} tokens, found {}",
                            p.len()
                        ),
                    ));
                }
                ids.push(p);
            }
            let longest = ids.iter().map(Vec::len).max().unwrap_or(0) as u32;
            (longest, Some(ids))
        }
        _ => {
            return Err(c.err(
                "workload",
                "expected either prompt_tokens (seeded prompts) or prompts (a non-empty list of texts)",
            ));
        }
    };
    c.count(
        "workload.output_tokens",
        w.output_tokens,
        MAX_PIPELINE_TOKENS,
    )?;
    if w.requests as u64 * prompt_tokens as u64 > MAX_TRACE_TOKENS {
        return Err(c.err(
            "workload.requests",
            format!(
                "{} requests of {prompt_tokens} prompt tokens exceed the {MAX_TRACE_TOKENS} \
                 prompt tokens a trace may hold",
                w.requests
            ),
        ));
    }
    let workload = PipelineWorkload {
        requests: w.requests,
        prompt_tokens,
        prompts,
        output_tokens: w.output_tokens,
        arrivals: match (w.arrival_rate_per_s, w.closed_loop) {
            (Some(r), false) => Arrivals::Poisson(c.positive("workload.arrival_rate_per_s", r)?),
            (None, true) => Arrivals::ClosedLoop,
            _ => {
                return Err(c.err(
                    "workload",
                    "expected either arrival_rate_per_s (Poisson arrivals) or closed_loop = true",
                ));
            }
        },
    };
    let mut restarts = Vec::with_capacity(p.restart.len());
    for (i, x) in p.restart.iter().enumerate() {
        let key = |f: &str| format!("pipeline.restart[{i}].{f}");
        if x.shard >= layers.len() {
            return Err(c.err(
                &key("shard"),
                format!("expected a shard below {}, found {}", layers.len(), x.shard),
            ));
        }
        if x.request >= w.requests {
            return Err(c.err(
                &key("request"),
                format!(
                    "expected a request below {}, found {}",
                    w.requests, x.request
                ),
            ));
        }
        if w.output_tokens < 2 {
            return Err(c.err(
                &key("after_tokens"),
                "a restart falls between two generated tokens, and requests generate only one",
            ));
        }
        if x.after_tokens == 0 || x.after_tokens >= w.output_tokens {
            return Err(c.err(
                &key("after_tokens"),
                format!(
                    "expected 1 to {} (a restart between two tokens), found {}",
                    w.output_tokens - 1,
                    x.after_tokens
                ),
            ));
        }
        restarts.push(RestartAt {
            request: x.request,
            after_tokens: x.after_tokens,
            shard: x.shard,
        });
    }
    let l = &r.limits;
    if l.max_events == 0 {
        return Err(c.err("limits.max_events", "expected a positive integer"));
    }
    let limits = Limits {
        max_events: l.max_events,
        max_time: Nanos::from_secs_f64(c.positive("limits.max_sim_time_s", l.max_sim_time_s)?),
        max_pending: 1_000_000,
    };
    let wall = c.positive("limits.max_wall_s", l.max_wall_s)?;
    if wall > MAX_WALL_S {
        return Err(c.err(
            "limits.max_wall_s",
            format!("expected at most {MAX_WALL_S} s (a week), found {wall}"),
        ));
    }
    let max_wall = Duration::from_secs_f64(wall);
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
    })
}
