//! Results folders and the tools that read them back (DESIGN, "Results layout").
//!
//! [`write_results_dir`] writes the folder of a run of either system: `scenario.toml`,
//! `requests.csv`, `summary.csv` (the schema of [`crate::metrics::write`]), then the plots and
//! `report.md` that [`plot`] makes from those files, replacing the folder atomically
//! ([`crate::results::output`]). [`compare`] reads a simulated and a live folder of one pipeline
//! scenario and reports how far the simulation is from the live run.

pub mod compare;
mod files;
pub mod output;
pub mod plot;
pub mod share;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::live::LiveError;
use crate::metrics::write::{write_requests, write_summary};
use crate::metrics::{RequestRecord, Summary};
use crate::sim::kernel::SimError;
use crate::workload::TraceError;

/// What [`write_results_dir`] did, for the console (wall-clock figures are never in result files).
#[derive(Clone, Debug)]
pub struct Written {
    /// Wall-clock time spent drawing the plots and writing `report.md`.
    pub plot_time: Duration,
    /// The plot and report files, in the results folder.
    pub plot_files: Vec<PathBuf>,
}

/// Writes a results folder: `scenario.toml` (`text`), `requests.csv` (`records`: point,
/// policy and its records), `summary.csv`, then the plots and `report.md`: the same files
/// `meshsim plot` makes from those CSV files, drawn from the records' latencies in memory.
/// Everything goes into a temporary folder beside `dir` that replaces `dir` atomically at the
/// end ([`crate::results::output::replace_dir_atomically`]), so a failure or a crash leaves the
/// old results or the new ones, whole; `dir` must be a results folder meshsim wrote, an empty
/// folder or a new one.
pub fn write_results_dir(
    text: &str,
    records: &[(Option<&str>, &str, &[RequestRecord])],
    summaries: &[Summary],
    dir: &Path,
) -> std::io::Result<Written> {
    let swept = records.iter().any(|r| r.0.is_some());
    let latencies = records
        .iter()
        .filter(|(_, _, rows)| !rows.is_empty())
        .map(|(point, policy, rows)| {
            plot::Latencies::of_run(plot::run_name(swept, *point, policy), rows)
        })
        .collect();
    write_results_dir_with(
        text,
        RequestRows::Records(records),
        summaries,
        Some(latencies),
        dir,
    )
}

/// Where the rows of `requests.csv` come from.
pub enum RequestRows<'a> {
    /// Records held in memory: (sweep point, policy, records) of each run.
    Records(&'a [(Option<&'a str>, &'a str, &'a [RequestRecord])]),
    /// Files of rows without a header, one per run in order (see
    /// [`crate::serving::sim::Spool`]); `swept` says whether they start with a `point` column.
    Spooled { swept: bool, files: Vec<&'a Path> },
}

impl RequestRows<'_> {
    /// Writes the whole `requests.csv` (header and rows) to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        match self {
            RequestRows::Records(records) => {
                write_requests(&mut f, records).map_err(std::io::Error::other)?
            }
            RequestRows::Spooled { swept, files } => {
                let mut w = csv::Writer::from_writer(&mut f);
                w.write_record(crate::metrics::write::requests_header(*swept))
                    .map_err(std::io::Error::other)?;
                w.flush()?;
                drop(w);
                for file in files {
                    std::io::copy(&mut std::fs::File::open(file)?, &mut f)?;
                }
            }
        }
        std::io::Write::flush(&mut f)
    }
}

/// [`write_results_dir`] with the request rows held in memory or spooled to files. With
/// `latencies` (those of the runs whose rows these are, in order: see
/// [`plot::Results::load_with`]), the plots are drawn without reading `requests.csv` back.
pub fn write_results_dir_with(
    text: &str,
    requests: RequestRows,
    summaries: &[Summary],
    latencies: Option<Vec<plot::Latencies>>,
    dir: &Path,
) -> std::io::Result<Written> {
    let (plot_time, files) = crate::results::output::replace_dir_atomically(dir, |tmp| {
        std::fs::write(tmp.join("scenario.toml"), text)?;
        requests.write(&tmp.join("requests.csv"))?;
        let f = std::io::BufWriter::new(std::fs::File::create(tmp.join("summary.csv"))?);
        write_summary(f, summaries).map_err(std::io::Error::other)?;
        let started = Instant::now();
        let files = match latencies {
            Some(l) => plot::render_with(tmp, l),
            None => plot::render_unpublished(tmp),
        }
        .map_err(std::io::Error::other)?;
        Ok((started.elapsed(), files))
    })?;
    Ok(Written {
        plot_time,
        plot_files: files
            .iter()
            .filter_map(|f| f.file_name())
            .map(|f| dir.join(f))
            .collect(),
    })
}

/// Why a run (of either system) gave no results.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A dataset or trace file is bad input (exit status 2).
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A simulation broke a limit or an invariant.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A live run failed.
    #[error(transparent)]
    Live(#[from] LiveError),
    /// A finished simulation's request rows could not be written to the scratch folder.
    #[error("cannot write request rows into {0}: {1}")]
    Spool(PathBuf, std::io::Error),
}

impl RunError {
    /// Whether the input was at fault, rather than the run.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, RunError::Trace(_))
    }
}
