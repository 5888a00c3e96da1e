//! Pipeline routes as sans-IO actors (`meshsim::pipeline`), end to end: the simulator is
//! deterministic and models what it claims (cached decode beats stateless, restarts and session
//! cache pressure force re-prefills, shards overlap, the head's queue is bounded), the live host
//! generates exactly the tokens of the in-process candle route (with several sessions at once
//! and across a restarted shard), and the CLI rejects bad pipeline scenarios with status 2,
//! naming the key, without writing anything.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use candle_core::{DType, Device};
use meshsim::backend::CandleBackend;
use meshsim::exec::WeightSource;
use meshsim::metrics::RequestRecord;
use meshsim::pipeline::build::trace;
use meshsim::pipeline::live::live;
use meshsim::pipeline::outcome::{PipelineRun, write_results};
use meshsim::pipeline::scenario::{PipelineScenario, mode_name};
use meshsim::pipeline::shard::{CacheLimits, DecodeMode, Route, SessionId, Shard};
use meshsim::pipeline::sim::{simulate, simulate_all};
use meshsim::units::Nanos;

const A100: &str = r#"
[pipeline.gpu]
name = "A100-SXM4-40GB"
memory_gib = 40.0
memory_bandwidth_gb_per_s = 1555.0
peak_tflops = 312.0
compute_efficiency = 0.6
memory_efficiency = 0.8
"#;

/// The parameters of a test scenario; `text` writes it as TOML.
#[derive(Clone, Debug)]
struct Spec {
    model: &'static str,
    shards: usize,
    policies: &'static str,
    max_active: usize,
    max_sessions: usize,
    ttl_s: f64,
    max_waiting: usize,
    /// (shard, request, after_tokens)
    restarts: Vec<(usize, u32, u32)>,
    requests: u32,
    prompt: u32,
    output: u32,
    rate: f64,
    /// Extra lines at the end (a `[limits]` table).
    extra: &'static str,
}

impl Spec {
    /// mistral-7b-instruct-v0.2 on 4 simulated A100s.
    fn mistral() -> Spec {
        Spec {
            model: "mistral-7b-instruct-v0.2",
            shards: 4,
            policies: r#"["cached", "stateless"]"#,
            max_active: 3,
            max_sessions: 16,
            ttl_s: 600.0,
            max_waiting: 10_000,
            restarts: Vec::new(),
            requests: 8,
            prompt: 32,
            output: 16,
            rate: 50.0,
            extra: "",
        }
    }

    /// The reference case: tiny on 2 shards, 3 sessions at once, a restart of shard 1.
    fn tiny() -> Spec {
        Spec {
            model: "tiny",
            shards: 2,
            max_active: 3,
            restarts: vec![(1, 0, 5)],
            requests: 6,
            prompt: 32,
            output: 16,
            rate: 50.0,
            ..Spec::mistral()
        }
    }

    fn text(&self) -> String {
        let mut t = format!(
            "name = \"t\"\nseed = 3\npolicies = {}\n\n[pipeline]\nmodel = \"{}\"\nshards = {}\n\
             max_sessions = {}\nsession_ttl_s = {:e}\nmax_active_sessions = {}\n\
             max_waiting_requests = {}\ncost = \"analytic\"\n{A100}\n[pipeline.link]\n\
             bandwidth_gb_per_s = 25.0\nlatency_us = 2.0\n",
            self.policies,
            self.model,
            self.shards,
            self.max_sessions,
            self.ttl_s,
            self.max_active,
            self.max_waiting,
        );
        for (shard, request, after) in &self.restarts {
            t += &format!(
                "\n[[pipeline.restart]]\nshard = {shard}\nrequest = {request}\n\
                 after_tokens = {after}\n"
            );
        }
        t += &format!(
            "\n[workload]\nrequests = {}\nprompt_tokens = {}\noutput_tokens = {}\n\
             arrival_rate_per_s = {:e}\n{}",
            self.requests, self.prompt, self.output, self.rate, self.extra
        );
        t
    }

