//! Shares of a run, for spreading a sweep over the nodes of a cluster.
//!
//! A run's simulations (every policy at every sweep point, in that order: job `i`) are dealt
//! round robin into `n` shares: share `k` (1-based) holds the jobs `i` with `i % n == k - 1`,
//! so shares of a sweep whose points differ in cost get similar mixes. `meshsim run FILE
//! --points K/N` simulates one share and writes a **partial results folder**: the run's
//! `scenario.toml`, the share's rows of `requests.csv` and `summary.csv` (same columns, jobs in
//! run order), and `share.toml`, which names the share, the run's job count, each job's point,
//! policy and rows, and a digest of each file as written.
//!
//! **A share proves what it holds.** `meshsim merge DIR...` checks, before it writes anything,
//! that the folders are the `n` shares of one run: the same `scenario.toml` and seed, each
//! share once, jobs that partition the run exactly once, each file's bytes as their digest
//! says (an edited or truncated file is refused, named), row counts per job as declared,
//! summary rows and request rows that name the job they claim (its point and policy; the
//! caller may give the run's own list of jobs to check them against), and numbers the plots
//! can read. Every check takes time bounded by the size of the files, never by a number in
//! them. Then it splices the rows back into run order and writes exactly the folder one run
//! would have written, plots and report included (`tests/shares.rs` compares the bytes).
//!
//! Every simulation is deterministic and depends only on the scenario, the seed and its point
//! and policy, so a job's rows are the same bytes whichever share computes them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::Written;
use crate::metrics::Summary;
use crate::metrics::write::write_summary;

/// Name of a share's manifest in its folder.
pub const MANIFEST: &str = super::files::SHARE_MANIFEST;
/// Version of the manifest's format.
const FORMAT: u32 = 2;
/// Most shares a run may be split into.
pub const MAX_SHARES: u32 = 100_000;

/// Which share of a run to simulate: the `k`-th (1-based) of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub k: u32,
    pub n: u32,
}

impl Share {
    /// Parses `K/N` (1 <= K <= N <= [`MAX_SHARES`]).
    pub fn parse(text: &str) -> Result<Share, String> {
        let bad = || format!("--points {text:?}: expected K/N with 1 <= K <= N <= {MAX_SHARES}");
        let (k, n) = text.split_once('/').ok_or_else(bad)?;
        let (k, n): (u32, u32) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if k == 0 || k > n || n > MAX_SHARES {
            return Err(bad());
        }
        Ok(Share { k, n })
    }

    /// Whether job `i` of the run belongs to this share.
    pub fn owns(&self, job: usize) -> bool {
        job % self.n as usize == (self.k - 1) as usize
    }

