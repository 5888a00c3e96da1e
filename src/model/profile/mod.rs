//! Measured profiles of the real backend (DESIGN: "A measured profile of the real backend can
//! replace the analytic cost model").
//!
//! A [`Profile`] holds, for each shard of a pipeline route (a contiguous layer range), the wall
//! time of one [`crate::backend::ModelBackend::run`] call of that shard alone on a grid of shapes:
//!
//! - **prefill**: `n` new tokens from an empty cache, for each `n` of the prefill grid (this is
//!   also what a stateless pass costs);
//! - **decode**: one new token with `c` tokens already cached, for each context `c` of the
//!   decode grid.
//!
//! This module holds the data (types, TOML, interpolation) that simulations use; measuring is
//! apart, in `crate::profiling` (`meshsim profile`), as Vidur keeps its profiling apart from
//! its execution-time predictor.
//!
//! Between grid points a profile is **piecewise linear**; below the first point it takes the
//! first point's value; beyond the last it extrapolates the line through the last two points,
//! never going below the last value (one point alone gives a constant). See
//! [`ShardProfile::prefill`] and [`ShardProfile::decode`].
//! [`crate::backend::SimBackend::profiled`] charges these times instead of the roofline
//! [`crate::model::cost::CostModel`].
//!
//! Files are TOML written by [`Profile::to_toml`] (`crate::profiling::write` writes them to a
//! file, atomically):
//!
//! ```toml
//! model = "small"
//! device = "cpu"
//! dtype = "f32"
//! repeats = 5
//! [[shard]]
//! layers = [0, 4]
//! prefill = [[1, 123456], [8, 234567]]   # [new tokens, ns]
//! decode = [[1, 34567], [16, 35678]]     # [cached context tokens, ns]
//! ```
//!
//! [`Profile::load`] rejects, with the file, the key (`shard[1].decode[3]`) and the reason: an
//! unreadable file, a TOML syntax or type error (with its line and column), an unknown key, an
//! unknown model name, an empty or unsorted grid or one with a duplicate point, a non-positive
//! token count or time, and layer ranges that are not contiguous from layer 0 to the model's
//! last layer.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;

use super::batch_profile::{BatchProfile, IterationPoint};
use crate::units::Nanos;

/// What can go wrong with a profile file or a measurement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("{file}: cannot read: {message}")]
    Unreadable { file: String, message: String },
    #[error("{}: {message}", place(file, *line_col, key))]
    Syntax {
        file: String,
        /// Line and column (from 1) of the offending text, when known.
        line_col: Option<(usize, usize)>,
        /// Key path, empty for the whole file.
        key: String,
        message: String,
    },
    #[error("{file}: {key}: {message}")]
    Grid {
        file: String,
        key: String,
        message: String,
    },
    #[error("{file}: {key}: expected a positive {what}, found {value}")]
    NonPositive {
        file: String,
        key: String,
        what: &'static str,
        value: i64,
    },
    #[error("{file}: {key}: empty grid (at least one point is needed)")]
    EmptyGrid { file: String, key: String },
    #[error("{file}: {key}: {message}")]
    Layers {
        file: String,
        key: String,
        message: String,
    },
    #[error(
        "{file}: model: unknown model {name:?} ({})",
        crate::model::catalogue::names()
    )]
    UnknownModel { file: String, name: String },
    #[error("{file}: {key}: {message}")]
    Invalid {
        file: String,
        key: String,
        message: String,
    },
    #[error("{file}: cannot write: {message}")]
    Write { file: String, message: String },
    #[error("measurement failed: {0}")]
    Measure(String),
}

impl ProfileError {
    /// Whether the input (a file, a grid, a layer split) was at fault, rather than the
    /// measurement or the file system.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, ProfileError::Measure(_) | ProfileError::Write { .. })
    }
}

fn place(file: &str, line_col: Option<(usize, usize)>, key: &str) -> String {
    let mut s = file.to_string();
    if let Some((l, c)) = line_col {
        let _ = write!(s, ":{l}:{c}");
    }
    if !key.is_empty() {
        let _ = write!(s, ": {key}");
    }
    s
}

