//! Plots and report.md: written by every run, redrawn by `meshsim plot` from the CSV files
//! alone, byte-identical for identical CSV files, with text drawn by the embedded font even
//! where the machine has no font at all, and bad CSV files reported as bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use meshsim::metrics::write::{write_requests, write_summary};
use meshsim::metrics::{Report, RequestRecord, Summary};
use meshsim::results::plot::{Figure, Results, output_files};
use meshsim::serving::outcome::write_results;
use meshsim::units::Nanos;

/// Runs the small scenario and writes its results (CSV, plots, report) into `<tmp>/out`.
fn results() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let s = common::small();
    write_results(&s, &common::run(&s, 2), &out).unwrap();
    (tmp, out)
}

fn meshsim_plot(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .arg("plot")
        .arg(dir)
        .output()
        .unwrap()
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Decodes a PNG file into (width, height, RGB bytes).
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Pixels clearly darker than the white background in rows `rows` of an RGB image.
fn dark_pixels(rgb: &[u8], width: u32, rows: std::ops::Range<u32>) -> usize {
    let w = width as usize;
    rgb[rows.start as usize * w * 3..rows.end as usize * w * 3]
        .chunks(3)
        .filter(|p| p.iter().all(|&c| c < 128))
        .count()
}

#[test]
fn a_run_writes_every_plot_and_the_report() {
    let (_tmp, out) = results();
    for f in output_files(&out) {
        let bytes = read(&out, &f);
        if f.ends_with(".png") {
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{f} is not a PNG");
        } else if f.ends_with(".svg") {
            let text = String::from_utf8(bytes).unwrap();
            assert!(text.contains("<svg") && text.contains("</svg>"), "{f}");
            assert!(
                text.contains("vanilla") && text.contains("local-prefix"),
                "{f}"
            );
        }
    }
    let report = String::from_utf8(read(&out, "report.md")).unwrap();
    assert!(report.starts_with("# small\n"), "{report}");
    assert!(report.contains("| vanilla | 400/400 |"), "{report}");
    assert!(report.contains("has the lowest TTFT p50"), "{report}");
    assert!(report.contains("has the lowest TTFT p99"), "{report}");
    for f in Figure::ALL {
        assert!(report.contains(&format!("]({}.png)", f.stem())), "{report}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "out")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn plots_are_byte_identical_for_identical_csv_files() {
    let (_a, a) = results();
    let (_b, b) = results();
    for f in output_files(&a) {
        assert!(read(&a, &f) == read(&b, &f), "{f} differs between two runs");
    }
    // `meshsim plot` redraws from the CSV files alone: the same bytes again.
    let before: Vec<Vec<u8>> = output_files(&a).iter().map(|f| read(&a, f)).collect();
    for f in output_files(&a) {
        std::fs::remove_file(a.join(&f)).unwrap();
    }
    let out = meshsim_plot(&a);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (f, old) in output_files(&a).iter().zip(before) {
        assert!(
            read(&a, f) == old,
            "{f} differs when redrawn by meshsim plot"
        );
    }
}

#[test]
fn the_title_is_drawn_with_the_embedded_font_without_system_fonts() {
    let (tmp, out) = results();
    for f in output_files(&out) {
        std::fs::remove_file(out.join(&f)).unwrap();
    }
    // An empty fontconfig configuration and font path: no font can come from the system.
    let empty = tmp.path().join("no-fonts");
    std::fs::create_dir(&empty).unwrap();
    let conf = empty.join("fonts.conf");
    std::fs::write(
        &conf,
        "<?xml version=\"1.0\"?>\n<fontconfig></fontconfig>\n",
    )
    .unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .arg("plot")
        .arg(&out)
        .env("FONTCONFIG_FILE", &conf)
        .env("FONTCONFIG_PATH", &empty)
        .env("XDG_DATA_HOME", &empty)
        .env("XDG_DATA_DIRS", &empty)
        .env("HOME", &empty)
        .output()
        .unwrap();
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for f in Figure::ALL {
        let (w, h, rgb) = decode_png(&read(&out, &format!("{}.png", f.stem())));
        assert_eq!((w, h), f.size());
        // The top 45 rows hold only the figure's title: dark pixels there are its glyphs.
        let title = dark_pixels(&rgb, w, 0..45);
        assert!(
            title > 300,
            "{}: only {title} dark pixels in the title",
            f.stem()
        );
    }
}

#[test]
fn text_changes_the_pixels_it_is_drawn_on() {
    let (_tmp, out) = results();
    let r = Results::load(&out).unwrap();
    let with = Figure::Throughput.rgb(&r).unwrap();
    let mut renamed = r.clone();
    for row in &mut renamed.summary {
        row.policy = format!("{}-renamed-with-a-longer-label", row.policy);
    }
    let other = Figure::Throughput.rgb(&renamed).unwrap();
    let (w, h) = Figure::Throughput.size();
    // Policy names are drawn under the bars, in the bottom 70 rows.
    let rows = (h - 70) as usize * w as usize * 3..h as usize * w as usize * 3;
    assert!(
        with[rows.clone()] != other[rows.clone()],
        "changing the labels must change the label area"
    );
    let top = 0..45 * w as usize * 3;
    assert!(with[top.clone()] == other[top], "the title did not change");
}

#[test]
fn a_summary_with_a_sweep_point_column_still_plots() {
    let (_tmp, out) = results();
    let text = String::from_utf8(read(&out, "summary.csv")).unwrap();
    let with_point: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                format!("{l},point\n")
            } else {
                format!("{l},4096\n")
            }
        })
        .collect();
    std::fs::write(out.join("summary.csv"), with_point).unwrap();
    let run = meshsim_plot(&out);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report = String::from_utf8(read(&out, "report.md")).unwrap();
    assert!(report.contains("| vanilla @ 4096 |"), "{report}");
}

