//! Every bundled scenario is valid, and names its results folder after its file.

use std::path::Path;

use meshsim::Scenario;

#[test]
fn every_bundled_scenario_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let stem = path.file_stem().unwrap().to_string_lossy();
        assert_eq!(s.name, stem, "{}", path.display());
        assert_eq!(s.policies.len(), 4, "{}: all four policies", path.display());
        assert_eq!(s.hardware.gpu.name, "A100-SXM4-40GB", "{}", path.display());
        n += 1;
    }
    assert!(n >= 12, "{n} scenarios");
}
