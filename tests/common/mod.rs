//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meshsim::Scenario;
use meshsim::serving::run::{PolicyRun, simulate_all, trace, write_results};

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

pub fn small() -> Scenario {
    Scenario::load(&data("small.toml")).expect("tests/data/small.toml is valid")
}

pub fn run(s: &Scenario, threads: usize) -> Vec<PolicyRun> {
    simulate_all(s, Arc::new(trace(s).expect("the trace loads")), threads)
        .expect("the simulation succeeds")
}

/// Runs `s` and returns the bytes of (requests.csv, summary.csv).
pub fn run_to_files(s: &Scenario, threads: usize) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    write_results(s, &run(s, threads), &out).unwrap();
    (
        std::fs::read(out.join("requests.csv")).unwrap(),
        std::fs::read(out.join("summary.csv")).unwrap(),
    )
}
