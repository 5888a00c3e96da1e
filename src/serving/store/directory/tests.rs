use super::*;
use crate::hash::{ROOT_PARENT, block_hash};

/// Tensor ids of a prompt made of `symbols`, one symbol per chunk.
pub(crate) fn chain(symbols: &[u32]) -> Vec<TensorId> {
    let mut parent = ROOT_PARENT;
    symbols
        .iter()
        .map(|&s| {
            parent = block_hash(parent, &[s]);
            parent
        })
        .collect()
}

pub(crate) fn params(nodes: u32, host: u64, replicas: u64, ssd: u64) -> StoreParams {
    StoreParams {
        nodes,
        tensor_bytes: 100,
        host_capacity: host * 100,
        replica_capacity: replicas * 100,
        ssd_capacity: ssd * 100,
        eviction: Eviction::Lru,
        consolidate: true,
        replicate_after_reads: Some(2),
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.15,
        net_ns_per_byte: 0.04,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 1e4,
    }
}

#[test]
fn storing_adds_only_what_lies_beyond_the_longest_common_prefix() {
    let mut d = Directory::new(params(2, 100, 0, 100));
    // A 12-chunk prompt, then one that shares 10 chunks and diverges.
    let a: Vec<u32> = (0..12).collect();
    let mut b: Vec<u32> = (0..10).collect();
    b.extend([90, 91, 92]);
    assert_eq!(d.insert(&chain(&a), 0).new_tensors, 12);
    assert_eq!(d.insert(&chain(&b), 1).new_tensors, 3);
    assert_eq!(d.len(), 15);
    // A prompt that extends a stored one adds only its tail.
    let mut c = a.clone();
    c.extend([12, 13]);
    assert_eq!(d.insert(&chain(&c), 1).new_tensors, 2);
    // A prompt that is a prefix of a stored one adds nothing, and is found whole.
    assert_eq!(d.insert(&chain(&a[..5]), 0).new_tensors, 0);
    assert_eq!(d.stored_prefix(&chain(&a[..5])), 5);
    assert_eq!(d.stored_prefix(&chain(&b)), 13);
    assert_eq!(d.stored_prefix(&chain(&[0, 1, 2, 77])), 3);
    assert_eq!(
        d.stored_prefix(&chain(&[5])),
        0,
        "same symbol, other parent"
    );
    d.check().unwrap();
}

#[test]
fn a_lookup_plans_one_group_per_source_and_counts_segments() {
    let mut d = Directory::new(params(2, 100, 0, 100));
    d.insert(&chain(&[0, 1, 2]), 0);
    d.insert(&chain(&[0, 1, 2, 3, 4]), 0); // consolidated onto [0, 1, 2]
    d.insert(&chain(&[0, 1, 2, 3, 4, 5]), 1);
    let plan = d.lookup(&chain(&[0, 1, 2, 3, 4, 5, 6]), 1, 1);
    assert_eq!(plan.stored_chunks, 6);
    assert_eq!(
        plan.groups,
        vec![
            LoadGroup {
                node: 0,
                location: Location::Host,
                tier: Tier::RemoteHost,
                tensors: 4,
                bytes: 400,
                segments: 1,
            },
            LoadGroup {
                node: 1,
                location: Location::Host,
                tier: Tier::LocalHost,
                tensors: 1,
                bytes: 100,
                segments: 1,
            },
        ]
    );
    // Without consolidation the second increment is a segment of its own.
    let mut p = params(2, 100, 0, 100);
    p.consolidate = false;
    let mut e = Directory::new(p);
    e.insert(&chain(&[0, 1, 2]), 0);
    e.insert(&chain(&[0, 1, 2, 3, 4]), 0);
    let plan = e.lookup(&chain(&[0, 1, 2, 3, 4]), 0, 1);
    assert_eq!(plan.groups[0].segments, 2);
}

