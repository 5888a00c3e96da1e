//! Plots and the report of a results folder, made from its CSV files alone.
//!
//! `meshsim run` calls [`render`] on the results it has just written (before they are moved
//! into place), and `meshsim plot DIR` calls it again on any results folder. Each figure is
//! written twice, as `<stem>.png` (1000 or 1200 x 600 pixels) and `<stem>.svg`:
//!
//! * `ttft_cdf`: the distribution of time to first token (TTFT) of completed requests, one
//!   cumulative curve per policy on a logarithmic time axis, with the p50 and p99 levels
//!   marked. A curve further left is faster; the gap at the top shows the tail.
//! * `tpot_cdf`: the same for the time per output token (TPOT) after the first token.
//! * `ttft_percentiles`: TTFT p50 (left) and p99 (right) per policy, as labelled bars.
//! * `throughput`: the system's output tokens per second per policy (requests/s in the label).
//! * `prefix_hits`: the prefix-hit ratio (reused / prompt tokens) per policy (left), and the
//!   reused prompt tokens split by the tier they came from (GPU, local host memory, local SSD,
//!   remote host memory, remote SSD) per policy (right).
//! * `tps_output`, only for pipeline (generation-cache) results, those whose `scenario.toml`
//!   has a top-level `[pipeline]` table: per-request output tokens per second against output
//!   length, one line per policy. A request's TPS is `output_tokens / (end - arrival)` in
//!   seconds (its `output_tokens` over its `e2e_ns`), over completed requests; each point is
//!   the median TPS of the policy's requests of that output length (with more than
//!   [`MAX_TPS_LENGTHS`] distinct lengths, of a power-of-two bin of lengths).
//!
//! `report.md` describes the scenario, tabulates the summary per policy, names the policy with
//! the lowest TTFT p50 and p99 and by how much, and embeds the PNG files. For pipeline results
//! it also compares the fastest and the slowest policy's median TPS at the longest output
//! length both have.
//!
//! Figures are pure functions of the CSV files: the same files give the same bytes (the font
//! is embedded (`font.rs`); PNG encoding has fixed settings; SVG numbers are formatted by
//! plotters without any randomness). Summary rows carry an optional `point` (sweep point)
//! that bar charts and the report show next to the policy name.

mod charts;
mod data;
mod font;
mod report;
mod summary_json;
mod table;

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

pub use data::{
    Latencies, LinkRow, MAX_TPS_LENGTHS, Results, SummaryRow, TpsPoint, TpsSeries, is_pipeline,
    median_tps_by_length, run_name,
};
pub use report::report_markdown;
pub use summary_json::{SCHEMA, summary_json};

/// Why plots or the report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// An input file is missing or unreadable.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An input file is not what meshsim writes.
    #[error("{}{}: {msg}", path.display(), line.map(|l| format!(": line {l}")).unwrap_or_default())]
    Bad {
        path: PathBuf,
        line: Option<u64>,
        msg: String,
    },
    /// A chart could not be drawn (for instance, the embedded font is broken).
    #[error("{file}: cannot draw: {msg}")]
    Draw { file: String, msg: String },
    /// An output file could not be written.
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PlotError {
    /// Whether the error is in the input files (as opposed to drawing or writing).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, PlotError::Read { .. } | PlotError::Bad { .. })
    }
}

/// A figure written by [`render`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    TtftCdf,
    TpotCdf,
    TtftPercentiles,
    Throughput,
    PrefixHits,
    /// Only for pipeline results: see [`Results::figures`].
    TpsOutput,
}

impl Figure {
    /// The figures drawn for every results folder ([`Results::figures`] adds
    /// [`Figure::TpsOutput`] for pipeline results).
    pub const ALL: [Figure; 5] = [
        Figure::TtftCdf,
        Figure::TpotCdf,
        Figure::TtftPercentiles,
        Figure::Throughput,
        Figure::PrefixHits,
    ];

