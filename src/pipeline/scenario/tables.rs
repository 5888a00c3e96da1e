//! The tables of a pipeline scenario, each validated on its own (see [`super`]).

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use super::raw::*;
use super::{
    Arrivals, CostSource, MAX_PIPELINE_TOKENS, MAX_SESSIONS, MAX_SHARDS, MAX_TRACE_TOKENS,
    MAX_WALL_S, PipelineWorkload,
};
use crate::exec::TransformerConfig;
use crate::fault::Fault;
use crate::hardware::LinkSpec;
use crate::model::profile::Profile;
use crate::pipeline::RestartAt;
use crate::pipeline::shard::{CacheLimits, DecodeMode};
use crate::scenario::hardware::gpu_spec;
use crate::scenario::{Check, MAX_REQUESTS, ScenarioError};
use crate::sim::kernel::{Limits, MAX_EVENTS};
use crate::units::{GB, Nanos};

/// `policies`: the decode modes to compare, each once.
pub(super) fn modes(c: &Check, policies: &[RawMode]) -> Result<Vec<DecodeMode>, ScenarioError> {
    if policies.is_empty() {
        return Err(c.err("policies", "expected \"cached\" and/or \"stateless\""));
    }
    let mut sorted = policies.to_vec();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != policies.len() {
        return Err(c.err("policies", "a decode mode is listed twice"));
    }
    Ok(policies
        .iter()
        .map(|m| match m {
            RawMode::Cached => DecodeMode::Cached,
            RawMode::Stateless => DecodeMode::Stateless,
        })
        .collect())
}

/// `pipeline.model`: a preset of the model catalogue.
pub(super) fn model(c: &Check, name: &str) -> Result<TransformerConfig, ScenarioError> {
    TransformerConfig::preset(name).ok_or_else(|| {
        c.err(
            "pipeline.model",
            format!(
                "unknown model {:?}; expected one of {}",
                name,
                crate::model::catalogue::names()
            ),
        )
    })
}

/// `pipeline.shards` (a count, split evenly) or `pipeline.layers` (explicit ranges).
pub(super) fn layers(
    c: &Check,
    p: &RawPipeline,
    model: &TransformerConfig,
) -> Result<Vec<Range<usize>>, ScenarioError> {
    Ok(match (p.shards, &p.layers) {
        (Some(n), None) => {
            if n == 0 || n > model.layers || n > MAX_SHARDS {
                return Err(c.err(
                    "pipeline.shards",
                    format!(
                        "expected 1 to {} shards for {} layers, found {n}",
                        model.layers.min(MAX_SHARDS),
                        model.layers
                    ),
                ));
            }
            crate::model::split_layers(model.layers, n)
                .map_err(|e| c.err("pipeline.shards", e.to_string()))?
        }
        (None, Some(l)) => {
            let mut next = 0;
            for (i, [a, b]) in l.iter().enumerate() {
                if *a != next || b <= a {
                    return Err(c.err(
                        &format!("pipeline.layers[{i}]"),
                        format!("expected [{next}, end] with end > {next}, found [{a}, {b}]"),
                    ));
                }
                next = *b;
            }
            if next != model.layers || l.len() > MAX_SHARDS {
                return Err(c.err(
                    "pipeline.layers",
                    format!(
                        "the ranges must cover layers 0..{} in at most {MAX_SHARDS} shards",
                        model.layers
                    ),
                ));
            }
            l.iter().map(|[a, b]| *a..*b).collect()
        }
        _ => {
            return Err(c.err(
                "pipeline",
                "expected exactly one of `shards` (a count) and `layers` (ranges)",
            ));
        }
    })
}

/// The shards' session caches and the head's session limits.
pub(super) fn sessions(c: &Check, p: &RawPipeline) -> Result<(CacheLimits, usize), ScenarioError> {
    let sessions = |key: &str, v: usize| {
        if (1..=MAX_SESSIONS).contains(&v) {
            Ok(v)
        } else {
            Err(c.err(
                key,
                format!("expected an integer from 1 to {MAX_SESSIONS}, found {v}"),
            ))
        }
    };
    let cache = CacheLimits {
        max_sessions: sessions("pipeline.max_sessions", p.max_sessions)?,
        ttl: Nanos::from_secs_f64(c.positive("pipeline.session_ttl_s", p.session_ttl_s)?),
    };
    let max_active = sessions("pipeline.max_active_sessions", p.max_active_sessions)?;
    if p.max_waiting_requests > MAX_REQUESTS as usize {
        return Err(c.err(
            "pipeline.max_waiting_requests",
            format!("expected at most {MAX_REQUESTS}"),
        ));
    }
    Ok((cache, max_active))
}

