//! The pipeline simulator (`meshsim::pipeline`'s sans-IO actors on the simulated clock), end
//! to end: it is deterministic across runs, threads and the CLI, and models what it claims
//! (cached decode beats stateless, restarts and session cache pressure force re-prefills,
//! shards overlap, the head's queue is bounded). The live host and the CLI's checks are in
//! `tests/pipeline.rs`.

mod common;

use common::pipeline::{
    Spec, assert_all_complete, assert_misses_consistent, max_concurrency, meshsim, path_str,
    preemptions, stderr, tempdir,
};
use meshsim::pipeline::outcome::{PipelineRun, write_results};
use meshsim::pipeline::scenario::{PipelineScenario, mode_name};
use meshsim::pipeline::shard::DecodeMode;
use meshsim::pipeline::sim::{simulate, simulate_all};

fn sim(s: &PipelineScenario, mode: DecodeMode) -> PipelineRun {
    let r = simulate(s, mode).unwrap_or_else(|e| panic!("{}: {e}", mode_name(mode)));
    assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
    r
}

#[test]
fn simulation_is_deterministic_across_runs_threads_and_the_cli() {
    let mut spec = Spec::mistral();
    spec.restarts = vec![(2, 1, 4)];
    let s = spec.scenario();
    let a = simulate_all(&s, 1).unwrap();
    let b = simulate_all(&s, 1).unwrap();
    let c = simulate_all(&s, 3).unwrap();
    assert_eq!(a.len(), 2);
    for other in [&b, &c] {
        assert_eq!(other.len(), a.len());
        for (x, y) in a.iter().zip(other.iter()) {
            assert_eq!(x.mode, y.mode, "runs come in mode order");
            assert_eq!(x.report.records, y.report.records, "{}", mode_name(x.mode));
            assert_eq!(x.report.outputs, y.report.outputs, "{}", mode_name(x.mode));
            assert_eq!(x.summary, y.summary, "{}", mode_name(x.mode));
        }
    }
    assert_eq!(
        a.iter().map(|r| r.mode).collect::<Vec<_>>(),
        [DecodeMode::Cached, DecodeMode::Stateless]
    );
    // The restart did happen (dropping the state of every session active then), so the
    // determinism covers re-prefills.
    assert!(a[0].summary.preemptions >= 1, "{:?}", a[0].summary);
    assert_eq!(a[1].summary.preemptions, 0);

    let dir = tempdir();
    let file = dir.path().join("det.toml");
    std::fs::write(&file, spec.text()).unwrap();
    let mut files = Vec::new();
    for (out, threads) in [("one", "1"), ("two", "3")] {
        let out = dir.path().join(out);
        let o = meshsim(&[
            "run",
            path_str(&file),
            "--quiet",
            "--threads",
            threads,
            "--out",
            path_str(&out),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let read = |f: &str| std::fs::read(out.join(f)).unwrap();
        files.push((read("requests.csv"), read("summary.csv")));
    }
    assert_eq!(
        files[0].0, files[1].0,
        "requests.csv differs between two runs"
    );
    assert_eq!(
        files[0].1, files[1].1,
        "summary.csv differs between two runs"
    );
    let requests = String::from_utf8(files[0].0.clone()).unwrap();
    assert_eq!(requests.lines().count(), 1 + 2 * spec.requests as usize);
}

#[test]
fn cached_decode_beats_stateless_on_tpot_and_network_bytes() {
    for spec in [
        Spec::mistral(),
        Spec {
            restarts: vec![],
            ..Spec::tiny()
        },
    ] {
        let s = spec.scenario();
        let cached = sim(&s, DecodeMode::Cached);
        let stateless = sim(&s, DecodeMode::Stateless);
        let (p, o) = (spec.prompt as u64, spec.output as u64);
        for r in [&cached, &stateless] {
            assert_all_complete(r, spec.requests, spec.output);
            assert_eq!(r.summary.preemptions, 0);
        }
        assert!(
            cached.summary.tpot.p50 < stateless.summary.tpot.p50,
            "{}: TPOT p50 cached {} ms, stateless {} ms",
            spec.model,
            cached.summary.tpot.p50,
            stateless.summary.tpot.p50
        );
        // Head -> shard 0 token ids and tail -> head tokens, 4 bytes each: the prompt, then one
        // token per decode step (cached) or the whole sequence so far (stateless).
        let want_cached = 4 * (p + (o - 1) + o);
        let want_stateless = 4 * ((0..o).map(|k| p + k).sum::<u64>() + o);
        for (c, st) in cached.report.records.iter().zip(&stateless.report.records) {
            assert!(st.network_bytes > c.network_bytes, "{c:?} vs {st:?}");
            assert_eq!(c.network_bytes, want_cached, "{c:?}");
            assert_eq!(st.network_bytes, want_stateless, "{st:?}");
        }
        assert!(stateless.summary.network_bytes > cached.summary.network_bytes);
    }
}

#[test]
fn a_shard_restart_forces_exactly_one_re_prefill() {
    let mut spec = Spec::mistral();
    spec.max_active = 1;
    spec.requests = 4;
    let base = sim(&spec.scenario(), DecodeMode::Cached);
    assert_all_complete(&base, spec.requests, spec.output);
    assert_eq!(base.summary.preemptions, 0);
    assert_eq!(preemptions(&base.report.records), [0, 0, 0, 0]);

    for shard in [0, 1, 3] {
        spec.restarts = vec![(shard, 2, 6)];
        let s = spec.scenario();
        let r = sim(&s, DecodeMode::Cached);
        assert_all_complete(&r, spec.requests, spec.output);
        assert_eq!(r.summary.preemptions, 1, "shard {shard}");
        assert_eq!(
            preemptions(&r.report.records),
            [0, 0, 1, 0],
            "shard {shard}"
        );
        let misses: Vec<u64> = r.report.instances.iter().map(|i| i.preemptions).collect();
        let mut want = vec![0; 4];
        want[shard] = 1;
        assert_eq!(misses, want, "the restarted shard answers the miss");
        // The re-prefill costs time: the request ends later than undisturbed.
        let (d, u) = (&r.report.records[2], &base.report.records[2]);
        assert!(d.e2e().unwrap() > u.e2e().unwrap(), "{d:?} vs {u:?}");
        // Requests before it are untouched.
        assert_eq!(r.report.records[..2], base.report.records[..2]);

        // Stateless passes never consult a cache: a restart changes nothing.
        let st = sim(&s, DecodeMode::Stateless);
        assert_all_complete(&st, spec.requests, spec.output);
        assert_eq!(st.summary.preemptions, 0);
    }
}

#[test]
fn session_cache_pressure_and_ttl_force_re_prefills() {
    // 4 sessions at once, arriving together, through caches of 2 sessions per shard.
    let mut spec = Spec::mistral();
    spec.policies = r#"["cached"]"#;
    spec.max_active = 4;
    spec.max_sessions = 2;
    spec.requests = 8;
    spec.rate = 1e4;
    let r = sim(&spec.scenario(), DecodeMode::Cached);
    assert_all_complete(&r, spec.requests, spec.output);
    assert!(max_concurrency(&r.report.records) == 4);
    assert!(r.summary.preemptions > 0, "{:?}", r.summary);
    assert!(
        r.summary.gpu_block_evictions > 0,
        "LRU evictions: {:?}",
        r.summary
    );
    assert_misses_consistent(&r);

    // Room for every session of the run: no miss.
    spec.max_sessions = 16;
    let r = sim(&spec.scenario(), DecodeMode::Cached);
    assert_all_complete(&r, spec.requests, spec.output);
    assert_eq!(r.summary.preemptions, 0);
    assert_eq!(r.summary.gpu_block_evictions, 0);

    // A TTL far below the time between two decode steps of a session: every decode step
    // misses, is re-prefilled, and the run still ends (within a bounded number of events).
    spec.max_sessions = 16;
    spec.ttl_s = 1e-6;
    spec.extra = "\n[limits]\nmax_events = 1000000\n";
    let r = sim(&spec.scenario(), DecodeMode::Cached);
    assert_all_complete(&r, spec.requests, spec.output);
    let per = spec.output - 1;
    assert_eq!(
        preemptions(&r.report.records),
        vec![per; spec.requests as usize]
    );
    assert_eq!(r.summary.preemptions, (spec.requests * per) as u64);
    assert_misses_consistent(&r);
}

#[test]
fn session_caches_as_large_as_the_active_sessions_never_miss() {
    // Every active session fits in every shard's cache; only sessions that ended (whose state
    // nobody will use again) should give way to new ones.
    let mut spec = Spec::mistral();
    spec.policies = r#"["cached"]"#;
    spec.max_active = 4;
    spec.max_sessions = 4;
    spec.requests = 8;
    spec.rate = 1e4;
    let r = sim(&spec.scenario(), DecodeMode::Cached);
    assert_all_complete(&r, spec.requests, spec.output);
    assert_eq!(
        r.summary.preemptions,
        0,
        "re-prefills per request {:?}",
        preemptions(&r.report.records)
    );
}

#[test]
fn shards_overlap_with_several_sessions_and_serve_one_at_a_time_with_one() {
    let mut spec = Spec::mistral();
    spec.policies = r#"["cached"]"#;
    spec.requests = 8;
    spec.rate = 1e3;
    spec.max_active = 4;
    let many = sim(&spec.scenario(), DecodeMode::Cached);
    spec.max_active = 1;
    let one = sim(&spec.scenario(), DecodeMode::Cached);
    for r in [&many, &one] {
        assert_all_complete(r, spec.requests, spec.output);
    }
    let busy = |r: &PipelineRun| r.report.instances.iter().map(|i| i.busy.0).sum::<u64>();
    let e2e = |r: &PipelineRun| {
        r.report
            .records
            .iter()
            .map(|x| x.e2e().unwrap().0)
            .sum::<u64>()
    };

    // Several sessions: the run is shorter than its requests end to end, the shards' busy time
    // adds up to more than the run's duration (two shards busy at once), and the run is much
    // shorter than with one session at a time.
    assert_eq!(max_concurrency(&many.report.records), 4);
    assert!(many.summary.duration.0 < e2e(&many), "{:?}", many.summary);
    assert!(busy(&many) > many.summary.duration.0, "{:?}", many.summary);
    assert!(
        2 * many.summary.duration.0 < one.summary.duration.0,
        "4 sessions {:?} vs 1 session {:?}",
        many.summary.duration,
        one.summary.duration
    );

    // One session: each request is admitted no earlier than the previous one's end, and no two
    // shards are ever busy at once.
    assert_eq!(max_concurrency(&one.report.records), 1);
    for w in one.report.records.windows(2) {
        assert!(w[1].admitted.unwrap() >= w[0].end.unwrap(), "{:?}", w);
    }
    assert!(busy(&one) <= one.summary.duration.0, "{:?}", one.summary);
}

#[test]
fn arrivals_beyond_the_waiting_queue_are_rejected() {
    let mut spec = Spec::mistral();
    spec.max_active = 1;
    spec.max_waiting = 2;
    spec.requests = 8;
    spec.rate = 1e6; // all within microseconds; a prefill takes milliseconds
    let s = spec.scenario();
    let runs = simulate_all(&s, 2).unwrap();
    for r in &runs {
        let m = mode_name(r.mode);
        assert!(
            r.report.violations.is_empty(),
            "{m}: {:?}",
            r.report.violations
        );
        assert_eq!(r.summary.requests, 8, "{m}");
        assert_eq!(r.summary.rejected, 5, "{m}");
        assert_eq!(r.summary.completed, 3, "{m}");
        for rec in &r.report.records {
            if rec.id < 3 {
                assert!(rec.completed() && !rec.rejected, "{m}: {rec:?}");
                assert_eq!(rec.output_tokens, spec.output);
            } else {
                assert!(rec.rejected && !rec.completed(), "{m}: {rec:?}");
                assert_eq!((rec.output_tokens, rec.admitted), (0, None), "{m}");
            }
        }
        let ids: Vec<u32> = r.report.outputs.iter().map(|o| o.0).collect();
        assert_eq!(ids, [0, 1, 2], "{m}");
    }

    let dir = tempdir();
    let out = dir.path().join("out");
    write_results(&s, &runs, &out).unwrap();
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let status = header.iter().position(|h| *h == "status").unwrap();
    let statuses: Vec<String> = lines
        .map(|l| l.split(',').nth(status).unwrap().to_string())
        .collect();
    let want: Vec<&str> = [["ok"; 3].as_slice(), ["rejected"; 5].as_slice()]
        .concat()
        .repeat(2);
    assert_eq!(statuses, want);
}