    fn scenario(&self) -> PipelineScenario {
        let text = self.text();
        PipelineScenario::parse("test.toml", "t", Path::new("."), &text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }
}

fn sim(s: &PipelineScenario, mode: DecodeMode) -> PipelineRun {
    let r = simulate(s, mode).unwrap_or_else(|e| panic!("{}: {e}", mode_name(mode)));
    assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
    r
}

/// Every request completed with `output` tokens, and `outputs` holds each one's tokens.
fn assert_all_complete(r: &PipelineRun, requests: u32, output: u32) {
    let m = mode_name(r.mode);
    assert_eq!(r.report.records.len(), requests as usize, "{m}");
    assert_eq!(r.summary.requests, requests as u64, "{m}");
    assert_eq!(r.summary.completed, requests as u64, "{m}");
    assert_eq!(r.summary.rejected, 0, "{m}");
    for (i, rec) in r.report.records.iter().enumerate() {
        assert_eq!(rec.id, i as u32, "{m}: records are in id order");
        assert!(rec.completed() && !rec.rejected, "{m}: {rec:?}");
        assert_eq!(rec.output_tokens, output, "{m}: {rec:?}");
        let (a, f, e) = (
            rec.admitted.unwrap(),
            rec.first_token.unwrap(),
            rec.end.unwrap(),
        );
        assert!(rec.arrival <= a && a < f && f <= e, "{m}: {rec:?}");
    }
    let ids: Vec<u32> = r.report.outputs.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (0..requests).collect::<Vec<_>>(), "{m}: outputs by id");
    for (id, toks) in &r.report.outputs {
        assert_eq!(toks.len(), output as usize, "{m}: request {id}");
    }
}

fn preemptions(records: &[RequestRecord]) -> Vec<u32> {
    records.iter().map(|r| r.preemptions).collect()
}

/// The re-prefills the head counted are the misses the shards answered.
fn assert_misses_consistent(r: &PipelineRun) {
    let head: u64 = r.report.records.iter().map(|r| r.preemptions as u64).sum();
    assert_eq!(
        head,
        r.summary.preemptions,
        "{}: the head's re-prefills vs the shards' misses",
        mode_name(r.mode)
    );
}

/// Most sessions in flight at once (admission to end).
fn max_concurrency(records: &[RequestRecord]) -> usize {
    let mut events: Vec<(Nanos, i32)> = Vec::new();
    for r in records.iter().filter(|r| r.completed()) {
        events.push((r.admitted.unwrap(), 1));
        events.push((r.end.unwrap(), -1));
    }
    // An end and an admission at the same instant: the end first.
    events.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        max = max.max(now);
    }
    max as usize
}

fn meshsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh temporary folder (under `std::env::temp_dir()`).
fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("meshsim-pipeline-test-")
        .tempdir()
        .unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Simulator
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Live host
// ---------------------------------------------------------------------------------------------

/// The in-process candle route of `s` (CPU, f32, the scenario's seeded weights).
fn candle_route(s: &PipelineScenario) -> Route {
    let shards = s
        .layers
        .iter()
        .map(|l| {
            let b = CandleBackend::load(
                &s.model,
                l.clone(),
                &WeightSource::Seeded(s.seed),
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
            Shard::new(Box::new(b), CacheLimits::default())
        })
        .collect();
    Route::new(shards).unwrap()
}

/// What the undisturbed route generates for every request of `s` in `mode`.
fn reference(s: &PipelineScenario, mode: DecodeMode) -> Vec<(u32, Vec<u32>)> {
    let mut route = candle_route(s);
    trace(s)
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let g = route
                .generate(
                    Nanos::ZERO,
                    SessionId(i as u64),
                    r.prompt,
                    r.output_tokens as usize,
                    mode,
                )
                .unwrap();
            assert_eq!(g.cache_misses, 0);
            (i as u32, g.output().to_vec())
        })
        .collect()
}