/// `pipeline.cost`: the analytic roofline on `[pipeline.gpu]`, or a measured profile of
/// exactly the scenario's split.
pub(super) fn cost(
    c: &Check,
    p: &RawPipeline,
    dir: &Path,
    layers: &[Range<usize>],
) -> Result<CostSource, ScenarioError> {
    if p.dtype != RawDtype::F32 && p.cost == RawCost::Profile {
        return Err(c.err(
            "pipeline.dtype",
            "profiles measure the candle backend, which computes in f32; bf16 is for \
             analytic simulations",
        ));
    }
    let overhead_us = p.step_overhead_us;
    if !(overhead_us.is_finite() && overhead_us >= 0.0) {
        return Err(c.err(
            "pipeline.step_overhead_us",
            format!("expected a non-negative number, found {overhead_us}"),
        ));
    }
    Ok(match p.cost {
        RawCost::Analytic => {
            if p.profile.is_some() {
                return Err(c.err(
                    "pipeline.profile",
                    "a profile is only used with cost = \"profile\"",
                ));
            }
            let g = p.gpu.as_ref().ok_or_else(|| {
                c.err(
                    "pipeline.gpu",
                    "cost = \"analytic\" needs the shards' device as a [pipeline.gpu] table",
                )
            })?;
            CostSource::Analytic {
                gpu: gpu_spec(c, "pipeline.gpu", g)?,
                overhead: Nanos::from_secs_f64(overhead_us * 1e-6),
            }
        }
        RawCost::Profile => {
            if p.gpu.is_some() || overhead_us != 0.0 {
                return Err(c.err(
                    "pipeline.gpu",
                    "[pipeline.gpu] and step_overhead_us belong to cost = \"analytic\"; \
                     a profile holds measured times",
                ));
            }
            let rel = p.profile.as_ref().ok_or_else(|| {
                c.err(
                    "pipeline.profile",
                    "cost = \"profile\" needs the path of a file written by `meshsim profile`",
                )
            })?;
            let path = dir.join(rel);
            let profile =
                Profile::load(&path).map_err(|e| c.err("pipeline.profile", e.to_string()))?;
            if profile.model != p.model {
                return Err(c.err(
                    "pipeline.profile",
                    format!(
                        "{} measures model {:?}, not {:?}",
                        path.display(),
                        profile.model,
                        p.model
                    ),
                ));
            }
            if profile.layer_ranges() != layers {
                return Err(c.err(
                    "pipeline.profile",
                    format!(
                        "{} measures shards {:?}, but the scenario splits the model into {:?}; \
                         measure this split with `meshsim profile --shards N`",
                        path.display(),
                        profile.layer_ranges(),
                        layers
                    ),
                ));
            }
            CostSource::Profile { path, profile }
        }
    })
}

/// `[pipeline.link]`: the link between every two shards.
pub(super) fn link(c: &Check, l: &RawPipeLink) -> Result<LinkSpec, ScenarioError> {
    // The pipeline's link is given at the rate its transfers achieve.
    Ok(LinkSpec {
        efficiency: 1.0,
        bandwidth: c.positive("pipeline.link.bandwidth_gb_per_s", l.bandwidth_gb_per_s)? * GB,
        latency: {
            let us = l.latency_us;
            if !(us.is_finite() && (0.0..=1e6).contains(&us)) {
                return Err(c.err(
                    "pipeline.link.latency_us",
                    format!("expected 0 to 1e6 microseconds, found {us}"),
                ));
            }
            Nanos::from_secs_f64(us * 1e-6)
        },
    })
}

