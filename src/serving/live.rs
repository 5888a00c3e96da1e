//! Live serving: a serving scenario's actors (router, instances, metadata service, store
//! servers) on the live host ([`crate::live::host`]), with real tensors.
//!
//! The actors are exactly the simulation's ([`super::build::actors`]); what changes is what
//! hosts them and what their backends do:
//!
//! * every instance gets a [`PagedCandleBackend`]: the scenario's model (f32, weights seeded
//!   from the scenario's seed, the same for every instance) with a paged K/V cache of the
//!   instance's `num_blocks` blocks, so continuous batching, chunked prefill, preemption and
//!   local prefix reuse run on real K/V;
//! * under store policies, the store servers hold the real K/V of what the metadata service
//!   places on their node ([`crate::serving::store::memory`]), and a load copies it from the
//!   owner's memory into the reader's blocks;
//! * time is the wall clock: requests arrive on tokio timers at the trace's times, and
//!   TTFT, TPOT and throughput are measured, not modelled. The "nodes" and "GPUs" of the
//!   scenario are actor places on the host: every instance computes on the host's CPU
//!   cores (or its CUDA device), so instances that compute at once share them.
//!
//! **Reuse never changes the output.** Every completed request's greedy tokens and first-token
//! logits are kept; [`check_outputs`] compares each policy with `vanilla` (full recompute),
//! request by request: the tokens must be equal and the logits agree within
//! [`LOGIT_TOLERANCE`]. A live run of a scenario that lists `vanilla` fails when they do not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use candle_core::DType;

use super::build::{actors, transformer};
use super::outcome::{OutputCheck, PolicyRun};
use super::policy::Policy;
use super::scenario::Scenario;
use super::store::memory::ClusterMemory;
use crate::backend::{BatchBackend, PagedCandleBackend, Timing};
use crate::exec::weights::{self, WeightSource};
use crate::exec::{ShardModel, default_device, model::max_abs_diff};
use crate::live::LiveError;
use crate::metrics::Summary;
use crate::results::RunError;
use crate::scenario::{Check, ScenarioError};
use crate::workload::Trace;
use crate::workload::TraceError;

/// Most memory a live run may hold: the weights (once: instances share them), every
/// instance's K/V capacity and every store's host and SSD capacity, in f32 (16 GiB).
pub const MAX_LIVE_BYTES: u64 = 16 << 30;
/// Largest difference allowed between a policy's first-token logits and vanilla's. Reuse
/// computes the same numbers in another order (a prefix's K/V computed in other chunks), so
/// they may differ in the last bits of f32; a wrong K/V differs by far more.
pub const LOGIT_TOLERANCE: f32 = 1e-3;

/// The bytes a live run of `s` holds: weights, K/V capacity of every instance, stores.
pub fn live_bytes(s: &Scenario) -> u64 {
    let m = &s.model;
    let f32_model = crate::model::ModelConfig {
        bytes_per_element: 4,
        ..m.clone()
    };
    let cfg = &s.serving.instance;
    let kv = s.instances() as u64
        * cfg.num_blocks as u64
        * cfg.block_size as u64
        * f32_model.kv_bytes_per_token();
    // Policies run one after the other: the largest store is what a run may hold at once.
    let stores = s
        .policies
        .iter()
        .filter_map(|p| p.store_rules())
        .map(|r| s.hardware.nodes as u64 * (r.host_capacity_bytes + r.ssd_capacity_bytes))
        .max()
        .unwrap_or(0);
    f32_model
        .weight_bytes()
        .saturating_add(kv)
        .saturating_add(stores)
}

/// Refuses, naming the key, what a live run of `s` cannot do (checked before any work).
pub fn check_live(s: &Scenario, file: &str) -> Result<(), ScenarioError> {
    let c = Check { file };
    if s.model.bytes_per_element != 4 {
        return Err(c.err(
            "model.dtype",
            "the candle backend of live runs computes in f32: set model.dtype = \"f32\"",
        ));
    }
    if !s.faults.is_empty() {
        return Err(c.err("fault", "faults are injected in simulations only"));
    }
    let bytes = live_bytes(s);
    if bytes > MAX_LIVE_BYTES {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(c.err(
            "hardware.gpu.memory_gib",
            format!(
                "a live run would hold {:.1} GiB (f32 weights, the K/V capacity of {} instances \
                 and the stores' host and SSD capacity); live runs hold at most {:.0} GiB: give \
                 the GPUs less memory, or the stores less capacity",
                gib(bytes),
                s.instances(),
                gib(MAX_LIVE_BYTES)
            ),
        ));
    }
    crate::scenario::check_cookie(&c, &s.nodes, s.cookie_file.as_deref())?;
    for p in &s.points {
        check_live(&p.scenario, file)?;
    }
    Ok(())
}

