//! Scenario files, the parts both systems share: a scenario is one TOML file that describes a
//! whole experiment, parsed once into typed, validated values ("parse, don't validate");
//! nothing downstream sees a string or re-checks a number. Each system validates its own kind
//! of file (`serving::scenario`, `pipeline::scenario`), table by table, with the helpers here:
//! the TOML deserializer that names line, column and key ([`deserialize`]), the checks of
//! single values ([`Check`]), the hardware tables ([`hardware`]) and `[sweep]` expansion
//! ([`sweep`]).
//!
//! Errors name the file, the key path (`hardware.gpu.memory_gib`) and what was expected; a
//! syntax error also gives the line and column. Unknown keys are errors, so a misspelt key or
//! a key with the wrong unit (`memory_gb` for `memory_gib`) is caught, not ignored.

pub(crate) mod catalogue;
pub(crate) mod fault;
pub(crate) mod hardware;
pub(crate) mod sweep;

use std::fmt;

use crate::hardware::LinkSpec;
use crate::units::{GB, Nanos};
use hardware::RawLink;

/// A scenario that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// Dotted key path, empty for errors about the whole file.
    pub key: String,
    pub message: String,
    pub line_col: Option<(usize, usize)>,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((l, c)) = self.line_col {
            write!(f, ":{l}:{c}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ScenarioError {}

/// Most parameters one sweep may vary.
pub const MAX_SWEEP_AXES: usize = 2;
/// Most points one sweep may have.
pub const MAX_SWEEP_POINTS: usize = 256;

/// Longest scenario name: it names the results folder, and file names have at most 255 bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// Largest number of requests a scenario may ask for.
pub const MAX_REQUESTS: u32 = 10_000_000;
/// Largest number of tokens of a context window or an output.
pub const MAX_TOKENS: u32 = 1 << 20;
/// Largest latency of any link or switch (1 s): anything above is a unit mistake.
pub const MAX_LATENCY_NS: u64 = 1_000_000_000;
/// Longest wall-clock limit of one live run (a week), in seconds.
pub const MAX_WALL_S: f64 = 7.0 * 86_400.0;
/// A scenario file's text: read, checked to be UTF-8, without a byte-order mark. Returns the
/// file as errors name it, the text, and the file's stem (`default` if it has none).
pub(crate) fn read_file(
    path: &std::path::Path,
    default: &str,
) -> Result<(String, String, String), ScenarioError> {
    let file = path.display().to_string();
    let whole = |message: String| ScenarioError {
        file: file.clone(),
        key: String::new(),
        message,
        line_col: None,
    };
    let bytes = crate::text::read_capped(path, crate::text::MAX_CONFIG_BYTES)
        .map_err(|e| whole(format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        whole(format!(
            "not valid UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    let text = match text.strip_prefix('\u{feff}') {
        Some(t) => t.to_string(),
        None => text,
    };
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| default.into());
    Ok((file, text, stem))
}

/// Whether `name` may name a file (or a part of one) on every system: letters, digits, '-',
/// '_' and '.', not empty, not starting with '.'.
pub(crate) fn is_file_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        && !name.starts_with('.')
}

/// Checks of single values, naming `file` and the key in errors.
pub(crate) struct Check<'a> {
    pub(crate) file: &'a str,
}

impl Check<'_> {
    pub(crate) fn err(&self, key: &str, message: impl Into<String>) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            key: key.to_string(),
            message: message.into(),
            line_col: None,
        }
    }

    /// The scenario's name (or `default_name`): it names the results folder, so it must be a
    /// file name on every system, with room for the suffixes meshsim adds (`_live`, and the
    /// `.partial-<pid>` of the folder being written).
    pub(crate) fn name(
        &self,
        name: Option<String>,
        default_name: &str,
    ) -> Result<String, ScenarioError> {
        let name = name.unwrap_or_else(|| default_name.to_string());
        if !is_file_name(&name) {
            return Err(self.err(
                "name",
                format!(
                    "expected letters, digits, '-', '_' or '.' (it names the results folder), \
                     found {name:?}"
                ),
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(self.err(
                "name",
                format!(
                    "expected at most {MAX_NAME_BYTES} characters (it names the results folder), \
                     found {} characters",
                    name.len()
                ),
            ));
        }
        Ok(name)
    }

    pub(crate) fn positive(&self, key: &str, v: f64) -> Result<f64, ScenarioError> {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(self.err(key, format!("expected a positive number, found {v}")))
        }
    }

    pub(crate) fn fraction(&self, key: &str, v: f64) -> Result<f64, ScenarioError> {
        if v.is_finite() && v > 0.0 && v <= 1.0 {
            Ok(v)
        } else {
            Err(self.err(key, format!("expected a fraction in (0, 1], found {v}")))
        }
    }

    pub(crate) fn count(&self, key: &str, v: u32, max: u32) -> Result<u32, ScenarioError> {
        if (1..=max).contains(&v) {
            Ok(v)
        } else {
            Err(self.err(
                key,
                format!("expected an integer from 1 to {max}, found {v}"),
            ))
        }
    }

    pub(crate) fn latency(&self, key: &str, ns: u64) -> Result<Nanos, ScenarioError> {
        if ns <= MAX_LATENCY_NS {
            Ok(Nanos(ns))
        } else {
            Err(self.err(
                key,
                format!("expected at most {MAX_LATENCY_NS} ns (1 s), found {ns}"),
            ))
        }
    }

    /// A `[hardware.KIND]` link table; `efficiency` is the kind's default fraction of line rate.
    pub(crate) fn link(
        &self,
        key: &str,
        l: &RawLink,
        efficiency: f64,
    ) -> Result<LinkSpec, ScenarioError> {
        let bandwidth = hardware::need(
            self,
            &format!("{key}.bandwidth_gb_per_s"),
            l.bandwidth_gb_per_s,
        )?;
        let latency = hardware::need(self, &format!("{key}.latency_ns"), l.latency_ns)?;
        Ok(LinkSpec {
            bandwidth: self.positive(&format!("{key}.bandwidth_gb_per_s"), bandwidth)? * GB,
            latency: self.latency(&format!("{key}.latency_ns"), latency)?,
            efficiency: self.fraction(
                &format!("{key}.efficiency"),
                l.efficiency.unwrap_or(efficiency),
            )?,
        })
    }
}

pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// A scenario file's text, parsed once into TOML: its kind is read from it, then it is
/// deserialized into that kind's tables.
pub(crate) struct Document<'a> {
    text: &'a str,
    root: toml::Spanned<toml::de::DeTable<'a>>,
}

impl<'a> Document<'a> {
    /// Parses `text` (of `file`); a TOML error names the file, the line and the column.
    pub(crate) fn parse(file: &str, text: &'a str) -> Result<Document<'a>, ScenarioError> {
        let root = toml::de::DeTable::parse(text)
            .map_err(|e| toml_error(file, text, String::new(), &e))?;
        Ok(Document { text, root })
    }

    /// The text it was parsed from.
    pub(crate) fn text(&self) -> &'a str {
        self.text
    }

    /// Whether the document has a top-level table `key`.
    pub(crate) fn has_table(&self, key: &str) -> bool {
        self.root.get_ref().iter().any(|(k, v)| {
            k.get_ref().as_ref() == key && matches!(v.get_ref(), toml::de::DeValue::Table(_))
        })
    }

    /// Deserializes the document into `T`; a type error names the file, the line and column,
    /// and the dotted key.
    pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
        self,
        file: &str,
    ) -> Result<T, ScenarioError> {
        let text = self.text;
        let de = toml::Deserializer::from(self.root);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let key = if path == "." { String::new() } else { path };
            toml_error(file, text, key, e.inner())
        })
    }
}

/// A TOML or type error in `text` (of `file`) at dotted `key`, with its line and column.
fn toml_error(file: &str, text: &str, key: String, e: &toml::de::Error) -> ScenarioError {
    ScenarioError {
        file: file.to_string(),
        key,
        message: e.message().trim_end().to_string(),
        line_col: e.span().map(|s| line_col(text, s.start)),
    }
}

/// `v` if it is finite and not negative.
pub(crate) fn non_negative(c: &Check, key: &str, v: f64) -> Result<f64, ScenarioError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(c.err(
            key,
            format!("expected zero or a positive number, found {v}"),
        ))
    }
}

/// Most `meshsim node`s a run may name.
pub const MAX_NODES: usize = 256;

/// Checks `[live] nodes` (or `--nodes`): each `HOST:PORT` with a port, none twice, at most
/// [`MAX_NODES`].
pub(crate) fn live_nodes(c: &Check<'_>, nodes: &[String]) -> Result<Vec<String>, ScenarioError> {
    if nodes.len() > MAX_NODES {
        return Err(c.err(
            "live.nodes",
            format!("{} nodes; at most {MAX_NODES}", nodes.len()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for n in nodes {
        let port = n.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        match port {
            Some((h, Ok(p))) if !h.is_empty() && p != 0 => {}
            _ => {
                return Err(c.err(
                    "live.nodes",
                    format!("{n:?} is not HOST:PORT (e.g. \"127.0.0.1:7001\")"),
                ));
            }
        }
        if !seen.insert(n.as_str()) {
            return Err(c.err("live.nodes", format!("{n} is named twice")));
        }
    }
    Ok(nodes.to_vec())
}

/// Checks, before anything starts, that a live run across `nodes` has the cluster's cookie
/// at `cookie_file`, readable by its owner only (`[live] cookie_file` or `--cookie-file`).
pub(crate) fn check_cookie(
    c: &Check<'_>,
    nodes: &[String],
    cookie_file: Option<&std::path::Path>,
) -> Result<(), ScenarioError> {
    if nodes.is_empty() {
        return Ok(());
    }
    let Some(path) = cookie_file else {
        return Err(c.err(
            "live.cookie_file",
            "[live] nodes needs the cluster's cookie: cookie_file, or --cookie-file",
        ));
    };
    crate::live::cluster::read_cookie(path).map_err(|e| c.err("live.cookie_file", e))?;
    Ok(())
}
