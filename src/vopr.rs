//! The VOPR (after TigerBeetle's Viewstamped Operation Replicator): many small random
//! serving scenarios, each from one seed, simulated under every policy with every actor's
//! invariants checked after every event, and each simulated twice to check determinism.
//!
//! A seed fixes a whole scenario ([`scenario_text`]): 1 to 3 nodes of 1 to 4 GPUs (tensor
//! parallel 1 or 2), the `tiny` model on GPUs with room for a few hundred KV blocks (so that
//! batches preempt), store servers with room for a handful of tensors in host memory and SSD
//! (so that the store evicts, demotes and drops), random routing, eviction and replication
//! rules, store loads that overlap compute layer by layer or not (`load_overlap`), and a
//! generated SQuAD- or WikiQA-style workload of 10 to 120 requests. Beside the paper's four
//! presets, every seed runs a random composition (`[policy.mix]`: a random preset as base,
//! the GPU cache and its eviction order (`lru`, `lfu` or `s3-fifo`), its tiers, scope,
//! chunk, capacities, eviction per tier (all five orders), admission, replication,
//! load-or-recompute (`load`) and the remote data path drawn, always one that can work).
//! Every scenario is a valid
//! scenario file: `meshsim vopr --seed S --print` writes it, and `meshsim run` runs it like
//! any other.
//!
//! A seed fails when a simulation returns an error (a broken limit or invariant, with the
//! simulated time at which it broke), when a request ends neither finished nor rejected, or
//! when the two simulations of one policy differ in any byte of their results. Half of the
//! seeds also inject up to three random faults (`[[fault]]`: node crashes, store restarts,
//! links slowed or cut, GPUs slowed) while the trace runs; then a request may also end failed,
//! with a reason.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::metrics::write::{write_requests, write_summary};
use crate::rng::Stream;
use crate::serving::outcome::PolicyRun;
use crate::serving::scenario::Scenario;

/// The ChaCha8 stream of a seed's scenario choices.
const VOPR_STREAM: u64 = 0x7090_0001;

/// Events between invariant checks in VOPR runs: every event.
pub const VOPR_CHECK_EVERY: u64 = 1;

/// What one seed gave.
#[derive(Debug)]
pub struct SeedOutcome {
    pub seed: u64,
    /// Simulations run (policies, each twice).
    pub simulations: usize,
    /// Events of all simulations.
    pub events: u64,
    /// Requests finished and rejected over all policies (first simulation of each).
    pub finished: u64,
    pub rejected: u64,
    /// Requests failed by a fault, and requests failed over to another instance.
    pub failed: u64,
    pub failovers: u64,
    /// Load groups that failed because their source lost its memory mid-read.
    pub failed_loads: u64,
    /// Faults the scenario injects.
    pub faults: usize,
    /// What the scenarios exercised (first simulation of each policy): preemptions of
    /// running sequences, and tensors the stores demoted to SSD, dropped and replicated.
    pub preemptions: u64,
    pub demoted: u64,
    pub dropped: u64,
    pub replicated: u64,
}

/// Why a seed failed; the message names the seed and how to reproduce it.
#[derive(Debug, thiserror::Error)]
#[error(
    "seed {seed}: {what}; reproduce with: meshsim vopr --seed {seed} (scenario: meshsim vopr --seed {seed} --print)"
)]
pub struct SeedFailure {
    pub seed: u64,
    pub what: String,
}

/// The tables every VOPR scenario shares.
const FIXED: &str = r#"[hardware.host]
memory_gib = 64.0
memory_bandwidth_gb_per_s = 204.8

[hardware.ssd]
drives = 1
capacity_gb_per_drive = 100.0
read_bandwidth_gb_per_s_per_drive = 3.5
write_bandwidth_gb_per_s_per_drive = 2.0
latency_us = 80.0

[hardware.pcie]
bandwidth_gb_per_s = 25.0
latency_ns = 1000

[hardware.nvlink]
bandwidth_gb_per_s = 300.0
latency_ns = 1000

[model]
preset = "tiny"

[limits]
max_events = 10000000
max_sim_time_s = 86400.0
max_pending_events = 1000000
"#;

