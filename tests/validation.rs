//! Validation against published measurements of real systems.
//!
//! Each test computes meshsim's figure for a published measurement, from a bundled
//! `scenarios/validation_*.toml` (the measured system's hardware at its datasheet figures; the
//! GPU efficiencies, 0.6 of peak FLOP/s and 0.8 of peak HBM bandwidth, and the 1 ms
//! per-iteration overhead that every bundled scenario uses; nothing fitted to the figure) or
//! from the published trace itself, and checks `|meshsim - published| / published <=
//! tolerance`. The README's section "Validation against published measurements" tabulates the
//! same figures; `cargo test --test validation -- --nocapture` prints its rows.
//!
//! Where meshsim agrees with a measurement (within 20 % for times and rates, 10 % for hit
//! ratios), the tolerance is that claim. Where it does not, the verdict says so
//! ([`Verdict::Disagrees`]): the tolerance then bounds the documented gap, and the test also
//! fails if the gap closes to within 20 %, so that the README never calls a figure a
//! disagreement that has become an agreement (or the reverse) without someone looking.

mod common;

use std::path::Path;

use meshsim::serving::outcome::PolicyRun;
use meshsim::workload::replay::{self, ReplaySpec, Source};
use meshsim::workload::stats::TraceStats;
use meshsim::{Experiment, Runs};

/// What a test claims about a published figure.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    /// meshsim is within the tolerance, which is the agreement claimed.
    Agrees,
    /// meshsim is further off than an agreement allows; the tolerance bounds the gap.
    Disagrees,
}

/// The bound beyond which a time or rate is called a disagreement.
const AGREEMENT: f64 = 0.20;

/// One published measurement.
struct Published {
    what: &'static str,
    figure: f64,
    unit: &'static str,
    source: &'static str,
    tolerance: f64,
    verdict: Verdict,
}

/// TensorRT-LLM v0.9.0's published performance page (data generated with v0.9.0).
const TRTLLM: &str = "TensorRT-LLM v0.9.0 docs/source/performance.md \
     (https://github.com/NVIDIA/TensorRT-LLM/blob/v0.9.0/docs/source/performance.md)";

/// The Mooncake FAST'25 paper (Qin et al., "Mooncake: Trading More Storage for Less
/// Computation", USENIX FAST 2025), as shipped in kvcache-ai/Mooncake,
/// `FAST25-release/Mooncake-FAST25.pdf`.
const MOONCAKE: &str =
    "Mooncake, USENIX FAST'25 (https://www.usenix.org/system/files/fast25-qin.pdf)";

/// Returns meshsim's relative error against `p` after checking it against the tolerance and
/// the verdict, and prints the README's table row.
fn check(p: &Published, meshsim: f64) -> f64 {
    let err = (meshsim - p.figure) / p.figure;
    println!(
        "| {} | {} {} | {:.4} {} | {:+.1} % | {:.0} % | {:?} |  ({})",
        p.what,
        p.figure,
        p.unit,
        meshsim,
        p.unit,
        100.0 * err,
        100.0 * p.tolerance,
        p.verdict,
        p.source
    );
    assert!(
        err.abs() <= p.tolerance,
        "{}: meshsim {meshsim:.4} {} against the published {} {} ({}): error {:+.1} % is beyond \
         the tolerance of {:.0} %",
        p.what,
        p.unit,
        p.figure,
        p.unit,
        p.source,
        100.0 * err,
        100.0 * p.tolerance
    );
    if p.verdict == Verdict::Disagrees {
        assert!(
            err.abs() > AGREEMENT,
            "{}: meshsim {meshsim:.4} {} now agrees with the published {} {} within {:.0} % \
             ({:+.1} %): call it an agreement here and in the README's validation table",
            p.what,
            p.unit,
            p.figure,
            p.unit,
            100.0 * AGREEMENT,
            100.0 * err
        );
    }
    err
}

