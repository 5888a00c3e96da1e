//! The pipeline scenarios of the pipeline tests (`tests/pipeline.rs`, `tests/pipeline_sim.rs`),
//! what every run must satisfy, and the `meshsim` binary they run.

use std::path::Path;
use std::process::{Command, Output};

use meshsim::metrics::RequestRecord;
use meshsim::pipeline::outcome::PipelineRun;
use meshsim::pipeline::scenario::{PipelineScenario, mode_name};
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
pub struct Spec {
    pub model: &'static str,
    pub shards: usize,
    pub policies: &'static str,
    pub max_active: usize,
    pub max_sessions: usize,
    pub ttl_s: f64,
    pub max_waiting: usize,
    /// (shard, request, after_tokens)
    pub restarts: Vec<(usize, u32, u32)>,
    pub requests: u32,
    pub prompt: u32,
    pub output: u32,
    pub rate: f64,
    /// Extra lines at the end (a `[limits]` table).
    pub extra: &'static str,
}

impl Spec {
    /// mistral-7b-instruct-v0.2 on 4 simulated A100s.
    pub fn mistral() -> Spec {
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
    pub fn tiny() -> Spec {
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

    pub fn text(&self) -> String {
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

    pub fn scenario(&self) -> PipelineScenario {
        let text = self.text();
        PipelineScenario::parse("test.toml", "t", Path::new("."), &text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }
}

/// Every request completed with `output` tokens, and `outputs` holds each one's tokens.
pub fn assert_all_complete(r: &PipelineRun, requests: u32, output: u32) {
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

pub fn preemptions(records: &[RequestRecord]) -> Vec<u32> {
    records.iter().map(|r| r.preemptions).collect()
}

/// The re-prefills the head counted are the misses the shards answered.
pub fn assert_misses_consistent(r: &PipelineRun) {
    let head: u64 = r.report.records.iter().map(|r| r.preemptions as u64).sum();
    assert_eq!(
        head,
        r.summary.preemptions,
        "{}: the head's re-prefills vs the shards' misses",
        mode_name(r.mode)
    );
}

/// Most sessions in flight at once (admission to end).
pub fn max_concurrency(records: &[RequestRecord]) -> usize {
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

pub fn meshsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshsim"))
        .args(args)
        .output()
        .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh temporary folder (under `std::env::temp_dir()`).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("meshsim-pipeline-test-")
        .tempdir()
        .unwrap()
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}
