//! Running a serving scenario: generate its trace once, simulate every policy on it (at every
//! sweep point), write results.
//!
//! Policies run in parallel threads (at most one per core); each simulation is a pure function
//! of the scenario, the seed and the policy, so the results do not depend on the thread count.
//! Results are written into a temporary folder beside the target and swapped into place at
//! the end ([`crate::results::output`]), so a failed run never leaves half-written files. Plots and
//! `report.md` are made from the CSV files in that temporary folder ([`crate::results::plot`]) before
//! the swap.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::actor::{Actor, ActorId};
use crate::backend::BatchBackend;
use crate::hardware::Place;
use crate::hardware::network::{LinkBytes, Network};
use crate::metrics::write::write_request_rows;
use crate::metrics::{Report, Summary};
use crate::model::cost::BatchShape;
use crate::results::output::Scratch;
use crate::results::plot::{Latencies, run_name};
use crate::results::{RequestRows, RunError};
use crate::serving::Msg;
use crate::serving::chaos::{Chaos, Targets};
use crate::serving::cluster::ActorSpec;
use crate::serving::kv_routing::KvRouting;
use crate::serving::policy::Policy;
use crate::serving::policy::PolicyKind;
use crate::serving::prompt_hashes::PromptHashes;
use crate::serving::router::{Router, RouterStrategy};
use crate::serving::scenario::Scenario;
use crate::serving::store::StoreRules;
use crate::serving::store::directory::{Directory, StoreParams};
use crate::serving::store::memory::ClusterMemory;
use crate::serving::store::metadata::Metadata;
use crate::sim::fault::Fault;
use crate::sim::host::{DEFAULT_CHECK_EVERY, SimHost};
use crate::sim::host::{FetchOverhead, MemoryLoss};
use crate::sim::kernel::SimError;
use crate::sim::progress::{Board, Progress};
use crate::units::Nanos;
use crate::workload::TraceError;
use crate::workload::replay;
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
    /// Where the run's `requests.csv` rows went when it was spooled ([`Spool`]); its
    /// `report.records` are then empty, and `latencies` holds what the plots need of them.
    pub spooled: Option<PathBuf>,
    /// A spooled run's latencies, as the plots read them from its rows (`None` otherwise).
    pub latencies: Option<crate::results::plot::Latencies>,
    /// Live runs: how its outputs compare with vanilla's ([`crate::serving::live`]).
    pub output_check: Option<crate::serving::live::OutputCheck>,
    /// Live runs: where the time of the instances' iterations went.
    pub timing: Option<crate::backend::Timing>,
    /// Live runs across processes: what moved between them.
    pub across: Option<crate::serving::cluster::AcrossProcesses>,
}

/// Where finished simulations write their `requests.csv` rows, so that a run does not hold
/// every policy's per-request records until the end: one file of rows (no header) per job in a
/// scratch folder (see [`crate::results::output::Scratch`]). The results folder's
/// `requests.csv` is then the header and these files in run order.
#[derive(Debug)]
pub struct Spool<'a> {
    pub scratch: &'a Scratch,
    /// Whether the rows start with a `point` column (the scenario has a sweep).
    pub swept: bool,
}

impl Spool<'_> {
    /// Writes job `i`'s rows and empties its records.
    fn put(&self, i: usize, run: &mut PolicyRun) -> std::io::Result<()> {
        let started = Instant::now();
        let path = self.scratch.ensure()?.join(format!("job-{i}.csv"));
        let f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut w = csv::WriterBuilder::new().has_headers(false).from_writer(f);
        write_request_rows(
            &mut w,
            self.swept,
            run.summary.point.as_deref(),
            run.policy.name(),
            &run.report.records,
        )
        .map_err(std::io::Error::other)?;
        w.flush()?;
        // Rows that `requests.csv` will hold: what the plots need of them (none without rows).
        let name = run_name(self.swept, run.summary.point.as_deref(), run.policy.name());
        let records = &run.report.records;
        run.latencies = (!records.is_empty()).then(|| Latencies::of_run(name, records));
        tracing::info!(
            policy = run.policy.name(),
            rows = records.len(),
            wall_s = started.elapsed().as_secs_f64(),
            "request rows spooled"
        );
        run.report.records = Vec::new();
        run.spooled = Some(path);
        Ok(())
    }
}

