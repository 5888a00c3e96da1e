//! Metrics, defined once and written the same way by every host (DESIGN contract 7).
//!
//! Per request (times measured at the router, i.e. as the client sees them):
//!
//! * `queue   = admitted - arrival` (first admission: blocks allocated, store loads started)
//! * `ttft    = first_token - arrival`
//! * `tpot    = (end - first_token) / (output_tokens - 1)`, undefined for one-token outputs
//! * `e2e     = end - arrival`
//! * `reused_<tier>_tokens`: prompt tokens whose KV came from that tier instead of being
//!   computed, at the request's first admission
//! * `loaded_<tier>_bytes`: KV bytes loaded from that tier of the prefix store
//! * `network_bytes`: bytes of the request and its response on the network (token ids)
//!
//! Per policy, over completed requests: mean and nearest-rank percentiles
//! (`p_q = sorted[ceil(q/100 x n) - 1]`) of TTFT, TPOT, E2E and queueing delay;
//! `duration = last end - first arrival`; throughput `completed / duration` and
//! `output tokens / duration`; prefix-hit ratio `sum reused tokens / sum prompt tokens`.
//!
//! Per policy, of the whole run (simulations only; see [`crate::hardware::network::LinkLoad`]):
//! the bytes that crossed each kind of link by purpose, the bytes moved per purpose, and each
//! kind's busy fraction (mean over its links, and its busiest link) and mean rate per link;
//! `network_bytes` is then every byte that crossed a NIC.

mod stats;
mod tier;
pub mod write;

pub use stats::{InstanceStats, PoolStats, StoreReport, StoreStats};
pub use tier::Tier;

use crate::hardware::network::{LinkKind, LinkLoad};
use crate::units::Nanos;

/// Everything recorded about one request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestRecord {
    pub id: u32,
    pub arrival: Nanos,
    pub instance: u32,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub admitted: Option<Nanos>,
    pub first_token: Option<Nanos>,
    pub end: Option<Nanos>,
    pub reused: [u32; Tier::ALL.len()],
    pub loaded_bytes: [u64; Tier::ALL.len()],
    pub preemptions: u32,
    pub network_bytes: u64,
    pub rejected: bool,
    /// Why the request failed (a fault), if it did; not a column of `requests.csv`, whose
    /// `status` says `failed`.
    pub failed: Option<String>,
}

impl RequestRecord {
    /// A request of `prompt_tokens` that will generate `output_tokens`, arrived and nothing
    /// more.
    pub fn new(id: u32, arrival: Nanos, prompt_tokens: u32, output_tokens: u32) -> RequestRecord {
        RequestRecord {
            output_tokens,
            ..RequestRecord::arrived(id, arrival, prompt_tokens)
        }
    }

    /// A request that has arrived and nothing more: no instance, no tokens yet.
    pub fn arrived(id: u32, arrival: Nanos, prompt_tokens: u32) -> RequestRecord {
        RequestRecord {
            id,
            arrival,
            instance: u32::MAX,
            prompt_tokens,
            output_tokens: 0,
            admitted: None,
            first_token: None,
            end: None,
            reused: [0; Tier::ALL.len()],
            loaded_bytes: [0; Tier::ALL.len()],
            preemptions: 0,
            network_bytes: 0,
            rejected: false,
            failed: None,
        }
    }

    /// Its `status` in `requests.csv`: `failed`, `rejected`, `ok` (completed) or
    /// `unfinished`.
    pub fn status(&self) -> &'static str {
        if self.failed.is_some() {
            "failed"
        } else if self.rejected {
            "rejected"
        } else if self.completed() {
            "ok"
        } else {
            "unfinished"
        }
    }

    pub fn completed(&self) -> bool {
        self.end.is_some()
    }
    pub fn queue(&self) -> Option<Nanos> {
        Some(self.admitted? - self.arrival)
    }
    pub fn ttft(&self) -> Option<Nanos> {
        Some(self.first_token? - self.arrival)
    }
    pub fn tpot(&self) -> Option<Nanos> {
        if self.output_tokens < 2 {
            return None;
        }
        Some(Nanos(
            (self.end? - self.first_token?).0 / (self.output_tokens as u64 - 1),
        ))
    }
    pub fn e2e(&self) -> Option<Nanos> {
        Some(self.end? - self.arrival)
    }
    pub fn reused_tokens(&self) -> u64 {
        self.reused.iter().map(|&t| t as u64).sum()
    }
}

