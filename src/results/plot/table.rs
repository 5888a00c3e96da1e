//! Reading the CSV files of a results folder: columns by header name, values checked (finite,
//! in range), errors that name the file, the line as an editor counts it, and the column.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::PlotError;

/// A CSV file being read: its path, its bytes (without a UTF-8 byte-order mark) and its
/// header, to find columns and name errors.
pub(super) struct Table {
    pub(super) path: PathBuf,
    pub(super) bytes: Vec<u8>,
    pub(super) header: csv::StringRecord,
}

impl Table {
    pub(super) fn open(path: &Path) -> Result<Table, PlotError> {
        let mut bytes =
            crate::text::read_capped(path, crate::text::MAX_DATA_BYTES).map_err(|source| {
                PlotError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        if bytes.starts_with(crate::text::UTF8_BOM) {
            bytes.drain(..crate::text::UTF8_BOM.len());
        }
        let header = csv::Reader::from_reader(&bytes[..])
            .headers()
            .map_err(|e| csv_error(path, &bytes, e))?
            .clone();
        Ok(Table {
            path: path.to_path_buf(),
            bytes,
            header,
        })
    }

    /// A reader of the data rows (the header is read and skipped on the first row).
    pub(super) fn rows(&self) -> csv::Reader<&[u8]> {
        csv::Reader::from_reader(&self.bytes[..])
    }

    pub(super) fn bad(&self, line: Option<u64>, msg: String) -> PlotError {
        PlotError::Bad {
            path: self.path.clone(),
            line,
            msg,
        }
    }

    pub(super) fn csv_error(&self, e: csv::Error) -> PlotError {
        csv_error(&self.path, &self.bytes, e)
    }

    /// The line of `rec` as a person counts it (the header is line 1).
    pub(super) fn line(&self, rec: &csv::StringRecord) -> Option<u64> {
        rec.position()
            .map(|p| crate::text::record_line(&self.bytes, p))
    }

    pub(super) fn column(&self, name: &str) -> Result<usize, PlotError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| self.bad(Some(1), format!("missing column `{name}`")))
    }

    pub(super) fn optional_column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// "column `c`: expected <expected>, found `raw`" at the line of `rec`.
    pub(super) fn bad_value(
        &self,
        rec: &csv::StringRecord,
        col: usize,
        expected: &str,
    ) -> PlotError {
        self.bad(
            self.line(rec),
            format!(
                "column `{}`: expected {expected}, found `{}`",
                &self.header[col],
                rec.get(col).unwrap_or("")
            ),
        )
    }

    pub(super) fn parse<T: FromStr>(
        &self,
        rec: &csv::StringRecord,
        col: usize,
        what: &str,
    ) -> Result<T, PlotError> {
        let raw = rec.get(col).unwrap_or("");
        raw.trim()
            .parse()
            .map_err(|_| self.bad_value(rec, col, what))
    }

    /// A finite number from `min` to `max` (durations, rates and ratios: `inf`, `NaN`, a
    /// negative time or a ratio above one are not results meshsim can have written).
    pub(super) fn number(
        &self,
        rec: &csv::StringRecord,
        col: usize,
        what: &str,
        (min, max): (f64, f64),
    ) -> Result<f64, PlotError> {
        let range = if max.is_finite() {
            format!("{what} from {min} to {max}")
        } else {
            format!("{what}, a finite number >= {min}")
        };
        let v: f64 = self.parse(rec, col, &range)?;
        if v.is_finite() && v >= min && v <= max {
            Ok(v)
        } else {
            Err(self.bad_value(rec, col, &range))
        }
    }
}

/// Durations and rates: finite and not negative.
pub(super) const NON_NEGATIVE: (f64, f64) = (0.0, f64::INFINITY);
/// Ratios of two counts.
pub(super) const RATIO: (f64, f64) = (0.0, 1.0);

fn csv_error(path: &Path, bytes: &[u8], e: csv::Error) -> PlotError {
    let line = e.position().map(|p| crate::text::record_line(bytes, p));
    let msg = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("expected {expected_len} fields, found {len}"),
        csv::ErrorKind::Utf8 { .. } => "invalid UTF-8".to_string(),
        _ => e.to_string(),
    };
    PlotError::Bad {
        path: path.to_path_buf(),
        line,
        msg,
    }
}