#[test]
fn replicas_go_before_owned_tensors_and_owned_ones_are_demoted_then_dropped() {
    // Node 0: room for 4 tensors in host memory (2 of them replicas), 2 on SSD.
    let mut d = Directory::new(params(2, 4, 2, 2));
    d.events = Some(Vec::new());
    d.insert(&chain(&[1, 2]), 1);
    // Node 0 reads node 1's prefix twice: the second read asks for replication.
    assert!(d.lookup(&chain(&[1, 2]), 0, 0).replicate.is_empty());
    let plan = d.lookup(&chain(&[1, 2]), 0, 0);
    assert_eq!(plan.replicate.len(), 2);
    assert_eq!(d.add_replicas(0, &plan.replicate), 2);
    assert_eq!(d.usage(0), (0, 200, 0));
    // Two owned tensors fit next to the replicas; the third evicts a replica first.
    d.insert(&chain(&[7, 8, 9]), 0);
    assert_eq!(d.usage(0), (300, 100, 0));
    // Four more: the last replica goes, then there is no room left that does not belong to
    // the prefix being extended, which an insert never evicts: it stops, counted as refused.
    d.insert(&chain(&[7, 8, 9, 10, 11, 12, 13]), 0);
    assert_eq!(d.usage(0), (400, 0, 0));
    assert_eq!(d.stored_prefix(&chain(&[7, 8, 9, 10, 11, 12, 13])), 4);
    assert_eq!(d.stats.refused, 1);
    // Another prompt on node 0 now demotes that chain's tensors to SSD (its leaf 10 first,
    // then the least recently used ones), and when SSD is full a leaf there (10) is dropped:
    // the stored prefix is cut to 7, 8 (on SSD) and 9.
    d.insert(&chain(&[20, 21, 22]), 0);
    assert_eq!(d.stored_prefix(&chain(&[20, 21, 22])), 3);
    assert_eq!(d.usage(0), (400, 0, 200));
    assert_eq!(d.stored_prefix(&chain(&[7, 8, 9, 10, 11, 12, 13])), 3);
    let events = d.events.take().unwrap();
    let first_demotion = events
        .iter()
        .position(|e| matches!(e, StoreEvent::Demoted { .. }))
        .unwrap();
    let last_replica_eviction = events
        .iter()
        .rposition(|e| matches!(e, StoreEvent::ReplicaEvicted { .. }))
        .unwrap();
    assert!(last_replica_eviction < first_demotion);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, StoreEvent::Dropped { .. }))
    );
    d.check().unwrap();
}

#[test]
fn an_insert_never_demotes_or_drops_the_prefix_it_extends() {
    // Node 0: room for 2 tensors in host memory and 2 on SSD. A prompt of 4 chunks.
    let mut d = Directory::new(params(1, 2, 0, 2));
    d.events = Some(Vec::new());
    let out = d.insert(&chain(&[1, 2, 3, 4]), 0);
    assert!(out.refused);
    assert_eq!(out.new_tensors, 2);
    assert_eq!(d.stored_prefix(&chain(&[1, 2, 3, 4])), 2);
    let events = d.events.take().unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, StoreEvent::Demoted { .. } | StoreEvent::Dropped { .. }))
    );
    assert!(matches!(
        events.last(),
        Some(StoreEvent::Refused { node: 0, index: 2 })
    ));
    d.check().unwrap();
}

#[test]
fn dropping_a_tensor_drops_its_descendants_on_every_node() {
    let mut d = Directory::new(params(2, 3, 2, 0));
    d.insert(&chain(&[1, 2, 3]), 0);
    d.insert(&chain(&[1, 2, 3, 4]), 1);
    // Node 1 reads node 0's part twice and replicates what fits beside its own tensor.
    d.lookup(&chain(&[1, 2, 3, 4]), 0, 1);
    let plan = d.lookup(&chain(&[1, 2, 3, 4]), 0, 1);
    assert_eq!(plan.replicate.len(), 3);
    assert_eq!(d.add_replicas(1, &plan.replicate), 2);
    assert_eq!(d.usage(1), (100, 200, 0));
    // Node 0 is full and none of its tensors is a leaf (tensor 4 on node 1 extends them):
    // a new prompt there drops its least recently used tensor (3: lookups touch a prefix
    // from its end) and, with it, tensor 4 on node 1. There is no SSD to demote to.
    d.insert(&chain(&[9]), 0);
    assert_eq!(d.stored_prefix(&chain(&[1, 2, 3, 4])), 2);
    assert_eq!(d.usage(1), (0, 200, 0));
    assert_eq!(d.len(), 3);
    d.check().unwrap();
}