/// Runs the bundled `scenarios/<name>.toml` and returns its runs (one per sweep point and
/// policy).
fn run_bundled(name: &str) -> Vec<PolicyRun> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/{name}.toml"));
    let e = Experiment::load(&file).unwrap_or_else(|e| panic!("{e}"));
    match e.run(2).unwrap_or_else(|e| panic!("{name}: {e}")) {
        Runs::Serving(runs) => runs,
        Runs::Pipeline(_) => panic!("{name} is a serving scenario"),
    }
}

/// TensorRT-LLM's "Low Latency" table, A100 GPUs (FP16), Mistral 7B, batch size 1, TP 1:
/// 1st token latency for 2048 input tokens.
const TTFT_2048: Published = Published {
    what: "TTFT, Mistral-7B, 2048-token prompt, batch 1, A100",
    figure: 139.6,
    unit: "ms",
    source: TRTLLM,
    tolerance: AGREEMENT,
    verdict: Verdict::Agrees,
};

/// The same table, 128 input tokens. meshsim is about a third low: a 128-token prefill at
/// batch 1 is bound neither by FLOPs (9.6 ms at 0.6 of peak) nor by reading the weights
/// (8.7 ms at 0.8 of peak) but by many small kernels that reach neither; the published figure
/// implies 0.9 TB/s, under half the A100's 2 TB/s. The roofline has no term for that.
const TTFT_128: Published = Published {
    what: "TTFT, Mistral-7B, 128-token prompt, batch 1, A100",
    figure: 16.3,
    unit: "ms",
    source: TRTLLM,
    tolerance: 0.40,
    verdict: Verdict::Disagrees,
};

#[test]
fn a_single_mistral_prefill_on_an_a100_takes_the_time_tensorrt_llm_publishes() {
    let runs = run_bundled("validation_trtllm_a100_ttft");
    assert_eq!(runs.len(), 1);
    let ttft_ms = |prompt: u32| {
        let r = runs[0]
            .report
            .records
            .iter()
            .find(|r| r.prompt_tokens == prompt)
            .expect("the scenario has a request of this length");
        let first = r.first_token.expect("the request completes");
        (first.0 - r.arrival.0) as f64 / 1e6
    };
    check(&TTFT_2048, ttft_ms(2048));
    let err = check(&TTFT_128, ttft_ms(128));
    assert!(
        err < 0.0,
        "meshsim is faster than the short prefill measured"
    );
}

/// TensorRT-LLM's "Peak Throughput" table, A100 GPUs (FP16), Mistral 7B, TP 1, output
/// tokens/s per GPU, one static batch: batch 896, 128 input and 128 output tokens.
const TPUT_B896_128_128: Published = Published {
    what: "output tokens/s, Mistral-7B, batch 896, 128 in / 128 out, A100",
    figure: 6251.0,
    unit: "tokens/s",
    source: TRTLLM,
    tolerance: AGREEMENT,
    verdict: Verdict::Agrees,
};

/// The same table: batch 64, 2048 input and 128 output tokens (prefill-dominated).
const TPUT_B64_2048_128: Published = Published {
    what: "output tokens/s, Mistral-7B, batch 64, 2048 in / 128 out, A100",
    figure: 698.0,
    unit: "tokens/s",
    source: TRTLLM,
    tolerance: AGREEMENT,
    verdict: Verdict::Agrees,
};

/// The same table: batch 120, 128 input and 2048 output tokens (decode-dominated). meshsim
/// is about half again faster: its decode step reads the weights and every sequence's KV at
/// 0.8 of peak HBM bandwidth (21 ms a step here), while the published rate implies 32 ms a
/// step, about 1.0 TB/s: decode attention over long contexts at large batch runs well below
/// the bandwidth that weight reads reach, which one memory efficiency for both cannot show.
const TPUT_B120_128_2048: Published = Published {
    what: "output tokens/s, Mistral-7B, batch 120, 128 in / 2048 out, A100",
    figure: 3776.0,
    unit: "tokens/s",
    source: TRTLLM,
    tolerance: 0.60,
    verdict: Verdict::Disagrees,
};

