//! The prefix store's directory against an oracle that is not the store ([`oracle`]: a
//! reference model written from the documented semantics, by brute force), run step by step
//! side by side.
//!
//! **What is compared**, after every step of random operation sequences (and in a
//! hand-computed scenario where LRU and GDSF choose different victims): the recorded
//! [`StoreEvent`]s in order (stored, demoted, dropped, replicated, replica evicted, refused:
//! the eviction order), the insert outcomes and replica counts, the stored tensors with
//! owner and tier, the replicas on every node, the bytes per cache, and every load plan.
//!
//! A second property test mixes in read leases (each lookup that plans a load leases its
//! stored prefix; time passes between steps, so leases expire) and the loss of a node's
//! store, and compares every tensor's lease too; two hand-computed scenarios pin both down.
//!
//! Among the checks: adding replicas never evicts an ancestor of the batch
//! ([`adding_replicas_never_evicts_an_ancestor_of_the_batch`]), and the oracle's shrunk case
//! for it is kept in the regressions file.

mod common;
mod oracle;

use common::chain;
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::Admission;
use meshsim::serving::store::directory::{Directory, Location, StoreEvent, StoreParams, TensorId};
use meshsim::serving::store::eviction::Eviction;
use oracle::Oracle;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Debug, Clone)]
enum Op {
    Insert {
        prompt: Vec<u8>,
        node: u32,
    },
    /// A lookup, followed (like a serving instance) by replicating what its plan asks for.
    Lookup {
        prompt: Vec<u8>,
        skip: usize,
        reader: u32,
    },
    /// Replicating the tensors of a prompt from chunk `from` on, directly.
    AddReplicas {
        prompt: Vec<u8>,
        from: usize,
        node: u32,
    },
    /// The store of `node` is lost (its server crashed or restarted).
    Lose {
        node: u32,
    },
    /// Time passes: leases granted before may expire.
    Advance {
        ns: u64,
    },
}

/// The real directory and the oracle side by side.
struct Pair {
    d: Directory,
    o: Oracle,
    /// The time of the operations (ns).
    now: u64,
}

impl Pair {
    /// The directory beside the oracle of the documented semantics.
    fn new(p: StoreParams) -> Pair {
        let mut d = Directory::new(p.clone());
        d.events = Some(Vec::new());
        Pair {
            d,
            o: Oracle::new(p),
            now: 0,
        }
    }

    /// The same, with read leases of `lease_ns`.
    fn with_lease(p: StoreParams, lease_ns: u64) -> Pair {
        let mut pair = Pair::new(p);
        pair.d.set_lease(lease_ns);
        pair.o.set_lease(lease_ns);
        pair
    }

    fn lose(&mut self, node: u32) -> Result<Vec<StoreEvent>, TestCaseError> {
        prop_assert_eq!(
            self.d.lose_node(node),
            self.o.lose_node(node),
            "tensors lost"
        );
        self.compare()
    }

    fn advance(&mut self, ns: u64) -> Result<Vec<StoreEvent>, TestCaseError> {
        self.now += ns;
        self.d.set_now(self.now);
        self.o.set_now(self.now);
        self.compare()
    }

    /// Each step returns the events it recorded (after comparing them).
    fn insert(&mut self, prompt: &[u8], node: u32) -> Result<Vec<StoreEvent>, TestCaseError> {
        let q = chain(prompt);
        prop_assert_eq!(
            self.d.insert(&q, node),
            self.o.insert(&q, node),
            "insert outcome"
        );
        self.compare()
    }

    fn lookup(
        &mut self,
        prompt: &[u8],
        skip: usize,
        reader: u32,
    ) -> Result<Vec<StoreEvent>, TestCaseError> {
        let q = chain(prompt);
        let plan = self.d.lookup(&q, skip, reader);
        prop_assert_eq!(&plan, &self.o.lookup(&q, skip, reader), "load plan");
        let mut events = self.compare()?;
        if !plan.replicate.is_empty() {
            events.extend(self.add_replicas(reader, &plan.replicate)?);
        }
        Ok(events)
    }