/// The store's sizes and GDSF costs, from the scenario's hardware and model.
pub fn store_params(s: &Scenario, rules: &StoreRules) -> StoreParams {
    let hw = &s.hardware;
    let g = s.store.tensor_tokens as u64;
    let cost = s.batch_backend();
    let prefill = |cached: u64| {
        let mut b = BatchShape::default();
        b.add(g, cached, false);
        cost.price(&b).0 as f64
    };
    let base = prefill(0);
    StoreParams {
        nodes: hw.nodes,
        tensor_bytes: g * s.model.kv_bytes_per_token(),
        host_capacity: s.store.host_capacity_bytes,
        replica_capacity: (s.store.host_capacity_bytes as f64 * rules.replica_fraction) as u64,
        ssd_capacity: s.store.ssd_capacity_bytes,
        eviction: rules.eviction,
        consolidate: rules.consolidate,
        replicate_after_reads: rules.replicate_after_reads,
        host_ns_per_byte: 1e9 / hw.pcie.bandwidth,
        ssd_ns_per_byte: 1e9 / (hw.ssd.drives as f64 * hw.ssd.read_bandwidth_per_drive),
        net_ns_per_byte: 1e9 / hw.network.nic.bandwidth,
        recompute_base_ns: base,
        recompute_per_index_ns: prefill(g) - base,
    }
}

/// Builds the scenario's trace: generated, or loaded from its dataset or trace file. A
/// replayed request that arrives after the time limit or whose prompt is longer than the
/// model's context is an error naming its line (the scenario checks generated prompts).
pub fn trace(s: &Scenario) -> Result<Trace, TraceError> {
    match &s.workload {
        WorkloadSpec::Generated(w) => {
            let t = qa::generate(w, s.model.vocab as u32, s.seed);
            // The scenario checked the expected span; a Poisson tail may still pass the limit.
            match t.requests.last() {
                Some(r) if r.arrival > s.limits.max_time => Err(TraceError::whole(
                    Path::new(&s.name),
                    "workload.arrival_rate_per_s",
                    format!(
                        "the last request arrives at {:.3} s, after limits.max_sim_time_s = {}",
                        r.arrival.as_secs_f64(),
                        s.limits.max_time.as_secs_f64()
                    ),
                )),
                _ => Ok(t),
            }
        }
        WorkloadSpec::Replay(spec) => {
            let loaded = replay::load(spec, s.seed)?;
            loaded.check_fits(
                &spec.path,
                s.limits.max_time,
                s.model.max_context,
                s.model.name,
            )?;
            Ok(loaded.trace)
        }
    }
}

/// Simulates one policy on `trace`.
pub fn simulate(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: PolicyKind,
) -> Result<PolicyRun, SimError> {
    simulate_checked(s, trace, policy, DEFAULT_CHECK_EVERY)
}

/// Simulates one policy on `trace`, checking every actor's invariants every `check_every`
/// events (0: only at the end). Checks never change results.
pub fn simulate_checked(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: PolicyKind,
    check_every: u64,
) -> Result<PolicyRun, SimError> {
    simulate_watched(s, trace, policy, check_every, None)
}

