//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod deadline;
pub mod node;
pub mod pipeline;
pub mod replay;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meshsim::Scenario;
use meshsim::hash::{ROOT_PARENT, block_hash};
use meshsim::serving::build::trace;
use meshsim::serving::outcome::{PolicyRun, write_results};
use meshsim::serving::sim::simulate_all;
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

/// The hardware and model of the small live serving scenarios: 2 nodes x 2 "GPUs" that are
/// shares of the host's CPU, tiny-32k in f32 (scenario text, up to `[serving]`).
pub const LIVE_TINY_2X2: &str = r#"[hardware]
nodes = 2
gpus_per_node = 2
[hardware.gpu]
name = "cpu"
memory_gib = 0.25
memory_bandwidth_gb_per_s = 10.0
peak_tflops = 0.02
compute_efficiency = 1.0
memory_efficiency = 1.0
[hardware.host]
memory_gib = 8.0
memory_bandwidth_gb_per_s = 5.0
[hardware.ssd]
drives = 1
capacity_gb_per_drive = 1.0
read_bandwidth_gb_per_s_per_drive = 5.0
write_bandwidth_gb_per_s_per_drive = 5.0
latency_us = 1.0
[hardware.pcie]
bandwidth_gb_per_s = 5.0
latency_ns = 1000
[hardware.nvlink]
bandwidth_gb_per_s = 5.0
latency_ns = 1000
[hardware.network]
nics_per_node = 1
nic_bandwidth_gbit_per_s = 40.0
nic_latency_ns = 1000
switch_latency_ns = 0
switch_hops = 1
[model]
preset = "tiny-32k"
dtype = "f32"
"#;

/// A multi-threaded tokio runtime of 2 workers (live runs block inside handlers).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