    fn add_replicas(
        &mut self,
        node: u32,
        ids: &[TensorId],
    ) -> Result<Vec<StoreEvent>, TestCaseError> {
        prop_assert_eq!(
            self.d.add_replicas(node, ids),
            self.o.add_replicas(node, ids),
            "replicas added"
        );
        self.compare()
    }

    fn run(&mut self, op: &Op) -> Result<Vec<StoreEvent>, TestCaseError> {
        match op {
            Op::Insert { prompt, node } => self.insert(prompt, *node),
            Op::Lookup {
                prompt,
                skip,
                reader,
            } => self.lookup(prompt, *skip, *reader),
            Op::AddReplicas { prompt, from, node } => {
                let q = chain(prompt);
                self.add_replicas(*node, &q[(*from).min(q.len())..])
            }
            Op::Lose { node } => self.lose(*node),
            Op::Advance { ns } => self.advance(*ns),
        }
    }

    /// Compares the decisions of the last step and the whole state; returns the step's events.
    fn compare(&mut self) -> Result<Vec<StoreEvent>, TestCaseError> {
        let events = self.d.events.replace(Vec::new()).expect("recording is on");
        prop_assert_eq!(
            &events,
            &std::mem::take(&mut self.o.events),
            "events in order"
        );
        if let Err(e) = self.d.check() {
            prop_assert!(false, "{}", e);
        }
        let ids: Vec<TensorId> = self.o.tensors.keys().copied().collect();
        prop_assert_eq!(self.d.ids(), ids, "stored tensors");
        for (&id, t) in &self.o.tensors {
            prop_assert_eq!(
                self.d.location(id),
                Some((t.owner, t.loc)),
                "tensor {:#x}",
                id
            );
            prop_assert_eq!(self.d.leased(id), self.o.leased(id), "lease of {:#x}", id);
        }
        for n in 0..self.o.p.nodes {
            let reps: Vec<TensorId> = self.o.replicas[n as usize].keys().copied().collect();
            prop_assert_eq!(self.d.replicas_on(n), reps, "replicas on node {}", n);
            prop_assert_eq!(self.d.usage(n), self.o.usage(n), "bytes on node {}", n);
        }
        Ok(events)
    }
}

/// Operations on `nodes` nodes, on prompts mostly drawn from `pool` (so that lookups find
/// what was stored, and reads repeat), else fresh.
fn op(nodes: u32, pool: Vec<Vec<u8>>) -> impl Strategy<Value = Op> {
    // A 3-symbol alphabet and short prompts make shared and divergent prefixes common.
    let prompt = prop_oneof![
        3 => prop::sample::select(pool),
        1 => prop::collection::vec(0u8..3, 1..7),
    ];
    prop_oneof![
        3 => (prompt.clone(), 0..nodes).prop_map(|(prompt, node)| Op::Insert { prompt, node }),
        4 => (prompt.clone(), 0usize..3, 0..nodes).prop_map(|(prompt, skip, reader)| Op::Lookup {
            prompt,
            skip,
            reader
        }),
        1 => (prompt, 0usize..3, 0..nodes).prop_map(|(prompt, from, node)| Op::AddReplicas {
            prompt,
            from,
            node
        }),
    ]
}

/// [`op`], with losses of a node's store and time passing among them.
fn timed_op(nodes: u32, pool: Vec<Vec<u8>>) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op(nodes, pool),
        1 => (0..nodes).prop_map(|node| Op::Lose { node }),
        3 => (0u64..30).prop_map(|ns| Op::Advance { ns }),
    ]
}

/// The orders the oracle models (LRU, GDSF, LFU): one for every tier, or one per tier.
fn tier_orders() -> impl Strategy<Value = TierEviction> {
    let order = || {
        prop_oneof![
            Just(Eviction::Lru),
            Just(Eviction::Gdsf),
            Just(Eviction::Lfu)
        ]
    };
    prop_oneof![
        2 => order().prop_map(TierEviction::all),
        1 => (order(), order(), order()).prop_map(|(host, ssd, replica)| TierEviction {
            host,
            ssd,
            replica
        }),
    ]
}

