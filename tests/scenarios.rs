//! Every bundled scenario is valid, and names its results folder after its file.

use std::path::Path;

use meshsim::Scenario;
use meshsim::pipeline::scenario::{PipelineScenario, is_pipeline};

/// The policies of study_network (the first six) and study_load (all).
const LOAD_CHOICES: [&str; 8] = [
    "vanilla",
    "local-prefix",
    "evostore",
    "ptstore",
    "evostore-when-faster",
    "ptstore-when-faster",
    "vllm-offload",
    "mooncake-store",
];

#[test]
fn every_bundled_scenario_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    let mut pipelines = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy();
        if is_pipeline(&std::fs::read_to_string(&path).unwrap()) {
            let s = PipelineScenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.name, stem, "{}", path.display());
            assert!(
                !s.live,
                "{}: bundled pipeline scenarios simulate",
                path.display()
            );
            pipelines += 1;
            continue;
        }
        let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.name, stem, "{}", path.display());
        n += 1;
        // Validation scenarios reproduce a published measurement: its hardware, the policy
        // it measured (tests/validation.rs).
        if stem.starts_with("validation_") {
            continue;
        }
        // The paper's four, or the deployed systems beside vanilla (live_small_presets), or
        // one store's eviction orders and admissions (study_eviction), or the paper's four
        // and its two stores deciding to load or recompute (study_network; study_load adds
        // two deployed systems).
        let want: &[&str] = if stem == "live_small_presets" {
            &[
                "vanilla",
                "vllm-offload",
                "lmcache",
                "sglang-hicache",
                "mooncake-store",
                "dynamo-kvbm",
            ]
        } else if stem == "study_eviction" {
            &[
                "lru",
                "gdsf",
                "lfu",
                "s3-fifo",
                "arc",
                "lru-second-hit",
                "lru-tinylfu",
            ]
        } else if stem == "study_network" {
            &LOAD_CHOICES[..6]
        } else if stem == "study_load" {
            &LOAD_CHOICES
        } else {
            &["vanilla", "local-prefix", "evostore", "ptstore"]
        };
        let names: Vec<&str> = s.policies.iter().map(|p| p.name()).collect();
        assert_eq!(names, want, "{}", path.display());
        assert!(!s.live, "{}: bundled scenarios simulate", path.display());
        // Live scenarios describe the host that runs them (a CPU) and compute in f32.
        if stem.starts_with("live_") {
            assert_eq!(s.model.bytes_per_element, 4, "{}", path.display());
            meshsim::serving::live::check_live(&s, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{e}"));
            continue;
        }
        assert_eq!(s.hardware.gpu.name, "A100-SXM4-40GB", "{}", path.display());
    }
    assert!(n >= 12, "{n} scenarios");
    assert!(pipelines >= 4, "{pipelines} pipeline scenarios");
}
