//! Serving scenarios: one TOML file describes a whole experiment of the serving system
//! (hardware, model, serving, workload, store, policies, limits). The shared parts of every
//! scenario (deserializer, value checks, hardware tables, sweeps) are in `crate::scenario`;
//! this module validates the file table by table: `[hardware]`
//! (`crate::scenario::hardware`), `[model]` and `[serving]` (here), `[workload]`
//! (`workload.rs`), `[store]` (`store.rs`) and `[limits]` (here).

pub mod policy;
pub(crate) mod raw;
mod store;
mod workload;

use std::path::Path;

use crate::fault::Fault;
use crate::hardware::{HardwareSpec, Place};
use crate::model::ModelConfig;
use crate::model::batch_profile::BatchFit;
use crate::model::cost::CostModel;
use crate::scenario::hardware::hardware;
use crate::scenario::sweep::sweep_texts;
use crate::scenario::{Check, Document, MAX_REQUESTS, MAX_TOKENS, MAX_WALL_S, ScenarioError};
use crate::serving::instance::InstanceConfig;
use crate::serving::policy::Policy;
use crate::serving::router::RouterStrategy;
use crate::serving::store::StoreConfig;
use crate::sim::kernel::{Limits, MAX_EVENTS, MAX_PENDING};
use crate::units::{GIB, Nanos};
use crate::workload::WorkloadSpec;
use raw::*;
use store::validate_store;
use workload::workload;

/// Serving parameters, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Serving {
    pub tensor_parallel: u32,
    pub router: RouterStrategy,
    /// `kv-aware` routing: weight of the blocks to prefill against the load (see
    /// [`crate::serving::kv_routing`]).
    pub kv_overlap_weight: f64,
    /// `kv-aware` routing: credits of blocks the store can load from host memory and from SSD
    /// (see [`crate::serving::router::kv_index`]).
    pub kv_host_credit: f64,
    pub kv_disk_credit: f64,
    /// `kv-aware` routing: how long KV events are gathered before they are published.
    pub kv_event_interval: Nanos,
    pub instance: InstanceConfig,
    pub iteration_overhead: Nanos,
    /// `serving.profile`: the file, and the fitted iteration model that prices iterations
    /// instead of the roofline.
    pub profile: Option<(std::path::PathBuf, BatchFit)>,
    /// `serving.shared_device`: every instance's iterations run on one device, one at a
    /// time (the simulation queues them on one device; a live run holds one lock). For live
    /// runs on a machine whose instances share its processor.
    pub shared_device: bool,
}

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// The file's exact text, copied into the results.
    pub text: String,
    pub seed: u64,
    /// The policies to run, resolved to their compositions, in the order listed.
    pub policies: Vec<Policy>,
    pub hardware: HardwareSpec,
    pub model: ModelConfig,
    pub serving: Serving,
    pub workload: WorkloadSpec,
    pub store: StoreConfig,
    pub limits: Limits,
    /// The points of the scenario's `[sweep]`, each a whole validated scenario; empty when
    /// nothing is swept.
    pub points: Vec<SweepPoint>,
    /// Faults to inject (`[[fault]]`), in file order.
    pub faults: Vec<Fault>,
    /// Run on the live host (`mode = "live"` or `meshsim run --live`) instead of simulating.
    pub live: bool,
    /// Live runs: the wall-clock limit of one policy's run (`limits.max_wall_s`).
    pub max_wall: std::time::Duration,
    /// `[live] nodes` (or `--nodes`): the `meshsim node` processes a live run places each
    /// scenario node's instances and store server on; empty: one process.
    pub nodes: Vec<String>,
    /// `[live] cookie_file` (or `--cookie-file`), resolved against the scenario's folder.
    pub cookie_file: Option<std::path::PathBuf>,
}

/// One point of a sweep.
#[derive(Clone, Debug)]
pub struct SweepPoint {
    /// `key=value` for each swept key (last path segment), space-separated.
    pub label: String,
    pub scenario: Scenario,
}

/// Most KV blocks one instance may have (a used block costs 16 bytes of record and 16 of hash
/// index; the pool's block ids need 30 bits at most).
pub const MAX_BLOCKS_PER_INSTANCE: u32 = 1 << 24;
/// Most KV blocks all instances together may have.
pub const MAX_BLOCKS_TOTAL: u64 = 1 << 27;

