//! PTStore's replication cache, seen from outside: a replicated prefix is read from the
//! reader's own host memory, and where the network is the bottleneck that makes PTStore
//! faster than EvoStore.

mod common;

use std::sync::Arc;

use meshsim::Tier;
use meshsim::serving::build::trace;
use meshsim::serving::sim::simulate;
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, Location, StoreParams};
use meshsim::serving::store::eviction::Eviction;

#[test]
fn a_replicated_prefix_is_read_from_the_local_replica() {
    let mut d = Directory::new(StoreParams {
        nodes: 2,
        tensor_bytes: 1 << 20,
        host_capacity: 64 << 20,
        replica_capacity: 16 << 20,
        ssd_capacity: 0,
        eviction: TierEviction::all(Eviction::Lru),
        admission: Admission::Always,
        consolidate: true,
        replicate_after_reads: Some(2),
        host_ns_per_byte: 0.1,
        ssd_ns_per_byte: 1.0,
        net_ns_per_byte: 1.0,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 1e4,
    });
    let c = common::chain(&[0, 1, 2, 3, 4, 5]);
    d.insert(&c, 0);
    // First read from node 1: remote, not yet hot.
    let plan = d.lookup(&c, 0, 1);
    assert_eq!(plan.groups.len(), 1);
    assert_eq!(
        (plan.groups[0].node, plan.groups[0].tier),
        (0, Tier::RemoteHost)
    );
    assert!(plan.replicate.is_empty());
    // Second read: hot, so node 1 is told to copy what it loaded into its replica cache.
    let plan = d.lookup(&c, 0, 1);
    assert_eq!(plan.replicate, c);
    assert_eq!(d.add_replicas(1, &plan.replicate), 6);
    // Third read: everything from node 1's own host memory, in one segment.
    let plan = d.lookup(&c, 0, 1);
    assert_eq!(plan.groups.len(), 1, "{plan:?}");
    let g = &plan.groups[0];
    assert_eq!(
        (g.node, g.location, g.tier),
        (1, Location::Host, Tier::LocalHost)
    );
    assert_eq!((g.tensors, g.bytes, g.segments), (6, 6 << 20, 1));
    assert!(plan.replicate.is_empty());
    // The owner still serves node 0's own reads from its memory.
    let plan = d.lookup(&c, 0, 0);
    assert_eq!(plan.groups[0].tier, Tier::LocalHost);
    assert_eq!(plan.groups[0].node, 0);
}

#[test]
fn ptstore_beats_evostore_when_remote_loads_cross_a_slow_network() {
    // Two nodes on 10 Gb/s NICs (1.1 GB/s achievable) against 25 GB/s of PCIe per GPU, and
    // round-robin routing: every context is prefilled on one node and read by the other
    // node's GPUs too, with GPU caches too small to keep it. EvoStore fetches a 2k-token
    // prefix (256 MiB) from the owner over the network every time (~240 ms); PTStore copies
    // it into the reader's replica cache after the first remote read and then loads it over
    // PCIe (~13 ms). Nothing else differs between the two policies here (same eviction
    // order, nothing evicted), so PTStore's mean TTFT must be lower, and the loads it saves
    // must show as local-host bytes.
    let mut s = common::small();
    s.serving.router = meshsim::serving::router::RouterStrategy::RoundRobin;
    s.hardware.network.nic.bandwidth = 10e9 / 8.0;
    s.serving.instance.num_blocks = 300; // 4,800 tokens: about two prompts
    s.store.ptstore.replicate_after_reads = Some(1);
    s.store.ptstore.eviction = s.store.evostore.eviction;
    s.store.ptstore.consolidate = false;
    let t = Arc::new(trace(&s).unwrap());
    let evo = simulate(&s, t.clone(), &s.preset("evostore").unwrap()).unwrap();
    let pt = simulate(&s, t, &s.preset("ptstore").unwrap()).unwrap();
    for run in [&evo, &pt] {
        assert!(run.report.records.iter().all(|r| r.completed()));
    }
    let st = pt.summary.store.as_ref().unwrap();
    assert!(st.stats.replicated > 0, "{st:?}");
    let local = Tier::LocalHost as usize;
    let remote = Tier::RemoteHost as usize;
    assert!(
        pt.summary.loaded_bytes[local] > evo.summary.loaded_bytes[local],
        "local-host bytes: ptstore {} evostore {}",
        pt.summary.loaded_bytes[local],
        evo.summary.loaded_bytes[local]
    );
    assert!(pt.summary.loaded_bytes[remote] < evo.summary.loaded_bytes[remote]);
    assert!(
        pt.summary.ttft.mean < 0.8 * evo.summary.ttft.mean,
        "mean TTFT: ptstore {} ms, evostore {} ms",
        pt.summary.ttft.mean,
        evo.summary.ttft.mean
    );
}