/// What the actors of one run report at its end (serializable: the nodes of a run across
/// processes send theirs to the coordinator, `crate::live::cluster`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub records: Vec<RequestRecord>,
    pub instances: Vec<InstanceStats>,
    /// What the prefix store did, under store policies.
    pub store: Option<StoreReport>,
    /// Broken invariants; a run with any is an error.
    pub violations: Vec<String>,
    /// Pipeline runs: the tokens each completed request generated, by request id (not
    /// written to the CSV files; for comparing hosts and backends).
    pub outputs: Vec<(u32, Vec<u32>)>,
    /// Live serving runs: the logits of each completed request's first token, by request id
    /// (to check that prefix reuse does not change the output).
    pub first_logits: Vec<(u32, Vec<f32>)>,
    /// Requests the router sent to another instance after theirs crashed (faults); pipeline
    /// sessions the head started over after a shard was lost with its process.
    pub failovers: u64,
    /// Load groups that failed because their source lost its memory (faults).
    pub failed_loads: u64,
}

impl Report {
    /// Adds `part` (one actor's report, or one host's) to this report. Both hosts build a
    /// run's report with this one function, so a field added later cannot be lost on one.
    pub fn merge(&mut self, part: Report) {
        let Report {
            records,
            instances,
            store,
            violations,
            outputs,
            first_logits,
            failovers,
            failed_loads,
        } = part;
        self.first_logits.extend(first_logits);
        self.failovers += failovers;
        self.failed_loads += failed_loads;
        // Moved, not copied, into a report that has none yet (the usual case: the host's
        // report takes the router's records, hundreds of MiB at cluster scale, whose copy was
        // a fresh allocation's page faults and a pass over all of them).
        if self.records.is_empty() {
            self.records = records;
        } else {
            self.records.extend(records);
        }
        self.instances.extend(instances);
        if store.is_some() {
            self.store = store;
        }
        self.violations.extend(violations);
        self.outputs.extend(outputs);
    }
}