    /// The file name without extension.
    pub fn stem(self) -> &'static str {
        super::files::FIGURES[self as usize]
    }

    /// A short description, used as the image's alt text in the report.
    pub fn caption(self) -> &'static str {
        match self {
            Figure::TtftCdf => "TTFT distribution per policy",
            Figure::TpotCdf => "TPOT distribution per policy",
            Figure::TtftPercentiles => "TTFT p50 and p99 per policy",
            Figure::Throughput => "Output tokens per second per policy",
            Figure::PrefixHits => {
                "Prefix-hit ratio, reused tokens by tier and KV bytes moved by tier per policy"
            }
            Figure::TpsOutput => {
                "Per-request output tokens per second (output tokens / (end - arrival)), median \
                 per output length and policy"
            }
        }
    }

    /// Width and height in pixels (SVG user units).
    pub fn size(self) -> (u32, u32) {
        match self {
            Figure::TtftPercentiles => (1200, 600),
            Figure::PrefixHits => (1500, 600),
            _ => (1000, 600),
        }
    }

    /// Draws the figure on `root`.
    pub fn draw<DB: DrawingBackend>(
        self,
        root: &DrawingArea<DB, Shift>,
        r: &Results,
    ) -> charts::DrawResult
    where
        DB::ErrorType: 'static,
    {
        match self {
            Figure::TtftCdf => charts::cdf(
                root,
                r,
                "Time to first token (TTFT): distribution per policy",
                "TTFT (ms, log scale)",
                |l| &l.ttft_ms,
            ),
            Figure::TpotCdf => charts::cdf(
                root,
                r,
                "Time per output token (TPOT): distribution per policy",
                "TPOT (ms, log scale)",
                |l| &l.tpot_ms,
            ),
            Figure::TtftPercentiles => charts::ttft_percentiles(root, r),
            Figure::Throughput => charts::throughput(root, r),
            Figure::PrefixHits => charts::prefix_hits(root, r),
            Figure::TpsOutput => charts::tps_output(root, r),
        }
    }

    /// The figure as SVG text.
    pub fn svg(self, r: &Results) -> Result<String, PlotError> {
        ensure_font(self)?;
        let mut s = String::new();
        {
            let root = SVGBackend::with_string(&mut s, self.size()).into_drawing_area();
            self.draw(&root, r).map_err(|e| self.draw_error("svg", e))?;
        }
        Ok(s)
    }

    /// The figure as RGB pixels, row by row (3 bytes per pixel).
    pub fn rgb(self, r: &Results) -> Result<Vec<u8>, PlotError> {
        ensure_font(self)?;
        let (w, h) = self.size();
        let mut buf = vec![0u8; w as usize * h as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            self.draw(&root, r).map_err(|e| self.draw_error("png", e))?;
        }
        Ok(buf)
    }

    /// The figure as PNG bytes.
    pub fn png(self, r: &Results) -> Result<Vec<u8>, PlotError> {
        let (w, h) = self.size();
        encode_png(&self.rgb(r)?, w, h).map_err(|e| self.draw_error("png", e.into()))
    }

    fn draw_error(self, ext: &str, e: Box<dyn std::error::Error + Send + Sync>) -> PlotError {
        PlotError::Draw {
            file: format!("{}.{ext}", self.stem()),
            msg: e.to_string(),
        }
    }
}

fn ensure_font(f: Figure) -> Result<(), PlotError> {
    if font::ensure_registered() {
        Ok(())
    } else {
        Err(PlotError::Draw {
            file: f.stem().to_string(),
            msg: "the embedded font is not a valid TrueType font".into(),
        })
    }
}

/// Encodes RGB pixels as PNG with fixed settings (same pixels, same bytes).
pub fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Fast);
    let mut w = enc.write_header()?;
    w.write_image_data(rgb)?;
    w.finish()?;
    Ok(out)
}

/// The files [`render`] writes into the results folder `dir`, relative to it, in writing
/// order: the figures (with `tps_output` when `dir/scenario.toml` is a pipeline scenario), then
/// `report.md` and `summary.json`. Only `scenario.toml` is read; a missing one counts as a non-pipeline folder.
pub fn output_files(dir: &Path) -> Vec<String> {
    let pipeline = data::read_scenario(dir).as_ref().is_some_and(is_pipeline);
    file_names(&data::figures(pipeline))
}

