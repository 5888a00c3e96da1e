//! Profiles of the real backend: a measured profile round-trips through its TOML file exactly,
//! bad profile files are rejected with the file, the key and the reason, and `meshsim profile`
//! writes a loadable file (exit status 2 on bad arguments).

use std::process::Command;

use candle_core::Device;
use meshsim::backend::{Activation, ModelBackend, SimBackend};
use meshsim::exec::{TransformerConfig, WeightSource};
use meshsim::model::profile::{Profile, ProfileError};
use meshsim::model::split_layers;
use meshsim::profiling::{Grid, measure};

fn tiny_grid() -> Grid {
    Grid {
        prefill: vec![1, 4],
        decode: vec![1, 4],
        repeats: 1,
    }
}

#[test]
fn a_measured_tiny_profile_round_trips_and_times_every_point() {
    let cfg = TransformerConfig::from_preset(&meshsim::model::catalogue::TINY);
    let layers = split_layers(cfg.layers, 2).unwrap();
    let p = measure(
        &cfg,
        &layers,
        &WeightSource::Seeded(7),
        &Device::Cpu,
        &tiny_grid(),
    )
    .unwrap();
    assert_eq!(
        (p.model.as_str(), p.device.as_str(), p.dtype.as_str()),
        ("tiny", "cpu", "f32")
    );
    assert_eq!(p.repeats, 1);
    assert_eq!(p.layer_ranges(), layers);
    for s in &p.shards {
        let xs: Vec<u32> = s.prefill.iter().map(|&(x, _)| x).collect();
        assert_eq!(xs, [1, 4]);
        let cs: Vec<u32> = s.decode.iter().map(|&(x, _)| x).collect();
        assert_eq!(cs, [1, 4]);
        assert!(s.prefill.iter().chain(&s.decode).all(|&(_, t)| t.0 > 0));
    }
    let text = p.to_toml();
    assert!(text.starts_with("# A meshsim profile"), "{text}");
    assert_eq!(Profile::parse("tiny.toml", &text).unwrap(), p);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("tiny.toml");
    meshsim::profiling::write(&p, &path).unwrap();
    assert_eq!(Profile::load(&path).unwrap(), p);
    // Only the profile is left behind: the temporary file was renamed.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["tiny.toml"]);

    // A profiled sim backend for the tail charges the tail's measured times.
    let tail = p.shard(&layers[1]).unwrap().clone();
    let mut b = SimBackend::profiled(cfg.model_config(4), layers[1].clone(), tail.clone());
    let head = p.shard(&layers[0]).unwrap().clone();
    let mut h = SimBackend::profiled(cfg.model_config(4), layers[0].clone(), head.clone());
    let step = h
        .run(layers[0].clone(), Activation::tokens(vec![1; 4]), 0, None)
        .unwrap();
    assert_eq!(step.duration, Some(head.prefill(4)));
    let meshsim::backend::StepOutput::Activation(x) = step.output else {
        panic!("the head returns an activation");
    };
    assert_eq!(x.bytes(), 4 * 256 * 4);
    let step = b.run(layers[1].clone(), x, 0, None).unwrap();
    assert_eq!(step.duration, Some(tail.prefill[1].1));
}

const GOOD: &str = r#"model = "tiny"
device = "cpu"
dtype = "f32"
repeats = 1

[[shard]]
layers = [0, 2]
prefill = [[1, 100], [4, 200]]
decode = [[1, 50], [4, 60]]

[[shard]]
layers = [2, 4]
prefill = [[1, 100], [4, 200]]
decode = [[1, 50], [4, 60], [8, 70], [16, 80]]
"#;

/// `GOOD` with its first occurrence of `from` replaced by `to`.
fn bad(from: &str, to: &str) -> ProfileError {
    assert!(GOOD.contains(from), "{from}");
    let text = GOOD.replacen(from, to, 1);
    Profile::parse("bad.toml", &text).expect_err(&text)
}

fn assert_names(e: &ProfileError, parts: &[&str]) {
    let msg = e.to_string();
    assert!(msg.starts_with("bad.toml"), "{msg}");
    for p in parts {
        assert!(msg.contains(p), "{msg:?} lacks {p:?}");
    }
}

#[test]
fn the_good_file_parses_and_interpolates() {
    let p = Profile::parse("good.toml", GOOD).unwrap();
    let s = p.shard(&(2..4)).unwrap();
    assert_eq!(s.decode(12).0, 75);
    assert_eq!(s.decode(32).0, 100);
    assert_eq!(s.prefill(2).0, 133);
    assert!(p.shard(&(0..4)).is_none());
}

