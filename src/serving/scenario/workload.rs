//! The `[workload]` table of a serving scenario: a generated QA workload or a replayed
//! dataset or trace.

use super::raw::*;
use std::path::Path;

use crate::scenario::{Check, MAX_REQUESTS, MAX_TOKENS, ScenarioError, non_negative};
use crate::workload::WorkloadSpec;
use crate::workload::output::OutputDist;
use crate::workload::qa::{ContextMode, Dataset, Order, QaWorkload};
use crate::workload::replay::{DEFAULT_SYSTEM_PROMPT, QaOptions, ReplaySpec, Source};
use crate::workload::reuse::{self, Popularity, Reuse};

/// Largest Zipf exponent: beyond it nearly every request is about the most popular context.
const MAX_ZIPF_ALPHA: f64 = 10.0;

/// Refuses a pool whose contexts (at most `context_tokens` each), or whose conversations'
/// answers (`requests` answers of at most `answer_tokens`), would hold more than
/// [`reuse::MAX_POOL_TOKENS`] tokens: the run would need many GiB before it starts.
fn check_pool_size(
    c: &Check,
    reuse: &Reuse,
    context_tokens: u32,
    requests: u32,
    answer_tokens: u32,
) -> Result<(), ScenarioError> {
    let pool = u64::from(reuse.contexts) * u64::from(context_tokens);
    if pool > reuse::MAX_POOL_TOKENS {
        return Err(c.err(
            "workload.reuse.contexts",
            format!(
                "{} contexts of up to {context_tokens} tokens hold up to {pool} tokens, more than \
                 {}: ask for fewer or shorter contexts",
                reuse.contexts,
                reuse::MAX_POOL_TOKENS
            ),
        ));
    }
    let answers = u64::from(requests) * u64::from(answer_tokens);
    if reuse.turns > 1 && answers > reuse::MAX_POOL_TOKENS {
        return Err(c.err(
            "workload.reuse.turns",
            format!(
                "{requests} answers of up to {answer_tokens} tokens, each kept for the next turn's \
                 prompt, hold up to {answers} tokens, more than {}",
                reuse::MAX_POOL_TOKENS
            ),
        ));
    }
    Ok(())
}

/// `[workload.reuse]`, validated; `order` must then be absent (the pool decides the order).
fn reuse_table(c: &Check, w: &RawWorkload) -> Result<Option<Reuse>, ScenarioError> {
    let Some(r) = &w.reuse else {
        return Ok(None);
    };
    if w.order.is_some() {
        return Err(c.err(
            "workload.order",
            "not used with [workload.reuse]: popularity and reuse_distance decide which \
             context each request is about",
        ));
    }
    let contexts = c.count(
        "workload.reuse.contexts",
        r.contexts.ok_or_else(|| {
            c.err(
                "workload.reuse",
                "missing field `contexts` (the number of distinct contexts)",
            )
        })?,
        reuse::MAX_CONTEXTS,
    )?;
    let min_context_tokens = min_context_tokens(c, w, r)?;
    let questions_per_context = match r.questions_per_context {
        Some(q) => Some(c.count(
            "workload.reuse.questions_per_context",
            q,
            reuse::MAX_QUESTIONS_PER_CONTEXT,
        )?),
        None => None,
    };
    let popularity = popularity(c, r)?;
    let reuse_distance = reuse_distance(c, r)?;
    let turns = c.count(
        "workload.reuse.turns",
        r.turns.unwrap_or(1),
        reuse::MAX_TURNS,
    )?;
    let turn_gap_s = turn_gap_s(c, r)?;
    Ok(Some(Reuse {
        contexts,
        min_context_tokens,
        questions_per_context,
        popularity,
        reuse_distance,
        turns,
        turn_gap_s,
    }))
}

/// `workload.reuse.min_context_tokens`: 0 when absent; only with windowed contexts, and at
/// most [`reuse::MAX_MIN_CONTEXT_FRACTION`] of the window.
fn min_context_tokens(c: &Check, w: &RawWorkload, r: &RawReuse) -> Result<u32, ScenarioError> {
    match (
        r.min_context_tokens,
        w.context.unwrap_or_else(default_context),
    ) {
        (None, _) => Ok(0),
        (Some(_), RawContext::Unit) => Err(c.err(
            "workload.reuse.min_context_tokens",
            "only used with context = \"window\"",
        )),
        (Some(m), RawContext::Window) => {
            let window = w.context_tokens.unwrap_or_else(default_context_tokens);
            let most = (window as f64 * reuse::MAX_MIN_CONTEXT_FRACTION) as u32;
            if m > most {
                return Err(c.err(
                    "workload.reuse.min_context_tokens",
                    format!(
                        "expected at most {most} (3/4 of context_tokens = {window}), found {m}"
                    ),
                ));
            }
            Ok(m)
        }
    }
}