/// Measured times of one shard (one layer range). See the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardProfile {
    pub layers: Range<usize>,
    /// `(new tokens, time)` from an empty cache, tokens strictly increasing.
    pub prefill: Vec<(u32, Nanos)>,
    /// `(cached context tokens, time of one new token)`, contexts strictly increasing.
    pub decode: Vec<(u32, Nanos)>,
}

impl ShardProfile {
    /// Time to run `tokens` new tokens from an empty cache (prefill, or a stateless pass).
    pub fn prefill(&self, tokens: usize) -> Nanos {
        interpolate(&self.prefill, tokens)
    }

    /// Time to run one new token with `context` tokens already cached.
    pub fn decode(&self, context: usize) -> Nanos {
        interpolate(&self.decode, context)
    }
}

/// The piecewise linear function through `points` (sorted by x) at `x`: the first value below
/// the first point, the line through the last two points beyond the last one (never below the
/// last value). Zero for no points. Rounds to the nearest nanosecond.
pub fn interpolate(points: &[(u32, Nanos)], x: usize) -> Nanos {
    let Some(&(x0, y0)) = points.first() else {
        return Nanos::ZERO;
    };
    let x = x as i128;
    if x <= x0 as i128 || points.len() == 1 {
        return y0;
    }
    // The segment holding x, or the last one for extrapolation.
    let i = points
        .windows(2)
        .position(|w| x <= w[1].0 as i128)
        .unwrap_or(points.len() - 2);
    let (xa, ya) = (points[i].0 as i128, points[i].1.0 as i128);
    let (xb, yb) = (points[i + 1].0 as i128, points[i + 1].1.0 as i128);
    let dx = xb - xa;
    if dx <= 0 {
        return Nanos(yb as u64);
    }
    let num = (yb - ya) * (x - xa);
    // Round half away from zero.
    let step = if num >= 0 {
        (2 * num + dx) / (2 * dx)
    } else {
        -((-2 * num + dx) / (2 * dx))
    };
    let mut y = ya + step;
    if x > xb {
        y = y.max(yb);
    }
    Nanos(y.clamp(0, u64::MAX as i128) as u64)
}