async fn live_run(s: &PipelineScenario, mode: DecodeMode) -> PipelineRun {
    let r = live(s, mode)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", mode_name(mode)));
    assert!(r.report.violations.is_empty(), "{:?}", r.report.violations);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_tokens_equal_the_in_process_route_with_three_sessions_at_once() {
    let spec = Spec {
        restarts: vec![],
        rate: 1e5,
        ..Spec::tiny()
    };
    let s = spec.scenario();
    for mode in [DecodeMode::Cached, DecodeMode::Stateless] {
        let want = reference(&s, mode);
        let r = live_run(&s, mode).await;
        assert_all_complete(&r, spec.requests, spec.output);
        assert_eq!(r.report.outputs, want, "{}", mode_name(mode));
        assert_eq!(r.summary.preemptions, 0, "{}", mode_name(mode));
        let c = max_concurrency(&r.report.records);
        assert!(
            (2..=3).contains(&c),
            "{}: {c} sessions at once: {:?}",
            mode_name(mode),
            r.report.records
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_restart_re_prefills_and_leaves_the_tokens_unchanged() {
    let spec = Spec::tiny();
    let s = spec.scenario();
    let want = reference(&s, DecodeMode::Cached);
    let r = live_run(&s, DecodeMode::Cached).await;
    assert_all_complete(&r, spec.requests, spec.output);
    assert_eq!(r.report.outputs, want);
    assert!(r.summary.preemptions >= 1, "{:?}", r.summary);
    assert!(
        r.report.records[0].preemptions >= 1,
        "{:?}",
        r.report.records[0]
    );
    assert!(r.report.instances[1].preemptions >= 1);
    assert_misses_consistent(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_decode_steps_that_all_miss_still_give_the_route_tokens() {
    // A TTL far below a step: every decode step of every session misses at a shard, and the
    // head re-prefills; the tokens must not change.
    let spec = Spec {
        restarts: vec![],
        ttl_s: 1e-6,
        requests: 3,
        output: 8,
        rate: 1e3,
        policies: r#"["cached"]"#,
        ..Spec::tiny()
    };
    let s = spec.scenario();
    let want = reference(&s, DecodeMode::Cached);
    let r = live_run(&s, DecodeMode::Cached).await;
    assert_all_complete(&r, spec.requests, spec.output);
    assert_eq!(r.report.outputs, want);
    assert_eq!(preemptions(&r.report.records), [spec.output - 1; 3]);
    assert_misses_consistent(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_and_live_hosts_generate_as_many_tokens_per_request() {
    let spec = Spec::tiny();
    let s = spec.scenario();
    let sims = simulate_all(&s, 1).unwrap();
    let lives = meshsim::pipeline::live::live_all(&s).await.unwrap();
    assert_eq!(sims.len(), 2);
    assert_eq!(lives.len(), 2);
    for (a, b) in sims.iter().zip(&lives) {
        let m = mode_name(a.mode);
        assert_eq!(a.mode, b.mode);
        assert_eq!(a.summary.policy, b.summary.policy);
        assert_eq!(a.report.records.len(), b.report.records.len(), "{m}");
        assert_eq!(a.summary.completed, b.summary.completed, "{m}");
        let lens = |r: &PipelineRun| -> Vec<(u32, usize)> {
            r.report
                .outputs
                .iter()
                .map(|(i, t)| (*i, t.len()))
                .collect()
        };
        assert_eq!(lens(a), lens(b), "{m}");
        for (x, y) in a.report.records.iter().zip(&b.report.records) {
            assert_eq!(
                (x.id, x.prompt_tokens, x.output_tokens, x.rejected),
                (y.id, y.prompt_tokens, y.output_tokens, y.rejected),
                "{m}"
            );
        }
        assert!(
            a.report
                .outputs
                .iter()
                .all(|(_, t)| t.iter().all(|&x| x == 0))
        );
    }
}

// ---------------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------------

/// Replaces the one line that starts with `from` (after trimming) by `to`.
fn edit(text: &str, from: &str, to: &str) -> String {
    let n = text
        .lines()
        .filter(|l| l.trim_start().starts_with(from))
        .count();
    assert_eq!(n, 1, "{from:?} must occur once in\n{text}");
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with(from) {
                to
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Runs `args` with FILE replaced by `file`, and checks the bad-input contract.
fn assert_rejected(args: &[&str], file: &Path, out: &Path, needles: &[&str]) {
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "FILE" { path_str(file) } else { a })
        .collect();
    let o = meshsim(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(err.contains(name), "{args:?}: names the file: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: names {n:?}: {err}");
    }
    assert!(!out.exists(), "{args:?}: wrote {}", out.display());
    let parent = out.parent().unwrap();
    let leftovers: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "toml"))
        .collect();
    assert!(leftovers.is_empty(), "{args:?}: left {leftovers:?}");
}

#[test]
fn bad_pipeline_scenarios_exit_2_naming_the_key_and_write_nothing() {
    let good = Spec::tiny().text();
    let without_gpu = {
        let start = good.find("[pipeline.gpu]").unwrap();
        let end = good.find("[pipeline.link]").unwrap();
        format!("{}{}", &good[..start], &good[end..])
    };
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "model",
            edit(&good, "model =", "model = \"gpt-5\""),
            vec!["pipeline.model", "gpt-5"],
        ),
        (
            "zero_shards",
            edit(&good, "shards =", "shards = 0"),
            vec!["pipeline.shards", "found 0"],
        ),
        (
            "too_many_shards",
            edit(&good, "shards =", "shards = 5"),
            vec!["pipeline.shards", "found 5"],
        ),
        (
            "shards_and_layers",
            edit(&good, "shards =", "shards = 2\nlayers = [[0, 2], [2, 4]]"),
            vec!["pipeline", "`shards`", "`layers`"],
        ),
        (
            "gap",
            edit(&good, "shards =", "layers = [[0, 2], [3, 4]]"),
            vec!["pipeline.layers[1]", "[3, 4]"],
        ),
        (
            "short",
            edit(&good, "shards =", "layers = [[0, 2], [2, 3]]"),
            vec!["pipeline.layers", "0..4"],
        ),
        ("no_gpu", without_gpu, vec!["pipeline.gpu"]),
        (
            "restart_shard",
            edit(&good, "shard = 1", "shard = 2"),
            vec!["pipeline.restart[0].shard", "found 2"],
        ),
        (
            "restart_after",
            edit(&good, "after_tokens", "after_tokens = 16"),
            vec!["pipeline.restart[0].after_tokens", "found 16"],
        ),
        (
            "output",
            edit(&good, "output_tokens", "output_tokens = 0"),
            vec!["workload.output_tokens", "found 0"],
        ),
        (
            "unknown_key",
            edit(&good, "max_sessions", "max_sessions = 16\nmax_sesions = 4"),
            vec!["pipeline", "max_sesions"],
        ),
        (
            "zero_sessions",
            edit(&good, "max_active_sessions", "max_active_sessions = 0"),
            vec!["pipeline.max_active_sessions"],
        ),
    ];
    // The unedited scenario is valid, so the rejections below come from the edits.
    let dir = tempdir();
    let file = dir.path().join("good.toml");
    std::fs::write(&file, &good).unwrap();
    let o = meshsim(&["check", path_str(&file)]);
    assert!(o.status.success(), "{}", stderr(&o));

    for (name, text, needles) in &cases {
        let dir = tempdir();
        let file = dir.path().join(format!("bad_{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = dir.path().join("out");
        let o = path_str(&out);
        for args in [
            vec!["run", "FILE", "--out", o],
            vec!["run", "FILE", "--live", "--out", o],
            vec!["check", "FILE"],
        ] {
            assert_rejected(&args, &file, &out, needles);
        }
    }

    // Limits that only a live run has: f32, and sequences short enough to attend over.
    let live_only: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "bf16",
            edit(&good, "cost =", "cost = \"analytic\"\ndtype = \"bf16\""),
            vec!["pipeline.dtype", "f32"],
        ),
        (
            "long",
            edit(&good, "prompt_tokens", "prompt_tokens = 8190"),
            vec!["workload.output_tokens", "8192"],
        ),
    ];
    for (name, text, needles) in &live_only {
        let dir = tempdir();
        let file = dir.path().join(format!("live_{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let o = meshsim(&["check", path_str(&file)]);
        assert!(
            o.status.success(),
            "{name}: a simulation may: {}",
            stderr(&o)
        );
        let out = dir.path().join("out");
        let args = ["run", "FILE", "--live", "--out", path_str(&out)];
        assert_rejected(&args, &file, &out, needles);
        // The same file with mode = "live" is refused by `check` too.
        let live = format!("mode = \"live\"\n{text}");
        std::fs::write(&file, live).unwrap();
        assert_rejected(&["check", "FILE"], &file, &out, needles);
    }

    // A wall-clock limit beyond a week is a unit mistake, not a panic.
    let dir = tempdir();
    let file = dir.path().join("bad_wall.toml");
    std::fs::write(&file, format!("{good}\n[limits]\nmax_wall_s = 1e20\n")).unwrap();
    let out = dir.path().join("out");
    assert_rejected(&["check", "FILE"], &file, &out, &["limits.max_wall_s"]);

    // --live runs serving scenarios too, but only what candle computes: f32.
    let polaris = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/polaris_8gpu.toml");
    let dir = tempdir();
    let out = dir.path().join("out");
    assert_rejected(
        &["run", "FILE", "--live", "--out", path_str(&out)],
        &polaris,
        &out,
        &["model.dtype", "f32"],
    );
}

/// `meshsim compare` reads what `meshsim run` writes, quoted sweep labels with commas included;
/// a run compared with itself has no error.
#[test]
fn compare_reads_sweep_labels_with_commas() {
    let spec = Spec::tiny();
    let text = edit(&spec.text(), "shards =", "layers = [[0, 2], [2, 4]]")
        + "\n[sweep]\n\"pipeline.layers\" = [[[0, 2], [2, 4]], [[0, 1], [1, 4]]]\n";
    let dir = tempdir();
    let file = dir.path().join("sweep.toml");
    std::fs::write(&file, text).unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for out in [&a, &b] {
        let o = meshsim(&["run", path_str(&file), "-q", "--out", path_str(out)]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = meshsim(&["compare", path_str(&a), path_str(&b)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let md = String::from_utf8(o.stdout).unwrap();
    assert!(md.contains("| layers=[[0, 2], [2, 4]] | cached |"), "{md}");
    assert!(
        md.contains("| layers=[[0, 1], [1, 4]] | stateless |"),
        "{md}"
    );
    // The first table (the throughput table below it has rows per point too).
    let md = md.split("Throughput").next().unwrap().to_string();
    let rows = md.lines().filter(|l| l.starts_with("| layers=")).count();
    assert_eq!(rows, 4, "{md}");
    for l in md.lines().filter(|l| l.starts_with("| layers=")) {
        assert_eq!(
            l.matches("+0.0%").count(),
            3,
            "no error against itself: {l}"
        );
    }
    assert!(!md.contains("Warning"), "{md}");
    // Folders of different scenarios are compared with a warning.
    let other = dir.path().join("other.toml");
    std::fs::write(
        &other,
        edit(
            &std::fs::read_to_string(&file).unwrap(),
            "seed =",
            "seed = 4",
        ),
    )
    .unwrap();
    let c = dir.path().join("c");
    let o = meshsim(&["run", path_str(&other), "-q", "--out", path_str(&c)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = meshsim(&["compare", path_str(&a), path_str(&c)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8(o.stdout).unwrap().contains("Warning"));
    // A folder without requests.csv is bad input.
    let o = meshsim(&["compare", path_str(&a), path_str(dir.path())]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("requests.csv"), "{}", stderr(&o));
}

#[test]
fn the_cli_runs_a_pipeline_scenario_live_into_its_out_folder() {
    let spec = Spec::tiny();
    let dir = tempdir();
    let file = dir.path().join("tiny.toml");
    std::fs::write(&file, spec.text()).unwrap();
    let out = dir.path().join("live");
    let o = meshsim(&[
        "run",
        path_str(&file),
        "--live",
        "--quiet",
        "--out",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 12, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |n: &str| header.iter().position(|h| *h == n).unwrap();
    let (policy, status, output) = (col("policy"), col("status"), col("output_tokens"));
    let mut per_mode = std::collections::BTreeMap::new();
    for l in &lines[1..] {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f[status], "ok", "{l}");
        assert_eq!(f[output], "16", "{l}");
        *per_mode.entry(f[policy].to_string()).or_insert(0) += 1;
    }
    assert_eq!(
        per_mode.into_iter().collect::<Vec<_>>(),
        [("cached".to_string(), 6), ("stateless".to_string(), 6)]
    );
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 3, "{summary}");
    // The input, marked as run live, so that the folder says how it was made.
    let copy = std::fs::read_to_string(out.join("scenario.toml")).unwrap();
    let (first, rest) = copy.split_once('\n').unwrap();
    assert!(first.starts_with("mode = \"live\""), "{copy}");
    assert_eq!(rest, spec.text());
}
