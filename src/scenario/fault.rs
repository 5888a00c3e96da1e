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
        let t = FaultTable { c, i, nodes };
        out.push(t.fault(f)?);
    }
    Ok(out)
}

/// The checks of the `i`-th `[[fault]]` table, whose errors name its keys.
struct FaultTable<'a, 'c> {
    c: &'a Check<'c>,
    i: usize,
    /// The system's nodes and GPUs per node, when it has them.
    nodes: Option<(u32, u32)>,
}

impl FaultTable<'_, '_> {
    /// The fault of raw table `f`, validated.
    fn fault(&self, f: &RawFault) -> Result<Fault, ScenarioError> {
        Ok(match *f {
            RawFault::NodeCrash { node: n, at_s } => Fault::NodeCrash {
                node: self.node(n)?,
                at: self.time("at_s", at_s)?,
            },
            RawFault::StoreRestart { node: n, at_s } => Fault::StoreRestart {
                node: self.node(n)?,
                at: self.time("at_s", at_s)?,
            },
            RawFault::LinkSlow {
                node: n,
                at_s,
                for_s,
                factor: f,
            } => {
                let (at, until) = self.window(at_s, for_s)?;
                Fault::LinkSlow {
                    node: self.node(n)?,
                    at,
                    until,
                    factor: self.factor(f, true)?,
                }
            }
            RawFault::GpuSlow {
                node: n,
                gpu,
                at_s,
                for_s,
                factor: f,
            } => {
                self.gpu(gpu)?;
                let (at, until) = self.window(at_s, for_s)?;
                Fault::GpuSlow {
                    node: self.node(n)?,
                    gpu,
                    at,
                    until,
                    factor: self.factor(f, false)?,
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
        })
    }

    /// The dotted key `k` of this table, for errors.
    fn key(&self, k: &str) -> String {
        format!("fault[{}].{k}", self.i)
    }

    /// Key `k`'s time `v` in seconds, from 0 to 1e9.
    fn time(&self, k: &str, v: f64) -> Result<Nanos, ScenarioError> {
        if v.is_finite() && (0.0..=1e9).contains(&v) {
            Ok(Nanos::from_secs_f64(v))
        } else {
            Err(self.c.err(
                &self.key(k),
                format!("expected seconds from 0 to 1e9, found {v}"),
            ))
        }
    }

    /// Node `n`, below the system's node count when it has nodes.
    fn node(&self, n: u32) -> Result<u32, ScenarioError> {
        match self.nodes {
            Some((count, _)) if n >= count => Err(self.c.err(
                &self.key("node"),
                format!("expected a node below {count}, found {n}"),
            )),
            _ => Ok(n),
        }
    }

    /// Checks that `gpu` is below the system's GPUs per node when it has nodes.
    fn gpu(&self, gpu: u32) -> Result<(), ScenarioError> {
        if let Some((_, gpus)) = self.nodes
            && gpu >= gpus
        {
            return Err(self.c.err(
                &self.key("gpu"),
                format!("expected a GPU below {gpus}, found {gpu}"),
            ));
        }
        Ok(())
    }

    /// The start and end of a fault from `at_s` lasting a positive `for_s` seconds.
    fn window(&self, at_s: f64, for_s: f64) -> Result<(Nanos, Nanos), ScenarioError> {
        let at = self.time("at_s", at_s)?;
        if !(for_s.is_finite() && for_s > 0.0 && for_s <= 1e9) {
            return Err(self.c.err(
                &self.key("for_s"),
                format!("expected a positive duration in seconds, found {for_s}"),
            ));
        }
        Ok((at, at + Nanos::from_secs_f64(for_s)))
    }

    /// A fraction `v` of full speed, in [0, 1] when `zero_ok`, else in (0, 1].
    fn factor(&self, v: f64, zero_ok: bool) -> Result<f64, ScenarioError> {
        let ok = v.is_finite() && v <= 1.0 && (v > 0.0 || (zero_ok && v == 0.0));
        if ok {
            Ok(v)
        } else {
            let range = if zero_ok { "[0, 1]" } else { "(0, 1]" };
            Err(self.c.err(
                &self.key("factor"),
                format!("expected a fraction of full speed in {range}, found {v}"),
            ))
        }
    }
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
