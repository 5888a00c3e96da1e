//! `meshsim run --points K/N` and `meshsim merge`: the shares of a run, merged in any order,
//! give exactly the folder one run writes; bad sets of shares are refused (exit 2) naming
//! what is wrong; the Slurm and PBS scripts of `scripts/` do the same through their own
//! commands, run here without a scheduler.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_meshsim")
}

/// `small.toml` with a two-point sweep: 2 points x 4 policies = 8 simulations.
fn scenario(dir: &Path, seed: u64) -> PathBuf {
    let text = std::fs::read_to_string(common::data("small.toml")).unwrap();
    let text = text.replacen("seed = ", &format!("seed = {seed}\n# was: seed = "), 1);
    let p = dir.join(format!("sweep{seed}.toml"));
    std::fs::write(
        &p,
        format!("{text}\n[sweep]\n\"workload.arrival_rate_per_s\" = [6.0, 12.0]\n"),
    )
    .unwrap();
    p
}

/// `meshsim run SCENARIO --quiet --points POINTS --out OUT` in `dir`: exit status and stderr.
fn run_share(dir: &Path, scenario: &Path, points: &str, out: &str) -> (i32, String) {
    let s = scenario.to_str().unwrap();
    meshsim(
        dir,
        &["run", s, "--quiet", "--points", points, "--out", out],
    )
}

fn meshsim(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every file of `a` has the same bytes in `b`, and `b` has no other file.
fn assert_same_tree(a: &Path, b: &Path) {
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(a), names(b));
    for n in names(a) {
        assert!(
            std::fs::read(a.join(&n)).unwrap() == std::fs::read(b.join(&n)).unwrap(),
            "{n} differs"
        );
    }
}

#[test]
fn merged_shares_are_byte_identical_to_one_run() {
    let d = tempfile::tempdir().unwrap();
    let s = scenario(d.path(), 5);
    let s = s.to_str().unwrap();
    assert_eq!(
        meshsim(d.path(), &["run", s, "--quiet", "--out", "one"]).0,
        0
    );
    for n in [1, 3, 8] {
        let mut parts = Vec::new();
        for k in 1..=n {
            let out = format!("n{n}/part{k}");
            let (code, err) = meshsim(
                d.path(),
                &[
                    "run",
                    s,
                    "--quiet",
                    "--points",
                    &format!("{k}/{n}"),
                    "--out",
                    &out,
                ],
            );
            assert_eq!(code, 0, "{err}");
            assert!(d.path().join(&out).join("share.toml").is_file());
            assert!(!d.path().join(&out).join("report.md").exists());
            parts.push(out);
        }
        // Any order.
        parts.reverse();
        let merged = format!("merged{n}");
        let mut args = vec!["merge", "--quiet", "--out", &merged];
        args.extend(parts.iter().map(String::as_str));
        let (code, err) = meshsim(d.path(), &args);
        assert_eq!(code, 0, "{err}");
        assert_same_tree(&d.path().join("one"), &d.path().join(&merged));
    }
}

