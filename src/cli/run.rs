//! `meshsim run` and `meshsim check`: one path for scenarios of both systems, through
//! [`meshsim::experiment::Experiment`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{EXIT_FAILED, bad, refused};
use meshsim::experiment::{Experiment, Runs};
use meshsim::results::output;
use meshsim::results::share::{self, Share, ShareOf, ShareRun};
use meshsim::results::{RunError, Written};
use meshsim::serving::outcome::PolicyRun;
use meshsim::serving::scenario::Scenario;
use meshsim::serving::sim::{RunOptions, Spool};
use meshsim::sim::progress::Board;

/// `meshsim check`: validate and describe, run nothing.
pub(crate) fn check(scenario: &Path) -> ExitCode {
    match Experiment::load(scenario) {
        Ok(x) => {
            if let Err(e) = x.check_live(&scenario.display().to_string()) {
                return bad(e);
            }
            print!("{}", x.describe());
            if let Err(e) = x.describe_traces(&mut std::io::stdout()) {
                eprintln!("error: {e}");
                return ExitCode::from(super::EXIT_BAD_INPUT);
            }
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => bad(e),
    }
}

/// `--nodes` and `--cookie-file`: where a live pipeline run's shards go.
pub(crate) struct Cluster {
    pub(crate) nodes: Option<String>,
    pub(crate) cookie_file: Option<PathBuf>,
}

impl Cluster {
    /// The flags as given, for a command line that repeats the run (` --nodes A,B
    /// --cookie-file F`; empty when neither was given).
    fn flags(&self) -> String {
        let mut s = String::new();
        if let Some(n) = &self.nodes {
            s += &format!(" --nodes {n}");
        }
        if let Some(c) = &self.cookie_file {
            s += &format!(" --cookie-file {}", c.display());
        }
        s
    }
}

/// `meshsim run`: validate, check the output folder, run every policy (or decode mode) at
/// every sweep point, write the results folder, print a line per run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    scenario: &Path,
    seed: Option<u64>,
    out: Option<PathBuf>,
    threads: Option<usize>,
    quiet: bool,
    live_flag: bool,
    points: Option<&str>,
    cluster: Cluster,
) -> ExitCode {
    let file = scenario.display().to_string();
    let again = cluster.flags();
    let x = match prepare(scenario, &file, seed, live_flag, cluster) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if let Some(points) = points {
        return run_share(&x, &file, points, out, threads, quiet);
    }
    let dir = out.unwrap_or_else(|| x.default_dir(live_flag));
    // Serving runs spool each finished simulation's request rows beside the results folder.
    // Made now, so that a place where no results can be written is refused before the run
    // (a pipeline run only proves it: it writes nothing before its results).
    let scratch = match make_scratch(&dir) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let scratch = match x {
        Experiment::Serving(_) => Some(scratch),
        Experiment::Pipeline(_) => {
            drop(scratch);
            None
        }
    };
    if !quiet {
        print!("{}", x.describe());
    }
    let started = Instant::now();
    let threads = threads.unwrap_or_else(default_threads);
    let runs = match run_all(&x, threads, quiet, scratch.as_ref()) {
        Ok(r) => r,
        Err(e) if e.is_bad_input() => return bad(e),
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!(
                "reproduce with: meshsim run {file}{}{again} --seed {}",
                if live_flag { " --live" } else { "" },
                x.seed()
            );
            return ExitCode::from(EXIT_FAILED);
        }
    };
    for (sm, wall) in runs.summaries() {
        tracing::info!(
            policy = sm.policy,
            events = sm.events,
            wall_s = wall.as_secs_f64(),
            "run finished"
        );
    }
    let written = match x.write(&runs, &dir) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: cannot write results to {}: {e}", dir.display());
            return ExitCode::from(EXIT_FAILED);
        }
    };
    tracing::info!(
        files = written.plot_files.len(),
        plot_s = written.plot_time.as_secs_f64(),
        "plots and report written"
    );
    if !quiet {
        print_run_totals(&x, &runs, &written, started, &dir);
    }
    ExitCode::SUCCESS
}

/// Loads the scenario of `meshsim run` and applies the command line's seed, `--live` and
/// cluster to it, checking what a live run needs; the exit status of a refusal otherwise.
fn prepare(
    scenario: &Path,
    file: &str,
    seed: Option<u64>,
    live_flag: bool,
    cluster: Cluster,
) -> Result<Experiment, ExitCode> {
    let mut x = Experiment::load(scenario).map_err(bad)?;
    if let Some(seed) = seed {
        x.set_seed(seed);
    }
    if live_flag && let Err(e) = x.set_live(file) {
        return Err(bad(e));
    }
    x.set_cluster(file, cluster.nodes.as_deref(), cluster.cookie_file)
        .map_err(bad)?;
    x.check_live(file).map_err(bad)?;
    if x.is_live() && matches!(x, Experiment::Serving(_)) {
        let n = super::leave_a_core_for_the_actors();
        tracing::info!(
            "live serving: candle computes on {n} thread(s), a core left for the actors"
        );
    }
    Ok(x)
}