/// Mean and percentiles of a set of durations, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Dist {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// The nearest-rank percentile `q` (0-100] of a sorted, non-empty slice:
/// `sorted[ceil(q/100 x n) - 1]`.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> T {
    let n = sorted.len();
    sorted[((q / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1]
}

impl Dist {
    /// The mean and nearest-rank percentiles of `v`, in milliseconds. The same numbers as
    /// sorting `v` and summing it in order, without sorting when that changes nothing: the
    /// percentiles are selected (three partitions, not a sort of a run's every request), and
    /// the sum of integers below 2^53 is exact in `f64` in any order.
    pub fn of(mut v: Vec<Nanos>) -> Dist {
        if v.is_empty() {
            return Dist::default();
        }
        let n = v.len();
        let total: u128 = v.iter().map(|d| u128::from(d.0)).sum();
        let sum = if total < 1 << f64::MANTISSA_DIGITS {
            total as f64
        } else {
            // Partial sums may round: sum in sorted order, so that the bits do not depend
            // on the order the values came in.
            v.sort_unstable();
            v.iter().map(|d| d.0 as f64).sum::<f64>()
        };
        let rank = |q: f64| ((q / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1;
        let mut picked = [0.0; 3];
        let mut from = 0;
        for (out, q) in picked.iter_mut().zip([50.0, 90.0, 99.0]) {
            // Ranks grow with `q`; everything left of `from` is at most the previous pick.
            let k = rank(q);
            let (_, nth, _) = v[from..].select_nth_unstable(k - from);
            *out = nth.as_ms_f64();
            from = k;
        }
        Dist {
            mean: sum / n as f64 / 1e6,
            p50: picked[0],
            p90: picked[1],
            p99: picked[2],
        }
    }
}

/// The summary of one policy's run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// The sweep point, when the scenario sweeps parameters.
    pub point: Option<String>,
    pub policy: String,
    pub requests: u64,
    pub completed: u64,
    pub rejected: u64,
    pub duration: Nanos,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    pub ttft: Dist,
    pub tpot: Dist,
    pub e2e: Dist,
    pub queue: Dist,
    pub prefix_hit_ratio: f64,
    pub reused_tokens: [u64; Tier::ALL.len()],
    pub loaded_bytes: [u64; Tier::ALL.len()],
    pub prompt_tokens: u64,
    pub preemptions: u64,
    pub gpu_block_evictions: u64,
    pub gpu_busy_ratio: f64,
    /// Bytes that crossed NICs: every purpose's when the run models links ([`Self::links`]),
    /// otherwise the requests' own (token ids to and from the frontend).
    pub network_bytes: u64,
    pub store: Option<StoreReport>,
    pub events: u64,
    /// What each kind of link carried and how busy it was, when the run models links (a
    /// simulation; a live run does not).
    pub links: Option<LinkLoad>,
    /// The best hit ratio any GPU prefix cache could have reached on this run's sequence of
    /// prompts (`crate::serving::optimal`), when computed.
    pub gpu_optimal_hit_ratio: Option<f64>,
}

impl Summary {
    /// Prompt tokens reused from the GPU's own prefix cache over prompt tokens.
    pub fn gpu_hit_ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            return 0.0;
        }
        self.reused_tokens[Tier::Gpu as usize] as f64 / self.prompt_tokens as f64
    }
}

impl Summary {
    pub fn new(policy: &str, report: &Report, events: u64) -> Summary {
        // One pass over the records (a run's are tens of megabytes, cold by now): sums are
        // of integers, and a distribution does not depend on the order of its values.
        let mut first_arrival: Option<Nanos> = None;
        let mut last_end: Option<Nanos> = None;
        let (mut completed, mut rejected, mut network_bytes) = (0u64, 0u64, 0u64);
        let (mut prompt_tokens, mut output_tokens) = (0u64, 0u64);
        let mut reused_tokens = [0u64; Tier::ALL.len()];
        let mut loaded_bytes = [0u64; Tier::ALL.len()];
        let [mut ttft, mut tpot, mut e2e, mut queue] =
            [(); 4].map(|_| Vec::with_capacity(report.records.len()));
        for r in &report.records {
            first_arrival = Some(first_arrival.map_or(r.arrival, |a| a.min(r.arrival)));
            rejected += u64::from(r.rejected);
            network_bytes += r.network_bytes;
            let Some(end) = r.end else {
                continue;
            };
            last_end = Some(last_end.map_or(end, |e| e.max(end)));
            completed += 1;
            for (t, &n) in reused_tokens.iter_mut().zip(&r.reused) {
                *t += n as u64;
            }
            for (t, &n) in loaded_bytes.iter_mut().zip(&r.loaded_bytes) {
                *t += n;
            }
            prompt_tokens += r.prompt_tokens as u64;
            output_tokens += r.output_tokens as u64;
            for (dist, value) in [
                (&mut ttft, r.ttft()),
                (&mut tpot, r.tpot()),
                (&mut e2e, r.e2e()),
                (&mut queue, r.queue()),
            ] {
                dist.extend(value);
            }
        }
        let duration = match (first_arrival, last_end) {
            (Some(a), Some(e)) => e - a,
            _ => Nanos::ZERO,
        };
        let secs = duration.as_secs_f64();
        let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let busy: u64 = report.instances.iter().map(|s| s.busy.0).sum();
        let capacity = duration.0 as f64 * report.instances.len() as f64;
        Summary {
            point: None,
            policy: policy.to_string(),
            requests: report.records.len() as u64,
            completed,
            rejected,
            duration,
            throughput_rps: per_s(completed as f64),
            output_tokens_per_s: per_s(output_tokens as f64),
            ttft: Dist::of(ttft),
            tpot: Dist::of(tpot),
            e2e: Dist::of(e2e),
            queue: Dist::of(queue),
            prefix_hit_ratio: if prompt_tokens > 0 {
                reused_tokens.iter().sum::<u64>() as f64 / prompt_tokens as f64
            } else {
                0.0
            },
            reused_tokens,
            loaded_bytes,
            prompt_tokens,
            preemptions: report.instances.iter().map(|s| s.preemptions).sum(),
            gpu_block_evictions: report.instances.iter().map(|s| s.pool.evictions).sum(),
            gpu_busy_ratio: if capacity > 0.0 {
                busy as f64 / capacity
            } else {
                0.0
            },
            network_bytes,
            store: report.store,
            events,
            links: None,
            gpu_optimal_hit_ratio: None,
        }
    }

