//! Scenarios: one TOML file describes a whole experiment (hardware, model, serving, workload,
//! policies, limits). It is parsed once into typed, validated values ("parse, don't
//! validate"); nothing downstream sees a string or re-checks a number.
//!
//! Errors name the file, the key path (`hardware.gpu.memory_gib`) and what was expected; a
//! syntax error also gives the line and column. Unknown keys are errors, so a misspelt key or
//! a key with the wrong unit (`memory_gb` for `memory_gib`) is caught, not ignored.

pub(crate) mod raw;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;

use crate::hardware::{GpuSpec, HardwareSpec, HostSpec, LinkSpec, NetworkSpec, Place, SsdSpec};
use crate::model::ModelConfig;
use crate::model::cost::CostModel;
use crate::serving::instance::InstanceConfig;
use crate::serving::policy::PolicyKind;
use crate::serving::router::RouterStrategy;
use crate::serving::store::{EvoStoreConfig, PtStoreConfig, StoreConfig};
use crate::sim::kernel::Limits;
use crate::units::{GB, GIB, Nanos};
use crate::workload::WorkloadSpec;
use crate::workload::qa::{ContextMode, Dataset, Order, OutputDist, QaWorkload};
use crate::workload::replay::{DEFAULT_SYSTEM_PROMPT, QaOptions, ReplaySpec, Source};
use raw::*;

/// A scenario that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// Dotted key path, empty for errors about the whole file.
    pub key: String,
    pub message: String,
    pub line_col: Option<(usize, usize)>,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((l, c)) = self.line_col {
            write!(f, ":{l}:{c}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ScenarioError {}

/// Serving parameters, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Serving {
    pub tensor_parallel: u32,
    pub router: RouterStrategy,
    pub instance: InstanceConfig,
    pub iteration_overhead: Nanos,
}

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// The file's exact text, copied into the results.
    pub text: String,
    pub seed: u64,
    pub policies: Vec<PolicyKind>,
    pub hardware: HardwareSpec,
    pub model: ModelConfig,
    pub serving: Serving,
    pub workload: WorkloadSpec,
    pub store: StoreConfig,
    pub limits: Limits,
    /// The points of the scenario's `[sweep]`, each a whole validated scenario; empty when
    /// nothing is swept.
    pub points: Vec<SweepPoint>,
}

/// One point of a sweep.
#[derive(Clone, Debug)]
pub struct SweepPoint {
    /// `key=value` for each swept key (last path segment), space-separated.
    pub label: String,
    pub scenario: Scenario,
}

/// Most parameters one sweep may vary.
pub const MAX_SWEEP_AXES: usize = 2;
/// Most points one sweep may have.
pub const MAX_SWEEP_POINTS: usize = 256;

/// Longest scenario name: it names the results folder, and file names have at most 255 bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// Largest number of requests a scenario may ask for.
pub const MAX_REQUESTS: u32 = 10_000_000;
/// Largest number of tokens of a context window or an output.
pub const MAX_TOKENS: u32 = 1 << 20;
/// Largest cluster.
pub const MAX_GPUS: u32 = 65_536;
/// Largest latency of any link or switch (1 s): anything above is a unit mistake.
pub const MAX_LATENCY_NS: u64 = 1_000_000_000;
/// Most KV blocks one instance may have (each costs 32 bytes of bookkeeping).
pub const MAX_BLOCKS_PER_INSTANCE: u32 = 1 << 24;
/// Most KV blocks all instances together may have.
pub const MAX_BLOCKS_TOTAL: u64 = 1 << 27;

pub(crate) struct Check<'a> {
    pub(crate) file: &'a str,
}