fn params() -> impl Strategy<Value = StoreParams> {
    (
        2u32..4,
        1u64..7,
        // The replica cache's share of host memory, in eighths: 0 (EvoStore) to all of it.
        0u64..=8,
        0u64..5,
        tier_orders(),
        prop::bool::ANY,
        0u32..3,
        // How much more a drop of a later tensor costs (0: all drops cost the same).
        prop_oneof![Just(0.0), Just(2e4), Just(3e5)],
    )
        .prop_map(
            |(nodes, host, eighths, ssd, eviction, consolidate, after, per_index)| StoreParams {
                nodes,
                tensor_bytes: 10,
                host_capacity: host * 10,
                replica_capacity: host * 10 * eighths / 8,
                ssd_capacity: ssd * 10,
                eviction,
                admission: Admission::Always,
                consolidate,
                replicate_after_reads: (after > 0).then_some(after),
                host_ns_per_byte: 0.04,
                ssd_ns_per_byte: 0.3,
                net_ns_per_byte: 0.05,
                recompute_base_ns: 1e6,
                recompute_per_index_ns: per_index,
            },
        )
}

/// 1000 cases, or `ORACLE_CASES` (`ORACLE_CASES=200000 cargo test --test store_oracle` for a
/// long search).
fn cases() -> u32 {
    std::env::var("ORACLE_CASES").map_or(1000, |v| v.parse().expect("ORACLE_CASES is a count"))
}

/// `cases` cases, and failures kept in `tests/store_oracle.proptest-regressions` (committed),
/// whose seeds proptest replays before any new case.
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
    #![proptest_config(config(cases()))]

    #[test]
    fn the_directory_decides_like_the_oracle_at_every_step(
        (p, ops) in (params(), prop::collection::vec(prop::collection::vec(0u8..3, 1..7), 4))
            .prop_flat_map(|(p, pool)| {
                let n = p.nodes;
                (Just(p), prop::collection::vec(op(n, pool), 1..60))
            })
    ) {
        let mut pair = Pair::new(p);
        for op in &ops {
            pair.run(op)?;
        }
    }

    #[test]
    fn the_directory_decides_like_the_oracle_with_leases_and_node_losses(
        (p, lease, ops) in (
            params(),
            // Leases that expire within a few steps, and one that outlives the case.
            prop_oneof![Just(5u64), Just(20), Just(1_000_000)],
            prop::collection::vec(prop::collection::vec(0u8..3, 1..7), 4),
        )
            .prop_flat_map(|(p, lease, pool)| {
                let n = p.nodes;
                (Just(p), Just(lease), prop::collection::vec(timed_op(n, pool), 1..60))
            })
    ) {
        let mut pair = Pair::with_lease(p, lease);
        for op in &ops {
            pair.run(op)?;
        }
    }
}

/// One node with room for one owned tensor and no SSD; leases of 10 ns. A lookup of A at 0
/// leases it until 10: storing B at 5 would have to demote A, and is refused; at 10 the lease
/// has expired, and storing B evicts A, which with no SSD tier is dropped.
#[test]
fn a_read_lease_holds_a_tensor_until_it_expires_in_both_directory_and_oracle() {
    let mut p = scenario_params(Eviction::Lru);
    p.host_capacity = 10;
    p.ssd_capacity = 0;
    let [a, b] = [[0u8], [1]].map(|s| chain(&s)[0]);
    let mut pair = Pair::with_lease(p, 10);
    pair.insert(&[0], 0).unwrap();
    pair.lookup(&[0], 0, 0).unwrap();
    assert!(pair.d.leased(a));
    pair.advance(5).unwrap();
    assert!(pair.d.leased(a));
    let refused = StoreEvent::Refused { node: 0, index: 0 };
    assert_eq!(pair.insert(&[1], 0).unwrap(), vec![refused]);
    pair.advance(5).unwrap();
    assert!(!pair.d.leased(a), "the lease ends by itself");
    assert_eq!(
        pair.insert(&[1], 0).unwrap(),
        vec![
            StoreEvent::Dropped {
                node: 0,
                index: 0,
                id: a
            },
            StoreEvent::Stored {
                node: 0,
                index: 0,
                id: b
            },
        ]
    );
}