/// Refuses an output folder `dir` that cannot be used, and makes the scratch folder beside it
/// now; the exit status of a refusal otherwise.
fn make_scratch(dir: &Path) -> Result<output::Scratch, ExitCode> {
    output::check_out_dir(dir).map_err(refused)?;
    let scratch = output::Scratch::beside(dir).map_err(refused)?;
    scratch.make_now(dir).map_err(refused)?;
    Ok(scratch)
}

/// Runs every simulation (or the live run) of `x` on `threads` threads, with the spinner
/// unless `quiet`; serving runs report to its board and spool their rows into `scratch`.
fn run_all(
    x: &Experiment,
    threads: usize,
    quiet: bool,
    scratch: Option<&output::Scratch>,
) -> Result<Runs, RunError> {
    let what = if x.is_live() {
        "serving on the live host".to_string()
    } else {
        format!("simulating {} runs", x.simulations())
    };
    let board = Arc::new(Board::default());
    let watched = matches!(x, Experiment::Serving(_));
    let spool = match (x, scratch) {
        (Experiment::Serving(s), Some(sc)) => Some(Spool {
            scratch: sc,
            swept: !s.points.is_empty(),
        }),
        _ => None,
    };
    let display = Spinner::start(!quiet, what, watched.then(|| board.clone()));
    let opts = RunOptions {
        share: None,
        board: watched.then_some(&*board),
        spool: spool.as_ref(),
        check_every: None,
    };
    let runs = x.run_watched(threads, &opts);
    display.stop();
    runs
}

/// Prints a console line per run, then the events, speed, wall time, peak memory and the
/// results folder of the whole run, and how long the plots took.
fn print_run_totals(x: &Experiment, runs: &Runs, written: &Written, started: Instant, dir: &Path) {
    let mut events = 0;
    for (sm, wall) in runs.summaries() {
        events += sm.events;
        println!("{}", x.console_line(sm, wall));
    }
    let wall = started.elapsed().as_secs_f64();
    let unit = if x.is_live() { "messages" } else { "events" };
    println!(
        "  {events} {unit} processed, {:.2} M {unit}/s overall, wall time {wall:.2} s{}; \
         results in {}",
        events as f64 / wall / 1e6,
        peak_memory(),
        dir.display()
    );
    println!(
        "  plots ({} files) and report.md drawn in {:.3} s",
        written.plot_files.len().saturating_sub(1),
        written.plot_time.as_secs_f64()
    );
}

/// Threads when `--threads` is not given: the available cores.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `, peak memory 1.23 GiB` (the process's peak resident set, from `/proc/self/status`), or
/// nothing where the system does not say.
fn peak_memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map_or(String::new(), |kb| {
            format!(", peak memory {:.2} GiB", kb as f64 / (1u64 << 20) as f64)
        })
}

/// `meshsim run FILE --points K/N`: simulate one share of the run and write its partial
/// results folder (default `results/<name>.share-K-of-N`), for `meshsim merge`.
fn run_share(
    x: &Experiment,
    file: &str,
    points: &str,
    out: Option<PathBuf>,
    threads: Option<usize>,
    quiet: bool,
) -> ExitCode {
    let (share, s, jobs) = match share_of(x, file, points) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let dir = out.unwrap_or_else(|| {
        Path::new("results").join(format!("{}.share-{}-of-{}", s.name, share.k, share.n))
    });
    // Made now: a place where the share cannot be written is refused before the run.
    let scratch = match make_scratch(&dir) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if !quiet {
        print!("{}", x.describe());
    }
    let started = Instant::now();
    let threads = threads.unwrap_or_else(default_threads);
    let spool = Spool {
        scratch: &scratch,
        swept: !s.points.is_empty(),
    };
    let runs = match simulate_share_runs(s, file, share, threads, quiet, &spool) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let parts: Vec<ShareRun> = runs
        .iter()
        .map(|(i, r)| ShareRun {
            index: *i,
            rows: r.summary.requests,
            summary: &r.summary,
            spooled: r.spooled.as_deref(),
        })
        .collect();
    if let Err(e) = share::write_share(
        &ShareOf {
            name: &s.name,
            seed: s.seed,
            text: &s.text,
            share,
            jobs,
            swept: spool.swept,
        },
        &parts,
        &dir,
    ) {
        eprintln!("error: cannot write results to {}: {e}", dir.display());
        return ExitCode::from(EXIT_FAILED);
    }
    if !quiet {
        for (_, r) in &runs {
            println!("{}", x.console_line(&r.summary, r.wall));
        }
        println!(
            "  share {share}: {} of {jobs} simulations in {:.2} s{}; partial results in {} \
             (assemble every share with `meshsim merge`)",
            runs.len(),
            started.elapsed().as_secs_f64(),
            peak_memory(),
            dir.display()
        );
    }
    ExitCode::SUCCESS
}