impl Check<'_> {
    pub(crate) fn err(&self, key: &str, message: impl Into<String>) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            key: key.to_string(),
            message: message.into(),
            line_col: None,
        }
    }

    /// The scenario's name (or `default_name`): it names the results folder, so it must be a
    /// file name on every system, with room for the suffixes meshsim adds (`_live`, and the
    /// `.partial-<pid>` of the folder being written).
    pub(crate) fn name(
        &self,
        name: Option<String>,
        default_name: &str,
    ) -> Result<String, ScenarioError> {
        let name = name.unwrap_or_else(|| default_name.to_string());
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
            && !name.starts_with('.');
        if !ok {
            return Err(self.err(
                "name",
                format!(
                    "expected letters, digits, '-', '_' or '.' (it names the results folder), \
                     found {name:?}"
                ),
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(self.err(
                "name",
                format!(
                    "expected at most {MAX_NAME_BYTES} characters (it names the results folder), \
                     found {} characters",
                    name.len()
                ),
            ));
        }
        Ok(name)
    }

    pub(crate) fn positive(&self, key: &str, v: f64) -> Result<f64, ScenarioError> {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(self.err(key, format!("expected a positive number, found {v}")))
        }
    }

    pub(crate) fn fraction(&self, key: &str, v: f64) -> Result<f64, ScenarioError> {
        if v.is_finite() && v > 0.0 && v <= 1.0 {
            Ok(v)
        } else {
            Err(self.err(key, format!("expected a fraction in (0, 1], found {v}")))
        }
    }

    pub(crate) fn count(&self, key: &str, v: u32, max: u32) -> Result<u32, ScenarioError> {
        if (1..=max).contains(&v) {
            Ok(v)
        } else {
            Err(self.err(
                key,
                format!("expected an integer from 1 to {max}, found {v}"),
            ))
        }
    }

    pub(crate) fn latency(&self, key: &str, ns: u64) -> Result<Nanos, ScenarioError> {
        if ns <= MAX_LATENCY_NS {
            Ok(Nanos(ns))
        } else {
            Err(self.err(
                key,
                format!("expected at most {MAX_LATENCY_NS} ns (1 s), found {ns}"),
            ))
        }
    }

    pub(crate) fn link(&self, key: &str, l: &RawLink) -> Result<LinkSpec, ScenarioError> {
        Ok(LinkSpec {
            bandwidth: self.positive(&format!("{key}.bandwidth_gb_per_s"), l.bandwidth_gb_per_s)?
                * GB,
            latency: self.latency(&format!("{key}.latency_ns"), l.latency_ns)?,
        })
    }
}

pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ScenarioError {
            file: file.clone(),
            key: String::new(),
            message: format!("cannot read: {e}"),
            line_col: None,
        })?;
        let text = String::from_utf8(bytes).map_err(|e| ScenarioError {
            file: file.clone(),
            key: String::new(),
            message: format!("not valid UTF-8 (byte {})", e.utf8_error().valid_up_to()),
            line_col: None,
        })?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into());
        Scenario::parse(&file, &stem, text)
    }

    /// Parses and validates scenario `text`; `file` names it in errors and `default_name`
    /// is used when the file has no `name` key.
    pub fn parse(file: &str, default_name: &str, text: &str) -> Result<Scenario, ScenarioError> {
        let raw: Raw = deserialize(file, text)?;
        let sweep = raw.sweep.clone();
        let mut s = validate(file, default_name, text, raw)?;
        if let Some(sweep) = sweep {
            s.points = sweep_points(file, &s.name, text, &sweep)?;
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

    /// Number of serving instances (one per tensor-parallel group of GPUs).
    pub fn instances(&self) -> u32 {
        self.hardware.total_gpus() / self.serving.tensor_parallel
    }

    /// Where instance `i` runs: the first GPU of its group.
    pub fn instance_place(&self, i: u32) -> Place {
        let per_node = self.hardware.gpus_per_node / self.serving.tensor_parallel;
        Place::Gpu {
            node: i / per_node,
            gpu: (i % per_node) * self.serving.tensor_parallel,
        }
    }

    pub fn cost_model(&self) -> CostModel {
        CostModel::new(
            self.model.clone(),
            self.hardware.gpu.clone(),
            self.hardware.nvlink,
            self.serving.tensor_parallel,
            self.serving.iteration_overhead,
        )
    }
}

/// Deserializes scenario `text` into `T`; a TOML or type error names the file, the line and
/// column, and the dotted key.
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    file: &str,
    text: &str,
) -> Result<T, ScenarioError> {
    let toml_err = |key: String, e: &toml::de::Error| ScenarioError {
        file: file.to_string(),
        key,
        message: e.message().trim_end().to_string(),
        line_col: e.span().map(|s| line_col(text, s.start)),
    };
    let de = toml::Deserializer::parse(text).map_err(|e| toml_err(String::new(), &e))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." { String::new() } else { path };
        toml_err(key, e.inner())
    })
}

