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
//! **Servers: an owned cache and a replica cache.** Each node's server splits its host memory
//! (`host_capacity`) in two fixed shares: the *replica cache* (`replica_capacity`, host memory
//! x `replica_fraction`; 0 for EvoStore, which has no replicas) and the *owned cache* (the
//! rest, [`Directory::owned_capacity`]). Behind them is the SSD (`ssd_capacity`), for owned
//! tensors only. Neither cache ever takes room from the other, even when the other is empty:
//! owned tensors never use the replica share, and replicas never use the owned share, so
//! replication keeps its share however full of owned tensors the node is.
//!
//! - New tensors go to the writer's owned cache (the writer owns them). Making room there
//!   *demotes* owned tensors to the SSD; when the SSD is full, making room there *drops* a
//!   tensor with its whole subtree (its descendants are unreachable without it, on every node)
//!   and its replicas everywhere. When the SSD holds nothing that may go (no SSD, or only the
//!   pinned prefix), the tensor being demoted is dropped instead. Replicas are never evicted to
//!   make room for an owned tensor.
//! - Replicas go to the reader's replica cache. Making room there *evicts* replicas (they can
//!   be fetched again from the owner); it never demotes or drops an owned tensor.
//!
//! **Leaf-first victims.** Each tier of each node (owned host memory, SSD, replica cache)
//! chooses its victim among its *leaves* in its order (LRU, GDSF, LFU, S3-FIFO or ARC, see
//! [`super::eviction`]; each tier's queue knows its capacity in tensors): a tensor with no
//! child in the same tier of the same node. A child already demoted to SSD, or owned by another node, does
//! not make its parent a non-leaf in host memory; a child in host memory does not make its
//! parent a non-leaf on SSD; a replica is a leaf when no child of it is a replica on the same
//! node. A prefix thus shrinks from its end, tier by tier. Every tensor counts its children per
//! tier on its owner (and every replica its replica children), so the test is O(1). Leaves
//! always exist: the tensor of highest index in a tier has no child there.
//! An insert never demotes or drops the prefix it extends (the tensors before the new one are
//! pinned while it runs): when the writer's node has no room without them, the insert stops
//! there and is counted as refused ([`StoreEvent::Refused`], `StoreStats::refused`). Likewise
//! adding replicas never evicts the replicated prefix's own ancestors. GDSF's cost is the time
//! to get the tensor back ([`super::eviction`]): SSD read instead of host read for a demotion,
//! recomputation for a drop, a network fetch for a replica.
//!
//! **Admission.** Before a new tensor is stored, the store's admission rule
//! ([`super::admission`]) may refuse it; the insert then stops there
//! ([`StoreEvent::NotAdmitted`], `StoreStats::not_admitted`), before any room is made. Under
//! `tinylfu` it compares the tensor with the owned cache's next victim (found as making room
//! would find it, without evicting it), and every lookup counts the tensors it asks for.
//!
//! **Access counts** (GDSF's frequency; LRU's last access). They are what the metadata service
//! sees, since it makes every eviction decision: it plans every load, while the reads
//! themselves (one-sided RDMA from host memory) are invisible to the owner's CPU. So:
//! - each tensor that a [`Directory::lookup`] plans to load is one access to the copy that
//!   will serve it: the reader's replica when the reader holds one (its own node serves the
//!   read), otherwise the owner's tensor, in host memory or on SSD. A read served by a replica
//!   is *not* an access to the owner's tensor (the owner serves nothing), so a prefix that
//!   every reader holds as a replica cools down on its owner, where it may be demoted;
//! - tensors the reader skips (already in its GPU cache) and tensors beyond the stored prefix
//!   are not loaded and not counted; inserting a prompt does not count as an access to the
//!   stored prefix it extends;
//! - a new owned tensor or replica starts with one access (its write); a demoted tensor keeps
//!   its count and its last access (the SSD queue takes over its history; a demotion is no
//!   access); a replica's count is its own, separate from the owner's.
//!
//! **Read leases.** A lookup that plans a load holds the path it reads (from the root) for
//! `read_lease_ms` ([`Directory::set_lease`]): leased tensors are never victims, so a load in
//! flight never reads memory that was freed under it. Leases expire by themselves.
//!
//! **Replication** (PTStore): when a node has read a tensor from a remote owner
//! `replicate_after_reads` times, the remote part of the prefix it just loaded is copied into
//! its replica cache (the copy is made from the GPU that loaded it, over local PCIe).
//! **Consolidation** (PTStore): an increment appended to a prefix whose last tensor is the tail
//! of a contiguous region on the same owner extends that region; otherwise it starts a region.
//! A load gathers one segment per region run, so consolidated prefixes load in fewer segments.

