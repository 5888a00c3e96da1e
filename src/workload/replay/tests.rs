use super::*;

fn vidur(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("t.csv");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_byte_order_mark_is_stripped_and_lines_follow_requests_after_sorting() {
    let dir = tempfile::tempdir().unwrap();
    let p = vidur(
        dir.path(),
        "\u{feff}arrived_at,num_prefill_tokens,num_decode_tokens\n2.0,10,1\n\n1.0,40,1\n",
    );
    let l = load(&ReplaySpec::new(Source::VidurCsv, &p), 1).unwrap();
    // Sorted by arrival: line 4 first.
    assert_eq!(l.lines, vec![4, 2]);
    let e = l.check_fits(&p, Nanos::from_secs(10), 20, "m").unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (Some(4), "num_prefill_tokens"));
    let e = l.check_fits(&p, Nanos::from_secs(1), 100, "m").unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (Some(2), "arrived_at"));
    assert!(l.check_fits(&p, Nanos::from_secs(2), 40, "m").is_ok());
}

#[test]
fn a_file_without_requests_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = vidur(
        dir.path(),
        "arrived_at,num_prefill_tokens,num_decode_tokens\n",
    );
    let e = load(&ReplaySpec::new(Source::VidurCsv, &p), 1).unwrap_err();
    assert!(e.message.contains("no requests"), "{e}");
}