/// A validated GPU from its raw table at `key`.
pub(crate) fn gpu_spec(c: &Check, key: &str, g: &RawGpu) -> Result<GpuSpec, ScenarioError> {
    let k = |f: &str| format!("{key}.{f}");
    Ok(GpuSpec {
        name: g.name.clone(),
        memory_bytes: (c.positive(&k("memory_gib"), g.memory_gib)? * GIB as f64) as u64,
        memory_bandwidth: c
            .positive(&k("memory_bandwidth_gb_per_s"), g.memory_bandwidth_gb_per_s)?
            * GB,
        peak_flops: c.positive(&k("peak_tflops"), g.peak_tflops)? * 1e12,
        compute_efficiency: c.fraction(&k("compute_efficiency"), g.compute_efficiency)?,
        memory_efficiency: c.fraction(&k("memory_efficiency"), g.memory_efficiency)?,
    })
}

/// KV memory of one instance: what its GPUs hold beyond the weights and the reserve.
fn kv_bytes_per_instance(hw: &HardwareSpec, model: &ModelConfig, tp: u32, reserve: u64) -> i128 {
    tp as i128 * hw.gpu.memory_bytes as i128
        - model.weight_bytes() as i128
        - tp as i128 * reserve as i128
}

fn validate(file: &str, default_name: &str, text: &str, r: Raw) -> Result<Scenario, ScenarioError> {
    let c = Check { file };
    let name = c.name(r.name, default_name)?;
    if r.policies.is_empty() {
        return Err(c.err("policies", "expected at least one policy"));
    }
    let mut policies = r.policies.clone();
    policies.sort();
    policies.dedup();
    if policies.len() != r.policies.len() {
        return Err(c.err("policies", "a policy is listed twice"));
    }

    let h = &r.hardware;
    c.count("hardware.nodes", h.nodes, MAX_GPUS)?;
    c.count("hardware.gpus_per_node", h.gpus_per_node, 64)?;
    if h.nodes.saturating_mul(h.gpus_per_node) > MAX_GPUS {
        return Err(c.err(
            "hardware.nodes",
            format!("more than {MAX_GPUS} GPUs in all"),
        ));
    }
    let gpu = gpu_spec(&c, "hardware.gpu", &h.gpu)?;
    let host = HostSpec {
        memory_bytes: (c.positive("hardware.host.memory_gib", h.host.memory_gib)? * GIB as f64)
            as u64,
        memory_bandwidth: c.positive(
            "hardware.host.memory_bandwidth_gb_per_s",
            h.host.memory_bandwidth_gb_per_s,
        )? * GB,
    };
    let ssd = SsdSpec {
        drives: c.count("hardware.ssd.drives", h.ssd.drives, 64)?,
        capacity_bytes_per_drive: (c.positive(
            "hardware.ssd.capacity_gb_per_drive",
            h.ssd.capacity_gb_per_drive,
        )? * GB) as u64,
        read_bandwidth_per_drive: c.positive(
            "hardware.ssd.read_bandwidth_gb_per_s_per_drive",
            h.ssd.read_bandwidth_gb_per_s_per_drive,
        )? * GB,
        write_bandwidth_per_drive: c.positive(
            "hardware.ssd.write_bandwidth_gb_per_s_per_drive",
            h.ssd.write_bandwidth_gb_per_s_per_drive,
        )? * GB,
        latency: Nanos::from_secs_f64(
            c.positive("hardware.ssd.latency_us", h.ssd.latency_us)? / 1e6,
        ),
    };
    let network = NetworkSpec {
        nics_per_node: c.count(
            "hardware.network.nics_per_node",
            h.network.nics_per_node,
            64,
        )?,
        nic: LinkSpec {
            bandwidth: c.positive(
                "hardware.network.nic_bandwidth_gbit_per_s",
                h.network.nic_bandwidth_gbit_per_s,
            )? * GB
                / 8.0,
            latency: c.latency("hardware.network.nic_latency_ns", h.network.nic_latency_ns)?,
        },
        switch_latency: c.latency(
            "hardware.network.switch_latency_ns",
            h.network.switch_latency_ns,
        )?,
        switch_hops: if h.network.switch_hops <= 64 {
            h.network.switch_hops
        } else {
            return Err(c.err(
                "hardware.network.switch_hops",
                format!("expected at most 64, found {}", h.network.switch_hops),
            ));
        },
    };
    let hardware = HardwareSpec {
        nodes: h.nodes,
        gpus_per_node: h.gpus_per_node,
        gpu,
        host,
        ssd,
        pcie: c.link("hardware.pcie", &h.pcie)?,
        nvlink: c.link("hardware.nvlink", &h.nvlink)?,
        network,
    };

    let model = match crate::model::preset(&r.model.preset) {
        Some(p) => p.model.clone(),
        None => {
            return Err(c.err(
                "model.preset",
                format!(
                    "unknown model {:?}; expected one of {}",
                    r.model.preset,
                    crate::model::catalogue::names()
                ),
            ));
        }
    };

    let s = &r.serving;
    let tp = c.count("serving.tensor_parallel", s.tensor_parallel, 64)?;
    if !hardware.gpus_per_node.is_multiple_of(tp) {
        return Err(c.err(
            "serving.tensor_parallel",
            format!(
                "expected a divisor of hardware.gpus_per_node ({}), found {tp}",
                hardware.gpus_per_node
            ),
        ));
    }
    let block_size = c.count("serving.block_size_tokens", s.block_size_tokens, 1024)?;
    if s.memory_reserve_gib.is_nan() || s.memory_reserve_gib < 0.0 {
        return Err(c.err(
            "serving.memory_reserve_gib",
            format!(
                "expected zero or a positive number, found {}",
                s.memory_reserve_gib
            ),
        ));
    }
    let reserve = (s.memory_reserve_gib * GIB as f64) as u64;
    let kv = kv_bytes_per_instance(&hardware, &model, tp, reserve);
    let block_bytes = block_size as i128 * model.kv_bytes_per_token() as i128;
    if kv < block_bytes {
        let gib = |b: f64| b / GIB as f64;
        return Err(c.err(
            "model.preset",
            format!(
                "{} does not fit: {:.2} GiB of weights over {tp} GPU(s) plus {:.2} GiB reserve \
                 per GPU leave no KV memory in {:.2} GiB (hardware.gpu.memory_gib); use bigger \
                 GPUs, a larger serving.tensor_parallel or a smaller model",
                model.name,
                gib(model.weight_bytes() as f64),
                s.memory_reserve_gib,
                gib(hardware.gpu.memory_bytes as f64),
            ),
        ));
    }
    let blocks = kv / block_bytes;
    let instances = (hardware.total_gpus() / tp) as i128;
    if blocks > MAX_BLOCKS_PER_INSTANCE as i128 || blocks * instances > MAX_BLOCKS_TOTAL as i128 {
        return Err(c.err(
            "serving.block_size_tokens",
            format!(
                "{blocks} KV blocks per instance x {instances} instances exceeds the limit of \
                 {MAX_BLOCKS_PER_INSTANCE} per instance and {MAX_BLOCKS_TOTAL} in all; use larger blocks"
            ),
        ));
    }
    let num_blocks = blocks as u32;
    if s.iteration_overhead_us.is_nan() || s.iteration_overhead_us < 0.0 {
        return Err(c.err(
            "serving.iteration_overhead_us",
            format!(
                "expected zero or a positive number, found {}",
                s.iteration_overhead_us
            ),
        ));
    }
    let serving = Serving {
        tensor_parallel: tp,
        router: s.router,
        instance: InstanceConfig {
            block_size,
            num_blocks,
            max_num_seqs: c.count("serving.max_num_seqs", s.max_num_seqs, 65_536)?,
            max_batched_tokens: c.count(
                "serving.max_batched_tokens",
                s.max_batched_tokens,
                MAX_TOKENS,
            )?,
            max_waiting: c.count(
                "serving.max_waiting_requests",
                s.max_waiting_requests,
                MAX_REQUESTS,
            )?,
        },
        iteration_overhead: Nanos::from_secs_f64(s.iteration_overhead_us / 1e6),
    };

    let workload = workload(&c, file, &r.workload)?;
    if let WorkloadSpec::Generated(w) = &workload
        && u64::from(w.max_prompt_tokens()) > model.max_context
    {
        return Err(c.err(
            "workload.context_tokens",
            format!(
                "prompts of up to {} tokens (system prompt, context and question) do not fit in \
                 the context of {} ({} tokens)",
                w.max_prompt_tokens(),
                model.name,
                model.max_context
            ),
        ));
    }
    if model.vocab < 4 {
        return Err(c.err("model.preset", "vocabulary too small to generate prompts"));
    }

    let store = validate_store(&c, &r.store, &hardware, &model, block_size)?;

    let l = &r.limits;
    if l.max_events == 0 {
        return Err(c.err("limits.max_events", "expected a positive integer, found 0"));
    }
    if l.max_pending_events == 0 {
        return Err(c.err(
            "limits.max_pending_events",
            "expected a positive integer, found 0",
        ));
    }
    let limits = Limits {
        max_events: l.max_events,
        max_time: Nanos::from_secs_f64(c.positive("limits.max_sim_time_s", l.max_sim_time_s)?),
        max_pending: l.max_pending_events.min(usize::MAX as u64) as usize,
    };

    Ok(Scenario {
        name,
        text: text.to_string(),
        seed: r.seed,
        policies: r.policies,
        hardware,
        model,
        serving,
        workload,
        store,
        limits,
        points: Vec::new(),
    })
}

