//! Mooncake JSONL traces (FAST'25 release): one request per line with `timestamp` (ms since
//! the trace start), `input_length` and `output_length` (tokens) and `hash_ids`, one id per
//! [`BLOCK_TOKENS`]-token block of the prompt; the last block may be partial. Equal ids at equal
//! positions are shared prefix blocks. The loader checks
//! `len(hash_ids) == ceil(input_length / 512)` on every line; by default a violation is an
//! error naming the line, and with `skip_bad_lines` such lines are skipped and counted.

use std::path::Path;

use serde::Deserialize;

use super::{TraceError, TraceFile, TraceRecord, lines, read_bytes, skip_or_fail};
use crate::units::Nanos;

/// Tokens per Mooncake block.
pub const BLOCK_TOKENS: u32 = 512;

/// Longest prompt or output accepted (tokens).
pub const MAX_LENGTH: i64 = 1 << 24;

/// Arrival times of traces must lie below this many seconds: the simulator's clock counts
/// nanoseconds in a `u64` (about 584 years).
pub const MAX_TIME_S: f64 = u64::MAX as f64 / 1e9;

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: i64,
    output_length: i64,
    hash_ids: Vec<i64>,
}

/// Parses one line into a record.
fn parse(path: &Path, n: usize, text: &str) -> Result<TraceRecord, TraceError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let l: Line = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| json_error(path, n, e))
        .and_then(|l| {
            de.end()
                .map(|_| l)
                .map_err(|e| TraceError::at(path, n, "line", e.to_string()))
        })?;
    if !(0.0..MAX_TIME_S * 1e3).contains(&l.timestamp) {
        return Err(TraceError::at(
            path,
            n,
            "timestamp",
            format!(
                "expected milliseconds from 0 to {:.0} (the simulator's clock), found {}",
                MAX_TIME_S * 1e3,
                super::short(l.timestamp)
            ),
        ));
    }
    for (field, v, min) in [
        ("input_length", l.input_length, 1),
        ("output_length", l.output_length, 1),
    ] {
        if !(min..=MAX_LENGTH).contains(&v) {
            return Err(TraceError::at(
                path,
                n,
                field,
                format!("expected tokens from {min} to {MAX_LENGTH}, found {v}"),
            ));
        }
    }
    let blocks = (l.input_length as u64).div_ceil(BLOCK_TOKENS as u64);
    if l.hash_ids.len() as u64 != blocks {
        return Err(TraceError::at(
            path,
            n,
            "hash_ids",
            format!(
                "expected ceil(input_length / {BLOCK_TOKENS}) = {blocks} block ids for input_length \
                 {}, found {}",
                l.input_length,
                l.hash_ids.len()
            ),
        ));
    }
    if let Some(bad) = l.hash_ids.iter().find(|&&h| h < 0) {
        return Err(TraceError::at(
            path,
            n,
            "hash_ids",
            format!("expected non-negative block ids, found {bad}"),
        ));
    }
    let input = l.input_length as u32;
    Ok(TraceRecord {
        arrival: Nanos::from_secs_f64(l.timestamp / 1e3),
        blocks: l
            .hash_ids
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                let start = i as u32 * BLOCK_TOKENS;
                (h as u64, (input - start).min(BLOCK_TOKENS))
            })
            .collect(),
        output_tokens: l.output_length as u32,
        line: n,
    })
}

/// A JSON error of line `n`, naming the field when serde knows it.
pub(crate) fn json_error(
    path: &Path,
    n: usize,
    e: serde_path_to_error::Error<serde_json::Error>,
) -> TraceError {
    let p = e.path().to_string();
    let inner = e.into_inner();
    let msg = inner.to_string();
    // A missing field is reported at the enclosing object; name the field itself.
    let field = msg
        .strip_prefix("missing field `")
        .and_then(|s| s.split('`').next())
        .map(str::to_string)
        .unwrap_or_else(|| {
            if p == "." || p == "?" {
                "line".into()
            } else {
                p
            }
        });
    TraceError::at(path, n, &field, msg)
}

/// Reads a Mooncake JSONL trace.
pub fn read(path: &Path, skip_bad_lines: bool) -> Result<TraceFile, TraceError> {
    let bytes = read_bytes(path)?;
    let mut out = TraceFile {
        block_size: BLOCK_TOKENS,
        ..TraceFile::default()
    };
    for l in lines(path, &bytes) {
        match l.and_then(|(n, text)| parse(path, n, text)) {
            Ok(r) => out.records.push(r),
            Err(e) => skip_or_fail(skip_bad_lines, &mut out.skipped_lines, e)?,
        }
    }
    Ok(out)
}
