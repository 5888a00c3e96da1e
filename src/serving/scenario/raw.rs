//! The scenario file as written: serde structs that mirror the TOML, with units in key names.
//! Unknown keys are errors everywhere. [`super::validate`] turns these into typed values.

use serde::Deserialize;

pub use crate::scenario::hardware::RawHardware;

use crate::serving::router::RouterStrategy;
use crate::serving::store::eviction::Eviction;
use crate::serving::store::{LoadChoice, LoadOverlap};

fn default_seed() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub name: Option<String>,
    #[serde(default)]
    pub mode: RawMode,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Names of presets or of `[policy.NAME]` tables.
    pub policies: Vec<String>,
    /// `[policy.NAME]`: compositions (see [`super::policy`]).
    #[serde(default)]
    pub policy: std::collections::BTreeMap<String, super::policy::RawPolicy>,
    pub hardware: RawHardware,
    pub model: RawModel,
    #[serde(default)]
    pub serving: RawServing,
    pub workload: RawWorkload,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub limits: RawLimits,
    /// Parameters to sweep: dotted key paths, each with a list of values.
    pub sweep: Option<toml::Table>,
    /// `[[fault]]`: faults to inject (see `crate::fault`).
    #[serde(default)]
    pub fault: Vec<crate::scenario::fault::RawFault>,
    /// `[live]`: the `meshsim node`s a live run places its instances and store servers on.
    #[serde(default)]
    pub live: RawLive,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLive {
    /// `HOST:PORT` of each `meshsim node`; empty: every actor in this process.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// The cluster's cookie, relative to the scenario's folder.
    pub cookie_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub tensor_tokens: u32,
    pub host_capacity_gib: f64,
    /// Per node; all drives when absent.
    pub ssd_capacity_gb: Option<f64>,
    pub metadata_service_us: f64,
    pub fetch_request_overhead_us: f64,
    pub fetch_segment_overhead_us: f64,
    pub gpu_prefix_cache: bool,
    /// `"none"` or `"layerwise"` (see [`LoadOverlap`]).
    pub load_overlap: LoadOverlap,
    /// `"always"` or `"when-faster"` (see [`LoadChoice`]).
    pub load: LoadChoice,
    /// How long a lookup holds what it plans to load (see `Directory::set_lease`).
    pub read_lease_ms: f64,
    pub evostore: RawEvoStore,
    pub ptstore: RawPtStore,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            tensor_tokens: 256,
            host_capacity_gib: 256.0,
            ssd_capacity_gb: None,
            metadata_service_us: 5.0,
            fetch_request_overhead_us: 10.0,
            fetch_segment_overhead_us: 2.0,
            gpu_prefix_cache: true,
            load_overlap: LoadOverlap::None,
            load: LoadChoice::Always,
            read_lease_ms: 5000.0,
            evostore: RawEvoStore::default(),
            ptstore: RawPtStore::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawEvoStore {
    pub eviction: Eviction,
}

impl Default for RawEvoStore {
    fn default() -> Self {
        RawEvoStore {
            eviction: Eviction::Lru,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPtStore {
    pub eviction: Eviction,
    pub replica_fraction: f64,
    /// 0 disables replication.
    pub replicate_after_reads: u32,
    pub consolidate: bool,
}

impl Default for RawPtStore {
    fn default() -> Self {
        RawPtStore {
            eviction: Eviction::Gdsf,
            replica_fraction: 0.25,
            replicate_after_reads: 2,
            consolidate: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// A name of the model catalogue ([`crate::model::preset`]).
    pub preset: String,
    /// The element type of weights and KV: `"bf16"` (the default, as served), `"f16"` or
    /// `"f32"` (what the candle backend of live runs computes in).
    pub dtype: Option<String>,
}

/// `mode`: simulate the scenario, or run it on the live host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawMode {
    #[default]
    Sim,
    Live,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServing {
    pub tensor_parallel: u32,
    pub router: RouterStrategy,
    pub block_size_tokens: u32,
    pub max_num_seqs: u32,
    pub max_batched_tokens: u32,
    pub memory_reserve_gib: f64,
    pub iteration_overhead_us: f64,
    pub max_waiting_requests: u32,
    /// `kv-aware` and `kv-approx` routing's weight of the blocks to prefill against the load.
    pub kv_overlap_weight: f64,
    /// `kv-aware` routing's credit of a block the store can load from host memory, and from
    /// SSD, against a GPU hit's 1.
    pub kv_host_credit: f64,
    pub kv_disk_credit: f64,
    /// `kv-aware` routing: how long instances and the store gather KV events before they
    /// publish them (0: every engine step).
    pub kv_event_interval_ms: f64,
    /// A measured profile of the serving batch backend (`meshsim profile --serving`), relative
    /// to the scenario file: iterations are priced by it instead of the roofline.
    pub profile: Option<String>,
    /// Every instance computes on one device, one iteration at a time (a live run's CPU).
    pub shared_device: bool,
}

impl Default for RawServing {
    /// vLLM's defaults where it has one: 16-token blocks, 256 sequences, 8192 batched tokens
    /// (chunked prefill). The reserve stands for `gpu_memory_utilization = 0.9` on a 40 GiB GPU.
    fn default() -> Self {
        RawServing {
            tensor_parallel: 1,
            router: RouterStrategy::RoundRobin,
            block_size_tokens: 16,
            max_num_seqs: 256,
            max_batched_tokens: 8192,
            memory_reserve_gib: 4.0,
            iteration_overhead_us: 1000.0,
            max_waiting_requests: 100_000,
            kv_overlap_weight: 1.0,
            kv_host_credit: 0.8,
            kv_disk_credit: 0.8,
            kv_event_interval_ms: 0.0,
            profile: None,
            shared_device: false,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawDataset {
    Squad,
    Wikiqa,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawOrder {
    Shuffled,
    Grouped,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawContext {
    Unit,
    Window,
}

/// The workload section: a built-in generator (`dataset`) or a replayed file (`source`).
/// Which keys apply depends on which; [`super::validate`] checks that.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkload {
    pub dataset: Option<RawDataset>,
    pub source: Option<RawSource>,
    pub path: Option<String>,
    pub tokenizer: Option<String>,
    pub skip_bad_lines: Option<bool>,
    pub skip_too_long: Option<bool>,
    pub system_prompt: Option<String>,
    pub requests: Option<u32>,
    pub arrival_rate_per_s: Option<f64>,
    pub order: Option<RawOrder>,
    pub context: Option<RawContext>,
    pub context_tokens: Option<u32>,
    pub system_prompt_tokens: Option<u32>,
    pub output_tokens: Option<RawOutput>,
    pub reuse: Option<RawReuse>,
}

/// `[workload.reuse]`: a pool of contexts, their popularity, reuse distance and turns.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReuse {
    pub contexts: Option<u32>,
    pub min_context_tokens: Option<u32>,
    pub questions_per_context: Option<u32>,
    pub popularity: Option<RawPopularity>,
    pub zipf_alpha: Option<f64>,
    pub reuse_distance: Option<f64>,
    pub turns: Option<u32>,
    pub turn_gap_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawPopularity {
    Uniform,
    Zipf,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawSource {
    SquadJson,
    WikiqaTsv,
    MooncakeJsonl,
    VidurCsv,
    Canonical,
}

pub fn default_order() -> RawOrder {
    RawOrder::Shuffled
}
pub fn default_context() -> RawContext {
    RawContext::Window
}
pub fn default_context_tokens() -> u32 {
    4096
}
pub fn default_system_prompt_tokens() -> u32 {
    32
}

#[derive(Debug, Deserialize)]
#[serde(tag = "distribution", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RawOutput {
    Fixed { tokens: u32 },
    Uniform { min: u32, max: u32 },
    Lognormal { median: f64, sigma: f64, max: u32 },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    pub max_events: u64,
    pub max_sim_time_s: f64,
    pub max_pending_events: u64,
    /// Live runs: the wall-clock limit of one policy's run.
    pub max_wall_s: f64,
}

impl Default for RawLimits {
    fn default() -> Self {
        let l = crate::sim::kernel::Limits::default();
        RawLimits {
            max_events: l.max_events,
            max_sim_time_s: l.max_time.as_secs_f64(),
            max_pending_events: l.max_pending as u64,
            max_wall_s: 3600.0,
        }
    }
}