/// [`simulate_checked`], reporting progress into `progress` (see [`crate::sim::progress`]).
pub fn simulate_watched(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: PolicyKind,
    check_every: u64,
    progress: Option<Arc<Progress>>,
) -> Result<PolicyRun, SimError> {
    let started = Instant::now();
    let mut host = SimHost::new(Network::new(&s.hardware), s.limits, s.seed);
    host.set_check_every(check_every);
    if let Some(p) = progress {
        host.set_progress(p);
    }
    host.set_fetch_overhead(FetchOverhead {
        request: s.store.fetch_request_overhead,
        segment: s.store.fetch_segment_overhead,
    });
    // One pricing, shared by every instance's backend.
    let backend = s.batch_backend();
    let (actors, targets) = actors(s, trace, policy, &mut |_| Box::new(backend.clone()), None);
    if s.serving.shared_device {
        let places: Vec<Place> = (0..s.instances()).map(|i| s.instance_place(i)).collect();
        host.share_device(&places);
    }
    for (actor, place) in actors {
        host.add(actor, place);
    }
    if !s.faults.is_empty() {
        inject(s, &mut host, targets);
    }
    let outcome = host.run()?;
    let summary = Summary::new(policy.name(), &outcome.report, outcome.events);
    Ok(PolicyRun {
        policy,
        report: outcome.report,
        summary,
        link_bytes: outcome.link_bytes,
        wall: started.elapsed(),
        spooled: None,
        latencies: None,
        output_check: None,
        timing: None,
        across: None,
    })
}

/// Actors with their places, in id order.
pub type Placed = Vec<(Box<dyn Actor<Msg>>, Place)>;

/// The actors of one policy's run with their places, in id order (router, instances,
/// metadata, store servers), and the targets of fault injection. Both hosts run exactly
/// these: `backend` gives instance `i` its batch backend; with `memory` the store servers
/// hold real bytes (the live host).
pub fn actors(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: PolicyKind,
    backend: &mut dyn FnMut(u32) -> Box<dyn BatchBackend>,
    memory: Option<Arc<ClusterMemory>>,
) -> (Placed, Targets) {
    let policy_impl: Arc<dyn Policy> = Arc::from(policy.build(&s.store));
    let n = s.instances();
    let router_id = ActorId(0);
    let instance_ids: Vec<ActorId> = (0..n).map(|i| ActorId(1 + i)).collect();
    let metadata_id = ActorId(1 + n);
    let server_ids: Vec<ActorId> = (0..s.hardware.nodes).map(|i| ActorId(2 + n + i)).collect();
    let rules = policy_impl.store_rules();
    let nodes: Vec<u32> = (0..n)
        .map(|i| s.instance_place(i).node().unwrap_or(0))
        .collect();
    let hashes = Arc::new(PromptHashes::new(trace.clone()));
    let mut router = Router::new(
        trace.clone(),
        instance_ids.clone(),
        nodes.clone(),
        s.serving.router,
    )
    .with_prompt_hashes(hashes.clone());
    if s.serving.router == RouterStrategy::KvAware {
        let cfg = &s.serving.instance;
        router = router.with_kv(KvRouting::new(
            n as usize,
            cfg.num_blocks,
            cfg.block_size,
            s.serving.kv_overlap_weight,
        ));
    }
    let mut list: Placed = vec![(Box::new(router), Place::Frontend)];
    // Instances and store servers from their specs (the constructors a node uses too).
    let mut servers: Vec<(Box<dyn Actor<Msg>>, Place)> = Vec::new();
    for (id, spec, place) in crate::serving::cluster::specs(s, policy) {
        match spec {
            ActorSpec::Instance(i) => {
                debug_assert_eq!(list.len() as u32, id);
                let instance = i.actor(
                    trace.clone(),
                    hashes.clone(),
                    policy_impl.clone(),
                    backend(i.index),
                );
                list.push((Box::new(instance), place));
            }
            ActorSpec::Server(sv) => servers.push((Box::new(sv.actor(memory.clone())), place)),
        }
    }
    if let Some(rules) = rules {
        let mut dir = Directory::new(store_params(s, &rules));
        dir.set_lease(s.store.read_lease.0);
        let mut metadata = Metadata::new(dir, s.store.metadata_service, server_ids.clone());
        if memory.is_some() {
            metadata = metadata.with_bytes();
        }
        debug_assert_eq!(list.len() as u32, metadata_id.0);
        list.push((Box::new(metadata), Place::Host { node: 0 }));
        list.extend(servers);
    }
    let targets = Targets {
        router: router_id,
        instances: instance_ids.into_iter().zip(nodes).collect(),
        metadata: rules.map(|_| metadata_id),
        servers: if rules.is_some() {
            server_ids
        } else {
            Vec::new()
        },
    };
    (list, targets)
}

