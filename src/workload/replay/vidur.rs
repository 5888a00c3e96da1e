//! Vidur / Splitwise CSV traces: a header naming `arrived_at` (seconds),
//! `num_prefill_tokens` and `num_decode_tokens` (in any column order; other columns are
//! ignored), then one request per line. The files carry no prefix information, so every
//! prompt is its own segment of pseudo tokens and nothing is shared.

use std::path::Path;

use super::mooncake::{MAX_LENGTH, MAX_TIME_S};
use super::{TraceError, TraceFile, TraceRecord, lines, read_bytes, skip_or_fail};
use crate::hash::mix64;
use crate::units::Nanos;

const COLUMNS: [&str; 3] = ["arrived_at", "num_prefill_tokens", "num_decode_tokens"];

/// Reads a Vidur CSV trace.
pub fn read(path: &Path, skip_bad_lines: bool) -> Result<TraceFile, TraceError> {
    let bytes = read_bytes(path)?;
    let mut it = lines(path, &bytes);
    let (hn, header) = it
        .next()
        .expect("read_bytes rejects files without a non-blank line")?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let mut col = [0usize; 3];
    for (i, c) in COLUMNS.iter().enumerate() {
        col[i] = names.iter().position(|n| n == c).ok_or_else(|| {
            TraceError::at(path, hn, c, format!("missing column {c} in the header"))
        })?;
    }
    let mut out = TraceFile {
        block_size: 16,
        ..TraceFile::default()
    };
    for l in it {
        let rec = l.and_then(|(n, text)| {
            let f: Vec<&str> = text.split(',').map(str::trim).collect();
            if f.len() != names.len() {
                return Err(TraceError::at(
                    path,
                    n,
                    "line",
                    format!("expected {} columns, found {}", names.len(), f.len()),
                ));
            }
            let t: f64 = f[col[0]].parse().map_err(|_| {
                TraceError::at(
                    path,
                    n,
                    COLUMNS[0],
                    format!("expected seconds, found {:?}", f[col[0]]),
                )
            })?;
            if !(0.0..MAX_TIME_S).contains(&t) {
                return Err(TraceError::at(
                    path,
                    n,
                    COLUMNS[0],
                    format!(
                        "expected seconds from 0 to {MAX_TIME_S:.0} (the simulator's clock), \
                         found {}",
                        f[col[0]]
                    ),
                ));
            }
            let count = |i: usize| -> Result<u32, TraceError> {
                match f[col[i]].parse::<i64>() {
                    Ok(v) if (1..=MAX_LENGTH).contains(&v) => Ok(v as u32),
                    _ => Err(TraceError::at(
                        path,
                        n,
                        COLUMNS[i],
                        format!(
                            "expected tokens from 1 to {MAX_LENGTH}, found {:?}",
                            f[col[i]]
                        ),
                    )),
                }
            };
            let prefill = count(1)?;
            let decode = count(2)?;
            let key = mix64(0x5649_4455_5200_0000 ^ out.records.len() as u64);
            Ok(TraceRecord {
                arrival: Nanos::from_secs_f64(t),
                blocks: vec![(key, prefill)],
                output_tokens: decode,
                line: n,
            })
        });
        match rec {
            Ok(r) => out.records.push(r),
            Err(e) => skip_or_fail(skip_bad_lines, &mut out.skipped_lines, e)?,
        }
    }
    Ok(out)
}
