//! Making room: demoting owned tensors to SSD, dropping subtrees, and adding and evicting
//! replicas (see the module doc of [`super`]). The owned cache and the replica cache of a
//! server make room each within its own share of host memory: neither ever evicts from the
//! other.

use super::*;

impl Directory {
    /// Whether the admission rule stores `id`, proposed to `node`'s owned cache by an insert
    /// that pins `pinned`: the rule compares it with the tensor that making room would demote
    /// first (none when there is room).
    pub(super) fn admit(&mut self, node: u32, pinned: &[TensorId], id: TensorId) -> bool {
        if matches!(self.admission, Filter::Always) {
            return true;
        }
        let bytes = self.params.tensor_bytes;
        let full = self.servers[node as usize].owned_host_bytes + bytes > self.owned_capacity();
        let victim = if full && matches!(self.admission, Filter::TinyLfu(_)) {
            let (tensors, now) = (&self.tensors, self.now_ns);
            let eligible = |v: u64| {
                let t = &tensors[&v];
                !pinned.contains(&v) && t.lease_until <= now && t.is_leaf()
            };
            self.servers[node as usize].host_q.peek_where(eligible)
        } else {
            None
        };
        self.admission.admit(id, victim)
    }

    /// Frees owned memory on `node` for one more owned tensor: demotes owned tensors to SSD
    /// (dropping from SSD when it is full), leaves of host memory first, never one of `pinned`
    /// (the prefix an insert extends). The replica cache is left alone. False if impossible.
    pub(super) fn make_room_for_owned(
        &mut self,
        node: u32,
        pinned: &[TensorId],
        out: &mut InsertOutcome,
    ) -> bool {
        let bytes = self.params.tensor_bytes;
        let capacity = self.owned_capacity();
        if bytes > capacity {
            return false;
        }
        // Bounded: each round removes one entry from the host queue.
        while self.servers[node as usize].owned_host_bytes + bytes > capacity {
            let tensors = &self.tensors;
            let q = &mut self.servers[node as usize].host_q;
            // Only leaves: whenever an unpinned, unleased tensor is in host memory, such a
            // leaf is (the one of highest index has no child there: a pinned or leased child
            // would pin or lease it, as pins and leases are closed under parents).
            let now = self.now_ns;
            let eligible = |id: u64| {
                let t = &tensors[&id];
                !pinned.contains(&id) && t.lease_until <= now && t.is_leaf()
            };
            let Some((victim, access)) = q.pop_entry_where(eligible) else {
                return false;
            };
            self.demote(node, victim, access, pinned, out);
        }
        true
    }

    /// Evicts one replica on `node` that is not in `keep`, a leaf of the replica cache (no
    /// child of it is a replica there). `keep` is a prefix (closed under parents), so such a
    /// leaf exists whenever a replica outside `keep` does. False if there is none.
    fn evict_replica_except(&mut self, node: u32, keep: &[TensorId]) -> bool {
        let Server {
            replicas,
            replica_q,
            ..
        } = &mut self.servers[node as usize];
        let (tensors, now) = (&self.tensors, self.now_ns);
        let leased = |id: u64| tensors.get(&id).is_some_and(|t| t.lease_until > now);
        let eligible = |id: u64| !keep.contains(&id) && !leased(id) && replicas[&id].kids == 0;
        let Some(id) = replica_q.pop_first_where(eligible) else {
            return false;
        };
        let t = self
            .tensors
            .get_mut(&id)
            .expect("replica of a stored tensor");
        t.replicas.retain(|&n| n != node);
        let (index, parent) = (t.index, t.parent);
        self.unlink_replica(node, id, parent);
        self.stats.replicas_evicted += 1;
        self.record(StoreEvent::ReplicaEvicted { node, index });
        true
    }

    /// Removes the replica of `id` (whose parent is `parent`) from `node`'s replica cache:
    /// its record, its queue entry if still there, its bytes, and its parent's count of
    /// replica children. The tensor's own list of replicas is the caller's.
    fn unlink_replica(&mut self, node: u32, id: TensorId, parent: Option<TensorId>) {
        let s = &mut self.servers[node as usize];
        if s.replicas.remove(&id).is_none() {
            return;
        }
        s.replica_q.remove(id);
        s.replica_bytes -= self.params.tensor_bytes;
        if let Some(p) = parent
            && let Some(r) = s.replicas.get_mut(&p)
        {
            r.kids -= 1;
            self.refresh_replica(node, p);
        }
        self.change(Change::ReplicaGone { node, id });
    }