    /// This summary with what the run's links carried: `network_bytes` becomes the bytes
    /// that crossed NICs.
    pub fn with_links(mut self, links: LinkLoad) -> Summary {
        self.network_bytes = links.kind_bytes(LinkKind::Nic);
        self.links = Some(links);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Nanos> = (1..=100).map(|i| Nanos(i * 1_000_000)).collect();
        let d = Dist::of(v);
        assert_eq!((d.p50, d.p90, d.p99), (50.0, 90.0, 99.0));
        assert_eq!(d.mean, 50.5);
        let one = Dist::of(vec![Nanos(3_000_000)]);
        assert_eq!((one.p50, one.p99, one.mean), (3.0, 3.0, 3.0));
        assert_eq!(Dist::of(vec![]), Dist::default());
    }

    /// A reference that sorts every list: `Dist::of`'s selections and its exact sum must give
    /// the same bits, for small sums and for sums whose partial sums round.
    #[test]
    fn selected_percentiles_and_exact_sums_match_a_sorted_list() {
        let sorted_dist = |mut v: Vec<Nanos>| {
            v.sort_unstable();
            let pct = |q: f64| nearest_rank(&v, q).as_ms_f64();
            Dist {
                mean: v.iter().map(|d| d.0 as f64).sum::<f64>() / v.len() as f64 / 1e6,
                p50: pct(50.0),
                p90: pct(90.0),
                p99: pct(99.0),
            }
        };
        let mut rng = crate::rng::Stream::new(7, 0);
        for case in 0..400 {
            let n = 1 + rng.below(300) as usize;
            // Some lists sum past 2^53 (the sorted sum rounds there), some hold repeats.
            let top: u64 = match case % 4 {
                0 => 10,
                1 => 1_000_000_000,
                2 => 1 << 50,
                _ => u64::MAX >> 8,
            };
            let v: Vec<Nanos> = (0..n).map(|_| Nanos(rng.below(top))).collect();
            let want = sorted_dist(v.clone());
            let got = Dist::of(v);
            assert_eq!(
                (got.mean.to_bits(), got.p50, got.p90, got.p99),
                (want.mean.to_bits(), want.p50, want.p90, want.p99),
                "case {case}, {n} values below {top}"
            );
        }
    }

    #[test]
    fn tpot_spreads_the_decode_time_over_the_tokens_after_the_first() {
        let mut r = RequestRecord {
            id: 0,
            arrival: Nanos(100),
            instance: 0,
            prompt_tokens: 10,
            output_tokens: 5,
            admitted: Some(Nanos(150)),
            first_token: Some(Nanos(1_100)),
            end: Some(Nanos(5_100)),
            reused: [0; 5],
            loaded_bytes: [0; 5],
            preemptions: 0,
            network_bytes: 0,
            rejected: false,
            failed: None,
        };
        assert_eq!(r.ttft(), Some(Nanos(1_000)));
        assert_eq!(r.tpot(), Some(Nanos(1_000)));
        assert_eq!(r.e2e(), Some(Nanos(5_000)));
        assert_eq!(r.queue(), Some(Nanos(50)));
        r.output_tokens = 1;
        assert_eq!(r.tpot(), None);
    }
}