/// Expands `[sweep]`: every combination of the listed values (the first key varies slowest),
/// each applied to the file's other keys and validated as a whole scenario.
fn sweep_points(
    file: &str,
    name: &str,
    text: &str,
    sweep: &toml::Table,
) -> Result<Vec<SweepPoint>, ScenarioError> {
    sweep_texts(file, text, sweep)?
        .into_iter()
        .map(|p| {
            let scenario = Scenario::parse(file, name, &p.text).map_err(|e| p.locate(file, e))?;
            Ok(SweepPoint {
                label: p.label,
                scenario,
            })
        })
        .collect()
}

/// One point of a `[sweep]`: its label, its scenario text and its swept values.
pub(crate) struct SweepText {
    /// `key=value` for each swept key (last path segment), space-separated.
    pub(crate) label: String,
    /// The scenario of the point, without the `[sweep]` table.
    pub(crate) text: String,
    /// The point's value of each swept key.
    values: Vec<SweptValue>,
}

/// A swept key's value at one point, as the scenario file writes it.
struct SweptValue {
    key: String,
    /// The value's text in the file (`2048`, `"round-robin"`).
    written: String,
    /// Its line and column in the file.
    at: Option<(usize, usize)>,
}

impl SweepText {
    /// `e`, an error in this point's scenario, placed in the scenario file `file`: at the
    /// swept value of the key it names (or the point's first value; the point's own text is
    /// in no file), and naming the point's keys and values as written.
    pub(crate) fn locate(&self, file: &str, e: ScenarioError) -> ScenarioError {
        let related = |k: &str| {
            !e.key.is_empty()
                && (e.key == k
                    || e.key.starts_with(&format!("{k}."))
                    || k.starts_with(&format!("{}.", e.key)))
        };
        let at = self
            .values
            .iter()
            .find(|v| related(&v.key))
            .or(self.values.first());
        let written: Vec<String> = self
            .values
            .iter()
            .map(|v| format!("\"{}\" = {}", v.key, v.written))
            .collect();
        ScenarioError {
            line_col: if e.file == file {
                at.and_then(|v| v.at)
            } else {
                e.line_col
            },
            message: format!(
                "{} (sweep point {}: {})",
                e.message,
                self.label,
                written.join(", ")
            ),
            ..e
        }
    }
}

