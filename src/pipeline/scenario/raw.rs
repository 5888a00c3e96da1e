//! The raw tables of a pipeline scenario file, as serde reads them (unknown keys are errors).

use serde::Deserialize;

use crate::scenario::hardware::RawGpu;

pub(super) fn default_seed() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Raw {
    pub(super) name: Option<String>,
    #[serde(default = "default_seed")]
    pub(super) seed: u64,
    pub(super) policies: Vec<RawMode>,
    #[serde(default)]
    pub(super) mode: RawHostMode,
    pub(super) pipeline: RawPipeline,
    pub(super) workload: RawWorkload,
    #[serde(default)]
    pub(super) limits: RawLimits,
    pub(super) sweep: Option<toml::Table>,
    /// `[[fault]]`: only `shard-restart` for pipelines.
    #[serde(default)]
    pub(super) fault: Vec<crate::scenario::fault::RawFault>,
    /// `[live]`: where a live run's shards go (`meshsim node` processes).
    #[serde(default)]
    pub(super) live: RawLive,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLive {
    /// `HOST:PORT` of each `meshsim node`; empty: every actor in this process.
    #[serde(default)]
    pub(super) nodes: Vec<String>,
    /// The cluster's cookie, relative to the scenario's folder.
    pub(super) cookie_file: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawMode {
    Cached,
    Stateless,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawHostMode {
    #[default]
    Sim,
    Live,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawDtype {
    #[default]
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawCost {
    #[default]
    Analytic,
    Profile,
}

pub(super) fn default_max_sessions() -> usize {
    16
}
pub(super) fn default_ttl() -> f64 {
    600.0
}
pub(super) fn default_active() -> usize {
    1
}
pub(super) fn default_waiting() -> usize {
    10_000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeline {
    pub(super) model: String,
    pub(super) shards: Option<usize>,
    pub(super) layers: Option<Vec<[usize; 2]>>,
    #[serde(default = "default_max_sessions")]
    pub(super) max_sessions: usize,
    #[serde(default = "default_ttl")]
    pub(super) session_ttl_s: f64,
    #[serde(default = "default_active")]
    pub(super) max_active_sessions: usize,
    #[serde(default = "default_waiting")]
    pub(super) max_waiting_requests: usize,
    #[serde(default)]
    pub(super) cost: RawCost,
    #[serde(default)]
    pub(super) dtype: RawDtype,
    #[serde(default)]
    pub(super) shared_device: bool,
    pub(super) profile: Option<String>,
    pub(super) gpu: Option<RawGpu>,
    #[serde(default)]
    pub(super) step_overhead_us: f64,
    pub(super) link: RawPipeLink,
    #[serde(default)]
    pub(super) restart: Vec<RawRestart>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeLink {
    pub(super) bandwidth_gb_per_s: f64,
    pub(super) latency_us: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRestart {
    pub(super) shard: usize,
    pub(super) request: u32,
    pub(super) after_tokens: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkload {
    pub(super) requests: u32,
    pub(super) prompt_tokens: Option<u32>,
    pub(super) prompts: Option<Vec<String>>,
    pub(super) tokenizer: Option<String>,
    pub(super) output_tokens: u32,
    pub(super) arrival_rate_per_s: Option<f64>,
    #[serde(default)]
    pub(super) closed_loop: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    #[serde(default = "default_max_events")]
    pub(super) max_events: u64,
    #[serde(default = "default_max_sim_time")]
    pub(super) max_sim_time_s: f64,
    #[serde(default = "default_max_wall")]
    pub(super) max_wall_s: f64,
}

pub(super) fn default_max_events() -> u64 {
    50_000_000
}
pub(super) fn default_max_sim_time() -> f64 {
    86_400.0
}
pub(super) fn default_max_wall() -> f64 {
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