    /// Shows owned tensor `id` to victim scans of its tier's queue if it is a leaf there, and
    /// hides it if not (so scans never pass over non-leaves).
    pub(super) fn refresh_leaf(&mut self, id: TensorId) {
        let Some(t) = self.tensors.get(&id) else {
            return;
        };
        let hidden = !t.is_leaf();
        let server = &mut self.servers[t.owner as usize];
        match t.loc {
            Location::Host => server.host_q.set_hidden(id, hidden),
            Location::Ssd => server.ssd_q.set_hidden(id, hidden),
        }
    }

    /// The same for the replica of `id` on `node`: shown when no child of it is a replica
    /// there.
    fn refresh_replica(&mut self, node: u32, id: TensorId) {
        let server = &mut self.servers[node as usize];
        if let Some(r) = server.replicas.get(&id) {
            server.replica_q.set_hidden(id, r.kids > 0);
        }
    }

    /// Moves owned tensor `id` to tier `to` on its owner, keeping its parent's counts of
    /// children per tier right. Bytes and queues are the caller's.
    fn set_location(&mut self, id: TensorId, to: Location) {
        let t = self.tensors.get_mut(&id).expect("moved tensor exists");
        let (from, owner, parent) = (t.loc, t.owner, t.parent);
        t.loc = to;
        if let Some(p) = parent
            && let Some(pt) = self.tensors.get_mut(&p)
            && pt.owner == owner
        {
            *pt.kids_mut(from) -= 1;
            *pt.kids_mut(to) += 1;
            self.refresh_leaf(p);
        }
    }

    /// Moves `id` (already out of the host queue, with its access history `access`) to SSD on
    /// `node`, dropping SSD tensors (leaves of the SSD first, never one of `pinned`) to make
    /// room; drops `id` itself if SSD cannot hold it. `id` is not pinned, and neither is any
    /// tensor below it: the pinned tensors are a prefix, so the subtree of a tensor outside it
    /// holds none of them.
    fn demote(
        &mut self,
        node: u32,
        id: TensorId,
        access: Access,
        pinned: &[TensorId],
        out: &mut InsertOutcome,
    ) {
        let bytes = self.params.tensor_bytes;
        self.servers[node as usize].owned_host_bytes -= bytes;
        if self.params.ssd_capacity < bytes {
            // No SSD tier (or one that holds no tensor): leaving host memory is being dropped,
            // and nothing is written anywhere.
            out.dropped += self.drop_tree(id);
            return;
        }
        let index = self.tensors[&id].index;
        // The tensor is now between tiers: mark it on SSD so a cascade can find it.
        self.set_location(id, Location::Ssd);
        self.servers[node as usize].ssd_q.announce(id);
        // Bounded: each round drops at least one tensor.
        while self.servers[node as usize].ssd_bytes + bytes > self.params.ssd_capacity {
            let tensors = &self.tensors;
            let q = &mut self.servers[node as usize].ssd_q;
            let now = self.now_ns;
            let eligible = |v: u64| {
                let t = &tensors[&v];
                !pinned.contains(&v) && t.lease_until <= now && t.is_leaf()
            };
            let Some(victim) = q.pop_first_where(eligible) else {
                // Nothing on SSD may go (there is nothing, or only pinned tensors): the
                // tensor being demoted goes instead.
                out.dropped += self.drop_tree(id);
                return;
            };
            // Out of its queue now: its bytes leave here, not in `drop_tree`.
            self.servers[node as usize].ssd_bytes -= bytes;
            out.dropped += self.drop_tree(victim);
            if !self.tensors.contains_key(&id) {
                // The victim was an ancestor of `id`: it is gone with it.
                return;
            }
        }
        // Only a tensor that reaches the SSD is written there (and recorded as demoted,
        // after the drops that made its room).
        self.record(StoreEvent::Demoted { node, index });
        self.change(Change::Demoted { node, id });
        out.demoted += 1;
        self.stats.demoted += 1;
        let value = self.drop_value(index);
        let server = &mut self.servers[node as usize];
        server.ssd_bytes += bytes;
        // A demotion is no access: the tensor keeps its count and its last access.
        server.ssd_q.insert(id, access.freq, value, access.tick);
        self.refresh_leaf(id);
    }

