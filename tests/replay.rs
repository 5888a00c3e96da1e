//! Replaying real datasets and traces: every loader on every file of `../shared/datasets`,
//! the published SQuAD counts, exact tokenisation, the canonical round trip, Mooncake's shared
//! blocks and strict and lenient validation, scenarios replaying each file under every policy,
//! and `meshsim trace` on the command line. Bad input and random bytes are in
//! `tests/replay_bad_input.rs`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::replay::{datasets, load};
use meshsim::Scenario;
use meshsim::serving::build::trace;
use meshsim::serving::sim::simulate_all;
use meshsim::workload::replay::{self, ReplaySpec, Source};
use meshsim::workload::stats::TraceStats;
use meshsim::workload::tokenize::Tokenizer;
use meshsim::workload::{SegId, Trace};

#[test]
#[should_panic(expected = "Put that folder there with these files and run the tests again")]
fn a_missing_shared_dataset_fails_the_test_and_says_what_to_do() {
    let empty = tempfile::tempdir().unwrap();
    common::shared_datasets_in(empty.path());
}

/// Every real file, with its format.
fn real_files() -> Vec<(Source, PathBuf)> {
    let d = datasets();
    vec![
        (Source::SquadJson, d.join("squad/dev-v1.1.json")),
        (Source::WikiqaTsv, d.join("wikiqa/WikiQA-dev.tsv")),
        (Source::WikiqaTsv, d.join("wikiqa/WikiQA-test.tsv")),
        (
            Source::MooncakeJsonl,
            d.join("mooncake/conversation_trace.jsonl"),
        ),
        (
            Source::MooncakeJsonl,
            d.join("mooncake/synthetic_trace.jsonl"),
        ),
        (Source::VidurCsv, d.join("vidur/splitwise_conv.csv")),
        (Source::VidurCsv, d.join("vidur/splitwise_code.csv")),
    ]
}

fn mistral() -> PathBuf {
    datasets().join("tokenizers/mistral-v1.json")
}

/// Everything a simulation sees of a trace.
fn key(t: &Trace) -> Vec<(u64, Vec<u32>, u32, u32)> {
    t.requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let prompt: Vec<u32> = t.prompt(meshsim::workload::ReqId(i as u32)).collect();
            assert_eq!(prompt.len() as u32, r.prompt_tokens);
            (r.arrival.0, prompt, r.output_tokens, r.context)
        })
        .collect()
}

#[test]
fn every_loader_reads_every_real_file_and_the_guess_agrees() {
    for (source, path) in real_files() {
        assert_eq!(Source::guess(&path), Some(source), "{}", path.display());
        let l = load(source, &path, Some(200)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.trace.requests.len(), 200, "{}", path.display());
        assert!(
            l.trace
                .requests
                .windows(2)
                .all(|w| w[0].arrival <= w[1].arrival)
        );
        assert!(
            l.trace
                .requests
                .iter()
                .all(|r| r.prompt_tokens > 0 && r.output_tokens > 0)
        );
    }
}

#[test]
fn the_squad_dev_set_has_the_published_counts() {
    let c = replay::squad::read(&datasets().join("squad/dev-v1.1.json")).unwrap();
    assert_eq!(c.documents.len(), 48);
    assert_eq!(c.units(), 2_067);
    assert_eq!(c.questions(), 10_570);
    let per_article: Vec<usize> = c.documents.iter().map(|d| d.units.len()).collect();
    assert_eq!(per_article.iter().min(), Some(&21));
    assert_eq!(per_article.iter().max(), Some(&98));
}

#[test]
fn wikiqa_documents_are_grouped_and_every_question_is_asked() {
    let c = replay::wikiqa::read(&datasets().join("wikiqa/WikiQA-dev.tsv"), false).unwrap();
    assert_eq!(c.questions(), 296);
    assert!(c.units() > 250, "{} documents", c.units());
    assert!(
        c.documents
            .iter()
            .all(|d| d.units.len() <= replay::wikiqa::COLLECTION)
    );
}

#[test]
fn the_mistral_tokenizer_gives_exact_ids_and_the_published_lengths() {
    let tok = Tokenizer::load(Some(&mistral())).unwrap();
    assert!(tok.is_exact());
    // The vocabulary's ids of "▁Hello" and "▁world" (no BOS token: the template adds none).
    assert_eq!(tok.encode("Hello world"), vec![22557, 1526]);
    let c = replay::squad::read(&datasets().join("squad/dev-v1.1.json")).unwrap();
    let paragraphs: Vec<usize> = c.documents[..6]
        .iter()
        .flat_map(|d| d.units.iter().map(|u| tok.encode(u).len()))
        .collect();
    let mean = paragraphs.iter().sum::<usize>() as f64 / paragraphs.len() as f64;
    assert!(
        (140.0..230.0).contains(&mean),
        "mean paragraph {mean} tokens"
    );
}

