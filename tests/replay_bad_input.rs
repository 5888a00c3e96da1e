//! Bad traces for the replay loaders: inputs every loader must reject are errors naming the
//! file, the line and the field, and no loader panics on random bytes or on mutated real lines
//! (property tests).

mod common;

use std::path::PathBuf;

use common::replay::{datasets, load};
use meshsim::workload::replay::{self, ReplaySpec, Source};
use meshsim::workload::stats::TraceStats;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// `(format, file name, contents, line, field)` of an input that a loader must reject.
type BadInput = (Source, &'static str, Vec<u8>, Option<usize>, &'static str);

/// Inputs that every loader must reject.
fn bad_inputs() -> Vec<BadInput> {
    let mc = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n";
    let vh = "arrived_at,num_prefill_tokens,num_decode_tokens\n";
    let wh = "QuestionID\tQuestion\tDocumentID\tDocumentTitle\tSentenceID\tSentence\tLabel\n";
    let wr = "Q1\tWhat?\tD1\tT\tD1-0\tA sentence .\t0\n";
    let ch = "{\"format\": \"meshsim-trace\", \"version\": 1, \"block_size\": 16}\n";
    let b = |s: String| s.into_bytes();
    vec![
        (Source::MooncakeJsonl, "m.jsonl", vec![], None, "file"),
        (
            Source::MooncakeJsonl,
            "m.jsonl",
            b(format!("{mc}{{\"timestamp\": 1")),
            Some(2),
            "line",
        ),
        (
            Source::MooncakeJsonl,
            "m.jsonl",
            b(format!(
                "{mc}{{\"timestamp\": 1, \"input_length\": 3, \"hash_ids\": [1]}}\n"
            )),
            Some(2),
            "output_length",
        ),
        (
            Source::MooncakeJsonl,
            "m.jsonl",
            b(format!(
                "{mc}{mc}{{\"timestamp\": 1, \"input_length\": -3, \"output_length\": 1, \"hash_ids\": []}}\n"
            )),
            Some(3),
            "input_length",
        ),
        (
            Source::MooncakeJsonl,
            "m.jsonl",
            [mc.as_bytes(), b"{\"timestamp\": \xff}\n"].concat(),
            Some(2),
            "line",
        ),
        (Source::VidurCsv, "v.csv", b"\n\n".to_vec(), None, "file"),
        (
            Source::VidurCsv,
            "v.csv",
            b(format!("{vh}0.0,1,2\n1.0,5\n")),
            Some(3),
            "line",
        ),
        (
            Source::VidurCsv,
            "v.csv",
            b(format!("{vh}0.0,-4,2\n")),
            Some(2),
            "num_prefill_tokens",
        ),
        (
            Source::VidurCsv,
            "v.csv",
            b("arrived_at,num_decode_tokens\n1,2\n".into()),
            Some(1),
            "num_prefill_tokens",
        ),
        (
            Source::VidurCsv,
            "v.csv",
            [vh.as_bytes(), b"0.\xc3,1,2\n"].concat(),
            Some(2),
            "line",
        ),
        (Source::WikiqaTsv, "w.tsv", vec![], None, "file"),
        (
            Source::WikiqaTsv,
            "w.tsv",
            b(format!("{wh}{wr}Q1\tWhat?\tD1\n")),
            Some(3),
            "line",
        ),
        (
            Source::WikiqaTsv,
            "w.tsv",
            b(format!("{wh}{wr}Q2\tWhy?\tD1\tT\tD1-x\tS\t0\n")),
            Some(3),
            "SentenceID",
        ),
        (
            Source::WikiqaTsv,
            "w.tsv",
            b(format!("{wh}Q2\tWhy?\tD1\tT\tD1-1\tS\t7\n")),
            Some(2),
            "Label",
        ),
        (Source::SquadJson, "s.json", vec![], None, "file"),
        (
            Source::SquadJson,
            "s.json",
            b("{\"data\": [{\"title\": \"a\",\n \"paragraphs\": [{\"qas\": []}]}]}".into()),
            Some(2),
            "data[0].paragraphs[0]",
        ),
        (
            Source::SquadJson,
            "s.json",
            b(
                "{\"data\": [{\"title\": \"a\", \"paragraphs\": [{\"context\": 5, \"qas\": []}]}]}"
                    .into(),
            ),
            Some(1),
            "data[0].paragraphs[0].context",
        ),
        (
            Source::SquadJson,
            "s.json",
            b"{\"data\": [\n\"\xfe\"]}".to_vec(),
            Some(2),
            "file",
        ),
        (Source::Canonical, "c.jsonl", vec![], None, "file"),
        (
            Source::Canonical,
            "c.jsonl",
            b(format!(
                "{ch}{{\"arrival_ns\": 0, \"prompt\": [0], \"output_tokens\": 1}}\n"
            )),
            Some(2),
            "prompt",
        ),
        (
            Source::Canonical,
            "c.jsonl",
            b(format!(
                "{ch}{{\"segment\": 0, \"tokens\": [5]}}\n{{\"arrival_ns\": -1, \"prompt\": [0], \"output_tokens\": 1}}\n"
            )),
            Some(3),
            "arrival_ns",
        ),
        (
            Source::Canonical,
            "c.jsonl",
            b(format!(
                "{ch}{{\"segment\": 0, \"tokens\": [5]}}\n{{\"prompt\": [0], \"output_tokens\": 1}}\n"
            )),
            Some(3),
            "arrival_ns",
        ),
    ]
}

