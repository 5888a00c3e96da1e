//! Consolidation (PTStore's `consolidate`): a prefix stored in increments by one node is one
//! contiguous region with it, so a load of the whole prefix gathers one segment instead of
//! one per increment, and pays `store.fetch_segment_overhead_us` once.

mod common;

use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, StoreParams};
use meshsim::serving::store::eviction::Eviction;

fn directory(consolidate: bool) -> Directory {
    Directory::new(StoreParams {
        nodes: 2,
        tensor_bytes: 1 << 20,
        host_capacity: 64 << 20,
        replica_capacity: 0,
        ssd_capacity: 0,
        eviction: TierEviction::all(Eviction::Lru),
        admission: Admission::Always,
        consolidate,
        replicate_after_reads: None,
        host_ns_per_byte: 0.1,
        ssd_ns_per_byte: 1.0,
        net_ns_per_byte: 1.0,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 1e4,
    })
}

/// Node 0 stores a conversation's prompt in three turns (2, then 4, then 6 tensors); node 1
/// loads the whole prefix: one segment consolidated, three (one per increment) without.
/// Where the increments come from different nodes, they are different groups either way.
#[test]
fn increments_stored_by_one_node_load_as_one_segment_only_when_consolidated() {
    let c = common::chain(&[0, 1, 2, 3, 4, 5]);
    for (consolidate, segments) in [(true, 1), (false, 3)] {
        let mut d = directory(consolidate);
        for turn in [2, 4, 6] {
            d.insert(&c[..turn], 0);
        }
        let plan = d.lookup(&c, 0, 1);
        assert_eq!(plan.groups.len(), 1, "{plan:?}");
        let g = &plan.groups[0];
        assert_eq!((g.node, g.tensors), (0, 6));
        assert_eq!(g.segments, segments, "consolidate = {consolidate}");
    }
    for consolidate in [true, false] {
        let mut d = directory(consolidate);
        d.insert(&c[..2], 0);
        d.insert(&c[..4], 1);
        let plan = d.lookup(&c[..4], 0, 1);
        let nodes: Vec<(u32, u32)> = plan.groups.iter().map(|g| (g.node, g.segments)).collect();
        assert_eq!(nodes, [(0, 1), (1, 1)], "consolidate = {consolidate}");
    }
}