use std::collections::HashMap;

use super::TierEviction;
use super::admission::{Admission, Filter};
use super::eviction::{Access, EvictionQueue};
use super::read_counts::{NO_ROW, ReadCounts};
use crate::hash::IdBuildHasher;
use crate::metrics::{StoreStats, Tier};

pub type TensorId = u64;

/// Where an owned tensor lives on its owner.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Location {
    Host,
    Ssd,
}

/// Sizes, rules and costs of the store.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreParams {
    pub nodes: u32,
    pub tensor_bytes: u64,
    /// Host memory per server, both caches together.
    pub host_capacity: u64,
    /// The replica cache's share of `host_capacity` (at most all of it); the owned cache has
    /// the rest.
    pub replica_capacity: u64,
    /// SSD per server, for owned tensors.
    pub ssd_capacity: u64,
    /// The order each tier evicts in.
    pub eviction: TierEviction,
    /// Which new tensors an insert stores.
    pub admission: Admission,
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
    /// An insert stopped before the tensor at `index`: the admission rule did not admit it
    /// ([`super::admission`]).
    NotAdmitted {
        node: u32,
        index: u32,
    },
}

/// A stored tensor's record.
#[derive(Clone, Debug)]
struct Tensor {
    replicas: Vec<u32>,
    /// Until when (ns) a read lease holds it (see [`Directory::set_lease`]); 0: never leased.
    lease_until: u64,
    region: u64,
    owner: u32,
    index: u32,
    /// Children owned by the same node, in its host memory / on its SSD (whatever this
    /// tensor's own tier): the tensor is a leaf of its tier when the count of that tier is 0.
    host_kids: u32,
    ssd_kids: u32,
    loc: Location,
    /// Its row of remote-read counts ([`ReadCounts`]), or [`NO_ROW`] without replication.
    reads: u32,
    parent: Option<TensorId>,
    children: Vec<TensorId>,
}

impl Tensor {
    /// The count of children owned by the same node and in tier `loc`.
    fn kids_mut(&mut self, loc: Location) -> &mut u32 {
        match loc {
            Location::Host => &mut self.host_kids,
            Location::Ssd => &mut self.ssd_kids,
        }
    }

    /// Whether no child of this tensor lies in its own tier of its own node.
    fn is_leaf(&self) -> bool {
        match self.loc {
            Location::Host => self.host_kids == 0,
            Location::Ssd => self.ssd_kids == 0,
        }
    }
}

/// A replica held by a node.
#[derive(Clone, Copy, Debug)]
struct Replica {
    region: u64,
    /// Children of the tensor that are replicas on the same node: a replica is a leaf of the
    /// replica cache when this is 0.
    kids: u32,
}

#[derive(Debug)]
struct Server {
    owned_host_bytes: u64,
    replica_bytes: u64,
    ssd_bytes: u64,
    host_q: EvictionQueue,
    ssd_q: EvictionQueue,
    replica_q: EvictionQueue,
    /// Replicas held.
    replicas: HashMap<TensorId, Replica, IdBuildHasher>,
}

