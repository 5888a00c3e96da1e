//! The bytes of a live prefix store: what each node's store server holds in host memory (and
//! on its "SSD"), as real K/V ([`HostKv`]).
//!
//! Under the simulator a store holds no bytes: the metadata service's [`super::directory`]
//! is all there is. Under the live host every server keeps the real K/V of the tensors the
//! directory places on its node, and nothing else:
//!
//! 1. an instance writes the K/V of new tensors to its node's server ([`Msg::StoreWrite`]
//!    with data); the bytes land in the server's *staging* area and the server registers the
//!    tensors with the metadata service, as in the simulation;
//! 2. the metadata service decides with the same [`super::directory::Directory`] code as the
//!    simulation, and tells every server whose holdings changed what changed, in order
//!    ([`Change`]s, with the list of tensors the write brought): stored tensors move from
//!    staging to host memory, demoted ones to the SSD tier, dropped and evicted ones are
//!    freed, and whatever the write brought that the directory did not keep is freed too;
//! 3. a reader's load reads the tensors of its plan from the owner's memory (one-sided, as
//!    RDMA reads are): a replica on the reader's node or the owner's host copy for a host
//!    group, the owner's SSD tier for an SSD group.
//!
//! So the bytes held never exceed what the directory accounts (its capacities bound them),
//! and a tensor whose bytes are not there (the directory stored a tensor that the write did
//! not carry: a prefix that shrank between the lookup and the insert) is a *hole*: a load
//! that needs it fails and its tokens are recomputed. Holes are counted.
//!
//! The SSD tier of a live store is host memory standing in for the node's SSD (a live run
//! writes nothing to the host's drives): its bytes are real and bounded by the SSD capacity,
//! its speed is host memory's.
//!
//! [`Msg::StoreWrite`]: crate::serving::Msg::StoreWrite

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::directory::{Change, Location, TensorId};
pub use crate::backend::KvData;
use crate::backend::KvSource;
use crate::exec::HostKv;

/// What one node's server holds.
#[derive(Debug, Default)]
struct NodeMemory {
    staged: BTreeMap<TensorId, Arc<HostKv>>,
    host: BTreeMap<TensorId, Arc<HostKv>>,
    replicas: BTreeMap<TensorId, Arc<HostKv>>,
    ssd: BTreeMap<TensorId, Arc<HostKv>>,
    stats: MemoryStats,
    /// Reads return wrong K/V (see [`ClusterMemory::corrupt_reads`]).
    corrupt: Option<f32>,
}

/// Counters of one node's live store memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held now: owned in host memory, replicas, on the SSD tier, in staging.
    pub host_bytes: u64,
    pub replica_bytes: u64,
    pub ssd_bytes: u64,
    pub staged_bytes: u64,
    /// Most bytes held at once in host memory (owned, replicas and staging together).
    pub peak_host_bytes: u64,
    /// Tensors the directory placed here whose bytes never came (see the module doc).
    pub holes: u64,
    /// Tensors read by loads, and reads that found nothing.
    pub reads: u64,
    pub missed_reads: u64,
}

fn total(m: &BTreeMap<TensorId, Arc<HostKv>>) -> u64 {
    m.values().map(|kv| kv.bytes()).sum()
}

impl NodeMemory {
    fn update(&mut self) {
        let s = &mut self.stats;
        s.host_bytes = total(&self.host);
        s.replica_bytes = total(&self.replicas);
        s.ssd_bytes = total(&self.ssd);
        s.staged_bytes = total(&self.staged);
        s.peak_host_bytes = s
            .peak_host_bytes
            .max(s.host_bytes + s.replica_bytes + s.staged_bytes);
    }
}

/// The live store memory of every node (see the module doc). Shared by the store servers
/// (which write it) and the instances' backends (which read it, one-sided).
#[derive(Debug)]
pub struct ClusterMemory {
    nodes: Vec<Mutex<NodeMemory>>,
}

impl ClusterMemory {
    pub fn new(nodes: u32) -> ClusterMemory {
        ClusterMemory {
            nodes: (0..nodes).map(|_| Mutex::default()).collect(),
        }
    }

