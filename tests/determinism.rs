//! One scenario and one seed give byte-identical result files; another seed does not.

mod common;

#[test]
fn the_same_seed_gives_byte_identical_results() {
    let s = common::small();
    let a = common::run_to_files(&s, 1);
    let b = common::run_to_files(&s, 2);
    assert!(a.0 == b.0, "requests.csv differs between two runs");
    assert!(a.1 == b.1, "summary.csv differs between two runs");
    assert!(a.0.len() > 1000 && a.1.len() > 100);
}

#[test]
fn another_seed_gives_different_results() {
    let s = common::small();
    let mut t = s.clone();
    t.seed += 1;
    let a = common::run_to_files(&s, 2);
    let b = common::run_to_files(&t, 2);
    assert!(a.0 != b.0, "requests.csv should change with the seed");
    assert!(a.1 != b.1, "summary.csv should change with the seed");
}
