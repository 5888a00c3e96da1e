//! One way to run a scenario file of either system: `meshsim run` and `meshsim check` go
//! through [`Experiment`], which loads the file as a serving or a pipeline scenario (a
//! top-level `[pipeline]` table decides), runs it on the simulator (or, for pipelines, on the
//! live host), writes its results folder, and describes it for the console.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::live::LiveError;
use crate::metrics::Summary;
use crate::pipeline::outcome::PipelineRun;
use crate::pipeline::scenario::{Arrivals, CostSource, PipelineScenario, mode_name};
use crate::results::share::JobName;
use crate::results::{RunError, Written};
use crate::scenario::ScenarioError;
use crate::serving::outcome::PolicyRun;
use crate::serving::scenario::Scenario;
use crate::units::GIB;
use crate::workload::WorkloadSpec;

/// A validated scenario of either system.
#[derive(Clone, Debug)]
pub enum Experiment {
    Serving(Box<Scenario>),
    Pipeline(Box<PipelineScenario>),
}

/// The runs of an experiment, in order (sweep points, then policies or decode modes).
#[derive(Debug)]
pub enum Runs {
    Serving(Vec<PolicyRun>),
    Pipeline(Vec<PipelineRun>),
}

impl Runs {
    /// Each run's summary and wall-clock time (console only).
    pub fn summaries(&self) -> Vec<(&Summary, Duration)> {
        match self {
            Runs::Serving(r) => r.iter().map(|r| (&r.summary, r.wall)).collect(),
            Runs::Pipeline(r) => r.iter().map(|r| (&r.summary, r.wall)).collect(),
        }
    }
}

impl Experiment {
    /// Reads and parses a scenario file of either kind once, and validates it as the kind
    /// its text says (a top-level `[pipeline]` table makes it a pipeline scenario).
    pub fn load(path: &Path) -> Result<Experiment, ScenarioError> {
        let (file, text, stem) = crate::scenario::read_file(path, "scenario")?;
        let doc = crate::scenario::Document::parse(&file, &text)?;
        if doc.has_table("pipeline") {
            let dir = path.parent().unwrap_or(Path::new(""));
            PipelineScenario::parse_document(&file, &stem, dir, doc)
                .map(|s| Experiment::Pipeline(Box::new(s)))
        } else {
            Scenario::parse_document(&file, &stem, doc).map(|s| Experiment::Serving(Box::new(s)))
        }
    }

    /// The run's simulations in run order, as their rows name them: every policy (or decode
    /// mode) at every sweep point.
    pub fn job_names(&self) -> Vec<JobName> {
        let name = |point: Option<&str>, policy: &str| JobName {
            point: point.map(str::to_string),
            policy: policy.to_string(),
        };
        match self {
            Experiment::Serving(s) => s
                .runs()
                .into_iter()
                .flat_map(|(l, p)| p.policies.iter().map(move |k| name(l, k.name())))
                .collect(),
            Experiment::Pipeline(s) => s
                .runs()
                .into_iter()
                .flat_map(|(l, p)| p.modes.iter().map(move |&m| name(l, mode_name(m))))
                .collect(),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Experiment::Serving(s) => &s.name,
            Experiment::Pipeline(s) => &s.name,
        }
    }

    pub fn seed(&self) -> u64 {
        match self {
            Experiment::Serving(s) => s.seed,
            Experiment::Pipeline(s) => s.seed,
        }
    }

    /// Replaces the seed (and every sweep point's).
    pub fn set_seed(&mut self, seed: u64) {
        match self {
            Experiment::Serving(s) => s.set_seed(seed),
            Experiment::Pipeline(s) => s.set_seed(seed),
        }
    }

    /// Whether the experiment runs on the live host.
    pub fn is_live(&self) -> bool {
        match self {
            Experiment::Pipeline(s) => s.live,
            Experiment::Serving(s) => s.live,
        }
    }

    /// `meshsim run --live`: run on the live host, and record `mode = "live"` in the results'
    /// copy of the scenario.
    pub fn set_live(&mut self, _file: &str) -> Result<(), ScenarioError> {
        match self {
            Experiment::Serving(s) => {
                s.live = true;
                s.text = crate::pipeline::scenario::with_live_mode(&s.text);
                for p in &mut s.points {
                    p.scenario.live = true;
                }
                Ok(())
            }
            Experiment::Pipeline(s) => {
                s.live = true;
                s.text = crate::pipeline::scenario::with_live_mode(&s.text);
                Ok(())
            }
        }
    }

