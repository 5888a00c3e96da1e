//! GDSF in the prefix store: its clock ages entries that are no longer read, and a tensor
//! demoted to SSD takes its access count with it.
//!
//! * The queue ([`EvictionQueue`]): an entry read often long ago has a high priority
//!   `L + frequency x value`, but every eviction raises the clock `L` to the evicted entry's
//!   priority, and new entries start at the clock; once a stream of entries read once has
//!   raised it to the old entry's priority, the old entry goes. Without the clock it would
//!   stay forever.
//! * The directory: a demotion is no access, but neither does it forget the accesses: the
//!   SSD queue ranks the tensor by the count it had in host memory, so a tensor read often
//!   before its demotion outlives one read less on SSD.

mod common;

use common::chain;
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, Location, StoreEvent, StoreParams};
use meshsim::serving::store::eviction::{Eviction, EvictionQueue};

#[test]
fn an_often_read_entry_goes_once_the_clock_reaches_its_priority() {
    let mut q = EvictionQueue::new(Eviction::Gdsf);
    // Read 10 times: H = 0 + 10 x 1.
    q.insert(1, 1, 1.0, 0);
    for t in 1..10 {
        q.touch(1, t);
    }
    assert_eq!(q.freq(1), 10);
    // Entries read once come and go, one at a time: the k-th starts at H = k + 1 (the clock
    // is the priority of the one evicted before it, k) and is evicted at once while that is
    // below 10.
    for k in 0..9u64 {
        q.insert(100 + k, 1, 1.0, 10 + k);
        assert_eq!(q.pop(), Some(100 + k), "entry {k} is below the old one");
    }
    // The next one starts at 10 and ties the old entry, which wins the tie by its lower id:
    // it is evicted although it was read ten times and the newcomer once.
    q.insert(200, 1, 1.0, 20);
    assert_eq!(q.pop(), Some(1), "the clock has aged the old entry out");
    assert_eq!(q.pop(), Some(200));
    assert_eq!(q.pop(), None);
}

#[test]
fn an_entry_read_after_the_clock_moved_ranks_from_the_clock() {
    let mut q = EvictionQueue::new(Eviction::Gdsf);
    q.insert(1, 1, 2.0, 0); // H = 2
    q.insert(2, 1, 3.5, 0); // H = 3.5
    assert_eq!(q.pop(), Some(1)); // the clock is now 2
    q.insert(3, 1, 1.0, 1); // H = 2 + 1 x 1 = 3
    q.touch(3, 2); // H = 2 + 2 x 1 = 4
    // Without the clock, entry 3 would rank at 2 x 1 = 2, below entry 2.
    assert_eq!(q.pop(), Some(2), "3.5 < 2 + 2");
    assert_eq!(q.pop(), Some(3));
}

/// One node whose owned host memory holds one tensor and whose SSD holds two; every tensor
/// costs the same to recompute, so GDSF ranks SSD tensors by their access counts alone.
fn one_node() -> Directory {
    let mut d = Directory::new(StoreParams {
        nodes: 1,
        tensor_bytes: 100,
        host_capacity: 100,
        replica_capacity: 0,
        ssd_capacity: 200,
        eviction: TierEviction::all(Eviction::Gdsf),
        admission: Admission::Always,
        consolidate: false,
        replicate_after_reads: None,
        host_ns_per_byte: 0.1,
        ssd_ns_per_byte: 0.5,
        net_ns_per_byte: 0.2,
        recompute_base_ns: 1_000.0,
        recompute_per_index_ns: 0.0,
    });
    d.events = Some(Vec::new());
    d
}

#[test]
fn a_demoted_tensor_keeps_its_access_count_on_ssd() {
    let mut d = one_node();
    let [a, b, c, e] = [b"a", b"b", b"c", b"e"].map(|p| chain(p));
    d.insert(&a, 0);
    // Five reads of `a` in host memory: 6 accesses with its write.
    for _ in 0..5 {
        assert_eq!(d.lookup(&a, 0, 0).stored_chunks, 1);
    }
    // `b` demotes `a`, `c` demotes `b`: both on SSD, which is full.
    d.insert(&b, 0);
    d.insert(&c, 0);
    assert_eq!(d.location(a[0]), Some((0, Location::Ssd)));
    assert_eq!(d.location(b[0]), Some((0, Location::Ssd)));
    // Two reads of `b` on SSD: 3 accesses, fewer than `a`'s 6 (but more than 1).
    for _ in 0..2 {
        assert_eq!(d.lookup(&b, 0, 0).stored_chunks, 1);
    }
    // `e` demotes `c`; the SSD drops its tensor of lowest priority: `b`, not `a`.
    d.events = Some(Vec::new());
    d.insert(&e, 0);
    let dropped: Vec<_> = d
        .events
        .take()
        .unwrap()
        .into_iter()
        .filter_map(|ev| match ev {
            StoreEvent::Dropped { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(
        dropped,
        [b[0]],
        "a tensor read 6 times outlives one read 3 times"
    );
    assert_eq!(d.location(a[0]), Some((0, Location::Ssd)));
    assert_eq!(d.location(c[0]), Some((0, Location::Ssd)));
    assert_eq!(d.location(e[0]), Some((0, Location::Host)));
    d.check().unwrap();
}