fn file_names(figures: &[Figure]) -> Vec<String> {
    let mut v: Vec<String> = figures
        .iter()
        .flat_map(|f| [format!("{}.png", f.stem()), format!("{}.svg", f.stem())])
        .collect();
    v.push("report.md".into());
    v.push("summary.json".into());
    v
}

/// Where [`render_results`] writes: how its files reach the folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// An existing results folder that others may read: each file replaces the old one
    /// atomically, with one flush for all ([`crate::results::output::write_files_atomically`]).
    InPlace,
    /// A folder being filled before it replaces the results folder whole
    /// ([`crate::results::output::replace_dir_atomically`], which flushes it): plain writes.
    Unpublished,
}

/// Reads the CSV files of `dir` and writes every figure (PNG and SVG), `report.md` and
/// `summary.json` ([`summary_json`]) into it, returning the paths written (those of
/// [`output_files`], in that order). Figures are drawn in parallel threads; the files replace
/// the old ones atomically ([`Placement::InPlace`]), so an interrupted run never leaves a
/// truncated file.
pub fn render(dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let results = Results::load(dir)?;
    render_results(&results, dir, Placement::InPlace)
}

/// [`render`] into a folder that is not yet published ([`Placement::Unpublished`]).
pub fn render_unpublished(dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let results = Results::load(dir)?;
    render_results(&results, dir, Placement::Unpublished)
}

/// [`render_unpublished`] for a folder just written from runs in memory, with their latencies
/// (see [`Results::load_with`]): the same files, without reading `requests.csv` back.
pub fn render_with(dir: &Path, latencies: Vec<Latencies>) -> Result<Vec<PathBuf>, PlotError> {
    let results = Results::load_with(dir, latencies)?;
    render_results(&results, dir, Placement::Unpublished)
}

/// A file's name in the results folder and its bytes.
type NamedFile = (String, Vec<u8>);

/// Writes the figures of `results` ([`Results::figures`]), `report.md` and `summary.json`
/// into `dir` as `placement` says, returning the paths written.
pub fn render_results(
    results: &Results,
    dir: &Path,
    placement: Placement,
) -> Result<Vec<PathBuf>, PlotError> {
    let figures = results.figures();
    let drawn: Vec<Result<Vec<NamedFile>, PlotError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = figures
            .iter()
            .map(|&f| {
                scope.spawn(move || {
                    let started = std::time::Instant::now();
                    let png = f.png(results)?;
                    let svg = f.svg(results)?;
                    tracing::debug!(
                        figure = f.stem(),
                        ms = started.elapsed().as_secs_f64() * 1e3,
                        png_bytes = png.len(),
                        svg_bytes = svg.len(),
                        "figure drawn"
                    );
                    Ok(vec![
                        (format!("{}.png", f.stem()), png),
                        (format!("{}.svg", f.stem()), svg.into_bytes()),
                    ])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a plotting thread panicked"))
            .collect()
    });
    let mut files = Vec::new();
    for figure in drawn {
        files.extend(figure?);
    }
    files.push(("report.md".into(), report_markdown(results).into_bytes()));
    let json = summary_json(dir, results.scenario.as_ref())?;
    files.push(("summary.json".into(), json.into_bytes()));
    let written = files.iter().map(|(name, _)| dir.join(name)).collect();
    match placement {
        Placement::InPlace => {
            crate::results::output::write_files_atomically(dir, &files).map_err(|e| {
                PlotError::Write {
                    path: dir.to_path_buf(),
                    source: e.into(),
                }
            })?
        }
        Placement::Unpublished => {
            for (name, bytes) in &files {
                let path = dir.join(name);
                std::fs::write(&path, bytes).map_err(|source| PlotError::Write { path, source })?;
                crate::results::output::crash_after_file_written();
            }
        }
    }
    Ok(written)
}