    fn node(&self, node: u32) -> std::sync::MutexGuard<'_, NodeMemory> {
        // A panic while holding the lock ends the run anyway; the data stay usable.
        self.nodes[node as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes of a write landed in `node`'s staging area.
    pub fn land(&self, node: u32, data: KvData) {
        let mut m = self.node(node);
        for (id, kv) in data {
            m.staged.insert(id, kv);
        }
        m.update();
    }

    /// Applies the directory's `changes` for `node` in order, then frees whatever of
    /// `written` (the tensors a write brought) is still staged.
    pub fn apply(&self, node: u32, changes: &[Change], written: &[TensorId]) {
        let mut m = self.node(node);
        for c in changes {
            match *c {
                Change::Stored { id, .. } => match m.staged.remove(&id) {
                    Some(kv) => {
                        m.host.insert(id, kv);
                    }
                    None => m.stats.holes += 1,
                },
                Change::Demoted { id, .. } => {
                    if let Some(kv) = m.host.remove(&id) {
                        m.ssd.insert(id, kv);
                    }
                }
                Change::Dropped { id, .. } => {
                    m.host.remove(&id);
                    m.ssd.remove(&id);
                }
                Change::Replicated { id, .. } => match m.staged.remove(&id) {
                    Some(kv) => {
                        m.replicas.insert(id, kv);
                    }
                    None => m.stats.holes += 1,
                },
                Change::ReplicaGone { id, .. } => {
                    m.replicas.remove(&id);
                }
            }
        }
        for id in written {
            m.staged.remove(id);
        }
        m.update();
    }

    /// `node` lost everything it held (a store restart or a crash).
    pub fn lose(&self, node: u32) {
        let mut m = self.node(node);
        let (stats, corrupt) = (m.stats, m.corrupt);
        *m = NodeMemory::default();
        m.corrupt = corrupt;
        m.stats = MemoryStats {
            holes: stats.holes,
            reads: stats.reads,
            missed_reads: stats.missed_reads,
            peak_host_bytes: stats.peak_host_bytes,
            ..MemoryStats::default()
        };
    }

    /// One-sided read of tensor `id` from `node`'s `location`: for host memory, a replica
    /// there, else the owned copy (or bytes landed and not yet placed).
    pub fn read(&self, node: u32, location: Location, id: TensorId) -> Option<Arc<HostKv>> {
        let mut m = self.node(node);
        let got = match location {
            Location::Host => m
                .replicas
                .get(&id)
                .or_else(|| m.host.get(&id))
                .or_else(|| m.staged.get(&id))
                .cloned(),
            Location::Ssd => m.ssd.get(&id).cloned(),
        };
        m.stats.reads += 1;
        if got.is_none() {
            m.stats.missed_reads += 1;
        }
        match (got, m.corrupt) {
            (Some(kv), Some(delta)) => {
                let mut bad = (*kv).clone();
                bad.data.mapv_inplace(|x| x + delta);
                Some(Arc::new(bad))
            }
            (got, _) => got,
        }
    }

    /// Makes every later read of a tensor return wrong K/V (each value plus `delta`): a fault
    /// to show that the live runs' output check catches a wrong load (tests only).
    #[doc(hidden)]
    pub fn corrupt_reads(&self, delta: f32) {
        for n in &self.nodes {
            let mut m = n.lock().unwrap_or_else(|e| e.into_inner());
            m.corrupt = Some(delta);
        }
    }

    pub fn stats(&self, node: u32) -> MemoryStats {
        self.node(node).stats
    }

    pub fn nodes(&self) -> u32 {
        self.nodes.len() as u32
    }
}

impl KvSource for ClusterMemory {
    fn read(&self, node: u32, ssd: bool, id: TensorId) -> Option<Arc<HostKv>> {
        if node >= self.nodes() {
            return None;
        }
        let location = if ssd { Location::Ssd } else { Location::Host };
        ClusterMemory::read(self, node, location, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array5;

    fn kv(tokens: usize) -> Arc<HostKv> {
        Arc::new(HostKv {
            layers: 0..1,
            positions: 0..tokens,
            data: Array5::zeros((1, 2, 1, tokens, 2)),
        })
    }

    #[test]
    fn memory_follows_the_directory_changes_and_frees_what_it_did_not_keep() {
        let m = ClusterMemory::new(2);
        m.land(0, vec![(1, kv(4)), (2, kv(4)), (3, kv(4))]);
        assert_eq!(m.stats(0).staged_bytes, 3 * 64);
        // The directory kept 1 and 2 (3 was refused), then demoted 1, and a cascade dropped a
        // replica on node 1.
        m.apply(
            0,
            &[
                Change::Stored { node: 0, id: 1 },
                Change::Stored { node: 0, id: 2 },
                Change::Demoted { node: 0, id: 1 },
                Change::Stored { node: 0, id: 9 },
            ],
            &[1, 2, 3],
        );
        let s = m.stats(0);
        assert_eq!((s.host_bytes, s.ssd_bytes, s.staged_bytes), (64, 64, 0));
        assert_eq!(s.holes, 1, "tensor 9 came without bytes");
        assert!(m.read(0, Location::Ssd, 1).is_some());
        assert!(m.read(0, Location::Host, 1).is_none());
        assert!(m.read(0, Location::Host, 2).is_some());
        assert_eq!(m.stats(0).missed_reads, 1);
        m.land(1, vec![(2, kv(4))]);
        m.apply(1, &[Change::Replicated { node: 1, id: 2 }], &[2]);
        assert_eq!(m.stats(1).replica_bytes, 64);
        m.apply(1, &[Change::ReplicaGone { node: 1, id: 2 }], &[]);
        m.apply(0, &[Change::Dropped { node: 0, id: 1 }], &[]);
        assert_eq!((m.stats(1).replica_bytes, m.stats(0).ssd_bytes), (0, 0));
        assert!(m.stats(0).peak_host_bytes >= 3 * 64);
    }
}
