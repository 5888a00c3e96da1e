//! What one policy's run gives, on any host ([`PolicyRun`]), and the results folder written
//! from the runs of a scenario ([`write_results`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::policy::Policy;
use super::scenario::Scenario;
use crate::metrics::{Report, Summary};
use crate::results::RequestRows;

/// One policy's simulation.
#[derive(Debug)]
pub struct PolicyRun {
    pub policy: Policy,
    pub report: Report,
    pub summary: Summary,
    /// Wall-clock time of the simulation (not reproducible; console only).
    pub wall: Duration,
    /// Where the run's `requests.csv` rows went when it was spooled ([`Spool`]); its
    /// `report.records` are then empty, and `latencies` holds what the plots need of them.
    pub spooled: Option<PathBuf>,
    /// A spooled run's latencies, as the plots read them from its rows (`None` otherwise).
    pub latencies: Option<crate::results::plot::Latencies>,
    /// Live runs: how its outputs compare with vanilla's ([`super::live::check_outputs`]).
    pub output_check: Option<OutputCheck>,
    /// Live runs: where the time of the instances' iterations went.
    pub timing: Option<crate::backend::Timing>,
    /// Live runs across processes: what moved between them.
    pub across: Option<AcrossProcesses>,
}

/// What a serving run across processes moved between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcrossProcesses {
    /// K/V bytes that store loads read from another process's memory (over the socket).
    pub remote_read: u64,
    /// Bytes of K/V that store loads read, wherever from.
    pub fetched: u64,
    /// Frames of actor messages between processes, and their bytes.
    pub frames: u64,
    pub frame_bytes: u64,
}

/// How one policy's outputs compare with vanilla's.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    pub policy: String,
    /// Requests completed under both.
    pub requests: usize,
    /// Largest difference of first-token logits over those requests.
    pub max_logit_diff: f32,
    /// The first request whose tokens differ, or whose logits differ beyond the tolerance.
    pub problem: Option<String>,
}

/// Writes `requests.csv`, `summary.csv` and `scenario.toml` into `dir`, replacing it whole,
/// then the plots and `report.md` made from those files. Runs that were spooled give their
/// rows from their files (all runs are spooled, or none).
pub fn write_results(
    s: &Scenario,
    runs: &[PolicyRun],
    dir: &Path,
) -> std::io::Result<crate::results::Written> {
    let summaries: Vec<Summary> = runs.iter().map(|r| r.summary.clone()).collect();
    let spooled: Option<Vec<&Path>> = runs.iter().map(|r| r.spooled.as_deref()).collect();
    if let Some(files) = spooled.filter(|f| !f.is_empty()) {
        let rows = RequestRows::Spooled {
            swept: !s.points.is_empty(),
            files,
        };
        // Read back from the rows if a run kept none.
        let latencies: Option<Vec<_>> = runs.iter().map(|r| r.latencies.clone()).collect();
        return crate::results::write_results_dir_with(&s.text, rows, &summaries, latencies, dir);
    }
    let records: Vec<(Option<&str>, &str, &[crate::metrics::RequestRecord])> = runs
        .iter()
        .map(|r| {
            (
                r.summary.point.as_deref(),
                r.policy.name(),
                r.report.records.as_slice(),
            )
        })
        .collect();
    crate::results::write_results_dir(&s.text, &records, &summaries, dir)
}