#[test]
fn squad_windows_are_real_long_contexts_shared_by_their_questions() {
    let mut spec = ReplaySpec::new(Source::SquadJson, datasets().join("squad/dev-v1.1.json"));
    spec.tokenizer = Some(mistral());
    spec.max_requests = Some(300);
    spec.qa.context = meshsim::workload::qa::ContextMode::Window { tokens: 4096 };
    let l = replay::load(&spec, 3).unwrap();
    let st = TraceStats::of(&l.trace, 16, &[]);
    assert!(st.prompt.mean > 2_000.0, "{:?}", st.prompt);
    assert!(st.prompt.max < 4096 + 200, "{:?}", st.prompt);
    assert!(st.unbounded_hit_ratio > 0.8, "{}", st.unbounded_hit_ratio);
    // Grouped by document: questions of a window arrive together.
    assert!(l.trace.contexts < 20, "{} contexts", l.trace.contexts);
}

#[test]
fn a_squad_replay_draws_its_contexts_from_a_pool_with_zipf_popularity_and_turns() {
    use meshsim::workload::reuse::{Popularity, Reuse};
    let mut spec = ReplaySpec::new(Source::SquadJson, datasets().join("squad/dev-v1.1.json"));
    spec.tokenizer = Some(mistral());
    spec.max_requests = Some(2_000);
    spec.qa.context = meshsim::workload::qa::ContextMode::Window { tokens: 4096 };
    spec.qa.reuse = Some(Reuse {
        questions_per_context: Some(5),
        popularity: Popularity::Zipf { alpha: 1.0 },
        turns: 2,
        ..Reuse::uniform(100)
    });
    let l = replay::load(&spec, 3).unwrap();
    let t = &l.trace;
    assert_eq!((t.requests.len(), t.contexts), (2_000, 100));
    // The dataset's real questions, at most five per window.
    let mut questions = std::collections::BTreeMap::<u32, std::collections::BTreeSet<u32>>::new();
    for r in &t.requests {
        let q = r.segments.last().unwrap().0;
        questions.entry(r.context).or_default().insert(q);
    }
    assert!(questions.values().all(|q| q.len() <= 5));
    // Zipf: the most asked window gets far more than the 1 % of a uniform draw.
    let top = questions
        .keys()
        .map(|c| t.requests.iter().filter(|r| r.context == *c).count())
        .max()
        .unwrap();
    assert!(top > 200, "{top}");
    let st = TraceStats::of(t, 16, &[]);
    assert!(st.revisits > 1_800, "{}", st.revisits);
    assert!(st.prompt.max < 4096 + 2 * 200 + 512, "{:?}", st.prompt);
    // More contexts than the dataset has is an error naming the key.
    spec.qa.reuse = Some(Reuse::uniform(100_000));
    let e = replay::load(&spec, 3).unwrap_err();
    assert_eq!(e.field, "reuse.contexts", "{e}");
    assert!(e.message.contains("the dataset has"), "{e}");
}

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another_order() {
    let mut spec = ReplaySpec::new(Source::SquadJson, datasets().join("squad/dev-v1.1.json"));
    spec.max_requests = Some(100);
    spec.qa.order = meshsim::workload::qa::Order::Shuffled;
    let a = replay::load(&spec, 5).unwrap();
    let b = replay::load(&spec, 5).unwrap();
    let c = replay::load(&spec, 6).unwrap();
    assert_eq!(key(&a.trace), key(&b.trace));
    assert_ne!(key(&a.trace), key(&c.trace));
}

#[test]
fn converting_to_the_canonical_format_replays_the_same_trace() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (source, path)) in real_files().into_iter().enumerate() {
        let l = load(source, &path, Some(150)).unwrap();
        let out = dir.path().join(format!("{i}.jsonl"));
        replay::canonical::write(&l, std::fs::File::create(&out).unwrap()).unwrap();
        assert_eq!(Source::guess(&out), Some(Source::Canonical));
        let back = load(Source::Canonical, &out, None).unwrap();
        assert_eq!(key(&l.trace), key(&back.trace), "{}", path.display());
        assert_eq!(back.block_size, l.block_size);
        assert_eq!(back.questions, l.questions);
        assert_eq!(back.trace.arena.segments(), l.trace.arena.segments());
        // Writing the read-back trace gives the same bytes.
        let again = dir.path().join(format!("{i}-again.jsonl"));
        replay::canonical::write(&back, std::fs::File::create(&again).unwrap()).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    }
}