    /// `--nodes` (comma-separated `HOST:PORT`s) and `--cookie-file`: a live run across
    /// `meshsim node` processes (a pipeline's shards, or a serving scenario's nodes).
    pub fn set_cluster(
        &mut self,
        file: &str,
        nodes: Option<&str>,
        cookie_file: Option<PathBuf>,
    ) -> Result<(), ScenarioError> {
        let c = crate::scenario::Check { file };
        let nodes = match nodes {
            Some(n) => Some(crate::scenario::live_nodes(
                &c,
                &n.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect::<Vec<_>>(),
            )?),
            None => None,
        };
        let apply = |to_nodes: &mut Vec<String>, to_cookie: &mut Option<PathBuf>| {
            if let Some(n) = &nodes {
                *to_nodes = n.clone();
            }
            if let Some(f) = &cookie_file {
                *to_cookie = Some(f.clone());
            }
        };
        let live = match self {
            Experiment::Pipeline(s) => {
                apply(&mut s.nodes, &mut s.cookie_file);
                for p in &mut s.points {
                    apply(&mut p.scenario.nodes, &mut p.scenario.cookie_file);
                }
                s.live
            }
            Experiment::Serving(s) => {
                apply(&mut s.nodes, &mut s.cookie_file);
                for p in &mut s.points {
                    apply(&mut p.scenario.nodes, &mut p.scenario.cookie_file);
                }
                s.live
            }
        };
        if nodes.is_some() && !live {
            return Err(c.err(
                "live.nodes",
                "--nodes places a live run: give --live (or mode = \"live\")",
            ));
        }
        Ok(())
    }

    /// Checks what only a live run needs (sizes a CPU can hold); `Ok` for simulations.
    pub fn check_live(&self, file: &str) -> Result<(), ScenarioError> {
        match self {
            Experiment::Pipeline(s) if s.live => s.check_live(file),
            Experiment::Serving(s) if s.live => crate::serving::live::check_live(s, file),
            _ => Ok(()),
        }
    }

    /// Simulations (policies or modes at every sweep point) to run.
    pub fn simulations(&self) -> usize {
        match self {
            Experiment::Serving(s) => crate::serving::sim::jobs(s),
            Experiment::Pipeline(s) => s.modes.len() * s.points.len().max(1),
        }
    }

    /// Runs every policy (or decode mode) at every sweep point: simulations on up to `threads`
    /// threads (results do not depend on the count), live runs one after another on a tokio
    /// runtime of their own.
    pub fn run(&self, threads: usize) -> Result<Runs, RunError> {
        self.run_watched(threads, &crate::serving::sim::RunOptions::default())
    }