    /// Drops `root` and all its descendants, with their replicas; `root` may already be out of
    /// its queue (a tensor just popped). Returns the number dropped.
    fn drop_tree(&mut self, root: TensorId) -> u32 {
        let bytes = self.params.tensor_bytes;
        let mut stack = vec![root];
        let mut n = 0;
        // Bounded by the number of stored tensors. A tensor goes before its children, so only
        // the root's parent outlives this loop and needs its links updated.
        while let Some(id) = stack.pop() {
            let Some(t) = self.tensors.remove(&id) else {
                continue;
            };
            n += 1;
            stack.extend_from_slice(&t.children);
            if let Some(p) = t.parent
                && let Some(pt) = self.tensors.get_mut(&p)
            {
                pt.children.retain(|&c| c != id);
                if pt.owner == t.owner {
                    *pt.kids_mut(t.loc) -= 1;
                    self.refresh_leaf(p);
                }
            }
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
                self.unlink_replica(node, id, t.parent);
            }
            if let Some(reads) = &mut self.reads {
                reads.release(t.reads);
            }
            if self.region_tail.get(&t.region) == Some(&id) {
                self.region_tail.remove(&t.region);
            }
            self.stats.dropped += 1;
            self.change(Change::Dropped { node: t.owner, id });
            self.record(StoreEvent::Dropped {
                node: t.owner,
                index: t.index,
                id,
            });
        }
        n
    }

    /// Adds replicas of `ids` (in prefix order) on `node`, as one contiguous region, within
    /// the replica cache's share of host memory, evicting older replicas (leaves of the
    /// replica cache first) but never owned tensors. Returns how many were added.
    pub fn add_replicas(&mut self, node: u32, ids: &[TensorId]) -> u32 {
        let bytes = self.params.tensor_bytes;
        let capacity = self.params.replica_capacity;
        let wanted: Vec<TensorId> = ids
            .iter()
            .copied()
            .filter(|id| {
                self.tensors.get(id).is_some_and(|t| t.owner != node)
                    && !self.servers[node as usize].replicas.contains_key(id)
            })
            .collect();
        // Keep the beginning of the prefix if the whole does not fit in the replica cache.
        let fit = (capacity / bytes) as usize;
        let wanted = &wanted[..wanted.len().min(fit)];
        let need = wanted.len() as u64 * bytes;
        // The batch's own ancestors stay: evicting them would split the prefix it extends. The
        // batch is one chain in prefix order, possibly with gaps (tensors the node already
        // holds as replicas), so the path to its last tensor holds every ancestor of all.
        let keep = wanted
            .last()
            .map(|&last| self.path_to(last))
            .unwrap_or_default();
        // Evict older replicas (bounded: one per round) until the batch fits.
        while self.servers[node as usize].replica_bytes + need > capacity {
            if !self.evict_replica_except(node, &keep) {
                break;
            }
        }
        let room = capacity - self.servers[node as usize].replica_bytes;
        let wanted = &wanted[..wanted.len().min((room / bytes) as usize)];
        self.next_region += 1;
        let region = self.next_region;
        for &id in wanted {
            let tick = self.next_tick();
            let value = self.params.net_ns_per_byte;
            let t = self.tensors.get_mut(&id).expect("filtered above");
            t.replicas.push(node);
            let (index, parent) = (t.index, t.parent);
            let s = &mut self.servers[node as usize];
            // Children replicated earlier (O(children)); later ones count themselves in.
            let kids = self.tensors[&id]
                .children
                .iter()
                .filter(|c| s.replicas.contains_key(c))
                .count() as u32;
            let parent_replica = parent.filter(|p| s.replicas.contains_key(p));
            if let Some(p) = parent_replica
                && let Some(r) = s.replicas.get_mut(&p)
            {
                r.kids += 1;
            }
            s.replicas.insert(id, Replica { region, kids });
            s.replica_bytes += bytes;
            s.replica_q.insert(id, 1, value, tick);
            self.refresh_replica(node, id);
            if let Some(p) = parent_replica {
                self.refresh_replica(node, p);
            }
            if let Some(reads) = &mut self.reads {
                reads.reset(self.tensors[&id].reads, node);
            }
            self.stats.replicated += 1;
            self.change(Change::Replicated { node, id });
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
        let mut held: Vec<TensorId> = server.replicas.keys().copied().collect();
        held.sort_unstable();
        for id in held {
            let parent = self.tensors.get_mut(&id).and_then(|t| {
                t.replicas.retain(|&n| n != node);
                t.parent
            });
            self.unlink_replica(node, id, parent);
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
        if let Some(reads) = &mut self.reads {
            reads.clear_node(node);
        }
        lost
    }
}