#[test]
fn bad_sets_of_shares_are_refused_naming_what_is_wrong() {
    let d = tempfile::tempdir().unwrap();
    let (s5, s6) = (scenario(d.path(), 5), scenario(d.path(), 6));
    let run = |s: &Path, points: &str, out: &str| {
        let (code, err) = run_share(d.path(), s, points, out);
        assert_eq!(code, 0, "{err}");
    };
    run(&s5, "1/2", "a1");
    run(&s5, "2/2", "a2");
    run(&s6, "2/2", "b2");
    run(&s5, "1/4", "c1");
    std::fs::create_dir(d.path().join("empty")).unwrap();
    for (dirs, says) in [
        (vec!["a1"], "share 2 of 2 is missing"),
        (vec!["a1", "a1"], "share 1 of 2 is given twice"),
        (vec!["a1", "b2"], "differs from"),
        (vec!["a1", "c1"], "share 1 of 4"),
        (vec!["a1", "empty"], "cannot read share.toml"),
        (vec!["a1", "nowhere"], "cannot read share.toml"),
    ] {
        let mut args = vec!["merge", "--out", "merged"];
        args.extend(dirs.iter().copied());
        let (code, err) = meshsim(d.path(), &args);
        assert_eq!(code, 2, "{dirs:?}: {err}");
        assert!(err.contains(says), "{dirs:?}: expected {says:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            !d.path().join("merged").exists(),
            "{dirs:?} wrote something"
        );
    }
    // A share whose rows were cut short.
    let csv = d.path().join("a2/requests.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    let cut: Vec<&str> = text.lines().collect();
    std::fs::write(&csv, cut[..cut.len() - 3].join("\n") + "\n").unwrap();
    let (code, err) = meshsim(d.path(), &["merge", "--out", "merged", "a1", "a2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("requests.csv has"), "{err}");
    // Bad --points values, and more shares than simulations.
    for (points, says) in [
        ("0/2", "expected K/N"),
        ("3/2", "expected K/N"),
        ("x", "expected K/N"),
        ("1/9", "the run has 8 simulations"),
    ] {
        let (code, err) = meshsim(
            d.path(),
            &[
                "run",
                s5.to_str().unwrap(),
                "--points",
                points,
                "--out",
                "p",
            ],
        );
        assert_eq!(code, 2, "{points}: {err}");
        assert!(err.contains(says), "{points}: {err}");
        assert!(!d.path().join("p").exists());
    }
}

/// Runs a scheduler script with bash and the environment a scheduler would give it.
fn script(dir: &Path, name: &str, env: &[(&str, String)]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name);
    let out = Command::new("bash")
        .arg(&path)
        .current_dir(dir)
        .env("MESHSIM", bin())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_slurm_and_pbs_scripts_split_and_merge_a_run() {
    let d = tempfile::tempdir().unwrap();
    let s = scenario(d.path(), 5);
    let s = s.to_str().unwrap().to_string();
    assert_eq!(
        meshsim(d.path(), &["run", &s, "--quiet", "--out", "one"]).0,
        0
    );
    let n = 3;
    for k in 1..=n {
        script(
            d.path(),
            "slurm_sweep.sbatch",
            &[
                ("SCENARIO", s.clone()),
                ("SLURM_ARRAY_TASK_ID", k.to_string()),
                ("SLURM_ARRAY_TASK_COUNT", n.to_string()),
                ("SLURM_CPUS_PER_TASK", "1".into()),
            ],
        );
    }
    script(
        d.path(),
        "slurm_merge.sbatch",
        &[("SCENARIO", s.clone()), ("OUT", "slurm".into())],
    );
    assert_same_tree(&d.path().join("one"), &d.path().join("slurm"));
    for k in 1..=n {
        script(
            d.path(),
            "pbs_sweep.pbs",
            &[
                ("SCENARIO", s.clone()),
                ("SHARES", n.to_string()),
                ("PBS_ARRAY_INDEX", k.to_string()),
                ("SHARES_DIR", "pbs_shares".into()),
            ],
        );
    }
    script(
        d.path(),
        "pbs_merge.pbs",
        &[
            ("SCENARIO", s.clone()),
            ("SHARES_DIR", "pbs_shares".into()),
            ("OUT", "pbs".into()),
        ],
    );
    assert_same_tree(&d.path().join("one"), &d.path().join("pbs"));
}

/// `meshsim run` spools each finished simulation's request rows to a scratch folder beside the
/// results; the folder it writes is byte for byte the one written from records in memory,
/// and no scratch folder is left behind.
#[test]
fn spooled_request_rows_are_the_rows_held_in_memory() {
    let d = tempfile::tempdir().unwrap();
    let path = scenario(d.path(), 5);
    let (code, err) = meshsim(
        d.path(),
        &["run", path.to_str().unwrap(), "--quiet", "--out", "cli"],
    );
    assert_eq!(code, 0, "{err}");
    let s = meshsim::Scenario::load(&path).unwrap();
    let runs = meshsim::serving::sim::simulate_experiment(&s, 2).unwrap();
    assert!(runs.iter().all(|r| r.spooled.is_none()));
    meshsim::serving::outcome::write_results(&s, &runs, &d.path().join("memory")).unwrap();
    assert_same_tree(&d.path().join("memory"), &d.path().join("cli"));
    let left: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("meshsim-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Writes `edit` of `file` in share folder `dir`, and records the new file's digest in the
/// share's manifest, as a share written that way would have: what `merge` then finds is up to
/// its other checks.
fn edit_with_digest(dir: &Path, file: &str, edit: impl Fn(&str) -> String) {
    let path = dir.join(file);
    let old = std::fs::read(&path).unwrap();
    let new = edit(&String::from_utf8(old.clone()).unwrap());
    std::fs::write(&path, &new).unwrap();
    let hex = |b: &[u8]| format!("{:016x}", meshsim::hash::bytes_hash(b));
    let manifest = dir.join("share.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains(&hex(&old)), "{text}");
    std::fs::write(&manifest, text.replace(&hex(&old), &hex(new.as_bytes()))).unwrap();
}

/// Two shares of the 8-simulation sweep, `a1` and `a2`, in a fresh folder.
fn two_shares() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let s = scenario(d.path(), 5);
    for (points, out) in [("1/2", "a1"), ("2/2", "a2")] {
        let (code, err) = run_share(d.path(), &s, points, out);
        assert_eq!(code, 0, "{err}");
    }
    (d, s)
}

/// `meshsim merge a1 a2` in `d`: refused with exit 2, `says` in the message, nothing written.
fn assert_merge_refused(d: &Path, says: &str) {
    let (code, err) = meshsim(d, &["merge", "--out", "merged", "a1", "a2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(says), "expected {says:?} in {err}");
    assert!(
        !err.contains(".meshsim-tmp"),
        "names a temporary file: {err}"
    );
    assert!(!d.join("merged").exists(), "wrote something: {err}");
}

#[test]
fn a_manifest_claiming_four_billion_jobs_is_refused_at_once() {
    let (d, _) = two_shares();
    let m = d.path().join("a1/share.toml");
    let text = std::fs::read_to_string(&m).unwrap();
    let text = text
        .replace("of = 2", "of = 1")
        .replace("jobs = 8", "jobs = 4294967295");
    std::fs::write(&m, text).unwrap();
    assert_merge_refused(d.path(), "holds 4294967295");
}

#[test]
fn a_killed_share_is_retried_by_running_the_same_command() {
    let (d, s) = two_shares();
    let (code, err) = run_share(d.path(), &s, "2/2", "a2");
    assert_eq!(code, 0, "the same share into its own folder: {err}");
    let (code, err) = meshsim(d.path(), &["merge", "--out", "merged", "a1", "a2"]);
    assert_eq!(code, 0, "{err}");
    // A share's folder holding a file meshsim does not write is still refused.
    std::fs::write(d.path().join("a2/notes.txt"), "mine").unwrap();
    let (code, err) = run_share(d.path(), &s, "2/2", "a2");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("notes.txt"), "{err}");
}

#[test]
fn an_edited_or_truncated_share_file_is_refused_by_its_digest() {
    let (d, _) = two_shares();
    let csv = d.path().join("a2/summary.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    // One digit of the first row changed: still a CSV file with its rows.
    let at = text.find('\n').unwrap()
        + text[text.find('\n').unwrap()..]
            .find(|c: char| c.is_ascii_digit())
            .unwrap();
    let digit = if &text[at..=at] == "1" { "2" } else { "1" };
    let edited = format!("{}{digit}{}", &text[..at], &text[at + 1..]);
    std::fs::write(&csv, edited).unwrap();
    assert_merge_refused(d.path(), "a2/summary.csv: its digest is");
}

#[test]
fn a_nan_in_a_shares_summary_is_named_with_its_file_and_line() {
    let (d, _) = two_shares();
    edit_with_digest(&d.path().join("a2"), "summary.csv", |t| {
        let mut lines: Vec<String> = t.lines().map(String::from).collect();
        let cells: Vec<&str> = lines[2].split(',').collect();
        let last = cells.len() - 1;
        let mut cells: Vec<String> = cells.iter().map(|c| c.to_string()).collect();
        cells[last] = "NaN".into();
        lines[2] = cells.join(",");
        lines.join("\n") + "\n"
    });
    assert_merge_refused(d.path(), "summary.csv: line 3");
}

#[test]
fn request_counts_moved_between_jobs_are_refused_naming_the_misfiled_row() {
    let (d, _) = two_shares();
    let m = d.path().join("a1/share.toml");
    let text = std::fs::read_to_string(&m).unwrap();
    let counts: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("requests = "))
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(counts.len() >= 2 && counts[0] > 5, "{counts:?}");
    let mut seen = 0;
    let edited: Vec<String> = text
        .lines()
        .map(|l| {
            match l
                .strip_prefix("requests = ")
                .filter(|n| n.parse::<u64>().is_ok())
            {
                Some(_) => {
                    seen += 1;
                    match seen {
                        1 => format!("requests = {}", counts[0] - 5),
                        2 => format!("requests = {}", counts[1] + 5),
                        _ => l.to_string(),
                    }
                }
                None => l.to_string(),
            }
        })
        .collect();
    std::fs::write(&m, edited.join("\n") + "\n").unwrap();
    assert_merge_refused(d.path(), "among the rows of job 2");
}

#[test]
fn a_summary_row_that_names_another_policy_is_refused() {
    let (d, _) = two_shares();
    // Row 2 of a1's summary is job 0's (vanilla at the first point).
    edit_with_digest(&d.path().join("a1"), "summary.csv", |t| {
        let mut lines: Vec<String> = t.lines().map(String::from).collect();
        assert!(lines[1].contains("vanilla"), "{}", lines[1]);
        lines[1] = lines[1].replacen("vanilla", "ptstore", 1);
        lines.join("\n") + "\n"
    });
    assert_merge_refused(d.path(), "summary.csv: line 2: policy ptstore");
}