/// One part of a load: the tensors that come from one node's tier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoadGroup {
    pub node: u32,
    pub location: Location,
    pub tier: Tier,
    pub tensors: u32,
    pub bytes: u64,
    pub segments: u32,
    /// Where in the query chain its tensors are: the indices of its tensors (in chain order),
    /// so that a reader that moves real bytes knows which tensor lands at which positions.
    pub indices: Vec<u32>,
    /// The losses of `node`'s store that the planner knew of (see
    /// [`crate::actor::Work::Fetch`]); the directory plans with 0, the metadata service sets
    /// it.
    pub epoch: u32,
}

/// A change of what a server holds, in the order the directory made it: what a store that
/// holds real bytes applies to its memory (see [`Directory::changes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Change {
    /// `node` now owns `id` in host memory (its bytes are the ones its server just received).
    Stored { node: u32, id: TensorId },
    /// `node` moved owned `id` from host memory to SSD.
    Demoted { node: u32, id: TensorId },
    /// `node` no longer owns `id` (in host memory or on SSD).
    Dropped { node: u32, id: TensorId },
    /// `node` now holds a replica of `id` in its replica cache.
    Replicated { node: u32, id: TensorId },
    /// `node` no longer holds a replica of `id`.
    ReplicaGone { node: u32, id: TensorId },
}

impl Change {
    /// The node whose server the change concerns.
    pub fn node(&self) -> u32 {
        match *self {
            Change::Stored { node, .. }
            | Change::Demoted { node, .. }
            | Change::Dropped { node, .. }
            | Change::Replicated { node, .. }
            | Change::ReplicaGone { node, .. } => node,
        }
    }
}

/// The answer to a lookup.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Owned tensors moved from host memory to SSD (bytes the server writes there).
    pub demoted: u32,
    /// Tensors dropped (from SSD, or from host memory where there is no SSD tier).
    pub dropped: u32,
    /// Whether the insert stopped early for want of room (see [`StoreEvent::Refused`]).
    pub refused: bool,
    /// Whether the insert stopped early at a tensor its admission rule did not admit.
    pub not_admitted: bool,
}

/// What serves one tensor of a lookup: the reader's replica, or its owner's copy.
#[derive(Clone, Copy, Debug)]
struct Served {
    node: u32,
    loc: Location,
    region: u64,
    replica: bool,
    /// The tensor's row of remote-read counts.
    reads: u32,
}

/// The store's bookkeeping.
#[derive(Debug)]
pub struct Directory {
    params: StoreParams,
    tensors: HashMap<TensorId, Tensor, IdBuildHasher>,
    servers: Vec<Server>,
    /// Each node's remote reads of each tensor, when the store replicates (PTStore).
    reads: Option<ReadCounts>,
    region_tail: HashMap<u64, TensorId, IdBuildHasher>,
    next_region: u64,
    tick: u64,
    /// The read lease a lookup grants (see [`Directory::set_lease`]); each tensor keeps its
    /// own expiry.
    lease_ns: u64,
    now_ns: u64,
    pub stats: StoreStats,
    /// The admission rule's state.
    admission: Filter,
    /// Recorded decisions, when recording is on.
    pub events: Option<Vec<StoreEvent>>,
    /// Changes of what each server holds, when tracking is on (see [`Directory::changes`]).
    changes: Option<Vec<Change>>,
    /// A lookup's notes, kept between lookups for their allocation.
    scratch: Vec<Served>,
}

