//! Running a pipeline scenario: on the simulator (every decode mode and sweep point in
//! parallel, deterministic) or on the live host (one run after another, measured).
//!
//! Both build the same actors ([`Head`] with id 0, then one [`ShardNode`] per layer range)
//! and differ only in the backend and the host:
//!
//! * **sim**: [`SimBackend`] (analytic roofline, or a measured profile) on [`SimHost`]. The
//!   head runs at the frontend, shard `i` on node `i`; every message crosses the scenario's
//!   `[pipeline.link]` (bandwidth per direction, one-way latency), FIFO per link, as in the
//!   cluster model. With `shared_device = true` every shard sits on node 0 and their steps
//!   queue for its one device (FIFO): an approximation of shard actors sharing one CPU on the
//!   live host, where their handlers run at the same time on different worker threads and
//!   share the cores (an upper bound on that contention; `false` is the lower bound).
//!   Messages between shards on one node cost nothing.
//! * **live**: [`CandleBackend`] (f32, weights seeded from the scenario's seed, on the default
//!   device) on [`crate::live::host`], with the wall clock.
//!
//! The trace: `requests` arrivals of a Poisson process at `arrival_rate_per_s` (ChaCha8 stream
//! `WORKLOAD_ARRIVALS`; in a closed loop the head sets each arrival when it happens), each with
//! a prompt of `prompt_tokens` seeded token ids (as [`crate::workload::seeded_prompt`]) or one of
//! the scenario's tokenized `prompts`, and `output_tokens` to generate. The same trace is used by
//! every mode, point and host.

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::DType;

use super::scenario::{Arrivals, CostSource, PipelineScenario, mode_name};
use super::shard::DecodeMode;
use super::{Head, HeadConfig, Msg, PipelineRequest};
use crate::actor::{Actor, ActorId};
use crate::backend::{CandleBackend, ModelBackend, SimBackend};
use crate::exec::{WeightSource, default_device};
use crate::hardware::Place;
use crate::hardware::network::Network;
use crate::live::LiveError;
use crate::metrics::{Report, RequestRecord, Summary};
use crate::results::Written;
use crate::rng::{Stream, streams};
use crate::sim::host::SimHost;
use crate::sim::kernel::SimError;
use crate::units::Nanos;

/// One decode mode's run at one point.
#[derive(Debug)]
pub struct PipelineRun {
    pub mode: DecodeMode,
    pub report: Report,
    pub summary: Summary,
    /// Wall-clock time of the run (console only).
    pub wall: Duration,
    /// Payload bytes of every message between the actors (head and shards), as the actors
    /// count them (`Context::send`): live runs only.
    pub payload_bytes: u64,
    /// Bytes of the frames that crossed processes (runs across processes; console only).
    pub wire_bytes: u64,
    /// What happened to the processes of a run across them (set up, lost, placed again,
    /// ended), with wall-clock times since the run started; empty otherwise.
    pub timeline: Vec<(Duration, String)>,
}

/// The requests of `s`, sorted by arrival.
pub fn trace(s: &PipelineScenario) -> Vec<PipelineRequest> {
    let w = &s.workload;
    let mut rng = Stream::new(s.seed, streams::WORKLOAD_ARRIVALS);
    let mut t = 0.0f64;
    (0..w.requests)
        .map(|id| {
            if let (Arrivals::Poisson(rate), true) = (w.arrivals, id > 0) {
                t += rng.exponential(rate);
            }
            PipelineRequest {
                arrival: Nanos::from_secs_f64(t),
                prompt: match &w.prompts {
                    Some(p) => p[id as usize % p.len()].clone(),
                    None => crate::workload::seeded_prompt(
                        s.seed,
                        id,
                        w.prompt_tokens as usize,
                        s.model.vocab,
                    ),
                },
                output_tokens: w.output_tokens,
            }
        })
        .collect()
}

/// The head of `s` in `mode` (actor 0), driving the shards `1..=layers`.
pub fn head(s: &PipelineScenario, mode: DecodeMode) -> Box<dyn Actor<Msg>> {
    let ids: Vec<ActorId> = (1..=s.layers.len()).map(|i| ActorId(i as u32)).collect();
    let cfg = HeadConfig {
        mode,
        max_active: s.max_active,
        max_waiting: s.max_waiting,
        closed_loop: s.workload.arrivals == Arrivals::ClosedLoop,
        restarts: s.restarts.clone(),
    };
    Box::new(Head::new(cfg, ids, trace(s)))
}

/// The head (id 0) and the shard actors (ids 1..) of `s` in `mode` over `backends`, built
/// from the same [`super::cluster::ShardSpec`]s that a run across processes sends to its
/// nodes.
pub fn actors(
    s: &PipelineScenario,
    mode: DecodeMode,
    backends: Vec<Box<dyn ModelBackend>>,
) -> Vec<Box<dyn Actor<Msg>>> {
    let mut out = vec![head(s, mode)];
    for (spec, b) in super::cluster::specs(s).iter().zip(backends) {
        out.push(spec.actor(b));
    }
    out
}

/// The network of a pipeline: one node per shard and the frontend, every pair joined by the
/// scenario's link (one NIC per node, the latency charged once per message).
fn network(s: &PipelineScenario) -> Network {
    Network::fabric(s.layers.len() as u32, s.link)
}

fn sim_backends(s: &PipelineScenario) -> Vec<Box<dyn ModelBackend>> {
    let model = s.model_config();
    s.layers
        .iter()
        .map(|l| -> Box<dyn ModelBackend> {
            match &s.cost {
                CostSource::Analytic { gpu, overhead } => Box::new(SimBackend::new(
                    model.clone(),
                    l.clone(),
                    gpu.clone(),
                    *overhead,
                )),
                CostSource::Profile { profile, .. } => {
                    // Validation checked that the profile has exactly the scenario's ranges.
                    let p = profile
                        .shard(l)
                        .cloned()
                        .expect("a profile for every shard");
                    Box::new(SimBackend::profiled(model.clone(), l.clone(), p))
                }
            }
        })
        .collect()
}

