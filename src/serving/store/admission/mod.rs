//! Admission to the store: which new tensors an insert stores at all.
//!
//! An insert proposes the tensors of a prompt beyond its stored prefix; admission decides,
//! tensor by tensor from the first, whether each is worth the room it takes. A refused
//! tensor ends the insert there (what follows it in the prompt would be unreachable without
//! it), counted apart from inserts refused for want of room (`StoreStats::not_admitted`,
//! [`super::directory::StoreEvent::NotAdmitted`]). The metadata service makes the decision,
//! so one filter sees every node's proposals and lookups (tensor ids name whole prefixes,
//! whichever node proposes them).
//!
//! - `always` stores everything, as EvoStore and PTStore do (and vLLM's offloading connector,
//!   LMCache and SGLang's `write_through` by default).
//! - `second-hit` stores a tensor only on its second proposal: the first one is remembered
//!   in a FIFO of the ids last proposed and refused (as many as the owned host caches of all
//!   nodes hold, in tensors); a proposal of an id found there stores it (and forgets it).
//!   The tensors an insert proposed after a refused one are remembered too (without being
//!   stored), so a prompt is stored whole on its second appearance.
//!   This is vLLM's offloading `store_threshold = 2` ("how many times a chunk must be
//!   offered for storage", counted once per request, in a bounded table), SGLang HiCache's
//!   `write_through_selective` (a radix node is backed up to host memory at `hit_count >= 2`)
//!   and Dynamo KVBM's frequency filter in front of its disk tier (a block offered twice).
//!   A lookup that misses is not counted apart from the proposal: the request that missed
//!   proposes the tensor after its prefill, and one request is one appearance (vLLM too
//!   counts a key once per request).
//! - `tinylfu` (Einziger, Friedman & Manes, ACM ToS 2017, as Caffeine's `FrequencySketch`): a
//!   count-min sketch of 4-bit counters (4 rows; each row 4 x ceilPow2(n) counters, at least
//!   16, n the owned host capacity of all nodes in tensors: Caffeine's 16 x ceilPow2(n)
//!   counters) counts every tensor a lookup asks for (stored or not) and every proposal (those
//!   after a refused one included); when 10 x n counts have been added, every counter is halved
//!   (the count of additions too, less a quarter of the odd counters, as Caffeine does), so old
//!   popularity fades. A proposal is stored when the writer's owned host cache has room, or
//!   when the estimate of the new tensor (the least of its 4 counters) exceeds the estimate of
//!   the tensor it would displace (the host cache's next victim): ties keep the victim.
//!   Caffeine's doorkeeper-less sketch is mirrored; its window cache, and its random admission
//!   of hot candidates against hash flooding, are not.
//!
//! Row `r` of the sketch counts id `x` at index `splitmix64(x + (r + 1) x
//! 0x9e3779b97f4a7c15) mod width`, so the indices are fixed by the id.

mod sketch;

use std::collections::{BTreeMap, HashMap};

pub use sketch::FrequencySketch;

use crate::hash::IdBuildHasher;

/// The admission rule of a store (`admission` in a policy's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    /// Store every new tensor.
    #[default]
    Always,
    /// Store a tensor on its second proposal.
    SecondHit,
    /// Store a tensor when there is room, or when it is more popular than its victim.
    #[serde(rename = "tinylfu")]
    TinyLfu,
}

/// The most tensors a filter is sized for (bounds the sketch's memory to 64 MiB).
pub const MAX_ENTRIES: u64 = 1 << 23;

/// The state of an admission rule.
#[derive(Debug)]
pub enum Filter {
    Always,
    SecondHit(Seen),
    TinyLfu(FrequencySketch),
}

impl Filter {
    /// The filter of rule `a` for caches that hold `entries` tensors in all.
    pub fn new(a: Admission, entries: u64) -> Filter {
        match a {
            Admission::Always => Filter::Always,
            Admission::SecondHit => Filter::SecondHit(Seen::new(entries)),
            Admission::TinyLfu => Filter::TinyLfu(FrequencySketch::new(entries)),
        }
    }

    /// Whether lookups must be recorded ([`Self::record`]).
    pub fn records_lookups(&self) -> bool {
        matches!(self, Filter::TinyLfu(_))
    }

    /// A lookup asked for `id`.
    pub fn record(&mut self, id: u64) {
        if let Filter::TinyLfu(s) = self {
            s.increment(id);
        }
    }

    /// The tensors an insert proposed after the one not admitted (they are not stored, as
    /// the insert ends there): they count as proposed all the same.
    pub fn proposed(&mut self, rest: &[u64]) {
        match self {
            Filter::Always => {}
            Filter::SecondHit(seen) => rest.iter().for_each(|&id| seen.remember(id)),
            Filter::TinyLfu(s) => rest.iter().for_each(|&id| s.increment(id)),
        }
    }

    /// An insert proposes `id`; `victim` is the tensor it would displace (`None`: there is
    /// room, or nothing may go). Whether to store it.
    pub fn admit(&mut self, id: u64, victim: Option<u64>) -> bool {
        match self {
            Filter::Always => true,
            Filter::SecondHit(seen) => seen.admit(id),
            Filter::TinyLfu(s) => {
                s.increment(id);
                victim.is_none_or(|v| s.frequency(id) > s.frequency(v))
            }
        }
    }
}

/// `second-hit`'s memory: the ids proposed once and not stored since, oldest first, at most
/// `capacity` of them.
#[derive(Debug)]
pub struct Seen {
    by_id: HashMap<u64, u64, IdBuildHasher>,
    order: BTreeMap<u64, u64>,
    next: u64,
    capacity: usize,
}

impl Seen {
    pub fn new(capacity: u64) -> Seen {
        Seen {
            by_id: HashMap::default(),
            order: BTreeMap::new(),
            next: 0,
            capacity: capacity.min(MAX_ENTRIES) as usize,
        }
    }

    /// A proposal of `id`: stored if seen before (and forgotten), else remembered (the
    /// oldest id forgotten when there are too many).
    pub fn admit(&mut self, id: u64) -> bool {
        if let Some(seq) = self.by_id.remove(&id) {
            self.order.remove(&seq);
            return true;
        }
        self.remember(id);
        false
    }

    /// Remembers `id` as proposed once (if it is not remembered already).
    pub fn remember(&mut self, id: u64) {
        if self.capacity == 0 || self.by_id.contains_key(&id) {
            return;
        }
        self.next += 1;
        self.by_id.insert(id, self.next);
        self.order.insert(self.next, id);
        if self.by_id.len() > self.capacity
            && let Some((_, old)) = self.order.pop_first()
        {
            self.by_id.remove(&old);
        }
    }

    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
