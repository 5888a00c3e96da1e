//! The names of the files meshsim writes into a results folder, in one place: the plots name
//! their figures from here, and [`super::output`] replaces only folders holding nothing else.

/// The marker file in every results folder that meshsim writes (see [`super::output`]).
pub const MARKER: &str = ".meshsim-results";

/// The manifest of a share of a run (see [`super::share`]): a folder that holds one was written
/// by `meshsim run --points`, and running that share again may replace it.
pub const SHARE_MANIFEST: &str = "share.toml";

/// The figures' file names without extension, in `plot::Figure` order.
pub const FIGURES: [&str; 6] = [
    "ttft_cdf",
    "tpot_cdf",
    "ttft_percentiles",
    "throughput",
    "prefix_hits",
    "tps_output",
];

/// Every name meshsim writes into a results folder (each figure as PNG and SVG).
pub fn names() -> Vec<String> {
    let mut v: Vec<String> = [
        MARKER,
        "scenario.toml",
        "requests.csv",
        "summary.csv",
        "summary.json",
        "report.md",
        "comparison.md",
        SHARE_MANIFEST,
    ]
    .map(String::from)
    .to_vec();
    for stem in FIGURES {
        v.push(format!("{stem}.png"));
        v.push(format!("{stem}.svg"));
    }
    v
}
