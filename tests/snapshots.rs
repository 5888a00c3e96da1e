//! Pins each policy's behaviour on a small scenario: any change in results shows up here.
//! The summary is transposed (one line per column) so that a change reads as a small diff.

mod common;

#[test]
fn small_scenario_summary_under_every_policy() {
    let s = common::small();
    let (_, summary) = common::run_to_files(&s, 2);
    let text = String::from_utf8(summary).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
    let mut out = String::new();
    for (i, column) in rows[0].iter().enumerate() {
        let values: Vec<&str> = rows[1..].iter().map(|r| r[i]).collect();
        out += &format!("{column:<26} {}\n", values.join("  "));
    }
    insta::assert_snapshot!(out);
}