/// The same table: batch 56, 2048 input and 2048 output tokens. meshsim is high for the
/// reason given at [`TPUT_B120_128_2048`], less so because the 2048-token prefills, which it
/// prices well, take a larger share of the time.
const TPUT_B56_2048_2048: Published = Published {
    what: "output tokens/s, Mistral-7B, batch 56, 2048 in / 2048 out, A100",
    figure: 1576.0,
    unit: "tokens/s",
    source: TRTLLM,
    tolerance: 0.35,
    verdict: Verdict::Disagrees,
};

#[test]
fn mistral_batch_throughput_on_an_a100_is_what_tensorrt_llm_publishes_or_the_gap_is_known() {
    let runs = run_bundled("validation_trtllm_a100_throughput");
    let rate = |file: &str| {
        let point = format!("path={file}");
        let run = runs
            .iter()
            .find(|r| r.summary.point.as_deref() == Some(point.as_str()))
            .unwrap_or_else(|| panic!("no sweep point {point}"));
        assert_eq!(run.summary.completed, run.summary.requests, "{point}");
        run.summary.output_tokens_per_s
    };
    let f = "validation_trtllm_a100_throughput";
    check(
        &TPUT_B896_128_128,
        rate(&format!("{f}_b896_in128_out128.csv")),
    );
    check(
        &TPUT_B64_2048_128,
        rate(&format!("{f}_b64_in2048_out128.csv")),
    );
    let long = check(
        &TPUT_B120_128_2048,
        rate(&format!("{f}_b120_in128_out2048.csv")),
    );
    let both = check(
        &TPUT_B56_2048_2048,
        rate(&format!("{f}_b56_in2048_out2048.csv")),
    );
    assert!(
        long > 0.0 && both > 0.0,
        "meshsim decodes faster than measured"
    );
}

/// Mooncake's Table 2 ("Workload Statistics"): cache ratio 40 % for the conversation trace.
/// The paper does not define the ratio; meshsim's is the token prefix-hit ratio with an
/// unbounded cache (`meshsim trace stats`: leading 512-token blocks seen before, over prompt
/// tokens). The mean of the per-request ratios of the same trace is 41 %.
const MOONCAKE_CONVERSATION: Published = Published {
    what: "prefix cache ratio, Mooncake conversation trace (12,031 requests)",
    figure: 0.40,
    unit: "",
    source: MOONCAKE,
    tolerance: 0.10,
    verdict: Verdict::Agrees,
};

/// Mooncake's Table 2: cache ratio 66 % for the synthetic trace (the same definition).
const MOONCAKE_SYNTHETIC: Published = Published {
    what: "prefix cache ratio, Mooncake synthetic trace (3,993 requests)",
    figure: 0.66,
    unit: "",
    source: MOONCAKE,
    tolerance: 0.10,
    verdict: Verdict::Agrees,
};

/// meshsim's unbounded prefix-hit ratio of a Mooncake trace in `../shared/datasets`, as
/// `meshsim trace stats` computes it.
fn mooncake_hit_ratio(file: &str) -> f64 {
    let path = common::shared_datasets().join("mooncake").join(file);
    let loaded = replay::load(&ReplaySpec::new(Source::MooncakeJsonl, &path), 0)
        .unwrap_or_else(|e| panic!("{e}"));
    TraceStats::of(&loaded.trace, 512, &[]).unbounded_hit_ratio
}

#[test]
fn the_mooncake_conversation_trace_reuses_the_prefix_share_its_paper_publishes() {
    check(
        &MOONCAKE_CONVERSATION,
        mooncake_hit_ratio("conversation_trace.jsonl"),
    );
}

#[test]
fn the_mooncake_synthetic_trace_reuses_the_prefix_share_its_paper_publishes() {
    check(
        &MOONCAKE_SYNTHETIC,
        mooncake_hit_ratio("synthetic_trace.jsonl"),
    );
}
