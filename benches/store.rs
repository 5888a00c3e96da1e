//! The prefix store's bookkeeping alone ([`Directory`]): inserts/s and lookups/s with about
//! 1M stored tensors while eviction runs. Run with `cargo bench --bench store`
//! (`STORE_CAPACITY=N` sets the tensors held, 1,000,000 by default, and `STORE_OPS=N` the
//! timed operations, N/10 up to 20,000 by default); under `cargo test --benches` (no
//! `--bench` argument) it runs 4,000 tensors and checks that eviction ran.
//!
//! **Workload.** Prompts are 50-tensor chains: groups of 100 prompts share their first 20
//! tensors (a shared context), then diverge; a follow-up turn extends a prompt by 4 tensors.
//! Writers and readers are spread over 8 nodes.
//!
//! **Untimed fill.** Host memory holds 1/5 of the tensors and SSD 4/5, 1M in all by default
//! (8 nodes of 25,000 + 100,000). The fill stores prompts until 5% more tensors than that have
//! been stored, so every node's host memory and SSD are full: from then on every new tensor
//! demotes one to SSD and drops one from SSD. A line per case reports the fill.
//!
//! **Timed.** N prompt inserts (half a follow-up turn of a recent prompt, half a new prompt),
//! then N lookups of prompts drawn from all those stored so far (some whole, some partly or
//! wholly dropped). The bench prints each phase's rate with the directory's counters over it
//! (`Directory::stats`: demoted, dropped, replicas added and evicted, refused) and the stored
//! tensors (`Directory::len`) at its start and end, to show what was measured. Cases: LRU,
//! GDSF, and GDSF with replication (a replica cache of 1/10 of host memory; a lookup that asks
//! for replicas gets them with `Directory::add_replicas`, timed with the lookups).

use std::hint::black_box;
use std::time::Instant;

use meshsim::hash::{ROOT_PARENT, block_hash};
use meshsim::metrics::StoreStats;
use meshsim::rng::Stream;
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, StoreParams, TensorId};
use meshsim::serving::store::eviction::Eviction;

const NODES: u32 = 8;
const GROUP: u32 = 100;
const CONTEXT: u32 = 20;
const OWN: u32 = 30;
const TURN: u32 = 4;
/// Tensor size: only the ratios of the capacities to it matter here.
const BYTES: u64 = 32 << 20;

/// Sizes of one run.
struct Scale {
    /// Host memory + SSD of all nodes, in tensors.
    capacity: u64,
    /// Timed inserts, and timed lookups.
    ops: usize,
    /// Follow-up turns pick from this many most recent prompts.
    recent: u32,
}

/// A prompt: base prompt `j` followed by `turns` follow-up turns.
fn chain(j: u32, turns: u32) -> Vec<TensorId> {
    let mut parent = ROOT_PARENT;
    let mut ids = Vec::with_capacity((CONTEXT + OWN + turns * TURN) as usize);
    for i in 0..CONTEXT + OWN {
        let sym = if i < CONTEXT { j / GROUP } else { j };
        parent = block_hash(parent, &[sym, i]);
        ids.push(parent);
    }
    for t in 0..turns * TURN {
        parent = block_hash(parent, &[j, 1_000 + t]);
        ids.push(parent);
    }
    ids
}