/// Runs one policy of `s` on the live host.
pub async fn live(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: &Policy,
) -> Result<PolicyRun, LiveError> {
    live_with(s, trace, policy, None).await
}

/// [`live`], with every store read returning wrong K/V (each value plus `corrupt`) when
/// given: a fault to show that [`check_outputs`] catches a wrong load.
pub async fn live_with(
    s: &Scenario,
    trace: Arc<Trace>,
    policy: &Policy,
    corrupt: Option<f32>,
) -> Result<PolicyRun, LiveError> {
    let started = Instant::now();
    let cfg = transformer(s)?;
    let device = default_device();
    let config = |e: &dyn std::fmt::Display| LiveError::Config(e.to_string());
    let vb = weights::var_builder(
        &cfg,
        0..cfg.layers,
        &WeightSource::Seeded(s.seed),
        DType::F32,
        &device,
    )
    .map_err(|e| config(&e))?;
    let model = ShardModel::new(&cfg, 0..cfg.layers, vb).map_err(|e| config(&e))?;
    let memory = policy
        .uses_store()
        .then(|| Arc::new(ClusterMemory::new(s.hardware.nodes)));
    if let (Some(m), Some(delta)) = (&memory, corrupt) {
        m.corrupt_reads(delta);
    }
    let timing = Arc::new(std::sync::Mutex::new(Timing::default()));
    let mut backends = backends(s, &model, &trace, memory.as_ref(), &timing)?;
    let (list, _) = actors(
        s,
        trace,
        policy,
        &mut |i| {
            let b = backends[i as usize]
                .take()
                .expect("one backend per instance");
            Box::new(b) as Box<dyn BatchBackend>
        },
        memory.clone(),
    );
    let list = list.into_iter().map(|(a, _)| a).collect();
    let out = crate::live::host::run(list, s.seed, s.max_wall).await?;
    let summary = Summary::new(policy.name(), &out.report, out.messages);
    let t = *timing.lock().unwrap_or_else(|e| e.into_inner());
    let price = |terms: &[f64; crate::model::batch_profile::TERMS]| {
        s.serving
            .profile
            .as_ref()
            .map(|(_, fit)| fit.price(terms) / 1e9)
    };
    log_timing(policy, &t, &price);
    if let Some(m) = &memory {
        log_memory(policy, m);
    }
    Ok(PolicyRun {
        policy: policy.clone(),
        report: out.report,
        summary,
        wall: started.elapsed().max(out.wall),
        spooled: None,
        latencies: None,
        output_check: None,
        timing: Some(t),
        across: None,
    })
}

/// One paged candle backend for each instance of `s`, over the one `model` (its weights
/// shared), reading stored K/V from `memory` under store policies and recording where the
/// time of iterations goes in `timing`.
fn backends(
    s: &Scenario,
    model: &ShardModel,
    trace: &Arc<Trace>,
    memory: Option<&Arc<ClusterMemory>>,
    timing: &Arc<std::sync::Mutex<Timing>>,
) -> Result<Vec<Option<PagedCandleBackend>>, LiveError> {
    let inst = s.serving.instance;
    let device = Arc::new(crate::backend::DeviceLock::default());
    let mut backends = Vec::with_capacity(s.instances() as usize);
    for _ in 0..s.instances() {
        let mut b = PagedCandleBackend::new(
            model.clone(),
            trace.clone(),
            inst.block_size,
            inst.num_blocks,
            memory
                .cloned()
                .map(|m| m as Arc<dyn crate::backend::KvSource>),
        )
        .map_err(|e| LiveError::Config(e.to_string()))?;
        if s.serving.shared_device {
            b = b.with_device_lock(device.clone());
        }
        b = b.with_timing(timing.clone());
        backends.push(Some(b));
    }
    Ok(backends)
}