/// Adds the scenario's faults: hardware ones to the host, the others to a fault injector
/// (added last, so that scenarios without faults keep their actor ids).
fn inject(s: &Scenario, host: &mut SimHost<Msg>, targets: Targets) {
    let tp = s.serving.tensor_parallel;
    for f in &s.faults {
        match *f {
            Fault::LinkSlow {
                node,
                at,
                until,
                factor,
            } => host.slow_nics(node, at, until, factor),
            Fault::GpuSlow {
                node,
                gpu,
                at,
                until,
                factor,
            } => {
                // The instance whose tensor-parallel group holds the GPU runs at its first GPU.
                let place = Place::Gpu {
                    node,
                    gpu: gpu - gpu % tp,
                };
                host.slow_device(place, at, until, factor);
            }
            Fault::NodeCrash { node, at } => host.lose_memory(MemoryLoss {
                node,
                at,
                crash: true,
            }),
            Fault::StoreRestart { node, at } => host.lose_memory(MemoryLoss {
                node,
                at,
                crash: false,
            }),
            _ => {}
        }
    }
    host.add(Box::new(Chaos::new(&s.faults, targets)), Place::Frontend);
}

/// Simulates every policy of the scenario on one trace, in scenario order (no sweep).
pub fn simulate_all(
    s: &Scenario,
    trace: Arc<Trace>,
    threads: usize,
) -> Result<Vec<PolicyRun>, SimError> {
    let jobs: Vec<Job> = s
        .policies
        .iter()
        .map(|&policy| Job {
            label: None,
            scenario: s,
            trace: trace.clone(),
            policy,
            progress: None,
            index: 0,
        })
        .collect();
    run_jobs(&jobs, threads, None)
        .into_iter()
        .map(|r| {
            r.map_err(|e| match e {
                RunError::Sim(e) => e,
                other => unreachable!("without a spool, a run fails only in simulation: {other}"),
            })
        })
        .collect()
}

/// A simulation to run.
struct Job<'a> {
    /// Its sweep point's label.
    label: Option<&'a str>,
    scenario: &'a Scenario,
    trace: Arc<Trace>,
    policy: PolicyKind,
    /// Where its progress goes.
    progress: Option<Arc<Progress>>,
    /// Its index in the whole run.
    index: usize,
}

/// Runs `jobs` on up to `threads` threads; results come back in job order. With a spool, each
/// run's request rows go to it as soon as the run ends.
fn run_jobs(
    jobs: &[Job],
    threads: usize,
    spool: Option<&Spool>,
) -> Vec<Result<PolicyRun, RunError>> {
    // The most costly first (requests times the policy's cost), so that two threads end
    // together rather than one starting a long job as the other finishes; a stable sort, so
    // jobs of equal cost start in job order.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| {
        let j = &jobs[i];
        std::cmp::Reverse(j.trace.requests.len() as u64 * j.policy.relative_cost())
    });
    crate::sim::parallel_map_in(jobs, &order, threads, |j| {
        if let Some(pr) = &j.progress {
            pr.start();
        }
        let r = simulate_watched(
            j.scenario,
            j.trace.clone(),
            j.policy,
            DEFAULT_CHECK_EVERY,
            j.progress.clone(),
        );
        if let Some(pr) = &j.progress {
            pr.finish();
        }
        let mut run = r?;
        run.summary.point = j.label.map(str::to_string);
        if let Some(spool) = spool {
            spool
                .put(j.index, &mut run)
                .map_err(|e| RunError::Spool(spool.scratch.path().to_path_buf(), e))?;
        }
        Ok(run)
    })
}