#[test]
fn bad_profiles_are_rejected_naming_the_file_and_the_key() {
    let last = "[8, 70], [16, 80]]";
    let e = bad(last, "[16, 70], [8, 80]]");
    assert!(matches!(e, ProfileError::Grid { .. }));
    assert_names(
        &e,
        &["shard[1].decode[3]", "strictly increasing", "8 after 16"],
    );

    let e = bad(last, "[8, 70], [8, 80]]");
    assert!(matches!(e, ProfileError::Grid { .. }));
    assert_names(&e, &["shard[1].decode[3]", "duplicate"]);

    let e = bad(last, "[8, 70], [16, 0]]");
    assert!(matches!(e, ProfileError::NonPositive { .. }));
    assert_names(&e, &["shard[1].decode[3]", "positive time", "found 0"]);
    let e = bad(last, "[8, 70], [16, -5]]");
    assert_names(&e, &["shard[1].decode[3]", "found -5"]);
    let e = bad("prefill = [[1, 100]", "prefill = [[0, 100]");
    assert_names(&e, &["shard[0].prefill[0]", "positive token count"]);

    let e = bad("prefill = [[1, 100], [4, 200]]", "prefill = []");
    assert!(matches!(e, ProfileError::EmptyGrid { .. }));
    assert_names(&e, &["shard[0].prefill", "empty grid"]);

    let e = bad("layers = [2, 4]", "layers = [3, 4]");
    assert!(matches!(e, ProfileError::Layers { .. }));
    assert_names(&e, &["shard[1].layers", "contiguous from 0"]);
    let e = bad("layers = [0, 2]", "layers = [1, 2]");
    assert_names(&e, &["shard[0].layers", "contiguous from 0"]);
    let e = bad("layers = [2, 4]", "layers = [2, 3]");
    assert_names(&e, &["shard[1].layers", "the model has 4 layers"]);
    let e = bad("layers = [2, 4]", "layers = [2]");
    assert_names(&e, &["shard[1].layers", "found 1 numbers"]);

    let e = bad(r#"model = "tiny""#, r#"model = "huge""#);
    assert!(matches!(e, ProfileError::UnknownModel { .. }));
    assert_names(&e, &["model", "unknown model \"huge\""]);

    let e = bad("repeats = 1", "repeats = 0");
    assert_names(&e, &["repeats", "positive"]);
    let e = bad("[8, 70]", "[8, 70, 3]");
    assert_names(&e, &["shard[1].decode[2]", "pair"]);
    let e = bad(r#"dtype = "f32""#, r#"dtype = "f64""#);
    assert_names(&e, &["dtype", "f64"]);
}

#[test]
fn syntax_type_and_key_errors_carry_the_line_or_the_key() {
    let e = bad("decode = [[1, 50], [4, 60]]", "decode = [[1, 50], [4, 60]");
    assert!(matches!(
        e,
        ProfileError::Syntax {
            line_col: Some(_),
            ..
        }
    ));
    assert_names(&e, &["bad.toml:"]);

    let e = bad("[16, 80]", "[16, \"fast\"]");
    let ProfileError::Syntax { line_col, key, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(line_col.map(|(l, _)| l), Some(14));
    assert_eq!(key, "shard[1].decode[3][1]");

    let e = bad("repeats = 1", "repeats = 1\nwarmup = 2");
    assert_names(&e, &["warmup"]);

    let e = Profile::load(std::path::Path::new("/nonexistent/profile.toml")).unwrap_err();
    assert!(matches!(e, ProfileError::Unreadable { .. }));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/profile.toml: cannot read")
    );
}

#[test]
fn the_cli_writes_a_loadable_profile_and_rejects_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.toml");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_meshsim"))
            .arg("profile")
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[
        "--model",
        "tiny",
        "--shards",
        "2",
        "--prefill",
        "1,4",
        "--decode",
        "1,4",
        "--repeats",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("prefill 4 tokens/s"), "{stdout}");
    let p = Profile::load(&out).unwrap();
    assert_eq!(p.layer_ranges(), [0..2, 2..4]);
    assert_eq!(p.repeats, 1);

    let o = run(&["--model", "tiny", "--shards", "0", "--out", "x.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--shards"));
    let o = run(&["--model", "tiny", "--prefill", "8,4", "--out", "x.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("prefill[1]"));
    let o = run(&[
        "--model",
        "tiny",
        "--prefill",
        "1,200000",
        "--out",
        "x.toml",
    ]);
    assert_eq!(o.status.code(), Some(2), "a grid beyond MAX_PROFILE_TOKENS");
    assert!(String::from_utf8_lossy(&o.stderr).contains("at most 8192"));
    let o = run(&["--model", "huge", "--out", "x.toml"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["--model", "tiny"]);
    assert_eq!(o.status.code(), Some(2), "--out is required");
    assert!(!std::path::Path::new("x.toml").exists());
}

#[test]
fn the_committed_small_profile_loads_and_covers_the_default_grid() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/small_2shard_cpu.toml");
    let p = Profile::load(&path).unwrap();
    assert_eq!(p.model, "small");
    assert_eq!(p.layer_ranges(), [0..4, 4..8]);
    let g = Grid::default();
    for s in &p.shards {
        let xs: Vec<u32> = s.prefill.iter().map(|&(x, _)| x).collect();
        assert_eq!(xs, g.prefill);
        let cs: Vec<u32> = s.decode.iter().map(|&(x, _)| x).collect();
        assert_eq!(cs, g.decode);
    }
    assert_eq!(Profile::parse("again", &p.to_toml()).unwrap(), p);
}