/// Logs where a live run's iterations spent their time, in all and by kind, with what the
/// scenario's profile prices them at (`price`).
fn log_timing(
    policy: &Policy,
    t: &Timing,
    price: &dyn Fn(&[f64; crate::model::batch_profile::TERMS]) -> Option<f64>,
) {
    let all = t.all();
    let priced = price(&all.terms);
    tracing::info!(
        policy = policy.name(),
        iterations = all.iterations,
        compute_s = all.compute.as_secs_f64(),
        profile_prices_s = priced,
        waiting_for_device_s = t.waiting.as_secs_f64(),
        kv_copies_s = t.copies.as_secs_f64(),
        "live iterations"
    );
    // By kind: a profile that prices decode steps well and chunks badly shows here.
    for kind in crate::backend::IterationKind::ALL {
        let k = &t.by_kind[kind as usize];
        if k.iterations == 0 {
            continue;
        }
        let priced = price(&k.terms);
        tracing::info!(
            policy = policy.name(),
            kind = kind.name(),
            iterations = k.iterations,
            compute_s = k.compute.as_secs_f64(),
            profile_prices_s = priced,
            profile_error = priced.map(|p| format!(
                "{:+.1}%",
                100.0 * (p / k.compute.as_secs_f64().max(1e-9) - 1.0)
            )),
            "live iterations by kind"
        );
    }
}

/// Logs what each node's store memory held and served in a live run.
fn log_memory(policy: &Policy, m: &ClusterMemory) {
    for node in 0..m.nodes() {
        let st = m.stats(node);
        tracing::info!(
            policy = policy.name(),
            node,
            peak_host_bytes = st.peak_host_bytes,
            ssd_bytes = st.ssd_bytes,
            reads = st.reads,
            missed_reads = st.missed_reads,
            holes = st.holes,
            "live store memory"
        );
    }
}

/// Runs every policy at every sweep point of `s` on the live host, one after another (in
/// this process, or across the `meshsim node`s of `[live] nodes`: see
/// [`super::cluster`]), then checks every policy's outputs against vanilla's
/// ([`check_outputs`]).
pub async fn live_all(s: &Scenario) -> Result<Vec<PolicyRun>, RunError> {
    let points = s.runs();
    let mut traces = Vec::with_capacity(points.len());
    for (_, p) in &points {
        let trace = super::build::trace(p)?;
        fits_the_model(p, &trace)?;
        traces.push(Arc::new(trace));
    }
    let mut coordinator = if s.nodes.is_empty() {
        None
    } else {
        let Some(path) = &s.cookie_file else {
            return Err(RunError::Live(LiveError::Config(
                "[live] nodes needs the cluster's cookie: [live] cookie_file or --cookie-file"
                    .into(),
            )));
        };
        let cookie = crate::live::cluster::read_cookie(path).map_err(LiveError::Config)?;
        let mut max_frame = 0;
        for ((_, p), t) in points.iter().zip(&traces) {
            max_frame = max_frame.max(super::cluster::max_frame(p, t)?);
        }
        Some(crate::live::cluster::Coordinator::connect(&s.nodes, cookie, max_frame).await?)
    };
    let result = live_points(&points, &traces, coordinator.as_mut()).await;
    if let Some(c) = &coordinator {
        c.shutdown().await;
    }
    result
}

async fn live_points(
    points: &[(Option<&str>, &Scenario)],
    traces: &[Arc<Trace>],
    mut coordinator: Option<&mut crate::live::cluster::Coordinator>,
) -> Result<Vec<PolicyRun>, RunError> {
    let mut runs = Vec::new();
    for (&(label, p), trace) in points.iter().zip(traces) {
        let mut mine = Vec::new();
        for policy in &p.policies {
            let mut r = match coordinator.as_deref_mut() {
                Some(c) => {
                    let r = super::cluster::live(p, trace.clone(), policy, c).await;
                    for (t, what) in &c.timeline {
                        tracing::info!("{:>9.3} s  {what}", t.as_secs_f64());
                    }
                    r?
                }
                None => live(p, trace.clone(), policy).await?,
            };
            r.summary.point = label.map(str::to_string);
            mine.push(r);
        }
        let checks = check_outputs(&mine);
        if let Some(bad) = checks.iter().find(|c| c.problem.is_some()) {
            return Err(RunError::Live(LiveError::Actor(format!(
                "{}{}",
                label.map_or(String::new(), |l| format!("[{l}] ")),
                bad.problem.as_deref().unwrap_or_default()
            ))));
        }
        for c in &checks {
            tracing::info!(
                policy = c.policy,
                requests = c.requests,
                max_logit_diff = c.max_logit_diff,
                "outputs equal vanilla's"
            );
        }
        // The logits served their purpose: do not hold them for the whole run.
        for r in &mut mine {
            r.report.first_logits = Vec::new();
            r.output_check = checks.iter().find(|c| c.policy == r.policy.name()).cloned();
        }
        runs.extend(mine);
    }
    Ok(runs)
}

