use super::*;
use crate::hash::{ROOT_PARENT, block_hash};
use crate::serving::store::eviction::Eviction;

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
        eviction: TierEviction::all(Eviction::Lru),
        admission: Admission::Always,
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
                indices: vec![1, 2, 3, 4],
                epoch: 0,
            },
            LoadGroup {
                node: 1,
                location: Location::Host,
                tier: Tier::LocalHost,
                tensors: 1,
                bytes: 100,
                segments: 1,
                indices: vec![5],
                epoch: 0,
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

fn events(d: &mut Directory) -> Vec<StoreEvent> {
    d.events.replace(Vec::new()).unwrap_or_default()
}

#[test]
fn owned_tensors_and_replicas_each_stay_within_their_share_of_host_memory() {
    // Per node: 4 tensors of host memory, 2 of them the replica cache; 2 on SSD.
    let mut d = Directory::new(params(2, 4, 2, 2));
    d.events = Some(Vec::new());
    assert_eq!(d.owned_capacity(), 200);
    d.insert(&chain(&[1, 2]), 1);
    // Node 0 reads node 1's prefix twice: the second read asks for replication.
    assert!(d.lookup(&chain(&[1, 2]), 0, 0).replicate.is_empty());
    let plan = d.lookup(&chain(&[1, 2]), 0, 0);
    assert_eq!(plan.replicate.len(), 2);
    assert_eq!(d.add_replicas(0, &plan.replicate), 2);
    assert_eq!(d.usage(0), (0, 200, 0));
    // Owned tensors fill the owned cache only; the third of a prompt would need the prefix
    // it extends to go, which an insert never does: it stops, counted as refused. The
    // replicas are untouched.
    d.insert(&chain(&[7, 8, 9]), 0);
    assert_eq!(d.usage(0), (200, 200, 0));
    assert_eq!(d.stats.refused, 1);
    // Another prompt demotes the leaf 8, then 7 (a leaf of host memory once its child is on
    // SSD); the next one demotes 21 and, SSD being full, drops SSD's leaf 8.
    d.insert(&chain(&[20, 21]), 0);
    assert_eq!(d.usage(0), (200, 200, 200));
    d.insert(&chain(&[30]), 0);
    assert_eq!(d.usage(0), (200, 200, 200));
    assert_eq!(d.stored_prefix(&chain(&[7, 8])), 1);
    assert_eq!(d.location(chain(&[7])[0]), Some((0, Location::Ssd)));
    assert_eq!(d.replicas_on(0).len(), 2);
    let evs = events(&mut d);
    assert!(evs.iter().any(|e| matches!(e, StoreEvent::Dropped { .. })));
    assert!(
        !evs.iter()
            .any(|e| matches!(e, StoreEvent::ReplicaEvicted { .. })),
        "owned tensors never push replicas out"
    );
    // Node 1's replica cache is empty, yet its owned tensors do not use it.
    d.insert(&chain(&[5]), 1);
    assert_eq!(d.usage(1), (200, 0, 100));
    d.check().unwrap();
    // And replicas never use the owned share, even an empty one: asked for 3 of node 0's
    // tensors, node 1's replica cache takes 2.
    let mut e = Directory::new(params(2, 4, 2, 2));
    e.insert(&chain(&[1, 2]), 0);
    e.insert(&chain(&[3]), 0);
    let ids = e.ids();
    assert_eq!(ids.len(), 3);
    assert_eq!(e.add_replicas(1, &ids), 2);
    assert_eq!(e.usage(1), (0, 200, 0));
    e.check().unwrap();
}

#[test]
fn replicas_are_kept_and_added_while_owned_tensors_are_demoted() {
    // Per node: 3 owned tensors in host memory, a replica cache of 3, SSD for 100.
    let mut d = Directory::new(params(2, 6, 3, 100));
    d.events = Some(Vec::new());
    d.insert(&chain(&[1, 2, 3]), 1);
    d.insert(&chain(&[40, 41, 42]), 0);
    events(&mut d);
    // Node 0 keeps writing new prompts (its owned cache is full: each one demotes) and reads
    // node 1's prefix between them.
    for k in 0..6u32 {
        d.insert(&chain(&[50 + k, 60 + k]), 0);
        let plan = d.lookup(&chain(&[1, 2, 3]), 0, 0);
        if !plan.replicate.is_empty() {
            d.add_replicas(0, &plan.replicate);
        }
        d.check().unwrap();
    }
    let evs = events(&mut d);
    let demoted = evs
        .iter()
        .filter(|e| matches!(e, StoreEvent::Demoted { node: 0, .. }))
        .count();
    let replicated = evs
        .iter()
        .filter(|e| matches!(e, StoreEvent::Replicated { node: 0, .. }))
        .count();
    assert_eq!(demoted, 12);
    assert_eq!(
        replicated, 3,
        "replication goes on under owned-memory pressure"
    );
    assert!(
        !evs.iter()
            .any(|e| matches!(e, StoreEvent::ReplicaEvicted { .. }))
    );
    assert_eq!(d.usage(0), (300, 300, 1200));
    // Later reads of the replicated prefix are served from node 0's replica cache.
    let plan = d.lookup(&chain(&[1, 2, 3]), 0, 0);
    assert_eq!(plan.groups.len(), 1);
    assert_eq!(plan.groups[0].tier, Tier::LocalHost);
}

#[test]
fn a_child_demoted_to_ssd_leaves_its_parent_a_leaf_of_host_memory() {
    // One node: 3 tensors in host memory, 4 on SSD; LRU.
    let mut d = Directory::new(params(1, 3, 0, 4));
    let abc = chain(&[1, 2, 3]);
    d.insert(&abc, 0);
    // 3 is the only leaf: it goes to SSD.
    d.insert(&chain(&[5]), 0);
    assert_eq!(d.location(abc[2]), Some((0, Location::Ssd)));
    // Now 2 is a leaf of host memory (its child is on SSD) and older than 5: it goes next,
    // although it still has a child.
    d.insert(&chain(&[6]), 0);
    assert_eq!(d.location(abc[1]), Some((0, Location::Ssd)));
    assert_eq!(d.location(chain(&[5])[0]), Some((0, Location::Host)));
    d.check().unwrap();
}

#[test]
fn a_child_owned_by_another_node_does_not_pin_its_parent_in_host_memory() {
    // Two nodes, 2 owned tensors each in host memory, 2 on SSD.
    let mut d = Directory::new(params(2, 2, 0, 2));
    d.insert(&chain(&[1, 2]), 0);
    d.insert(&chain(&[1, 2, 3]), 1);
    // Node 0 makes room: 2 is a leaf there (its child 3 is node 1's) and goes to SSD.
    d.insert(&chain(&[9]), 0);
    assert_eq!(d.location(chain(&[1, 2])[1]), Some((0, Location::Ssd)));
    assert_eq!(d.stored_prefix(&chain(&[1, 2, 3])), 3);
    d.check().unwrap();
}

#[test]
fn a_replica_with_a_replica_child_on_its_node_is_not_evicted_first() {
    // Node 1 has a replica cache of 2 tensors; LRU.
    let mut d = Directory::new(params(2, 10, 2, 0));
    d.events = Some(Vec::new());
    let ab = chain(&[1, 2]);
    let c = chain(&[7]);
    d.insert(&ab, 0);
    d.insert(&c, 0);
    assert_eq!(d.add_replicas(1, &ab), 2);
    // Reading only 2 (1 is in the reader's GPU cache) makes 1 the least recently used
    // replica; yet 2, the leaf, goes to make room for another replica.
    d.lookup(&ab, 1, 1);
    events(&mut d);
    assert_eq!(d.add_replicas(1, &c), 1);
    assert_eq!(
        events(&mut d),
        vec![
            StoreEvent::ReplicaEvicted { node: 1, index: 1 },
            StoreEvent::Replicated { node: 1, index: 0 },
        ]
    );
    let mut held = vec![ab[0], c[0]];
    held.sort_unstable();
    assert_eq!(d.replicas_on(1), held);
    d.check().unwrap();
}

#[test]
fn a_read_counts_for_the_copy_that_serves_it() {
    let mut d = Directory::new(params(2, 10, 5, 0));
    let ab = chain(&[1, 2]);
    d.insert(&ab, 0);
    let owner_count = |d: &Directory, id| d.servers[0].host_q.freq(id);
    let replica_count = |d: &Directory, id| d.servers[1].replica_q.freq(id);
    assert_eq!(owner_count(&d, ab[0]), 1, "its write");
    // Two remote reads count on the owner; then node 1 replicates.
    d.lookup(&ab, 0, 1);
    let plan = d.lookup(&ab, 0, 1);
    assert_eq!(d.add_replicas(1, &plan.replicate), 2);
    assert_eq!((owner_count(&d, ab[0]), replica_count(&d, ab[0])), (3, 1));
    // A read served by node 1's replica counts there, not on the owner.
    d.lookup(&ab, 0, 1);
    assert_eq!((owner_count(&d, ab[0]), replica_count(&d, ab[0])), (3, 2));
    // A tensor the reader skips (in its GPU cache) is not loaded, so not counted.
    d.lookup(&ab, 1, 1);
    assert_eq!(replica_count(&d, ab[0]), 2);
    assert_eq!(replica_count(&d, ab[1]), 3);
    // The owner's own reads count on the owner; inserting a prompt that extends the prefix
    // counts nothing.
    d.lookup(&ab, 0, 0);
    d.insert(&chain(&[1, 2, 3]), 0);
    assert_eq!(owner_count(&d, ab[0]), 4);
    d.check().unwrap();
}

#[test]
fn a_frequently_read_early_tensor_stays_in_host_memory_under_gdsf_and_not_under_lru() {
    let run = |eviction| {
        // One node: 3 tensors in host memory, SSD for 10.
        let mut p = params(1, 3, 0, 10);
        p.eviction = TierEviction::all(eviction);
        let mut d = Directory::new(p);
        let a = chain(&[1]);
        d.insert(&a, 0);
        for _ in 0..5 {
            d.lookup(&a, 0, 0);
        }
        // Three prompts stored after the reads: each past the second makes room.
        for s in [2, 3, 4, 5] {
            d.insert(&chain(&[s]), 0);
        }
        d.check().unwrap();
        d.location(a[0]).unwrap().1
    };
    assert_eq!(run(Eviction::Gdsf), Location::Host);
    assert_eq!(run(Eviction::Lru), Location::Ssd);
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
    // Per node: 3 owned tensors in host memory, a replica cache of 2, no SSD.
    let mut d = Directory::new(params(2, 5, 2, 0));
    d.insert(&chain(&[1, 2, 3]), 0);
    d.insert(&chain(&[1, 2, 3, 4]), 1);
    // Node 1 reads node 0's part twice and replicates what fits beside its own tensor.
    d.lookup(&chain(&[1, 2, 3, 4]), 0, 1);
    let plan = d.lookup(&chain(&[1, 2, 3, 4]), 0, 1);
    assert_eq!(plan.replicate.len(), 3);
    assert_eq!(d.add_replicas(1, &plan.replicate), 2);
    assert_eq!(d.usage(1), (100, 200, 0));
    // Node 0 is full; its only leaf in host memory is 3 (its child 4 is node 1's): a new
    // prompt there drops it (there is no SSD to demote to) and, with it, tensor 4 on node 1.
    d.insert(&chain(&[9]), 0);
    assert_eq!(d.stored_prefix(&chain(&[1, 2, 3, 4])), 2);
    assert_eq!(d.usage(1), (0, 200, 0));
    assert_eq!(d.len(), 3);
    d.check().unwrap();
}

#[test]
fn a_leased_path_is_neither_demoted_nor_dropped_until_its_lease_ends() {
    // One node: 2 tensors in host memory, 1 on SSD; leases of 1 ms.
    let mut d = Directory::new(params(1, 2, 0, 1));
    d.set_lease(1_000_000);
    let ab = chain(&[1, 2]);
    d.insert(&ab, 0);
    d.set_now(10);
    // A load of `ab` is planned: both tensors are leased (the path from the root).
    let plan = d.lookup(&ab, 0, 0);
    assert_eq!(plan.stored_chunks, 2);
    assert!(d.leased(ab[0]) && d.leased(ab[1]));
    // While the load runs, a new prompt finds no room that is not leased: refused.
    d.set_now(500_000);
    let x = chain(&[7]);
    let out = d.insert(&x, 0);
    assert!(out.refused && out.new_tensors == 0, "{out:?}");
    assert_eq!(d.location(ab[1]), Some((0, Location::Host)));
    // Once the lease has run out, `ab`'s leaf goes to SSD to make room, as without leases.
    d.set_now(1_000_011);
    assert!(!d.leased(ab[1]));
    let out = d.insert(&x, 0);
    assert_eq!((out.new_tensors, out.demoted), (1, 1));
    assert_eq!(d.location(ab[1]), Some((0, Location::Ssd)));
    // A lookup that skips the tensors the reader holds still leases the whole path: the
    // skipped tensors are the loaded ones' ancestors.
    d.set_now(2_000_000);
    let plan = d.lookup(&ab, 1, 0);
    assert_eq!(plan.groups.len(), 1);
    assert!(d.leased(ab[0]));
    // A lookup that finds nothing beyond what the reader holds plans nothing and leases
    // nothing.
    d.set_now(3_000_001);
    let plan = d.lookup(&ab, 2, 0);
    assert!(plan.groups.is_empty());
    assert!(!d.leased(ab[0]) && !d.leased(ab[1]));
    d.check().unwrap();
    // A lease on a tensor and not on its parent is a broken path, and the check says so.
    let t = d.tensors.get_mut(&ab[1]).unwrap();
    t.lease_until = u64::MAX;
    let e = d.check().unwrap_err();
    assert!(e.contains("its parent only until"), "{e}");
}

#[test]
fn without_leases_a_planned_load_can_be_evicted_under_it() {
    let mut d = Directory::new(params(1, 2, 0, 0));
    let ab = chain(&[1, 2]);
    d.insert(&ab, 0);
    let _ = d.lookup(&ab, 0, 0);
    assert!(!d.leased(ab[1]));
    // No SSD: the leaf is dropped for the new tensor.
    let out = d.insert(&chain(&[7]), 0);
    assert_eq!(out.new_tensors, 1);
    assert!(!d.contains(ab[1]));
}

/// What each node holds by the directory's own records: owned in host memory, owned on SSD,
/// replicas.
fn holdings(d: &Directory) -> Vec<[std::collections::BTreeSet<TensorId>; 3]> {
    let mut out = vec![<[std::collections::BTreeSet<TensorId>; 3]>::default(); d.servers.len()];
    for (&id, t) in &d.tensors {
        let tier = match t.loc {
            Location::Host => 0,
            Location::Ssd => 1,
        };
        out[t.owner as usize][tier].insert(id);
    }
    for (n, s) in d.servers.iter().enumerate() {
        out[n][2].extend(s.replicas.keys().copied());
    }
    out
}

#[test]
fn replaying_the_changes_gives_exactly_what_every_node_holds() {
    // A live store mirrors the directory by its changes alone (`store::memory`): inserts
    // that demote and drop across nodes, replicas added and evicted, and a lost node.
    let mut d = Directory::new(params(3, 6, 3, 5));
    d.track_changes();
    let mut mirror = vec![<[std::collections::BTreeSet<TensorId>; 3]>::default(); 3];
    let mut rng = crate::rng::Stream::new(11, 0);
    for step in 0..400u32 {
        let node = rng.below(3) as u32;
        let len = 1 + rng.below(8) as usize;
        let stem = rng.below(5) as u32;
        let symbols: Vec<u32> = (0..len as u32)
            .map(|k| stem * 100 + k % (3 + stem))
            .collect();
        let c = chain(&symbols);
        match step % 7 {
            0..=3 => {
                d.insert(&c, node);
            }
            4 | 5 => {
                d.lookup(&c, 0, node);
                let stored = d.stored_prefix(&c);
                d.add_replicas(node, &c[..stored]);
            }
            _ if step % 50 == 6 => {
                d.lose_node(node);
            }
            _ => {
                d.lookup(&c, 0, node);
            }
        }
        for ch in d.changes() {
            let m = &mut mirror[ch.node() as usize];
            match ch {
                Change::Stored { id, .. } => assert!(m[0].insert(id), "stored twice: {ch:?}"),
                Change::Demoted { id, .. } => {
                    assert!(m[0].remove(&id), "demoted from nowhere: {ch:?}");
                    m[1].insert(id);
                }
                Change::Dropped { id, .. } => {
                    assert!(m[0].remove(&id) | m[1].remove(&id), "dropped: {ch:?}")
                }
                Change::Replicated { id, .. } => assert!(m[2].insert(id), "{ch:?}"),
                Change::ReplicaGone { id, .. } => assert!(m[2].remove(&id), "{ch:?}"),
            }
        }
        assert_eq!(mirror, holdings(&d), "after step {step}");
        // Every invariant too, through drops, replication and a lost node.
        d.check()
            .unwrap_or_else(|e| panic!("after step {step}: {e}"));
    }
    assert!(d.stats.demoted > 0 && d.stats.dropped > 0 && d.stats.replicas_evicted > 0);
}

/// Prompts 1 to 3 and 14 come back often, the others rarely.
const SCRIPT: [u32; 28] = [
    2, 9, 5, 2, 11, 4, 2, 5, 14, 3, 2, 2, 12, 14, 1, 14, 2, 2, 13, 11, 10, 14, 13, 2, 2, 3, 2, 1,
];

/// The prompts each order keeps in a host memory of 4 tensors (no SSD: a demotion drops)
/// after `script`: single-chunk prompts (all leaves), each looked up and stored if missed.
fn kept_after(eviction: Eviction, script: &[u32]) -> Vec<u32> {
    let mut p = params(1, 4, 0, 0);
    p.eviction = TierEviction::all(eviction);
    p.replicate_after_reads = None;
    let mut d = Directory::new(p);
    let step = |d: &mut Directory, s: u32| {
        let c = chain(&[s]);
        if d.lookup(&c, 0, 0).stored_chunks == 0 {
            d.insert(&c, 0);
        }
    };
    for &s in script {
        step(&mut d, s);
        d.check().unwrap();
    }
    (1..=14).filter(|&s| d.contains(chain(&[s])[0])).collect()
}

#[test]
fn the_five_orders_keep_different_tensors() {
    let kept = |e| kept_after(e, &SCRIPT);
    // LRU keeps the four last used; no two orders keep the same four.
    assert_eq!(kept(Eviction::Lru), [1, 2, 3, 13]);
    assert_eq!(kept(Eviction::Gdsf), [1, 2, 13, 14]);
    assert_eq!(kept(Eviction::Lfu), [1, 2, 5, 14]);
    assert_eq!(kept(Eviction::S3Fifo), [1, 2, 3, 14]);
    assert_eq!(kept(Eviction::Arc), [1, 2, 3, 10]);
}
