//! A lookup: the stored prefix of a chain for a reader, the plan to load it, and the accesses
//! and replication it counts (see the module doc of [`super`]).

use super::*;

impl Directory {
    /// Finds the stored prefix of `chain` for a reader on `reader`, and plans loading the
    /// stored tensors after the first `skip` (those the reader already has). Counts as an
    /// access to every tensor it plans to load.
    pub fn lookup(&mut self, chain: &[TensorId], skip: usize, reader: u32) -> LoadPlan {
        if self.admission.records_lookups() {
            // What the reader asks the store for, stored or not.
            for &id in chain.iter().skip(skip) {
                self.admission.record(id);
            }
        }
        let mut served = std::mem::take(&mut self.scratch);
        served.clear();
        let k = self.serve(chain, skip, reader, &mut served);
        let mut plan = LoadPlan {
            stored_chunks: k as u32,
            ..LoadPlan::default()
        };
        if k <= skip {
            self.scratch = served;
            return plan;
        }
        // The planned tensors were leased by `serve`; the skipped ones (the reader holds them)
        // are on the path too.
        if self.lease_ns > 0 {
            let until = self.now_ns.saturating_add(self.lease_ns);
            for id in &chain[..skip] {
                if let Some(t) = self.tensors.get_mut(id) {
                    t.lease_until = until;
                }
            }
        }
        let remote = self.group(&mut plan, chain, skip, reader, &served);
        // The reader's counts of remote reads, one for each remote tensor planned.
        let mut replicate_now = false;
        if let (Some(after), Some(reads)) = (self.params.replicate_after_reads, &mut self.reads) {
            for row in served.iter().filter(|s| s.node != reader).map(|s| s.reads) {
                replicate_now |= reads.bump(row, reader) >= after;
            }
        }
        self.touch_served(chain, skip, &served);
        self.scratch = served;
        if replicate_now {
            plan.replicate = remote;
        }
        plan
    }

    /// The length of `chain`'s stored prefix, with one probe of the tensor map per tensor:
    /// the first `skip` are only counted, and what serves each of the others (the reader's
    /// replica, or the owner's copy) goes to `served` (each leased).
    fn serve(
        &mut self,
        chain: &[TensorId],
        skip: usize,
        reader: u32,
        served: &mut Vec<Served>,
    ) -> usize {
        let k = chain[..skip.min(chain.len())]
            .iter()
            .take_while(|id| self.tensors.contains_key(id))
            .count();
        if k != skip {
            return k;
        }
        let until = self.now_ns.saturating_add(self.lease_ns);
        let replicas = &self.servers[reader as usize].replicas;
        for id in &chain[skip..] {
            let Some(t) = self.tensors.get_mut(id) else {
                break;
            };
            if self.lease_ns > 0 {
                t.lease_until = until;
            }
            // A tensor with no replica anywhere has none on the reader (the replica map and
            // the tensors' replica lists agree, see the check): no probe of the map.
            let replica = if t.replicas.is_empty() {
                None
            } else {
                replicas.get(id)
            };
            served.push(match replica {
                Some(r) => Served {
                    node: reader,
                    loc: Location::Host,
                    region: r.region,
                    replica: true,
                    reads: t.reads,
                },
                None => Served {
                    node: t.owner,
                    loc: t.loc,
                    region: t.region,
                    replica: false,
                    reads: t.reads,
                },
            });
        }
        k + served.len()
    }

    /// Groups the `served` tensors of `chain` (from `skip` on) into `plan`'s load groups, one
    /// a source node and tier, counting the contiguous segments each gathers. Returns the
    /// remote tensors, which a replicating store may copy to the reader.
    fn group(
        &self,
        plan: &mut LoadPlan,
        chain: &[TensorId],
        skip: usize,
        reader: u32,
        served: &[Served],
    ) -> Vec<TensorId> {
        let bytes = self.params.tensor_bytes;
        let mut last: Option<(u32, Location, u64)> = None;
        let mut remote = Vec::new();
        for (i, s) in served.iter().enumerate() {
            let (node, loc, region) = (s.node, s.loc, s.region);
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
                        // At most the tensors left to plan.
                        indices: Vec::with_capacity(served.len() - i),
                        epoch: 0,
                    });
                    plan.groups.last_mut().expect("just pushed")
                }
            };
            group.tensors += 1;
            group.indices.push((skip + i) as u32);
            group.bytes += bytes;
            group.segments += new_segment as u32;
            if node != reader && self.params.replicate_after_reads.is_some() {
                remote.push(chain[skip + i]);
            }
        }
        remote
    }

    /// One access to the copy that serves each planned tensor (see "Access counts" in the
    /// module doc): the reader's replica if it has one, else the owner's tensor. Touched from
    /// the last tensor to the first, so that under LRU a prefix's early tensors are the most
    /// recent.
    fn touch_served(&mut self, chain: &[TensorId], skip: usize, served: &[Served]) {
        for (i, s) in served.iter().enumerate().rev() {
            let id = chain[skip + i];
            self.tick += 1;
            let tick = self.tick;
            let server = &mut self.servers[s.node as usize];
            match (s.replica, s.loc) {
                (true, _) => server.replica_q.touch(id, tick),
                (false, Location::Host) => server.host_q.touch(id, tick),
                (false, Location::Ssd) => server.ssd_q.touch(id, tick),
            }
        }
    }
}