impl Scenario {
    /// The preset called `name` with this scenario's `[store]` figures (whether listed or
    /// not); `None` for a name that is not a preset.
    pub fn preset(&self, name: &str) -> Option<crate::serving::policy::Policy> {
        let setting = policy::setting(&self.store, &self.hardware, &self.serving, &self.model);
        crate::serving::policy::preset(name, &setting)
    }

    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let (file, text, stem) = crate::scenario::read_file(path, "scenario")?;
        Scenario::parse(&file, &stem, &text)
    }

    /// Parses and validates scenario `text`; `file` names it in errors and `default_name`
    /// is used when the file has no `name` key.
    pub fn parse(file: &str, default_name: &str, text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse_document(file, default_name, Document::parse(file, text)?)
    }

    /// [`Scenario::parse`] of a document already parsed as TOML.
    pub(crate) fn parse_document(
        file: &str,
        default_name: &str,
        doc: Document<'_>,
    ) -> Result<Scenario, ScenarioError> {
        let text = doc.text();
        let raw: Raw = doc.deserialize(file)?;
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

    /// The points to run, with their labels: the sweep's, or the scenario itself.
    pub fn runs(&self) -> Vec<(Option<&str>, &Scenario)> {
        if self.points.is_empty() {
            vec![(None, self)]
        } else {
            self.points
                .iter()
                .map(|p| (Some(p.label.as_str()), &p.scenario))
                .collect()
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

    /// How a simulation prices an instance's iterations: the measured profile
    /// (`serving.profile`) if the scenario has one, else the roofline [`Scenario::cost_model`].
    pub fn batch_backend(&self) -> crate::backend::SimBatchBackend {
        match &self.serving.profile {
            Some((_, fit)) => {
                crate::backend::SimBatchBackend::profiled(*fit, self.serving.iteration_overhead)
            }
            None => crate::backend::SimBatchBackend::new(self.cost_model()),
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

/// `serving.profile`: a profile file with a `[serving]` table for this model, in f32, with
/// this block size.
fn serving_profile(
    c: &Check,
    file: &str,
    path: &str,
    model: &ModelConfig,
    serving: &Serving,
) -> Result<(std::path::PathBuf, BatchFit), ScenarioError> {
    let key = "serving.profile";
    let base = Path::new(file).parent().unwrap_or(Path::new(""));
    let full = base.join(path);
    let p = crate::model::profile::Profile::load(&full).map_err(|e| c.err(key, e.to_string()))?;
    let Some(b) = &p.serving else {
        return Err(c.err(
            key,
            format!(
                "{} has no [serving] table: make it with `meshsim profile --serving`",
                full.display()
            ),
        ));
    };
    if p.model != model.name {
        return Err(c.err(
            key,
            format!(
                "{} profiles {}, not {}",
                full.display(),
                p.model,
                model.name
            ),
        ));
    }
    if model.bytes_per_element != 4 || p.dtype != "f32" {
        return Err(c.err(
            key,
            "a profile of the candle backend (f32) prices only an f32 model: set model.dtype = \"f32\"",
        ));
    }
    if b.block_size != serving.instance.block_size {
        return Err(c.err(
            key,
            format!(
                "{} was measured with blocks of {} tokens, not serving.block_size_tokens = {}",
                full.display(),
                b.block_size,
                serving.instance.block_size
            ),
        ));
    }
    Ok((full, b.fit()))
}

/// KV memory of one instance: what its GPUs hold beyond the weights and the reserve.
fn kv_bytes_per_instance(hw: &HardwareSpec, model: &ModelConfig, tp: u32, reserve: u64) -> i128 {
    tp as i128 * hw.gpu.memory_bytes as i128
        - model.weight_bytes() as i128
        - tp as i128 * reserve as i128
}

/// Validates a deserialized scenario table by table: policies, `[hardware]`, `[model]`,
/// `[serving]`, `[workload]`, `[store]`, `[limits]`, `[[fault]]` and `[live]`.
fn validate(file: &str, default_name: &str, text: &str, r: Raw) -> Result<Scenario, ScenarioError> {
    let c = Check { file };
    let name = c.name(r.name, default_name)?;

    let hardware = hardware(&c, &r.hardware)?;

    let model = model(&c, &r.model)?;

    let mut serving = serving(&c, &r.serving, &hardware, &model)?;
    if let Some(p) = &r.serving.profile {
        serving.profile = Some(serving_profile(&c, file, p, &model, &serving)?);
    }

    let workload = workload(&c, file, &r.workload)?;
    check_prompts_fit(&c, &workload, &model)?;
    if model.vocab < 4 {
        return Err(c.err("model.preset", "vocabulary too small to generate prompts"));
    }

    let store = validate_store(&c, &r.store, &hardware, &model, serving.instance.block_size)?;
    let bounds = policy::Bounds {
        hw: &hardware,
        model: &model,
        block_size: serving.instance.block_size,
    };
    let setting = policy::setting(&store, &hardware, &serving, &model);
    let policies = policy::policies(&c, &r.policies, &r.policy, &setting, &bounds)?;

    let limits = limits(&c, &r.limits)?;
    check_arrival_span(&c, &workload, &limits)?;
    let nodes = (hardware.nodes, hardware.gpus_per_node);
    let faults = crate::scenario::fault::faults(&c, &r.fault, Some(nodes))?;
    crate::scenario::fault::refuse(&c, &faults, "serving", &["shard-restart"])?;

    Ok(Scenario {
        name,
        text: text.to_string(),
        seed: r.seed,
        policies,
        hardware,
        model,
        serving,
        workload,
        store,
        limits,
        points: Vec::new(),
        faults,
        live: r.mode == RawMode::Live,
        nodes: crate::scenario::live_nodes(&c, &r.live.nodes)?,
        cookie_file: r
            .live
            .cookie_file
            .as_ref()
            .map(|f| Path::new(file).parent().unwrap_or(Path::new("")).join(f)),
        max_wall: max_wall(&c, r.limits.max_wall_s)?,
    })
}

/// Refuses a generated workload whose longest prompt does not fit in the model's context.
fn check_prompts_fit(
    c: &Check,
    workload: &WorkloadSpec,
    model: &ModelConfig,
) -> Result<(), ScenarioError> {
    if let WorkloadSpec::Generated(w) = workload
        && u64::from(w.max_prompt_tokens()) > model.max_context
    {
        let turns = w.reuse.as_ref().map_or(1, |r| r.turns);
        let (key, parts) = if turns > 1 {
            (
                "workload.reuse.turns",
                format!("system prompt, context, and {turns} turns of questions and answers"),
            )
        } else {
            (
                "workload.context_tokens",
                "system prompt, context and question".to_string(),
            )
        };
        return Err(c.err(
            key,
            format!(
                "prompts of up to {} tokens ({parts}) do not fit in the context of {} ({} \
                 tokens)",
                w.max_prompt_tokens(),
                model.name,
                model.max_context
            ),
        ));
    }
    Ok(())
}

/// Refuses a generated workload whose arrivals' expected span is beyond the simulated time
/// limit: a trace that cannot fit is refused before it is built.
fn check_arrival_span(
    c: &Check,
    workload: &WorkloadSpec,
    limits: &Limits,
) -> Result<(), ScenarioError> {
    if let WorkloadSpec::Generated(w) = workload {
        let turns = w
            .reuse
            .as_ref()
            .map_or(0.0, |r| f64::from(r.turns.saturating_sub(1)) * r.turn_gap_s);
        let span = f64::from(w.requests) / w.arrival_rate_per_s + turns;
        if span > limits.max_time.as_secs_f64() {
            return Err(c.err(
                "workload.arrival_rate_per_s",
                format!(
                    "{} requests at {} per second arrive over about {span:.0} s, beyond \
                     limits.max_sim_time_s = {}: raise the rate or the limit, or ask for fewer \
                     requests",
                    w.requests,
                    w.arrival_rate_per_s,
                    limits.max_time.as_secs_f64()
                ),
            ));
        }
    }
    Ok(())
}

/// `limits.max_wall_s`: positive and at most [`MAX_WALL_S`].
fn max_wall(c: &Check, max_wall_s: f64) -> Result<std::time::Duration, ScenarioError> {
    let w = c.positive("limits.max_wall_s", max_wall_s)?;
    if w > MAX_WALL_S {
        return Err(c.err(
            "limits.max_wall_s",
            format!(
                "{w} s is more than a week ({} s): a unit mistake?",
                MAX_WALL_S
            ),
        ));
    }
    Ok(std::time::Duration::from_secs_f64(w))
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

/// The `[model]` table: a preset of the model catalogue.
fn model(c: &Check, m: &RawModel) -> Result<ModelConfig, ScenarioError> {
    let bytes = match m.dtype.as_deref() {
        None | Some("bf16") | Some("f16") => 2,
        Some("f32") => 4,
        Some(other) => {
            return Err(c.err(
                "model.dtype",
                format!("unknown element type {other:?}; expected \"bf16\", \"f16\" or \"f32\""),
            ));
        }
    };
    match crate::model::preset(&m.preset) {
        Some(p) => Ok(ModelConfig {
            bytes_per_element: bytes,
            ..p.model.clone()
        }),
        None => Err(c.err(
            "model.preset",
            format!(
                "unknown model {:?}; expected one of {}",
                m.preset,
                crate::model::catalogue::names()
            ),
        )),
    }
}

/// The KV routers' keys of `[serving]`: the overlap weight, the tier credits and the event
/// interval.
fn kv_routing(c: &Check, s: &RawServing) -> Result<(f64, f64, f64, Nanos), ScenarioError> {
    let w = s.kv_overlap_weight;
    if !(w.is_finite() && (0.0..=1e6).contains(&w)) {
        return Err(c.err(
            "serving.kv_overlap_weight",
            format!("expected a number from 0 to 1e6, found {w}"),
        ));
    }
    for (key, v) in [
        ("serving.kv_host_credit", s.kv_host_credit),
        ("serving.kv_disk_credit", s.kv_disk_credit),
    ] {
        if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
            return Err(c.err(key, format!("expected a number from 0 to 1, found {v}")));
        }
    }
    let ms = s.kv_event_interval_ms;
    if !(ms.is_finite() && (0.0..=3.6e6).contains(&ms)) {
        return Err(c.err(
            "serving.kv_event_interval_ms",
            format!("expected a number of milliseconds from 0 to 3600000, found {ms}"),
        ));
    }
    let interval = Nanos((ms * 1e6).round() as u64);
    Ok((w, s.kv_host_credit, s.kv_disk_credit, interval))
}

/// The `[serving]` table: tensor parallelism, the KV block pool that fits beside the weights
/// (`num_blocks`, see [`crate::serving::instance`]), batching limits and the router.
fn serving(
    c: &Check,
    s: &RawServing,
    hardware: &HardwareSpec,
    model: &ModelConfig,
) -> Result<Serving, ScenarioError> {
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
    let kv = kv_bytes_per_instance(hardware, model, tp, reserve);
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
    let (w, host, disk, interval) = kv_routing(c, s)?;
    Ok(Serving {
        tensor_parallel: tp,
        router: s.router,
        kv_overlap_weight: w,
        kv_host_credit: host,
        kv_disk_credit: disk,
        kv_event_interval: interval,
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
        profile: None,
        shared_device: s.shared_device,
    })
}

/// The `[limits]` table of a simulation.
fn limits(c: &Check, l: &RawLimits) -> Result<Limits, ScenarioError> {
    if l.max_events == 0 {
        return Err(c.err("limits.max_events", "expected a positive integer, found 0"));
    }
    if l.max_events > MAX_EVENTS {
        return Err(c.err(
            "limits.max_events",
            format!("at most {MAX_EVENTS} events, found {}", l.max_events),
        ));
    }
    if l.max_pending_events == 0 {
        return Err(c.err(
            "limits.max_pending_events",
            "expected a positive integer, found 0",
        ));
    }
    if l.max_pending_events > MAX_PENDING as u64 {
        return Err(c.err(
            "limits.max_pending_events",
            format!(
                "at most {MAX_PENDING} events, found {}",
                l.max_pending_events
            ),
        ));
    }
    Ok(Limits {
        max_events: l.max_events,
        max_time: Nanos::from_secs_f64(c.positive("limits.max_sim_time_s", l.max_sim_time_s)?),
        max_pending: l.max_pending_events as usize,
    })
}
