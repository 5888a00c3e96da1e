//! The bookkeeping of the distributed prefix store: which tensors exist, who owns them, in
//! which tier, which nodes hold replicas, and what to evict. A pure data structure (no time,
//! no I/O); the [`super::metadata::Metadata`] actor owns it and the store servers move the
//! bytes it decides about.
//!
//! **Tensors.** A prompt is cut into chunks of `tensor_tokens` tokens; the KV of one full chunk
//! (all layers) is one tensor, identified by the chained hash of the whole prefix up to its end
//! ([`crate::hash::block_hash`] chained chunk by chunk), so equal ids mean equal prefixes. A
//! tensor's parent is the tensor of the previous chunk. Storing a prompt adds only the tensors
//! beyond the longest common prefix (LCP) of what is stored: prompts that diverge share their
//! common part, like a trie at tensor granularity.
//!
//! **Flat metadata.** An object (a stored prompt prefix) is the list of its tensor ids; because
//! ids are chained, the record of any prefix is found by walking the query's ids in a hash map
//! until the first miss: one request, O(prompt chunks), no distributed trie.
//!
//! **Servers.** Each node's server has host memory (`host_capacity`, split into an owned part
//! and at most `replica_fraction` of it for replicas) and SSD (`ssd_capacity`). New tensors go
//! to the writer's host memory (the writer owns them). To make room, replicas are evicted first
//! (they can be fetched again); then owned tensors are *demoted* to SSD; a tensor is dropped
//! only when SSD is full too, and dropping a tensor drops its descendants (they are unreachable
//! without it) and its replicas everywhere. Victims are taken from the leaves of the prefix
//! trie first (tensors without stored children), in LRU or GDSF order; when SSD has no leaf
//! to drop, the tensor being demoted is dropped instead. A prefix thus shrinks from its end. Each tier evicts in LRU or GDSF order
//! ([`super::eviction`]); GDSF's cost is the time to get the tensor back: SSD read instead of
//! host read for a demotion, recomputation for a drop, a network fetch for a replica.
//!
//! **Replication** (PTStore): when a node has read a tensor from a remote owner
//! `replicate_after_reads` times, the remote part of the prefix it just loaded is copied into
//! its replica cache (the copy is made from the GPU that loaded it, over local PCIe).
//! **Consolidation** (PTStore): an increment appended to a prefix whose last tensor is the tail
//! of a contiguous region on the same owner extends that region; otherwise it starts a region.
//! A load gathers one segment per region run, so consolidated prefixes load in fewer segments.

use std::collections::HashMap;

use super::eviction::{Eviction, EvictionQueue};
use crate::hash::IdBuildHasher;
use crate::metrics::{StoreStats, Tier};

pub type TensorId = u64;

/// Where an owned tensor lives on its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Location {
    Host,
    Ssd,
}

/// Sizes, rules and costs of the store.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreParams {
    pub nodes: u32,
    pub tensor_bytes: u64,
    pub host_capacity: u64,
    pub replica_capacity: u64,
    pub ssd_capacity: u64,
    pub eviction: Eviction,
    pub consolidate: bool,
    /// Replicate after this many remote reads by one node; `None` disables replication.
    pub replicate_after_reads: Option<u32>,
    /// ns per byte of reading host memory, SSD, and the network (GDSF costs).
    pub host_ns_per_byte: f64,
    pub ssd_ns_per_byte: f64,
    pub net_ns_per_byte: f64,
    /// Recomputing tensor `i` costs `recompute_base_ns + i x recompute_per_index_ns`.
    pub recompute_base_ns: f64,
    pub recompute_per_index_ns: f64,
}

/// One recorded decision (for tests and snapshots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    Stored {
        node: u32,
        index: u32,
        id: TensorId,
    },
    Demoted {
        node: u32,
        index: u32,
        replicas_left: u64,
    },
    Dropped {
        node: u32,
        index: u32,
        id: TensorId,
    },
    Replicated {
        node: u32,
        index: u32,
    },
    ReplicaEvicted {
        node: u32,
        index: u32,
    },
}

