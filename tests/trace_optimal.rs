//! `meshsim trace stats --optimal`: the Belady bound beside the LRU figures, from the command
//! line, on a Mooncake trace small enough to compute by hand; and `--optimal 0` refused.

mod common;

use common::deadline::{assert_refused, meshsim};

/// Blocks of 512 tokens: `7 8 | 7 9 | 7 8`, of 512, 488, 512, 88, 512 and 488 tokens (2,600).
const TRACE: &str = "\
{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [7, 8]}
{\"timestamp\": 10, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [7, 9]}
{\"timestamp\": 20, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [7, 8]}
";

#[test]
fn the_bound_is_printed_beside_the_lru_and_is_above_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.jsonl"), TRACE).unwrap();
    let o = meshsim(
        dir.path(),
        &[
            "trace",
            "stats",
            "t.jsonl",
            "--lru",
            "1000",
            "--optimal",
            "600,1000,100",
        ],
    );
    assert_eq!(o.status, 0, "{}", o.stderr);
    let out = &o.stdout;
    for line in [
        // Unbounded: the second request hits 7, the third 7 and 8: 1,512 tokens.
        "unbounded cache 58.15%",
        // The LRU loses 8 when 9 comes in: 512 + 512 tokens.
        "    LRU cache of 1000 tokens: 39.38%\n",
        // Belady keeps 7 and 8 and bypasses 9 (never used again): everything reused hits.
        "    Belady bound (any eviction, upper bound) of 1000 tokens: 58.15%\n",
        // 600 tokens: 7 whole, and 88 tokens of 8 (used last): 512 + 512 + 88.
        "    Belady bound (any eviction, upper bound) of 600 tokens: 42.77%\n",
        // No block fits in 100 tokens.
        "    Belady bound (any eviction, upper bound) of 100 tokens: 0.00%\n",
    ] {
        assert!(out.contains(line), "`{line}` not in:\n{out}");
    }
    // The bounds follow the LRU lines, in the order given.
    let lru = out.find("LRU cache of").unwrap();
    let first = out.find("of 600 tokens").unwrap();
    assert!(
        lru < first && first < out.find("of 100 tokens").unwrap(),
        "{out}"
    );
}

#[test]
fn a_bound_of_no_token_is_refused_naming_the_flag_before_the_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.jsonl"), TRACE).unwrap();
    for args in [
        &["trace", "stats", "t.jsonl", "--optimal", "0"][..],
        &["trace", "stats", "t.jsonl", "--optimal", "1000,0"],
        &["trace", "stats", "missing.jsonl", "--optimal", "0"],
    ] {
        let o = meshsim(dir.path(), args);
        assert_refused(&o, &["--optimal 0"]);
        assert!(o.stdout.is_empty(), "{}", o.stdout);
    }
    let o = meshsim(
        dir.path(),
        &["trace", "stats", "t.jsonl", "--optimal", "-1"],
    );
    assert_refused(&o, &["--optimal"]);
}
