//! Every numeric flag of the command line refuses a value that cannot be used, before any
//! work: one past its type (overflow), a negative one, zero where zero would run nothing, a
//! rate that is not a finite positive number, and a value past the flag's documented bound.
//! Each is refused with exit status 2 and a message naming the flag, nothing is written, and
//! nothing hangs (every command runs under the deadline of `tests/common/deadline.rs`).

mod common;

use std::path::Path;

use common::deadline::{Outcome, assert_refused, meshsim};

/// Two WikiQA questions on one paragraph: the smallest dataset `trace` reads.
const WIKIQA: &str = "QuestionID\tQuestion\tDocumentID\tDocumentTitle\tSentenceID\tSentence\tLabel\n\
                      Q1\twhat is x\tD1\tT\tD1-0\tx is y\t1\n\
                      Q2\twhat is z\tD1\tT\tD1-0\tz is w\t1\n";

/// Runs `meshsim args` in a fresh folder holding the small scenario (`s.toml`), a WikiQA
/// dataset (`q.tsv`) and a cookie (`cookie`); checks that it is refused with a message that
/// holds every one of `expected`, and that it wrote nothing (no `out`, `out.toml` or
/// `out.jsonl`, nor `results/`).
fn refused(args: &[&str], expected: &[&str]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(common::data("small.toml"), d.join("s.toml")).unwrap();
    std::fs::write(d.join("q.tsv"), WIKIQA).unwrap();
    std::fs::write(d.join("cookie"), "a-cookie-of-the-test-cluster\n").unwrap();
    let before = listing(d);
    let o = meshsim(d, args);
    assert_refused(&o, expected);
    assert!(!o.stderr.contains("panicked"), "{args:?}: {}", o.stderr);
    assert_eq!(listing(d), before, "{args:?} wrote into its folder");
    o
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `meshsim profile --model tiny` with `flags`, into `out.toml`.
fn profile(flags: &[&str]) -> Vec<String> {
    let mut args = vec!["profile", "--model", "tiny"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--out", "out.toml"]);
    args.into_iter().map(String::from).collect()
}

/// `meshsim trace convert q.tsv` with `flags`, into `out.jsonl`.
fn convert(flags: &[&str]) -> Vec<String> {
    let mut args = vec!["trace", "convert", "q.tsv"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--out", "out.jsonl"]);
    args.into_iter().map(String::from).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A value past the flag's type is refused by the parser, naming the flag.
#[test]
fn a_value_past_the_flags_type_is_refused_naming_the_flag() {
    let big = "99999999999999999999999";
    for flag in [
        "--shards",
        "--prefill",
        "--decode",
        "--repeats",
        "--seed",
        "--block-size",
        "--tensor-tokens",
    ] {
        let serving = ["--block-size", "--tensor-tokens"].contains(&flag);
        let flags = if serving {
            vec!["--serving", flag, big]
        } else {
            vec![flag, big]
        };
        refused(&strs(&profile(&flags)), &[flag]);
    }
    for flag in [
        "--requests",
        "--context-tokens",
        "--rate",
        "--output-tokens",
        "--seed",
    ] {
        let value = if flag == "--rate" { "1e400" } else { big };
        refused(&strs(&convert(&[flag, value])), &[flag]);
    }
    for flag in ["--lru", "--optimal", "--block-size"] {
        refused(&["trace", "stats", "q.tsv", flag, big], &[flag]);
    }
    for flag in ["--seeds", "--from", "--seed"] {
        refused(&["vopr", flag, big], &[flag]);
    }
    for flag in ["--seed", "--threads"] {
        refused(&["run", "s.toml", "--out", "out", flag, big], &[flag]);
    }
    refused(
        &["run", "s.toml", "--out", "out", "--points", "1/4294967296"],
        &["--points"],
    );
    for flag in ["--max-frame-mib", "--max-memory-gib"] {
        refused(
            &[
                "node",
                "--cookie-file",
                "cookie",
                "--listen",
                "127.0.0.1:0",
                flag,
                big,
            ],
            &[flag],
        );
    }
}

/// A negative number is read as the flag's value (and refused naming the flag), not as an
/// unknown option.
#[test]
fn a_negative_value_is_refused_naming_the_flag() {
    for flag in ["--shards", "--prefill", "--decode", "--repeats", "--seed"] {
        refused(&strs(&profile(&[flag, "-1"])), &[flag]);
    }
    refused(&strs(&profile(&["--prefill", "-1,8"])), &["--prefill"]);
    for flag in ["--block-size", "--tensor-tokens"] {
        refused(&strs(&profile(&["--serving", flag, "-16"])), &[flag]);
    }
    for flag in [
        "--requests",
        "--context-tokens",
        "--rate",
        "--output-tokens",
        "--seed",
    ] {
        refused(&strs(&convert(&[flag, "-1"])), &[flag]);
    }
    refused(&strs(&convert(&["--rate", "-0.5"])), &["--rate"]);
    for flag in ["--lru", "--optimal", "--block-size"] {
        refused(&["trace", "stats", "q.tsv", flag, "-1"], &[flag]);
    }
    for flag in ["--seeds", "--from", "--seed"] {
        refused(&["vopr", flag, "-1"], &[flag]);
    }
    for flag in ["--seed", "--threads"] {
        refused(&["run", "s.toml", "--out", "out", flag, "-1"], &[flag]);
    }
    for flag in ["--max-frame-mib", "--max-memory-gib"] {
        refused(
            &[
                "node",
                "--cookie-file",
                "cookie",
                "--listen",
                "127.0.0.1:0",
                flag,
                "-1",
            ],
            &[flag],
        );
    }
}

/// Zero repeats, shards, grid points, block or tensor tokens measure nothing; so do more
/// repeats than the bound, points past the longest profiled sequence, and grids out of order.
#[test]
fn profile_refuses_counts_that_measure_nothing_naming_the_flag() {
    for (flags, expected) in [
        (&["--repeats", "0"][..], &["--repeats 0"][..]),
        (
            &["--repeats", "4000000000"],
            &["--repeats 4000000000", "1000"],
        ),
        (&["--repeats", "1001"], &["--repeats 1001", "1000"]),
        (&["--shards", "0"], &["--shards"]),
        (&["--shards", "1000"], &["--shards"]),
        (&["--prefill", "0"], &["--prefill 0"]),
        (&["--prefill", "1,0,8"], &["--prefill 1,0,8", "prefill[1]"]),
        (&["--prefill", "8,4"], &["--prefill 8,4", "prefill[1]"]),
        (&["--prefill", "8,8"], &["--prefill 8,8", "prefill[1]"]),
        (
            &["--prefill", "1,200000"],
            &["--prefill 1,200000", "at most 8192"],
        ),
        (&["--decode", "0"], &["--decode 0"]),
        (
            &["--decode", "16,4000000000"],
            &["--decode 16,4000000000", "at most 8192"],
        ),
        (&["--serving", "--repeats", "0"], &["--repeats 0"]),
        (&["--serving", "--repeats", "5000"], &["--repeats 5000"]),
        (&["--serving", "--prefill", "0"], &["--prefill 0"]),
        (&["--serving", "--block-size", "0"], &["--block-size 0"]),
        (
            &["--serving", "--tensor-tokens", "0"],
            &["--tensor-tokens 0"],
        ),
        (
            &["--serving", "--block-size", "100000"],
            &["--block-size 100000"],
        ),
        (
            &["--serving", "--tensor-tokens", "24"],
            &["--tensor-tokens 24", "--block-size 16"],
        ),
        (
            &["--serving", "--tensor-tokens", "100000"],
            &["--tensor-tokens 100000", "8192"],
        ),
    ] {
        refused(&strs(&profile(flags)), expected);
    }
}

/// Flags that one kind of profile does not use are refused rather than silently ignored.
#[test]
fn profile_refuses_a_grid_flag_its_kind_of_profile_ignores() {
    refused(
        &strs(&profile(&["--serving", "--decode", "0"])),
        &["--decode", "--serving"],
    );
    refused(
        &strs(&profile(&["--serving", "--decode", "16"])),
        &["--decode", "--serving"],
    );
    for flag in ["--block-size", "--tensor-tokens"] {
        refused(&strs(&profile(&[flag, "32"])), &[flag, "--serving"]);
    }
}

/// A trace keeps at least one request; arrivals come at a finite positive rate whose gaps the
/// nanosecond clock can hold; outputs are at least one token and at most what a trace line may
/// hold; a context window holds at least one token.
#[test]
fn trace_refuses_counts_and_rates_that_make_no_trace_naming_the_flag() {
    for (flags, expected) in [
        (&["--requests", "0"][..], &["--requests 0"][..]),
        (&["--rate", "0"], &["--rate 0"]),
        (&["--rate", "inf"], &["--rate inf"]),
        (&["--rate", "NaN"], &["--rate NaN"]),
        (&["--rate=-1"], &["--rate -1"]),
        (&["--rate", "1e-300"], &["--rate 1e-300"]),
        (&["--rate", "1e300"], &["--rate 1e300"]),
        (&["--output-tokens", "0"], &["--output-tokens 0"]),
        (
            &["--output-tokens", "4000000000"],
            &["--output-tokens 4000000000"],
        ),
        (&["--context-tokens", "0"], &["--context-tokens 0"]),
    ] {
        refused(&strs(&convert(flags)), expected);
        let mut stats = vec!["trace", "stats", "q.tsv"];
        stats.extend_from_slice(flags);
        refused(&stats, expected);
    }
    for (flags, expected) in [
        (&["--block-size", "0"][..], &["--block-size 0"][..]),
        (
            &["--block-size", "4000000000"],
            &["--block-size 4000000000"],
        ),
        (&["--lru", "0"], &["--lru 0"]),
        (&["--lru", "1000,0"], &["--lru 0"]),
        (&["--optimal", "0"], &["--optimal 0"]),
        (&["--optimal", "1000,0"], &["--optimal 0"]),
    ] {
        let mut stats = vec!["trace", "stats", "q.tsv"];
        stats.extend_from_slice(flags);
        refused(&stats, expected);
    }
}

/// `vopr` runs at least one seed and at most its bound, without collecting the seeds first;
/// `--seed` runs one seed and is not combined with `--seeds` or `--from`, which it would ignore.
#[test]
fn vopr_refuses_seed_counts_it_cannot_run_naming_the_flag() {
    for (args, expected) in [
        (&["vopr", "--seeds", "0"][..], &["--seeds 0"][..]),
        (
            &["vopr", "--seeds", "18446744073709551615"],
            &["--seeds 18446744073709551615"],
        ),
        (&["vopr", "--seeds", "4000000000"], &["--seeds 4000000000"]),
        (
            &["vopr", "--seed", "3", "--seeds", "0"],
            &["--seed", "--seeds"],
        ),
        (
            &["vopr", "--seed", "3", "--seeds", "2"],
            &["--seed", "--seeds"],
        ),
        (
            &["vopr", "--seed", "3", "--from", "5"],
            &["--seed", "--from"],
        ),
    ] {
        refused(args, expected);
    }
}

/// The node's bounds are the ones its message states.
#[test]
fn node_refuses_zero_and_past_the_bound_stating_the_bound() {
    for (flag, value, bound) in [
        ("--max-frame-mib", "0", "1 to 4096"),
        ("--max-frame-mib", "4097", "1 to 4096"),
        ("--max-memory-gib", "0", "1 to 1048576"),
        ("--max-memory-gib", "2000000", "1 to 1048576"),
    ] {
        let said = format!("{flag} {value}");
        refused(
            &[
                "node",
                "--cookie-file",
                "cookie",
                "--listen",
                "127.0.0.1:0",
                flag,
                value,
            ],
            &[&said, bound],
        );
    }
}