    /// [`Experiment::run`] with options for serving runs (progress board, spool of request
    /// rows; not a share); pipeline runs ignore them.
    pub fn run_watched(
        &self,
        threads: usize,
        opts: &crate::serving::sim::RunOptions,
    ) -> Result<Runs, RunError> {
        match self {
            Experiment::Serving(s) if s.live => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| LiveError::Actor(format!("cannot start tokio: {e}")))?;
                Ok(Runs::Serving(
                    rt.block_on(crate::serving::live::live_all(s))?,
                ))
            }
            Experiment::Serving(s) => Ok(Runs::Serving(
                crate::serving::sim::simulate_share(s, threads, opts)?
                    .into_iter()
                    .map(|(_, r)| r)
                    .collect(),
            )),
            Experiment::Pipeline(s) if s.live => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| LiveError::Actor(format!("cannot start tokio: {e}")))?;
                Ok(Runs::Pipeline(
                    rt.block_on(crate::pipeline::live::live_all(s))?,
                ))
            }
            Experiment::Pipeline(s) => Ok(Runs::Pipeline(crate::pipeline::sim::simulate_all(
                s, threads,
            )?)),
        }
    }

    /// Writes the results folder of `runs` into `dir`.
    pub fn write(&self, runs: &Runs, dir: &Path) -> std::io::Result<Written> {
        match (self, runs) {
            (Experiment::Serving(s), Runs::Serving(r)) => {
                crate::serving::outcome::write_results(s, r, dir)
            }
            (Experiment::Pipeline(s), Runs::Pipeline(r)) => {
                crate::pipeline::outcome::write_results(s, r, dir)
            }
            _ => Err(std::io::Error::other("runs of another kind of scenario")),
        }
    }

    /// `results/<name>/`, or `results/<name>_live/` for a run made live by `--live`.
    pub fn default_dir(&self, live_flag: bool) -> PathBuf {
        let name = if live_flag {
            format!("{}_live", self.name())
        } else {
            self.name().to_string()
        };
        Path::new("results").join(name)
    }

    /// What the scenario derives, for `meshsim check` and the start of `meshsim run`.
    pub fn describe(&self) -> String {
        match self {
            Experiment::Serving(s) => describe_serving(s),
            Experiment::Pipeline(s) => describe_pipeline(s),
        }
    }

    /// One console line for a run's summary.
    pub fn console_line(&self, sm: &Summary, wall: Duration) -> String {
        let mut line = String::new();
        if let Some(point) = &sm.point {
            let _ = write!(line, "  [{point}]");
        }
        let _ = match self {
            Experiment::Serving(_) => write!(
                line,
                "  {:<14} TTFT p50 {:>9.1} ms  p99 {:>9.1} ms | TPOT p50 {:>6.1} ms | hit {:>5.1}% | {:>9} events in {:.2} s ({:.2} M events/s)",
                sm.policy,
                sm.ttft.p50,
                sm.ttft.p99,
                sm.tpot.p50,
                100.0 * sm.prefix_hit_ratio,
                sm.events,
                wall.as_secs_f64(),
                sm.events as f64 / wall.as_secs_f64().max(1e-9) / 1e6
            ),
            Experiment::Pipeline(_) => write!(
                line,
                "  {:<10} TTFT p50 {:>9.1} ms  p99 {:>9.1} ms | TPOT p50 {:>7.2} ms | {:>8.1} output tokens/s | {} re-prefills | {:.2} s",
                sm.policy,
                sm.ttft.p50,
                sm.ttft.p99,
                sm.tpot.p50,
                sm.output_tokens_per_s,
                sm.preemptions,
                wall.as_secs_f64()
            ),
        };
        line
    }
}