    /// Checks that a run of `jobs` simulations gives every share at least one.
    pub fn check(&self, jobs: usize) -> Result<(), String> {
        if self.n as usize > jobs {
            return Err(format!(
                "--points {}/{}: the run has {jobs} simulations (points x policies), fewer than \
                 {} shares; use at most {jobs}",
                self.k, self.n, self.n
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

/// `share.toml`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    /// The run's name (its default results folder).
    name: String,
    /// The run's seed (`--seed` may differ from the scenario's).
    seed: u64,
    share: u32,
    of: u32,
    /// Simulations in the whole run.
    jobs: u32,
    /// Digests of the files as written ([`digest`]).
    digest: Digests,
    /// The share's jobs, in run order.
    job: Vec<JobRows>,
}

/// [`digest`]s of a share's files.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Digests {
    scenario: String,
    requests: String,
    summary: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobRows {
    index: u32,
    /// The job's sweep point, if the run has a sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    point: Option<String>,
    policy: String,
    /// Rows of `requests.csv` that the job wrote.
    requests: u64,
}

/// A simulation of a run as its rows name it: its sweep point (with a sweep) and its policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobName {
    pub point: Option<String>,
    pub policy: String,
}

/// The digest of a file's bytes that a share's manifest records: 64-bit FNV-1a finished with
/// a mixer ([`crate::hash::bytes_hash`]), in hex. It tells an edited or truncated file from
/// the one written; it is no defence against someone who rewrites the manifest too.
fn digest(bytes: &[u8]) -> String {
    format!("{:016x}", crate::hash::bytes_hash(bytes))
}

/// The run a share belongs to: its name, seed, scenario text, which share, the run's job
/// count, and whether it has a sweep (a `point` column).
#[derive(Clone, Copy, Debug)]
pub struct ShareOf<'a> {
    pub name: &'a str,
    pub seed: u64,
    pub text: &'a str,
    pub share: Share,
    pub jobs: usize,
    pub swept: bool,
}

/// One simulation of a share: its index in the run, its number of `requests.csv` rows, its
/// summary and the file its rows were spooled to.
pub struct ShareRun<'a> {
    pub index: usize,
    pub rows: u64,
    pub summary: &'a Summary,
    pub spooled: Option<&'a Path>,
}

/// Writes the partial results folder of `share` (see the module doc) into `dir`, replacing
/// it atomically like a results folder.
pub fn write_share(run: &ShareOf, runs: &[ShareRun], dir: &Path) -> std::io::Result<()> {
    let ShareOf {
        name,
        seed,
        text,
        share,
        jobs,
        swept,
    } = *run;
    let files: Option<Vec<&Path>> = runs.iter().map(|r| r.spooled).collect();
    let files = files.ok_or_else(|| std::io::Error::other("a share's runs must be spooled"))?;
    crate::results::output::replace_dir_atomically(dir, |tmp| {
        std::fs::write(tmp.join("scenario.toml"), text)?;
        super::RequestRows::Spooled {
            swept,
            files: files.clone(),
        }
        .write(&tmp.join("requests.csv"))?;
        let summaries: Vec<Summary> = runs.iter().map(|r| r.summary.clone()).collect();
        let mut f = std::io::BufWriter::new(std::fs::File::create(tmp.join("summary.csv"))?);
        write_summary(&mut f, &summaries).map_err(std::io::Error::other)?;
        std::io::Write::flush(&mut f)?;
        drop(f);
        // The digests of the bytes as they lie in the folder.
        let file_digest =
            |f: &str| -> std::io::Result<String> { Ok(digest(&std::fs::read(tmp.join(f))?)) };
        let manifest = Manifest {
            format: FORMAT,
            name: name.to_string(),
            seed,
            share: share.k,
            of: share.n,
            jobs: jobs as u32,
            digest: Digests {
                scenario: digest(text.as_bytes()),
                requests: file_digest("requests.csv")?,
                summary: file_digest("summary.csv")?,
            },
            job: runs
                .iter()
                .map(|r| JobRows {
                    index: r.index as u32,
                    point: r.summary.point.clone(),
                    policy: r.summary.policy.clone(),
                    requests: r.rows,
                })
                .collect(),
        };
        let manifest = format!(
            "# A share of a meshsim run (meshsim run --points {share}); `meshsim merge` \
             assembles the shares.\n{}",
            toml::to_string(&manifest).map_err(std::io::Error::other)?
        );
        std::fs::write(tmp.join(MANIFEST), manifest)
    })
    .map_err(std::io::Error::from)
}

/// Why shares cannot be merged: bad input (exit status 2), or a failed write.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("{0}")]
    Bad(String),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

/// A share read back: its folder, manifest, and the raw bytes of its CSV files split into
/// header and rows.
struct Part {
    dir: PathBuf,
    manifest: Manifest,
    text: Vec<u8>,
    requests: Csv,
    summary: Csv,
}

/// A CSV file as its header line and its records' raw bytes (each with its line end), and the
/// digest of the whole file.
struct Csv {
    header: Vec<u8>,
    rows: Vec<Vec<u8>>,
    digest: String,
}

fn bad(msg: impl Into<String>) -> MergeError {
    MergeError::Bad(msg.into())
}

/// Reads the CSV file at `path` (its digest is checked later, against the manifest's).
fn read_csv(path: &Path) -> Result<Csv, MergeError> {
    let bytes = crate::text::read_capped(path, crate::text::MAX_DATA_BYTES)
        .map_err(|e| bad(format!("{}: cannot read: {e}", path.display())))?;
    let digest = digest(&bytes);
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(bytes.as_slice());
    let mut starts = Vec::new();
    let mut rec = csv::ByteRecord::new();
    loop {
        let start = r.position().byte() as usize;
        match r.read_byte_record(&mut rec) {
            Ok(true) => starts.push(start),
            Ok(false) => break,
            Err(e) => return Err(bad(format!("{}: not a CSV file: {e}", path.display()))),
        }
    }
    if starts.is_empty() {
        return Err(bad(format!("{}: empty, not a results CSV", path.display())));
    }
    starts.push(bytes.len());
    let mut pieces: Vec<Vec<u8>> = starts
        .windows(2)
        .map(|w| bytes[w[0]..w[1]].to_vec())
        .collect();
    let header = pieces.remove(0);
    Ok(Csv {
        header,
        rows: pieces,
        digest,
    })
}

fn read_part(dir: &Path) -> Result<Part, MergeError> {
    let at = |f: &str| dir.join(f);
    let manifest_text =
        crate::text::read_capped_string(&at(MANIFEST), crate::text::MAX_CONFIG_BYTES).map_err(
            |e| {
                bad(format!(
                    "{}: cannot read {MANIFEST} ({e}); a share's folder is written by `meshsim run \
             --points K/N`",
                    dir.display()
                ))
            },
        )?;
    let manifest: Manifest = toml::from_str(&manifest_text).map_err(|e| {
        bad(format!(
            "{}: {}",
            at(MANIFEST).display(),
            e.message().trim_end()
        ))
    })?;
    if manifest.format != FORMAT {
        return Err(bad(format!(
            "{}: format {} of a share manifest, this meshsim reads format {FORMAT}",
            at(MANIFEST).display(),
            manifest.format
        )));
    }
    let text = crate::text::read_capped(&at("scenario.toml"), crate::text::MAX_CONFIG_BYTES)
        .map_err(|e| {
            bad(format!(
                "{}: cannot read: {e}",
                at("scenario.toml").display()
            ))
        })?;
    check_digest(
        &at("scenario.toml"),
        &digest(&text),
        &manifest.digest.scenario,
    )?;
    let requests = read_csv(&at("requests.csv"))?;
    let summary = read_csv(&at("summary.csv"))?;
    Ok(Part {
        dir: dir.to_path_buf(),
        requests,
        summary,
        manifest,
        text,
    })
}

/// Refuses the file at `path`, whose digest is `got`, unless it is `recorded`.
fn check_digest(path: &Path, got: &str, recorded: &str) -> Result<(), MergeError> {
    if got == recorded {
        return Ok(());
    }
    Err(bad(format!(
        "{}: its digest is {got}, {MANIFEST} says {recorded}: the file changed after the share \
         was written (edited or truncated); run the share again",
        path.display()
    )))
}

/// Checks that `parts` are the shares of one run, each once and whole; returns the run's
/// share count and job count.
fn check_parts(parts: &[Part]) -> Result<(u32, usize), MergeError> {
    let first = &parts[0];
    let (n, jobs) = (first.manifest.of, first.manifest.jobs as usize);
    let mut seen: BTreeMap<u32, &Path> = BTreeMap::new();
    for p in parts {
        let m = &p.manifest;
        let d = p.dir.display();
        if p.text != first.text || m.name != first.manifest.name || m.seed != first.manifest.seed {
            return Err(bad(format!(
                "{d}: its scenario.toml differs from {}'s: the shares are of different runs \
                 (another scenario or --seed)",
                first.dir.display()
            )));
        }
        if m.of != n || m.jobs as usize != jobs {
            return Err(bad(format!(
                "{d}: share {} of {} of a run of {} simulations, but {} is a share of {n} of a \
                 run of {jobs}",
                m.share,
                m.of,
                m.jobs,
                first.dir.display()
            )));
        }
        if m.share == 0 || m.share > n {
            return Err(bad(format!("{d}: share {} of {n} does not exist", m.share)));
        }
        if let Some(other) = seen.insert(m.share, &p.dir) {
            return Err(bad(format!(
                "share {} of {n} is given twice: {} and {d}",
                m.share,
                other.display()
            )));
        }
        check_jobs(p, n, jobs)?;
        let rows: u64 = m.job.iter().map(|j| j.requests).sum();
        if p.requests.rows.len() as u64 != rows {
            return Err(bad(format!(
                "{d}: requests.csv has {} rows, {MANIFEST} says {rows}",
                p.requests.rows.len()
            )));
        }
        if p.summary.rows.len() != m.job.len() {
            return Err(bad(format!(
                "{d}: summary.csv has {} rows, {MANIFEST} lists {} jobs",
                p.summary.rows.len(),
                m.job.len()
            )));
        }
        if p.requests.header != first.requests.header || p.summary.header != first.summary.header {
            return Err(bad(format!(
                "{d}: its CSV columns differ from {}'s (written by another meshsim?)",
                first.dir.display()
            )));
        }
    }
    if let Some(missing) = (1..=n).find(|k| !seen.contains_key(k)) {
        return Err(bad(format!(
            "share {missing} of {n} is missing: give every share's folder"
        )));
    }
    Ok((n, jobs))
}

/// Checks that share `p` of `n` lists exactly its jobs of a run of `jobs`: jobs `k - 1`,
/// `k - 1 + n`, ... below `jobs`, in order. Time bounded by the manifest's list, whatever
/// `jobs` and `n` say.
fn check_jobs(p: &Part, n: u32, jobs: usize) -> Result<(), MergeError> {
    let m = &p.manifest;
    let share = Share { k: m.share, n };
    let first = u64::from(m.share - 1);
    let (jobs, n64) = (jobs as u64, u64::from(n));
    let count = if first < jobs {
        (jobs - first).div_ceil(n64)
    } else {
        0
    };
    if m.job.len() as u64 != count {
        return Err(bad(format!(
            "{}: {MANIFEST} lists {} jobs, but share {share} of a run of {jobs} holds {count}",
            p.dir.display(),
            m.job.len()
        )));
    }
    for (t, job) in m.job.iter().enumerate() {
        let want = first + t as u64 * n64;
        if u64::from(job.index) != want {
            return Err(bad(format!(
                "{}: {MANIFEST} lists job {} where share {share} holds job {want}",
                p.dir.display(),
                job.index
            )));
        }
    }
    Ok(())
}

/// Checks that every row of share `p` names the job it belongs to: summary row `j` and the
/// requests rows of the manifest's job `j` carry its point and policy, which are `expected`'s
/// for that job when the caller knows the run's jobs. Then reads the share's CSV files as the
/// plots will (numbers finite and in range), so that a bad value is named in the share's file
/// before anything is written.
fn check_rows(p: &Part, expected: Option<&[JobName]>) -> Result<(), MergeError> {
    let d = p.dir.display();
    let digests = &p.manifest.digest;
    check_digest(
        &p.dir.join("requests.csv"),
        &p.requests.digest,
        &digests.requests,
    )?;
    check_digest(
        &p.dir.join("summary.csv"),
        &p.summary.digest,
        &digests.summary,
    )?;
    let summary = named_rows(&p.summary, &p.dir.join("summary.csv"))?;
    let requests = named_rows(&p.requests, &p.dir.join("requests.csv"))?;
    let mut row = 0;
    for (j, job) in p.manifest.job.iter().enumerate() {
        let claimed = JobName {
            point: job.point.clone(),
            policy: job.policy.clone(),
        };
        if let Some(want) = expected.and_then(|e| e.get(job.index as usize))
            && *want != claimed
        {
            return Err(bad(format!(
                "{d}: {MANIFEST} names job {} {}, but the run's job {} is {}",
                job.index,
                show(&claimed),
                job.index,
                show(want)
            )));
        }
        if summary[j] != claimed {
            return Err(bad(format!(
                "{d}/summary.csv: line {}: {} where job {} is {}",
                j + 2,
                show(&summary[j]),
                job.index,
                show(&claimed)
            )));
        }
        let rows = &requests[row..row + job.requests as usize];
        if let Some(k) = rows.iter().position(|r| *r != claimed) {
            return Err(bad(format!(
                "{d}/requests.csv: line {}: a row of {} among the rows of job {} ({})",
                row + k + 2,
                show(&rows[k]),
                job.index,
                show(&claimed)
            )));
        }
        row += job.requests as usize;
    }
    crate::results::plot::Results::load(&p.dir).map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// `point / policy` of a job, for messages.
fn show(job: &JobName) -> String {
    match &job.point {
        Some(point) => format!("policy {} at point {point:?}", job.policy),
        None => format!("policy {}", job.policy),
    }
}

/// The job each row of `csv` (read from `path`) names: its `point` (if the file has the
/// column) and `policy` columns.
fn named_rows(csv: &Csv, path: &Path) -> Result<Vec<JobName>, MergeError> {
    let header = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(csv.header.as_slice())
        .byte_records()
        .next()
        .and_then(Result::ok)
        .unwrap_or_default();
    let col = |name: &str| header.iter().position(|h| h == name.as_bytes());
    let policy =
        col("policy").ok_or_else(|| bad(format!("{}: no `policy` column", path.display())))?;
    let point = col("point");
    let mut out = Vec::with_capacity(csv.rows.len());
    let mut rec = csv::ByteRecord::new();
    for (i, raw) in csv.rows.iter().enumerate() {
        let mut r = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(raw.as_slice());
        if !r.read_byte_record(&mut rec).unwrap_or(false) {
            return Err(bad(format!(
                "{}: line {}: not a CSV row",
                path.display(),
                i + 2
            )));
        }
        let text = |c: usize| String::from_utf8_lossy(rec.get(c).unwrap_or_default()).into_owned();
        out.push(JobName {
            point: point.map(text),
            policy: text(policy),
        });
    }
    Ok(out)
}

/// `meshsim merge`: the run's name (for the default output folder) of the shares in `dirs`,
/// checked; nothing is written.
pub fn run_name(dirs: &[PathBuf]) -> Result<String, MergeError> {
    let dir = dirs
        .first()
        .ok_or_else(|| bad("give the folders of every share"))?;
    Ok(read_part(dir)?.manifest.name)
}

/// Merges the share folders `dirs` into `out`, exactly the folder one run would have written
/// (see the module doc). With `expected`, the run's jobs in order (from its scenario), every
/// share's jobs must be those.
pub fn merge(
    dirs: &[PathBuf],
    out: &Path,
    expected: Option<&[JobName]>,
) -> Result<Written, MergeError> {
    if dirs.is_empty() {
        return Err(bad("give the folders of every share"));
    }
    let parts: Vec<Part> = dirs
        .iter()
        .map(|d| read_part(d))
        .collect::<Result<_, _>>()?;
    let (n, jobs) = check_parts(&parts)?;
    if let Some(e) = expected
        && e.len() != jobs
    {
        return Err(bad(format!(
            "{}: a run of {jobs} simulations, but its scenario.toml gives {}",
            parts[0].dir.display(),
            e.len()
        )));
    }
    for p in &parts {
        check_rows(p, expected)?;
    }
    let by_share: BTreeMap<u32, &Part> = parts.iter().map(|p| (p.manifest.share, p)).collect();
    // Each share's rows, consumed job by job in run order.
    let mut next_row: BTreeMap<u32, usize> = BTreeMap::new();
    let mut next_job: BTreeMap<u32, usize> = BTreeMap::new();
    let first = &parts[0];
    let mut requests = first.requests.header.clone();
    let mut summary = first.summary.header.clone();
    for i in 0..jobs {
        let k = (i % n as usize) as u32 + 1;
        let p = by_share[&k];
        let j = next_job.entry(k).or_insert(0);
        let rows = p.manifest.job[*j].requests as usize;
        summary.extend_from_slice(&p.summary.rows[*j]);
        *j += 1;
        let r = next_row.entry(k).or_insert(0);
        for row in &p.requests.rows[*r..*r + rows] {
            requests.extend_from_slice(row);
        }
        *r += rows;
    }
    let (plot_time, files) = crate::results::output::replace_dir_atomically(out, |tmp| {
        std::fs::write(tmp.join("scenario.toml"), &first.text)?;
        std::fs::write(tmp.join("requests.csv"), &requests)?;
        std::fs::write(tmp.join("summary.csv"), &summary)?;
        let started = Instant::now();
        let files = super::plot::render_unpublished(tmp).map_err(std::io::Error::other)?;
        Ok((started.elapsed(), files))
    })
    .map_err(|e| MergeError::Write(out.to_path_buf(), e.into()))?;
    Ok(Written {
        plot_time,
        plot_files: files
            .iter()
            .filter_map(|f| f.file_name())
            .map(|f| out.join(f))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_and_deal_jobs_round_robin() {
        let s = Share::parse("2/3").unwrap();
        assert_eq!(s, Share { k: 2, n: 3 });
        let owned: Vec<usize> = (0..8).filter(|&i| s.owns(i)).collect();
        assert_eq!(owned, vec![1, 4, 7]);
        for bad in ["0/3", "4/3", "3", "a/b", "1/0", "-1/2", "1/100001", ""] {
            assert!(Share::parse(bad).is_err(), "{bad}");
        }
        assert!(Share::parse(" 1 / 2 ").is_ok());
        assert!(Share { k: 1, n: 5 }.check(4).is_err());
        assert!(Share { k: 1, n: 4 }.check(4).is_ok());
    }
}