fn assert_bad_input(dir: &Path, expected: &[&str]) {
    let run = meshsim_plot(dir);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    for e in expected {
        assert!(stderr.contains(e), "`{e}` not in: {stderr}");
    }
}

#[test]
fn a_bad_number_is_reported_with_its_file_line_and_column() {
    let (_tmp, out) = results();
    let text = String::from_utf8(read(&out, "summary.csv")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let p50 = lines[0]
        .split(',')
        .position(|c| c == "ttft_p50_ms")
        .unwrap();
    let mut fields: Vec<&str> = lines[2].split(',').collect();
    fields[p50] = "fast";
    lines[2] = fields.join(",");
    std::fs::write(out.join("summary.csv"), lines.join("\n") + "\n").unwrap();
    assert_bad_input(
        &out,
        &["summary.csv: line 3", "ttft_p50_ms", "found `fast`"],
    );
}

#[test]
fn missing_or_ragged_csv_files_are_bad_input() {
    let (_tmp, out) = results();
    let requests = read(&out, "requests.csv");
    std::fs::remove_file(out.join("requests.csv")).unwrap();
    assert_bad_input(&out, &["requests.csv", "cannot read"]);

    let mut ragged = requests.clone();
    ragged.extend_from_slice(b"vanilla,1,2\n");
    std::fs::write(out.join("requests.csv"), ragged).unwrap();
    let lines = requests.iter().filter(|&&b| b == b'\n').count() + 1;
    let columns = meshsim::metrics::write::request_header().len();
    assert_bad_input(
        &out,
        &[
            &format!("requests.csv: line {lines}"),
            &format!("expected {columns} fields"),
        ],
    );

    let header_only = b"policy,status\n";
    std::fs::write(out.join("requests.csv"), header_only).unwrap();
    assert_bad_input(&out, &["requests.csv: line 1", "missing column `ttft_ns`"]);

    assert_bad_input(&out.join("no-such-folder"), &["no-such-folder"]);
}

#[test]
fn figures_draw_when_no_request_completed() {
    let row = meshsim::results::plot::SummaryRow {
        policy: "vanilla".into(),
        point: None,
        requests: 3,
        completed: 0,
        throughput_rps: 0.0,
        output_tokens_per_s: 0.0,
        ttft_p50_ms: 0.0,
        ttft_p99_ms: 0.0,
        tpot_p50_ms: 0.0,
        e2e_p50_ms: 0.0,
        prefix_hit_ratio: 0.0,
        reused_tokens: [0; 5],
        loaded_bytes: [0; 4],
        links: None,
        gpu_hit_ratio: None,
        gpu_optimal_hit_ratio: None,
    };
    let r = Results {
        summary: vec![row],
        latencies: vec![meshsim::results::plot::Latencies {
            policy: "vanilla".into(),
            ttft_ms: vec![],
            tpot_ms: vec![],
        }],
        scenario: None,
        tps_output: None,
    };
    for f in Figure::ALL {
        assert!(f.png(&r).is_ok(), "{}", f.stem());
        assert!(f.svg(&r).is_ok(), "{}", f.stem());
    }
    let report = meshsim::results::plot::report_markdown(&r);
    assert!(
        report.contains("No policy completed any request."),
        "{report}"
    );
}

/// One policy's requests at one output length of a hand-made pipeline result: each completed
/// request ends `e2e_s[i]` seconds after it arrived.
fn pipeline_records(first_id: u32, output_tokens: u32, e2e_s: &[u64]) -> Vec<RequestRecord> {
    let mut records: Vec<RequestRecord> = e2e_s
        .iter()
        .enumerate()
        .map(|(i, &e2e)| {
            let arrival = Nanos(1_000_000_000 * i as u64);
            let mut r = RequestRecord::new(first_id + i as u32, arrival, 100, output_tokens);
            r.instance = 0;
            r.admitted = Some(r.arrival);
            r.first_token = Some(r.arrival + Nanos(10_000_000));
            r.end = Some(r.arrival + Nanos(e2e * 1_000_000_000));
            r
        })
        .collect();
    // An unfinished and a rejected request: not counted.
    let mut unfinished = RequestRecord::new(first_id + 100, Nanos(0), 100, output_tokens);
    records.push(unfinished.clone());
    unfinished.id += 1;
    unfinished.rejected = true;
    records.push(unfinished);
    records
}

/// Writes a pipeline results folder by hand: policies `cached` and `stateless`, swept over
/// 64, 128 and 512 output tokens, three completed requests per point. Median TPS (output
/// tokens / e2e): cached 64 / 1 s, 128 / 2 s, 512 / 5 s = 102.4; stateless 64 / 2 s,
/// 128 / 8 s, 512 / 50 s = 10.24.
fn pipeline_results(dir: &Path, scenario: Option<&str>) {
    std::fs::create_dir_all(dir).unwrap();
    // Seconds from arrival to end of each request, per policy, at 64, 128 and 512 tokens.
    let cases = [
        ("cached", [[1, 1, 3], [1, 2, 4], [4, 5, 6]]),
        ("stateless", [[2, 2, 2], [6, 8, 9], [40, 50, 80]]),
    ];
    let mut runs: Vec<(String, &str, Vec<RequestRecord>)> = Vec::new();
    let mut summaries = Vec::new();
    for (length_index, length) in [64u32, 128, 512].into_iter().enumerate() {
        for (policy, e2e) in &cases {
            let records = pipeline_records(1000 * length_index as u32, length, &e2e[length_index]);
            let point = format!("output_tokens={length}");
            let report = Report {
                records: records.clone(),
                ..Report::default()
            };
            let mut summary = Summary::new(policy, &report, 0);
            summary.point = Some(point.clone());
            summaries.push(summary);
            runs.push((point, policy, records));
        }
    }
    let rows: Vec<(Option<&str>, &str, &[RequestRecord])> = runs
        .iter()
        .map(|(point, policy, records)| (Some(point.as_str()), *policy, records.as_slice()))
        .collect();
    let f = std::fs::File::create(dir.join("requests.csv")).unwrap();
    write_requests(f, &rows).unwrap();
    let f = std::fs::File::create(dir.join("summary.csv")).unwrap();
    write_summary(f, &summaries).unwrap();
    if let Some(text) = scenario {
        std::fs::write(dir.join("scenario.toml"), text).unwrap();
    }
}

const PIPELINE_SCENARIO: &str = "name = \"pipe\"\nseed = 7\n\n[pipeline]\nstages = 2\n";

#[test]
fn pipeline_results_get_tps_against_output_length() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pipe");
    pipeline_results(&dir, Some(PIPELINE_SCENARIO));
    let written = meshsim::results::plot::render(&dir).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, output_files(&dir));
    assert!(names.contains(&"tps_output.png".to_string()), "{names:?}");
    assert!(names.contains(&"tps_output.svg".to_string()), "{names:?}");

    let png = read(&dir, "tps_output.png");
    let (w, h, rgb) = decode_png(&png);
    assert_eq!((w, h), Figure::TpsOutput.size());
    assert!(dark_pixels(&rgb, w, 0..45) > 300, "the title is drawn");
    let svg = String::from_utf8(read(&dir, "tps_output.svg")).unwrap();
    for text in [
        "cached (n = 9)",
        "stateless (n = 9)",
        "output tokens/s per request (median)",
        "\noutput tokens\n",
        "\n512\n",
    ] {
        assert!(svg.contains(text), "`{text}` not in tps_output.svg");
    }

    let r = Results::load(&dir).unwrap();
    let series = r.tps_output.as_ref().unwrap();
    assert_eq!(series.len(), 2);
    assert_eq!(series[0].policy, "cached");
    assert_eq!(series[0].rest, None);
    let medians: Vec<(u32, f64)> = series[1]
        .points
        .iter()
        .map(|p| (p.to, p.median_tps))
        .collect();
    assert_eq!(medians, vec![(64, 32.0), (128, 16.0), (512, 10.24)]);

    let report = String::from_utf8(read(&dir, "report.md")).unwrap();
    assert!(
        report.contains(
            "At 512 output tokens, `cached` generates 102.4 tokens/s per request against 10.2 \
             for `stateless` (10.0x)."
        ),
        "{report}"
    );
    assert!(report.contains("](tps_output.png)"), "{report}");

    // Redrawing gives the same bytes.
    let before: Vec<Vec<u8>> = names.iter().map(|f| read(&dir, f)).collect();
    let out = meshsim_plot(&dir);
    assert_eq!(out.status.code(), Some(0));
    for (f, old) in names.iter().zip(before) {
        assert!(read(&dir, f) == old, "{f} differs when redrawn");
    }
}