/// `workload.reuse.popularity` (uniform when absent) with its `zipf_alpha`, which only Zipf
/// popularity takes and needs, at most [`MAX_ZIPF_ALPHA`].
fn popularity(c: &Check, r: &RawReuse) -> Result<Popularity, ScenarioError> {
    match (r.popularity.unwrap_or(RawPopularity::Uniform), r.zipf_alpha) {
        (RawPopularity::Uniform, None) => Ok(Popularity::Uniform),
        (RawPopularity::Uniform, Some(_)) => Err(c.err(
            "workload.reuse.zipf_alpha",
            "only used with popularity = \"zipf\"",
        )),
        (RawPopularity::Zipf, None) => Err(c.err(
            "workload.reuse",
            "missing field `zipf_alpha` (popularity = \"zipf\" needs its exponent)",
        )),
        (RawPopularity::Zipf, Some(alpha)) => {
            let alpha = non_negative(c, "workload.reuse.zipf_alpha", alpha)?;
            if alpha > MAX_ZIPF_ALPHA {
                return Err(c.err(
                    "workload.reuse.zipf_alpha",
                    format!("expected at most {MAX_ZIPF_ALPHA}, found {alpha}"),
                ));
            }
            Ok(Popularity::Zipf { alpha })
        }
    }
}

/// `workload.reuse.reuse_distance`, when set: not negative and at most
/// [`reuse::MAX_REUSE_DISTANCE`].
fn reuse_distance(c: &Check, r: &RawReuse) -> Result<Option<f64>, ScenarioError> {
    let Some(d) = r.reuse_distance else {
        return Ok(None);
    };
    let d = non_negative(c, "workload.reuse.reuse_distance", d)?;
    if d > reuse::MAX_REUSE_DISTANCE {
        return Err(c.err(
            "workload.reuse.reuse_distance",
            format!(
                "expected at most {:e}, found {d}",
                reuse::MAX_REUSE_DISTANCE
            ),
        ));
    }
    Ok(Some(d))
}

/// `workload.reuse.turn_gap_s` ([`reuse::DEFAULT_TURN_GAP_S`] when absent): not negative and
/// at most [`reuse::MAX_TURN_GAP_S`].
fn turn_gap_s(c: &Check, r: &RawReuse) -> Result<f64, ScenarioError> {
    let Some(g) = r.turn_gap_s else {
        return Ok(reuse::DEFAULT_TURN_GAP_S);
    };
    let g = non_negative(c, "workload.reuse.turn_gap_s", g)?;
    if g > reuse::MAX_TURN_GAP_S {
        return Err(c.err(
            "workload.reuse.turn_gap_s",
            format!("expected at most {} s, found {g}", reuse::MAX_TURN_GAP_S),
        ));
    }
    Ok(g)
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
pub(super) fn workload(
    c: &Check,
    file: &str,
    w: &RawWorkload,
) -> Result<WorkloadSpec, ScenarioError> {
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
        (Some(dataset), None) => return generated(c, w, dataset, order, context),
        (None, Some(s)) => match s {
            RawSource::SquadJson => Source::SquadJson,
            RawSource::WikiqaTsv => Source::WikiqaTsv,
            RawSource::MooncakeJsonl => Source::MooncakeJsonl,
            RawSource::VidurCsv => Source::VidurCsv,
            RawSource::Canonical => Source::Canonical,
        },
    };
    replay(c, file, w, source, order, context)
}

/// A built-in generator (`dataset = ...`).
fn generated(
    c: &Check,
    w: &RawWorkload,
    dataset: RawDataset,
    order: Order,
    context: ContextMode,
) -> Result<WorkloadSpec, ScenarioError> {
    let missing = |key: &str| c.err("workload", format!("missing field `{key}`"));
    for (key, set) in [
        ("path", w.path.is_some()),
        ("tokenizer", w.tokenizer.is_some()),
        ("skip_bad_lines", w.skip_bad_lines.is_some()),
        ("skip_too_long", w.skip_too_long.is_some()),
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
    let w = QaWorkload {
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
        reuse: reuse_table(c, w)?,
    };
    if let Some(r) = &w.reuse {
        // A context is at most a window (or a unit): the longest prompt bounds it.
        check_pool_size(c, r, w.max_prompt_tokens(), w.requests, w.output.max())?;
    }
    Ok(WorkloadSpec::Generated(w))
}

/// A replayed dataset or trace file (`source = ...`), its path relative to the scenario file.
fn replay(
    c: &Check,
    file: &str,
    w: &RawWorkload,
    source: Source,
    order: Order,
    context: ContextMode,
) -> Result<WorkloadSpec, ScenarioError> {
    let missing = |key: &str| c.err("workload", format!("missing field `{key}`"));
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
            reuse: reuse_table(c, w)?,
        }
    } else {
        for (key, set) in [
            ("reuse", w.reuse.is_some()),
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
        skip_too_long: w.skip_too_long.unwrap_or(false),
        qa,
    }))
}