/// A measured profile of a whole route. See the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// A model of the catalogue ([`crate::model::preset`]).
    pub model: String,
    /// Where it was measured: `cpu`, `cuda:0`, ...
    pub device: String,
    /// The element type of weights and activations: `f32`.
    pub dtype: String,
    /// Runs per grid point (the median is kept).
    pub repeats: u32,
    /// Head first; layer ranges contiguous from 0 to the model's last layer. Empty in a
    /// profile of the serving batch backend alone.
    pub shards: Vec<ShardProfile>,
    /// The serving batch backend's profile (`[serving]`, see [`super::batch_profile`]).
    pub serving: Option<BatchProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    model: String,
    device: String,
    dtype: String,
    repeats: i64,
    #[serde(default)]
    shard: Vec<RawShard>,
    serving: Option<RawServing>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServing {
    block_size: i64,
    tensor_tokens: i64,
    iterations: Vec<Vec<i64>>,
    export: Vec<Vec<i64>>,
    load: Vec<Vec<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShard {
    layers: Vec<i64>,
    prefill: Vec<Vec<i64>>,
    decode: Vec<Vec<i64>>,
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Checks a grid of positive, strictly increasing points; `key` names it (`shard[0].prefill`).
pub(crate) fn check_grid(file: &str, key: &str, xs: &[i64]) -> Result<(), ProfileError> {
    if xs.is_empty() {
        return Err(ProfileError::EmptyGrid {
            file: file.into(),
            key: key.into(),
        });
    }
    for (i, &x) in xs.iter().enumerate() {
        if x <= 0 {
            return Err(ProfileError::NonPositive {
                file: file.into(),
                key: format!("{key}[{i}]"),
                what: "token count",
                value: x,
            });
        }
        if x > u32::MAX as i64 {
            return Err(ProfileError::Invalid {
                file: file.into(),
                key: format!("{key}[{i}]"),
                message: format!("token count {x} is too large"),
            });
        }
        if i > 0 && x <= xs[i - 1] {
            let what = if x == xs[i - 1] {
                "duplicate grid point"
            } else {
                "grid points must be strictly increasing"
            };
            return Err(ProfileError::Grid {
                file: file.into(),
                key: format!("{key}[{i}]"),
                message: format!("{what}: {x} after {}", xs[i - 1]),
            });
        }
    }
    Ok(())
}

/// Checks that `ranges` are non-empty, contiguous from 0 and end at `layers`; `key(i)` names
/// range `i`.
pub(crate) fn check_layers(
    file: &str,
    ranges: &[Range<usize>],
    layers: usize,
    key: impl Fn(usize) -> String,
) -> Result<(), ProfileError> {
    let err = |i: usize, message: String| ProfileError::Layers {
        file: file.into(),
        key: key(i),
        message,
    };
    if ranges.is_empty() {
        return Err(ProfileError::Layers {
            file: file.into(),
            key: "shard".into(),
            message: "no shards".into(),
        });
    }
    let mut next = 0;
    for (i, r) in ranges.iter().enumerate() {
        if r.start != next {
            return Err(err(
                i,
                format!(
                    "layer ranges must be contiguous from 0: expected a range starting at {next}, found {r:?}"
                ),
            ));
        }
        if r.end <= r.start {
            return Err(err(i, format!("empty layer range {r:?}")));
        }
        next = r.end;
    }
    if next != layers {
        return Err(err(
            ranges.len() - 1,
            format!("layer ranges end at {next}, but the model has {layers} layers"),
        ));
    }
    Ok(())
}

fn parse_points(
    file: &str,
    key: &str,
    raw: &[Vec<i64>],
) -> Result<Vec<(u32, Nanos)>, ProfileError> {
    for (i, p) in raw.iter().enumerate() {
        if p.len() != 2 {
            return Err(ProfileError::Invalid {
                file: file.into(),
                key: format!("{key}[{i}]"),
                message: format!("expected a pair [tokens, ns], found {} numbers", p.len()),
            });
        }
    }
    let xs: Vec<i64> = raw.iter().map(|p| p[0]).collect();
    check_grid(file, key, &xs)?;
    raw.iter()
        .enumerate()
        .map(|(i, p)| {
            if p[1] <= 0 {
                return Err(ProfileError::NonPositive {
                    file: file.into(),
                    key: format!("{key}[{i}]"),
                    what: "time in ns",
                    value: p[1],
                });
            }
            Ok((p[0] as u32, Nanos(p[1] as u64)))
        })
        .collect()
}

/// Validates the `[serving]` table.
fn parse_serving(file: &str, r: &RawServing) -> Result<BatchProfile, ProfileError> {
    let positive = |key: &str, what: &'static str, v: i64| {
        if v <= 0 || v > u32::MAX as i64 {
            Err(ProfileError::NonPositive {
                file: file.into(),
                key: key.into(),
                what,
                value: v,
            })
        } else {
            Ok(v as u32)
        }
    };
    let block_size = positive("serving.block_size", "token count", r.block_size)?;
    let tensor_tokens = positive("serving.tensor_tokens", "token count", r.tensor_tokens)?;
    let mut iterations = Vec::with_capacity(r.iterations.len());
    for (i, p) in r.iterations.iter().enumerate() {
        let key = format!("serving.iterations[{i}]");
        let [members, new_tokens, cached, ns] = p[..] else {
            return Err(ProfileError::Invalid {
                file: file.into(),
                key,
                message: format!(
                    "expected [members, new tokens, cached tokens, ns], found {} numbers",
                    p.len()
                ),
            });
        };
        if !(0..=u32::MAX as i64).contains(&cached) {
            return Err(ProfileError::Invalid {
                file: file.into(),
                key,
                message: format!("cached tokens {cached} out of range"),
            });
        }
        iterations.push(IterationPoint {
            members: positive(&key, "member count", members)?,
            new_tokens: positive(&key, "token count", new_tokens)?,
            cached: cached as u32,
            time: Nanos(positive(&key, "time in ns", ns)? as u64),
        });
    }
    if iterations.is_empty() {
        return Err(ProfileError::EmptyGrid {
            file: file.into(),
            key: "serving.iterations".into(),
        });
    }
    let bytes = |name: &str, v: &[Vec<i64>]| -> Result<Vec<(u64, Nanos)>, ProfileError> {
        v.iter()
            .enumerate()
            .map(|(i, p)| {
                let key = format!("serving.{name}[{i}]");
                let [b, ns] = p[..] else {
                    return Err(ProfileError::Invalid {
                        file: file.into(),
                        key,
                        message: format!("expected a pair [bytes, ns], found {} numbers", p.len()),
                    });
                };
                if b <= 0 {
                    return Err(ProfileError::NonPositive {
                        file: file.into(),
                        key,
                        what: "byte count",
                        value: b,
                    });
                }
                Ok((b as u64, Nanos(positive(&key, "time in ns", ns)? as u64)))
            })
            .collect()
    };
    Ok(BatchProfile {
        block_size,
        tensor_tokens,
        iterations,
        export: bytes("export", &r.export)?,
        load: bytes("load", &r.load)?,
    })
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let file = path.display().to_string();
        let text =
            crate::text::read_capped_string(path, crate::text::MAX_CONFIG_BYTES).map_err(|e| {
                ProfileError::Unreadable {
                    file: file.clone(),
                    message: e.to_string(),
                }
            })?;
        Profile::parse(&file, &text)
    }

    /// Parses and validates profile `text`; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Profile, ProfileError> {
        let toml_err = |key: String, e: &toml::de::Error| ProfileError::Syntax {
            file: file.to_string(),
            line_col: e.span().map(|s| line_col(text, s.start)),
            key,
            message: e.message().trim_end().to_string(),
        };
        let de = toml::Deserializer::parse(text).map_err(|e| toml_err(String::new(), &e))?;
        let raw: RawProfile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let key = if path == "." { String::new() } else { path };
            toml_err(key, e.inner())
        })?;
        let invalid = |key: &str, message: String| ProfileError::Invalid {
            file: file.into(),
            key: key.into(),
            message,
        };
        let Some(preset) = crate::model::preset(&raw.model) else {
            return Err(ProfileError::UnknownModel {
                file: file.into(),
                name: raw.model,
            });
        };
        if raw.device.trim().is_empty() {
            return Err(invalid("device", "expected a device name".into()));
        }
        if !matches!(raw.dtype.as_str(), "f32" | "f16" | "bf16") {
            return Err(invalid(
                "dtype",
                format!("expected f32, f16 or bf16, found {:?}", raw.dtype),
            ));
        }
        if raw.repeats <= 0 || raw.repeats > u32::MAX as i64 {
            return Err(ProfileError::NonPositive {
                file: file.into(),
                key: "repeats".into(),
                what: "number of runs",
                value: raw.repeats,
            });
        }
        let mut shards = Vec::with_capacity(raw.shard.len());
        for (i, s) in raw.shard.iter().enumerate() {
            let key = format!("shard[{i}]");
            let [start, end] = s.layers[..] else {
                return Err(ProfileError::Layers {
                    file: file.into(),
                    key: format!("{key}.layers"),
                    message: format!(
                        "expected [first layer, end layer], found {} numbers",
                        s.layers.len()
                    ),
                });
            };
            if start < 0 || end < 0 {
                return Err(ProfileError::Layers {
                    file: file.into(),
                    key: format!("{key}.layers"),
                    message: format!("negative layer in [{start}, {end}]"),
                });
            }
            shards.push(ShardProfile {
                layers: start as usize..end as usize,
                prefill: parse_points(file, &format!("{key}.prefill"), &s.prefill)?,
                decode: parse_points(file, &format!("{key}.decode"), &s.decode)?,
            });
        }
        let ranges: Vec<Range<usize>> = shards.iter().map(|s| s.layers.clone()).collect();
        if !(ranges.is_empty() && raw.serving.is_some()) {
            check_layers(file, &ranges, preset.model.layers as usize, |i| {
                format!("shard[{i}].layers")
            })?;
        }
        let serving = match &raw.serving {
            None => None,
            Some(r) => Some(parse_serving(file, r)?),
        };
        Ok(Profile {
            model: raw.model,
            device: raw.device,
            dtype: raw.dtype,
            repeats: raw.repeats as u32,
            shards,
            serving,
        })
    }

    /// The profile as TOML, with a header comment saying how it was made.
    pub fn to_toml(&self) -> String {
        let mut s = String::new();
        let points = |v: &[(u32, Nanos)]| {
            let items: Vec<String> = v.iter().map(|(x, t)| format!("[{x}, {}]", t.0)).collect();
            format!("[{}]", items.join(", "))
        };
        let _ = writeln!(
            s,
            "# A meshsim profile, written by `meshsim profile`: the wall time in ns of one\n\
             # ModelBackend::run call of each shard alone (CandleBackend, seeded weights), the\n\
             # median of `repeats` runs after a warm-up pass. prefill: new tokens from an empty\n\
             # cache; decode: one new token after that many cached tokens. Times between grid\n\
             # points are interpolated linearly (see src/model/profile.rs)."
        );
        let _ = writeln!(s, "model = {}", quote(&self.model));
        let _ = writeln!(s, "device = {}", quote(&self.device));
        let _ = writeln!(s, "dtype = {}", quote(&self.dtype));
        let _ = writeln!(s, "repeats = {}", self.repeats);
        for sh in &self.shards {
            let _ = writeln!(s, "\n[[shard]]");
            let _ = writeln!(s, "layers = [{}, {}]", sh.layers.start, sh.layers.end);
            let _ = writeln!(s, "prefill = {}   # [new tokens, ns]", points(&sh.prefill));
            let _ = writeln!(
                s,
                "decode = {}   # [cached context tokens, ns]",
                points(&sh.decode)
            );
        }
        if let Some(b) = &self.serving {
            let _ = writeln!(
                s,
                "\n# The serving batch backend (PagedCandleBackend): whole iterations of\n\
                 # [members, new tokens per member, cached tokens per member, ns], and\n\
                 # [bytes, ns] of exporting / loading whole store tensors (see\n\
                 # src/model/batch_profile.rs).\n[serving]"
            );
            let _ = writeln!(s, "block_size = {}", b.block_size);
            let _ = writeln!(s, "tensor_tokens = {}", b.tensor_tokens);
            let its: Vec<String> = b
                .iterations
                .iter()
                .map(|p| {
                    format!(
                        "[{}, {}, {}, {}]",
                        p.members, p.new_tokens, p.cached, p.time.0
                    )
                })
                .collect();
            let _ = writeln!(s, "iterations = [{}]", its.join(", "));
            let pairs = |v: &[(u64, Nanos)]| {
                let items: Vec<String> = v.iter().map(|(x, t)| format!("[{x}, {}]", t.0)).collect();
                format!("[{}]", items.join(", "))
            };
            let _ = writeln!(s, "export = {}", pairs(&b.export));
            let _ = writeln!(s, "load = {}", pairs(&b.load));
        }
        s
    }

    /// The profile of the shard that holds exactly `layers`.
    pub fn shard(&self, layers: &Range<usize>) -> Option<&ShardProfile> {
        self.shards.iter().find(|s| &s.layers == layers)
    }

    /// The shards' layer ranges, head first.
    pub fn layer_ranges(&self) -> Vec<Range<usize>> {
        self.shards.iter().map(|s| s.layers.clone()).collect()
    }
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