/// The scenario file of `seed`.
pub fn scenario_text(seed: u64) -> String {
    let mut r = Stream::new(seed, VOPR_STREAM);
    let mut pick = |n: u64| r.below(n);
    let nodes = 1 + pick(3);
    let gpus = [1, 2, 4][pick(3) as usize];
    let tp = if gpus > 1 && pick(3) == 0 { 2 } else { 1 };
    let router = ["round-robin", "least-loaded", "kv-aware"][pick(3) as usize];
    let block = [8, 16][pick(2) as usize];
    // The tiny model's weights take about 5.5 MiB; 7 to 16 MiB of GPU memory per instance
    // leave KV for 700 to 5,000 tokens (2 KiB per token): batches preempt, and the longest
    // prompts do not fit at all (rejected).
    let gpu_mib = 7 + pick(10);
    let max_seqs = 2 + pick(31);
    let budget = 64 * (1 + pick(8));
    let dataset = ["squad", "wikiqa"][pick(2) as usize];
    let requests = 10 + pick(111);
    // From light load to bursts far beyond what the instances serve.
    let rate = [10, 100, 1000, 5000][pick(4) as usize] * (1 + pick(4));
    let order = ["shuffled", "grouped"][pick(2) as usize];
    let context = 128 * (1 + pick(8));
    let system = pick(33);
    let output = output_text(&mut pick);
    let tensor_tokens = block * [2, 4, 8][pick(3) as usize];
    // A tensor holds tensor_tokens x 2 KiB; room for 4 to 40 of them in host memory and 0 to
    // 40 on SSD.
    let tensor_mib = tensor_tokens as f64 * 2048.0 / (1 << 20) as f64;
    let host_gib = tensor_mib * (4 + pick(37)) as f64 / 1024.0;
    let ssd_gb = tensor_mib * (pick(41)) as f64 * 1.048576 / 1024.0;
    let evict = |p: u64| ["lru", "gdsf"][p as usize];
    let evo = evict(pick(2));
    let pt = evict(pick(2));
    let fraction = [0.25, 0.5, 0.75][pick(3) as usize];
    let after = [0, 1, 1, 2][pick(4) as usize];
    let waiting = 2 + pick(requests);
    let consolidate = pick(2) == 0;
    let gpu_cache = pick(4) != 0;
    // Faults within the trace's span.
    let span_ms = (1000 * requests / rate).max(1);
    let faults = faults_text(&mut pick, nodes, gpus, span_ms);
    // Drawn last, so that it shifts none of the draws above: a seed recorded with a
    // failure still draws the same choices there.
    let overlap = ["none", "layerwise"][pick(2) as usize];
    let (order, reuse) = reuse_text(&mut pick, order);
    let mix = composition_text(&mut pick, block, tensor_mib_per_token_block(block));
    let mut t = String::new();
    let _ = write!(
        t,
        r#"# meshsim vopr --seed {seed}
name = "vopr_{seed}"
seed = {seed}
policies = ["vanilla", "local-prefix", "evostore", "ptstore", "mix"]
{mix}
[hardware]
nodes = {nodes}
gpus_per_node = {gpus}

[hardware.gpu]
name = "vopr-gpu"
memory_gib = {gpu_gib}
memory_bandwidth_gb_per_s = 1555.0
peak_tflops = 312.0
compute_efficiency = 0.6
memory_efficiency = 0.8

[hardware.network]
nics_per_node = {nics}
nic_bandwidth_gbit_per_s = {nic}.0
nic_latency_ns = 700
switch_latency_ns = 350
switch_hops = 3

[serving]
tensor_parallel = {tp}
router = "{router}"
block_size_tokens = {block}
max_num_seqs = {max_seqs}
max_batched_tokens = {budget}
memory_reserve_gib = 0.0
iteration_overhead_us = 100.0
max_waiting_requests = {waiting}

[workload]
dataset = "{dataset}"
requests = {requests}
arrival_rate_per_s = {rate}.0
{order}context = "window"
context_tokens = {context}
system_prompt_tokens = {system}

[workload.output_tokens]
{output}
{reuse}
[store]
tensor_tokens = {tensor_tokens}
host_capacity_gib = {host_gib:.9}
ssd_capacity_gb = {ssd_gb:.9}
metadata_service_us = 5.0
fetch_request_overhead_us = 10.0
fetch_segment_overhead_us = 2.0
gpu_prefix_cache = {gpu_cache}
load_overlap = "{overlap}"

[store.evostore]
eviction = "{evo}"

[store.ptstore]
eviction = "{pt}"
replica_fraction = {fraction}
replicate_after_reads = {after}
consolidate = {consolidate}

{FIXED}
{faults}"#,
        gpu_gib = gpu_mib as f64 / 1024.0,
        nics = 1 + (seed % 2),
        nic = [25, 100, 200][(seed % 3) as usize],
    );
    t
}

/// MiB of one serving block of the tiny model (2 KiB per token).
fn tensor_mib_per_token_block(block: u64) -> f64 {
    block as f64 * 2048.0 / (1 << 20) as f64
}

