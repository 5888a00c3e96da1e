//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod node;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meshsim::Scenario;
use meshsim::hash::{ROOT_PARENT, block_hash};
use meshsim::serving::run::{PolicyRun, simulate_all, trace, write_results};
use meshsim::serving::store::directory::TensorId;

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The store's tensor ids of a prompt made of `symbols`, one symbol per chunk (ids are the
/// chained hashes of the prefix up to each chunk, as the serving instance makes them).
pub fn chain(symbols: &[u8]) -> Vec<TensorId> {
    let mut parent = ROOT_PARENT;
    symbols
        .iter()
        .map(|&s| {
            parent = block_hash(parent, &[s as u32]);
            parent
        })
        .collect()
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

/// The files of `../shared/datasets` that tests read.
pub const SHARED_DATASETS: [&str; 8] = [
    "squad/dev-v1.1.json",
    "wikiqa/WikiQA-dev.tsv",
    "wikiqa/WikiQA-test.tsv",
    "mooncake/conversation_trace.jsonl",
    "mooncake/synthetic_trace.jsonl",
    "vidur/splitwise_conv.csv",
    "vidur/splitwise_code.csv",
    "tokenizers/mistral-v1.json",
];

/// `../shared/datasets` (the published datasets beside the project), after checking that it
/// holds every file in [`SHARED_DATASETS`]. A test that needs real data calls this first, so
/// it fails, saying what to do, when the data is missing: it never passes without it.
pub fn shared_datasets() -> PathBuf {
    shared_datasets_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/datasets"))
}

/// [`shared_datasets`] for the folder `dir`.
pub fn shared_datasets_in(dir: &Path) -> PathBuf {
    let missing: Vec<&str> = SHARED_DATASETS
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "{} lacks {missing:?}. This test replays real data from ../shared/datasets, the folder \
         of published datasets beside the project (its README.md lists each file and where it \
         comes from). Put that folder there with these files and run the tests again.",
        dir.display()
    );
    dir.to_path_buf()
}
