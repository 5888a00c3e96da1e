//! A store oracle that is not the store: a small reference model of the prefix store's
//! semantics, written from the module docs of `serving::store::{directory, eviction}`, for
//! `tests/store_oracle.rs` to run step by step beside the real `Directory`.
//!
//! **What the oracle models.** Tensors as a map from id to (parent, index, owner, tier,
//! region, access history); inserts that add only what lies beyond the longest stored prefix;
//! per node an owned cache (host memory less the replica share), an SSD and a replica cache,
//! each within its own capacity; victims chosen among the leaves of one tier of one node (no
//! child of the same owner in that tier; for replicas, no child replicated on that node), in
//! LRU order (last access tick), GDSF order (`clock + freq x cost/size`, the clock being the
//! priority of the tier's last victim) or LFU order (access count, then last access tick),
//! each tier its own, ties broken by the lower tensor id (S3-FIFO and ARC, whose lists move
//! while a victim is sought, are left to `tests/eviction_oracle.rs`); the prefix an
//! insert extends pinned; demotion to SSD, dropping a whole subtree (with its replicas) when
//! the SSD is full, and dropping the demoted tensor itself when nothing on SSD may go;
//! lookups served by the reader's replica first, one access to the serving copy per planned
//! tensor (last to first); replication after `replicate_after_reads` remote reads; regions
//! and their consolidation; read leases (a lookup that plans a load leases its whole stored
//! prefix until `now + lease`, and a leased tensor is no victim in any tier, its replicas
//! included); the loss of a node's store (its replicas gone, every tensor it owned dropped
//! with its subtree, its remote-read counts forgotten).
//!
//! It is deliberately built differently from the directory: plain `BTreeMap`s, no queues,
//! heaps or counters. Every decision is recomputed by brute force: leaves by scanning all
//! tensors for children, bytes by counting, priorities from each entry's history, a region's
//! tail from a log of every region assignment, children's order from their birth tick.
//!
//! **Where the docs leave a choice, the oracle follows the implementation** (assumed here):
//! - a tensor being demoted counts as on SSD while room is made there (so its SSD parent is
//!   no leaf and the SSD victims never include its own prefix on that node);
//! - a subtree is dropped in pre-order, the latest-born child first (the order of `Dropped`
//!   events within one subtree);
//! - consolidation extends a region only from a tail that is still in host memory, and the
//!   tensors after the first of one insert always continue its region;
//! - remote-read counts are forgotten when the reader gets the replica or the tensor is
//!   dropped, not when the replica is evicted;
//! - the ticks of LRU advance once per stored tensor, per planned tensor of a lookup and per
//!   added replica (demotions keep their tick and frequency, and take the SSD clock);
//! - a lease is set to `now + lease` by each lookup that plans a load, not extended to the
//!   later of two expiries; a node's loss drops the tensors it owned in the order of their
//!   ids, each with its subtree, and leaves the tiers' GDSF clocks where they were.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use meshsim::Tier;
use meshsim::serving::store::directory::{
    InsertOutcome, LoadGroup, LoadPlan, Location, StoreEvent, StoreParams, TensorId,
};
use meshsim::serving::store::eviction::Eviction;

/// The access history of one copy (owned tensor or replica).
#[derive(Clone, Copy, Debug)]
pub struct History {
    freq: u32,
    /// Tick of the last access.
    tick: u64,
    /// The clock of the copy's tier when it was last keyed (added, touched or demoted).
    clock: f64,
    /// Cost / size of getting the copy back.
    value: f64,
}

/// The three tiers of one node, each with its own GDSF clock.
#[derive(Clone, Copy)]
enum Queue {
    Host = 0,
    Ssd = 1,
    Replicas = 2,
}

/// Regions of owned tensors and of replica batches are told apart by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    Owned(u64),
    Replica(u64),
}

#[derive(Clone, Debug)]
pub struct OTensor {
    parent: Option<TensorId>,
    index: u32,
    pub owner: u32,
    pub loc: Location,
    region: u64,
    born: u64,
    hist: History,
    /// Until when (ns) a read lease holds it; 0: never leased.
    lease_until: u64,
}