/// Node 1 owns x = [0, 0]; node 0 extends it with y = [0, 0, 1] and, after one remote read,
/// holds replicas of both tensors of x; node 1 holds a replica of z = [2], owned by node 0.
/// When node 1's store is lost, x goes with y (unreachable without its prefix) and node 0's
/// replicas of x; node 1's replica of z goes, z stays with its owner.
#[test]
fn a_lost_nodes_tensors_and_replicas_are_gone_in_both_directory_and_oracle() {
    let mut pair = Pair::new(replication_params());
    let (x, y, z) = (chain(&[0, 0]), chain(&[0, 0, 1]), chain(&[2]));
    pair.insert(&[0, 0], 1).unwrap();
    pair.insert(&[0, 0, 1], 0).unwrap();
    pair.insert(&[2], 0).unwrap();
    pair.lookup(&[0, 0], 0, 0).unwrap();
    pair.lookup(&[2], 0, 1).unwrap();
    assert_eq!(pair.d.replicas_on(0), sorted(&x));
    assert_eq!(pair.d.replicas_on(1), z);
    let dropped = |node, index, id| StoreEvent::Dropped { node, index, id };
    let mut events = pair.lose(1).unwrap();
    events.sort_by_key(|e| format!("{e:?}"));
    let mut want = vec![
        dropped(1, 0, x[0]),
        dropped(1, 1, x[1]),
        dropped(0, 2, y[2]),
    ];
    want.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(events, want);
    assert!(pair.d.replicas_on(0).is_empty() && pair.d.replicas_on(1).is_empty());
    assert_eq!(pair.d.location(z[0]), Some((0, Location::Host)));
    assert_eq!(pair.d.lookup(&y, 0, 0).stored_chunks, 0);
}

fn scenario_params(eviction: Eviction) -> StoreParams {
    StoreParams {
        nodes: 1,
        tensor_bytes: 10,
        host_capacity: 20,
        replica_capacity: 0,
        ssd_capacity: 10,
        eviction: TierEviction::all(eviction),
        admission: Admission::Always,
        consolidate: false,
        replicate_after_reads: None,
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.3,
        net_ns_per_byte: 0.05,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 2e4,
    }
}

/// One node with room for two tensors in host memory and one on SSD. A = [0] is read three
/// times in all (freq 3, last read at tick 4), B = [1] twice (freq 2, last read at tick 5).
/// Storing C = [2] demotes a host leaf: LRU takes A (older last access, tick 4 < 5), GDSF
/// takes B (lower priority, 2 x 0.26 < 3 x 0.26 ns/B), and so does LFU (2 accesses < 3).
/// Storing D = [2, 0] pins C, so the other host tensor is demoted and the full SSD drops the
/// one demoted before it to make its room: under LRU A is dropped and B demoted, under GDSF
/// and LFU the reverse.
#[test]
fn lru_gdsf_and_lfu_evict_in_the_order_computed_by_hand_in_both_directory_and_oracle() {
    let [a, b, c] = [[0u8], [1], [2]].map(|s| chain(&s)[0]);
    let d_id = chain(&[2, 0])[1];
    let orders = [
        (Eviction::Lru, a, b),
        (Eviction::Gdsf, b, a),
        (Eviction::Lfu, b, a),
    ];
    for (eviction, first, second) in orders {
        let mut pair = Pair::new(scenario_params(eviction));
        pair.insert(&[0], 0).unwrap();
        pair.insert(&[1], 0).unwrap();
        pair.lookup(&[0], 0, 0).unwrap();
        pair.lookup(&[0], 0, 0).unwrap();
        pair.lookup(&[1], 0, 0).unwrap();
        let mut steps = vec![pair.insert(&[2], 0).unwrap()];
        assert_eq!(pair.d.location(first), Some((0, Location::Ssd)));
        assert_eq!(pair.d.location(second), Some((0, Location::Host)));
        steps.push(pair.insert(&[2, 0], 0).unwrap());
        assert_eq!(pair.d.location(first), None);
        assert_eq!(pair.d.location(second), Some((0, Location::Ssd)));
        let stored = |id, index| StoreEvent::Stored { node: 0, index, id };
        let demoted = StoreEvent::Demoted { node: 0, index: 0 };
        let dropped = StoreEvent::Dropped {
            node: 0,
            index: 0,
            id: first,
        };
        assert_eq!(
            steps,
            vec![
                vec![demoted.clone(), stored(c, 0)],
                vec![dropped, demoted, stored(d_id, 1)],
            ],
            "{eviction:?}"
        );
    }
}

