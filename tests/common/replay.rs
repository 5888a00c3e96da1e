//! Loading the published datasets for the replay tests (`tests/replay.rs`,
//! `tests/replay_bad_input.rs`).

use std::path::{Path, PathBuf};

use meshsim::workload::TraceError;
use meshsim::workload::replay::{self, Loaded, ReplaySpec, Source};

/// `../shared/datasets`; the test fails, saying what to do, when a file is missing.
pub fn datasets() -> PathBuf {
    super::shared_datasets()
}

/// Loads `path` as `source`, at most `max` requests (seed 1).
pub fn load(source: Source, path: &Path, max: Option<u32>) -> Result<Loaded, TraceError> {
    let mut spec = ReplaySpec::new(source, path);
    spec.max_requests = max;
    replay::load(&spec, 1)
}
