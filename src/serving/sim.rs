//! Simulating a serving scenario: generate its trace once ([`super::build`]), simulate every
//! policy on it (at every sweep point) on the simulator's host ([`crate::sim::host`]).
//!
//! Policies run in parallel threads (at most one per core); each simulation is a pure function
//! of the scenario, the seed and the policy, so the results do not depend on the thread count.
//! Results are written into a temporary folder beside the target and swapped into place at
//! the end ([`crate::results::output`]), so a failed run never leaves half-written files.
//! Plots and `report.md` are made from the CSV files in that temporary folder
//! ([`crate::results::plot`]) before the swap.

use std::sync::Arc;
use std::time::Instant;

use super::Msg;
use super::build::actors;
use super::chaos::{Chaos, Targets};
use super::outcome::PolicyRun;
use super::policy::Policy;
use super::scenario::Scenario;
use crate::fault::Fault;
use crate::hardware::Place;
use crate::hardware::network::Network;
use crate::metrics::Summary;
use crate::metrics::write::write_request_rows;
use crate::results::RunError;
use crate::results::output::Scratch;
use crate::results::plot::{Latencies, run_name};
use crate::sim::host::{DEFAULT_CHECK_EVERY, SimHost};
use crate::sim::host::{FetchOverhead, MemoryLoss};
use crate::sim::kernel::SimError;
use crate::sim::progress::{Board, Progress};
use crate::units::Nanos;
use crate::workload::Trace;

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

/// Simulates one policy on `trace`.
pub fn simulate(s: &Scenario, trace: Arc<Trace>, policy: &Policy) -> Result<PolicyRun, SimError> {
    simulate_checked(s, trace, policy, DEFAULT_CHECK_EVERY)
}

/// Simulates one policy on `trace`, checking every actor's invariants every `check_every`
/// events (0: only at the end). Checks never change results.
pub fn simulate_checked(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: &Policy,
    check_every: u64,
) -> Result<PolicyRun, SimError> {
    simulate_watched(s, trace, policy, check_every, None)
}

/// [`simulate_checked`], reporting progress into `progress` (see [`crate::sim::progress`]).
pub fn simulate_watched(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: &Policy,
    check_every: u64,
    progress: Option<Arc<Progress>>,
) -> Result<PolicyRun, SimError> {
    let started = Instant::now();
    let mut host = SimHost::new(Network::new(&s.hardware), s.limits, s.seed);
    host.set_check_every(check_every);
    host.set_purpose(super::msg::purpose);
    if let Some(p) = progress {
        host.set_progress(p);
    }
    host.set_fetch_overhead(FetchOverhead {
        request: s.store.fetch_request_overhead,
        segment: s.store.fetch_segment_overhead,
    });
    // One pricing, shared by every instance's backend.
    let backend = s.batch_backend();
    let (actors, targets) = actors(
        s,
        trace.clone(),
        policy,
        &mut |_| Box::new(backend.clone()),
        None,
    );
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
    let mut summary =
        Summary::new(policy.name(), &outcome.report, outcome.events).with_links(outcome.links);
    let cfg = &s.serving.instance;
    summary.gpu_optimal_hit_ratio = super::optimal::gpu_optimal_hit_ratio(
        &trace,
        &outcome.report.records,
        s.instances(),
        cfg.block_size,
        cfg.num_blocks as u64 * cfg.block_size as u64,
    );
    Ok(PolicyRun {
        policy: policy.clone(),
        report: outcome.report,
        summary,
        wall: started.elapsed(),
        spooled: None,
        latencies: None,
        output_check: None,
        timing: None,
        across: None,
    })
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
        .map(|policy| Job {
            label: None,
            scenario: s,
            trace: trace.clone(),
            policy,
            progress: None,
            index: 0,
        })
        .collect();
    run_jobs(&jobs, threads, None, DEFAULT_CHECK_EVERY)
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
    policy: &'a Policy,
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
    check_every: u64,
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
            check_every,
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
    /// Actor events between invariant checks of every actor; `None`: [`DEFAULT_CHECK_EVERY`]
    /// (checks are read-only: results do not depend on it).
    pub check_every: Option<u64>,
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
            let t = Arc::new(super::build::trace(sc)?);
            tracing::info!(
                point = label.unwrap_or(""),
                requests = t.requests.len(),
                wall_s = started.elapsed().as_secs_f64(),
                "trace built"
            );
            let span = t.requests.last().map_or(Nanos::ZERO, |r| r.arrival);
            for (j, p) in sc.policies.iter().enumerate() {
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
    let check_every = o.check_every.unwrap_or(DEFAULT_CHECK_EVERY);
    run_jobs(&jobs, threads, o.spool, check_every)
        .into_iter()
        .zip(index)
        .map(|(r, i)| r.map(|r| (i, r)))
        .collect()
}
