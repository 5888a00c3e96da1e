//! The best hit ratio any GPU prefix cache could have reached in a run, beside the one it did
//! reach: `gpu_optimal_hit_ratio` in `summary.csv`.
//!
//! Each instance's GPU cache sees the prompts of the requests routed to it, in the order it
//! admitted them. Over that sequence of blocks (full blocks of the instance's block size, as
//! the GPU cache keeps them), Belady's rule with bypass for a cache of the instance's whole KV
//! memory (`num_blocks x block_size` tokens) bounds from above the prefix hits of every
//! eviction order with that memory ([`crate::workload::optimal`] says why and is tested
//! against a brute-force optimum). The ratio is the bound's hit tokens over the instances,
//! divided by the prompt tokens, both over the completed requests, as the summary's
//! `reused_gpu_tokens` is. It is an upper bound for the run's own routing and admission order:
//! another router would give another sequence and another bound. A real cache holds less than
//! its whole memory (running sequences take blocks), so the gap to the bound is an upper bound
//! on what a better eviction order could gain, not a promise.
//!
//! Bounded: runs with more than [`MAX_OPTIMAL_ACCESSES`] block accesses are left without the
//! figure (an empty cell), since the bound takes memory and time in proportion to them.

use crate::metrics::RequestRecord;
use crate::workload::optimal::optimal_hit_tokens;
use crate::workload::{ReqId, Trace};

/// Most block accesses a run's bound is computed over (about 0.8 GiB of working memory at
/// 24 bytes an access): `polaris_32gpu` has ~4.7 million, `polaris_full` ~230 million.
pub const MAX_OPTIMAL_ACCESSES: u64 = 1 << 25;

/// The bound's hit ratio for a run of `instances` instances whose KV memory holds
/// `capacity_tokens` tokens each in blocks of `block_size` tokens, from the run's `records`;
/// `None` when no request completed or the run has more than [`MAX_OPTIMAL_ACCESSES`] accesses.
pub fn gpu_optimal_hit_ratio(
    trace: &Trace,
    records: &[RequestRecord],
    instances: u32,
    block_size: u32,
    capacity_tokens: u64,
) -> Option<f64> {
    let bs = block_size.max(1);
    let done = || {
        records
            .iter()
            .filter(|r| r.end.is_some() && (r.instance as u64) < instances as u64)
    };
    let accesses: u64 = done().map(|r| (r.prompt_tokens / bs) as u64).sum();
    let prompt_tokens: u64 = done().map(|r| r.prompt_tokens as u64).sum();
    if prompt_tokens == 0 {
        return None;
    }
    if accesses > MAX_OPTIMAL_ACCESSES {
        tracing::info!(
            accesses,
            limit = MAX_OPTIMAL_ACCESSES,
            "too many block accesses for the GPU cache's optimal hit ratio; left empty"
        );
        return None;
    }
    // Each instance's completed requests in the order it admitted them.
    let mut by_instance: Vec<Vec<(u64, u32)>> = vec![Vec::new(); instances as usize];
    for r in done() {
        let admitted = r.admitted.map_or(r.arrival.0, |a| a.0);
        by_instance[r.instance as usize].push((admitted, r.id));
    }
    let mut hits = 0u64;
    let (mut seq, mut hashes) = (Vec::new(), Vec::new());
    for mut requests in by_instance {
        requests.sort_unstable();
        seq.clear();
        for (_, id) in requests {
            trace.block_hashes(ReqId(id), bs as usize, &mut hashes);
            seq.extend(hashes.iter().map(|&h| (h, bs)));
        }
        hits += optimal_hit_tokens(&seq, capacity_tokens);
    }
    Some(hits as f64 / prompt_tokens as f64)
}
