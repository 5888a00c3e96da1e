//! The store's admission rules against references written again from their sources.
//!
//! - `second-hit`'s memory against a plain FIFO of ids (a `VecDeque` scanned end to end): a
//!   proposal of a remembered id is admitted and forgets it; any other is refused and
//!   remembered, the oldest forgotten beyond the capacity; a tensor proposed after a refused
//!   one is remembered (once).
//! - `tinylfu`'s sketch against a plain count-min sketch (4 rows of 4 x ceilPow2(capacity)
//!   byte counters, at least 16, capped at 15, indices by the documented SplitMix64 rule;
//!   halving every counter, and the count of additions as Caffeine does, after 10 x capacity
//!   additions), and the admission decision (room, or a strictly higher estimate than the
//!   victim's).
//!
//! Both step by step on random sequences, at capacities 0, 1 and larger; then, through the
//! directory, `second-hit` stores a prompt on its second appearance only, and `tinylfu`
//! keeps a popular prefix against a prompt seen once.

mod common;

use std::collections::VecDeque;

use common::chain;
use meshsim::serving::store::TierEviction;
use meshsim::serving::store::admission::{Admission, Filter, FrequencySketch, Seen};
use meshsim::serving::store::directory::{Directory, Location, StoreEvent, StoreParams};
use meshsim::serving::store::eviction::Eviction;
use proptest::prelude::*;

/// The reference FIFO of ids seen once.
struct RefSeen {
    fifo: VecDeque<u64>,
    capacity: usize,
}

impl RefSeen {
    fn admit(&mut self, id: u64) -> bool {
        if let Some(i) = self.fifo.iter().position(|&x| x == id) {
            self.fifo.remove(i);
            return true;
        }
        self.remember(id);
        false
    }

    fn remember(&mut self, id: u64) {
        if self.capacity > 0 && !self.fifo.contains(&id) {
            self.fifo.push_back(id);
            if self.fifo.len() > self.capacity {
                self.fifo.pop_front();
            }
        }
    }
}

/// The reference count-min sketch.
struct RefSketch {
    rows: Vec<Vec<u8>>,
    size: u64,
    sample: u64,
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

impl RefSketch {
    fn new(entries: u64) -> RefSketch {
        let n = entries.max(1);
        let width = 4 * n.next_power_of_two().max(4) as usize;
        RefSketch {
            rows: vec![vec![0; width]; 4],
            size: 0,
            sample: 10 * n,
        }
    }