/// The byte range in `text` of each value of each `[sweep]` list, by key; empty when the
/// table is not a table of lists.
fn sweep_spans(text: &str) -> BTreeMap<String, Vec<Range<usize>>> {
    #[derive(serde::Deserialize)]
    struct File {
        sweep: Option<BTreeMap<String, Vec<toml::Spanned<toml::Value>>>>,
    }
    toml::from_str::<File>(text)
        .ok()
        .and_then(|f| f.sweep)
        .map(|s| {
            s.into_iter()
                .map(|(k, v)| (k, v.iter().map(toml::Spanned::span).collect()))
                .collect()
        })
        .unwrap_or_default()
}

/// The points of a `[sweep]` table: every combination of the listed values (the first key
/// varies slowest) applied to the file's other keys, with the `[sweep]` table removed. Any
/// kind of scenario validates the texts itself. A value listed twice for one key is an error
/// (two points would have one label).
pub(crate) fn sweep_texts(
    file: &str,
    text: &str,
    sweep: &toml::Table,
) -> Result<Vec<SweepText>, ScenarioError> {
    let spans = sweep_spans(text);
    // The value `i` of `key` as written in the file, and its line and column.
    let written = |key: &str, i: usize, v: &toml::Value| match spans.get(key).and_then(|s| s.get(i))
    {
        Some(r) => (
            text[r.clone()].trim().to_string(),
            Some(line_col(text, r.start)),
        ),
        None => (v.to_string(), None),
    };
    let err = |key: &str, message: String| ScenarioError {
        file: file.to_string(),
        key: if key.is_empty() {
            "sweep".to_string()
        } else {
            format!("sweep.\"{key}\"")
        },
        message,
        line_col: None,
    };
    if sweep.is_empty() || sweep.len() > MAX_SWEEP_AXES {
        return Err(err(
            "",
            format!(
                "expected 1 to {MAX_SWEEP_AXES} keys to sweep, found {}",
                sweep.len()
            ),
        ));
    }
    let shown = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut axes: Vec<(&str, &Vec<toml::Value>)> = Vec::new();
    for (key, values) in sweep {
        match values {
            toml::Value::Array(v) if !v.is_empty() => axes.push((key, v)),
            _ => {
                return Err(err(key, "expected a non-empty list of values".into()));
            }
        }
    }
    for (key, values) in &axes {
        for (i, v) in values.iter().enumerate() {
            if let Some(first) = values[..i].iter().position(|u| shown(u) == shown(v)) {
                let (again, at) = written(key, i, v);
                let (before, _) = written(key, first, &values[first]);
                let before = if before == again {
                    String::new()
                } else {
                    format!(" (as {before} before it)")
                };
                return Err(ScenarioError {
                    line_col: at,
                    ..err(
                        key,
                        format!(
                            "{again} is listed twice{before}: the label `{}={}` would name two \
                             points",
                            key.rsplit('.').next().unwrap_or(key),
                            shown(v)
                        ),
                    )
                });
            }
        }
    }
    let total: usize = axes.iter().map(|(_, v)| v.len()).product();
    if total > MAX_SWEEP_POINTS {
        return Err(err(
            "",
            format!("{total} points; at most {MAX_SWEEP_POINTS} are allowed"),
        ));
    }
    let mut base: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| err("", e.message().to_string()))?;
    base.remove("sweep");
    let mut points = Vec::with_capacity(total);
    for i in 0..total {
        let mut t = base.clone();
        let mut label = Vec::new();
        let mut values = Vec::new();
        let mut rest = i;
        for (key, list) in axes.iter().rev() {
            let j = rest % list.len();
            let v = &list[j];
            rest /= list.len();
            set_path(&mut t, key, v.clone()).map_err(|m| err(key, m))?;
            label.push(format!(
                "{}={}",
                key.rsplit('.').next().unwrap_or(key),
                shown(v)
            ));
            let (written, at) = written(key, j, v);
            values.push(SweptValue {
                key: key.to_string(),
                written,
                at,
            });
        }
        label.reverse();
        values.reverse();
        let point_text = toml::to_string(&t).map_err(|e| err("", e.to_string()))?;
        points.push(SweepText {
            label: label.join(" "),
            text: point_text,
            values,
        });
    }
    Ok(points)
}

