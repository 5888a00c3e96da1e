//! The directory's full invariant check and views for tests and reference checks.

use super::*;

impl Directory {
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