impl Directory {
    /// # Panics
    /// If the replica cache is larger than host memory (the scenario's `replica_fraction` is
    /// validated to lie in [0, 1)).
    pub fn new(params: StoreParams) -> Directory {
        assert!(
            params.replica_capacity <= params.host_capacity,
            "replica cache ({} B) larger than host memory ({} B)",
            params.replica_capacity,
            params.host_capacity
        );
        // Each tier's capacity in tensors (all of one size), for the orders that size lists.
        let entries = |bytes: u64| bytes.checked_div(params.tensor_bytes).unwrap_or(u64::MAX);
        let host = entries(params.host_capacity - params.replica_capacity);
        let (ssd, replica) = (
            entries(params.ssd_capacity),
            entries(params.replica_capacity),
        );
        let servers = (0..params.nodes)
            .map(|_| Server {
                owned_host_bytes: 0,
                replica_bytes: 0,
                ssd_bytes: 0,
                host_q: EvictionQueue::with_capacity(params.eviction.host, host),
                ssd_q: EvictionQueue::with_capacity(params.eviction.ssd, ssd),
                replica_q: EvictionQueue::with_capacity(params.eviction.replica, replica),
                replicas: HashMap::default(),
            })
            .collect();
        let admission = Filter::new(params.admission, host.saturating_mul(params.nodes as u64));
        let reads = params
            .replicate_after_reads
            .map(|after| ReadCounts::new(params.nodes, after));
        Directory {
            params,
            tensors: HashMap::default(),
            servers,
            reads,
            region_tail: HashMap::default(),
            next_region: 0,
            tick: 0,
            lease_ns: 0,
            now_ns: 0,
            stats: StoreStats::default(),
            admission,
            events: None,
            changes: None,
            scratch: Vec::new(),
        }
    }

    pub fn params(&self) -> &StoreParams {
        &self.params
    }

    /// Bytes of a server's host memory for the tensors it owns: what the replica cache does
    /// not reserve.
    pub fn owned_capacity(&self) -> u64 {
        self.params.host_capacity - self.params.replica_capacity
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

    fn change(&mut self, c: Change) {
        if let Some(changes) = &mut self.changes {
            changes.push(c);
        }
    }

    /// Starts tracking every change of what the servers hold ([`Change`]): a store whose
    /// servers hold real bytes (the live host) applies them to its memory. Off by default: a
    /// simulated store holds no bytes.
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The changes since the last call, in the order they were made (empty when not
    /// tracking).
    pub fn changes(&mut self) -> Vec<Change> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
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

    /// Every lookup that plans a load grants a *read lease* of `ns` nanoseconds on the path it
    /// reads (the whole stored prefix, from the root: a lease on a tensor covers its
    /// ancestors, without which it would be dropped with them): until it expires, no leased
    /// tensor is demoted, dropped or evicted, so a load in flight never reads freed memory.
    /// Mooncake's store does the same (`kv_lease_ttl`, 5 s by default). A lease ends by
    /// itself, so a reader that crashes holds nothing for long. 0 (the default) grants none.
    pub fn set_lease(&mut self, ns: u64) {
        self.lease_ns = ns;
    }

    /// The time of the next operations, in ns (leases are granted and expire against it).
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    /// Whether `id` holds an unexpired read lease.
    pub fn leased(&self, id: TensorId) -> bool {
        self.tensors
            .get(&id)
            .is_some_and(|t| t.lease_until > self.now_ns)
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
            if !self.admit(owner, &chain[..i], id) {
                self.admission.proposed(&chain[i + 1..]);
                out.not_admitted = true;
                self.stats.not_admitted += 1;
                self.record(StoreEvent::NotAdmitted {
                    node: owner,
                    index: i as u32,
                });
                break;
            }
            self.servers[owner as usize].host_q.announce(id);
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
                let pt = self.tensors.get_mut(&p).expect("parent exists");
                pt.children.push(id);
                if pt.owner == owner {
                    // A child of the same node, in its host memory (wherever the parent is).
                    pt.host_kids += 1;
                    self.refresh_leaf(p);
                }
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
                    host_kids: 0,
                    ssd_kids: 0,
                    replicas: Vec::new(),
                    lease_until: 0,
                    reads: self.reads.as_mut().map_or(NO_ROW, ReadCounts::alloc),
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
            self.change(Change::Stored { node: owner, id });
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
mod lookup;
#[cfg(test)]
pub(crate) mod tests;