fn params(scale: &Scale, eviction: Eviction, replicas: bool) -> StoreParams {
    let per_node = scale.capacity / NODES as u64;
    let host = per_node / 5;
    StoreParams {
        nodes: NODES,
        tensor_bytes: BYTES,
        host_capacity: host * BYTES,
        replica_capacity: if replicas { host / 10 * BYTES } else { 0 },
        ssd_capacity: (per_node - host) * BYTES,
        eviction: TierEviction::all(eviction),
        admission: Admission::Always,
        consolidate: true,
        replicate_after_reads: replicas.then_some(2),
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.3,
        net_ns_per_byte: 0.04,
        recompute_base_ns: 1e7,
        recompute_per_index_ns: 1e5,
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// What changed in the counters over a phase.
fn delta(after: &StoreStats, before: &StoreStats) -> StoreStats {
    StoreStats {
        stored: after.stored - before.stored,
        demoted: after.demoted - before.demoted,
        dropped: after.dropped - before.dropped,
        replicated: after.replicated - before.replicated,
        replicas_evicted: after.replicas_evicted - before.replicas_evicted,
        refused: after.refused - before.refused,
        not_admitted: after.not_admitted - before.not_admitted,
        lost: after.lost - before.lost,
    }
}

fn counters(s: &StoreStats, len0: usize, len1: usize) -> String {
    format!(
        "stored {} tensors, demoted {}, dropped {}, replicas added {} / evicted {}, refused {}; {len0} -> {len1} tensors held",
        s.stored, s.demoted, s.dropped, s.replicated, s.replicas_evicted, s.refused
    )
}

/// Figures of one case, for the checks of the quick mode.
struct Outcome {
    insert_rate: f64,
    lookup_rate: f64,
    inserts: StoreStats,
    len_before: usize,
    len_after: usize,
}

fn case(name: &str, scale: &Scale, eviction: Eviction, replicas: bool, seed: u64) -> Outcome {
    let mut rng = Stream::new(seed, 1);
    // Memory is measured in the first case only: later ones reuse the freed pages.
    let first = seed == 1;
    let rss0 = rss_bytes();
    let mut d = Directory::new(params(scale, eviction, replicas));
    // Follow-up turns of each base prompt so far.
    let mut turns: Vec<u32> = Vec::new();
    let fill_started = Instant::now();
    let target = scale.capacity + scale.capacity / 20;
    while d.stats.stored < target {
        let j = turns.len() as u32;
        d.insert(&chain(j, 0), j % NODES);
        turns.push(0);
        if replicas && j.is_multiple_of(4) {
            // Remote reads, so that replicas exist when the timed phase starts.
            let reader = rng.below(NODES as u64) as u32;
            let r = rng.below(j as u64 + 1) as u32;
            let plan = d.lookup(&chain(r, 0), 0, reader);
            if !plan.replicate.is_empty() {
                d.add_replicas(reader, &plan.replicate);
            }
        }
    }
    let fill_s = fill_started.elapsed().as_secs_f64();
    let rss = rss_bytes().saturating_sub(rss0);
    let memory = if first {
        format!(
            ", ~{} B of memory per held tensor",
            rss / d.len().max(1) as u64
        )
    } else {
        String::new()
    };
    println!(
        "  {name}: filled in {fill_s:.1} s ({} prompts, {} tensors stored, {} held{memory})",
        turns.len(),
        d.stats.stored,
        d.len(),
    );

    // The timed inserts, prepared beforehand.
    let mut writes: Vec<(Vec<TensorId>, u32)> = Vec::with_capacity(scale.ops);
    for k in 0..scale.ops {
        let j = if k.is_multiple_of(2) {
            let n = turns.len() as u32;
            let j = n - 1 - rng.below(scale.recent.min(n) as u64) as u32;
            turns[j as usize] += 1;
            j
        } else {
            turns.push(0);
            turns.len() as u32 - 1
        };
        let owner = rng.below(NODES as u64) as u32;
        writes.push((chain(j, turns[j as usize]), owner));
    }
    let (before, len_before) = (d.stats, d.len());
    let started = Instant::now();
    let mut new_tensors = 0u64;
    for (c, owner) in &writes {
        new_tensors += black_box(d.insert(c, *owner)).new_tensors as u64;
    }
    let insert_s = started.elapsed().as_secs_f64();
    let inserts = delta(&d.stats, &before);
    let len_after = d.len();
    let insert_rate = scale.ops as f64 / insert_s;
    println!(
        "    {:>9.0} prompt inserts/s ({:.0} new tensors/s): {}",
        insert_rate,
        new_tensors as f64 / insert_s,
        counters(&inserts, len_before, len_after)
    );
    drop(writes);

    let lookup_rate = time_lookups(&mut d, scale, &mut rng, &turns);
    Outcome {
        insert_rate,
        lookup_rate,
        inserts,
        len_before,
        len_after,
    }
}

/// Times `scale.ops` lookups of prompts drawn from those stored (`turns` follow-ups of each),
/// by random readers, replicating where the plan asks; prints and returns lookups/s.
fn time_lookups(d: &mut Directory, scale: &Scale, rng: &mut Stream, turns: &[u32]) -> f64 {
    let reads: Vec<(Vec<TensorId>, u32)> = (0..scale.ops)
        .map(|_| {
            let j = rng.below(turns.len() as u64) as u32;
            let reader = rng.below(NODES as u64) as u32;
            (chain(j, turns[j as usize]), reader)
        })
        .collect();
    let (before, len0) = (d.stats, d.len());
    let started = Instant::now();
    let (mut asked, mut found) = (0u64, 0u64);
    for (c, reader) in &reads {
        let plan = d.lookup(c, 0, *reader);
        asked += c.len() as u64;
        found += plan.stored_chunks as u64;
        if !plan.replicate.is_empty() {
            d.add_replicas(*reader, &plan.replicate);
        }
        black_box(plan);
    }
    let lookup_s = started.elapsed().as_secs_f64();
    let lookup_rate = scale.ops as f64 / lookup_s;
    println!(
        "    {:>9.0} lookups/s ({:.0}% of the asked tensors stored): {}",
        lookup_rate,
        100.0 * found as f64 / asked as f64,
        counters(&delta(&d.stats, &before), len0, d.len())
    );
    lookup_rate
}

fn main() {
    // `cargo test --benches` runs benches without `--bench`: a small, checked run then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let capacity = env("STORE_CAPACITY", if quick { 4_000 } else { 1_000_000 });
    let scale = Scale {
        capacity,
        ops: env("STORE_OPS", (capacity / 10).min(20_000)) as usize,
        recent: (capacity / 500).max(20) as u32,
    };
    println!(
        "store: {} nodes, {} tensors of host memory + SSD in all (1/5 host), {} timed prompt inserts and lookups",
        NODES, scale.capacity, scale.ops
    );
    let cases = [
        ("LRU", Eviction::Lru, false),
        ("GDSF", Eviction::Gdsf, false),
        ("GDSF + replication", Eviction::Gdsf, true),
    ];
    for (k, (name, eviction, replicas)) in cases.into_iter().enumerate() {
        let o = case(name, &scale, eviction, replicas, k as u64 + 1);
        // What the bench claims to measure: a full store where inserts demote and drop.
        assert!(o.insert_rate.is_finite() && o.insert_rate > 0.0);
        assert!(o.lookup_rate.is_finite() && o.lookup_rate > 0.0);
        assert!(
            o.inserts.demoted > 0 && o.inserts.dropped > 0,
            "{name}: no eviction"
        );
        for len in [o.len_before, o.len_after] {
            assert!(
                len as u64 <= scale.capacity && len as u64 >= scale.capacity * 9 / 10,
                "{name}: {len} tensors held, capacity {}",
                scale.capacity
            );
        }
    }
}