#[test]
fn bad_input_is_an_error_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (source, name, bytes, line, field)) in bad_inputs().into_iter().enumerate() {
        let p = dir.path().join(format!("{i}-{name}"));
        std::fs::write(&p, &bytes).unwrap();
        let e = load(source, &p, None).expect_err(&format!("case {i} must fail"));
        assert_eq!((e.line, e.field.as_str()), (line, field), "case {i}: {e}");
        assert!(
            e.to_string().contains(&format!("{i}-{name}")),
            "case {i}: {e}"
        );
    }
}

/// One real line (or header plus line) of each format, to mutate.
fn seeds() -> Vec<(Source, Vec<u8>)> {
    let first_lines = |p: PathBuf, n: usize| -> Vec<u8> {
        let text = std::fs::read_to_string(p).unwrap();
        text.lines()
            .take(n)
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into_bytes()
    };
    let d = datasets();
    let squad = br#"{"data": [{"title": "T", "paragraphs": [{"context": "Some text here.", "qas": [{"id": "1", "question": "What text?", "answers": [{"text": "Some", "answer_start": 0}]}]}]}], "version": "1.1"}"#;
    vec![
        (Source::SquadJson, squad.to_vec()),
        (Source::WikiqaTsv, first_lines(d.join("wikiqa/WikiQA-dev.tsv"), 4)),
        (Source::MooncakeJsonl, first_lines(d.join("mooncake/conversation_trace.jsonl"), 2)),
        (Source::VidurCsv, first_lines(d.join("vidur/splitwise_conv.csv"), 3)),
        (
            Source::Canonical,
            b"{\"format\": \"meshsim-trace\", \"version\": 1, \"block_size\": 16}\n{\"segment\": 0, \"tokens\": [5, 6]}\n{\"segment\": 1, \"pseudo_key\": 9, \"len\": 40}\n{\"arrival_ns\": 0, \"prompt\": [0, 1], \"output_tokens\": 3, \"context\": 0}\n".to_vec(),
        ),
    ]
}

fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(pos, op, byte) in edits {
        if bytes.is_empty() {
            bytes.push(byte);
            continue;
        }
        let i = pos % bytes.len();
        match op % 4 {
            0 => bytes[i] = byte,
            1 => {
                bytes.remove(i);
            }
            2 => bytes.insert(i, byte),
            _ => bytes.insert(i, b"-0:,\"[]{}9e\t\n"[byte as usize % 13]),
        }
    }
    bytes
}

fn no_panic(source: Source, bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("input");
    std::fs::write(&p, bytes).unwrap();
    for skip in [false, true] {
        let mut spec = ReplaySpec::new(source, &p);
        spec.skip_bad_lines = skip;
        spec.max_requests = Some(50);
        if let Ok(l) = replay::load(&spec, 1) {
            // Whatever loads is a usable trace.
            for r in &l.trace.requests {
                assert!(r.prompt_tokens > 0 && r.output_tokens > 0);
            }
            TraceStats::of(&l.trace, l.block_size, &[100]);
        }
    }
}

proptest! {
    // Failures are kept in tests/replay_bad_input.proptest-regressions (commit it) and replayed
    // first.
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_loader_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        for source in Source::ALL {
            no_panic(source, &bytes);
        }
    }

    #[test]
    fn no_loader_panics_on_mutated_real_lines(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)
    ) {
        for (source, seed) in seeds() {
            no_panic(source, &mutate(seed, &edits));
        }
    }
}

/// A replayed prompt longer than the model's context refuses the trace, naming its line;
/// with `workload.skip_too_long` such requests are left out and the others replayed.
#[test]
fn a_prompt_longer_than_the_context_is_refused_or_left_out_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let line = |t: u64, n: u64| {
        let ids: Vec<String> = (0..n.div_ceil(512))
            .map(|i| (t * 1000 + i).to_string())
            .collect();
        format!(
            "{{\"timestamp\": {t}, \"input_length\": {n}, \"output_length\": 4, \"hash_ids\": [{}]}}\n",
            ids.join(", ")
        )
    };
    let trace = [line(0, 1000), line(10, 40_000), line(20, 2000)].concat();
    std::fs::write(dir.path().join("m.jsonl"), trace).unwrap();
    let small = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/small.toml"),
    )
    .unwrap();
    let head = &small[..small.find("[workload]").unwrap()];
    let scenario = |skip: &str| {
        let text =
            format!("{head}[workload]\nsource = \"mooncake-jsonl\"\npath = \"m.jsonl\"\n{skip}");
        let file = dir.path().join("s.toml");
        meshsim::serving::scenario::Scenario::parse(file.to_str().unwrap(), "s", &text).unwrap()
    };
    let refused = meshsim::serving::build::trace(&scenario(""))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("m.jsonl:2: input_length"), "{refused}");
    assert!(refused.contains("longer than the context"), "{refused}");
    let t = meshsim::serving::build::trace(&scenario("skip_too_long = true\n")).unwrap();
    let prompts: Vec<u32> = t.requests.iter().map(|r| r.prompt_tokens).collect();
    assert_eq!(prompts, [1000, 2000]);
    // Not for generated workloads.
    let generated = small.replace("[workload]\n", "[workload]\nskip_too_long = true\n");
    let e = meshsim::serving::scenario::Scenario::parse("g.toml", "g", &generated).unwrap_err();
    assert!(e.to_string().contains("workload.skip_too_long"), "{e}");
}