/// `[policy.mix]`: a random composition that can work, from a random preset: GPU cache or
/// not, and with it any of its eviction orders, no tier, host memory, or host memory and SSD
/// (4 to 40 chunks of host memory, 0 to 40 on SSD), any scope, any chunk, eviction per tier,
/// replication only across the cluster, either load choice and any remote data path.
fn composition_text(pick: &mut dyn FnMut(u64) -> u64, block: u64, block_mib: f64) -> String {
    let presets = crate::serving::policy::PRESETS;
    let base = presets[pick(presets.len() as u64) as usize];
    let gpu_cache = pick(3) != 0;
    let mut t = format!("\n[policy.mix]\nbase = \"{base}\"\ngpu_prefix_cache = {gpu_cache}\n");
    let tiers = pick(3);
    if tiers == 0 {
        t += "tiers = []\n";
    } else {
        store_keys(&mut t, pick, tiers, block, block_mib);
    }
    // Drawn after the keys above, so that it shifts none of their draws.
    let order = ["lru", "lfu", "s3-fifo"][pick(3) as usize];
    if gpu_cache {
        let _ = writeln!(t, "gpu_eviction = \"{order}\"");
    }
    t
}

/// The store's keys of `[policy.mix]` (see [`composition_text`]), for `tiers` 1 (host
/// memory) or 2 (host memory and SSD).
fn store_keys(
    t: &mut String,
    pick: &mut dyn FnMut(u64) -> u64,
    tiers: u64,
    block: u64,
    block_mib: f64,
) {
    let per = [1, 2, 4, 8][pick(4) as usize];
    let chunk_mib = block_mib * per as f64;
    let scope = ["instance", "node", "cluster"][pick(3) as usize];
    let evict = |p: u64| ["lru", "gdsf", "lfu", "s3-fifo", "arc"][p as usize];
    let _ = write!(
        t,
        "tiers = {}\nscope = \"{scope}\"\ntensor_tokens = {}\nhost_capacity_gib = {:.9}\n\
         host_eviction = \"{}\"\nssd_eviction = \"{}\"\nreplica_eviction = \"{}\"\n\
         admission = \"{}\"\nconsolidate = {}\nload_overlap = \"{}\"\n",
        if tiers == 1 {
            "[\"host\"]"
        } else {
            "[\"host\", \"ssd\"]"
        },
        block * per,
        chunk_mib * (4 + pick(37)) as f64 / 1024.0,
        evict(pick(5)),
        evict(pick(5)),
        evict(pick(5)),
        ["always", "second-hit", "tinylfu"][pick(3) as usize],
        pick(2) == 0,
        ["none", "layerwise"][pick(2) as usize],
    );
    if tiers == 2 {
        let _ = writeln!(
            t,
            "ssd_capacity_gb = {:.9}",
            chunk_mib * (1 + pick(40)) as f64 * 1.048576 / 1024.0
        );
    }
    let after = if scope == "cluster" { pick(3) } else { 0 };
    let fraction = if after > 0 {
        [0.25, 0.5][pick(2) as usize]
    } else {
        0.0
    };
    let _ = writeln!(
        t,
        "replicate_after_reads = {after}\nreplica_fraction = {fraction}\nload = \"{}\"\n\
         remote_kv_path = \"{}\"",
        ["always", "when-faster"][pick(2) as usize],
        ["gpudirect", "host-staged", "host-pipelined"][pick(3) as usize]
    );
}

/// Half the time, a `[workload.reuse]` table (and then no `order`): few contexts, popularity
/// uniform or Zipf, sometimes a reuse distance, 1 to 3 turns. Returns the `order` line and the
/// table.
fn reuse_text(pick: &mut dyn FnMut(u64) -> u64, order: &str) -> (String, String) {
    if pick(2) == 0 {
        return (format!("order = \"{order}\"\n"), String::new());
    }
    let mut t = format!("\n[workload.reuse]\ncontexts = {}\n", 1 + pick(12));
    if pick(2) == 0 {
        let _ = writeln!(
            t,
            "popularity = \"zipf\"\nzipf_alpha = {:.1}",
            pick(25) as f64 / 10.0
        );
    }
    if pick(3) == 0 {
        let _ = writeln!(t, "reuse_distance = {}.0", pick(6));
    }
    if pick(2) == 0 {
        let _ = writeln!(t, "questions_per_context = {}", 1 + pick(4));
    }
    let _ = writeln!(
        t,
        "turns = {}\nturn_gap_s = {:.2}",
        1 + pick(3),
        pick(200) as f64 / 100.0
    );
    (String::new(), t)
}

/// The `[workload.output_tokens]` table of a VOPR scenario.
fn output_text(pick: &mut dyn FnMut(u64) -> u64) -> String {
    match pick(3) {
        0 => format!("distribution = \"fixed\"\ntokens = {}", 1 + pick(256)),
        1 => format!(
            "distribution = \"uniform\"\nmin = {}\nmax = {}",
            1 + pick(4),
            8 + pick(400)
        ),
        _ => format!(
            "distribution = \"lognormal\"\nmedian = {}.0\nsigma = 0.8\nmax = {}",
            8 + pick(120),
            128 + pick(512)
        ),
    }
}