/// Sets the dotted `path` in `t` to `v`, creating missing tables.
fn set_path(t: &mut toml::Table, path: &str, v: toml::Value) -> Result<(), String> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().filter(|l| !l.is_empty()).ok_or("empty key")?;
    let mut cur = t;
    for p in parts {
        let next = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match next {
            toml::Value::Table(t) => t,
            _ => return Err(format!("`{p}` is not a table")),
        };
    }
    cur.insert(last.to_string(), v);
    Ok(())
}

fn output_dist(c: &Check, o: &RawOutput) -> Result<OutputDist, ScenarioError> {
    Ok(match *o {
        RawOutput::Fixed { tokens } => OutputDist::Fixed {
            tokens: c.count("workload.output_tokens.tokens", tokens, MAX_TOKENS)?,
        },
        RawOutput::Uniform { min, max } => {
            c.count("workload.output_tokens.min", min, MAX_TOKENS)?;
            c.count("workload.output_tokens.max", max, MAX_TOKENS)?;
            if min > max {
                return Err(c.err(
                    "workload.output_tokens.max",
                    format!("expected at least min ({min}), found {max}"),
                ));
            }
            OutputDist::Uniform { min, max }
        }
        RawOutput::Lognormal { median, sigma, max } => {
            let median = c.positive("workload.output_tokens.median", median)?;
            if !(sigma.is_finite() && sigma >= 0.0) {
                return Err(c.err(
                    "workload.output_tokens.sigma",
                    format!("expected zero or a positive number, found {sigma}"),
                ));
            }
            OutputDist::LogNormal {
                median,
                sigma,
                max: c.count("workload.output_tokens.max", max, MAX_TOKENS)?,
            }
        }
    })
}

