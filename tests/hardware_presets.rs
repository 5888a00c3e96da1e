//! The hardware catalogue: a scenario that names a node preset gets the node's figures, keys it
//! writes replace the preset's, a GPU preset replaces the node's GPU, and unknown names or
//! figures no table gives are refused naming the key.

use meshsim::Scenario;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// `scenarios/polaris_32gpu.toml` with its whole `[hardware]` section replaced by `hardware`.
fn polaris_with(hardware: &str) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(root().join("scenarios/polaris_32gpu.toml")).unwrap();
    let (start, end) = (
        text.find("[hardware]").unwrap(),
        text.find("[model]").unwrap(),
    );
    let text = format!("{}{hardware}\n{}", &text[..start], &text[end..]);
    Scenario::parse("p.toml", "p", &text).map_err(|e| e.to_string())
}

#[test]
fn the_polaris_preset_is_the_bundled_scenarios_hardware() {
    let bundled = Scenario::load(&root().join("scenarios/polaris_32gpu.toml")).unwrap();
    let preset = polaris_with("[hardware]\npreset = \"polaris\"\nnodes = 8\n").unwrap();
    assert_eq!(preset.hardware, bundled.hardware);
}

#[test]
fn a_node_preset_gives_its_figures_and_the_scenarios_keys_replace_them() {
    let s = polaris_with("[hardware]\npreset = \"dgx-h100\"\nnodes = 2\n").unwrap();
    let h = &s.hardware;
    assert_eq!((h.nodes, h.gpus_per_node, h.total_gpus()), (2, 8, 16));
    assert_eq!(h.gpu.name, "H100-SXM5-80GB");
    assert_eq!(h.gpu.memory_bandwidth, 3350e9);
    assert_eq!(h.gpu.peak_flops, 989.5e12);
    assert_eq!(h.network.nics_per_node, 8);
    assert_eq!(h.network.nic.bandwidth, 400e9 / 8.0 * 1.0);
    assert_eq!(h.pcie.bandwidth, 63e9);
    assert_eq!(s.instances(), 16);
    // A GPU preset replaces the node's GPU (and its links); a key replaces a figure.
    let s = polaris_with(
        "[hardware]\npreset = \"dgx-h100\"\nnodes = 1\n[hardware.gpu]\npreset = \"h200-sxm\"\n\
         compute_efficiency = 0.68\n[hardware.network]\nnics_per_node = 4\n",
    )
    .unwrap();
    let h = &s.hardware;
    assert_eq!(h.gpu.name, "H200-SXM-141GB");
    assert_eq!(h.gpu.memory_bytes, 141 << 30);
    assert_eq!(h.gpu.compute_efficiency, 0.68);
    assert_eq!(h.network.nics_per_node, 4);
    assert_eq!(h.network.switch_hops, 3);
    // Every GPU and node of the catalogue makes a valid cluster.
    for node in ["polaris", "dgx-h100", "dgx-h200", "dgx-b200"] {
        polaris_with(&format!("[hardware]\npreset = \"{node}\"\nnodes = 2\n"))
            .unwrap_or_else(|e| panic!("{node}: {e}"));
    }
    for gpu in [
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "h100-sxm",
        "h200-sxm",
        "b200",
        "mi300x",
        "l40s",
    ] {
        let hw = format!(
            "[hardware]\npreset = \"polaris\"\nnodes = 1\n[hardware.gpu]\npreset = \"{gpu}\"\n\
             [hardware.nvlink]\nbandwidth_gb_per_s = 31.5\n"
        );
        let s = polaris_with(&hw).unwrap_or_else(|e| panic!("{gpu}: {e}"));
        assert!(s.hardware.gpu.memory_bytes >= 40 << 30, "{gpu}");
    }
}

#[test]
fn unknown_presets_and_missing_figures_are_refused_naming_the_key() {
    let e = polaris_with("[hardware]\npreset = \"dgx-z9\"\nnodes = 2\n").unwrap_err();
    assert!(
        e.contains("hardware.preset") && e.contains("dgx-h100"),
        "{e}"
    );
    let e = polaris_with(
        "[hardware]\npreset = \"polaris\"\nnodes = 2\n[hardware.gpu]\npreset = \"x\"\n",
    )
    .unwrap_err();
    assert!(
        e.contains("hardware.gpu.preset") && e.contains("h100-sxm"),
        "{e}"
    );
    // No preset: every figure must be written.
    let e = polaris_with("[hardware]\nnodes = 2\ngpus_per_node = 4\n").unwrap_err();
    assert!(e.contains("hardware.gpu") && e.contains("missing"), "{e}");
    let e = polaris_with("[hardware]\npreset = \"polaris\"\n").unwrap_err();
    assert!(e.contains("hardware.nodes") && e.contains("missing"), "{e}");
    // L40S has no NVLink: a node of them must say what its GPUs talk over.
    let e = polaris_with(
        "[hardware]\nnodes = 1\ngpus_per_node = 4\n[hardware.gpu]\npreset = \"l40s\"\n",
    )
    .unwrap_err();
    assert!(e.contains("hardware.host") && e.contains("missing"), "{e}");
    // Values from a preset are checked as the scenario's are.
    let e = polaris_with(
        "[hardware]\npreset = \"polaris\"\nnodes = 2\n[hardware.gpu]\nmemory_gib = -1.0\n",
    )
    .unwrap_err();
    assert!(e.contains("hardware.gpu.memory_gib"), "{e}");
}