    fn index(&self, id: u64, row: usize) -> usize {
        let seed = (row as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
        splitmix(id.wrapping_add(seed)) as usize % self.rows[row].len()
    }

    fn frequency(&self, id: u64) -> u64 {
        (0..4)
            .map(|r| self.rows[r][self.index(id, r)] as u64)
            .min()
            .unwrap()
    }

    fn increment(&mut self, id: u64) {
        let mut added = false;
        for r in 0..4 {
            let i = self.index(id, r);
            if self.rows[r][i] < 15 {
                self.rows[r][i] += 1;
                added = true;
            }
        }
        if added {
            self.size += 1;
            if self.size == self.sample {
                let odd: u64 = self.rows.iter().flatten().map(|&c| (c & 1) as u64).sum();
                for c in self.rows.iter_mut().flatten() {
                    *c /= 2;
                }
                self.size = (self.size - odd / 4) / 2;
            }
        }
    }

    /// TinyLFU's decision for a proposal of `id` displacing `victim`.
    fn admit(&mut self, id: u64, victim: Option<u64>) -> bool {
        self.increment(id);
        victim.is_none_or(|v| self.frequency(id) > self.frequency(v))
    }
}

#[derive(Clone, Debug)]
enum Op {
    Lookup(u64),
    Propose(u64, Option<u64>),
}

fn ops() -> impl Strategy<Value = (u64, Vec<Op>)> {
    prop_oneof![Just(0u64), Just(1), 2u64..40].prop_flat_map(|cap| {
        let ids = 2 * cap + 4;
        let op = prop_oneof![
            (0..ids).prop_map(Op::Lookup),
            (0..ids, prop::option::of(0..ids)).prop_map(|(a, b)| Op::Propose(a, b)),
        ];
        (Just(cap), prop::collection::vec(op, 0..400))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn second_hit_remembers_like_a_plain_fifo((cap, ops) in ops()) {
        let mut seen = Seen::new(cap);
        let mut filter = Filter::new(Admission::SecondHit, cap);
        let mut r = RefSeen { fifo: VecDeque::new(), capacity: cap as usize };
        for op in &ops {
            match *op {
                Op::Lookup(id) => {
                    // A lookup changes nothing under second-hit; a tensor proposed after a
                    // refused one is remembered.
                    filter.record(id);
                    filter.proposed(&[id]);
                    seen.remember(id);
                    r.remember(id);
                }
                Op::Propose(id, victim) => {
                    let want = r.admit(id);
                    prop_assert_eq!(seen.admit(id), want, "proposal of {}", id);
                    prop_assert_eq!(filter.admit(id, victim), want);
                }
            }
            prop_assert_eq!(seen.len(), r.fifo.len());
            for x in 0..2 * cap + 4 {
                prop_assert_eq!(seen.contains(x), r.fifo.contains(&x));
            }
        }
    }

    #[test]
    fn tinylfu_counts_and_decides_like_a_plain_count_min_sketch((cap, ops) in ops()) {
        let mut s = FrequencySketch::new(cap);
        let mut filter = Filter::new(Admission::TinyLfu, cap);
        let mut r = RefSketch::new(cap);
        prop_assert_eq!(s.width(), r.rows[0].len() as u64);
        prop_assert_eq!(s.sample(), r.sample);
        for op in &ops {
            match *op {
                Op::Lookup(id) => {
                    s.increment(id);
                    filter.record(id);
                    r.increment(id);
                }
                Op::Propose(id, victim) => {
                    let want = r.admit(id, victim);
                    s.increment(id);
                    prop_assert_eq!(filter.admit(id, victim), want, "proposal of {}", id);
                }
            }
            for x in 0..2 * cap + 4 {
                prop_assert_eq!(s.frequency(x), r.frequency(x), "estimate of {}", x);
            }
        }
    }
}

#[test]
fn the_sketch_halves_after_ten_times_its_capacity() {
    let mut s = FrequencySketch::new(1);
    for _ in 0..9 {
        s.increment(7);
    }
    assert_eq!(s.frequency(7), 9);
    // The tenth addition halves every counter: 10 / 2.
    s.increment(7);
    assert_eq!(s.frequency(7), 5);
}

fn params(admission: Admission, host_tensors: u64) -> StoreParams {
    StoreParams {
        nodes: 1,
        tensor_bytes: 10,
        host_capacity: host_tensors * 10,
        replica_capacity: 0,
        ssd_capacity: 0,
        eviction: TierEviction::all(Eviction::Lru),
        admission,
        consolidate: false,
        replicate_after_reads: None,
        host_ns_per_byte: 0.04,
        ssd_ns_per_byte: 0.3,
        net_ns_per_byte: 0.05,
        recompute_base_ns: 1e6,
        recompute_per_index_ns: 0.0,
    }
}

#[test]
fn second_hit_stores_a_prompt_on_its_second_appearance() {
    let mut d = Directory::new(params(Admission::SecondHit, 8));
    d.events = Some(Vec::new());
    let p = chain(&[1, 2, 3]);
    // First appearance: looked up (a miss), then proposed: nothing stored.
    assert_eq!(d.lookup(&p, 0, 0).stored_chunks, 0);
    let out = d.insert(&p, 0);
    assert!(out.not_admitted && out.new_tensors == 0);
    assert_eq!(d.stats.not_admitted, 1);
    assert_eq!(
        d.events.take().unwrap(),
        [StoreEvent::NotAdmitted { node: 0, index: 0 }]
    );
    // Second appearance: stored whole (the tensors after the refused one were remembered).
    d.events = Some(Vec::new());
    assert_eq!(d.lookup(&p, 0, 0).stored_chunks, 0);
    let out = d.insert(&p, 0);
    assert_eq!((out.new_tensors, out.not_admitted), (3, false));
    assert_eq!(d.stored_prefix(&p), 3);
    // A prompt that extends it: its new tensor waits for its own second appearance.
    let q = chain(&[1, 2, 3, 4]);
    assert!(d.insert(&q, 0).not_admitted);
    assert_eq!(d.insert(&q, 0).new_tensors, 1);
    assert_eq!(d.location(p[2]), Some((0, Location::Host)));
    d.check().unwrap();
}

#[test]
fn tinylfu_keeps_a_popular_prefix_against_a_prompt_seen_once() {
    // Room for two tensors, no SSD: making room drops.
    let mut d = Directory::new(params(Admission::TinyLfu, 2));
    let hot = chain(&[1, 2]);
    d.insert(&hot, 0);
    for _ in 0..3 {
        assert_eq!(d.lookup(&hot, 0, 0).stored_chunks, 2);
    }
    // A prompt seen once (its lookup and its proposal: estimate 2) against the hot leaf
    // (its proposal and three lookups: 4): not admitted.
    let cold = chain(&[9]);
    d.lookup(&cold, 0, 0);
    let out = d.insert(&cold, 0);
    assert!(out.not_admitted);
    assert_eq!(d.stored_prefix(&hot), 2);
    // Seen often enough, it beats the hot leaf's estimate and displaces it.
    for _ in 0..3 {
        d.lookup(&cold, 0, 0);
    }
    let out = d.insert(&cold, 0);
    assert!(!out.not_admitted && out.new_tensors == 1);
    assert_eq!(d.stored_prefix(&hot), 1);
    d.check().unwrap();
}