/// The reference model.
pub struct Oracle {
    pub p: StoreParams,
    pub tensors: BTreeMap<TensorId, OTensor>,
    /// Per node: replicas held, with their batch's region and their history.
    pub replicas: Vec<BTreeMap<TensorId, (u64, History)>>,
    /// Per node: GDSF clock of each [`Queue`].
    clocks: Vec<[f64; 3]>,
    /// Per node: remote reads of each tensor.
    reads: Vec<BTreeMap<TensorId, u32>>,
    /// Every region assignment of an owned tensor, in order.
    region_log: Vec<(u64, TensorId)>,
    owned_regions: u64,
    replica_regions: u64,
    tick: u64,
    /// The read lease a lookup grants, and the time of the operations (ns).
    lease_ns: u64,
    now: u64,
    pub events: Vec<StoreEvent>,
}

impl Oracle {
    pub fn new(p: StoreParams) -> Oracle {
        let n = p.nodes as usize;
        Oracle {
            p,
            tensors: BTreeMap::new(),
            replicas: vec![BTreeMap::new(); n],
            clocks: vec![[0.0; 3]; n],
            reads: vec![BTreeMap::new(); n],
            region_log: Vec::new(),
            owned_regions: 0,
            replica_regions: 0,
            tick: 0,
            lease_ns: 0,
            now: 0,
            events: Vec::new(),
        }
    }

    pub fn set_lease(&mut self, ns: u64) {
        self.lease_ns = ns;
    }