#[test]
fn mooncake_blocks_are_shared_prefixes_with_a_partial_last_block() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.jsonl");
    std::fs::write(
        &p,
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [7, 8]}\n\
         {\"timestamp\": 10, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [7, 9]}\n",
    )
    .unwrap();
    let l = load(Source::MooncakeJsonl, &p, None).unwrap();
    let t = &l.trace;
    assert_eq!(t.requests[0].prompt_tokens, 1000);
    assert_eq!(t.requests[1].prompt_tokens, 600);
    assert_eq!(t.requests[1].arrival.0, 10_000_000);
    // Block 7 is one shared segment; 8 and 9 are not.
    assert_eq!(t.requests[0].segments[0], t.requests[1].segments[0]);
    assert_eq!(t.arena.segment(t.requests[1].segments[1]).len(), 88);
    let st = TraceStats::of(t, 512, &[512, 10_000]);
    assert_eq!(st.unbounded_hit_ratio, 512.0 / 1600.0);
    // A 512-token LRU keeps only the most recent block (the partial 488-token one).
    assert_eq!(st.lru_hit_ratio, vec![(512, 0.0), (10_000, 512.0 / 1600.0)]);
    assert_eq!(t.arena.segment(SegId(0)).len(), 512);
}

#[test]
fn mooncake_length_violations_name_the_line_or_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.jsonl");
    std::fs::write(
        &p,
        "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 5, \"hash_ids\": [1]}\n\
         {\"timestamp\": 1, \"input_length\": 513, \"output_length\": 5, \"hash_ids\": [1]}\n\
         {\"timestamp\": 2, \"input_length\": 20, \"output_length\": 5, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let e = load(Source::MooncakeJsonl, &p, None).unwrap_err();
    assert_eq!(e.line, Some(2));
    assert_eq!(e.field, "hash_ids");
    assert!(e.to_string().contains("t.jsonl:2: hash_ids"), "{e}");
    let mut spec = ReplaySpec::new(Source::MooncakeJsonl, &p);
    spec.skip_bad_lines = true;
    let l = replay::load(&spec, 1).unwrap();
    assert_eq!(l.skipped_lines, 1);
    assert_eq!(l.trace.requests.len(), 2);
}

/// The small test scenario with its workload section replaced by `workload`.
fn scenario_with(workload: &str) -> String {
    let text = std::fs::read_to_string(common::data("small.toml")).unwrap();
    let head = &text[..text.find("[workload]").unwrap()];
    format!("{head}[workload]\n{workload}\n")
}