/// The `[workload]` section: a generator (`dataset = ...`) or a replayed file
/// (`source = ...`), each with only the keys that apply to it.
fn workload(c: &Check, file: &str, w: &RawWorkload) -> Result<WorkloadSpec, ScenarioError> {
    let missing = |key: &str| c.err("workload", format!("missing field `{key}`"));
    let order = match w.order.unwrap_or_else(default_order) {
        RawOrder::Shuffled => Order::Shuffled,
        RawOrder::Grouped => Order::Grouped,
    };
    let context = match w.context.unwrap_or_else(default_context) {
        RawContext::Unit => ContextMode::Unit,
        RawContext::Window => ContextMode::Window {
            tokens: c.count(
                "workload.context_tokens",
                w.context_tokens.unwrap_or_else(default_context_tokens),
                MAX_TOKENS,
            )?,
        },
    };
    let source = match (w.dataset, w.source) {
        (Some(_), Some(_)) => {
            return Err(c.err(
                "workload.source",
                "expected either `dataset` (a built-in generator) or `source` (a file), not both",
            ));
        }
        (None, None) => return Err(missing("dataset")),
        (Some(dataset), None) => {
            for (key, set) in [
                ("path", w.path.is_some()),
                ("tokenizer", w.tokenizer.is_some()),
                ("skip_bad_lines", w.skip_bad_lines.is_some()),
                ("system_prompt", w.system_prompt.is_some()),
            ] {
                if set {
                    return Err(c.err(
                        &format!("workload.{key}"),
                        "only used when replaying a file (`source = ...`)",
                    ));
                }
            }
            let output = output_dist(
                c,
                w.output_tokens
                    .as_ref()
                    .ok_or_else(|| missing("output_tokens"))?,
            )?;
            let system_prompt_tokens = w
                .system_prompt_tokens
                .unwrap_or_else(default_system_prompt_tokens);
            if system_prompt_tokens > MAX_TOKENS {
                return Err(c.err(
                    "workload.system_prompt_tokens",
                    format!("expected at most {MAX_TOKENS}, found {system_prompt_tokens}"),
                ));
            }
            return Ok(WorkloadSpec::Generated(QaWorkload {
                dataset: match dataset {
                    RawDataset::Squad => Dataset::Squad,
                    RawDataset::Wikiqa => Dataset::Wikiqa,
                },
                requests: c.count(
                    "workload.requests",
                    w.requests.ok_or_else(|| missing("requests"))?,
                    MAX_REQUESTS,
                )?,
                arrival_rate_per_s: c.positive(
                    "workload.arrival_rate_per_s",
                    w.arrival_rate_per_s
                        .ok_or_else(|| missing("arrival_rate_per_s"))?,
                )?,
                order,
                context,
                system_prompt_tokens,
                output,
            }));
        }
        (None, Some(s)) => match s {
            RawSource::SquadJson => Source::SquadJson,
            RawSource::WikiqaTsv => Source::WikiqaTsv,
            RawSource::MooncakeJsonl => Source::MooncakeJsonl,
            RawSource::VidurCsv => Source::VidurCsv,
            RawSource::Canonical => Source::Canonical,
        },
    };
    if w.system_prompt_tokens.is_some() {
        return Err(c.err(
            "workload.system_prompt_tokens",
            "only used by the built-in generators; a replayed dataset takes `system_prompt` (text)",
        ));
    }
    let base = Path::new(file).parent().unwrap_or(Path::new(""));
    let resolve = |p: &str| base.join(p);
    let path = resolve(w.path.as_deref().ok_or_else(|| missing("path"))?);
    let max_requests = match w.requests {
        Some(n) => Some(c.count("workload.requests", n, MAX_REQUESTS)?),
        None => None,
    };
    let qa = if source.is_dataset() {
        let system_prompt = w
            .system_prompt
            .clone()
            .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string());
        QaOptions {
            arrival_rate_per_s: c.positive(
                "workload.arrival_rate_per_s",
                w.arrival_rate_per_s
                    .ok_or_else(|| missing("arrival_rate_per_s"))?,
            )?,
            order,
            context,
            system_prompt,
            output: output_dist(
                c,
                w.output_tokens
                    .as_ref()
                    .ok_or_else(|| missing("output_tokens"))?,
            )?,
        }
    } else {
        for (key, set) in [
            ("tokenizer", w.tokenizer.is_some()),
            ("system_prompt", w.system_prompt.is_some()),
            ("arrival_rate_per_s", w.arrival_rate_per_s.is_some()),
            ("order", w.order.is_some()),
            ("context", w.context.is_some()),
            ("context_tokens", w.context_tokens.is_some()),
            ("output_tokens", w.output_tokens.is_some()),
        ] {
            if set {
                return Err(c.err(
                    &format!("workload.{key}"),
                    format!(
                        "not used by source {:?}: the trace gives arrival times, prompts and \
                         output lengths",
                        source.name()
                    ),
                ));
            }
        }
        QaOptions::default()
    };
    if matches!(source, Source::SquadJson | Source::Canonical) && w.skip_bad_lines.is_some() {
        return Err(c.err(
            "workload.skip_bad_lines",
            format!("not supported by source {:?}", source.name()),
        ));
    }
    Ok(WorkloadSpec::Replay(ReplaySpec {
        source,
        path,
        tokenizer: w.tokenizer.as_deref().map(resolve),
        max_requests,
        skip_bad_lines: w.skip_bad_lines.unwrap_or(false),
        qa,
    }))
}