/// Simulates `s` in `mode`.
pub fn simulate(s: &PipelineScenario, mode: DecodeMode) -> Result<PipelineRun, SimError> {
    let started = Instant::now();
    let mut host = SimHost::new(network(s), s.limits, s.seed);
    for (i, a) in actors(s, mode, sim_backends(s)).into_iter().enumerate() {
        let place = match i {
            0 => Place::Frontend,
            // One device for all shards: their compute queues on one place.
            _ if s.shared_device => Place::Host { node: 0 },
            _ => Place::Host { node: i as u32 - 1 },
        };
        host.add(a, place);
    }
    let out = host.run()?;
    let summary = Summary::new(mode_name(mode), &out.report, out.events);
    Ok(PipelineRun {
        mode,
        report: out.report,
        summary,
        wall: started.elapsed(),
        payload_bytes: 0,
        wire_bytes: 0,
        timeline: Vec::new(),
    })
}

/// Simulates every mode at every point of `s` on up to `threads` threads; the results are in
/// (point, mode) order whatever the thread count.
pub fn simulate_all(s: &PipelineScenario, threads: usize) -> Result<Vec<PipelineRun>, SimError> {
    let jobs: Vec<(Option<&str>, &PipelineScenario, DecodeMode)> = s
        .runs()
        .into_iter()
        .flat_map(|(label, p)| p.modes.iter().map(move |&m| (label, p, m)))
        .collect();
    crate::sim::parallel_map(&jobs, threads, |&(label, p, mode)| {
        simulate(p, mode).map(|mut r| {
            r.summary.point = label.map(str::to_string);
            r
        })
    })
    .into_iter()
    .collect()
}

/// Runs `s` in `mode` on the live host with candle shards.
pub async fn live(s: &PipelineScenario, mode: DecodeMode) -> Result<PipelineRun, LiveError> {
    let device = default_device();
    let weights = WeightSource::Seeded(s.seed);
    let mut backends: Vec<Box<dyn ModelBackend>> = Vec::with_capacity(s.layers.len());
    for l in &s.layers {
        let b = CandleBackend::load(&s.model, l.clone(), &weights, DType::F32, &device)
            .map_err(|e| LiveError::Config(e.to_string()))?;
        backends.push(Box::new(b));
    }
    let out = crate::live::host::run(actors(s, mode, backends), s.seed, s.max_wall).await?;
    Ok(PipelineRun::live(mode, out, Vec::new()))
}

impl PipelineRun {
    /// The run of `mode` on a live host (one process, or across processes with their
    /// `timeline`).
    pub fn live(
        mode: DecodeMode,
        out: crate::live::host::LiveOutcome,
        timeline: Vec<(Duration, String)>,
    ) -> PipelineRun {
        let summary = Summary::new(mode_name(mode), &out.report, out.messages);
        PipelineRun {
            mode,
            report: out.report,
            summary,
            wall: out.wall,
            payload_bytes: out.bytes,
            wire_bytes: out.wire_bytes,
            timeline,
        }
    }
}

/// Runs every mode at every point of `s` on the live host, one after another: in this
/// process, or across the `meshsim node`s of `[live] nodes` (with the cluster's cookie).
pub async fn live_all(s: &PipelineScenario) -> Result<Vec<PipelineRun>, LiveError> {
    let mut coordinator = if s.nodes.is_empty() {
        None
    } else {
        let Some(path) = &s.cookie_file else {
            return Err(LiveError::Config(
                "[live] nodes needs the cluster's cookie: [live] cookie_file or --cookie-file"
                    .into(),
            ));
        };
        let cookie = crate::live::cluster::read_cookie(path).map_err(LiveError::Config)?;
        let max_frame = s
            .runs()
            .iter()
            .map(|(_, p)| super::cluster::max_frame(p))
            .max()
            .unwrap_or(0);
        Some(crate::live::cluster::Coordinator::connect(&s.nodes, cookie, max_frame).await?)
    };
    let mut runs = Vec::new();
    let mut result = Ok(());
    'points: for (label, p) in s.runs() {
        for &m in &p.modes {
            let r = match coordinator.as_mut() {
                Some(c) => {
                    let r = super::cluster::live(p, m, c).await;
                    for (t, what) in &c.timeline {
                        tracing::info!("{:>9.3} s  {what}", t.as_secs_f64());
                    }
                    r
                }
                None => live(p, m).await,
            };
            match r {
                Ok(mut r) => {
                    r.summary.point = label.map(str::to_string);
                    runs.push(r);
                }
                Err(e) => {
                    result = Err(e);
                    break 'points;
                }
            }
        }
    }
    if let Some(c) = &coordinator {
        c.shutdown().await;
    }
    result.map(|()| runs)
}

/// Writes the results folder of `runs` of `s` (see [`crate::results::write_results_dir`]).
pub fn write_results(
    s: &PipelineScenario,
    runs: &[PipelineRun],
    dir: &Path,
) -> std::io::Result<Written> {
    let records: Vec<(Option<&str>, &str, &[RequestRecord])> = runs
        .iter()
        .map(|r| {
            (
                r.summary.point.as_deref(),
                mode_name(r.mode),
                r.report.records.as_slice(),
            )
        })
        .collect();
    let summaries: Vec<Summary> = runs.iter().map(|r| r.summary.clone()).collect();
    crate::results::write_results_dir(&s.text, &records, &summaries, dir)
}