#[test]
fn a_scenario_replaying_each_file_runs_under_every_policy() {
    let d = datasets();
    let cases = [
        format!(
            "source = \"squad-json\"\npath = \"{}\"\ntokenizer = \"{}\"\nrequests = 40\n\
             arrival_rate_per_s = 8.0\norder = \"grouped\"\ncontext_tokens = 2048\n\
             [workload.output_tokens]\ndistribution = \"fixed\"\ntokens = 8",
            d.join("squad/dev-v1.1.json").display(),
            mistral().display()
        ),
        format!(
            "source = \"wikiqa-tsv\"\npath = \"{}\"\nrequests = 40\narrival_rate_per_s = 8.0\n\
             context = \"unit\"\n[workload.output_tokens]\ndistribution = \"uniform\"\nmin = 4\nmax = 16",
            d.join("wikiqa/WikiQA-test.tsv").display()
        ),
        format!(
            "source = \"mooncake-jsonl\"\npath = \"{}\"\nrequests = 30",
            d.join("mooncake/conversation_trace.jsonl").display()
        ),
        format!(
            "source = \"mooncake-jsonl\"\npath = \"{}\"\nrequests = 20",
            d.join("mooncake/synthetic_trace.jsonl").display()
        ),
        format!(
            "source = \"vidur-csv\"\npath = \"{}\"\nrequests = 40",
            d.join("vidur/splitwise_code.csv").display()
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, w) in cases.iter().enumerate() {
        let mut text = scenario_with(w);
        if w.contains("mooncake") {
            // Mooncake's traces reach 128k-token prompts; Mistral-7B takes 32k and refuses
            // them, so they replay on the test model, which has no context limit.
            text = text.replace("preset = \"mistral-7b-instruct-v0.2\"", "preset = \"tiny\"");
        }
        let s = Scenario::parse("replay.toml", "replay", &text)
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        let t = Arc::new(trace(&s).unwrap_or_else(|e| panic!("case {i}: {e}")));
        assert!(!t.requests.is_empty());
        // The canonical copy of the same trace replays identically.
        let l = replay::load(
            match &s.workload {
                meshsim::workload::WorkloadSpec::Replay(r) => r,
                _ => unreachable!("replay scenarios"),
            },
            s.seed,
        )
        .unwrap();
        let c = dir.path().join(format!("{i}.jsonl"));
        replay::canonical::write(&l, std::fs::File::create(&c).unwrap()).unwrap();
        let runs = simulate_all(&s, t, 2).unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(runs.len(), 4, "vanilla, local-prefix, evostore, ptstore");
        for r in &runs {
            assert_eq!(
                r.summary.completed, r.summary.requests,
                "case {i}: {}",
                r.summary.policy
            );
        }
        let canonical = scenario_with(&format!(
            "source = \"canonical\"\npath = \"{}\"",
            c.display()
        ));
        let model =
            |t: &str| t[t.find("[model]").unwrap()..t.find("[serving]").unwrap()].to_string();
        let canonical = canonical.replace(&model(&canonical), &model(&text));
        let sc = Scenario::parse("replay.toml", "replay", &canonical).unwrap();
        let runs_c = simulate_all(&sc, Arc::new(trace(&sc).unwrap()), 1).unwrap();
        for (a, b) in runs.iter().zip(&runs_c) {
            assert_eq!(a.summary, b.summary, "case {i}: canonical replay differs");
        }
    }
}

#[test]
fn replay_paths_are_relative_to_the_scenario_file() {
    datasets(); // the file below is in ../shared/datasets
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/replay.toml");
    let s = Scenario::parse(
        &file.display().to_string(),
        "replay",
        &scenario_with(
            "source = \"vidur-csv\"\npath = \"../../../shared/datasets/vidur/splitwise_code.csv\"\nrequests = 5",
        ),
    )
    .unwrap();
    assert_eq!(trace(&s).unwrap().requests.len(), 5);
}

#[test]
fn keys_that_do_not_apply_to_a_source_are_rejected() {
    for (w, key) in [
        (
            "source = \"vidur-csv\"\npath = \"x.csv\"\narrival_rate_per_s = 3.0",
            "workload.arrival_rate_per_s",
        ),
        (
            "source = \"squad-json\"\npath = \"x.json\"\narrival_rate_per_s = 3.0",
            "workload",
        ),
        (
            "dataset = \"squad\"\npath = \"x.json\"\nrequests = 3\narrival_rate_per_s = 1.0",
            "workload.path",
        ),
        (
            "source = \"mooncake-jsonl\"\ndataset = \"squad\"\npath = \"x\"",
            "workload.source",
        ),
        ("source = \"nope\"\npath = \"x\"", "workload.source"),
        (
            "source = \"mooncake-jsonl\"\npath = \"x\"\n[workload.reuse]\ncontexts = 3",
            "workload.reuse",
        ),
    ] {
        let e = Scenario::parse("r.toml", "r", &scenario_with(w)).unwrap_err();
        assert_eq!(e.key, key, "{w}: {e}");
    }
}

fn meshsim(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_trace_file_exits_2_naming_the_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.jsonl"),
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}\n\
         {\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        scenario_with("source = \"mooncake-jsonl\"\npath = \"t.jsonl\""),
    )
    .unwrap();
    let (code, _, err) = meshsim(dir.path(), &["run", "bad.toml"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("t.jsonl:2: hash_ids"), "{err}");
    assert!(!dir.path().join("results").exists());
    let (code, _, err) = meshsim(dir.path(), &["trace", "stats", "t.jsonl"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("t.jsonl:2: hash_ids"), "{err}");
    let (code, out, err) = meshsim(
        dir.path(),
        &["trace", "stats", "t.jsonl", "--skip-bad-lines"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("skipped lines 1"), "{out}");
}

#[test]
fn trace_stats_and_convert_work_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let src = datasets().join("vidur/splitwise_code.csv");
    let src = src.to_str().unwrap();
    let (code, out, err) = meshsim(
        dir.path(),
        &[
            "trace",
            "convert",
            src,
            "--requests",
            "100",
            "--out",
            "c.jsonl",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote 100 requests"), "{out}");
    let (code, a, err) = meshsim(
        dir.path(),
        &["trace", "stats", "c.jsonl", "--lru", "1000,100000"],
    );
    assert_eq!(code, 0, "{err}");
    let (_, b, _) = meshsim(
        dir.path(),
        &[
            "trace",
            "stats",
            src,
            "--requests",
            "100",
            "--lru",
            "1000,100000",
        ],
    );
    assert!(
        a.contains("requests 100;") && a.contains("LRU cache of 100000 tokens"),
        "{a}"
    );
    // Same numbers from the source and its canonical copy (only the header line differs).
    assert_eq!(
        a.lines().skip(1).collect::<Vec<_>>(),
        b.lines().skip(1).collect::<Vec<_>>()
    );
    let (code, _, err) = meshsim(
        dir.path(),
        &["trace", "stats", "c.jsonl", "--format", "bogus"],
    );
    assert_eq!(code, 2, "{err}");
}

#[test]
fn the_example_replay_scenario_loads_the_whole_squad_dev_set() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/polaris_32gpu_squad_replay.toml");
    let s = Scenario::load(&p).unwrap();
    let t = trace(&s).unwrap();
    assert_eq!(t.requests.len(), 10_570);
}
