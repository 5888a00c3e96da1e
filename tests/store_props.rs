//! Property tests of the prefix store's bookkeeping ([`Directory`]): random sequences of
//! inserts, lookups and replications on random capacities and replica shares (0 included),
//! checked after every step: the directory's full invariant check (each cache within its
//! share, counters and queues agree with the tensors, replicas of other nodes' tensors), the
//! stored prefix against brute force, and that the owned cache and the replica cache never
//! evict from each other.

mod common;

use std::collections::BTreeSet;

use common::chain;
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, StoreEvent, StoreParams, TensorId};
use meshsim::serving::store::eviction::Eviction;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Debug, Clone)]
enum Op {
    Insert {
        prompt: Vec<u8>,
        node: u32,
    },
    Lookup {
        prompt: Vec<u8>,
        skip: usize,
        reader: u32,
    },
}

fn op(nodes: u32) -> impl Strategy<Value = Op> {
    // A 3-symbol alphabet and short prompts make shared and divergent prefixes common.
    let prompt = prop::collection::vec(0u8..3, 1..8);
    prop_oneof![
        (prompt.clone(), 0..nodes).prop_map(|(prompt, node)| Op::Insert { prompt, node }),
        (prompt, 0usize..3, 0..nodes).prop_map(|(prompt, skip, reader)| Op::Lookup {
            prompt,
            skip,
            reader
        }),
    ]
}

fn params() -> impl Strategy<Value = StoreParams> {
    (
        1u32..4,
        1u64..8,
        // The replica cache's share of host memory, in eighths: 0 (EvoStore) to all of it.
        0u64..=8,
        0u64..6,
        prop::bool::ANY,
        prop::bool::ANY,
        0u32..3,
    )
        .prop_map(
            |(nodes, host, eighths, ssd, gdsf, consolidate, after)| StoreParams {
                nodes,
                tensor_bytes: 10,
                host_capacity: host * 10,
                // Not always a whole number of tensors, nor is the owned rest.
                replica_capacity: host * 10 * eighths / 8,
                ssd_capacity: ssd * 10,
                eviction: TierEviction::all(if gdsf { Eviction::Gdsf } else { Eviction::Lru }),
                admission: Admission::Always,
                consolidate,
                replicate_after_reads: (after > 0).then_some(after),
                host_ns_per_byte: 0.04,
                ssd_ns_per_byte: 0.3,
                net_ns_per_byte: 0.05,
                recompute_base_ns: 1e6,
                recompute_per_index_ns: 2e4,
            },
        )
}

/// The stored prefix of `query`, by brute force: rebuild every stored tensor's full chain by
/// walking parents and keep the longest that is a prefix of the query.
fn brute_force_lcp(d: &Directory, query: &[TensorId]) -> usize {
    d.ids()
        .into_iter()
        .map(|id| d.path_to(id))
        .filter(|path| path.len() <= query.len() && query[..path.len()] == path[..])
        .map(|path| path.len())
        .max()
        .unwrap_or(0)
}

