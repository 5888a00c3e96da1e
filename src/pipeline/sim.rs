//! Running a pipeline scenario on the simulator (every decode mode and sweep point in
//! parallel, deterministic); [`super::live`] runs the same actors on the live host (one run
//! after another, measured) and [`super::cluster`] across processes.
//!
//! Every host runs the same actors ([`super::build`]: the [`super::Head`] with id 0, then one
//! [`super::ShardNode`] per layer range); here they run on [`SimHost`] with [`SimBackend`]
//! (analytic roofline, or a measured profile). The head runs at the frontend, shard `i` on
//! node `i`; every message crosses the scenario's `[pipeline.link]` (bandwidth per
//! direction, one-way latency), FIFO per link, as in the cluster model. With
//! `shared_device = true` every shard sits on node 0 and their steps queue for its one
//! device (FIFO): an approximation of shard actors sharing one CPU on the live host, where
//! their handlers run at the same time on different worker threads and share the cores (an
//! upper bound on that contention; `false` is the lower bound). Messages between shards on
//! one node cost nothing.

use std::time::Instant;

use super::build::actors;
use super::outcome::PipelineRun;
use super::scenario::{CostSource, PipelineScenario, mode_name};
use super::shard::DecodeMode;
use crate::backend::{ModelBackend, SimBackend};
use crate::hardware::Place;
use crate::hardware::network::Network;
use crate::metrics::Summary;
use crate::sim::host::SimHost;
use crate::sim::kernel::SimError;

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
    let summary = Summary::new(mode_name(mode), &out.report, out.events).with_links(out.links);
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
