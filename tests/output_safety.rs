//! meshsim never loses a user's files: `--out` replaces only what meshsim wrote, refuses
//! anything else with exit status 2 before any work, and replaces results whole (a crash at
//! any stage leaves the old results or the new ones, and the next run cleans up). See
//! `src/results/output/mod.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use meshsim::results::output::{MARKER, check_out_dir};

/// The small test scenario cut to 20 requests and one policy (a fraction of a second).
fn tiny_scenario(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/data/small.toml")).unwrap();
    let text = text.replace("requests = 400", "requests = 20").replace(
        "policies = [\"vanilla\", \"local-prefix\", \"evostore\", \"ptstore\"]",
        "policies = [\"vanilla\"]",
    );
    assert!(text.contains("requests = 20") && text.contains("[\"vanilla\"]"));
    let path = dir.join("tiny.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `meshsim args` in `cwd`, with `env` set and no test hooks inherited.
fn meshsim_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_meshsim"));
    c.current_dir(cwd)
        .args(args)
        .env_remove("MESHSIM_TEST_CRASH_AT")
        .env_remove("MESHSIM_TEST_NO_EXCHANGE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn meshsim(cwd: &Path, args: &[&str]) -> Output {
    meshsim_env(cwd, args, &[])
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 2, a message naming `path` and `reason`, and nothing done before.
fn assert_refused(o: &Output, path: &str, reason: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{path}: {err}");
    assert!(
        err.contains(&format!("refusing to write {path}")),
        "{path}: {err}"
    );
    assert!(err.contains(reason), "{path}: expected {reason:?} in {err}");
    assert!(
        o.stdout.is_empty(),
        "{path}: work started before the refusal: {}",
        String::from_utf8_lossy(&o.stdout)
    );
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// meshsim's temporary names in `dir`.
fn temps(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|n| n.contains(".meshsim-"))
        .collect()
}

/// Every file of a results folder: (name, bytes), sorted by name.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    names(dir)
        .into_iter()
        .map(|n| {
            let bytes = std::fs::read(dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

/// Reference results of the tiny scenario for seeds 1 and 2 (they differ).
struct Refs {
    _tmp: tempfile::TempDir,
    scenario: PathBuf,
    seeds: [Vec<(String, Vec<u8>)>; 2],
}

impl Refs {
    fn new() -> Refs {
        let tmp = tempfile::tempdir().unwrap();
        let scenario = tiny_scenario(tmp.path());
        let seeds = [1, 2].map(|seed| {
            let out = tmp.path().join(format!("ref{seed}"));
            let o = run(tmp.path(), &scenario, &out, seed, &[]);
            assert!(o.status.success(), "{}", stderr(&o));
            contents(&out)
        });
        assert_ne!(seeds[0], seeds[1], "the seeds give different results");
        assert!(seeds[0].iter().any(|(n, _)| n == MARKER));
        assert!(seeds[0].iter().any(|(n, _)| n == "report.md"));
        Refs {
            _tmp: tmp,
            scenario,
            seeds,
        }
    }

    /// The seed whose complete results `dir` holds, byte for byte; panics on anything else.
    fn whole(&self, dir: &Path) -> u64 {
        let now = contents(dir);
        match self.seeds.iter().position(|r| *r == now) {
            Some(i) => i as u64 + 1,
            None => panic!(
                "{} holds neither complete result set: {:?}",
                dir.display(),
                now.iter().map(|(n, _)| n).collect::<Vec<_>>()
            ),
        }
    }
}

fn run(cwd: &Path, scenario: &Path, out: &Path, seed: u64, env: &[(&str, &str)]) -> Output {
    let seed = seed.to_string();
    meshsim_env(
        cwd,
        &["run", s(scenario), "--out", s(out), "--seed", &seed, "-q"],
        env,
    )
}

#[test]
fn dot_dotdot_root_home_and_ancestors_of_the_current_folder_are_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tiny_scenario(tmp.path());
    let work = tmp.path().join("work");
    let sub = work.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(work.join("notes.txt"), "mine").unwrap();
    // An empty home folder: an empty folder is fine to fill, but never the home folder.
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let env = [("HOME", s(&home))];
    let abs_work = work.to_str().unwrap().to_string();
    let cases: [(&str, &str); 7] = [
        (".", "current folder"),
        ("..", "parent of the current folder"),
        ("/", "root folder"),
        ("sub/..", "parent of the current folder"),
        (&abs_work, "current folder or one of its ancestors"),
        (s(tmp.path()), "current folder or one of its ancestors"),
        (s(&home), "home folder"),
    ];
    for (out, reason) in cases {
        let o = meshsim_env(&sub, &["run", s(&scenario), "--out", out], &env);
        assert_refused(&o, out, reason);
    }
    let o = meshsim_env(&work, &["run", s(&scenario), "--out", "."], &env);
    assert_refused(&o, ".", "current folder");
    assert_eq!(names(&work), ["notes.txt", "sub"]);
    assert!(names(&sub).is_empty());
    assert!(names(&home).is_empty());
    assert_eq!(names(tmp.path()), ["home", "tiny.toml", "work"]);
}

#[test]
fn a_folder_holding_a_users_file_is_refused_and_the_file_survives() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tiny_scenario(tmp.path());
    let out = tmp.path().join("mine");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("thesis.tex"), "years of work").unwrap();
    let o = run(tmp.path(), &scenario, &out, 1, &[]);
    assert_refused(&o, s(&out), "has no .meshsim-results marker");
    assert!(stderr(&o).contains("thesis.tex"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("thesis.tex")).unwrap(),
        "years of work"
    );
    assert_eq!(names(&out), ["thesis.tex"]);
    // A user's file added to a results folder meshsim wrote is protected too.
    let results = tmp.path().join("results");
    let o = run(tmp.path(), &scenario, &results, 1, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(results.join("notes.txt"), "mine").unwrap();
    let o = run(tmp.path(), &scenario, &results, 2, &[]);
    assert_refused(&o, s(&results), "notes.txt, which meshsim does not write");
    assert_eq!(
        std::fs::read_to_string(results.join("notes.txt")).unwrap(),
        "mine"
    );
    assert!(temps(tmp.path()).is_empty());
}

#[test]
fn the_repositorys_results_folder_is_refused_and_every_committed_results_folder_is_marked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tiny_scenario(tmp.path());
    let o = meshsim(root, &["run", s(&scenario), "--out", "results"]);
    assert_refused(&o, "results", "has no .meshsim-results marker");
    let mut folders = 0;
    for entry in std::fs::read_dir(root.join("results")).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_dir() || path.file_name().unwrap().to_string_lossy().starts_with('.') {
            continue;
        }
        folders += 1;
        assert!(
            path.join(MARKER).is_file(),
            "{} has no {MARKER}",
            path.display()
        );
        check_out_dir(&path).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(folders >= 20, "{folders} results folders");
}

#[test]
fn a_results_folder_meshsim_wrote_is_replaced_whole_and_an_empty_folder_is_filled() {
    let refs = Refs::new();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = run(tmp.path(), &refs.scenario, &out, 1, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(refs.whole(&out), 1);
    let o = run(tmp.path(), &refs.scenario, &out, 2, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(refs.whole(&out), 2);
    // The portable path (no renameat2) gives the same.
    let o = run(
        tmp.path(),
        &refs.scenario,
        &out,
        1,
        &[("MESHSIM_TEST_NO_EXCHANGE", "1")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(refs.whole(&out), 1);
    assert_eq!(names(tmp.path()), ["out"]);
}

#[test]
fn files_links_and_devices_are_refused_as_results_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tiny_scenario(tmp.path());
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for (out, reason) in [
        (s(&scenario), "it is a file, not a folder"),
        ("/dev/full", "it is a character device, not a folder"),
        (s(&link), "it is a symbolic link, not a folder"),
        (
            &format!("{}/sub", s(&scenario)),
            "tiny.toml is a file, not a folder",
        ),
    ] {
        let o = run(tmp.path(), &scenario, Path::new(out), 1, &[]);
        assert_refused(&o, out, reason);
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(names(tmp.path()), ["link", "target", "tiny.toml"]);
    assert!(names(&target).is_empty());
}

#[test]
fn pipeline_and_live_runs_check_their_folder_before_any_work() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("a.txt"), "mine").unwrap();
    let scenario = root.join("scenarios/pipeline_small_2shard.toml");
    for live in [false, true] {
        for (out, reason) in [
            ("/dev/full", "character device"),
            (s(&mine), "has no .meshsim-results marker"),
        ] {
            let mut args = vec!["run", s(&scenario), "--out", out];
            if live {
                args.push("--live");
            }
            let o = meshsim(tmp.path(), &args);
            assert_refused(&o, out, reason);
        }
    }
    assert_eq!(names(&mine), ["a.txt"]);
}

/// A profile of the tiny model on the smallest grid (a fraction of a second), its `--out`
/// to be given.
const TINY_PROFILE: [&str; 12] = [
    "profile",
    "--model",
    "tiny",
    "--shards",
    "1",
    "--prefill",
    "1",
    "--decode",
    "1",
    "--repeats",
    "1",
    "--out",
];

/// A results folder beside which nothing can be made (here in a pseudo file system, which
/// refuses a new folder even to root, so the test holds as root as well) is refused before
/// any work: a serving run, a share of one, a pipeline run, a merge, a trace's conversion, a
/// comparison and a profile. Otherwise a serving run would find out only when its first
/// simulation had finished and its request rows had nowhere to go, and the others when their
/// work was done (exit status 1).
#[test]
#[cfg(target_os = "linux")]
fn a_place_where_nothing_can_be_made_is_refused_before_any_work() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tiny_scenario(tmp.path());
    let pipeline = root.join("scenarios/pipeline_small_2shard.toml");
    let share = tmp.path().join("share");
    let o = meshsim(
        tmp.path(),
        &["run", s(&scenario), "--out", s(&share), "--points", "1/1"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = tmp.path().join("t.csv");
    std::fs::write(
        &csv,
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n",
    )
    .unwrap();
    let live = root.join("results/pipeline_small_2shard_live");
    let out = "/proc/meshsim-results";
    let profile = [&TINY_PROFILE[..], &[out]].concat();
    for args in [
        vec!["run", s(&scenario), "--out", out],
        vec!["run", s(&scenario), "--out", out, "--points", "1/1"],
        vec!["run", s(&pipeline), "--out", out],
        vec!["merge", s(&share), "--out", out],
        vec!["trace", "convert", s(&csv), "--out", out],
        vec!["compare", s(&live), s(&live), "--out", out],
        profile,
    ] {
        let o = meshsim(tmp.path(), &args);
        assert_refused(&o, out, "cannot make a folder beside it");
    }
    assert_eq!(names(tmp.path()), ["share", "t.csv", "tiny.toml"]);
}

/// Bad input found once the scratch folder is made (a trace file that is not one) leaves
/// nothing behind: neither the scratch folder nor the parents made for it.
#[test]
fn bad_input_found_after_the_scratch_folder_is_made_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tiny_scenario(tmp.path());
    let text = std::fs::read_to_string(&scenario).unwrap();
    let at = text.find("[workload]").unwrap();
    let traced = format!(
        "{}[workload]\nsource = \"mooncake-jsonl\"\npath = \"bad.jsonl\"\n",
        &text[..at]
    );
    std::fs::write(tmp.path().join("bad.jsonl"), "not a trace\n").unwrap();
    let with_trace = tmp.path().join("traced.toml");
    std::fs::write(&with_trace, traced).unwrap();
    let out = tmp.path().join("a/b/out");
    let o = meshsim(tmp.path(), &["run", s(&with_trace), "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(names(tmp.path()), ["bad.jsonl", "tiny.toml", "traced.toml"]);
}

#[test]
fn profile_compare_and_trace_convert_refuse_devices_folders_links_and_foreign_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let csv = dir.join("t.csv");
    std::fs::write(
        &csv,
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,20,3\n",
    )
    .unwrap();
    let live = root.join("results/pipeline_small_2shard_live");
    let commands: [(&str, Vec<&str>); 3] = [
        ("profile", TINY_PROFILE.to_vec()),
        ("compare", vec!["compare", s(&live), s(&live), "--out"]),
        ("trace", vec!["trace", "convert", s(&csv), "--out"]),
    ];
    let folder = dir.join("folder");
    std::fs::create_dir(&folder).unwrap();
    let foreign = dir.join("foreign.txt");
    std::fs::write(&foreign, "mine").unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&foreign, &link).unwrap();
    for (what, args) in &commands {
        for (out, reason) in [
            ("/dev/full", "it is a character device, not a regular file"),
            (s(&folder), "it is a folder, not a regular file"),
            (s(&link), "it is a symbolic link, not a regular file"),
            (s(&foreign), "meshsim did not write it"),
            (".", "current folder"),
        ] {
            let mut a = args.clone();
            a.push(out);
            let o = meshsim(dir, &a);
            assert_refused(&o, out, reason);
        }
        // Its own output it writes, and replaces; no temporary file is left.
        let own = dir.join(format!("{what}.out"));
        for _ in 0..2 {
            let mut a = args.clone();
            a.push(s(&own));
            let o = meshsim(dir, &a);
            assert!(o.status.success(), "{what}: {}", stderr(&o));
        }
    }
    let full = std::fs::metadata("/dev/full").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &full.file_type()
    ));
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "mine");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(names(&folder).is_empty());
    assert_eq!(
        names(dir),
        [
            "compare.out",
            "folder",
            "foreign.txt",
            "link",
            "profile.out",
            "t.csv",
            "trace.out"
        ]
    );
}

/// Runs `n` meshsim runs at once into `out` (seeds 1 and 2 alternating); all succeed.
fn concurrent_runs(refs: &Refs, cwd: &Path, out: &Path, n: usize, env: &[(&str, &str)]) {
    let children: Vec<_> = (0..n)
        .map(|i| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_meshsim"));
            c.current_dir(cwd)
                .args(["run", s(&refs.scenario), "--out", s(out), "-q", "--seed"])
                .arg((1 + i % 2).to_string())
                .args(["--threads", "1"])
                .env_remove("MESHSIM_TEST_CRASH_AT")
                .env_remove("MESHSIM_TEST_NO_EXCHANGE")
                .stderr(std::process::Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
}

#[test]
fn concurrent_runs_into_one_folder_leave_one_whole_result_set_and_no_temporaries() {
    let refs = Refs::new();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // Into a new folder, then over existing results; with renameat2 and without.
    concurrent_runs(&refs, tmp.path(), &out, 8, &[]);
    refs.whole(&out);
    concurrent_runs(&refs, tmp.path(), &out, 8, &[]);
    refs.whole(&out);
    concurrent_runs(
        &refs,
        tmp.path(),
        &out,
        8,
        &[("MESHSIM_TEST_NO_EXCHANGE", "1")],
    );
    refs.whole(&out);
    assert_eq!(names(tmp.path()), ["out"]);
}

/// Runs seed 2 over the seed-1 results in `out` with the crash hook at `stage`, checks that
/// the process died, and returns the temporaries it left.
fn crash_at(refs: &Refs, cwd: &Path, out: &Path, stage: &str, portable: bool) -> Vec<String> {
    let mut env = vec![("MESHSIM_TEST_CRASH_AT", stage)];
    if portable {
        env.push(("MESHSIM_TEST_NO_EXCHANGE", "1"));
    }
    let o = run(cwd, &refs.scenario, out, 2, &env);
    assert!(
        !o.status.success(),
        "{stage}: the hook did not stop the run"
    );
    assert_eq!(o.status.code(), None, "{stage}: killed by a signal");
    temps(cwd)
}

#[test]
fn a_crash_at_any_stage_leaves_whole_results_and_the_next_run_cleans_up() {
    let refs = Refs::new();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // (stage, portable path, seed whose results are whole at `out` right after the crash)
    for (stage, portable, whole) in [
        ("file-tmp-written", false, 1), // writing a plot into the temporary folder
        ("dir-tmp-written", false, 1),
        ("dir-swapped", false, 2),
        ("dir-old-half-removed", false, 2),
        ("dir-tmp-written", true, 1),
        ("dir-swapped", true, 2),
    ] {
        let o = run(tmp.path(), &refs.scenario, &out, 1, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(temps(tmp.path()).is_empty());
        let left = crash_at(&refs, tmp.path(), &out, stage, portable);
        assert_eq!(refs.whole(&out), whole, "{stage}, portable {portable}");
        // The results' temporary folder, and the scratch folder of spooled request rows.
        assert_eq!(left.len(), 2, "{stage}: {left:?}");
        // The next run removes the leftover and replaces the results whole.
        let o = run(tmp.path(), &refs.scenario, &out, 1, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(refs.whole(&out), 1, "{stage}");
        assert_eq!(names(tmp.path()), ["out"], "{stage}");
    }
    // Portable path, between its two renames: `out` is missing and the old results are
    // whole under `.out.meshsim-old-*`; the next run puts them back before anything else.
    let left = crash_at(&refs, tmp.path(), &out, "dir-old-moved", true);
    assert!(!out.exists());
    assert_eq!(
        left.len(),
        3,
        "the old results, the new temporary and the scratch: {left:?}"
    );
    let old = left.iter().find(|n| n.contains(".meshsim-old-")).unwrap();
    assert_eq!(refs.whole(&tmp.path().join(old)), 1);
    let left = crash_at(&refs, tmp.path(), &out, "dir-tmp-written", false);
    assert_eq!(refs.whole(&out), 1, "restored: {left:?}");
    let o = run(tmp.path(), &refs.scenario, &out, 2, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(refs.whole(&out), 2);
    assert_eq!(names(tmp.path()), ["out"]);
}

#[test]
fn a_crash_while_writing_a_file_leaves_the_old_or_the_new_file_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let csv = dir.join("t.csv");
    let convert = |rows: &str, env: &[(&str, &str)]| {
        std::fs::write(
            &csv,
            format!("arrived_at,num_prefill_tokens,num_decode_tokens\n{rows}"),
        )
        .unwrap();
        meshsim_env(dir, &["trace", "convert", "t.csv", "--out", "t.jsonl"], env)
    };
    let o = convert("0.0,10,5\n", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let old = std::fs::read(dir.join("t.jsonl")).unwrap();
    let o = convert("0.0,10,5\n0.5,20,3\n", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let new = std::fs::read(dir.join("t.jsonl")).unwrap();
    assert_ne!(old, new);
    for (stage, portable, whole) in [
        ("file-tmp-written", false, &old),
        ("file-swapped", false, &new),
        ("file-old-moved", true, &old),
        ("file-swapped", true, &new),
    ] {
        let o = convert("0.0,10,5\n", &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut env = vec![("MESHSIM_TEST_CRASH_AT", stage)];
        if portable {
            env.push(("MESHSIM_TEST_NO_EXCHANGE", "1"));
        }
        let o = convert("0.0,10,5\n0.5,20,3\n", &env);
        assert_eq!(o.status.code(), None, "{stage}: killed by a signal");
        let left = temps(dir);
        if stage == "file-old-moved" {
            // The old file is whole under its `old` name; the next write restores it first.
            assert!(!dir.join("t.jsonl").exists());
            assert_eq!(left.len(), 2, "{left:?}");
            let o = old_name(&left);
            assert_eq!(&std::fs::read(dir.join(o)).unwrap(), whole);
        } else {
            assert_eq!(left.len(), 1, "{stage}: {left:?}");
            assert_eq!(
                &std::fs::read(dir.join("t.jsonl")).unwrap(),
                whole,
                "{stage}"
            );
        }
        let o = convert("0.0,10,5\n0.5,20,3\n", &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(std::fs::read(dir.join("t.jsonl")).unwrap(), new);
        assert_eq!(names(dir), ["t.csv", "t.jsonl"], "{stage}");
    }
}

fn old_name(names: &[String]) -> &str {
    names
        .iter()
        .find(|n| n.contains(".meshsim-old-"))
        .expect("an old name")
}
