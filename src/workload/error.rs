//! The one error type of datasets, traces and tokenizers: what is wrong, and where.

use std::path::Path;

/// A dataset or trace file that cannot be used, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {field}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct TraceError {
    pub file: String,
    /// 1-based line, where the format has lines.
    pub line: Option<usize>,
    /// The field (or column, or JSON path) at fault; `file` for the whole file.
    pub field: String,
    pub message: String,
}

impl TraceError {
    pub fn at(file: &Path, line: usize, field: &str, message: impl Into<String>) -> TraceError {
        TraceError {
            file: file.display().to_string(),
            line: Some(line),
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub fn whole(file: &Path, field: &str, message: impl Into<String>) -> TraceError {
        TraceError {
            file: file.display().to_string(),
            line: None,
            field: field.to_string(),
            message: message.into(),
        }
    }
}