/// The share `points` (`K/N`) of serving scenario `x`, the scenario and its number of
/// simulations; the exit status of a refusal otherwise.
fn share_of<'a>(
    x: &'a Experiment,
    file: &str,
    points: &str,
) -> Result<(Share, &'a Scenario, usize), ExitCode> {
    let share = Share::parse(points).map_err(bad)?;
    let s: &Scenario = match x {
        Experiment::Serving(s) => s,
        Experiment::Pipeline(_) => {
            return Err(bad(format!(
                "{file}: --points splits serving scenarios only; a pipeline sweep runs whole"
            )));
        }
    };
    let jobs = meshsim::serving::sim::jobs(s);
    share.check(jobs).map_err(bad)?;
    Ok((share, s, jobs))
}

/// Simulates `share` of `s` on `threads` threads, with the spinner unless `quiet`, spooling
/// request rows into `spool`; the exit status of a failure otherwise.
fn simulate_share_runs(
    s: &Scenario,
    file: &str,
    share: Share,
    threads: usize,
    quiet: bool,
    spool: &Spool<'_>,
) -> Result<Vec<(usize, PolicyRun)>, ExitCode> {
    let board = Arc::new(Board::default());
    let display = Spinner::start(
        !quiet,
        format!("simulating share {share}"),
        Some(board.clone()),
    );
    let opts = RunOptions {
        share: Some(share),
        board: Some(&board),
        spool: Some(spool),
        check_every: None,
    };
    let runs = meshsim::serving::sim::simulate_share(s, threads, &opts);
    display.stop();
    match runs {
        Ok(r) => Ok(r),
        Err(e) if e.is_bad_input() => Err(bad(e)),
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!(
                "reproduce with: meshsim run {file} --points {share} --seed {}",
                s.seed
            );
            Err(ExitCode::from(EXIT_FAILED))
        }
    }
}

/// `meshsim merge DIR... [--out DIR]`: assemble the shares of a run into its results folder
/// (default `results/<name>`).
pub(crate) fn merge(dirs: &[PathBuf], out: Option<PathBuf>, quiet: bool) -> ExitCode {
    let out = match out {
        Some(o) => o,
        None => match share::run_name(dirs) {
            Ok(name) => Path::new("results").join(name),
            Err(e) => return bad(e),
        },
    };
    if let Err(e) = output::check_out_dir(&out).and_then(|()| output::probe_beside(&out)) {
        return refused(e);
    }
    let expected = expected_jobs(dirs);
    match share::merge(dirs, &out, expected.as_deref()) {
        Ok(w) => {
            if !quiet {
                println!(
                    "merged {} shares into {} (plots and report.md drawn in {:.3} s)",
                    dirs.len(),
                    out.display(),
                    w.plot_time.as_secs_f64()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e @ share::MergeError::Bad(_)) => bad(e),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// The jobs of the run whose shares are in `dirs`, from the first share's `scenario.toml`, so
/// that `merge` checks each share's jobs against the run's own. `None` when that scenario
/// cannot be read here (it may name files relative to where it was written); the shares'
/// other checks hold without it.
fn expected_jobs(dirs: &[PathBuf]) -> Option<Vec<share::JobName>> {
    let path = dirs.first()?.join("scenario.toml");
    match Experiment::load(&path) {
        Ok(x) => Some(x.job_names()),
        Err(e) => {
            tracing::info!("merge: the run's jobs are not checked against {e}");
            None
        }
    }
}

/// On a terminal only (stdout), and only when the run lasts more than a second: a spinner with
/// the elapsed time, and for serving runs one line per running simulation (fraction of the
/// trace's span simulated, events/s, estimated time left; see [`Board`]). Console only: nothing
/// of it reaches result files or logs.
struct Spinner {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start(enabled: bool, msg: String, board: Option<Arc<Board>>) -> Spinner {
        if !enabled || !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            return Spinner {
                done: None,
                thread: None,
            };
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            use std::sync::mpsc::RecvTimeoutError;
            // Finished (or the sender dropped) within a second: never shown.
            if rx.recv_timeout(Duration::from_secs(1)) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let bar = indicatif::ProgressBar::with_draw_target(
                None,
                indicatif::ProgressDrawTarget::stdout(),
            );
            // The template is a valid literal, so building the style cannot fail.
            let style = indicatif::ProgressStyle::with_template("  {spinner} {msg}")
                .expect("valid spinner template");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(100));
            let started = Instant::now();
            // Bounded: one round per half second until the run ends.
            loop {
                let elapsed = started.elapsed().as_secs() + 1;
                let text = match &board {
                    None => format!("{msg} ({}:{:02})", elapsed / 60, elapsed % 60),
                    Some(b) => {
                        let (done, total, running) = b.snapshot();
                        let mut t = format!(
                            "{msg}: {done} of {total} simulations done, {} running ({}:{:02})",
                            running.len(),
                            elapsed / 60,
                            elapsed % 60
                        );
                        for r in &running {
                            t.push_str("\n      ");
                            t.push_str(&r.line());
                        }
                        t
                    }
                };
                bar.set_message(text);
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            }
            bar.finish_and_clear();
        });
        Spinner {
            done: Some(tx),
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