    /// Time never goes back.
    pub fn set_now(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    /// Whether `id` is stored and its lease has not expired.
    pub fn leased(&self, id: TensorId) -> bool {
        self.tensors
            .get(&id)
            .is_some_and(|t| t.lease_until > self.now)
    }

    /// The loss of `node`'s store: its replicas, and every tensor it owned with all that
    /// extends it. Returns the tensors lost.
    pub fn lose_node(&mut self, node: u32) -> u64 {
        let Some(replicas) = self.replicas.get_mut(node as usize) else {
            return 0;
        };
        replicas.clear();
        self.reads[node as usize].clear();
        let before = self.tensors.len();
        let owned: Vec<TensorId> = self
            .tensors
            .iter()
            .filter(|(_, t)| t.owner == node)
            .map(|(&id, _)| id)
            .collect();
        for id in owned {
            if self.tensors.contains_key(&id) {
                self.drop_tree(id);
            }
        }
        (before - self.tensors.len()) as u64
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn stored_prefix(&self, chain: &[TensorId]) -> usize {
        (0..=chain.len())
            .rev()
            .find(|&k| chain[..k].iter().all(|id| self.tensors.contains_key(id)))
            .unwrap_or(0)
    }

    /// Owned tensors of `node` in `loc`, leaving `except` out.
    fn count(&self, node: u32, loc: Location, except: Option<TensorId>) -> u64 {
        self.tensors
            .iter()
            .filter(|&(&id, t)| t.owner == node && t.loc == loc && Some(id) != except)
            .count() as u64
    }

    pub fn usage(&self, node: u32) -> (u64, u64, u64) {
        let b = self.p.tensor_bytes;
        (
            self.count(node, Location::Host, None) * b,
            self.replicas[node as usize].len() as u64 * b,
            self.count(node, Location::Ssd, None) * b,
        )
    }

    /// Whether no child of owned tensor `id` is owned by the same node and lies in its tier.
    fn is_leaf(&self, id: TensorId) -> bool {
        let t = &self.tensors[&id];
        !self
            .tensors
            .values()
            .any(|c| c.parent == Some(id) && c.owner == t.owner && c.loc == t.loc)
    }

    /// Whether no child of `id` is replicated on `node`.
    fn is_replica_leaf(&self, node: u32, id: TensorId) -> bool {
        !self.replicas[node as usize]
            .keys()
            .any(|c| self.tensors[c].parent == Some(id))
    }

    /// The eviction order of queue `q`.
    fn kind(&self, q: Queue) -> Eviction {
        match q {
            Queue::Host => self.p.eviction.host,
            Queue::Ssd => self.p.eviction.ssd,
            Queue::Replicas => self.p.eviction.replica,
        }
    }

    /// Eviction order of `kind`: LRU by last access, GDSF by priority, LFU by access count
    /// then last access; then by id. S3-FIFO and ARC are not modelled here (their lists are
    /// checked against references of their own in `tests/eviction_oracle.rs`).
    fn order(kind: Eviction, a: (TensorId, &History), b: (TensorId, &History)) -> Ordering {
        let by_key = match kind {
            Eviction::Lru => a.1.tick.cmp(&b.1.tick),
            Eviction::Gdsf => priority(a.1).total_cmp(&priority(b.1)),
            Eviction::Lfu => (a.1.freq, a.1.tick).cmp(&(b.1.freq, b.1.tick)),
            Eviction::S3Fifo | Eviction::Arc => unimplemented!("{kind:?} is not modelled"),
        };
        by_key.then(a.0.cmp(&b.0))
    }

    /// The first candidate in eviction order; advances the tier's GDSF clock to its priority.
    fn pick(&mut self, node: u32, q: Queue, cands: Vec<(TensorId, History)>) -> Option<TensorId> {
        let kind = self.kind(q);
        let (id, h) = cands
            .into_iter()
            .min_by(|a, b| Self::order(kind, (a.0, &a.1), (b.0, &b.1)))?;
        if kind == Eviction::Gdsf {
            self.clocks[node as usize][q as usize] = priority(&h);
        }
        Some(id)
    }

    fn touch(h: &mut History, tick: u64, clock: f64) {
        h.freq = h.freq.saturating_add(1);
        h.tick = tick;
        h.clock = clock;
    }

    /// Whether `id` is the last tensor ever given its region.
    fn is_region_tail(&self, id: TensorId) -> bool {
        let region = self.tensors[&id].region;
        self.region_log.iter().rev().find(|e| e.0 == region) == Some(&(region, id))
    }

    fn ancestors_and_self(&self, id: TensorId) -> BTreeSet<TensorId> {
        let mut out = BTreeSet::new();
        let mut cur = Some(id);
        while let Some(c) = cur {
            out.insert(c);
            cur = self.tensors.get(&c).and_then(|t| t.parent);
        }
        out
    }

    pub fn insert(&mut self, chain: &[TensorId], owner: u32) -> InsertOutcome {
        let first_event = self.events.len();
        let start = self.stored_prefix(chain);
        for i in start..chain.len() {
            if !self.make_room_for_owned(owner, &chain[..i]) {
                self.events.push(StoreEvent::Refused {
                    node: owner,
                    index: i as u32,
                });
                break;
            }
            let parent = i.checked_sub(1).map(|j| chain[j]);
            let region = match parent.map(|p| &self.tensors[&p]) {
                Some(pt) if i > start => pt.region,
                Some(pt)
                    if self.p.consolidate
                        && pt.owner == owner
                        && pt.loc == Location::Host
                        && self.is_region_tail(chain[i - 1]) =>
                {
                    pt.region
                }
                _ => {
                    self.owned_regions += 1;
                    self.owned_regions
                }
            };
            let tick = self.next_tick();
            let value = (self.p.ssd_ns_per_byte - self.p.host_ns_per_byte).max(0.0);
            let clock = self.clocks[owner as usize][Queue::Host as usize];
            self.region_log.push((region, chain[i]));
            self.tensors.insert(
                chain[i],
                OTensor {
                    parent,
                    index: i as u32,
                    owner,
                    loc: Location::Host,
                    region,
                    born: tick,
                    hist: History {
                        freq: 1,
                        tick,
                        clock,
                        value,
                    },
                    lease_until: 0,
                },
            );
            self.events.push(StoreEvent::Stored {
                node: owner,
                index: i as u32,
                id: chain[i],
            });
        }
        let mut out = InsertOutcome::default();
        for e in &self.events[first_event..] {
            match e {
                StoreEvent::Stored { .. } => out.new_tensors += 1,
                StoreEvent::Demoted { .. } => out.demoted += 1,
                StoreEvent::Dropped { .. } => out.dropped += 1,
                StoreEvent::Refused { .. } => out.refused = true,
                StoreEvent::NotAdmitted { .. } => out.not_admitted = true,
                _ => unreachable!("an insert touches no replica cache"),
            }
        }
        out
    }

    fn make_room_for_owned(&mut self, node: u32, pinned: &[TensorId]) -> bool {
        let b = self.p.tensor_bytes;
        let capacity = self.p.host_capacity - self.p.replica_capacity;
        while (self.count(node, Location::Host, None) + 1) * b > capacity {
            let cands = self
                .tensors
                .iter()
                .filter(|&(&id, t)| {
                    t.owner == node
                        && t.loc == Location::Host
                        && !pinned.contains(&id)
                        && !self.leased(id)
                        && self.is_leaf(id)
                })
                .map(|(&id, t)| (id, t.hist))
                .collect();
            let Some(victim) = self.pick(node, Queue::Host, cands) else {
                return false;
            };
            self.demote(node, victim, pinned);
        }
        true
    }

    fn demote(&mut self, node: u32, id: TensorId, pinned: &[TensorId]) {
        let b = self.p.tensor_bytes;
        let index = self.tensors[&id].index;
        if self.p.ssd_capacity < b {
            // No SSD tier: leaving host memory is being dropped.
            self.drop_tree(id);
            return;
        }
        self.tensors.get_mut(&id).expect("victim is stored").loc = Location::Ssd;
        while (self.count(node, Location::Ssd, Some(id)) + 1) * b > self.p.ssd_capacity {
            let cands = self
                .tensors
                .iter()
                .filter(|&(&v, t)| {
                    t.owner == node
                        && t.loc == Location::Ssd
                        && v != id
                        && !pinned.contains(&v)
                        && !self.leased(v)
                        && self.is_leaf(v)
                })
                .map(|(&v, t)| (v, t.hist))
                .collect();
            match self.pick(node, Queue::Ssd, cands) {
                None => {
                    self.drop_tree(id);
                    return;
                }
                Some(victim) => {
                    self.drop_tree(victim);
                    if !self.tensors.contains_key(&id) {
                        return;
                    }
                }
            }
        }
        // Demoted once its room is made.
        self.events.push(StoreEvent::Demoted { node, index });
        let value = (self.p.recompute_base_ns + index as f64 * self.p.recompute_per_index_ns)
            / self.p.tensor_bytes as f64;
        let clock = self.clocks[node as usize][Queue::Ssd as usize];
        let t = self.tensors.get_mut(&id).expect("still stored");
        t.hist.clock = clock;
        t.hist.value = value;
    }

    /// Drops `id` and then its children's subtrees, latest-born child first.
    fn drop_tree(&mut self, id: TensorId) {
        let t = self.tensors.remove(&id).expect("dropped tensor is stored");
        for r in &mut self.replicas {
            r.remove(&id);
        }
        for r in &mut self.reads {
            r.remove(&id);
        }
        self.events.push(StoreEvent::Dropped {
            node: t.owner,
            index: t.index,
            id,
        });
        let mut children: Vec<(u64, TensorId)> = self
            .tensors
            .iter()
            .filter(|(_, c)| c.parent == Some(id))
            .map(|(&c, ct)| (ct.born, c))
            .collect();
        children.sort_unstable_by(|a, b| b.cmp(a));
        for (_, c) in children {
            self.drop_tree(c);
        }
    }

    pub fn lookup(&mut self, chain: &[TensorId], skip: usize, reader: u32) -> LoadPlan {
        let k = self.stored_prefix(chain);
        let mut plan = LoadPlan {
            stored_chunks: k as u32,
            ..LoadPlan::default()
        };
        if k <= skip {
            return plan;
        }
        if self.lease_ns > 0 {
            let until = self.now + self.lease_ns;
            for id in &chain[..k] {
                self.tensors.get_mut(id).expect("stored prefix").lease_until = until;
            }
        }
        let r = reader as usize;
        // The copy that serves each planned tensor: the reader's replica first.
        let sources: Vec<(u32, Location, Region)> = chain[skip..k]
            .iter()
            .map(|id| match self.replicas[r].get(id) {
                Some(&(region, _)) => (reader, Location::Host, Region::Replica(region)),
                None => {
                    let t = &self.tensors[id];
                    (t.owner, t.loc, Region::Owned(t.region))
                }
            })
            .collect();
        for (j, &(node, location, _)) in sources.iter().enumerate() {
            if plan
                .groups
                .iter()
                .any(|g| (g.node, g.location) == (node, location))
            {
                continue;
            }
            let members: Vec<usize> = (j..sources.len())
                .filter(|&m| (sources[m].0, sources[m].1) == (node, location))
                .collect();
            let segments = members
                .iter()
                .filter(|&&m| m == 0 || sources[m - 1] != sources[m])
                .count() as u32;
            plan.groups.push(LoadGroup {
                node,
                location,
                tier: match (node == reader, location) {
                    (true, Location::Host) => Tier::LocalHost,
                    (true, Location::Ssd) => Tier::LocalSsd,
                    (false, Location::Host) => Tier::RemoteHost,
                    (false, Location::Ssd) => Tier::RemoteSsd,
                },
                tensors: members.len() as u32,
                bytes: members.len() as u64 * self.p.tensor_bytes,
                segments,
                indices: members.iter().map(|&m| (skip + m) as u32).collect(),
                epoch: 0,
            });
        }
        let remote: Vec<TensorId> = (skip..k)
            .filter(|&i| sources[i - skip].0 != reader)
            .map(|i| chain[i])
            .collect();
        if let Some(after) = self.p.replicate_after_reads {
            let mut now = false;
            for id in &remote {
                let n = self.reads[r].entry(*id).or_insert(0);
                *n += 1;
                now |= *n >= after;
            }
            if now {
                plan.replicate = remote;
            }
        }
        for i in (skip..k).rev() {
            let tick = self.next_tick();
            let id = chain[i];
            let clocks = self.clocks[r];
            if let Some((_, h)) = self.replicas[r].get_mut(&id) {
                Self::touch(h, tick, clocks[Queue::Replicas as usize]);
            } else {
                let t = self
                    .tensors
                    .get_mut(&id)
                    .expect("planned tensors are stored");
                let q = match t.loc {
                    Location::Host => Queue::Host,
                    Location::Ssd => Queue::Ssd,
                };
                let clock = self.clocks[t.owner as usize][q as usize];
                Self::touch(&mut t.hist, tick, clock);
            }
        }
        plan
    }

    pub fn add_replicas(&mut self, node: u32, ids: &[TensorId]) -> u32 {
        let n = node as usize;
        let b = self.p.tensor_bytes;
        let capacity = self.p.replica_capacity;
        let mut wanted: Vec<TensorId> = ids
            .iter()
            .copied()
            .filter(|id| {
                self.tensors.get(id).is_some_and(|t| t.owner != node)
                    && !self.replicas[n].contains_key(id)
            })
            .collect();
        wanted.truncate((capacity / b) as usize);
        // The replicated prefix's own ancestors are never evicted for it.
        let keep: BTreeSet<TensorId> = wanted
            .iter()
            .flat_map(|&id| self.ancestors_and_self(id))
            .collect();
        while (self.replicas[n].len() + wanted.len()) as u64 * b > capacity {
            let cands = self.replicas[n]
                .iter()
                .filter(|&(id, _)| {
                    !keep.contains(id) && !self.leased(*id) && self.is_replica_leaf(node, *id)
                })
                .map(|(&id, &(_, h))| (id, h))
                .collect();
            let Some(victim) = self.pick(node, Queue::Replicas, cands) else {
                break;
            };
            self.replicas[n].remove(&victim);
            let index = self.tensors[&victim].index;
            self.events.push(StoreEvent::ReplicaEvicted { node, index });
        }
        let room = (capacity / b) as usize - self.replicas[n].len();
        wanted.truncate(room);
        self.replica_regions += 1;
        for &id in &wanted {
            let tick = self.next_tick();
            let h = History {
                freq: 1,
                tick,
                clock: self.clocks[n][Queue::Replicas as usize],
                value: self.p.net_ns_per_byte,
            };
            self.replicas[n].insert(id, (self.replica_regions, h));
            self.reads[n].remove(&id);
            let index = self.tensors[&id].index;
            self.events.push(StoreEvent::Replicated { node, index });
        }
        wanted.len() as u32
    }
}

/// A copy's GDSF priority: the clock when it was keyed plus frequency x value.
fn priority(h: &History) -> f64 {
    h.clock + h.freq as f64 * h.value
}