#[derive(Clone, Debug)]
struct Tensor {
    parent: Option<TensorId>,
    index: u32,
    owner: u32,
    loc: Location,
    region: u64,
    children: Vec<TensorId>,
    replicas: Vec<u32>,
}

#[derive(Debug)]
struct Server {
    owned_host_bytes: u64,
    replica_bytes: u64,
    ssd_bytes: u64,
    host_q: EvictionQueue,
    ssd_q: EvictionQueue,
    replica_q: EvictionQueue,
    /// Replicas held: tensor -> replica region.
    replicas: HashMap<TensorId, u64, IdBuildHasher>,
    /// Remote reads of each tensor by this node.
    remote_reads: HashMap<TensorId, u32, IdBuildHasher>,
}

/// One part of a load: the tensors that come from one node's tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadGroup {
    pub node: u32,
    pub location: Location,
    pub tier: Tier,
    pub tensors: u32,
    pub bytes: u64,
    pub segments: u32,
}

/// The answer to a lookup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadPlan {
    /// Leading chunks of the query that are stored (including the skipped ones).
    pub stored_chunks: u32,
    pub groups: Vec<LoadGroup>,
    /// Remote tensors to copy into the reader's replica cache once loaded.
    pub replicate: Vec<TensorId>,
}

/// What an insert did on the owner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    pub new_tensors: u32,
    pub demoted: u32,
    pub dropped: u32,
    pub replicas_evicted: u32,
}

/// The store's bookkeeping.
#[derive(Debug)]
pub struct Directory {
    params: StoreParams,
    tensors: HashMap<TensorId, Tensor, IdBuildHasher>,
    servers: Vec<Server>,
    region_tail: HashMap<u64, TensorId, IdBuildHasher>,
    next_region: u64,
    tick: u64,
    pub stats: StoreStats,
    /// Recorded decisions, when recording is on.
    pub events: Option<Vec<StoreEvent>>,
}

impl Directory {
    pub fn new(params: StoreParams) -> Directory {
        let servers = (0..params.nodes)
            .map(|_| Server {
                owned_host_bytes: 0,
                replica_bytes: 0,
                ssd_bytes: 0,
                host_q: EvictionQueue::new(params.eviction),
                ssd_q: EvictionQueue::new(params.eviction),
                replica_q: EvictionQueue::new(params.eviction),
                replicas: HashMap::default(),
                remote_reads: HashMap::default(),
            })
            .collect();
        Directory {
            params,
            tensors: HashMap::default(),
            servers,
            region_tail: HashMap::default(),
            next_region: 0,
            tick: 0,
            stats: StoreStats::default(),
            events: None,
        }
    }