type ByRequest<'a> = (BTreeMap<u32, &'a Vec<u32>>, BTreeMap<u32, &'a Vec<f32>>);

/// A run's tokens and first-token logits by request.
fn by_req(r: &PolicyRun) -> ByRequest<'_> {
    let tokens = r.report.outputs.iter().map(|(q, t)| (*q, t)).collect();
    let logits = r.report.first_logits.iter().map(|(q, l)| (*q, l)).collect();
    (tokens, logits)
}

/// Refuses a trace with a request whose prompt and output outgrow the model's context (a
/// live model computes every position it is given), or with token ids beyond its vocabulary
/// (it embeds every prompt token).
fn fits_the_model(s: &Scenario, trace: &Trace) -> Result<(), TraceError> {
    let vocab = s.model.vocab;
    if let Err(e) = u32::try_from(vocab)
        .map_err(|_| format!("a vocabulary of {vocab} ids"))
        .and_then(|v| trace.check(v))
    {
        return Err(TraceError::whole(
            std::path::Path::new(&s.name),
            "workload",
            format!(
                "{e}: {} embeds ids below {vocab} only (a model whose vocabulary holds the \
                 tokenizer's ids serves, such as tiny-32k for the Mistral tokenizer and the \
                 pseudo tokens of traces that name blocks)",
                s.model.name
            ),
        ));
    }
    let most = s.model.max_context;
    if let Some((i, r)) = trace
        .requests
        .iter()
        .enumerate()
        .find(|(_, r)| u64::from(r.prompt_tokens) + u64::from(r.output_tokens) > most)
    {
        return Err(TraceError::whole(
            std::path::Path::new(&s.name),
            "workload",
            format!(
                "request {i} has {} prompt and {} output tokens, more than the {most} positions \
                 of {} (a live run computes them all)",
                r.prompt_tokens, r.output_tokens, s.model.name
            ),
        ));
    }
    Ok(())
}

/// Compares every policy of `runs` (one sweep point) with its `vanilla` run, request by
/// request: equal greedy tokens, first-token logits within [`LOGIT_TOLERANCE`]. Empty when
/// no run is vanilla.
pub fn check_outputs(runs: &[PolicyRun]) -> Vec<OutputCheck> {
    let Some(base) = runs.iter().find(|r| r.policy.reuses_nothing()) else {
        return Vec::new();
    };
    let (base_tokens, base_logits) = by_req(base);
    let mut checks = Vec::new();
    for r in runs.iter().filter(|r| !std::ptr::eq(*r, base)) {
        let (tokens, logits) = by_req(r);
        let mut c = OutputCheck {
            policy: r.policy.name().to_string(),
            requests: 0,
            max_logit_diff: 0.0,
            problem: None,
        };
        for (q, t) in &tokens {
            let Some(b) = base_tokens.get(q) else {
                continue;
            };
            c.requests += 1;
            let diff = match (logits.get(q), base_logits.get(q)) {
                (Some(l), Some(bl)) => max_abs_diff(l, bl),
                _ => f32::INFINITY,
            };
            c.max_logit_diff = c.max_logit_diff.max(diff);
            if c.problem.is_none() && (t != b || diff.is_nan() || diff > LOGIT_TOLERANCE) {
                c.problem = Some(format!(
                    "policy {} changed the output of request {q}: tokens {:?} against vanilla's \
                     {:?}, first-token logits differ by {diff:e} (tolerance {LOGIT_TOLERANCE:e})",
                    c.policy,
                    &t[..t.len().min(8)],
                    &b[..b.len().min(8)],
                ));
            }
        }
        checks.push(c);
    }
    checks
}
