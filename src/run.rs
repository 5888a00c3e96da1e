//! Running a scenario: generate its trace once, simulate every policy on it, write results.
//!
//! Policies run in parallel threads (at most one per core); each simulation is a pure function
//! of the scenario, the seed and the policy, so the results do not depend on the thread count.
//! Results are written into a temporary folder beside the target and renamed into place at
//! the end, so a failed run never leaves half-written files.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hardware::Place;
use crate::hardware::network::{LinkBytes, Network};
use crate::metrics::write::{write_requests, write_summary};
use crate::metrics::{Report, Summary};
use crate::policy::PolicyKind;
use crate::scenario::Scenario;
use crate::serving::instance::Instance;
use crate::serving::router::Router;
use crate::sim::host::SimHost;
use crate::sim::kernel::SimError;
use crate::workload::replay::{self, TraceError};
use crate::workload::{Trace, WorkloadSpec, qa};

/// One policy's simulation.
#[derive(Debug)]
pub struct PolicyRun {
    pub policy: PolicyKind,
    pub report: Report,
    pub summary: Summary,
    pub link_bytes: LinkBytes,
    /// Wall-clock time of the simulation (not reproducible; console only).
    pub wall: Duration,
}

/// Builds the scenario's trace: generated, or loaded from its dataset or trace file.
pub fn trace(s: &Scenario) -> Result<Trace, TraceError> {
    match &s.workload {
        WorkloadSpec::Generated(w) => Ok(qa::generate(w, s.model.vocab as u32, s.seed)),
        WorkloadSpec::Replay(spec) => Ok(replay::load(spec, s.seed)?.trace),
    }
}

/// Simulates one policy on `trace`.
pub fn simulate(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: PolicyKind,
) -> Result<PolicyRun, SimError> {
    let started = Instant::now();
    let mut host = SimHost::new(Network::new(&s.hardware), s.cost_model(), s.limits, s.seed);
    let policy_impl: Arc<dyn crate::policy::Policy> = Arc::from(policy.build());
    let router_id = host.next_id();
    let instance_ids = (0..s.instances())
        .map(|i| crate::sim::kernel::ActorId(router_id.0 + 1 + i))
        .collect();
    host.add(
        Box::new(Router::new(trace.clone(), instance_ids, s.serving.router)),
        Place::Frontend,
    );
    for i in 0..s.instances() {
        host.add(
            Box::new(Instance::new(
                i,
                router_id,
                trace.clone(),
                policy_impl.clone(),
                s.serving.instance,
            )),
            s.instance_place(i),
        );
    }
    let outcome = host.run()?;
    let summary = Summary::new(policy.name(), &outcome.report, outcome.events);
    Ok(PolicyRun {
        policy,
        report: outcome.report,
        summary,
        link_bytes: outcome.link_bytes,
        wall: started.elapsed(),
    })
}

/// Simulates every policy of the scenario on one trace, in scenario order.
pub fn simulate_all(
    s: &Scenario,
    trace: Arc<Trace>,
    threads: usize,
) -> Result<Vec<PolicyRun>, SimError> {
    let threads = threads.max(1);
    let mut runs = Vec::with_capacity(s.policies.len());
    for chunk in s.policies.chunks(threads) {
        let results: Vec<Result<PolicyRun, SimError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|&p| {
                    let trace = trace.clone();
                    scope.spawn(move || simulate(s, trace, p))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a simulation thread panicked"))
                .collect()
        });
        for r in results {
            runs.push(r?);
        }
    }
    Ok(runs)
}

/// Writes `requests.csv`, `summary.csv` and `scenario.toml` into `dir`, replacing it whole.
pub fn write_results(s: &Scenario, runs: &[PolicyRun], dir: &Path) -> std::io::Result<()> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "results".into());
    let tmp: PathBuf = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    let result = (|| -> std::io::Result<()> {
        std::fs::write(tmp.join("scenario.toml"), &s.text)?;
        let records: Vec<(&str, &[crate::metrics::RequestRecord])> = runs
            .iter()
            .map(|r| (r.policy.name(), r.report.records.as_slice()))
            .collect();
        let f = std::io::BufWriter::new(std::fs::File::create(tmp.join("requests.csv"))?);
        write_requests(f, &records).map_err(std::io::Error::other)?;
        let summaries: Vec<Summary> = runs.iter().map(|r| r.summary.clone()).collect();
        let f = std::io::BufWriter::new(std::fs::File::create(tmp.join("summary.csv"))?);
        write_summary(f, &summaries).map_err(std::io::Error::other)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&tmp, dir)
}