/// `cases` cases, and failures kept in `tests/store_props.proptest-regressions` (committed):
/// proptest replays the seeds of that file before any new case, and adds the seed of every new
/// failure to it.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn store_invariants_hold_after_every_step(
        (p, ops) in params().prop_flat_map(|p| {
            let n = p.nodes;
            (Just(p), prop::collection::vec(op(n), 1..60))
        })
    ) {
        let mut d = Directory::new(p);
        d.events = Some(Vec::new());
        // What must be stored: every stored tensor, less what a modelled eviction dropped.
        let mut expected: BTreeSet<TensorId> = BTreeSet::new();
        for op in ops {
            let nodes = d.params().nodes;
            let replicas_before: Vec<Vec<TensorId>> = (0..nodes).map(|n| d.replicas_on(n)).collect();
            let usage_before: Vec<(u64, u64, u64)> = (0..nodes).map(|n| d.usage(n)).collect();
            let mut replicated = false;
            match op {
                Op::Insert { prompt, node } => {
                    d.insert(&chain(&prompt), node);
                }
                Op::Lookup { prompt, skip, reader } => {
                    let q = chain(&prompt);
                    let plan = d.lookup(&q, skip, reader);
                    prop_assert_eq!(plan.stored_chunks as usize, brute_force_lcp(&d, &q));
                    let loaded: u32 = plan.groups.iter().map(|g| g.tensors).sum();
                    prop_assert_eq!(loaded as usize, (plan.stored_chunks as usize).saturating_sub(skip));
                    if !plan.replicate.is_empty() {
                        d.add_replicas(reader, &plan.replicate);
                        replicated = true;
                    }
                }
            }
            if let Err(e) = d.check() {
                prop_assert!(false, "{}", e);
            }
            let events = d.events.replace(Vec::new()).unwrap();
            for e in &events {
                match *e {
                    StoreEvent::Stored { id, .. } => {
                        expected.insert(id);
                    }
                    StoreEvent::Dropped { id, .. } => {
                        expected.remove(&id);
                    }
                    StoreEvent::ReplicaEvicted { .. } => {
                        prop_assert!(replicated, "making room for owned tensors evicted a replica");
                    }
                    StoreEvent::Demoted { .. } => {
                        prop_assert!(!replicated, "making room for replicas demoted a tensor");
                    }
                    _ => {}
                }
            }
            if replicated {
                // Adding replicas moved no owned tensor on any node.
                for n in 0..nodes {
                    let (owned, _, ssd) = d.usage(n);
                    let (owned0, _, ssd0) = usage_before[n as usize];
                    prop_assert_eq!((owned, ssd), (owned0, ssd0), "node {}", n);
                }
            } else {
                // Replicas only leave with the tensors they copy.
                for n in 0..nodes {
                    let kept: Vec<TensorId> = replicas_before[n as usize]
                        .iter()
                        .copied()
                        .filter(|&id| d.contains(id))
                        .collect();
                    prop_assert_eq!(d.replicas_on(n), kept, "node {}", n);
                }
            }
            prop_assert_eq!(d.ids(), expected.iter().copied().collect::<Vec<_>>());
        }
    }
}

/// The property test's configuration finds the committed regressions file, where the runner
/// looks for it (next to this file, named after it), so its seeds run first on every
/// `cargo test`.
#[test]
fn the_committed_regression_seeds_are_replayed() {
    let seeds = config(1)
        .failure_persistence
        .expect("failures are persisted")
        .load_persisted_failures2(Some(file!()));
    let seeds: Vec<String> = seeds.iter().map(ToString::to_string).collect();
    assert!(
        seeds
            .iter()
            .any(|s| s.contains("beae5bf68d80095168571a5d6e4609e8")),
        "tests/store_props.proptest-regressions is not read (seeds found: {seeds:?}); \
         it must lie next to tests/store_props.rs"
    );
}

/// The case the committed seed shrank to, kept as a plain test so that it runs whatever the
/// strategies become: a second prompt on a one-node store with room for one tensor in host
/// memory and one on SSD.
#[test]
fn the_committed_regression_case_keeps_the_store_consistent() {
    let mut d = Directory::new(StoreParams {
        nodes: 1,
        tensor_bytes: 10,
        host_capacity: 10,
        replica_capacity: 0,
        ssd_capacity: 10,
        eviction: TierEviction::all(Eviction::Lru),
        admission: Admission::Always,
        consolidate: false,
        replicate_after_reads: None,
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.3,
        net_ns_per_byte: 0.05,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 2e4,
    });
    for prompt in [&[0u8][..], &[1, 0]] {
        d.insert(&chain(prompt), 0);
        d.check().unwrap();
        let q = chain(prompt);
        assert_eq!(
            d.lookup(&q, 0, 0).stored_chunks as usize,
            brute_force_lcp(&d, &q)
        );
    }
}