/// Half the time, up to three random faults within the trace's span.
fn faults_text(pick: &mut dyn FnMut(u64) -> u64, nodes: u64, gpus: u64, span_ms: u64) -> String {
    let mut faults = String::new();
    if pick(2) == 0 {
        for _ in 0..1 + pick(3) {
            let node = pick(nodes);
            let at = format!("at_s = {:.3}", pick(span_ms) as f64 / 1000.0);
            let window = format!("for_s = {:.3}", (1 + pick(span_ms)) as f64 / 1000.0);
            let _ = match pick(4) {
                0 => writeln!(
                    faults,
                    "[[fault]]\nkind = \"node-crash\"\nnode = {node}\n{at}"
                ),
                1 => writeln!(
                    faults,
                    "[[fault]]\nkind = \"store-restart\"\nnode = {node}\n{at}"
                ),
                2 => writeln!(
                    faults,
                    "[[fault]]\nkind = \"link-slow\"\nnode = {node}\n{at}\n{window}\nfactor = {}",
                    [0.0, 0.1, 0.5][pick(3) as usize]
                ),
                _ => writeln!(
                    faults,
                    "[[fault]]\nkind = \"gpu-slow\"\nnode = {node}\ngpu = {}\n{at}\n{window}\nfactor = {}",
                    pick(gpus),
                    [0.05, 0.25, 0.5][pick(3) as usize]
                ),
            };
        }
    }
    faults
}

/// The bytes of a run's results: `requests.csv` and `summary.csv`.
fn results_bytes(r: &PolicyRun) -> Vec<u8> {
    let mut out = Vec::new();
    let records = [(None, r.policy.name(), r.report.records.as_slice())];
    // Writing into memory cannot fail.
    let _ = write_requests(&mut out, &records);
    let _ = write_summary(&mut out, std::slice::from_ref(&r.summary));
    out
}

/// Runs seed `seed`: every policy twice, invariants checked after every event.
pub fn run_seed(seed: u64) -> Result<SeedOutcome, SeedFailure> {
    let fail = |what: String| SeedFailure { seed, what };
    let text = scenario_text(seed);
    let file = format!("vopr_{seed}.toml");
    let s = Scenario::parse(&file, &format!("vopr_{seed}"), &text)
        .map_err(|e| fail(format!("the generated scenario is invalid: {e}")))?;
    let trace =
        Arc::new(crate::serving::build::trace(&s).map_err(|e| fail(format!("trace: {e}")))?);
    let mut out = SeedOutcome {
        seed,
        simulations: 0,
        events: 0,
        finished: 0,
        rejected: 0,
        failed: 0,
        failovers: 0,
        failed_loads: 0,
        faults: s.faults.len(),
        preemptions: 0,
        demoted: 0,
        dropped: 0,
        replicated: 0,
    };
    for policy in &s.policies {
        let mut bytes = Vec::with_capacity(2);
        for round in 0..2 {
            let r =
                crate::serving::sim::simulate_checked(&s, trace.clone(), policy, VOPR_CHECK_EVERY)
                    .map_err(|e| fail(format!("{}: {e}", policy.name())))?;
            out.simulations += 1;
            out.events += r.summary.events;
            if round == 0 {
                out.preemptions += r
                    .report
                    .instances
                    .iter()
                    .map(|i| i.preemptions)
                    .sum::<u64>();
                if let Some(st) = &r.report.store {
                    out.demoted += st.stats.demoted;
                    out.dropped += st.stats.dropped;
                    out.replicated += st.stats.replicated;
                }
                out.failovers += r.report.failovers;
                out.failed_loads += r.report.failed_loads;
                for rec in &r.report.records {
                    match (rec.completed(), rec.rejected, rec.failed.is_some()) {
                        (true, false, false) => out.finished += 1,
                        (false, true, false) => out.rejected += 1,
                        (false, false, true) => out.failed += 1,
                        _ => {
                            return Err(fail(format!(
                                "{}: request {} did not end exactly one way (finished, rejected or failed)",
                                policy.name(),
                                rec.id
                            )));
                        }
                    }
                }
            }
            bytes.push(results_bytes(&r));
        }
        if bytes[0] != bytes[1] {
            return Err(fail(format!(
                "{}: two simulations of one seed gave different results",
                policy.name()
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_gives_a_valid_scenario_and_the_same_text_twice() {
        for seed in 0..200 {
            let t = scenario_text(seed);
            assert_eq!(t, scenario_text(seed));
            if let Err(e) = Scenario::parse("v.toml", "v", &t) {
                panic!("seed {seed}: {e}\n{t}");
            }
        }
        assert_ne!(scenario_text(1), scenario_text(2));
    }
}