#[test]
fn other_results_get_no_tps_figure() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, scenario) in [
        (
            "plain",
            Some("name = \"plain\"\npipeline = \"not a table\"\n"),
        ),
        ("no-scenario", None),
    ] {
        let dir = tmp.path().join(name);
        pipeline_results(&dir, scenario);
        let written = meshsim::results::plot::render(&dir).unwrap();
        assert_eq!(
            written.len(),
            2 * Figure::ALL.len() + 2,
            "{name}: figures, report.md, summary.json"
        );
        assert!(!output_files(&dir).iter().any(|f| f.contains("tps_output")));
        assert!(!dir.join("tps_output.png").exists(), "{name}");
        assert!(!dir.join("tps_output.svg").exists(), "{name}");
        let report = String::from_utf8(read(&dir, "report.md")).unwrap();
        assert!(!report.contains("tps_output"), "{report}");
        assert!(!report.contains("tokens/s per request"), "{report}");
        assert!(Results::load(&dir).unwrap().tps_output.is_none());
    }
}

#[test]
fn one_policy_gets_the_figure_without_a_comparison() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pipe");
    pipeline_results(&dir, Some(PIPELINE_SCENARIO));
    // Keep the header and the `cached` rows only.
    for file in ["requests.csv", "summary.csv"] {
        let text = String::from_utf8(read(&dir, file)).unwrap();
        let kept: String = text
            .lines()
            .filter(|l| !l.contains(",stateless,"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(dir.join(file), kept).unwrap();
    }
    meshsim::results::plot::render(&dir).unwrap();
    assert!(dir.join("tps_output.svg").exists());
    let report = String::from_utf8(read(&dir, "report.md")).unwrap();
    assert!(!report.contains("tokens/s per request against"), "{report}");
    assert!(report.contains("](tps_output.png)"), "{report}");
}

/// `meshsim run` draws its plots from the runs' latencies in memory, not from `requests.csv`
/// read back (see `Results::load_with`); `meshsim plot` reads the files. Both must give the
/// same bytes: here with a sweep (a `point` column) and one-token outputs (no TPOT).
#[test]
fn plots_drawn_by_a_run_are_the_bytes_that_meshsim_plot_draws_from_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(common::data("small.toml"))
        .unwrap()
        .replace("requests = 400", "requests = 120")
        .replace("min = 8", "min = 1")
        + "\n[sweep]\n\"workload.context_tokens\" = [1024, 2048]\n";
    std::fs::write(tmp.path().join("s.toml"), text).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(["run", "s.toml", "--out", "out", "--threads", "2", "--quiet"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out = tmp.path().join("out");
    let requests = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    assert!(
        requests.starts_with("point,"),
        "a sweep's rows name their point"
    );
    assert!(
        requests
            .lines()
            .any(|l| l.contains(",ok,") && l.contains(",,")),
        "some completed request has no TPOT"
    );
    let drawn: Vec<(String, Vec<u8>)> = output_files(&out)
        .into_iter()
        .map(|f| {
            let bytes = read(&out, &f);
            std::fs::remove_file(out.join(&f)).unwrap();
            (f, bytes)
        })
        .collect();
    let redraw = meshsim_plot(&out);
    assert!(
        redraw.status.success(),
        "{}",
        String::from_utf8_lossy(&redraw.stderr)
    );
    for (f, bytes) in drawn {
        assert!(
            read(&out, &f) == bytes,
            "{f} differs when redrawn from the files"
        );
    }
}
