//! The directory's full invariant check and views for tests and reference checks.

use super::*;

/// The bytes each node holds by kind, summed over the tensors.
struct Sums<'a> {
    owned: &'a mut [u64],
    ssd: &'a mut [u64],
    reps: &'a mut [u64],
}

impl Directory {
    /// Bytes per server: (owned in host memory, replicas, SSD).
    pub fn usage(&self, node: u32) -> (u64, u64, u64) {
        let s = &self.servers[node as usize];
        (s.owned_host_bytes, s.replica_bytes, s.ssd_bytes)
    }

    /// The tensors `node` holds replicas of, sorted.
    pub fn replicas_on(&self, node: u32) -> Vec<TensorId> {
        let mut v: Vec<TensorId> = self.servers[node as usize]
            .replicas
            .keys()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }

    /// Where owned tensor `id` is, if stored: its owner and tier.
    pub fn location(&self, id: TensorId) -> Option<(u32, Location)> {
        self.tensors.get(&id).map(|t| (t.owner, t.loc))
    }

    /// Checks every invariant; for tests and end-of-run checks. O(stored tensors + replicas).
    ///
    /// - the trie: every tensor's parent exists, lists it as a child, and is one chunk shorter;
    /// - capacities: per server, owned bytes within the owned cache (host memory less the
    ///   replica share), replica bytes within the replica cache, SSD bytes within the SSD;
    /// - counters: byte counters and each tensor's counts of children in the same tier of
    ///   the same node (host, SSD) and each replica's count of replica children equal a
    ///   recount;
    /// - replicas: every replica is of a stored tensor owned by another node, recorded on both
    ///   sides;
    /// - queues: each queue holds exactly the entries of its tier (host, SSD, replicas);
    /// - leases: a tensor's parent is leased at least as long as it is;
    /// - read counts: with replication, every tensor has a row of its own and every other row
    ///   is free and zero; without, no tensor has one.
    pub fn check(&self) -> Result<(), String> {
        let p = &self.params;
        let nodes = p.nodes as usize;
        let (mut owned, mut ssd, mut reps) = (vec![0u64; nodes], vec![0u64; nodes], vec![0; nodes]);
        let mut sums = Sums {
            owned: &mut owned,
            ssd: &mut ssd,
            reps: &mut reps,
        };
        for (&id, t) in &self.tensors {
            self.check_tensor(id, t, &mut sums)?;
        }
        match &self.reads {
            Some(reads) => reads.check(self.tensors.values().map(|t| t.reads))?,
            None => {
                if let Some((id, _)) = self.tensors.iter().find(|(_, t)| t.reads != NO_ROW) {
                    return Err(format!(
                        "tensor {id:#x} has read counts without replication"
                    ));
                }
            }
        }
        for (n, s) in self.servers.iter().enumerate() {
            self.check_server(n, s, &owned, &ssd, &reps)?;
        }
        Ok(())
    }