/// `[workload]`: seeded prompts or tokenized texts, output length and arrivals.
pub(super) fn workload(
    c: &Check,
    w: &RawWorkload,
    dir: &Path,
    model: &TransformerConfig,
) -> Result<PipelineWorkload, ScenarioError> {
    c.count("workload.requests", w.requests, MAX_REQUESTS)?;
    let (prompt_tokens, prompts) = match (w.prompt_tokens, &w.prompts) {
        (Some(n), None) => {
            if w.tokenizer.is_some() {
                return Err(c.err("workload.tokenizer", "a tokenizer needs `prompts` (texts)"));
            }
            (
                c.count("workload.prompt_tokens", n, MAX_PIPELINE_TOKENS)?,
                None,
            )
        }
        (None, Some(texts)) if !texts.is_empty() => {
            let tok = crate::workload::tokenize::Tokenizer::load(
                w.tokenizer.as_ref().map(|t| dir.join(t)).as_deref(),
            )
            .map_err(|e| c.err("workload.tokenizer", e.to_string()))?;
            let mut ids = Vec::with_capacity(texts.len());
            for (i, t) in texts.iter().enumerate() {
                let p: Vec<u32> = tok
                    .encode(t)
                    .into_iter()
                    .map(|id| id % model.vocab as u32)
                    .collect();
                if p.is_empty() || p.len() > MAX_PIPELINE_TOKENS as usize {
                    return Err(c.err(
                        &format!("workload.prompts[{i}]"),
                        format!(
                            "expected 1 to {MAX_PIPELINE_TOKENS} tokens, found {}",
                            p.len()
                        ),
                    ));
                }
                ids.push(p);
            }
            let longest = ids.iter().map(Vec::len).max().unwrap_or(0) as u32;
            (longest, Some(ids))
        }
        _ => {
            return Err(c.err(
                "workload",
                "expected either prompt_tokens (seeded prompts) or prompts (a non-empty list of texts)",
            ));
        }
    };
    c.count(
        "workload.output_tokens",
        w.output_tokens,
        MAX_PIPELINE_TOKENS,
    )?;
    if w.requests as u64 * prompt_tokens as u64 > MAX_TRACE_TOKENS {
        return Err(c.err(
            "workload.requests",
            format!(
                "{} requests of {prompt_tokens} prompt tokens exceed the {MAX_TRACE_TOKENS} \
                 prompt tokens a trace may hold",
                w.requests
            ),
        ));
    }
    Ok(PipelineWorkload {
        requests: w.requests,
        prompt_tokens,
        prompts,
        output_tokens: w.output_tokens,
        arrivals: match (w.arrival_rate_per_s, w.closed_loop) {
            (Some(r), false) => Arrivals::Poisson(c.positive("workload.arrival_rate_per_s", r)?),
            (None, true) => Arrivals::ClosedLoop,
            _ => {
                return Err(c.err(
                    "workload",
                    "expected either arrival_rate_per_s (Poisson arrivals) or closed_loop = true",
                ));
            }
        },
    })
}

/// `[[pipeline.restart]]`: shard restarts between two tokens of a request.
pub(super) fn restarts(
    c: &Check,
    p: &RawPipeline,
    w: &RawWorkload,
    shards: usize,
    faults: &[Fault],
) -> Result<Vec<RestartAt>, ScenarioError> {
    // `[[pipeline.restart]]` first, then `[[fault]]` tables of kind `shard-restart`.
    let mut all: Vec<(String, RawRestart)> = p
        .restart
        .iter()
        .enumerate()
        .map(|(i, x)| (format!("pipeline.restart[{i}]"), x.clone()))
        .collect();
    for (i, f) in faults.iter().enumerate() {
        if let Fault::ShardRestart {
            shard,
            request,
            after_tokens,
        } = *f
        {
            let x = RawRestart {
                shard,
                request,
                after_tokens,
            };
            all.push((format!("fault[{i}]"), x));
        }
    }
    let mut restarts = Vec::with_capacity(all.len());
    for (prefix, x) in &all {
        let key = |f: &str| format!("{prefix}.{f}");
        if x.shard >= shards {
            return Err(c.err(
                &key("shard"),
                format!("expected a shard below {}, found {}", shards, x.shard),
            ));
        }
        if x.request >= w.requests {
            return Err(c.err(
                &key("request"),
                format!(
                    "expected a request below {}, found {}",
                    w.requests, x.request
                ),
            ));
        }
        if w.output_tokens < 2 {
            return Err(c.err(
                &key("after_tokens"),
                "a restart falls between two generated tokens, and requests generate only one",
            ));
        }
        if x.after_tokens == 0 || x.after_tokens >= w.output_tokens {
            return Err(c.err(
                &key("after_tokens"),
                format!(
                    "expected 1 to {} (a restart between two tokens), found {}",
                    w.output_tokens - 1,
                    x.after_tokens
                ),
            ));
        }
        restarts.push(RestartAt {
            request: x.request,
            after_tokens: x.after_tokens,
            shard: x.shard,
        });
    }
    Ok(restarts)
}

/// `[limits]`: simulated events and time, and the wall clock of live runs.
pub(super) fn limits(c: &Check, l: &RawLimits) -> Result<(Limits, Duration), ScenarioError> {
    if l.max_events == 0 {
        return Err(c.err("limits.max_events", "expected a positive integer"));
    }
    if l.max_events > MAX_EVENTS {
        return Err(c.err(
            "limits.max_events",
            format!("at most {MAX_EVENTS} events, found {}", l.max_events),
        ));
    }
    let limits = Limits {
        max_events: l.max_events,
        max_time: Nanos::from_secs_f64(c.positive("limits.max_sim_time_s", l.max_sim_time_s)?),
        max_pending: 1_000_000,
    };
    let wall = c.positive("limits.max_wall_s", l.max_wall_s)?;
    if wall > MAX_WALL_S {
        return Err(c.err(
            "limits.max_wall_s",
            format!("expected at most {MAX_WALL_S} s (a week), found {wall}"),
        ));
    }
    let max_wall = Duration::from_secs_f64(wall);
    Ok((limits, max_wall))
}
