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
//! to drop, the tensor being demoted is dropped instead. A prefix thus shrinks from its end.
//! An insert never demotes or drops the prefix it extends (the tensors before the new one are
//! pinned while it runs): when the writer's node has no room without them, the insert stops
//! there and is counted as refused ([`StoreEvent::Refused`], `StoreStats::refused`). Each tier evicts in LRU or GDSF order
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
    /// An insert stopped before the tensor at `index`: `node` had no room for it without
    /// evicting the prefix being extended (which an insert never does).
    Refused {
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
    /// Whether the insert stopped early for want of room (see [`StoreEvent::Refused`]).
    pub refused: bool,
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
            // The prefix being extended is pinned: making room never demotes or drops it.
            if !self.make_room_for_owned(owner, &chain[..i], &mut out) {
                out.refused = true;
                self.stats.refused += 1;
                self.record(StoreEvent::Refused {
                    node: owner,
                    index: i as u32,
                });
                break;
            }
            debug_assert!(parent.is_none_or(|p| self.tensors.contains_key(&p)));
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
}

mod check;
mod evict;
#[cfg(test)]
mod tests;