    /// One tensor's part of [`Directory::check`]: its place in the trie, its counts of
    /// children, its queue and lease, its replicas; adds its bytes to `sums`.
    fn check_tensor(&self, id: TensorId, t: &Tensor, sums: &mut Sums<'_>) -> Result<(), String> {
        let b = self.params.tensor_bytes;
        if let Some(parent) = t.parent {
            let Some(pt) = self.tensors.get(&parent) else {
                return Err(format!("tensor {id:#x} has no parent {parent:#x}"));
            };
            if !pt.children.contains(&id) || pt.index + 1 != t.index {
                return Err(format!("tensor {id:#x} and its parent disagree"));
            }
            // A lease holds the whole path from the root, so a parent's lasts as long.
            if pt.lease_until < t.lease_until {
                return Err(format!(
                    "tensor {id:#x} is leased until {} ns, its parent only until {} ns",
                    t.lease_until, pt.lease_until
                ));
            }
        } else if t.index != 0 {
            return Err(format!("root tensor {id:#x} at index {}", t.index));
        }
        for c in &t.children {
            if self.tensors.get(c).is_none_or(|ct| ct.parent != Some(id)) {
                return Err(format!("tensor {id:#x} lists a child {c:#x} that is not"));
            }
        }
        let same_node = |loc| {
            t.children
                .iter()
                .map(|c| &self.tensors[c])
                .filter(|c| c.owner == t.owner && c.loc == loc)
                .count() as u32
        };
        if t.host_kids != same_node(Location::Host) || t.ssd_kids != same_node(Location::Ssd) {
            return Err(format!(
                "tensor {id:#x}: counts of children per tier are wrong"
            ));
        }
        let s = &self.servers[t.owner as usize];
        let queue = match t.loc {
            Location::Host => &s.host_q,
            Location::Ssd => &s.ssd_q,
        };
        if queue
            .is_hidden(id)
            .is_some_and(|hidden| hidden == t.is_leaf())
        {
            return Err(format!(
                "tensor {id:#x}: shown to victim scans unless a leaf of its tier, or hidden"
            ));
        }
        let (in_host, in_ssd) = (s.host_q.contains(id), s.ssd_q.contains(id));
        match t.loc {
            Location::Host => {
                sums.owned[t.owner as usize] += b;
                if !in_host || in_ssd {
                    return Err(format!("host tensor {id:#x} not (only) in the host queue"));
                }
            }
            Location::Ssd => {
                sums.ssd[t.owner as usize] += b;
                if !in_ssd || in_host {
                    return Err(format!("SSD tensor {id:#x} not (only) in the SSD queue"));
                }
            }
        }
        for &n in &t.replicas {
            sums.reps[n as usize] += b;
            if n == t.owner || !self.servers[n as usize].replicas.contains_key(&id) {
                return Err(format!("replica of {id:#x} on node {n} is not recorded"));
            }
        }
        Ok(())
    }

    /// One node's part of [`Directory::check`]: byte counters against the tensors' sums
    /// (`owned`, `ssd`, `reps`), capacities, queues and replica records.
    fn check_server(
        &self,
        n: usize,
        s: &Server,
        owned: &[u64],
        ssd: &[u64],
        reps: &[u64],
    ) -> Result<(), String> {
        let p = &self.params;
        let b = p.tensor_bytes;
        if s.owned_host_bytes != owned[n] || s.ssd_bytes != ssd[n] || s.replica_bytes != reps[n] {
            return Err(format!("node {n}: byte counters disagree with the tensors"));
        }
        if s.owned_host_bytes > self.owned_capacity() {
            return Err(format!(
                "node {n}: owned tensors over the owned cache's capacity"
            ));
        }
        if s.replica_bytes > p.replica_capacity {
            return Err(format!(
                "node {n}: replicas over the replica cache's capacity"
            ));
        }
        if s.ssd_bytes > p.ssd_capacity {
            return Err(format!("node {n}: SSD over capacity"));
        }
        if s.host_q.len() as u64 * b != owned[n] || s.ssd_q.len() as u64 * b != ssd[n] {
            return Err(format!("node {n}: queues disagree with the tensors"));
        }
        if s.replicas.len() != s.replica_q.len() || s.replica_bytes != s.replicas.len() as u64 * b {
            return Err(format!("node {n}: replica map, queue and bytes disagree"));
        }
        for (&id, r) in &s.replicas {
            let Some(t) = self.tensors.get(&id) else {
                return Err(format!("node {n}: replica of {id:#x}, which is not stored"));
            };
            if t.owner as usize == n || !t.replicas.contains(&(n as u32)) {
                return Err(format!(
                    "node {n}: replica of {id:#x} not recorded on the tensor"
                ));
            }
            if !s.replica_q.contains(id) {
                return Err(format!(
                    "node {n}: replica of {id:#x} not in the replica queue"
                ));
            }
            let kids = t
                .children
                .iter()
                .filter(|c| s.replicas.contains_key(c))
                .count() as u32;
            if r.kids != kids {
                return Err(format!(
                    "node {n}: replica of {id:#x} miscounts its children"
                ));
            }
            if s.replica_q.is_hidden(id) != Some(kids > 0) {
                return Err(format!(
                    "node {n}: replica of {id:#x} hidden from scans unless a leaf, or shown"
                ));
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
