//! Making room: evicting replicas, demoting owned tensors to SSD, dropping subtrees, and
//! adding replicas (see the module doc of [`super`]).

use super::*;

impl Directory {
    fn host_used(&self, node: u32) -> u64 {
        let s = &self.servers[node as usize];
        s.owned_host_bytes + s.replica_bytes
    }

    /// Frees host memory on `node` for one more owned tensor: replicas first, then demote
    /// owned tensors to SSD (dropping from SSD when it is full), never one of `pinned` (the
    /// prefix an insert extends). False if impossible.
    pub(super) fn make_room_for_owned(
        &mut self,
        node: u32,
        pinned: &[TensorId],
        out: &mut InsertOutcome,
    ) -> bool {
        let bytes = self.params.tensor_bytes;
        // Bounded: each round removes one entry from a queue.
        while self.host_used(node) + bytes > self.params.host_capacity {
            if self.evict_replica(node) {
                out.replicas_evicted += 1;
                continue;
            }
            let tensors = &self.tensors;
            let q = &mut self.servers[node as usize].host_q;
            let free = |id: u64| !pinned.contains(&id);
            let leaf = |id: u64| free(id) && tensors[&id].children.is_empty();
            let Some(victim) = q.pop_first_where(leaf).or_else(|| q.pop_first_where(free)) else {
                return false;
            };
            out.demoted += 1;
            if !self.demote(node, victim, pinned, out) {
                return false;
            }
        }
        true
    }

    fn evict_replica(&mut self, node: u32) -> bool {
        self.evict_replica_except(node, &[])
    }

    /// Evicts one replica on `node` that is not in `keep`.
    pub(super) fn evict_replica_except(&mut self, node: u32, keep: &[TensorId]) -> bool {
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

    /// Moves `id` (already out of the host queue) to SSD on `node`, dropping SSD tensors
    /// (never one of `pinned`) to make room; drops `id` itself if SSD cannot hold it. `id` is
    /// not pinned, and neither is any tensor below it: the pinned tensors are a prefix, so the
    /// subtree of a tensor outside it holds none of them.
    fn demote(
        &mut self,
        node: u32,
        id: TensorId,
        pinned: &[TensorId],
        out: &mut InsertOutcome,
    ) -> bool {
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
            let leaf = |v: u64| !pinned.contains(&v) && tensors[&v].children.is_empty();
            let Some(victim) = q.pop_first_where(leaf) else {
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

    /// Node `node` lost everything its store held (a crash or a restart of its server): its
    /// replicas of other nodes' tensors, and every tensor it owned with all that extends them
    /// (unreachable without their prefix), wherever they are. Returns the tensors lost.
    pub fn lose_node(&mut self, node: u32) -> u64 {
        let Some(server) = self.servers.get_mut(node as usize) else {
            return 0;
        };
        let bytes = self.params.tensor_bytes;
        let mut held: Vec<TensorId> = server.replicas.keys().copied().collect();
        held.sort_unstable();
        for id in held {
            let server = &mut self.servers[node as usize];
            server.replicas.remove(&id);
            server.replica_q.remove(id);
            server.replica_bytes -= bytes;
            if let Some(t) = self.tensors.get_mut(&id) {
                t.replicas.retain(|&n| n != node);
            }
        }
        let mut owned: Vec<TensorId> = self
            .tensors
            .iter()
            .filter(|(_, t)| t.owner == node)
            .map(|(&id, _)| id)
            .collect();
        owned.sort_unstable();
        let dropped_before = self.stats.dropped;
        let mut lost = 0;
        for id in owned {
            if self.tensors.contains_key(&id) {
                lost += self.drop_tree(id) as u64;
            }
        }
        // Losses are not eviction decisions: count them apart.
        self.stats.dropped = dropped_before;
        self.stats.lost += lost;
        self.servers[node as usize].remote_reads.clear();
        lost
    }
}