/// The property test's configuration finds the committed regressions file (next to this
/// file, named after it), so its seeds run first on every `cargo test`.
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
            .any(|s| s.contains("45dbb134beca3f5031b6f45ebf5c3c85")),
        "tests/store_oracle.proptest-regressions is not read (seeds found: {seeds:?})"
    );
}

fn replication_params() -> StoreParams {
    StoreParams {
        nodes: 2,
        tensor_bytes: 10,
        host_capacity: 60,
        // Room for two replicas; the owned cache holds four tensors.
        replica_capacity: 20,
        ssd_capacity: 0,
        eviction: TierEviction::all(Eviction::Lru),
        admission: Admission::Always,
        consolidate: false,
        replicate_after_reads: Some(1),
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.3,
        net_ns_per_byte: 0.05,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 2e4,
    }
}

/// The directory's module doc: "adding replicas never evicts the replicated prefix's own
/// ancestors" (and `add_replicas`: "the batch's own ancestors stay: evicting them would split
/// the prefix it extends"). But `add_replicas` keeps only the ancestors of the batch's first
/// tensor, while a lookup's batch (its remote tensors) has gaps where the reader already
/// holds a replica: that replica is an ancestor of the batch's later tensors, yet a leaf of
/// the replica cache, so it may be evicted for them.
///
/// Node 1 owns x0 x1 x2 (`[0, 0, 0]`) and y (`[1]`); node 0 reads, with room for two
/// replicas, replicating after one remote read. Reading x1 x2 replicates both; reading y
/// evicts the leaf x2 for y. Reading x0 x1 x2 then loads x1 from the local replica and asks
/// to replicate x0 and x2; the documented rule keeps x1 (an ancestor of x2), evicts y, and
/// has room for x0 only. (The wrong outcome evicts y and x1 and replicates x0 and x2,
/// leaving node 0 with x0 and x2 but not the x1 between them.)
#[test]
fn adding_replicas_never_evicts_an_ancestor_of_the_batch() {
    let mut pair = Pair::new(replication_params());
    let x = chain(&[0, 0, 0]);
    pair.insert(&[0, 0, 0], 1).unwrap();
    pair.insert(&[1], 1).unwrap();
    pair.lookup(&[0, 0, 0], 1, 0).unwrap();
    assert_eq!(pair.d.replicas_on(0), sorted(&[x[1], x[2]]));
    pair.lookup(&[1], 0, 0).unwrap();
    assert_eq!(pair.d.replicas_on(0), sorted(&[x[1], chain(&[1])[0]]));
    let plan = pair.d.lookup(&x, 0, 0);
    pair.o.lookup(&x, 0, 0);
    pair.compare().unwrap();
    assert_eq!(plan.replicate, vec![x[0], x[2]]);
    pair.d.add_replicas(0, &plan.replicate);
    pair.o.add_replicas(0, &plan.replicate);
    let oracle: Vec<TensorId> = pair.o.replicas[0].keys().copied().collect();
    assert_eq!(
        oracle,
        sorted(&[x[0], x[1]]),
        "the documented rule, by hand"
    );
    assert_eq!(
        pair.d.replicas_on(0),
        sorted(&[x[0], x[1]]),
        "the replica of x1, an ancestor of the replicated x2, was evicted for it"
    );
}

fn sorted(ids: &[TensorId]) -> Vec<TensorId> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v
}