/// Simulates every policy at every sweep point of `s` (or once, without a sweep), running up
/// to `threads` simulations at once. Runs come back in order: points in sweep order, policies
/// in scenario order; each is labelled with its point. Results do not depend on `threads`.
pub fn simulate_experiment(s: &Scenario, threads: usize) -> Result<Vec<PolicyRun>, RunError> {
    Ok(simulate_share(s, threads, &RunOptions::default())?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// Simulations of the whole experiment: policies at every sweep point.
pub fn jobs(s: &Scenario) -> usize {
    if s.points.is_empty() {
        s.policies.len()
    } else {
        s.points.iter().map(|p| p.scenario.policies.len()).sum()
    }
}

/// How [`simulate_share`] runs an experiment's simulations.
#[derive(Clone, Debug, Default)]
pub struct RunOptions<'a> {
    /// Only this share of the jobs (see [`crate::results::share`]); all without one.
    pub share: Option<crate::results::share::Share>,
    /// Where each simulation's progress goes.
    pub board: Option<&'a Board>,
    /// Where each finished simulation's request rows go.
    pub spool: Option<&'a Spool<'a>>,
}

/// Like [`simulate_experiment`], with [`RunOptions`]: each run comes back with its index in
/// the whole run. Traces are built only for the points a share simulates.
pub fn simulate_share(
    s: &Scenario,
    threads: usize,
    o: &RunOptions,
) -> Result<Vec<(usize, PolicyRun)>, RunError> {
    let (share, board) = (o.share, o.board);
    let points = s.runs();
    let owns = |i: usize| share.is_none_or(|sh| sh.owns(i));
    let mut jobs: Vec<Job> = Vec::new();
    let mut i = 0;
    for (label, sc) in &points {
        let mine: Vec<usize> = (i..i + sc.policies.len()).filter(|&j| owns(j)).collect();
        if !mine.is_empty() {
            let started = Instant::now();
            let t = Arc::new(trace(sc)?);
            tracing::info!(
                point = label.unwrap_or(""),
                requests = t.requests.len(),
                wall_s = started.elapsed().as_secs_f64(),
                "trace built"
            );
            let span = t.requests.last().map_or(Nanos::ZERO, |r| r.arrival);
            for (j, &p) in sc.policies.iter().enumerate() {
                if owns(i + j) {
                    let progress = board.map(|b| {
                        let at = label.map_or(String::new(), |l| format!("[{l}] "));
                        b.add(format!("{at}{}", p.name()), span)
                    });
                    jobs.push(Job {
                        label: *label,
                        scenario: sc,
                        trace: t.clone(),
                        policy: p,
                        progress,
                        index: i + j,
                    });
                }
            }
        }
        i += sc.policies.len();
    }
    let index: Vec<usize> = jobs.iter().map(|j| j.index).collect();
    run_jobs(&jobs, threads, o.spool)
        .into_iter()
        .zip(index)
        .map(|(r, i)| r.map(|r| (i, r)))
        .collect()
}

/// Writes `requests.csv`, `summary.csv` and `scenario.toml` into `dir`, replacing it whole,
/// then the plots and `report.md` made from those files. Runs that were spooled give their
/// rows from their files (all runs are spooled, or none).
pub fn write_results(
    s: &Scenario,
    runs: &[PolicyRun],
    dir: &Path,
) -> std::io::Result<crate::results::Written> {
    let summaries: Vec<Summary> = runs.iter().map(|r| r.summary.clone()).collect();
    let spooled: Option<Vec<&Path>> = runs.iter().map(|r| r.spooled.as_deref()).collect();
    if let Some(files) = spooled.filter(|f| !f.is_empty()) {
        let rows = RequestRows::Spooled {
            swept: !s.points.is_empty(),
            files,
        };
        // Read back from the rows if a run kept none.
        let latencies: Option<Vec<_>> = runs.iter().map(|r| r.latencies.clone()).collect();
        return crate::results::write_results_dir_with(&s.text, rows, &summaries, latencies, dir);
    }
    let records: Vec<(Option<&str>, &str, &[crate::metrics::RequestRecord])> = runs
        .iter()
        .map(|r| {
            (
                r.summary.point.as_deref(),
                r.policy.name(),
                r.report.records.as_slice(),
            )
        })
        .collect();
    crate::results::write_results_dir(&s.text, &records, &summaries, dir)
}