impl Experiment {
    /// For `meshsim check`: builds the trace of a serving scenario (of each sweep point) and
    /// writes its length, prefix-reuse potential and context reuse; nothing for pipelines.
    pub fn describe_traces(&self, out: &mut impl std::io::Write) -> Result<(), String> {
        let Experiment::Serving(s) = self else {
            return Ok(());
        };
        let points: Vec<(&str, &Scenario)> = if s.points.is_empty() {
            vec![("", s)]
        } else {
            s.points
                .iter()
                .map(|p| (p.label.as_str(), &p.scenario))
                .collect()
        };
        for (label, s) in points {
            let trace = crate::serving::build::trace(s).map_err(|e| e.to_string())?;
            let bs = s.serving.instance.block_size;
            let st = crate::workload::stats::TraceStats::of(&trace, bs, &[]);
            let at = if label.is_empty() {
                String::new()
            } else {
                format!(" [{label}]")
            };
            let line = format!(
                "  trace{at}: {} requests over {:.1} s, prompts mean {:.0} tokens (max {}); \
                 {:.1}% of prompt tokens in blocks of {bs} seen before\n    {}\n",
                st.requests,
                st.duration_s,
                st.prompt.mean,
                st.prompt.max,
                100.0 * st.unbounded_hit_ratio,
                st.reuse_line()
            );
            out.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The resolved figures of the GPU and the node, for `meshsim check`.
fn describe_hardware(o: &mut String, h: &crate::hardware::HardwareSpec) {
    let (g, gb) = (&h.gpu, |x: f64| x / 1e9);
    let _ = writeln!(
        o,
        "    GPU: {:.1} GiB, {:.0} GB/s memory, {:.1} TFLOP/s peak (efficiency {} compute, {} \
         memory); PCIe {:.1} GB/s, NVLink {:.1} GB/s per direction",
        g.memory_bytes as f64 / GIB as f64,
        gb(g.memory_bandwidth),
        g.peak_flops / 1e12,
        g.compute_efficiency,
        g.memory_efficiency,
        gb(h.pcie.bandwidth),
        gb(h.nvlink.bandwidth)
    );
    let _ = writeln!(
        o,
        "    node: {:.0} GiB host memory at {:.1} GB/s; {} x {:.0} GB SSD; {} x {:.0} Gb/s NICs, \
         {} switch hops",
        h.host.memory_bytes as f64 / GIB as f64,
        gb(h.host.memory_bandwidth),
        h.ssd.drives,
        h.ssd.capacity_bytes_per_drive as f64 / 1e9,
        h.network.nics_per_node,
        h.network.nic.bandwidth * 8.0 / 1e9,
        h.network.switch_hops
    );
}

fn describe_serving(s: &Scenario) -> String {
    let mut o = String::new();
    let inst = s.serving.instance;
    let kv_tok = s.model.kv_bytes_per_token();
    let _ = writeln!(o, "scenario {} (seed {})", s.name, s.seed);
    let _ = writeln!(
        o,
        "  hardware: {} nodes x {} {} = {} GPUs; {} serving instances (tensor parallel {})",
        s.hardware.nodes,
        s.hardware.gpus_per_node,
        s.hardware.gpu.name,
        s.hardware.total_gpus(),
        s.instances(),
        s.serving.tensor_parallel
    );
    describe_hardware(&mut o, &s.hardware);
    let _ = writeln!(
        o,
        "  model: {} ({:.2} GiB of weights, {} KiB of KV per token)",
        s.model.name,
        s.model.weight_bytes() as f64 / GIB as f64,
        kv_tok / 1024
    );
    let _ = writeln!(
        o,
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
    let policies: Vec<&str> = s.policies.iter().map(|p| p.name()).collect();
    let _ = writeln!(
        o,
        "  workload: {workload}; policies: {}",
        policies.join(", ")
    );
    // Every policy's composition, as the table that makes it (a user's policy starts there).
    for p in &s.policies {
        for line in crate::serving::scenario::policy::table(p).lines() {
            let _ = writeln!(o, "    {line}");
        }
    }
    if !s.points.is_empty() {
        let labels: Vec<&str> = s.points.iter().map(|p| p.label.as_str()).collect();
        let _ = writeln!(o, "  sweep: {} points: {}", labels.len(), labels.join(", "));
    }
    if !s.faults.is_empty() {
        let kinds: Vec<&str> = s.faults.iter().map(|f| f.kind()).collect();
        let _ = writeln!(o, "  faults: {}", kinds.join(", "));
    }
    let pricing = match &s.serving.profile {
        Some((path, fit)) => format!("the profile {} ({fit})", path.display()),
        None => "the roofline of the GPU".into(),
    };
    let _ = writeln!(
        o,
        "  iterations priced by {pricing}{}",
        if s.serving.shared_device {
            "; all instances share one device"
        } else {
            ""
        }
    );
    if s.live {
        let _ = writeln!(
            o,
            "  live: candle f32 with a paged K/V cache per instance, {:.2} GiB held at most, \
             {:.0} s per policy at most",
            crate::serving::live::live_bytes(s) as f64 / GIB as f64,
            s.max_wall.as_secs_f64()
        );
    }
    o
}

fn describe_pipeline(s: &PipelineScenario) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "pipeline scenario {} (seed {})", s.name, s.seed);
    let ranges: Vec<String> = s
        .layers
        .iter()
        .map(|l| format!("{}..{}", l.start, l.end))
        .collect();
    let _ = writeln!(
        o,
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
    let host = if s.live {
        "live (candle, ractor)"
    } else {
        "simulated"
    };
    let _ = writeln!(
        o,
        "  host: {host}; step cost: {cost}; link {:.1} GB/s, {:.1} us one way",
        s.link.bandwidth / 1e9,
        s.link.latency.0 as f64 / 1e3
    );
    let _ = writeln!(
        o,
        "  session caches: {} sessions, TTL {:.0} s; head: {} sessions at once",
        s.cache.max_sessions,
        s.cache.ttl.as_secs_f64(),
        s.max_active
    );
    let w = &s.workload;
    let arrivals = match w.arrivals {
        Arrivals::Poisson(r) => format!("at {r} /s (Poisson)"),
        Arrivals::ClosedLoop => format!("in a closed loop of {} clients", s.max_active),
    };
    let modes: Vec<&str> = s.modes.iter().map(|m| mode_name(*m)).collect();
    let _ = writeln!(
        o,
        "  workload: {} requests {arrivals}, {} prompt tokens, {} output tokens; modes: {}",
        w.requests,
        w.prompt_tokens,
        w.output_tokens,
        modes.join(", ")
    );
    if !s.points.is_empty() {
        let labels: Vec<&str> = s.points.iter().map(|p| p.label.as_str()).collect();
        let _ = writeln!(o, "  sweep: {} points: {}", labels.len(), labels.join(", "));
    }
    o
}