fn non_negative(c: &Check, key: &str, v: f64) -> Result<f64, ScenarioError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(c.err(
            key,
            format!("expected zero or a positive number, found {v}"),
        ))
    }
}

fn validate_store(
    c: &Check,
    s: &RawStore,
    hw: &HardwareSpec,
    model: &ModelConfig,
    block_size: u32,
) -> Result<StoreConfig, ScenarioError> {
    let tokens = c.count("store.tensor_tokens", s.tensor_tokens, MAX_TOKENS)?;
    if !tokens.is_multiple_of(block_size) {
        return Err(c.err(
            "store.tensor_tokens",
            format!(
                "expected a multiple of serving.block_size_tokens ({block_size}), found {tokens}"
            ),
        ));
    }
    let tensor_bytes = tokens as u64 * model.kv_bytes_per_token();
    let host = c.positive("store.host_capacity_gib", s.host_capacity_gib)? * GIB as f64;
    if host > hw.host.memory_bytes as f64 || (host as u64) < tensor_bytes {
        return Err(c.err(
            "store.host_capacity_gib",
            format!(
                "expected at least one tensor ({:.3} GiB) and at most hardware.host.memory_gib ({:.1}), found {}",
                tensor_bytes as f64 / GIB as f64,
                hw.host.memory_bytes as f64 / GIB as f64,
                s.host_capacity_gib
            ),
        ));
    }
    let drives = hw.ssd.drives as u64 * hw.ssd.capacity_bytes_per_drive;
    let ssd = match s.ssd_capacity_gb {
        None => drives,
        Some(gb) => {
            let b = non_negative(c, "store.ssd_capacity_gb", gb)? * GB;
            if b > drives as f64 {
                return Err(c.err(
                    "store.ssd_capacity_gb",
                    format!(
                        "expected at most the drives' {:.0} GB, found {gb}",
                        drives as f64 / GB
                    ),
                ));
            }
            b as u64
        }
    };
    let us = |key: &str, v: f64| -> Result<Nanos, ScenarioError> {
        Ok(Nanos::from_secs_f64(non_negative(c, key, v)? / 1e6))
    };
    let f = s.ptstore.replica_fraction;
    if !(f.is_finite() && (0.0..1.0).contains(&f)) {
        return Err(c.err(
            "store.ptstore.replica_fraction",
            format!("expected a fraction in [0, 1), found {f}"),
        ));
    }
    Ok(StoreConfig {
        tensor_tokens: tokens,
        host_capacity_bytes: host as u64,
        ssd_capacity_bytes: ssd,
        metadata_service: us("store.metadata_service_us", s.metadata_service_us)?,
        fetch_request_overhead: us(
            "store.fetch_request_overhead_us",
            s.fetch_request_overhead_us,
        )?,
        fetch_segment_overhead: us(
            "store.fetch_segment_overhead_us",
            s.fetch_segment_overhead_us,
        )?,
        gpu_prefix_cache: s.gpu_prefix_cache,
        evostore: EvoStoreConfig {
            eviction: s.evostore.eviction,
        },
        ptstore: PtStoreConfig {
            eviction: s.ptstore.eviction,
            replica_fraction: f,
            replicate_after_reads: (s.ptstore.replicate_after_reads > 0)
                .then_some(s.ptstore.replicate_after_reads),
            consolidate: s.ptstore.consolidate,
        },
    })
}