    pub fn params(&self) -> &StoreParams {
        &self.params
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn contains(&self, id: TensorId) -> bool {
        self.tensors.contains_key(&id)
    }

    /// Number of leading ids of `chain` that are stored.
    pub fn stored_prefix(&self, chain: &[TensorId]) -> usize {
        chain
            .iter()
            .take_while(|id| self.tensors.contains_key(id))
            .count()
    }

    fn record(&mut self, e: StoreEvent) {
        if let Some(events) = &mut self.events {
            events.push(e);
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn demote_value(&self) -> f64 {
        (self.params.ssd_ns_per_byte - self.params.host_ns_per_byte).max(0.0)
    }

    fn drop_value(&self, index: u32) -> f64 {
        (self.params.recompute_base_ns + index as f64 * self.params.recompute_per_index_ns)
            / self.params.tensor_bytes as f64
    }

    /// Finds the stored prefix of `chain` for a reader on `reader`, and plans loading the
    /// stored tensors after the first `skip` (those the reader already has). Counts as an
    /// access to every tensor it plans to load.
    pub fn lookup(&mut self, chain: &[TensorId], skip: usize, reader: u32) -> LoadPlan {
        let k = self.stored_prefix(chain);
        let mut plan = LoadPlan {
            stored_chunks: k as u32,
            ..LoadPlan::default()
        };
        if k <= skip {
            return plan;
        }
        let bytes = self.params.tensor_bytes;
        let mut last: Option<(u32, Location, u64)> = None;
        let mut replicate_now = false;
        let mut remote = Vec::new();
        for &id in &chain[skip..k] {
            let t = &self.tensors[&id];
            let (node, loc, region) =
                if let Some(&r) = self.servers[reader as usize].replicas.get(&id) {
                    (reader, Location::Host, r)
                } else {
                    (t.owner, t.loc, t.region)
                };
            let tier = match (node == reader, loc) {
                (true, Location::Host) => Tier::LocalHost,
                (true, Location::Ssd) => Tier::LocalSsd,
                (false, Location::Host) => Tier::RemoteHost,
                (false, Location::Ssd) => Tier::RemoteSsd,
            };
            let new_segment = last != Some((node, loc, region));
            last = Some((node, loc, region));
            let group = match plan
                .groups
                .iter_mut()
                .find(|g| g.node == node && g.location == loc)
            {
                Some(g) => g,
                None => {
                    plan.groups.push(LoadGroup {
                        node,
                        location: loc,
                        tier,
                        tensors: 0,
                        bytes: 0,
                        segments: 0,
                    });
                    plan.groups.last_mut().expect("just pushed")
                }
            };
            group.tensors += 1;
            group.bytes += bytes;
            group.segments += new_segment as u32;
            if node != reader {
                remote.push(id);
                if let Some(after) = self.params.replicate_after_reads {
                    let reads = self.servers[reader as usize]
                        .remote_reads
                        .entry(id)
                        .or_insert(0);
                    *reads += 1;
                    replicate_now |= *reads >= after;
                }
            }
        }
        // Touch from the last tensor to the first, so that under LRU a prefix's early
        // tensors are the most recent.
        for i in (skip..k).rev() {
            let id = chain[i];
            let tick = self.next_tick();
            let t = &self.tensors[&id];
            let (owner, loc) = (t.owner, t.loc);
            let server = &mut self.servers[reader as usize];
            if server.replicas.contains_key(&id) {
                server.replica_q.touch(id, tick);
            }
            let owner_server = &mut self.servers[owner as usize];
            match loc {
                Location::Host => owner_server.host_q.touch(id, tick),
                Location::Ssd => owner_server.ssd_q.touch(id, tick),
            }
        }
        if replicate_now {
            plan.replicate = remote;
        }
        plan
    }

    /// Stores the tensors of `chain` beyond its stored prefix, owned by `owner`.
    pub fn insert(&mut self, chain: &[TensorId], owner: u32) -> InsertOutcome {
        let mut out = InsertOutcome::default();
        let start = self.stored_prefix(chain);
        for i in start..chain.len() {
            let id = chain[i];
            if self.tensors.contains_key(&id) {
                continue;
            }
            let parent = if i == 0 { None } else { Some(chain[i - 1]) };
            if !self.make_room_for_owned(owner, &mut out) {
                break;
            }
            // Making room may have dropped this prefix's own ancestors.
            if parent.is_some_and(|p| !self.tensors.contains_key(&p)) {
                break;
            }
            let region = match parent {
                // Later tensors of one increment are written contiguously after the first.
                Some(p)
                    if i > start
                        && self.tensors[&p].owner == owner
                        && self.region_tail.get(&self.tensors[&p].region) == Some(&p) =>
                {
                    self.tensors[&p].region
                }
                Some(p)
                    if self.params.consolidate
                        && self.tensors[&p].owner == owner
                        && self.tensors[&p].loc == Location::Host
                        && self.region_tail.get(&self.tensors[&p].region) == Some(&p) =>
                {
                    self.tensors[&p].region
                }
                _ => {
                    self.next_region += 1;
                    self.next_region
                }
            };
            self.region_tail.insert(region, id);
            if let Some(p) = parent {
                self.tensors
                    .get_mut(&p)
                    .expect("parent exists")
                    .children
                    .push(id);
            }
            self.tensors.insert(
                id,
                Tensor {
                    parent,
                    index: i as u32,
                    owner,
                    loc: Location::Host,
                    region,
                    children: Vec::new(),
                    replicas: Vec::new(),
                },
            );
            let tick = self.next_tick();
            let value = self.demote_value();
            let bytes = self.params.tensor_bytes;
            let server = &mut self.servers[owner as usize];
            server.owned_host_bytes += bytes;
            server.host_q.insert(id, 1, value, tick);
            out.new_tensors += 1;
            self.stats.stored += 1;
            self.record(StoreEvent::Stored {
                node: owner,
                index: i as u32,
                id,
            });
        }
        out
    }

    fn host_used(&self, node: u32) -> u64 {
        let s = &self.servers[node as usize];
        s.owned_host_bytes + s.replica_bytes
    }

    /// Frees host memory on `node` for one more owned tensor: replicas first, then demote
    /// owned tensors to SSD (dropping from SSD when it is full). False if impossible.
    fn make_room_for_owned(&mut self, node: u32, out: &mut InsertOutcome) -> bool {
        let bytes = self.params.tensor_bytes;
        // Bounded: each round removes one entry from a queue.
        while self.host_used(node) + bytes > self.params.host_capacity {
            if self.evict_replica(node) {
                out.replicas_evicted += 1;
                continue;
            }
            let tensors = &self.tensors;
            let q = &mut self.servers[node as usize].host_q;
            let leaf = |id: u64| tensors[&id].children.is_empty();
            let Some(victim) = q.pop_first_where(leaf).or_else(|| q.pop()) else {
                return false;
            };
            out.demoted += 1;
            if !self.demote(node, victim, out) {
                return false;
            }
        }
        true
    }

    fn evict_replica(&mut self, node: u32) -> bool {
        self.evict_replica_except(node, &[])
    }

    /// Evicts one replica on `node` that is not in `keep`.
    fn evict_replica_except(&mut self, node: u32, keep: &[TensorId]) -> bool {
        let server = &mut self.servers[node as usize];
        let Some(id) = server.replica_q.pop_first_where(|id| !keep.contains(&id)) else {
            return false;
        };
        server.replicas.remove(&id);
        server.replica_bytes -= self.params.tensor_bytes;
        let t = self
            .tensors
            .get_mut(&id)
            .expect("replica of a stored tensor");
        t.replicas.retain(|&n| n != node);
        let index = t.index;
        self.stats.replicas_evicted += 1;
        self.record(StoreEvent::ReplicaEvicted { node, index });
        true
    }

    /// Moves `id` (already out of the host queue) to SSD on `node`, dropping SSD tensors to
    /// make room; drops `id` itself if SSD cannot hold it.
    fn demote(&mut self, node: u32, id: TensorId, out: &mut InsertOutcome) -> bool {
        let bytes = self.params.tensor_bytes;
        let index = self.tensors[&id].index;
        let replicas_left = self.servers[node as usize].replica_bytes;
        self.record(StoreEvent::Demoted {
            node,
            index,
            replicas_left,
        });
        self.stats.demoted += 1;
        self.servers[node as usize].owned_host_bytes -= bytes;
        // The tensor is now between tiers: mark it on SSD so a cascade can find it.
        self.tensors
            .get_mut(&id)
            .expect("demoted tensor exists")
            .loc = Location::Ssd;
        while self.servers[node as usize].ssd_bytes + bytes > self.params.ssd_capacity {
            let tensors = &self.tensors;
            let q = &mut self.servers[node as usize].ssd_q;
            let Some(victim) = q.pop_first_where(|v| tensors[&v].children.is_empty()) else {
                // No leaf on SSD can go: the tensor being demoted goes instead.
                out.dropped += self.drop_tree(id);
                return true;
            };
            // Out of its queue now: its bytes leave here, not in `drop_tree`.
            self.servers[node as usize].ssd_bytes -= bytes;
            out.dropped += self.drop_tree(victim);
            if !self.tensors.contains_key(&id) {
                // The victim was an ancestor of `id`: it is gone with it.
                return true;
            }
        }
        let tick = self.next_tick();
        let freq = 1;
        let value = self.drop_value(index);
        let server = &mut self.servers[node as usize];
        server.ssd_bytes += bytes;
        server.ssd_q.insert(id, freq, value, tick);
        true
    }

    /// Drops `root` and all its descendants, with their replicas; `root` may already be out of
    /// its queue (a tensor just popped). Returns the number dropped.
    fn drop_tree(&mut self, root: TensorId) -> u32 {
        let bytes = self.params.tensor_bytes;
        if let Some(p) = self.tensors[&root].parent
            && let Some(pt) = self.tensors.get_mut(&p)
        {
            pt.children.retain(|&c| c != root);
        }
        let mut stack = vec![root];
        let mut n = 0;
        // Bounded by the number of stored tensors.
        while let Some(id) = stack.pop() {
            let Some(t) = self.tensors.remove(&id) else {
                continue;
            };
            n += 1;
            stack.extend_from_slice(&t.children);
            let owner = &mut self.servers[t.owner as usize];
            match t.loc {
                Location::Host => {
                    if owner.host_q.remove(id) {
                        owner.owned_host_bytes -= bytes;
                    }
                }
                Location::Ssd => {
                    if owner.ssd_q.remove(id) {
                        owner.ssd_bytes -= bytes;
                    }
                }
            }
            for &node in &t.replicas {
                let s = &mut self.servers[node as usize];
                s.replicas.remove(&id);
                s.replica_q.remove(id);
                s.replica_bytes -= bytes;
            }
            for s in &mut self.servers {
                s.remote_reads.remove(&id);
            }
            if self.region_tail.get(&t.region) == Some(&id) {
                self.region_tail.remove(&t.region);
            }
            self.stats.dropped += 1;
            self.record(StoreEvent::Dropped {
                node: t.owner,
                index: t.index,
                id,
            });
        }
        n
    }

    /// Adds replicas of `ids` (in prefix order) on `node`, as one contiguous region, within
    /// the replica cache's capacity (evicting older replicas); replicas never push owned
    /// tensors out. Returns how many were added.
    pub fn add_replicas(&mut self, node: u32, ids: &[TensorId]) -> u32 {
        let bytes = self.params.tensor_bytes;
        let wanted: Vec<TensorId> = ids
            .iter()
            .copied()
            .filter(|id| {
                self.tensors.get(id).is_some_and(|t| t.owner != node)
                    && !self.servers[node as usize].replicas.contains_key(id)
            })
            .collect();
        // Keep the beginning of the prefix if the whole does not fit in the replica cache.
        let fit = (self.params.replica_capacity / bytes) as usize;
        let wanted = &wanted[..wanted.len().min(fit)];
        let need = wanted.len() as u64 * bytes;
        // The batch's own ancestors stay: evicting them would split the prefix it extends.
        let keep = wanted
            .first()
            .map(|&first| self.path_to(first))
            .unwrap_or_default();
        // Evict older replicas (bounded: one per round) until the batch fits.
        while self.servers[node as usize].replica_bytes + need > self.params.replica_capacity
            || self.host_used(node) + need > self.params.host_capacity
        {
            if !self.evict_replica_except(node, &keep) {
                break;
            }
        }
        let room_replicas =
            self.params.replica_capacity - self.servers[node as usize].replica_bytes;
        let room_host = self
            .params
            .host_capacity
            .saturating_sub(self.host_used(node));
        let n = (room_replicas.min(room_host) / bytes) as usize;
        let wanted = &wanted[..wanted.len().min(n)];
        self.next_region += 1;
        let region = self.next_region;
        for &id in wanted {
            let tick = self.next_tick();
            let value = self.params.net_ns_per_byte;
            let s = &mut self.servers[node as usize];
            s.replicas.insert(id, region);
            s.replica_bytes += bytes;
            s.replica_q.insert(id, 1, value, tick);
            s.remote_reads.remove(&id);
            let t = self.tensors.get_mut(&id).expect("filtered above");
            t.replicas.push(node);
            let index = t.index;
            self.stats.replicated += 1;
            self.record(StoreEvent::Replicated { node, index });
        }
        wanted.len() as u32
    }

    /// Bytes per server: (owned in host memory, replicas, SSD).
    pub fn usage(&self, node: u32) -> (u64, u64, u64) {
        let s = &self.servers[node as usize];
        (s.owned_host_bytes, s.replica_bytes, s.ssd_bytes)
    }

    /// Checks every invariant; for tests and end-of-run checks.
    pub fn check(&self) -> Result<(), String> {
        let p = &self.params;
        let b = p.tensor_bytes;
        let mut owned = vec![0u64; p.nodes as usize];
        let mut ssd = vec![0u64; p.nodes as usize];
        let mut reps = vec![0u64; p.nodes as usize];
        for (&id, t) in &self.tensors {
            if let Some(parent) = t.parent {
                let Some(pt) = self.tensors.get(&parent) else {
                    return Err(format!("tensor {id:#x} has no parent {parent:#x}"));
                };
                if !pt.children.contains(&id) || pt.index + 1 != t.index {
                    return Err(format!("tensor {id:#x} and its parent disagree"));
                }
            } else if t.index != 0 {
                return Err(format!("root tensor {id:#x} at index {}", t.index));
            }
            let s = &self.servers[t.owner as usize];
            match t.loc {
                Location::Host => {
                    owned[t.owner as usize] += b;
                    if !s.host_q.contains(id) {
                        return Err(format!("host tensor {id:#x} not in its queue"));
                    }
                }
                Location::Ssd => {
                    ssd[t.owner as usize] += b;
                    if !s.ssd_q.contains(id) {
                        return Err(format!("SSD tensor {id:#x} not in its queue"));
                    }
                }
            }
            for &n in &t.replicas {
                reps[n as usize] += b;
                if n == t.owner || !self.servers[n as usize].replicas.contains_key(&id) {
                    return Err(format!("replica of {id:#x} on node {n} is not recorded"));
                }
            }
        }
        for (n, s) in self.servers.iter().enumerate() {
            if s.owned_host_bytes != owned[n] || s.ssd_bytes != ssd[n] || s.replica_bytes != reps[n]
            {
                return Err(format!("node {n}: byte counters disagree with the tensors"));
            }
            if s.owned_host_bytes + s.replica_bytes > p.host_capacity {
                return Err(format!("node {n}: host memory over capacity"));
            }
            if s.replica_bytes > p.replica_capacity || s.ssd_bytes > p.ssd_capacity {
                return Err(format!("node {n}: replica cache or SSD over capacity"));
            }
            let queued = (s.host_q.len() + s.ssd_q.len()) as u64 * b;
            if queued != owned[n] + ssd[n] || s.replica_q.len() as u64 * b != reps[n] {
                return Err(format!("node {n}: queues disagree with the tensors"));
            }
            if s.replicas.len() != s.replica_q.len() {
                return Err(format!("node {n}: replica map and queue disagree"));
            }
        }
        Ok(())
    }

    /// The full chain of ids from the root to `id`, by walking parents (for reference checks).
    pub fn path_to(&self, id: TensorId) -> Vec<TensorId> {
        let mut path = Vec::new();
        let mut cur = Some(id);
        while let Some(c) = cur {
            path.push(c);
            cur = self.tensors.get(&c).and_then(|t| t.parent);
        }
        path.reverse();
        path
    }

    /// All stored ids, sorted (for reference checks).
    pub fn ids(&self) -> Vec<TensorId> {
        let mut v: Vec<TensorId> = self.tensors.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
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
        // Four more: the last replica goes, then the chain's newest tensors are demoted, and
        // when SSD is full the tensor being demoted is dropped: the stored prefix is cut.
        d.insert(&chain(&[7, 8, 9, 10, 11, 12, 13]), 0);
        assert_eq!(d.usage(0), (300, 0, 200));
        assert_eq!(d.stored_prefix(&chain(&[7, 8, 9, 10, 11, 12, 13])), 5);
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
}
