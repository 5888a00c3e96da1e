//! The `[[fault]]` tables of a scenario file (see `crate::fault` for what each kind
//! does). Each system then refuses the kinds it cannot inject.

use serde::Deserialize;

use super::{Check, ScenarioError};
use crate::fault::Fault;
use crate::units::Nanos;

/// Most faults one scenario may inject.
pub const MAX_FAULTS: usize = 1024;

/// One `[[fault]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum RawFault {
    NodeCrash {
        node: u32,
        at_s: f64,
    },
    StoreRestart {
        node: u32,
        at_s: f64,
    },
    LinkSlow {
        node: u32,
        at_s: f64,
        for_s: f64,
        factor: f64,
    },
    GpuSlow {
        node: u32,
        gpu: u32,
        at_s: f64,
        for_s: f64,
        factor: f64,
    },
    ShardRestart {
        shard: usize,
        request: u32,
        after_tokens: u32,
    },
}

/// Validates `[[fault]]`: times finite and not negative, durations positive, factors in
/// [0, 1] (a GPU cannot be stopped: (0, 1]), nodes below `nodes` and GPUs below
/// `gpus_per_node` (when the system has them). Shard and request bounds are the pipeline's
/// to check.
pub(crate) fn faults(
    c: &Check,
    raw: &[RawFault],
    nodes: Option<(u32, u32)>,
) -> Result<Vec<Fault>, ScenarioError> {
    if raw.len() > MAX_FAULTS {
        return Err(c.err("fault", format!("at most {MAX_FAULTS} faults")));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (i, f) in raw.iter().enumerate() {
        let key = |k: &str| format!("fault[{i}].{k}");
        let time = |k: &str, v: f64| -> Result<Nanos, ScenarioError> {
            if v.is_finite() && (0.0..=1e9).contains(&v) {
                Ok(Nanos::from_secs_f64(v))
            } else {
                Err(c.err(
                    &key(k),
                    format!("expected seconds from 0 to 1e9, found {v}"),
                ))
            }
        };
        let node = |n: u32| -> Result<u32, ScenarioError> {
            match nodes {
                Some((count, _)) if n >= count => Err(c.err(
                    &key("node"),
                    format!("expected a node below {count}, found {n}"),
                )),
                _ => Ok(n),
            }
        };
        let window = |at_s: f64, for_s: f64| -> Result<(Nanos, Nanos), ScenarioError> {
            let at = time("at_s", at_s)?;
            if !(for_s.is_finite() && for_s > 0.0 && for_s <= 1e9) {
                return Err(c.err(
                    &key("for_s"),
                    format!("expected a positive duration in seconds, found {for_s}"),
                ));
            }
            Ok((at, at + Nanos::from_secs_f64(for_s)))
        };
        let factor = |v: f64, zero_ok: bool| -> Result<f64, ScenarioError> {
            let ok = v.is_finite() && v <= 1.0 && (v > 0.0 || (zero_ok && v == 0.0));
            if ok {
                Ok(v)
            } else {
                let range = if zero_ok { "[0, 1]" } else { "(0, 1]" };
                Err(c.err(
                    &key("factor"),
                    format!("expected a fraction of full speed in {range}, found {v}"),
                ))
            }
        };
        out.push(match *f {
            RawFault::NodeCrash { node: n, at_s } => Fault::NodeCrash {
                node: node(n)?,
                at: time("at_s", at_s)?,
            },
            RawFault::StoreRestart { node: n, at_s } => Fault::StoreRestart {
                node: node(n)?,
                at: time("at_s", at_s)?,
            },
            RawFault::LinkSlow {
                node: n,
                at_s,
                for_s,
                factor: f,
            } => {
                let (at, until) = window(at_s, for_s)?;
                Fault::LinkSlow {
                    node: node(n)?,
                    at,
                    until,
                    factor: factor(f, true)?,
                }
            }
            RawFault::GpuSlow {
                node: n,
                gpu,
                at_s,
                for_s,
                factor: f,
            } => {
                if let Some((_, gpus)) = nodes
                    && gpu >= gpus
                {
                    return Err(c.err(
                        &key("gpu"),
                        format!("expected a GPU below {gpus}, found {gpu}"),
                    ));
                }
                let (at, until) = window(at_s, for_s)?;
                Fault::GpuSlow {
                    node: node(n)?,
                    gpu,
                    at,
                    until,
                    factor: factor(f, false)?,
                }
            }
            RawFault::ShardRestart {
                shard,
                request,
                after_tokens,
            } => Fault::ShardRestart {
                shard,
                request,
                after_tokens,
            },
        });
    }
    Ok(out)
}

/// Refuses the faults of `kinds` that a system cannot inject, naming the first.
pub(crate) fn refuse(
    c: &Check,
    faults: &[Fault],
    system: &str,
    refused: &[&str],
) -> Result<(), ScenarioError> {
    for (i, f) in faults.iter().enumerate() {
        if refused.contains(&f.kind()) {
            return Err(c.err(
                &format!("fault[{i}].kind"),
                format!(
                    "{} faults are not supported by {system} scenarios",
                    f.kind()
                ),
            ));
        }
    }
    Ok(())
}
