//! The prefix store's bookkeeping alone: inserts/s and lookups/s with 1M stored tensors, and
//! memory per stored tensor. Run with `cargo bench --bench store`.
//!
//! Prompts are 50-tensor chains: groups of 100 prompts share their first 20 tensors (a shared
//! context), then diverge. 20,000 prompts give 20,000 x 30 + 200 x 20 = 604,000 tensors; the
//! run stores 34,000 prompts for just over 1M.

use std::hint::black_box;
use std::time::Instant;

use meshsim::hash::{ROOT_PARENT, block_hash};
use meshsim::rng::Stream;
use meshsim::serving::store::directory::{Directory, StoreParams, TensorId};
use meshsim::serving::store::eviction::Eviction;

fn prompt(j: u32) -> Vec<TensorId> {
    let mut parent = ROOT_PARENT;
    (0..50u32)
        .map(|i| {
            let sym = if i < 20 { j / 100 } else { j };
            parent = block_hash(parent, &[sym, i]);
            parent
        })
        .collect()
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let prompts: u32 = if quick { 2_000 } else { 34_000 };
    let params = StoreParams {
        nodes: 8,
        tensor_bytes: 32 << 20,
        host_capacity: 1 << 50,
        replica_capacity: 1 << 48,
        ssd_capacity: 1 << 50,
        eviction: Eviction::Gdsf,
        consolidate: true,
        replicate_after_reads: Some(2),
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.3,
        net_ns_per_byte: 0.04,
        recompute_base_ns: 1e7,
        recompute_per_index_ns: 1e5,
    };
    let chains: Vec<Vec<TensorId>> = (0..prompts).map(prompt).collect();
    let rss0 = rss_bytes();
    let mut d = Directory::new(params);
    let started = Instant::now();
    for (j, c) in chains.iter().enumerate() {
        d.insert(c, j as u32 % 8);
    }
    let insert_s = started.elapsed().as_secs_f64();
    let tensors = d.len();
    let rss = rss_bytes().saturating_sub(rss0);
    println!(
        "store: {tensors} tensors stored from {prompts} prompts: {:.2} M tensors inserted/s, {:.0} k prompt inserts/s; ~{} bytes of memory per tensor",
        tensors as f64 / insert_s / 1e6,
        prompts as f64 / insert_s / 1e3,
        if tensors > 0 { rss / tensors as u64 } else { 0 }
    );
    let mut rng = Stream::new(1, 1);
    let lookups = if quick { 10_000 } else { 500_000 };
    let mut rates = Vec::new();
    for _ in 0..if quick { 1 } else { 5 } {
        let started = Instant::now();
        for _ in 0..lookups {
            let j = rng.below(prompts as u64) as usize;
            let reader = rng.below(8) as u32;
            black_box(d.lookup(&chains[j], 0, reader));
        }
        rates.push(lookups as f64 / started.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    println!(
        "store: {:.0} k lookups/s of 50-tensor prompts ({:.1} M tensor ids walked/s), median of {} rounds",
        median / 1e3,
        median * 50.0 / 1e6,
        rates.len()
    );
    assert!(quick || tensors >= 1_000_000);
}
