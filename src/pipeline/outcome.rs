//! What one decode mode's pipeline run gives, on any host ([`PipelineRun`]), and the results
//! folder written from a scenario's runs ([`write_results`]).

use std::path::Path;
use std::time::Duration;

use super::scenario::{PipelineScenario, mode_name};
use super::shard::DecodeMode;
use crate::metrics::{Report, RequestRecord, Summary};
use crate::results::Written;

/// One decode mode's run at one point.
#[derive(Debug)]
pub struct PipelineRun {
    pub mode: DecodeMode,
    pub report: Report,
    pub summary: Summary,
    /// Wall-clock time of the run (console only).
    pub wall: Duration,
    /// Payload bytes of every message between the actors (head and shards), as the actors
    /// count them (`Context::send`): live runs only.
    pub payload_bytes: u64,
    /// Bytes of the frames that crossed processes (runs across processes; console only).
    pub wire_bytes: u64,
    /// What happened to the processes of a run across them (set up, lost, placed again,
    /// ended), with wall-clock times since the run started; empty otherwise.
    pub timeline: Vec<(Duration, String)>,
}

impl PipelineRun {
    /// The run of `mode` on a live host (one process, or across processes with their
    /// `timeline`).
    pub fn live(
        mode: DecodeMode,
        out: crate::live::host::LiveOutcome,
        timeline: Vec<(Duration, String)>,
    ) -> PipelineRun {
        let summary = Summary::new(mode_name(mode), &out.report, out.messages);
        PipelineRun {
            mode,
            report: out.report,
            summary,
            wall: out.wall,
            payload_bytes: out.bytes,
            wire_bytes: out.wire_bytes,
            timeline,
        }
    }
}

/// Writes the results folder of `runs` of `s` (see [`crate::results::write_results_dir`]).
pub fn write_results(
    s: &PipelineScenario,
    runs: &[PipelineRun],
    dir: &Path,
) -> std::io::Result<Written> {
    let records: Vec<(Option<&str>, &str, &[RequestRecord])> = runs
        .iter()
        .map(|r| {
            (
                r.summary.point.as_deref(),
                mode_name(r.mode),
                r.report.records.as_slice(),
            )
        })
        .collect();
    let summaries: Vec<Summary> = runs.iter().map(|r| r.summary.clone()).collect();
    crate::results::write_results_dir(&s.text, &records, &summaries, dir)
}
